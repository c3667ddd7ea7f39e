"""Scene descriptions as a capability: the VLM client every stream's describer shares, the `vlm:`
section, the describe stage (descriptions and `vlm` rules), the `vlm` rule type, its service
plugin, and the client's figures for /metrics."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterable

from engines.vlm.client import create_vlm_client
from pipelines.capability import NO_BUDGET, Capability, CapabilityError, Flag, OpenContext, Sample, StreamSwitch
from pipelines.describe import stage
from pipelines.describe.config import VlmConfig
from pipelines.describe.printer import DescriptionLines
from pipelines.describe.rules import VlmRule
from pipelines.describe.settings import DESCRIPTIONS, DescribeEngine
from pipelines.event_bodies import DescriptionBody

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def open_describer(
    settings: VlmConfig, _context: OpenContext = NO_BUDGET
) -> AsyncIterator[DescribeEngine | None]:
    """The VLM client every stream's describer shares, for the duration; None (said once, here)
    when no endpoint is configured."""
    if not settings.enabled:
        log.info("no VLM configured (vlm.endpoints, --vlm-url): running without scene descriptions")
        yield None
        return
    try:
        client = create_vlm_client(settings.client_settings())
    except ValueError as exc:
        raise CapabilityError(str(exc)) from exc
    log.info("scene descriptions on", extra={"endpoints": settings.endpoints, "model": settings.model})
    try:
        yield DescribeEngine(client, settings.model, settings.describe_settings())
    finally:
        await client.aclose()


def vlm_samples(engine: DescribeEngine) -> Iterable[Sample]:
    stats = engine.client.stats()
    yield Sample("vidsentry_vlm_requests", "VLM requests (descriptions and alert checks)", stats.requests)
    yield Sample("vidsentry_vlm_failures", "VLM requests that failed", stats.failed)
    yield Sample("vidsentry_vlm_retries", "VLM request retries", stats.retries)
    yield Sample("vidsentry_vlm_timeouts", "VLM requests that timed out", stats.timeouts)
    yield Sample("vidsentry_vlm_in_flight", "VLM requests in flight", stats.in_flight, "gauge")
    for kind, value in (("prompt", stats.prompt_tokens), ("cached", stats.cached_tokens),
                        ("completion", stats.completion_tokens)):
        yield Sample("vidsentry_vlm_tokens", "VLM tokens by kind", value, labels=(("kind", kind),))
    for form, value in (("json", stats.answers_json), ("extracted", stats.answers_extracted),
                        ("text", stats.answers_text)):
        yield Sample("vidsentry_vlm_answers", "VLM answers to a JSON schema by form (json, extracted from prose or "
                     "a fence, text without JSON)", value, labels=(("form", form),))
    yield Sample("vidsentry_vlm_fields_refused", "VLM requests refused for a field the server does not know (sent "
                 "again without it)", stats.fields_refused)
    yield Sample("vidsentry_vlm_uuid_refusals", "VLM requests refused for naming images by uuid (sent again as data)",
                 stats.uuid_refusals)
    for endpoint in stats.endpoints:
        yield Sample("vidsentry_vlm_endpoint_open", "1 while an endpoint's circuit is open (not asked)",
                     int(endpoint.breaker == "open"), "gauge", (("endpoint", endpoint.url),))
        yield Sample("vidsentry_vlm_endpoint_data_only", "1 while an endpoint gets images as data URLs only",
                     int(endpoint.images == "data"), "gauge", (("endpoint", endpoint.url),))


CAPABILITY: Capability[DescribeEngine, VlmConfig] = Capability(
    key=DESCRIPTIONS,
    section="vlm",
    settings=VlmConfig,
    open=open_describer,
    build=stage.build,
    bodies=(DescriptionBody,),
    rules=(VlmRule,),  # answered by its stage; a VLM must be configured for them
    service="realtime.service.plugins.descriptions",
    samples=vlm_samples,
    printer=lambda _settings: DescriptionLines(),
    flags=(Flag("--vlm-url", "vLLM (OpenAI-compatible) base URL for scene descriptions, e.g. http://vllm:8000/v1 "
                "(overrides vlm.endpoints)", key="endpoints", value=lambda url: [url]),),
    switch=StreamSwitch(stage.STAGE_NAME, "rolling scene descriptions (when vlm.endpoints are set); vlm rules run "
                        "either way"),
)
