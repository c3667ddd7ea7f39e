"""Rule definitions as they appear in a stream's config (`streams[].rules`).

A rule is one of seven types, told apart by its `type` key. Every model forbids unknown keys,
so a typo is an error that names the key instead of a rule that silently never fires.
Coordinates are source pixels, or 0-1 fractions of the frame with `normalized: true`.
A polygon has at most 256 points and a stream at most 64 rules: a zone is drawn by hand, and
validating a body (pairwise edge checks) must stay cheap however it was made. The pairwise check
runs once per distinct polygon (a small cache of verdicts): a config that reuses one zone (a YAML
alias, a copied rule) pays for it once, not once per copy.

Every number has both bounds, with a reason in the error: durations at most a week
(MAX_DURATION_S), counts at most MAX_COUNT objects, pixel coordinates at most MAX_PIXEL.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipelines.rules.geometry import Point, is_simple_polygon, signed_area

RULE_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
RULE_TYPES = ("present", "absent", "count", "zone", "line", "fall", "vlm")

Severity = Literal["info", "warning", "critical"]
ZoneTrigger = Literal["enter", "exit", "dwell"]
Direction = Literal["a_to_b", "b_to_a", "any"]

MAX_POLYGON_POINTS = 256
MAX_RULES = 64
MAX_DURATION_S = 7 * 24 * 3600.0  # for_s, dwell_s, cooldown_s, clear_s: a week is already "never"
MAX_COUNT = 10_000  # objects in a frame: no detector reports more
MAX_PIXEL = 100_000.0  # pixel coordinates: larger than any frame (webrtc takes at most 7680 x 4320)


def _as_tuples(value: Any) -> Any:
    # YAML and JSON have lists, not tuples. Converting here lets a JSON body be validated in
    # strict mode (where a list is not a tuple) without loosening anything else.
    return tuple(_as_tuples(item) for item in value) if isinstance(value, list) else value


def _polygon_input(value: Any) -> Any:
    # Before the points are validated one by one: a huge list is refused at once.
    if isinstance(value, list | tuple) and len(value) > MAX_POLYGON_POINTS:
        raise ValueError(f"a polygon has at most {MAX_POLYGON_POINTS} points, got {len(value)}")
    return _as_tuples(value)


Polygon = Annotated[tuple[Point, ...], BeforeValidator(_polygon_input)]
Segment = Annotated[tuple[Point, Point], BeforeValidator(_as_tuples)]
ClassNames = Annotated[tuple[str, ...], BeforeValidator(_as_tuples)]


def _check_points(points: tuple[Point, ...], normalized: bool) -> None:
    for x, y in points:
        if normalized and not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
            raise ValueError(f"point [{x:g}, {y:g}] is outside 0-1, but normalized is true")
        if not normalized and (x < 0 or y < 0):
            raise ValueError(f"point [{x:g}, {y:g}] is negative; pixel coordinates start at 0")
        if not normalized and (x > MAX_PIXEL or y > MAX_PIXEL):
            raise ValueError(f"point [{x:g}, {y:g}] is beyond {MAX_PIXEL:g} pixels, outside any frame")


def _check_polygon(polygon: tuple[Point, ...], normalized: bool) -> tuple[Point, ...]:
    problem = _polygon_problem(polygon, normalized)
    if problem is not None:
        raise ValueError(problem)
    return polygon


@lru_cache(maxsize=256)
def _polygon_problem(polygon: tuple[Point, ...], normalized: bool) -> str | None:
    """Why the polygon is no zone, or None; cached, so each distinct polygon is checked once
    (the check compares every pair of edges)."""
    if len(polygon) < 3:
        return f"a polygon needs at least 3 points [x, y], got {len(polygon)}"
    try:
        _check_points(polygon, normalized)
    except ValueError as exc:
        return str(exc)
    if not is_simple_polygon(polygon):
        return "the polygon's edges cross each other or repeat a point; list the corners in order"
    if signed_area(polygon) == 0:
        return "the polygon has no area (its points are on one line)"
    return None


def _normalized(info: ValidationInfo) -> bool:
    # `normalized` is declared before the geometry fields, so it is validated first.
    return bool(info.data.get("normalized", False))


class _Rule(BaseModel):
    # Infinity and NaN are not coordinates or durations, and JSON clients cannot parse them back.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    id: str = Field(pattern=RULE_ID_PATTERN)
    severity: Severity = "warning"
    # After an alert ends, the same rule and subject (track, or the whole stream) cannot start a
    # new one for this long: the main defence against floods of repeated alerts.
    cooldown_s: float = Field(30.0, ge=0, le=MAX_DURATION_S)
    # An alert ends once its condition has been false this long; rides over detector flicker.
    clear_s: float = Field(1.0, ge=0, le=MAX_DURATION_S)
    snapshot: bool = False


class _ClassFiltered(_Rule):
    # Class names of the model (e.g. Normal, Fall for the bundled people model); None: all.
    classes: ClassNames | None = None

    @field_validator("classes")
    @classmethod
    def _classes(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and not value:
            raise ValueError("list at least one class name, or leave classes out for all classes")
        return value


class _OptionalZone(_ClassFiltered):
    normalized: bool = False
    # Only objects whose bottom-centre is in this polygon count; None: the whole frame.
    zone: Polygon | None = None
    hysteresis: float = Field(0.1, ge=0, le=1)
    for_s: float = Field(0.0, ge=0, le=MAX_DURATION_S)

    @field_validator("zone")
    @classmethod
    def _zone(cls, value: tuple[Point, ...] | None, info: ValidationInfo) -> tuple[Point, ...] | None:
        return None if value is None else _check_polygon(value, _normalized(info))


class PresentRule(_OptionalZone):
    """At least one object of the classes (in the zone) for `for_s` seconds."""

    type: Literal["present"]


class AbsentRule(_OptionalZone):
    """No object of the classes (in the zone) for `for_s` seconds."""

    type: Literal["absent"]


class CountRule(_OptionalZone):
    """More than `above`, or fewer than `below`, objects for `for_s` seconds (set exactly one)."""

    type: Literal["count"]
    above: int | None = Field(None, ge=0, le=MAX_COUNT)
    below: int | None = Field(None, ge=1, le=MAX_COUNT)

    @model_validator(mode="after")
    def _one_threshold(self) -> CountRule:
        if (self.above is None) == (self.below is None):
            raise ValueError("set exactly one of above or below")
        return self


class ZoneRule(_ClassFiltered):
    """Objects entering, leaving, or staying longer than `dwell_s` in a polygon.

    Membership is decided by the bottom-centre of the box with a hysteresis band of
    `hysteresis` x box height on each side of the outline, so jitter at the edge cannot flap.
    """

    type: Literal["zone"]
    normalized: bool = False
    polygon: Polygon
    events: Annotated[tuple[ZoneTrigger, ...], BeforeValidator(_as_tuples)] = ("enter",)
    dwell_s: float | None = Field(None, gt=0, le=MAX_DURATION_S, validate_default=True)
    for_s: float = Field(0.0, ge=0, le=MAX_DURATION_S)  # an object must be inside this long before `enter` fires
    hysteresis: float = Field(0.1, ge=0, le=1)

    @field_validator("polygon")
    @classmethod
    def _polygon(cls, value: tuple[Point, ...], info: ValidationInfo) -> tuple[Point, ...]:
        return _check_polygon(value, _normalized(info))

    @field_validator("events")
    @classmethod
    def _events(cls, value: tuple[ZoneTrigger, ...]) -> tuple[ZoneTrigger, ...]:
        if not value:
            raise ValueError("list at least one of enter, exit, dwell")
        if len(set(value)) != len(value):
            raise ValueError("an event is listed twice")
        return value

    @field_validator("dwell_s")
    @classmethod
    def _dwell(cls, value: float | None, info: ValidationInfo) -> float | None:
        events = info.data.get("events")
        if events is None:
            return value  # events itself was invalid; that error is reported
        if "dwell" in events and value is None:
            raise ValueError("required when events include dwell")
        if "dwell" not in events and value is not None:
            raise ValueError("set, but events do not include dwell")
        return value


class LineRule(_ClassFiltered):
    """Tracks crossing the segment `points[0]`-`points[1]`.

    Side `a` is on the left of someone standing at the first point facing the second, as the
    image is shown (a line drawn left to right has side `a` above it); `b` is the other side.
    """

    type: Literal["line"]
    normalized: bool = False
    points: Segment
    direction: Direction = "any"
    hysteresis: float = Field(0.1, ge=0, le=1)

    @field_validator("points")
    @classmethod
    def _points(cls, value: tuple[Point, Point], info: ValidationInfo) -> tuple[Point, Point]:
        _check_points(value, _normalized(info))
        if value[0] == value[1]:
            raise ValueError("the two points of a line must differ")
        return value


class FallRule(_Rule):
    """A track whose (smoothed) class is `fall_class` for `for_s` seconds."""

    type: Literal["fall"]
    fall_class: str = Field("Fall", min_length=1)
    for_s: float = Field(2.0, ge=0, le=MAX_DURATION_S)


MAX_QUESTION_CHARS = 300


class VlmRule(_Rule):
    """A yes/no question put to the vision-language model every `cadence_s` seconds about the
    stream's recent frames ("is anyone lying on the ground?"); "yes" for `for_s` seconds is an
    alert. Answered by the describer (only where a VLM is configured), not the frame loop."""

    type: Literal["vlm"]
    question: str = Field(min_length=3, max_length=MAX_QUESTION_CHARS)
    cadence_s: float = Field(5.0, ge=1.0, le=3600.0)
    for_s: float = Field(0.0, ge=0, le=MAX_DURATION_S)
    # Two answers apart is one "no" that may be a wrong answer; ride over it like detector flicker.
    clear_s: float = Field(10.0, ge=0, le=MAX_DURATION_S)

    @field_validator("question")
    @classmethod
    def _question(cls, value: str) -> str:
        value = " ".join(value.split())  # one line: it is written into the prompt as it is
        if len(value) < 3:
            raise ValueError("ask a question of at least 3 characters")
        return value


AnyRule = PresentRule | AbsentRule | CountRule | ZoneRule | LineRule | FallRule | VlmRule


def _known_type(value: Any) -> Any:
    # Say which key is wrong; pydantic's own message for a bad tag does not read well in a config.
    if isinstance(value, dict):
        kind = value.get("type")
        if kind is None:
            raise ValueError(f"type: missing; use one of {', '.join(RULE_TYPES)}")
        if kind not in RULE_TYPES:
            raise ValueError(f"type: {kind!r} is not a rule type; use one of {', '.join(RULE_TYPES)}")
    return value


# What `streams[].rules` holds. Validation errors read `streams.0.rules.1.zone.polygon: ...`
# (the rule's type, then the key).
RuleSpec = Annotated[AnyRule, Field(discriminator="type"), BeforeValidator(_known_type)]


def check_unique_ids(rules: list[AnyRule]) -> list[AnyRule]:
    seen: set[str] = set()
    for rule in rules:
        if rule.id in seen:
            raise ValueError(f"duplicate rule id {rule.id!r}")
        seen.add(rule.id)
    return rules


def _at_most_rules(value: Any) -> Any:
    if isinstance(value, list) and len(value) > MAX_RULES:
        raise ValueError(f"a stream has at most {MAX_RULES} rules, got {len(value)}")
    return value


# A stream's whole rule list: at most MAX_RULES (counted before any is validated), ids unique.
RuleList = Annotated[list[RuleSpec], BeforeValidator(_at_most_rules), AfterValidator(check_unique_ids)]
