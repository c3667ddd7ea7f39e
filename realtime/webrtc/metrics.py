"""Service-wide session metrics; each session's own counters are per-stream metrics already."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
