"""The VLM client against the real simulator server: requests, usage, prefix reuse, vLLM's refusals."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging

import pytest

from engines.vlm.errors import (
    VlmBadResponse,
    VlmContextTooLong,
    VlmRequestError,
    VlmTimeout,
    VlmTooManyImages,
    VlmUnavailable,
)
from engines.vlm.types import VlmImage
from tests.engines.vlm.builders import SCHEMA, append_only, question, sliding
from tests.engines.vlm.conftest import MakeClient
from tests.support.vllm_sim import VllmSimulator
from tests.support.waiting import wait_until


async def test_a_description_with_images_and_a_schema_returns_fields_and_usage(
    sim: VllmSimulator, make_client: MakeClient, frames: list[VlmImage]
) -> None:
    client = await make_client(sim.url)
    response = await client.complete(append_only(frames, 3, priority=10, salt="tenant-a"))

    assert response.fields is not None and set(response.fields) == {"description", "people"}
    assert json.loads(response.text) == response.fields
    assert response.prompt_tokens > 3 * 144  # three 448x252 frames at 144 tokens each, plus the text
    assert response.completion_tokens > 0
    assert response.endpoint == sim.url and response.model == sim.model
    body = sim.requests[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["priority"] == 10 and body["cache_salt"] == "tenant-a"
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == SCHEMA
    images = [p for p in body["messages"][1]["content"] if p["type"] == "image_url"]
    assert [p["image_url"]["url"] for p in images] == [f.data_url() for f in frames[:3]]
    assert all(p["uuid"] and p["uuid"] != f.digest for p, f in zip(images, frames, strict=False))  # salted


async def test_cached_tokens_grow_for_an_append_only_window(
    sim: VllmSimulator, make_client: MakeClient, frames: list[VlmImage]
) -> None:
    client = await make_client(sim.url)
    first = await client.complete(append_only(frames, 2))
    second = await client.complete(append_only(frames, 4))
    third = await client.complete(append_only(frames, 6))

    # Everything before the first request's instruction is reused: only its tail, the generation
    # prompt and a partly filled block are computed again.
    assert second.cached_tokens is not None and second.cached_tokens >= first.prompt_tokens - 40
    assert third.cached_tokens is not None and third.cached_tokens >= second.prompt_tokens - 40
    assert third.cached_tokens / third.prompt_tokens > 0.6
    stats = client.stats()
    assert stats.cached_tokens == (first.cached_tokens or 0) + second.cached_tokens + third.cached_tokens


async def test_a_sliding_window_or_another_salt_reuses_next_to_nothing(
    sim: VllmSimulator, make_client: MakeClient, frames: list[VlmImage]
) -> None:
    client = await make_client(sim.url)
    window = await client.complete(sliding(frames, 0, 4))
    slid = await client.complete(sliding(frames, 2, 4))
    # Only the system prompt is shared; the frames after it moved.
    assert slid.cached_tokens is not None and slid.cached_tokens <= 64 < window.prompt_tokens // 4

    await client.complete(append_only(frames, 4, salt="tenant-a"))
    same_salt = await client.complete(append_only(frames, 4, salt="tenant-a"))
    other_salt = await client.complete(append_only(frames, 4, salt="tenant-b"))
    assert same_salt.cached_tokens is not None and same_salt.cached_tokens > same_salt.prompt_tokens * 0.9
    assert other_salt.cached_tokens == 0  # the salted first block differs, and every block chains to it


async def test_the_stream_is_joined_across_multibyte_characters(make_client: MakeClient) -> None:
    text = "Zwei Personen gehen über den Hof; één fiets; 二人が歩いている."
    async with VllmSimulator(answer=lambda body: text, per_token_s=0.001) as sim:
        client = await make_client(sim.url)
        response = await client.complete(question())
    assert response.text == text and response.fields is None
    assert response.completion_tokens == len(text.encode()) // 4 + 1


async def test_an_answer_that_was_not_streamed_is_read_whole(
    sim: VllmSimulator, make_client: MakeClient, frames: list[VlmImage]
) -> None:
    client = await make_client(sim.url)
    sim.ignore_stream = True
    await client.complete(append_only(frames, 2))
    response = await client.complete(append_only(frames, 2))
    assert response.fields is not None and response.cached_tokens and response.completion_tokens > 0


async def test_without_prompt_token_details_cached_tokens_is_unknown(
    make_client: MakeClient, frames: list[VlmImage]
) -> None:
    async with VllmSimulator(prompt_tokens_details=False) as sim:
        client = await make_client(sim.url)
        await client.complete(append_only(frames, 2))
        again = await client.complete(append_only(frames, 2))
    assert again.cached_tokens is None and again.prompt_tokens > 0


async def test_a_slow_server_times_out_and_the_request_is_abandoned(
    sim: VllmSimulator, make_client: MakeClient
) -> None:
    client = await make_client(sim.url)
    sim.latency_s = 3600.0  # never answers: only the request's own timeout can end it
    with pytest.raises(VlmTimeout) as caught:
        await client.complete(question(timeout_s=0.3))
    assert isinstance(caught.value, VlmUnavailable)
    assert client.stats().timeouts == 1 and client.stats().in_flight == 0
    await wait_until(lambda: sim.open_connections == 0)


async def test_malformed_model_json_is_a_bad_response_and_the_endpoint_stays_healthy(
    sim: VllmSimulator, make_client: MakeClient, frames: list[VlmImage]
) -> None:
    client = await make_client(sim.url, breaker_failures=1)
    sim.malformed_next = 1
    with pytest.raises(VlmBadResponse) as caught:
        await client.complete(append_only(frames, 1))
    assert "not JSON" in str(caught.value) and caught.value.text.startswith('{"description"')
    assert len(sim.requests) == 1  # not retried: the same prompt would get the same answer
    assert client.stats().endpoints[0].breaker == "closed"
    assert (await client.complete(append_only(frames, 1))).fields is not None


async def test_json_that_does_not_fit_the_schema_is_a_bad_response(
    make_client: MakeClient, frames: list[VlmImage]
) -> None:
    async with VllmSimulator(answer=lambda body: '{"description": "x", "people": -2}') as sim:
        client = await make_client(sim.url)
        with pytest.raises(VlmBadResponse, match=r"\$\.people: -2 is below the minimum 0"):
            await client.complete(append_only(frames, 1))


async def test_an_answer_cut_at_max_tokens_is_a_bad_response(make_client: MakeClient, frames: list[VlmImage]) -> None:
    long_answer = json.dumps({"description": "word " * 200, "people": 1})
    async with VllmSimulator(answer=lambda body: long_answer) as sim:
        client = await make_client(sim.url)
        with pytest.raises(VlmBadResponse, match="cut at max_tokens=64"):
            await client.complete(append_only(frames, 1))


async def test_a_prompt_over_the_context_length_says_the_servers_limit(
    make_client: MakeClient, frames: list[VlmImage]
) -> None:
    async with VllmSimulator(max_model_len=400) as sim:
        client = await make_client(sim.url)
        with pytest.raises(VlmContextTooLong) as too_long:
            await client.complete(append_only(frames, 3))  # > 400 tokens of images alone
        assert too_long.value.max_tokens == 400 and "However, your request has" in str(too_long.value)
        with pytest.raises(VlmContextTooLong) as no_room:
            # The prompt fits, but not with room for the answer.
            await client.complete(dataclasses.replace(append_only(frames, 2), max_tokens=200))
        assert no_room.value.max_tokens == 400 and "is too large: 200" in str(no_room.value)
        assert len(sim.requests) == 2  # a refusal is not retried
        assert client.stats().endpoints[0].breaker == "closed"


async def test_too_many_images_is_learned_and_then_refused_without_asking(
    make_client: MakeClient, frames: list[VlmImage]
) -> None:
    async with VllmSimulator(limit_images=2) as sim:
        client = await make_client(sim.url)
        assert client.image_limit("cam-1") is None
        with pytest.raises(VlmTooManyImages) as caught:
            await client.complete(append_only(frames, 3))
        assert caught.value.limit == 2 and "--limit-mm-per-prompt" in str(caught.value)
        assert client.image_limit("cam-1") == 2
        with pytest.raises(VlmTooManyImages):
            await client.complete(append_only(frames, 3))
        assert len(sim.requests) == 1  # the second refusal came from what the client learned
        assert (await client.complete(append_only(frames, 2))).fields is not None


async def test_an_unknown_model_is_a_request_error_and_not_retried(sim: VllmSimulator, make_client: MakeClient) -> None:
    client = await make_client(sim.url, model="Qwen/Qwen2.5-VL-3B-Instruct")
    with pytest.raises(VlmRequestError) as caught:
        await client.complete(question())
    assert caught.value.status == 404 and "does not exist" in str(caught.value) and "model name" in str(caught.value)
    assert len(sim.requests) == 1


async def test_the_api_key_is_sent_and_never_shown(make_client: MakeClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with VllmSimulator(api_key="sk-very-secret") as sim:
        without = await make_client(sim.url)
        with pytest.raises(VlmRequestError) as caught:
            await without.complete(question())
        assert caught.value.status == 401 and "API key" in str(caught.value)
        client = await make_client(sim.url, api_key="sk-very-secret")
        assert (await client.complete(question())).text
    settings_repr = repr(client._settings)
    assert "sk-very-secret" not in settings_repr + caplog.text + str(caught.value)


async def test_cancelling_mid_stream_closes_the_connection_and_leaves_no_task(make_client: MakeClient) -> None:
    async with VllmSimulator(answer=lambda body: "step " * 400, per_token_s=0.01) as sim:
        client = await make_client(sim.url)
        before = asyncio.all_tasks()
        call = asyncio.create_task(client.complete(question(timeout_s=20)))
        await wait_until(lambda: sim.in_flight == 1)
        await asyncio.sleep(0.05)  # some of the answer has streamed
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await wait_until(lambda: sim.in_flight == 0 and sim.open_connections == 0)
        assert sim.disconnects == 1
        assert client.stats().in_flight == 0
        assert client.stats().endpoints[0].breaker == "closed"  # a cancel is no verdict on the server
        assert asyncio.all_tasks() - before == set()
        assert (await client.complete(question())).text  # the client carries on



def image_parts(body: dict[str, object]) -> list[dict[str, object]]:
    return [p for m in body["messages"] if isinstance(m["content"], list)  # type: ignore[index,union-attr]
            for p in m["content"] if p["type"] == "image_url"]  # type: ignore[index]


async def test_images_the_server_has_go_by_uuid_alone_and_a_cache_miss_sends_them_again(
    sim: VllmSimulator, make_client: MakeClient, frames: list[VlmImage]
) -> None:
    client = await make_client(sim.url, max_retries=0)
    first = await client.complete(append_only(frames, 3))
    second = await client.complete(append_only(frames, 5))
    parts = image_parts(sim.requests[-1])
    assert [p["image_url"] is None for p in parts] == [True, True, True, False, False]  # the first three known
    assert second.cached_tokens is not None and second.cached_tokens >= first.prompt_tokens - 40  # same prefix
    stats = client.stats()
    assert (stats.images_sent, stats.images_by_uuid, stats.cache_misses) == (5, 3, 0)

    sim.reset_cache()  # the server restarted: it holds nothing
    third = await client.complete(append_only(frames, 6))
    miss, resent = sim.requests[-2], sim.requests[-1]
    assert any(p["image_url"] is None for p in image_parts(miss))  # refused: "Cache miss for image ..."
    assert all(p["image_url"] is not None for p in image_parts(resent))  # sent again, whole, at once
    assert third.text and client.stats().cache_misses == 1 and client.stats().failed == 0
    assert client.stats().retries == 0  # a miss spends no retry


async def test_uuid_only_sending_stops_where_the_server_never_keeps_images(
    sim: VllmSimulator, make_client: MakeClient, frames: list[VlmImage]
) -> None:
    client = await make_client(sim.url)
    for n in range(1, 6):
        await client.complete(append_only(frames, n))
        sim.reset_cache()  # caching off: every uuid-only image misses
    assert client.stats().cache_misses == 3  # then it sends the data every time
    assert all(p["image_url"] is not None for p in image_parts(sim.requests[-1]))


async def test_uuid_only_is_off_when_disabled(sim: VllmSimulator, make_client: MakeClient,
                                              frames: list[VlmImage]) -> None:
    client = await make_client(sim.url, uuid_only_images=0)
    await client.complete(append_only(frames, 2))
    await client.complete(append_only(frames, 3))
    assert all(p["image_url"] is not None for p in image_parts(sim.requests[-1]))


async def test_a_server_that_takes_data_urls_only_gets_them_at_once_and_keeps_its_prefix_reuse(
    make_client: MakeClient, frames: list[VlmImage], caplog: pytest.LogCaptureFixture
) -> None:
    async with VllmSimulator(images="data") as sim:
        client = await make_client(sim.url, max_retries=0)
        with caplog.at_level(logging.WARNING, logger="engines.vlm.client"):
            answers = [await client.complete(append_only(frames, n)) for n in range(2, 7)]

        assert all(a.text for a in answers)  # every one answered: none lost to the uuid refusal
        stats = client.stats()
        assert stats.failed == 0 and stats.retries == 0 and stats.uuid_refusals == 1
        assert stats.endpoints[0].images == "data"
        refused, resent = sim.requests[1], sim.requests[2]
        assert any(p["image_url"] is None for p in image_parts(refused))
        assert all(p["image_url"] is not None and "uuid" not in p for p in image_parts(resent))
        assert all("uuid" not in p for body in sim.requests[2:] for p in image_parts(body))
        # Its cache keys images by their bytes: the window's prefix is reused all the same.
        assert answers[-1].cached_tokens is not None and answers[-1].cached_tokens > 0.6 * answers[-1].prompt_tokens
        said = [r.getMessage() for r in caplog.records if "does not take images by uuid" in r.getMessage()]
        assert len(said) == 1 and sim.url in said[0]


async def test_an_endpoint_that_refused_uuids_is_asked_with_them_again_after_the_reprobe_time(
    make_client: MakeClient, frames: list[VlmImage]
) -> None:
    async with VllmSimulator(images="data") as sim:
        client = await make_client(sim.url, uuid_reprobe_s=0.2)
        await client.complete(append_only(frames, 2))
        await client.complete(append_only(frames, 3))
        assert client.stats().uuid_refusals == 1
        sim.images = "uuid"  # upgraded in place
        await wait_until(lambda: client.stats().endpoints[0].images == "uuid", 5.0, "the reprobe time")
        await client.complete(append_only(frames, 4))
        await client.complete(append_only(frames, 5))
        assert any(p["image_url"] is None for p in image_parts(sim.requests[-1]))  # by uuid again
        assert client.stats().uuid_refusals == 1


async def test_a_refusal_that_is_not_about_uuids_is_raised_and_leaves_uuids_on(
    sim: VllmSimulator, make_client: MakeClient, frames: list[VlmImage]
) -> None:
    client = await make_client(sim.url)
    sim.refuse_fields = ("max_tokens",)  # a field no request goes without
    with pytest.raises(VlmRequestError, match="Unrecognized request argument supplied: max_tokens"):
        await client.complete(append_only(frames, 2))
    assert client.stats().endpoints[0].images == "uuid"  # the same 400 without uuids: not their fault
    assert len(sim.requests) == 2
    sim.refuse_fields = ()
    await client.complete(append_only(frames, 2))
    assert all("uuid" in p for p in image_parts(sim.requests[-1]))


async def test_a_vllm_without_priority_scheduling_gets_requests_without_priority(
    sim: VllmSimulator, make_client: MakeClient, frames: list[VlmImage]
) -> None:
    client = await make_client(sim.url)
    sim.scheduling_policy = "fcfs"  # "Got priority 5 but Priority scheduling is not enabled."
    await client.complete(append_only(frames, 2, priority=5))
    await client.complete(append_only(frames, 3, priority=5))
    assert client.stats().endpoints[0].omitted == ("priority",) and client.stats().failed == 0
    assert "priority" not in sim.requests[-1]


@pytest.mark.parametrize(("answers", "form"), [("schema", "json"), ("fenced", "extracted"), ("prose", "extracted"),
                                                ("text", "text")])
async def test_a_server_that_ignores_the_schema_still_answers_and_the_form_is_counted(
    answers: str, form: str, make_client: MakeClient, frames: list[VlmImage]
) -> None:
    async with VllmSimulator(answers=answers) as sim:
        client = await make_client(sim.url)
        response = await client.complete(append_only(frames, 2))
    assert response.form == form
    if form == "text":  # prose: no fields, the words kept
        assert response.fields is None and response.text == "A person walks across an empty parking lot."
    else:
        assert response.fields == {"description": "A person walks across an empty parking lot.", "people": 1}
    stats = client.stats()
    assert (stats.answers_json, stats.answers_extracted, stats.answers_text) == (
        form == "json", form == "extracted", form == "text")


async def test_json_in_prose_that_breaks_off_or_misfits_is_still_a_bad_response(
    make_client: MakeClient, frames: list[VlmImage]
) -> None:
    async with VllmSimulator(answer=lambda body: '{"description": "x", "people": -2}', answers="fenced") as sim:
        client = await make_client(sim.url)
        with pytest.raises(VlmBadResponse, match="below the minimum"):
            await client.complete(append_only(frames, 1))
    long_answer = "```json\n" + json.dumps({"description": "word " * 200, "people": 1})
    async with VllmSimulator(answer=lambda body: long_answer) as sim:
        client = await make_client(sim.url)
        with pytest.raises(VlmBadResponse, match="cut at max_tokens=64"):
            await client.complete(append_only(frames, 1))


@pytest.mark.parametrize("field", ["cache_salt", "priority", "stream_options"])
async def test_a_field_the_server_does_not_know_is_dropped_for_that_endpoint(
    field: str, make_client: MakeClient, frames: list[VlmImage], caplog: pytest.LogCaptureFixture
) -> None:
    async with VllmSimulator(refuse_fields=(field,)) as sim:
        client = await make_client(sim.url, max_retries=0)
        with caplog.at_level(logging.WARNING, logger="engines.vlm.client"):
            for n in (1, 2, 3):
                response = await client.complete(append_only(frames, n, priority=5, salt="tenant-a"))
        assert response.fields is not None
        stats = client.stats()
        assert stats.failed == 0 and stats.retries == 0 and stats.fields_refused == 1
        assert stats.endpoints[0].omitted == (field,)
        assert field in sim.requests[0] and all(field not in body for body in sim.requests[1:])
        assert len(sim.requests) == 4  # one refused, three answered
        assert sum(f"refused the field '{field}'" in r.getMessage() for r in caplog.records) == 1
        if field == "stream_options":  # no usage in the stream: tokens unknown, not a failure
            assert response.prompt_tokens == 0
