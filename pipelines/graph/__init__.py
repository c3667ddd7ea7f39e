"""One stream's graph: a media source, tees that give each consumer its own latest-frame mailbox,
and any set of stages, run and stopped as one unit.

    source ──frames──▶ FrameTee ──▶ mailbox ▶ frame loop (primary: detect → track → rules → events)
           │                   └──▶ mailbox ▶ any other frame stage, at its own rate
           └──audio──▶ AudioTee ──▶ buffer  ▶ audio stages
           └──status─▶ StatusRelay ─▶ status events

A stage is one module with a factory `build(ctx) -> Stage | None`; `pipelines.stages` lists the
factories every stream gets. Nothing here imports `realtime`: sources and the event sink come in
through small protocols.
"""

from pipelines.graph.counters import CounterInfo, counter, counter_info, gauge, register_counters
from pipelines.graph.engines import SharedEngines
from pipelines.graph.graph import StageFailed, StreamGraph
from pipelines.graph.source import MediaSource, SourceOutputs
from pipelines.graph.spec import ProcessingSpec
from pipelines.graph.stage import Stage, StageContext, StageFactory
from pipelines.graph.tee import AudioTee, FrameTee

__all__ = [
    "AudioTee",
    "CounterInfo",
    "FrameTee",
    "MediaSource",
    "ProcessingSpec",
    "SharedEngines",
    "SourceOutputs",
    "Stage",
    "StageContext",
    "StageFactory",
    "StageFailed",
    "StreamGraph",
    "counter",
    "counter_info",
    "gauge",
    "register_counters",
]
