"""`vidsentry search QUERY` and `vidsentry ask QUESTION`: a running service's timeline
(GET /api/search, POST /api/ask). Search prints the hits one line each; ask prints the answer as
it is written, then the checked answer and its citations. `--json` prints the API's answer as it is.

Exit 0 with or without hits; 2 for a query or question the service refuses (its reason, one
line); 1 when the service cannot be reached or answers otherwise (no VLM, a VLM outage).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, TextIO
from urllib.parse import urlencode, urlsplit

import aiohttp

from realtime.cli.args import TOKEN_ENV
from realtime.cli.errors import EXIT_OK, EXIT_RUNTIME, CommandError
from realtime.timeline.search import marked

TIMEOUT_S = 30.0
ASK_TIMEOUT_S = 120.0


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CommandError(f"--url must be the service's http(s):// address, e.g. http://127.0.0.1:8080, not {url!r}")
    return url.rstrip("/")


def params(args: argparse.Namespace) -> dict[str, str]:
    out = {"q": args.query, "limit": str(args.limit), "order": args.order}
    for name in ("stream", "kind", "since", "until"):
        value = getattr(args, name)
        if value:
            out[name] = ",".join(value) if isinstance(value, list) else value
    return out


def hit_line(hit: dict[str, Any], *, color: bool) -> str:
    when = datetime.fromtimestamp(hit["wall"]).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    at = f"{hit['pts']:.1f}s" if hit.get("pts") is not None else "-"
    snippet = marked(hit["snippet"], hit["marks"], "\x1b[1m" if color else "«", "\x1b[0m" if color else "»")
    line = f"{when}  {hit['stream_id']}  {hit['kind']:<12}  {at:>8}  {snippet}"
    clip = hit.get("clip")
    if clip:
        line += f"  [clip {clip['clip_id'][:8]} at {clip['offset_s']:.1f}s]"
    return line


@contextlib.asynccontextmanager
async def _call(url: str, method: str, path: str, *, timeout_s: float, headers: dict[str, str],
                **kwargs: Any) -> AsyncIterator[aiohttp.ClientResponse]:
    """One request to the service; its response when it is a 200. Anything else is a CommandError
    with one line: the service's reason for a 400 (exit 2), its status and reason otherwise, and
    what to check when it cannot be reached (exit 1)."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        headers = {**headers, "Authorization": f"Bearer {token}"}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.request(method, f"{url}{path}", headers=headers, **kwargs) as response,
        ):
            if response.status != 200:
                try:
                    body = await response.json(content_type=None)
                except ValueError:
                    body = None
                reason = body.get("error") if isinstance(body, dict) else None
                if response.status == 400 and reason:
                    raise CommandError(str(reason))
                hint = f" (set {TOKEN_ENV})" if response.status == 401 else ""
                raise CommandError(f"{url} answered {response.status}: {reason or response.reason}{hint}",
                                   EXIT_RUNTIME)
            yield response
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise CommandError(f"cannot reach the service at {url} ({exc.__class__.__name__}); is `vidsentry serve` "
                           "running there? (--url)", EXIT_RUNTIME) from None


async def fetch(url: str, query: dict[str, str]) -> dict[str, Any]:
    async with _call(url, "GET", f"/api/search?{urlencode(query)}", timeout_s=TIMEOUT_S, headers={}) as response:
        try:
            body = await response.json(content_type=None)
        except ValueError:
            body = None
    if not isinstance(body, dict):
        raise CommandError(f"{url} answered with something that is not a search result", EXIT_RUNTIME)
    return body


async def search_command(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    url = check_url(args.url)
    body = await fetch(url, params(args))
    if args.json:
        out.write(json.dumps(body, ensure_ascii=False) + "\n")
        return EXIT_OK
    color = out.isatty()
    for hit in body["hits"]:
        out.write(hit_line(hit, color=color) + "\n")
    if not body["hits"]:
        print(f"no hits for {args.query!r}", file=sys.stderr)
    elif body.get("next"):
        print(f"more: --limit {args.limit} and offset {body['offset'] + body['limit']} (--json gives the link)",
              file=sys.stderr)
    return EXIT_OK


async def ask_command(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """`vidsentry ask QUESTION`: the answer as the model writes it, then the checked answer with
    its citations (stream, time, clip), and what the check dropped."""
    url = check_url(args.url)
    body: dict[str, Any] = {"question": args.question}
    if args.stream:
        body["streams"] = args.stream
    for name in ("since", "until"):
        if getattr(args, name):
            body[name] = getattr(args, name)
    streaming = out.isatty() and not args.json
    final: dict[str, Any] | None = None
    async with _call(url, "POST", "/api/ask", timeout_s=ASK_TIMEOUT_S, headers={"Accept": "text/event-stream"},
                     json=body) as response:
        kind = ""
        async for raw in response.content:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
                continue
            if not line.startswith("data: "):
                continue
            data = json.loads(line[6:])
            if kind == "delta" and streaming:
                out.write(data["text"])
                out.flush()
            elif kind == "restart" and streaming:
                out.write("\n[retrying]\n")
            elif kind == "error":
                raise CommandError(str(data.get("error")), EXIT_RUNTIME)
            elif kind == "answer":
                final = data
    if final is None:
        raise CommandError("the answer stopped part-way", EXIT_RUNTIME)
    if args.json:
        out.write(json.dumps(final, ensure_ascii=False) + "\n")
        return EXIT_OK
    if streaming:
        out.write("\n\nchecked:\n")
    out.write(final["answer"] + "\n")
    for label, hit in final["citations"].items():
        when = datetime.fromtimestamp(hit["wall"]).astimezone().strftime("%Y-%m-%d %H:%M:%S")
        at = f" at {hit['pts']:.1f}s" if hit.get("pts") is not None else ""
        clip = f", clip {hit['clip']['clip_id'][:8]} at {hit['clip']['offset_s']:.1f}s" if hit.get("clip") else ""
        out.write(f"  [{label}] {hit['stream_id']}{at}, {when}, {hit['kind']}{clip}: {hit['text'][:120]}\n")
    dropped = [d for d in final["dropped"] if d["citation"]]
    if dropped:
        out.write(f"  dropped {len(dropped)} citation{'s' if len(dropped) != 1 else ''}: "
                  + "; ".join(f"{d['citation']} ({d['reason']})" for d in dropped) + "\n")
    if not final["checked"]:
        out.write("  (unchecked: the citation check could not run)\n")
    return EXIT_OK
