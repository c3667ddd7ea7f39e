"""VLM alert checks: a stream's `vlm` rules, each a yes/no question asked on its own cadence.

The question rides on the describer's window (same prefix, so it is nearly all cached) with a
short JSON answer. Answers are verdicts for the rule's `AlertLifecycle`, the same one every other
rule type uses: "yes" held for `for_s` starts an alert, "no" for `clear_s` ends it, then the
cooldown. The model's short reason is the alert's evidence.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.clock import Moment
from pipelines.describe.rules import VlmRule
from pipelines.rules.evaluators import STREAM_SUBJECT
from pipelines.rules.lifecycle import AlertLifecycle, AlertStart
from pipelines.rules.types import AlertChange

MAX_REASON_CHARS = 200
# A prose answer's first word, after any markup ("**Yes.** The man ..."), then the rest as reason.
_PLAIN_RE = re.compile(r"^[\W_]*(yes|no)\b[\W_]*(.*)", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True, slots=True)
class Verdict:
    answer: bool
    reason: str


def parse_verdict(fields: Mapping[str, Any] | None, text: str) -> Verdict | None:
    """The model's yes/no and reason; None when the answer says neither. A server that ignores the
    JSON schema answers in prose: "Yes, a man lies by the door." reads as yes with that reason."""
    if fields is None:
        try:
            parsed = json.loads(text)
        except ValueError:
            return _plain_verdict(text)
        fields = parsed if isinstance(parsed, dict) else None
    if fields is None:
        return None
    answer = str(fields.get("answer", "")).strip().lower()
    if answer not in ("yes", "no"):
        return None
    reason = " ".join(str(fields.get("reason", "")).split())[:MAX_REASON_CHARS]
    return Verdict(answer == "yes", reason)


def _plain_verdict(text: str) -> Verdict | None:
    match = _PLAIN_RE.match(text)
    if match is None:
        return None
    reason = " ".join(match.group(2).split()).rstrip(".")[:MAX_REASON_CHARS]
    return Verdict(match.group(1).lower() == "yes", reason)


class _Check:
    def __init__(self, rule: VlmRule) -> None:
        self.rule = rule
        self.lifecycle = AlertLifecycle(rule)
        self.next_t: float | None = None  # stream time it is asked next; None: at once


class VlmChecks:
    """One stream's `vlm` rules. Pure: time moves with the stream times passed in."""

    def __init__(self, rules: Sequence[VlmRule]) -> None:
        self._checks = [_Check(rule) for rule in rules]
        self.asked = 0
        self.unanswered = 0  # answers that were neither yes nor no

    def __bool__(self) -> bool:
        return bool(self._checks)

    def due(self, t: float) -> VlmRule | None:
        """The rule to ask now (the longest overdue), or None."""
        waiting = [c for c in self._checks if c.next_t is None or c.next_t <= t]
        if not waiting:
            return None
        check = min(waiting, key=lambda c: -1.0 if c.next_t is None else c.next_t)
        return check.rule

    def ask(self, rule: VlmRule, t: float) -> None:
        check = self._check(rule)
        check.next_t = t + rule.cadence_s
        self.asked += 1

    def verdict(self, rule: VlmRule, now: Moment, verdict: Verdict | None, *, model: str) -> AlertChange | None:
        """Feed one answer, decided on the frame at `now`; a start or an end, or None."""
        if verdict is None:
            self.unanswered += 1
            return None
        check = self._check(rule)

        def describe() -> AlertStart:
            evidence = {
                "trigger": "vlm",
                "question": rule.question,
                "answer": "yes",
                "reason": verdict.reason,
                "model": model,
            }
            return AlertStart((), None, evidence)

        return check.lifecycle.observe(now, STREAM_SUBJECT, verdict.answer, hold_s=rule.for_s, describe=describe)

    def finish(self, now: Moment) -> list[AlertChange]:
        """The stream stopped: every open alert ends."""
        return [change for check in self._checks for change in check.lifecycle.finish(now)]

    @property
    def active(self) -> int:
        return sum(c.lifecycle.active for c in self._checks)

    @property
    def suppressed(self) -> int:
        return sum(c.lifecycle.suppressed for c in self._checks)

    def _check(self, rule: VlmRule) -> _Check:
        return next(c for c in self._checks if c.rule is rule)
