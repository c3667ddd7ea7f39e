"""`vidsentry search QUERY`: ask a running service's timeline (GET /api/search) and print the hits,
one line each, newest or best first; `--json` prints the API's answer as it is.

Exit 0 with or without hits; 2 for a query the service refuses (its reason, one line); 1 when the
service cannot be reached or answers otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime
from typing import Any, TextIO
from urllib.parse import urlencode, urlsplit

import aiohttp

from realtime.cli.args import TOKEN_ENV
from realtime.cli.errors import EXIT_OK, EXIT_RUNTIME, CommandError
from realtime.timeline.search import marked

TIMEOUT_S = 30.0


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


async def fetch(url: str, query: dict[str, str], token: str | None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session,
            session.get(f"{url}/api/search?{urlencode(query)}", headers=headers) as response,
        ):
            try:
                body = await response.json(content_type=None)
            except ValueError:
                body = None
            if response.status == 400 and isinstance(body, dict):
                raise CommandError(str(body.get("error", "the search was refused")))
            if response.status != 200 or not isinstance(body, dict):
                reason = body.get("error") if isinstance(body, dict) else response.reason
                hint = f" (set {TOKEN_ENV})" if response.status == 401 else ""
                raise CommandError(f"{url} answered {response.status}: {reason}{hint}", EXIT_RUNTIME)
            return body
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise CommandError(f"cannot reach the service at {url} ({exc.__class__.__name__}); is `vidsentry serve` "
                           "running there? (--url)", EXIT_RUNTIME) from None


async def search_command(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    url = check_url(args.url)
    body = await fetch(url, params(args), os.environ.get(TOKEN_ENV, "").strip() or None)
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
