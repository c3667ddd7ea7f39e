"""Tiny ONNX models with the real export signatures of SAM / MobileSAM, EfficientSAM and YOLO-seg,
built with onnx.helper. Their outputs are chosen so assertions mean something: the SAM decoders
paint the ellipse inscribed in the prompt box (plus a whole-image mask with a worse IoU score),
and the YOLO-seg model finds two known instances whose prototype masks are known."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
OPSET = [helper.make_opsetid("", 17)]


def _const(name: str, value: np.ndarray | float) -> onnx.NodeProto:
    array = np.asarray(value, np.float32 if isinstance(value, float) else None)
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))


def _save(graph: onnx.GraphProto, path: Path, metadata: dict[str, str] | None = None) -> Path:
    model = helper.make_model(graph, opset_imports=OPSET)
    model.ir_version = 8
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def encoder(path: Path, *, input_name: str = "image", side: int | None = 1024) -> Path:
    """(1, 3, side, side) -> image_embeddings (1, 256, 1, 1): the mean colour through a 1x1 conv
    (side None: dynamic height and width, as EfficientSAM's encoder takes the image as it is)."""
    dims: list[int | str] = [1, 3, side, side] if side else [1, 3, "height", "width"]
    weight = numpy_helper.from_array(np.full((256, 3, 1, 1), 0.01, np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", [input_name], ["pooled"]),
            helper.make_node("Conv", ["pooled", "w"], ["image_embeddings"]),
        ],
        "encoder",
        [helper.make_tensor_value_info(input_name, F, dims)],
        [helper.make_tensor_value_info("image_embeddings", F, [1, 256, 1, 1])],
        [weight],
    )
    return _save(graph, path)


def sam_decoder(path: Path, *, efficient: bool = False, low_res: bool = False) -> Path:
    """SAM's decoder signature (or EfficientSAM's): masks (.., 2, H, W) at orig_im_size, where
    mask 1 (IoU 0.9) is the ellipse inscribed in the box given by the first two points and mask 0
    (IoU 0.1) is the whole image. `low_res`: no orig_im_size, `low_res_masks (1, 2, 256, 256)`
    over the padded 1024 square (NanoSAM's signature)."""
    coords, labels = ("batched_point_coords", "batched_point_labels") if efficient else ("point_coords", "point_labels")
    nodes = [
        _const("size", np.array([256.0, 256.0], np.float32))
        if low_res
        else helper.make_node("Cast", ["orig_im_size"], ["size"], to=F),
        _const("i0", np.array(0, np.int64)),
        _const("i1", np.array(1, np.int64)),
        helper.make_node("Gather", ["size", "i0"], ["h"]),
        helper.make_node("Gather", ["size", "i1"], ["w"]),
        helper.make_node("Max", ["h", "w"], ["longest"]),
        _const("side", 1024.0),
        # SAM prompts are in resized pixels; EfficientSAM's in image pixels.
        helper.make_node("Div", ["longest", "side"], ["to_orig"]) if not efficient else _const("to_orig", 1.0),
        # low_res: "size" is the 256 square, so this is 256 / 1024, prompts to the low-res grid
        _const("flat4", np.array([-1], np.int64)),
        helper.make_node("Reshape", [coords, "flat4"], ["xy"]),
        helper.make_node("Mul", ["xy", "to_orig"], ["pts"]),
    ]
    for i, name in enumerate(("x1", "y1", "x2", "y2")):
        nodes += [_const(f"k{i}", np.array(i, np.int64)), helper.make_node("Gather", ["pts", f"k{i}"], [name])]
    nodes += [
        _const("half", 0.5),
        _const("one", 1.0),
        helper.make_node("Add", ["x1", "x2"], ["sx"]),
        helper.make_node("Mul", ["sx", "half"], ["cx"]),
        helper.make_node("Add", ["y1", "y2"], ["sy"]),
        helper.make_node("Mul", ["sy", "half"], ["cy"]),
        helper.make_node("Sub", ["x2", "x1"], ["dxw"]),
        helper.make_node("Mul", ["dxw", "half"], ["rx"]),
        helper.make_node("Sub", ["y2", "y1"], ["dyh"]),
        helper.make_node("Mul", ["dyh", "half"], ["ry"]),
        helper.make_node("Range", ["half", "w", "one"], ["xs"]),
        helper.make_node("Range", ["half", "h", "one"], ["ys"]),
        helper.make_node("Sub", ["xs", "cx"], ["ex"]),
        helper.make_node("Div", ["ex", "rx"], ["nx"]),
        helper.make_node("Mul", ["nx", "nx"], ["nx2"]),
        helper.make_node("Sub", ["ys", "cy"], ["ey"]),
        helper.make_node("Div", ["ey", "ry"], ["ny"]),
        helper.make_node("Mul", ["ny", "ny"], ["ny2"]),
        _const("ax0", np.array([0], np.int64)),
        _const("ax1", np.array([1], np.int64)),
        helper.make_node("Unsqueeze", ["nx2", "ax0"], ["row"]),
        helper.make_node("Unsqueeze", ["ny2", "ax1"], ["col"]),
        helper.make_node("Add", ["row", "col"], ["dist"]),
        helper.make_node("Sub", ["one", "dist"], ["inside"]),  # > 0 inside the ellipse
        # The embedding flows into the logits (times zero), so the encoder's output is consumed.
        helper.make_node("ReduceMean", ["image_embeddings"], ["emb"], keepdims=0),
        _const("zero", 0.0),
        helper.make_node("Mul", ["emb", "zero"], ["emb0"]),
        helper.make_node("Add", ["inside", "emb0"], ["ellipse"]),
        helper.make_node("Sub", ["ellipse", "ellipse"], ["zeros"]),
        helper.make_node("Add", ["zeros", "one"], ["whole"]),
        helper.make_node("Unsqueeze", ["ellipse", "ax0"], ["e3"]),
        helper.make_node("Unsqueeze", ["whole", "ax0"], ["w3"]),
        helper.make_node("Concat", ["w3", "e3"], ["both"], axis=0),
    ]
    lead = [0, 1] if efficient else [0]
    nodes += [
        _const("lead", np.array(lead, np.int64)),
        helper.make_node("Unsqueeze", ["both", "lead"], ["masks_out"]),
        _const("ious", np.array([[0.1, 0.9]] if not efficient else [[[0.1, 0.9]]], np.float32)),
        helper.make_node("Identity", ["ious"], ["iou_predictions"]),
    ]
    if efficient:
        inputs = [
            helper.make_tensor_value_info("image_embeddings", F, [1, 256, 1, 1]),
            helper.make_tensor_value_info(coords, F, [1, 1, "num_points", 2]),
            helper.make_tensor_value_info(labels, F, [1, 1, "num_points"]),
            helper.make_tensor_value_info("orig_im_size", TensorProto.INT64, [2]),
        ]
        nodes.append(helper.make_node("Identity", ["masks_out"], ["output_masks"]))
        outputs = [
            helper.make_tensor_value_info("output_masks", F, [1, 1, 2, "H", "W"]),
            helper.make_tensor_value_info("iou_predictions", F, [1, 1, 2]),
        ]
    elif low_res:
        inputs = [
            helper.make_tensor_value_info("image_embeddings", F, [1, 256, 1, 1]),
            helper.make_tensor_value_info(coords, F, [1, "num_points", 2]),
            helper.make_tensor_value_info(labels, F, [1, "num_points"]),
            helper.make_tensor_value_info("mask_input", F, [1, 1, 256, 256]),
            helper.make_tensor_value_info("has_mask_input", F, [1]),
        ]
        nodes.append(helper.make_node("Identity", ["masks_out"], ["low_res_masks"]))
        outputs = [
            helper.make_tensor_value_info("iou_predictions", F, [1, 2]),
            helper.make_tensor_value_info("low_res_masks", F, [1, 2, 256, 256]),
        ]
    else:
        inputs = [
            helper.make_tensor_value_info("image_embeddings", F, [1, 256, 1, 1]),
            helper.make_tensor_value_info(coords, F, [1, "num_points", 2]),
            helper.make_tensor_value_info(labels, F, [1, "num_points"]),
            helper.make_tensor_value_info("mask_input", F, [1, 1, 256, 256]),
            helper.make_tensor_value_info("has_mask_input", F, [1]),
            helper.make_tensor_value_info("orig_im_size", F, [2]),
        ]
        nodes += [
            helper.make_node("Identity", ["masks_out"], ["masks"]),
            helper.make_node("Identity", ["mask_input"], ["low_res_masks"]),
        ]
        outputs = [
            helper.make_tensor_value_info("masks", F, [1, 2, "H", "W"]),
            helper.make_tensor_value_info("iou_predictions", F, [1, 2]),
            helper.make_tensor_value_info("low_res_masks", F, [1, 1, 256, 256]),
        ]
    return _save(helper.make_graph(nodes, "decoder", inputs, outputs), path)


# YOLO-seg: a 64x64 input, 2 classes, 32 mask coefficients, 3 anchors, 16x16 prototypes.
SEG_IMGSZ, SEG_NC, SEG_NM, SEG_PROTO = 64, 2, 32, 16


def yolo_seg_outputs() -> tuple[np.ndarray, np.ndarray]:
    """(output0 (1, 4+2+32, 3), output1 (1, 32, 16, 16)) in model pixels.

    Anchor 0: class 0 (0.9), box x 16..48, y 24..40, mask = prototype 0 (the left half of the
    input). Anchor 1: below the threshold. Anchor 2: class 1 (0.8), box x 40..56, y 24..40,
    mask = prototype 1 (everywhere)."""
    pred = np.zeros((1, 4 + SEG_NC + SEG_NM, 3), np.float32)
    pred[0, :4, 0] = [32, 32, 32, 16]
    pred[0, 4, 0] = 0.9
    pred[0, 6 + 0, 0] = 1.0
    pred[0, :4, 1] = [10, 10, 8, 8]
    pred[0, 4, 1] = 0.05
    pred[0, :4, 2] = [48, 32, 16, 16]
    pred[0, 5, 2] = 0.8
    pred[0, 6 + 1, 2] = 1.0
    protos = np.full((1, SEG_NM, SEG_PROTO, SEG_PROTO), -10.0, np.float32)
    protos[0, 0, :, : SEG_PROTO // 2] = 10.0
    protos[0, 1] = 10.0
    return pred, protos


def yolo_seg(path: Path) -> Path:
    pred, protos = yolo_seg_outputs()
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["m"], keepdims=0),
        _const("zero", 0.0),
        helper.make_node("Mul", ["m", "zero"], ["m0"]),
        _const("pred", pred),
        _const("protos", protos),
        helper.make_node("Add", ["pred", "m0"], ["output0"]),
        helper.make_node("Add", ["protos", "m0"], ["output1"]),
    ]
    graph = helper.make_graph(
        nodes,
        "yolo-seg",
        [helper.make_tensor_value_info("images", F, [1, 3, SEG_IMGSZ, SEG_IMGSZ])],
        [
            helper.make_tensor_value_info("output0", F, [1, 4 + SEG_NC + SEG_NM, 3]),
            helper.make_tensor_value_info("output1", F, [1, SEG_NM, SEG_PROTO, SEG_PROTO]),
        ],
    )
    meta = {
        "task": "segment",
        "names": "{0: 'person', 1: 'car'}",
        "imgsz": f"[{SEG_IMGSZ}, {SEG_IMGSZ}]",
        "stride": "32",
    }
    return _save(graph, path, meta)


def ellipse_in(box: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The reference mask the tiny SAM decoders paint for `box` (pixel centres inside the ellipse)."""
    h, w = size
    x1, y1, x2, y2 = box
    ys, xs = np.mgrid[0:h, 0:w] + 0.5
    return ((xs - (x1 + x2) / 2) / ((x2 - x1) / 2)) ** 2 + ((ys - (y1 + y2) / 2) / ((y2 - y1) / 2)) ** 2 < 1
