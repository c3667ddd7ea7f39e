"""Service-wide session metrics; each session's own counters are per-stream metrics already."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from realtime.webrtc.live import ENDINGS, LiveView
from realtime.webrtc.sessions import SessionTable


class SessionCollector(Collector):
    def __init__(self, table: SessionTable) -> None:
        self.table = table

    def collect(self) -> Iterable[Metric]:
        table = self.table
        yield GaugeMetricFamily("vidsentry_webrtc_sessions", "Open browser sessions", value=table.count)
        yield GaugeMetricFamily(
            "vidsentry_webrtc_sessions_limit", "webrtc.max_sessions", value=table.settings.max_sessions
        )
        yield CounterMetricFamily("vidsentry_webrtc_sessions_opened", "Browser sessions opened", value=table.opened)
        yield CounterMetricFamily(
            "vidsentry_webrtc_sessions_rejected", "Offers refused by webrtc.max_sessions (503)", value=table.rejected
        )
        yield CounterMetricFamily(
            "vidsentry_webrtc_sessions_rejected_connecting",
            "Offers refused by webrtc.max_connecting or max_connecting_per_client (503)",
            value=table.rejected_connecting,
        )
        yield GaugeMetricFamily(
            "vidsentry_webrtc_sessions_connecting", "Sessions negotiating or not connected yet", value=table.connecting
        )
        refusals = CounterMetricFamily(
            "vidsentry_webrtc_peer_refusals",
            "What peers sent past a bound: channel (a DataChannel message too large, session ended), "
            "candidates (remote ICE candidates on refused addresses, removed), stun_deferred (STUN requests held "
            "back by the per-session rate limit)",
            labels=["what"],
        )
        for what in ("channel", "candidates", "stun_deferred"):
            refusals.add_metric([what], table.refusals[what])
        yield refusals


class ViewerCollector(Collector):
    """Live viewers (WHEP): now, the bound, refused, and why they ended (`behind`: dropped slow);
    and the live encoders of streams whose packets are not forwarded."""

    def __init__(self, live: LiveView) -> None:
        self.live = live

    def collect(self) -> Iterable[Metric]:
        live = self.live
        yield GaugeMetricFamily("vidsentry_live_viewers", "Live viewers (WHEP) now", value=live.count)
        yield GaugeMetricFamily("vidsentry_live_viewers_limit", "webrtc.max_viewers", value=live.settings.max_viewers)
        yield CounterMetricFamily("vidsentry_live_viewers_opened", "Live viewers opened", value=live.opened)
        yield CounterMetricFamily("vidsentry_live_viewers_refused", "WHEP offers refused by webrtc.max_viewers (503)",
                                  value=live.refused)
        ended = CounterMetricFamily(
            "vidsentry_live_viewers_ended",
            "Live viewers ended, by why: deleted, stream_ended, connection, connect_timeout, behind (dropped: too "
            "far behind webrtc.max_viewer_skips times in a row), shutdown",
            labels=["reason"],
        )
        for reason in ENDINGS:
            ended.add_metric([reason], live.ended[reason])
        yield ended
        yield CounterMetricFamily("vidsentry_live_viewer_skips",
                                  "Times a live viewer fell webrtc.viewer_queue_packets behind and skipped to the "
                                  "next keyframe (open viewers and ended ones)", value=live.skips)
        encoding = live.encoding  # streams whose packets are not forwarded: their frames encoded for viewers
        yield GaugeMetricFamily("vidsentry_live_encoders",
                                "Streams whose frames are being encoded for live viewers now", value=encoding.running)
        yield CounterMetricFamily("vidsentry_live_encoder_starts", "Live encoders started (a stream's first viewer)",
                                  value=encoding.starts)
        yield CounterMetricFamily("vidsentry_live_frames_encoded", "Frames encoded to H.264 for live viewers",
                                  value=encoding.encoded)
        yield CounterMetricFamily("vidsentry_live_frames_skipped",
                                  "Frames not encoded for live viewers: the encoder or its compute budget turn was "
                                  "busy with an earlier frame", value=encoding.skipped)
