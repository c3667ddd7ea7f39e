"""Every command's arguments, in plain argparse: building `--help` imports nothing heavy.

What the capabilities add (their flags, the searchable kinds) needs the registry, which imports
every capability and the models they use: so the commands that take them (run, serve, search)
get their arguments when their parser is first used, not when the parser is built.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from typing import Any

TOKEN_ENV = "VIDSENTRY_API_TOKEN"
LOG_LEVEL_ENV = "VIDSENTRY_LOG_LEVEL"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vidsentry", description="Real-time video analytics with events over NATS")
    parser.add_argument("--log-level", help=f"debug, info, warning (default), error (also {LOG_LEVEL_ENV})")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)

    serve = commands.add_parser("serve", help="run the service: HTTP API, the config's streams, events over NATS")
    later(serve, add_serve_arguments)

    run = commands.add_parser("run", help="process one source in the foreground")
    later(run, add_run_arguments)

    sub = commands.add_parser("subscribe", help="print events from NATS as JSON lines")
    sub.add_argument("subject", nargs="?", default="vidsentry.>")
    sub.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    sub.add_argument("--count", type=int, help="exit after this many events")
    sub.add_argument("--duration", type=float, help="exit after this many seconds")
    sub.add_argument("--connect-timeout", type=float, default=5.0,
                     help="give up (exit 1) when NATS cannot be reached in this many seconds (default 5)")

    search = commands.add_parser("search", help="search what the streams said and saw (a running service's timeline)")
    later(search, add_search_arguments)

    ask = commands.add_parser("ask", help="ask a question about what the streams said and saw (needs a VLM)")
    ask.add_argument("question")
    add_timeline_arguments(ask)
    ask.add_argument("--json", action="store_true", help="print the checked answer as JSON")

    doctor = commands.add_parser("doctor", help="which engines can run on this machine, and why not")
    doctor.add_argument("--config", help="YAML config whose vlm.endpoints to check (also VIDSENTRY_VLM__* variables)")
    doctor.add_argument("--vlm-url", action="append", help="check this vLLM base URL, e.g. http://vllm:8000/v1 "
                        "(repeatable; overrides vlm.endpoints)")
    doctor.add_argument("--vlm-model", help="the model it should serve (default: vlm.model)")
    add_parity_arguments(doctor)
    return parser


def add_timeline_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the service (default http://127.0.0.1:8080; "
                        f"token from {TOKEN_ENV})")
    parser.add_argument("--stream", action="append", help="only this stream (repeatable)")
    parser.add_argument("--since", help="epoch seconds, RFC 3339, or an age: 15m, 2h, 7d")
    parser.add_argument("--until", help="the same")


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query", help='words, "a phrase", a OR b, -excluded, prefix* (3+ characters)')
    add_timeline_arguments(parser)
    parser.add_argument("--kind", action="append", choices=SearchedKinds(), help="only this kind")
    parser.add_argument("--order", choices=["relevance", "newest"], default="relevance")
    parser.add_argument("--limit", type=int, default=20, help="hits to print (1-100, default 20)")
    parser.add_argument("--json", action="store_true", help="print the API's answer as JSON")


def add_parity_arguments(parser: argparse.ArgumentParser) -> None:
    parity = parser.add_argument_group("parity", "--parity: an engine's detections against ONNX Runtime CPU's")
    parity.add_argument("--parity", action="store_true", help="run the comparison (the other flags need it)")
    parity.add_argument("--file", help="video to take frames from (default: the sample clip)")
    parity.add_argument("--backend", choices=["tensorrt", "onnx-cuda", "onnx-cpu"],
                        help="engine to check (default: the best GPU engine here; onnx-cpu checks the check)")
    parity.add_argument("--model", help="ONNX the checked engine runs (default: the bundled people model)")
    parity.add_argument("--reference-model", help="ONNX the CPU reference runs (default: --model)")
    parity.add_argument("--frames", type=int, default=50, help="frames to compare (default 50)")
    parity.add_argument("--conf", type=float, default=0.25, help="detection score threshold (default 0.25)")
    parity.add_argument("--precision", choices=["fp16", "fp32", "int8"], default="fp16", help="TensorRT precision")
    parity.add_argument("--calibration-cache", help="TensorRT INT8 calibration cache: read if present, "
                        "else written after calibrating on --file")
    parity.add_argument("--json", action="store_true", help="print the report as one JSON object")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="file path, rtsp://… or http(s)://… URL")
    parser.add_argument("--id", dest="stream_id", default="cam", help="stream id (A-Z a-z 0-9 _ -, ≤ 64)")
    parser.add_argument("--model", help="Ultralytics YOLO detect export (.onnx); default: bundled people model")
    parser.add_argument("--config", help="YAML config: detector, tracker, supervisor and NATS settings (flags win)")
    parser.add_argument("--engine", choices=["auto", "tensorrt", "onnx-cuda", "onnx-cpu"], help="default: auto")
    parser.add_argument("--precision", choices=["auto", "fp32", "int8"],
                        help="int8: a quantized copy of the model on the CPU, built once; auto: int8 for the "
                             "bundled model on the CPU (default: detector.precision)")
    parser.add_argument("--ingest", default="pyav", choices=["pyav", "gstreamer"], help="decoder backend")
    parser.add_argument("--nats-url", help="NATS server; default: start an embedded one on loopback")
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    parser.add_argument("--realtime", action="store_true", help="pace a file like a live camera")
    parser.add_argument("--no-audio", action="store_true", help="do not decode audio (no captions)")
    parser.add_argument("--detect-fps", type=float, help="cap detection rate (default: every frame possible)")
    parser.add_argument("--conf", type=float, help="detection score threshold (default 0.25)")
    add_capability_flags(parser)
    parser.add_argument("--connect-attempts", type=int, default=3,
                        help="give up when a network source cannot be reached this many times in a row "
                        "before it was ever live (0: retry forever)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on the last stdout line")



class CommandParser(argparse.ArgumentParser):
    """A command's parser, which adds what it was told to add `later` when it is first used."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.later: list[Callable[[argparse.ArgumentParser], None]] = []

    def _added(self) -> None:
        while self.later:
            self.later.pop(0)(self)

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        self._added()
        return super().parse_known_args(*args, **kwargs)

    def format_help(self) -> str:
        self._added()
        return super().format_help()

    def format_usage(self) -> str:
        self._added()
        return super().format_usage()


