"""The client's pure parts: frames, SSE parsing, vLLM's error texts, the schema check."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from engines.vlm.errors import VlmContextTooLong, VlmRequestError, VlmTooManyImages
from engines.vlm.images import encode_image
from engines.vlm.schema import schema_problem
from engines.vlm.sse import DONE, SseParser
from engines.vlm.types import VlmImage
from engines.vlm.wire import client_error, is_transient, parse_error
from tests.support.vllm_sim import jpeg_size, smart_resize


def test_a_frame_is_letterboxed_to_exactly_the_size_and_encoded_once() -> None:
    wide = np.full((720, 1280, 3), (0, 0, 255), np.uint8)  # BGR red
    image = encode_image(wide, (448, 448))
    assert (image.width, image.height) == (448, 448) and jpeg_size(image.jpeg) == (448, 448)
    decoded = _decode(image)
    assert decoded[:80].max() < 20  # black bar above
    assert decoded[224, 224, 2] > 200 and decoded[224, 224, 0] < 40  # red kept red (BGR in, BGR out)
    rgb = encode_image(np.full((720, 1280, 3), (255, 0, 0), np.uint8), (448, 448), bgr=False)
    assert _decode(rgb)[224, 224, 2] > 200
    assert image.data_url() is image.data_url()  # built once
    assert image.data_url().startswith("data:image/jpeg;base64,/9j/")
    assert image == VlmImage(image.jpeg, 448, 448)  # same bytes, same identity
    with pytest.raises(ValueError, match="H x W x 3"):
        encode_image(np.zeros((10, 10), np.uint8), (448, 448))


def _decode(image: VlmImage) -> np.ndarray:
    decoded = cv2.imdecode(np.frombuffer(image.jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert decoded is not None
    return decoded


def test_qwen_token_counts_follow_its_resize_rule() -> None:
    full = dict(min_pixels=4 * 784, max_pixels=16384 * 784)
    assert smart_resize(448, 448, **full) == (448, 448)  # 256 tokens
    assert smart_resize(252, 448, **full) == (252, 448)  # 9 x 16 = 144 tokens
    assert smart_resize(720, 1280, **full) == (728, 1288)  # 1,196 tokens
    assert smart_resize(1080, 1920, min_pixels=784, max_pixels=200704) == (336, 588)  # capped near 256 tokens


def test_sse_events_are_split_joined_and_comments_skipped() -> None:
    parser = SseParser(max_event_bytes=64)
    lines = [b": keep-alive\n", b'data: {"a":\r\n', b"data: 1}\n", b"\n", b"event: x\n", b"data: [DONE]\n", b"\n"]
    events = [e for e in (parser.feed(line) for line in lines) if e is not None]
    assert events == ['{"a":\n1}', DONE]
    parser.feed(b"data: tail")
    assert parser.close() == "tail"
    with pytest.raises(ValueError, match="larger than 64"):
        for _ in range(10):
            parser.feed(b"data: " + b"x" * 10)


def test_vllm_error_texts_become_typed_errors_with_the_servers_numbers() -> None:
    prompt_long = parse_error(400, b'{"error": {"message": "This model\'s maximum context length is 32768 tokens. '
                                   b'However, your request has 40000 input tokens. Please reduce the length of the '
                                   b'input messages. (parameter=input_tokens, value=40000)", "type": "BadRequestError",'
                                   b' "param": null, "code": 400}}')
    error = client_error(prompt_long)
    assert isinstance(error, VlmContextTooLong) and error.max_tokens == 32768
    old_shape = parse_error(400, {"object": "error", "message": "This model's maximum context length is 4096 tokens. "
                                  "However, you requested 5000 tokens (4000 in the messages, 1000 in the "
                                  "completion).", "type": "BadRequestError", "code": 400})
    assert client_error(old_shape).max_tokens == 4096  # type: ignore[attr-defined]
    images = client_error(parse_error(400, b'{"error": {"message": "At most 4 image(s) may be provided in one '
                                           b'prompt.", "type": "BadRequestError", "param": "image", "code": 400}}'))
    assert isinstance(images, VlmTooManyImages) and images.limit == 4
    unauthorized = client_error(parse_error(401, b'{"error": "Unauthorized"}'))
    assert isinstance(unauthorized, VlmRequestError) and "API key" in str(unauthorized)
    in_stream = parse_error(200, {"error": {"message": "boom", "type": "InternalServerError", "code": 500}})
    assert in_stream.status == 500 and is_transient(in_stream.status)
    assert parse_error(502, b"<html>Bad Gateway</html>").message == "<html>Bad Gateway</html>"
    assert not is_transient(400) and is_transient(429) and is_transient(503)


def test_the_schema_check_names_what_is_wrong() -> None:
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no"]},
            "people": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["answer"],
        "additionalProperties": False,
    }
    assert schema_problem({"answer": "yes", "people": 2, "tags": ["a"]}, schema) is None
    assert schema_problem({"people": 2}, schema) == "$: missing answer"
    assert schema_problem({"answer": "maybe"}, schema) == "$.answer: 'maybe' is not one of ['yes', 'no']"
    assert schema_problem({"answer": "no", "people": True}, schema) == "$.people: expected integer, got bool"
    assert schema_problem({"answer": "no", "tags": [1]}, schema) == "$.tags[0]: expected string, got int"
    assert schema_problem({"answer": "no", "extra": 1}, schema) == "$: unexpected extra"


def test_settings_refuse_what_cannot_work_and_never_show_the_key() -> None:
    from engines.vlm.client import VlmSettings

    with pytest.raises(ValueError, match="credentials"):
        VlmSettings(endpoints=("http://user:pw@vllm:8000/v1",), model="m")
    with pytest.raises(ValueError, match="twice"):
        VlmSettings(endpoints=("http://a/v1", "http://a/v1"), model="m")
    with pytest.raises(ValueError, match="http"):
        VlmSettings(endpoints=("vllm:8000",), model="m")
    assert "sk-123" not in repr(VlmSettings(endpoints=("http://a/v1",), model="m", api_key="sk-123"))
