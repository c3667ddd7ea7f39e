"""Rules are checked against the detector's class names before a stream is accepted (issue 7,
item 19): a rule on a class the model does not have could never fire, and its stream would fail
and restart for ever. The real service and the real nudenet detector (its classes are FACE_FEMALE,
FEET_EXPOSED, ...; no `person`, no `Fall`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.cli import one_error_line, vidsentry
from tests.support.serve_process import write_config
from tests.support.service import LiveService

UNREACHABLE = "rtsp://127.0.0.1:1/cam"


async def test_a_rule_on_an_unknown_class_is_400_naming_the_rule_and_the_classes(svc: LiveService) -> None:
    rules = [
        {"id": "faces", "type": "present", "classes": ["FACE_FEMALE", "FACE_MALE"]},
        {"id": "people", "type": "count", "above": 2, "classes": ["person"]},
    ]
    reply = await svc.call("POST", "/api/streams", json_body={"id": "cam", "url": UNREACHABLE, "rules": rules})
    assert reply.status == 400, reply
    (problem,) = reply.body["detail"]
    assert problem["field"] == "rules.1.classes"
    assert "'people'" in problem["message"] and "'person'" in problem["message"]
    assert "FACE_FEMALE" in problem["message"] and "FEET_EXPOSED" in problem["message"]  # what there is
    assert (await svc.call("GET", "/api/streams")).body["streams"] == []

    fall = [{"id": "fallen", "type": "fall"}]  # the default fall_class is the bundled model's `Fall`
    reply = await svc.call("POST", "/api/streams", json_body={"id": "cam", "url": UNREACHABLE, "rules": fall})
    assert reply.status == 400 and reply.body["detail"][0]["field"] == "rules.0.fall_class", reply

    reply = await svc.call("POST", "/api/streams", json_body={"id": "cam", "url": UNREACHABLE, "rules": rules[:1]})
    assert reply.status == 201, reply


def test_serve_refuses_a_config_rule_on_an_unknown_class(nudenet_model: Path, tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        {
            "detector": {"model": str(nudenet_model), "engine": "onnx-cpu", "threads": 1},
            "streams": [{"id": "plaza", "url": UNREACHABLE, "rules": [{"id": "people", "type": "present",
                                                                        "classes": ["person"]}]}],
        },
    )
    proc: subprocess.CompletedProcess[str] = vidsentry("serve", "--config", str(config), "--port", "0", timeout=60)
    line = one_error_line(proc, 2)
    assert "streams.0.rules.0.classes" in line and "'people'" in line and "'person'" in line and "FACE_MALE" in line
