"""Choosing NVDEC or CPU decode, and decoding on the choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.cuda_probe import cuda_device_count
from realtime.sources.decode import (
    DECODE_ENV,
    DecoderChoice,
    DecodeUnavailable,
    decode_mode,
    nvdec_status,
    open_input,
    select_decoder,
)


def test_this_host_decodes_on_the_cpu_and_says_why() -> None:
    if cuda_device_count()[0] > 0:
        pytest.skip("this host has a GPU")
    choice = select_decoder("auto")
    assert choice.device == "cpu"
    assert choice.reason.startswith("CPU decode: ")
    assert "no NVIDIA driver" in choice.reason or "NVDEC" in choice.reason
    assert choice.hwaccel() is None
    with pytest.raises(DecodeUnavailable, match=f"{DECODE_ENV}=cuda but NVDEC cannot run here"):
        select_decoder("cuda")


def test_nvdec_status_names_the_missing_piece() -> None:
    ok, why = nvdec_status(lambda: ["vaapi"], lambda: (1, "1 CUDA device(s)"))
    assert not ok and why.endswith("without the CUDA hwdevice (NVDEC)")
    ok, why = nvdec_status(lambda: ["cuda"], lambda: (0, "no NVIDIA driver"))
    assert not ok and why == "FFmpeg has NVDEC support but no NVIDIA driver"
    ok, why = nvdec_status(lambda: ["cuda", "vaapi"], lambda: (2, "2 CUDA device(s)"))
    assert ok and "2 CUDA device(s)" in why


def test_selection_follows_the_mode() -> None:
    assert select_decoder("cpu", status=lambda: (True, "NVDEC")).device == "cpu"
    chosen = select_decoder("auto", status=lambda: (True, "NVDEC here"))
    assert chosen == DecoderChoice("cuda", "NVDEC here")
    hwaccel = chosen.hwaccel()
    assert hwaccel is not None and hwaccel.allow_software_fallback
    assert select_decoder("cuda", status=lambda: (True, "NVDEC here")).device == "cuda"
    with pytest.raises(ValueError, match="not one of auto, cpu, cuda"):
        select_decoder("gpu")


def test_mode_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DECODE_ENV, raising=False)
    assert decode_mode() == "auto"
    monkeypatch.setenv(DECODE_ENV, " CPU ")
    assert decode_mode() == "cpu"
    monkeypatch.setenv(DECODE_ENV, "nvdec")
    with pytest.raises(ValueError, match=f"{DECODE_ENV}='nvdec'"):
        decode_mode()


def test_open_input_decodes_on_the_choice(sample_clip: Path) -> None:
    choice = select_decoder("auto")
    with open_input(str(sample_clip), choice) as container:
        frame = next(container.decode(video=0))
        image = frame.to_ndarray(format="rgb24")
    assert image.shape == (576, 768, 3)  # host memory either way: see realtime/sources/decode.py
