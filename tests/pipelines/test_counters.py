"""The counter catalogue: every key declared once with its capability, and the run summary built
from it without naming a stage."""

from __future__ import annotations

import pytest

import pipelines.stages  # noqa: F401  # every stage's counters are declared at import
import realtime.sources.camera  # noqa: F401
from pipelines.graph.counters import counter, counter_info, register_counters, summary_lines


def test_the_summary_groups_what_a_stream_reported_by_capability_in_the_stream_s_order() -> None:
    reported = {
        "status_events_dropped": 1, "frames_processed": 120, "reconnects": 1, "frames_in": 300,
        "frames_predicted": 178, "alerts": 0, "alerts_suppressed": 0,
        "mailbox_depth": 2, "detections": 40, "speech_seconds": 12.25, "asr_short_windows": 3,
        "vlm_prompt_tokens": 900, "masks_skipped": 4, "not_described_anywhere": 7,
    }
    lines = dict(summary_lines(reported))
    # Frames first (in a frame's order), capabilities as the stream reported them, the status queue
    # last; a capability that counted nothing (alerts here) says nothing.
    assert list(lines) == ["frames", "source", "tracking", "captions", "vlm", "masks", "status"]
    assert lines["frames"] == "in 300, processed 120, predicted 178"
    assert lines["captions"] == "speech seconds 12.2, asr short windows 3"  # its section's prefix is not repeated
    assert lines["vlm"] == "prompt tokens 900" and lines["masks"] == "skipped 4"
    assert all("depth" not in line and "not described" not in line for line in lines.values())  # gauges, unknowns


def test_a_key_declared_again_must_mean_the_same_thing() -> None:
    assert counter_info("reconnects").section == "source"
    register_counters({"reconnects": counter("Times the source went reconnecting")}, section="source")  # the same
    with pytest.raises(ValueError, match="reconnects"):
        register_counters({"reconnects": counter("Times the source went reconnecting")}, section="captions")
