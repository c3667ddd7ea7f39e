"""A camera, file or HTTP stream as a graph source: the supervised PyAV / GStreamer reader.

`CameraSource` adapts `CameraSupervisor` (thread-driven decoding under a reconnecting state
machine) to the graph's `MediaSource` protocol: frames and audio go to the graph's tees from the
reader threads, state changes to the graph on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.frames import StreamState
from pipelines.graph import SourceOutputs, counter, register_counters
from pipelines.graph.counters import Counters, frame_stage
from realtime.sources.policy import SourcePolicy
from realtime.sources.spec import SourceSpec
from realtime.sources.supervisor import CameraSupervisor, SourceStats, SupervisorPolicy

register_counters(
    {
        "frames_in": frame_stage("in"),
        "reconnects": counter("Times the source went reconnecting"),
        "stalls": counter("Times the frame watchdog declared the source stalled"),
        "corrupt_packets": counter("Undecodable packets skipped"),
        "connect_attempts": counter("Connect attempts"),
        "abandoned_readers": counter("Reader threads left to end at their own read timeout"),
        "refused_connects": counter("Connects the sources policy refused (streams not from the config file)"),
    },
    section="source",
)


@dataclass(frozen=True, slots=True)
class CameraSourceSpec:
    source: SourceSpec
    ingest: str  # "pyav" | "gstreamer"
    realtime: bool  # pace a file like a live camera (live sources are always real time)
    policy: SupervisorPolicy
    untrusted: bool = False  # added over the API: failure reasons in status events are generic
    admit: SourcePolicy | None = None  # untrusted: the sources policy, checked before every (re)connect


class CameraSource:
    def __init__(self, stream_id: str, spec: CameraSourceSpec) -> None:
        self.stream_id = stream_id
        self.spec = spec
        self.supervisor: CameraSupervisor | None = None
        self._stop_requested = False

    @property
    def display(self) -> str:
        return self.spec.source.display

    @property
    def lossless(self) -> bool:
        return self.spec.source.is_file and not self.spec.realtime

    @property
    def demuxes(self) -> bool:
        return self.spec.ingest == "pyav"  # GStreamer decodes inside its pipeline

    async def run(self, outputs: SourceOutputs) -> StreamState:
        self.supervisor = CameraSupervisor(
            self.stream_id,
            self.spec.source,
            video=outputs.video,
            audio=outputs.audio,
            on_status=outputs.status,
            backend=self.spec.ingest,
            policy=self.spec.policy,
            realtime=self.spec.realtime,
            untrusted=self.spec.untrusted,
            admit=self.spec.admit,
            packets=outputs.packets,
        )
        if self._stop_requested:
            self.supervisor.stop()
        return await self.supervisor.run()

    def stop(self) -> None:
        self._stop_requested = True
        if self.supervisor is not None:
            self.supervisor.stop()

    def counters(self) -> Counters:
        stats = self.supervisor.stats if self.supervisor is not None else SourceStats()
        return {
            "frames_in": stats.frames,
            "reconnects": stats.reconnects,
            "stalls": stats.stalls,
            "corrupt_packets": stats.corrupt_packets,
            "connect_attempts": stats.connect_attempts,
            "abandoned_readers": stats.abandoned_readers,
            "refused_connects": stats.refused_connects,
        }
