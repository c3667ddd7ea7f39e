"""Captions in the service: each stream's recent final captions, read back as WebVTT."""

from __future__ import annotations

import functools

from pipelines.captions.engine import CAPTIONS
from realtime.http import transcript
from realtime.http.page import Panel, static
from realtime.service.plugin import Attached, PluginContext, ServicePlugin
from realtime.streams.transcripts import TranscriptStore


def attach(_ctx: PluginContext) -> Attached:
    store = TranscriptStore()  # each stream's recent finals, for captions.vtt (empty with captions off)
    return Attached(taps=(store.tap,), routes=functools.partial(transcript.add_routes, store=store),
                    forget=(store.forget,), state=store)


# Partials, finals and each utterance's transcript in place of its finals, with its English text
# under it (captions.translate): beside Go live's video, and first under the frame in Watch cameras,
# so a camera's speech is read where it is watched.
PANEL = Panel(
    "captions",
    "Captions",
    static("captions.js"),
    kinds=("partials", "captions", "transcript", "translations"),
    order=10,
)

PLUGIN = ServicePlugin(CAPTIONS.name, attach, panels=(PANEL,))
