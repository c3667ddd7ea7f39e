"""Ask the timeline: a question answered by the VLM from what the index retrieved, every claim
citing its evidence, and every citation checked.

1. Retrieve. The question's content words, OR-ed, ranked by BM25 over the index (with the
   caller's streams and time range): the best `max_evidence` entries become numbered evidence
   [E1]..[En], each with its stream, wall and media time, kind and text; alert entries bring the
   snapshot frame they fired on (a few at most) as images.
2. Answer. One streamed chat completion: answer only from the evidence, cite every claim with
   its numbers. The text is passed on as it arrives (`on_delta`), so the page shows it growing.
3. Check. The answer is split into claims (sentences) and their citations. A citation of
   evidence that does not exist is dropped at once; the rest go to a second, short VLM call with
   a JSON schema that says, per claim and cited entry, whether the entry supports it. A
   citation it does not confirm is dropped; a claim left with none is dropped from the answer. The
   result says what was dropped and why. When the check itself fails (VLM down), the answer is
   returned unchecked, and says so.

Nothing here trusts the model's text: the citations returned are the index's entries, looked up
by number, never what the model wrote about them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import cv2
import numpy as np

from engines.vlm.client import VlmClient
from engines.vlm.errors import VlmBadResponse, VlmError
from engines.vlm.types import VlmImage, VlmMessage, VlmRequest, VlmText
from realtime.errors import ServiceError
from realtime.timeline.errors import IndexUnavailable, QueryTooBroad
from realtime.timeline.index import Filters, Hit
from realtime.timeline.query import QueryError, retrieval_query
from realtime.timeline.search import hit_view

log = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 1000
MAX_EVIDENCE = 12
MAX_EVIDENCE_CHARS = 600  # of one entry's text in the prompt
MAX_IMAGES = 4
ANSWER_TOKENS = 400
CHECK_TOKENS = 600
_CITATION = re.compile(r"\[E(\d{1,3})\]")
# A sentence ends at . ! ? before a space (not inside "3.5"); citations right after it are its own.
_SENTENCE = re.compile(r"\s*(.+?(?:[.!?]+(?=\s|$)(?:\s*\[E\d{1,3}\])*|$))", re.S)

SYSTEM = (
    "You answer questions about what cameras saw and heard. Use only the numbered evidence the user gives. "
    "After every sentence that states something from the evidence, cite the evidence it rests on as [E1] or "
    "[E2][E5]. Never cite evidence that does not say what the sentence says. If the evidence does not answer "
    "the question, say so in one sentence without citations. At most five sentences."
)
CHECK_SYSTEM = (
    "You check citations. For each numbered claim and each evidence entry it cites, say whether that entry, "
    "read alone, supports the claim. Answer only with the JSON the schema asks for."
)
CHECK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "verdicts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "claim": {"type": "integer"},
                    "evidence": {"type": "string"},
                    "supported": {"type": "boolean"},
                },
                "required": ["claim", "evidence", "supported"],
            },
        }
    },
    "required": ["verdicts"],
}


class AskError(ServiceError):
    """The question cannot be answered now; `status` is the HTTP status that says why."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Claim:
    text: str
    citations: list[str]  # "E3", kept only when checked (or the check could not run)


@dataclass(slots=True)
class Answer:
    question: str
    answer: str  # the claims that stand, with their citations
    draft: str  # what the model wrote
    claims: list[Claim]
    dropped: list[dict[str, str]]  # {"claim", "citation", "reason"}
    evidence: list[Hit]
    checked: bool
    model: str
    timings_ms: dict[str, float] = field(default_factory=dict)

    def view(self, live: Callable[[str], bool]) -> dict[str, Any]:
        cited = {c for claim in self.claims for c in claim.citations}
        return {
            "question": self.question,
            "answer": self.answer,
            "draft": self.draft,
            "claims": [{"text": c.text, "citations": c.citations} for c in self.claims],
            "citations": {
                f"E{n}": _citation(hit, live) for n, hit in enumerate(self.evidence, 1) if f"E{n}" in cited
            },
            "dropped": self.dropped,
            "checked": self.checked,
            "evidence": len(self.evidence),
            "model": self.model,
            "latency_ms": {k: round(v, 1) for k, v in self.timings_ms.items()},
        }


def _citation(hit: Hit, live: Callable[[str], bool]) -> dict[str, Any]:
    view = hit_view(hit, live=live)
    view["text"] = hit.text[:MAX_EVIDENCE_CHARS]
    return view


