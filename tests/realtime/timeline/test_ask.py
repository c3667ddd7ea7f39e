"""Asking the timeline, against the vLLM simulator over real HTTP: evidence retrieved from a real
index, the answer streamed, citations outside the evidence and those the checker rejects dropped,
a claim left without any removed, and a VLM outage said as such."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from engines.vlm.client import VlmClient, VlmSettings, create_vlm_client
from realtime.timeline.ask import Asker, AskError, claims_of
from realtime.timeline.entries import entry_of
from realtime.timeline.index import Filters, Hit, TimelineIndex
from realtime.timeline.query import QueryError, retrieval_query
from tests.realtime.timeline.bodies import caption, clip, description, wire
from tests.support.vllm_sim import VllmSimulator

NOW = time.time()
DRAFT = ("A courier delivered the parcel to the front door [E1][E2]. The courier wore a red jacket [E2]. "
         "A dog barked at him [E7]. Nobody signed for it.")


def answer_or_check(body: dict[str, Any]) -> str:
    if (body.get("response_format") or {}).get("type") == "json_schema":  # the checker's call
        return json.dumps({"verdicts": [
            {"claim": 1, "evidence": "E1", "supported": True},
            {"claim": 1, "evidence": "E2", "supported": False},  # the description does not say "delivered"
            {"claim": 2, "evidence": "E2", "supported": True},
        ]})
    return DRAFT


@pytest.fixture
def index(tmp_path: Path) -> TimelineIndex:
    idx = TimelineIndex(tmp_path / "t.db", max_entries=10_000, max_age_s=86400)
    events = [
        caption("door", "s1", "the parcel was delivered to the front door.", 30.0, at=NOW - 60),
        description("door", "A courier in a red jacket leaves a parcel by the door.", 28.0, 34.0, at=NOW - 58),
        clip("door", "c" * 32, 25.0, 40.0, at=NOW - 40),
        caption("yard", "s2", "the sprinklers came on.", 3.0, at=NOW - 30),
    ]
    idx.add([(n, entry_of(*wire(e))) for n, e in enumerate(events, 1)], 4, now=NOW)
    return idx


@pytest.fixture
async def sim() -> AsyncIterator[VllmSimulator]:
    async with VllmSimulator(answer=answer_or_check, per_token_s=0.001) as server:
        yield server


@pytest.fixture
async def vlm(sim: VllmSimulator) -> AsyncIterator[VlmClient]:
    client = create_vlm_client(VlmSettings(endpoints=(sim.url,), model=sim.model, max_retries=0,
                                           breaker_failures=100))
    yield client
    await client.aclose()


def asker_for(index: TimelineIndex, vlm: VlmClient, model: str) -> Asker:
    async def retrieve(question: str, filters: Filters, limit: int) -> list[Hit]:
        return index.search(retrieval_query(question), filters, limit=limit, offset=0)[0]

    return Asker(retrieve, vlm, model, timeout_s=10.0)


def test_claims_and_their_citations_are_read_from_the_text() -> None:
    claims = claims_of("One thing [E1]. Two things! [E2] [E3] Three at 3.5 s? No citation here")
    assert [(c.text, c.citations) for c in claims] == [
        ("One thing.", ["E1"]), ("Two things!", ["E2", "E3"]), ("Three at 3.5 s?", []), ("No citation here", [])]
    assert retrieval_query("When was the parcel delivered to the door?").fts() == \
        '("parcel" OR "delivered" OR "door")'
    with pytest.raises(QueryError, match="no words"):
        retrieval_query("what is it?")


async def test_an_answer_cites_only_what_the_checker_confirmed(
    index: TimelineIndex, vlm: VlmClient, sim: VllmSimulator
) -> None:
    deltas: list[str | None] = []
    evidence: list[Hit] = []
    result = await asker_for(index, vlm, sim.model).ask(
        "when was the parcel delivered to the door?", Filters(), on_delta=deltas.append, on_evidence=evidence.extend)
    assert "".join(d for d in deltas if d) == DRAFT and len(deltas) > 3  # streamed in pieces
    assert {h.stream_id for h in evidence} == {"door"}  # the sprinklers share no word with the question
    assert result.checked and result.draft == DRAFT
    assert [(c.text, c.citations) for c in result.claims] == [
        ("A courier delivered the parcel to the front door.", ["E1"]),
        ("The courier wore a red jacket.", ["E2"]),
        ("Nobody signed for it.", []),  # cited nothing in the draft: kept as it is
    ]
    reasons = {(d["citation"], d["reason"]) for d in result.dropped}
    assert ("E2", "the checker found it does not support the claim") in reasons
    assert ("E7", "no such evidence") in reasons
    assert ("", "no citation left: claim removed") in reasons  # "A dog barked at him"
    view = result.view(lambda _: False)
    assert set(view["citations"]) == {"E1", "E2"}
    said = view["citations"]["E1"]
    assert said["kind"] == "captions" and said["stream_id"] == "door" and said["pts"] is not None
    assert said["clip"]["clip_id"] == "c" * 32 and said["links"]["mp4"].startswith(f"/api/clips/{'c' * 32}.mp4#t=")
    check = sim.requests[-1]
    assert check["response_format"]["type"] == "json_schema"
    assert "E7" not in json.dumps(check["messages"])  # a citation of nothing is not even asked about
    assert result.answer == ("A courier delivered the parcel to the front door [E1]. "
                             "The courier wore a red jacket [E2]. Nobody signed for it.")


async def test_nothing_found_is_said_without_asking_the_model(index: TimelineIndex, vlm: VlmClient,
                                                              sim: VllmSimulator) -> None:
    result = await asker_for(index, vlm, sim.model).ask("any elephants on the roof?", Filters())
    assert result.answer == "Nothing in the timeline matches the question." and not result.evidence
    assert sim.requests == []


async def test_a_vlm_outage_is_a_503_and_a_failed_check_goes_out_unchecked(
    index: TimelineIndex, vlm: VlmClient, sim: VllmSimulator
) -> None:
    asker = asker_for(index, vlm, sim.model)
    sim.down = True
    with pytest.raises(AskError) as refused:
        await asker.ask("when was the parcel delivered?", Filters())
    assert refused.value.status == 503 and "VLM" in str(refused.value)
    sim.down = False
    sim.fail_next = 0
    original = sim.answer

    def answer_then_fail(body: dict[str, Any]) -> str:
        sim.fail_next = 1  # the next call, the checker's, gets a 500
        return original(body) if original else ""

    sim.answer = answer_then_fail
    result = await asker.ask("when was the parcel delivered?", Filters())
    assert not result.checked
    assert [c.citations for c in result.claims][:2] == [["E1", "E2"], ["E2"]]  # unchecked: as written


@pytest.mark.parametrize(("answers", "checked"), [("fenced", True), ("prose", True), ("text", False)])
async def test_a_server_that_ignores_the_checkers_schema_still_answers(
    answers: str, checked: bool, index: TimelineIndex, vlm: VlmClient, sim: VllmSimulator
) -> None:
    sim.answers = answers
    result = await asker_for(index, vlm, sim.model).ask("when was the parcel delivered to the door?", Filters())
    assert result.draft == DRAFT and result.checked is checked
    if checked:  # the verdicts read from the fence or the prose
        assert [c.citations for c in result.claims] == [["E1"], ["E2"], []]
    else:  # prose cannot confirm a citation: the answer goes out as written, marked unchecked
        assert [c.citations for c in result.claims][:2] == [["E1", "E2"], ["E2"]]
