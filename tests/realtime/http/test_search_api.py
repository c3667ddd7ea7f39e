"""Search through the running service: a real RTSP camera with speech, the real tiny.en model,
the VLM simulator describing it, a real nats-server; its captions and descriptions indexed from
JetStream and found by `GET /api/search` at the right media time. Then what a hostile client
sends: each a 400 that says why, never a 500."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import nats
import pytest

from engines.detector import Detector
from engines.vlm.client import VlmClient, VlmSettings, create_vlm_client
from pipelines.describe.settings import DescribeEngine, DescribeSettings
from realtime.bus.embedded import EmbeddedNatsServer
from tests.realtime.service.test_descriptions import sim, vlm
from tests.realtime.timeline.bodies import caption
from tests.support.cli import one_error_line, vidsentry
from tests.support.rtsp import RtspServer
from tests.support.service import CaptionModels, LiveService, live_service, make_config
from tests.support.sse import sse_events
from tests.support.vllm_sim import VllmSimulator
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
__all__ = ["sim", "vlm"]  # the VLM simulator and client fixtures of the descriptions tests

DESCRIBE = DescribeSettings(min_interval_s=1.0, max_interval_s=2.0, describe_interval_s=2.0, max_frames=4)


@pytest.fixture
async def svc(detector: Detector, nats_server: EmbeddedNatsServer, caption_models: CaptionModels,
              sim: VllmSimulator, vlm: VlmClient) -> AsyncIterator[LiveService]:
    # A server of its own: the index holds this test's events only.
    engine = DescribeEngine(vlm, sim.model, DESCRIBE)
    async with live_service(detector, nats_server.url, config=make_config(), captions=caption_models,
                            describe=engine, timeline=True) as live:
        yield live


async def test_a_spoken_phrase_and_a_description_are_found_at_their_moment(
    svc: LiveService, nats_server: EmbeddedNatsServer, sample_clip: Path, tmp_path: Path
) -> None:
    finals: list[dict[str, Any]] = []
    transcripts: list[dict[str, Any]] = []
    nc = await nats.connect(nats_server.url)

    async def on_final(msg: Any) -> None:
        (finals if msg.subject.endswith(".captions") else transcripts).append(json.loads(msg.data))

    await nc.subscribe("vidsentry.cam.captions", cb=on_final)
    await nc.subscribe("vidsentry.cam.transcript", cb=on_final)
    rtsp = RtspServer(clip=sample_clip, log_path=tmp_path / "rtsp.log").start()
    try:
        reply = await svc.call("POST", "/api/streams", json_body={"id": "cam", "url": rtsp.url("/vtest")})
        assert reply.status == 201, reply
        await wait_until(lambda: sum(len(f["words"]) for f in finals) >= 12, 60, "a dozen words of finals")
        assert (await svc.call("DELETE", "/api/streams/cam")).status == 204
        await wait_until(lambda: svc.service.registry.running_count == 0, 15, "the stream to stop")
        timeline = svc.service.timeline
        assert timeline is not None
        # The stream's end ends its last utterance: every final is then replaced by a transcript.
        await wait_until(lambda: {r for t in transcripts for r in t["replaces"]} == {f["segment_id"] for f in finals},
                         10, "transcripts of every final")
        ids = [f"transcript-cam-{t['utterance_id']}" for t in transcripts]
        await wait_until(lambda: len(timeline.index.known(ids)) == len(ids) and timeline.index.stats.entries > 1, 10,
                         lambda: f"transcripts indexed: {len(timeline.index.known(ids))} of {len(ids)}")
        assert len(timeline.index.known([f"caption-cam-{f['segment_id']}" for f in finals])) == len(finals)
        for _ in range(100):  # a description is asked for every 1-2 s
            described = await svc.call("GET", "/api/search?q=walking+parking&kind=descriptions")
            assert described.status == 200, described
            if described.body["hits"]:
                break
            await asyncio.sleep(0.1)
    finally:
        await nc.close()
        rtsp.close()

    # Two words said one after the other, as a phrase: the hit is the utterance's transcript (which
    # replaced its finals in the index), at the first word's start.
    final = max(transcripts, key=lambda f: len(f["words"]))
    words = [w for w in final["words"] if len(w["word"].strip(".,?!")) > 2]
    first, second = final["words"].index(words[0]), final["words"].index(words[0]) + 1
    phrase = " ".join(re.sub(r"[^\w ]", "", w["word"]) for w in final["words"][first:second + 1]).lower()
    reply = await svc.call("GET", f"/api/search?q={quote(chr(34) + phrase + chr(34))}&stream=cam&kind=captions")
    assert reply.status == 200, reply
    # An utterance is one entry: the hit is the one holding this transcript, at the word's start.
    said_at = final["words"][first]["start"]
    hit = next(h for h in reply.body["hits"] if h["pts"] == pytest.approx(said_at, abs=0.002))
    assert hit["pts"] <= final["start"] + 30 and hit["end_pts"] >= final["end"]
    assert "frame" not in hit["links"]  # the stream has stopped: no newest frame to link
    assert [re.sub(r"[^\w ]", "", hit["snippet"][a:b].lower()) for a, b in hit["marks"]] == [phrase]

    assert described.body["hits"], described
    top = described.body["hits"][0]
    assert top["kind"] == "descriptions" and top["stream_id"] == "cam" and top["pts"] is not None
    assert "\ue000" not in top["snippet"] and top["marks"]

    # Paging: every hit once, and the `next` link carries the query.
    seen: list[str] = []
    path: str | None = "/api/search?q=parking&limit=1"
    while path is not None and len(seen) < 5:
        page = await svc.call("GET", path)
        assert page.status == 200, page
        seen += [h["event_id"] for h in page.body["hits"]]
        path = page.body["next"]
    assert len(seen) == len(set(seen)) >= 2


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("q=", "q"),
        ("q=%22unclosed", "q"),
        ("q=a*", "q"),
        ("q=" + "x" * 600, "q"),
        ("q=door&kind=detections", "kind"),
        ("q=door&stream=..%2Fetc", "stream"),
        ("q=door&since=yesterday", "since"),
        ("q=door&since=2026-01-01T00:00:00", "since"),
        ("q=door&since=10&until=5", "since"),
        ("q=door&limit=1000", "limit"),
        ("q=door&offset=-1", "offset"),
        ("q=door&order=random", "order"),
    ],
)
async def test_bad_searches_are_400s_that_say_why(detector: Detector, shared_nats_server: EmbeddedNatsServer,
                                                 query: str, field: str) -> None:
    async with live_service(detector, shared_nats_server.url, timeline=True) as svc:
        reply = await svc.call("GET", f"/api/search?{query}")
        assert reply.status == 400, reply
        assert reply.body["detail"][0]["field"] == field and reply.body["error"].startswith("invalid search")


async def test_hostile_queries_are_refused_or_bounded(detector: Detector,
                                                     shared_nats_server: EmbeddedNatsServer) -> None:
    async with live_service(detector, shared_nats_server.url, timeline=True) as svc:
        for q in ['NEAR("a" "b")', "text:secret", "^x", "a OR OR b", "{text}:x", "'; DROP TABLE entries; --"]:
            reply = await svc.call("GET", f"/api/search?q={quote(q)}")
            assert reply.status in (200, 400), (q, reply)
            assert reply.is_json
        started = time.monotonic()
        huge = await svc.call("GET", "/api/search?q=" + "a" * (1 << 20))  # a megabyte in the URL
        assert 400 <= huge.status < 500 and time.monotonic() - started < 5
        assert (await svc.call("GET", "/healthz")).status == 200  # still serving


async def test_with_the_timeline_off_search_says_so(detector: Detector,
                                                   shared_nats_server: EmbeddedNatsServer) -> None:
    config = make_config(timeline={"enabled": False})
    async with live_service(detector, shared_nats_server.url, config=config, timeline=True) as svc:
        reply = await svc.call("GET", "/api/search?q=door")
        assert reply.status == 409 and "timeline.enabled" in reply.body["error"]


async def read_events(response: Any) -> list[tuple[str, Any]]:
    return [(event["event"], event["data"]) async for event in sse_events(response)]


async def test_ask_streams_an_answer_with_checked_citations(
    detector: Detector, nats_server: EmbeddedNatsServer
) -> None:
    def answer_or_check(body: dict[str, Any]) -> str:
        if (body.get("response_format") or {}).get("type") == "json_schema":
            return json.dumps({"verdicts": [{"claim": 1, "evidence": "E1", "supported": True}]})
        return "The parcel was left at the front door [E1]. It was raining [E2]."

    async with VllmSimulator(answer=answer_or_check, per_token_s=0.002) as sim:
        client = create_vlm_client(VlmSettings(endpoints=(sim.url,), model=sim.model, max_retries=0))
        engine = DescribeEngine(client, sim.model, DESCRIBE)
        try:
            async with live_service(detector, nats_server.url, describe=engine, timeline=True) as svc:
                now = time.time()
                for event in (caption("door", "s1", "the parcel was left at the front door.", 12.0, at=now),
                              caption("yard", "s2", "it started raining hard.", 40.0, at=now)):
                    await svc.service.publisher.publish(event)
                timeline = svc.service.timeline
                assert timeline is not None
                await wait_until(lambda: timeline.index.stats.entries == 2, 10, "two captions indexed")

                headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}
                body = json.dumps({"question": "where was the parcel left?", "streams": ["door"], "since": "1h"})
                async with svc.session.post(svc.url + "/api/ask", data=body, headers=headers) as response:
                    assert response.status == 200 and response.content_type == "text/event-stream"
                    events = await read_events(response)
                kinds = [k for k, _ in events]
                assert kinds[0] == "evidence" and kinds[-1] == "answer" and kinds.count("delta") > 3
                assert [h["stream_id"] for h in events[0][1]["evidence"]] == ["door"]  # the filter held
                final = events[-1][1]
                assert final["answer"] == "The parcel was left at the front door [E1]."
                assert final["citations"]["E1"]["pts"] == pytest.approx(12.4, abs=0.01)  # "parcel"
                assert {d["citation"] for d in final["dropped"]} >= {"E2"}  # one entry of evidence only

                plain = await svc.call("POST", "/api/ask", json_body={"question": "where was the parcel left?"})
                assert plain.status == 200 and plain.body["citations"]["E1"]["stream_id"] == "door"
                for bad, field in (({"question": ""}, "question"), ({"question": "x", "streams": "door"}, "streams"),
                                   ({"question": "x", "since": "soon"}, "since"), ({"q": "x"}, "q")):
                    reply = await svc.call("POST", "/api/ask", json_body=bad)
                    assert reply.status == 400 and reply.body["detail"][0]["field"] == field, reply
                # The commands, as a user runs them against the service.
                found = await asyncio.to_thread(vidsentry, "search", "front door", "--url", svc.url)
                assert found.returncode == 0 and "door  captions" in found.stdout and "«front» «door»" in found.stdout
                asked = await asyncio.to_thread(vidsentry, "ask", "where was the parcel left?", "--url", svc.url,
                                                "--stream", "door")
                assert asked.returncode == 0, asked.stderr
                assert asked.stdout.startswith("The parcel was left at the front door [E1].")
                assert "[E1] door at 12.4s" in asked.stdout and "dropped 1 citation: E2" in asked.stdout
                bad = await asyncio.to_thread(vidsentry, "search", '"unclosed', "--url", svc.url)
                assert "unclosed quote" in one_error_line(bad, 2)

                sim.down = True
                outage = await svc.call("POST", "/api/ask", json_body={"question": "where was the parcel left?"})
                assert outage.status == 503 and "VLM" in outage.body["error"]
                down = await asyncio.to_thread(vidsentry, "ask", "where was the parcel left?", "--url", svc.url)
                assert "VLM" in one_error_line(down, 1)
                metrics = (await svc.call("GET", "/metrics")).body
                counted = {name: float(value) for name, value in
                           re.findall(r"^vidsentry_timeline_(asks|ask_failures|ask_citations_dropped)_total (\S+)$",
                                      metrics, re.M)}
                assert counted["asks"] == 5 and counted["ask_failures"] == 2, counted
                assert counted["ask_citations_dropped"] >= 3, counted  # E2 in each of the 3 answers
        finally:
            await client.aclose()


async def test_ask_without_a_vlm_says_what_to_configure(detector: Detector,
                                                       shared_nats_server: EmbeddedNatsServer) -> None:
    async with live_service(detector, shared_nats_server.url, timeline=True) as svc:
        reply = await svc.call("POST", "/api/ask", json_body={"question": "anyone at the door?"})
        assert reply.status == 409 and "vlm.endpoints" in reply.body["error"]