def claims_of(text: str) -> list[Claim]:
    """Sentences with the citations written in them or right after their full stop."""
    out: list[Claim] = []
    for match in _SENTENCE.finditer(text):
        sentence = match.group(1).strip()
        citations = [f"E{n}" for n in _CITATION.findall(sentence)]
        bare = re.sub(r"\s+([.!?,;:])", r"\1", " ".join(_CITATION.sub(" ", sentence).split()))
        if bare:
            out.append(Claim(bare, list(dict.fromkeys(citations))))
        elif out:  # citations alone: the previous sentence's
            out[-1].citations += [c for c in citations if c not in out[-1].citations]
    return out


@dataclass(slots=True)
class AskStats:
    asked: int = 0
    failed: int = 0  # the VLM could not answer
    citations_dropped: int = 0  # by the check, or citing nothing
    refused: int = 0  # past the questions answered at once (counted by the HTTP route)


class Asker:
    def __init__(self, search: Callable[..., Any], vlm: VlmClient, model: str, *,
                 snapshot: Callable[[str], Any] | None = None, max_evidence: int = MAX_EVIDENCE,
                 timeout_s: float = 60.0) -> None:
        self._search = search  # Timeline.retrieve: (question, filters, limit) -> hits
        self._vlm = vlm
        self._model = model
        self._snapshot = snapshot  # reference -> JPEG bytes (alert snapshots), or None
        self.max_evidence = max_evidence
        self.timeout_s = timeout_s
        self.stats = AskStats()

    async def ask(self, question: str, filters: Filters, *,
                  on_delta: Callable[[str | None], None] | None = None,
                  on_evidence: Callable[[list[Hit]], None] | None = None) -> Answer:
        question = " ".join(question.split())
        if not question:
            raise AskError("question: say what to ask", 400)
        if len(question) > MAX_QUESTION_CHARS:
            raise AskError(f"question: at most {MAX_QUESTION_CHARS} characters", 400)
        self.stats.asked += 1
        timings: dict[str, float] = {}
        started = time.monotonic()
        try:
            retrieval_query(question)  # a question with nothing to look for is refused before anything runs
        except QueryError as exc:
            raise AskError(f"question: {exc}", 400) from None
        try:
            evidence: list[Hit] = await self._search(question, filters, self.max_evidence)
        except QueryTooBroad as exc:
            raise AskError(f"{exc}: name a stream or a time range", 400) from None
        except IndexUnavailable as exc:
            raise AskError(str(exc), 503) from None
        timings["retrieve"] = 1000 * (time.monotonic() - started)
        if on_evidence is not None:
            on_evidence(evidence)
        if not evidence:
            text = "Nothing in the timeline matches the question."
            if on_delta is not None:
                on_delta(text)
            return Answer(question, text, text, [Claim(text, [])], [], [], True, self._model, timings)
        images = await self._images(evidence)
        stage = time.monotonic()
        try:
            response = await self._vlm.complete(self._answer_request(question, evidence, images), on_delta=on_delta)
        except VlmError as exc:
            self.stats.failed += 1
            raise AskError(f"the VLM could not answer: {exc}", 503) from None
        timings["answer"] = 1000 * (time.monotonic() - stage)
        draft = response.text.strip()
        claims = claims_of(draft)
        cited_at_first = {id(c) for c in claims if c.citations}
        dropped: list[dict[str, str]] = []
        for claim in claims:  # a number outside the evidence cites nothing
            for citation in [c for c in claim.citations if not 1 <= int(c[1:]) <= len(evidence)]:
                claim.citations.remove(citation)
                dropped.append({"claim": claim.text, "citation": citation, "reason": "no such evidence"})
        stage = time.monotonic()
        checked = True
        try:
            verdicts = await self._check(claims, evidence)
        except VlmError as exc:
            checked = False
            log.warning("citation check failed; the answer goes out unchecked", extra={"reason": str(exc)})
        else:
            for n, claim in enumerate(claims, 1):
                for citation in list(claim.citations):
                    verdict = verdicts.get((n, citation))
                    if verdict is not True:  # only what the checker confirmed stands
                        claim.citations.remove(citation)
                        dropped.append({"claim": claim.text, "citation": citation, "reason": (
                            "the checker found it does not support the claim" if verdict is False
                            else "the checker did not confirm it")})
        timings["check"] = 1000 * (time.monotonic() - stage)
        # A claim that cited evidence and has none left goes; one that never cited ("the evidence
        # does not say") stays.
        kept = [c for c in claims if c.citations or id(c) not in cited_at_first]
        dropped += [{"claim": c.text, "citation": "", "reason": "no citation left: claim removed"}
                    for c in claims if not c.citations and id(c) in cited_at_first]
        self.stats.citations_dropped += sum(1 for d in dropped if d["citation"])
        answer = " ".join(_cited(c) for c in kept)
        timings["total"] = 1000 * (time.monotonic() - started)
        return Answer(question, answer, draft, kept, dropped, evidence, checked, self._model, timings)

    def _answer_request(self, question: str, evidence: Sequence[Hit], images: list[VlmImage]) -> VlmRequest:
        lines = [_evidence_line(n, hit) for n, hit in enumerate(evidence, 1)]
        parts: list[VlmText | VlmImage] = [VlmText("Evidence:\n" + "\n".join(lines))]
        parts += images
        parts.append(VlmText(f"Question: {question}"))
        return VlmRequest((VlmMessage("system", (VlmText(SYSTEM),)), VlmMessage("user", tuple(parts))),
                          route_key="ask", max_tokens=ANSWER_TOKENS, timeout_s=self.timeout_s)

    async def _check(self, claims: Sequence[Claim], evidence: Sequence[Hit]) -> dict[tuple[int, str], bool]:
        cited = [(n, claim) for n, claim in enumerate(claims, 1) if claim.citations]
        if not cited:
            return {}
        used = sorted({c for _, claim in cited for c in claim.citations}, key=lambda c: int(c[1:]))
        text = "Evidence:\n" + "\n".join(_evidence_line(int(c[1:]), evidence[int(c[1:]) - 1]) for c in used)
        text += "\n\nClaims:\n" + "\n".join(f"{n}. {claim.text} (cites {', '.join(claim.citations)})"
                                            for n, claim in cited)
        request = VlmRequest((VlmMessage("system", (VlmText(CHECK_SYSTEM),)), VlmMessage("user", (VlmText(text),))),
                             route_key="ask", max_tokens=CHECK_TOKENS, json_schema=CHECK_SCHEMA,
                             timeout_s=self.timeout_s)
        response = await self._vlm.complete(request)
        if response.fields is None:  # a server that ignores the schema: prose cannot confirm a citation
            raise VlmBadResponse("the checker answered without the JSON it was asked for", text=response.text)
        verdicts: dict[tuple[int, str], bool] = {}
        for item in response.fields.get("verdicts") or ():
            if isinstance(item, dict) and isinstance(item.get("supported"), bool):
                try:
                    verdicts[(int(item["claim"]), str(item["evidence"]).strip("[]"))] = item["supported"]
                except (KeyError, TypeError, ValueError):
                    continue
        return verdicts

    async def _images(self, evidence: Sequence[Hit]) -> list[VlmImage]:
        if self._snapshot is None:
            return []
        refs = [h.extra["snapshot"] for h in evidence if isinstance(h.extra.get("snapshot"), str)][:MAX_IMAGES]
        images: list[VlmImage] = []
        for ref in refs:
            try:
                async with asyncio.timeout(2.0):
                    jpeg = await self._snapshot(ref)
                decoded = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_REDUCED_GRAYSCALE_8)
                if decoded is None:
                    continue
                images.append(VlmImage(jpeg, decoded.shape[1] * 8, decoded.shape[0] * 8))
            except Exception as exc:  # a snapshot that expired or cannot be read: the text still answers
                log.debug("snapshot for ask unavailable", extra={"reason": str(exc)})
        return images


def _cited(claim: Claim) -> str:
    """The claim with its citations before its full stop: "The door opened [E2]." """
    if not claim.citations:
        return claim.text
    marks = "".join(f"[{c}]" for c in claim.citations)
    body = claim.text.rstrip(".!?")
    return f"{body} {marks}{claim.text[len(body):]}"


def _evidence_line(n: int, hit: Hit) -> str:
    when = datetime.fromtimestamp(hit.wall).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    at = f", at {hit.pts:.1f} s of the stream" if hit.pts is not None else ""
    return f"[E{n}] {when}, stream {hit.stream_id}{at}, {hit.kind}: {json.dumps(hit.text[:MAX_EVIDENCE_CHARS])}"
