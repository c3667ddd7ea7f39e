"""Rule definitions as they appear in a stream's config (`streams[].rules`).

Placeholder until the rule engine lands: no rule types are accepted yet.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RuleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
