"""The fleet's desired streams as this worker may read them: a trust boundary.

Anyone with write access to NATS can put a value in the desired bucket, without the API's checks.
So a desired stream that is not one of this worker's own config-file streams is held to its
`sources:` policy, as an API stream is. At claim time the checks that touch neither a file nor the
network (`SourcePolicy.check_form`: scheme, local files only under `sources.local_dirs`, never
/proc, /sys, /dev) decide whether this worker claims it at all: a refused stream is not claimed,
so a worker whose policy allows it can take it. The stream's source then runs the whole policy
before every connect (realtime.sources.supervisor), since DNS answers change. The reasons are the
policy's own, which never say whether a file outside the allowed directories exists. Values that
are not a stream of the key's id are skipped. Each value is judged once per key and revision; a
refusal or an unreadable value is logged and counted then.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from realtime.config import STREAM_SETTINGS, AnyStreamSettings, CameraStreamSettings, WebRtcStreamSettings
from realtime.fleet.mirror import KvMirror
from realtime.sources.policy import SourcePolicy
from realtime.sources.spec import InvalidSource

log = logging.getLogger(__name__)

UNOPENED_URL = "rtsp://unopened.invalid/"  # stands in for a refused path while the rest of its value is read


@dataclass(slots=True)
class DesiredCounts:
    refused: int = 0  # values refused by this worker's sources policy (once per key and revision)
    skipped: int = 0  # values that are not a stream of their key's id (once per key and revision)


class DesiredStreams:
    """The desired bucket's mirror, judged: each stream's settings and why this worker may not open it."""

    def __init__(self, mirror: Callable[[], KvMirror | None], policy: SourcePolicy) -> None:
        self._mirror = mirror  # the worker opens the bucket when it joins
        self.policy = policy
        self.counts = DesiredCounts()
        self._own: dict[str, AnyStreamSettings] = {}  # this worker's config-file streams, trusted
        self._judged: dict[str, tuple[int, AnyStreamSettings | None, str | None]] = {}  # id -> (rev, settings, why)

    def trust(self, config_streams: Iterable[AnyStreamSettings]) -> None:
        self._own = {settings.id: settings for settings in config_streams}

    def ids(self) -> list[str]:
        """The keys that hold a stream of their id."""
        mirror = self._mirror()
        if mirror is None:
            return []
        return [key for key, _ in mirror.items() if self.settings(key) is not None]

    def settings(self, stream_id: str) -> AnyStreamSettings | None:
        return self._decoded(stream_id)[0]

    def refusal(self, stream_id: str) -> str | None:
        """Why this worker may not open a desired stream (None: it may, or there is no such stream)."""
        return self._decoded(stream_id)[1]

    def changed(self, key: str) -> None:
        """A key changed in the bucket: what the bucket no longer holds leaves the cache."""
        mirror = self._mirror()
        if mirror is not None and mirror.get(key) is None:
            self._judged.pop(key, None)

    def _decoded(self, stream_id: str) -> tuple[AnyStreamSettings | None, str | None]:
        mirror = self._mirror()
        seen = mirror.get(stream_id) if mirror is not None else None
        if seen is None:
            return None, None
        cached = self._judged.get(stream_id)
        if cached is not None and cached[0] == seen.revision:
            return cached[1], cached[2]
        settings, why = self._judge(stream_id, seen.value, seen.revision)
        if settings is None:
            self.counts.skipped += 1
        elif why is not None:
            self.counts.refused += 1
            log.warning("desired stream refused by this worker's sources policy; not claiming it",
                        extra={"stream_id": stream_id, "revision": seen.revision, "reason": why})
        self._judged[stream_id] = (seen.revision, settings, why)
        return settings, why

    def _judge(self, stream_id: str, raw: bytes, revision: int) -> tuple[AnyStreamSettings | None, str | None]:
        """Its own config-file streams are trusted; any other value is held to the sources policy.
        The policy's form check comes first, as at the API: a path outside `sources.local_dirs` is
        never looked at (validating the settings would), so its refusal is the same whether or not
        the file exists."""
        own = self._own.get(stream_id)
        body = _json_object(raw)
        url = body.get("url") if body is not None else None
        why: str | None = None
        if not (isinstance(own, CameraStreamSettings) and url == own.url):  # its own path: the operator's
            try:
                self.policy.check_form(url)
            except InvalidSource as exc:
                why = str(exc)
        if why is None:
            settings = decode_stream(stream_id, raw, revision)
        else:  # the rest of the value is read as usual; the path stays as written, unopened
            assert body is not None and isinstance(url, str)
            settings = decode_stream(stream_id, json.dumps({**body, "url": UNOPENED_URL}).encode(), revision)
            settings = settings.model_copy(update={"url": url}) if settings is not None else None
        if settings is None or why is not None or settings == own:
            return settings, why
        if isinstance(settings, WebRtcStreamSettings):
            return settings, "browser sessions cannot be added to the desired set"
        try:  # the URL as validated (the same as read above; checked again all the same)
            self.policy.check_form(settings.url)
        except InvalidSource as exc:
            return settings, str(exc)
        return settings, None


def encode_stream(settings: AnyStreamSettings) -> bytes:
    """The stream object as the config and the API write it."""
    return settings.model_dump_json().encode()


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # decode_stream says what is wrong with it
        return None
    return body if isinstance(body, dict) else None


def decode_stream(stream_id: str, raw: bytes, revision: int | None = None) -> AnyStreamSettings | None:
    """The stream a desired-bucket value holds, or None (logged) when it is not one of this key's id.
    DesiredStreams calls it once per key and revision, so each bad value is logged once."""
    try:
        settings = STREAM_SETTINGS.validate_json(raw)
    except ValidationError as exc:
        log.warning("unreadable stream in the fleet's desired set; skipped",
                    extra={"stream_id": stream_id, "revision": revision, "error": str(exc).splitlines()[0]})
        return None
    if settings.id != stream_id:
        log.warning("stream in the fleet's desired set under another key; skipped",
                    extra={"stream_id": stream_id, "revision": revision, "value_id": settings.id[:64]})
        return None
    return settings
