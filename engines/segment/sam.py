"""Box-prompted SAM-family segmentation: an image encoder ONNX and a prompt decoder ONNX.

Two export signatures are recognised from the decoder's input names:

- SAM / MobileSAM (`segment_anything.utils.onnx.SamOnnxModel`, the official export script):
  encoder `(1, 3, 1024, 1024)` float (whatever its input is called) -> `(1, 256, 64, 64)`; the
  image is resized so its longest side is 1024, normalised with SAM's pixel mean / std and
  padded bottom-right with zeros. Decoder inputs `image_embeddings`, `point_coords (1, N, 2)`,
  `point_labels (1, N)`, `mask_input (1, 1, 256, 256)`, `has_mask_input (1,)`,
  `orig_im_size (2,)` -> `masks (1, M, H, W)` logits at the original size, `iou_predictions`,
  `low_res_masks`. A box is two points, its corners, with labels 2 and 3, in resized pixels.
  Decoders exported without the final upscaling (no `orig_im_size`; NanoSAM's and most
  TensorRT-minded exports) return `low_res_masks (1, M, 256, 256)` over the padded 1024 square;
  those are upscaled, cut to the image and resized to it here.
- EfficientSAM (its repo's `export_to_onnx.py`): encoder `batched_images (1, 3, H, W)`, RGB in
  0..1 at the image's own size (the model resizes and normalises inside); decoder
  `image_embeddings`, `batched_point_coords (1, 1, N, 2)` in image pixels,
  `batched_point_labels (1, 1, N)`, `orig_im_size (2,)` int64 -> `output_masks (1, 1, M, H, W)`,
  `iou_predictions (1, 1, M)`.

The encoder runs once per image, the decoder once per box; the mask of the best predicted IoU
is kept, thresholded at logit 0 and clipped to its box.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from engines.errors import EngineUnavailable, ModelLoadError
from engines.segment.runtime import ShapeRange, Signature, TensorRunner, open_runner, read_signature
from engines.segment.types import clip_to_box

SAM_DECODER_INPUTS = ("image_embeddings", "point_coords", "point_labels")  # + mask_input, has_mask_input, orig_im_size
EFFICIENTSAM_DECODER_INPUTS = ("image_embeddings", "batched_point_coords", "batched_point_labels", "orig_im_size")
PIXEL_MEAN = np.array([123.675, 116.28, 103.53], np.float32)
PIXEL_STD = np.array([58.395, 57.12, 57.375], np.float32)
BOX_LABELS = (2.0, 3.0)  # top-left and bottom-right corner of a box prompt
MAX_POINTS = 16  # TensorRT profile bound for the decoder's point axis (a box uses 2)


def sam_resize_shape(height: int, width: int, side: int) -> tuple[int, int]:
    """The size SAM's ResizeLongestSide gives an image: longest side `side`, aspect kept."""
    scale = side / max(height, width)
    return int(height * scale + 0.5), int(width * scale + 0.5)


def sam_preprocess(image: np.ndarray, side: int) -> tuple[np.ndarray, tuple[int, int]]:
    """RGB uint8 -> (1, 3, side, side) float32 normalised and zero-padded, and the resized (h, w)."""
    rh, rw = sam_resize_shape(image.shape[0], image.shape[1], side)
    resized = cv2.resize(image, (rw, rh), interpolation=cv2.INTER_LINEAR)
    tensor = np.zeros((1, 3, side, side), np.float32)
    tensor[0, :, :rh, :rw] = ((resized.astype(np.float32) - PIXEL_MEAN) / PIXEL_STD).transpose(2, 0, 1)
    return tensor, (rh, rw)