def later(parser: argparse.ArgumentParser, add: Callable[[argparse.ArgumentParser], None]) -> None:
    """`add(parser)` when the parser is first used (now, for a plain parser)."""
    if isinstance(parser, CommandParser):
        parser.later.append(add)
    else:
        add(parser)


def add_capability_flags(parser: argparse.ArgumentParser) -> None:
    """Each capability's flags (pipelines.capability.Flag), which win over its section."""
    from pipelines.capabilities import CAPABILITIES  # here: the registry imports every capability

    for capability in CAPABILITIES:
        for flag in capability.flags:
            parser.add_argument(flag.name, dest=flag.dest, help=flag.help)


class SearchedKinds:
    """`--kind`'s choices: the kinds the timeline finds (realtime.timeline.entries), read when first
    checked or shown."""

    def _values(self) -> list[str]:
        from realtime.timeline.entries import indexed_kinds  # here: it reads the registry

        return [kind.value for kind in indexed_kinds()]

    def __contains__(self, value: object) -> bool:
        return value in self._values()

    def __iter__(self) -> Iterator[str]:
        return iter(self._values())


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config: streams, detector, NATS, HTTP (see samples/vidsentry.yaml)")
    parser.add_argument("--host", help="address to listen on (default: http.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default: http.port, 8080; 0 picks a free one)")
    parser.add_argument("--nats-url", help="NATS server; default: nats.url, else an embedded one on loopback")
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help=f"serve a non-loopback address without an API token ({TOKEN_ENV} / http.api_token)",
    )
    add_capability_flags(parser)
    parser.add_argument("--fleet", help="share streams with every worker started with this fleet name on the same "
                        "NATS (A-Z a-z 0-9 _ -, at most 32; default: fleet.name, else no fleet)")
    parser.add_argument("--node", help="this worker's name in events and the fleet (default: node, the host name)")