class SamSegmenter:
    def __init__(self, encoder: TensorRunner, decoder: TensorRunner, enc_sig: Signature, dec_sig: Signature) -> None:
        names = set(dec_sig.input_names)
        if set(SAM_DECODER_INPUTS) <= names:
            self.kind = "sam"
        elif set(EFFICIENTSAM_DECODER_INPUTS) <= names:
            self.kind = "efficientsam"
        else:
            raise ModelLoadError(
                f"{dec_sig.path}: inputs {sorted(names)} are neither a SAM/MobileSAM decoder "
                f"({', '.join(SAM_DECODER_INPUTS)}) nor an EfficientSAM decoder "
                f"({', '.join(EFFICIENTSAM_DECODER_INPUTS)})"
            )
        if len(enc_sig.inputs) != 1 or len(enc_sig.inputs[0].shape) != 4 or enc_sig.inputs[0].shape[1] not in (3, None):
            shapes = [list(t.shape) for t in enc_sig.inputs]
            raise ModelLoadError(f"{enc_sig.path}: an image encoder has one (1, 3, H, W) input, this one has {shapes}")
        self._enc_in = enc_sig.inputs[0].name
        self._enc_out = enc_sig.outputs[0].name
        height = enc_sig.inputs[0].shape[2]
        self.side = height if self.kind == "sam" and height else 1024
        mask_input = dec_sig.input("mask_input")
        self._mask_input_hw = (
            tuple(d or 256 for d in mask_input.shape[2:])
            if mask_input is not None and len(mask_input.shape) == 4
            else (256, 256)
        )
        self._masks_out, self._iou_out = self._output_names(dec_sig)
        self._decoder_inputs = set(names)
        self._encoder, self._decoder = encoder, decoder
        self.backend = decoder.name

    def _output_names(self, sig: Signature) -> tuple[str, str]:
        names = sig.output_names
        masks = next((n for n in ("masks", "output_masks", "low_res_masks") if n in names), names[0])
        iou = "iou_predictions" if "iou_predictions" in names else names[1] if len(names) > 1 else ""
        return masks, iou

    def embed(self, image: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
        """Run the encoder once: the image embedding and the resized (h, w) the prompts refer to."""
        if self.kind == "sam":
            tensor, resized = sam_preprocess(image, self.side)
        else:
            tensor = (image.astype(np.float32) * np.float32(1 / 255)).transpose(2, 0, 1)[None]
            resized = image.shape[:2]
        return self._encoder.run({self._enc_in: tensor})[self._enc_out], resized

    def segment(self, image: np.ndarray, boxes: np.ndarray) -> list[np.ndarray | None]:
        boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
        if len(boxes) == 0:
            return []
        embedding, resized = self.embed(image)
        height, width = image.shape[:2]
        return [self._decode(embedding, box, (height, width), resized) for box in boxes]

    def _decode(
        self, embedding: np.ndarray, box: np.ndarray, size: tuple[int, int], resized: tuple[int, int]
    ) -> np.ndarray | None:
        height, width = size
        corners = box.reshape(2, 2).astype(np.float32)
        if self.kind == "sam":
            corners = corners * np.array([resized[1] / width, resized[0] / height], np.float32)
            feeds = {
                "image_embeddings": embedding,
                "point_coords": corners[None],
                "point_labels": np.array([BOX_LABELS], np.float32),
                "mask_input": np.zeros((1, 1, *self._mask_input_hw), np.float32),
                "has_mask_input": np.zeros((1,), np.float32),
                "orig_im_size": np.array([height, width], np.float32),
            }
            feeds = {k: v for k, v in feeds.items() if k in self._decoder_inputs}
        else:
            feeds = {
                "image_embeddings": embedding,
                "batched_point_coords": corners[None, None],
                "batched_point_labels": np.array([[BOX_LABELS]], np.float32),
                "orig_im_size": np.array([height, width], np.int64),
            }
        out = self._decoder.run(feeds)
        masks = out[self._masks_out].reshape(-1, *out[self._masks_out].shape[-2:])  # (M, H, W) logits
        best = int(np.argmax(out[self._iou_out].reshape(-1))) if self._iou_out in out else 0
        logits = masks[best]
        if logits.shape != (height, width):  # low-resolution logits over the padded square
            logits = self._upscale(logits.astype(np.float32), size, resized)
        mask = clip_to_box(logits > 0, box)
        return mask if mask.any() else None

    def _upscale(self, logits: np.ndarray, size: tuple[int, int], resized: tuple[int, int]) -> np.ndarray:
        """SAM's own mask post-processing: to the padded square, cut to the resized image, then to
        the original size (bilinear on logits each time)."""
        (height, width), (rh, rw) = size, resized
        if self.kind == "sam":
            square = cv2.resize(logits, (self.side, self.side), interpolation=cv2.INTER_LINEAR)
            logits = square[:rh, :rw]
        return cv2.resize(logits, (width, height), interpolation=cv2.INTER_LINEAR)

    def close(self) -> None:
        self._encoder.close()
        self._decoder.close()


def open_sam(
    encoder_path: str | Path, decoder_path: str | Path, backend: str = "onnx-cpu", *, threads: int | None = None
) -> SamSegmenter:
    """Check both files' signatures, then start them on `backend`."""
    enc_sig, dec_sig = read_signature(encoder_path), read_signature(decoder_path)
    if backend == "tensorrt" and dec_sig.input("orig_im_size") is not None:
        # Its output size is computed from an input's values, which a TensorRT engine cannot plan for.
        raise EngineUnavailable(
            f"tensorrt: {decoder_path} sizes its masks from orig_im_size; export the decoder without the "
            "upscaling (low_res_masks out, as NanoSAM does) or use backend onnx-cuda"
        )
    enc_shapes, dec_shapes = _trt_shapes(enc_sig, dec_sig)
    encoder = open_runner(encoder_path, backend, threads=threads, shapes=enc_shapes)
    try:
        decoder = open_runner(decoder_path, backend, threads=threads, shapes=dec_shapes)
    except BaseException:
        encoder.close()
        raise
    try:
        return SamSegmenter(encoder, decoder, enc_sig, dec_sig)
    except BaseException:
        encoder.close()
        decoder.close()
        raise


def _trt_shapes(enc: Signature, dec: Signature) -> tuple[dict[str, ShapeRange], dict[str, ShapeRange]]:
    """TensorRT profiles: the encoder at 1024 (EfficientSAM: up to 1920 a side), the decoder's point
    axis from 1 to MAX_POINTS, its image size up to 4K."""
    enc_shapes: dict[str, ShapeRange] = {}
    spec = enc.inputs[0] if enc.inputs else None
    if spec is not None and any(d is None for d in spec.shape):
        enc_shapes[spec.name] = ((1, 3, 64, 64), (1, 3, 1080, 1920), (1, 3, 2160, 3840))
    dec_shapes: dict[str, ShapeRange] = {}
    for t in dec.inputs:
        if not any(d is None for d in t.shape):
            continue
        if t.name in ("point_coords", "batched_point_coords"):
            lead = (1,) * (len(t.shape) - 2)
            dec_shapes[t.name] = ((*lead, 1, 2), (*lead, 2, 2), (*lead, MAX_POINTS, 2))
        elif t.name in ("point_labels", "batched_point_labels"):
            lead = (1,) * (len(t.shape) - 1)
            dec_shapes[t.name] = ((*lead, 1), (*lead, 2), (*lead, MAX_POINTS))
    return enc_shapes, dec_shapes
