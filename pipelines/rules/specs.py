"""Rule definitions as they appear in a stream's config (`streams[].rules`).

A rule is one of the core types here (evaluated by the frame loop's rule engine on each frame's
tracks) or one a capability declares with its own model (`Capability.rules`; the describer's
`vlm` questions), told apart by its `type` key: the union is built from the registry when the
config model is (`rule_list`), so a capability's rule type edits nothing here. Every model forbids unknown keys,
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

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union, get_args

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

Severity = Literal["info", "warning", "critical"]
ZoneTrigger = Literal["enter", "exit", "dwell"]
Direction = Literal["a_to_b", "b_to_a", "any"]

MAX_POLYGON_POINTS = 256
MAX_RULES = 64
# Long enough to outlast a box's jitter at an edge (a leg found or lost, predicted frames between
# measured ones), short against a person's walk across a zone's edge or a line.
DEFAULT_SETTLE_S = 0.5
MAX_SETTLE_S = 60.0
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


class Rule(BaseModel):
    """What every rule type has. A type is a subclass with `type: Literal["<its name>"]`; what it
    needs of the service it declares here, so no caller asks which type it is."""

    # Infinity and NaN are not coordinates or durations, and JSON clients cannot parse them back.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    # Evaluated by the frame loop's rule engine on each frame's tracks; False: its capability's
    # stage answers it, and the rule engine leaves it alone.
    on_frames: ClassVar[bool] = True
    # The key naming the model's classes it watches (checked against the detector's); None: none.
    class_key: ClassVar[str | None] = None
    # Why it cannot run where its capability is off (the capability that declares it).
    needs: ClassVar[str] = "its capability is off"

    id: str = Field(pattern=RULE_ID_PATTERN)
    severity: Severity = "warning"
    # After an alert ends, the same rule and subject (track, or the whole stream) cannot start a
    # new one for this long: the main defence against floods of repeated alerts.
    cooldown_s: float = Field(30.0, ge=0, le=MAX_DURATION_S)
    # An alert ends once its condition has been false this long; rides over detector flicker.
    clear_s: float = Field(1.0, ge=0, le=MAX_DURATION_S)
    snapshot: bool = False
    # Each type adds `type: Literal["<its name>"]`, last (here it would move in the JSON of a rule).

    @classmethod
    def type_name(cls) -> str:
        """Its `type` key's one value."""
        (name,) = get_args(cls.model_fields["type"].annotation)
        return str(name)

    def wanted_classes(self) -> tuple[str, ...]:
        """The model's class names it needs (the detector must have them)."""
        return ()


_Rule = Rule  # the name the core types below were written against


class _ClassFiltered(_Rule):
    class_key: ClassVar[str | None] = "classes"
    # Class names of the model (e.g. Normal, Fall for the bundled people model); None: all.
    classes: ClassNames | None = None

    def wanted_classes(self) -> tuple[str, ...]:
        return self.classes or ()

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
    # A change of side (in/out of the zone, across the line) counts once it lasts this long.
    settle_s: float = Field(DEFAULT_SETTLE_S, ge=0, le=MAX_SETTLE_S)
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
    # A change of side (in/out of the zone, across the line) counts once it lasts this long.
    settle_s: float = Field(DEFAULT_SETTLE_S, ge=0, le=MAX_SETTLE_S)

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
    # A change of side (in/out of the zone, across the line) counts once it lasts this long.
    settle_s: float = Field(DEFAULT_SETTLE_S, ge=0, le=MAX_SETTLE_S)

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
    class_key: ClassVar[str | None] = "fall_class"
    fall_class: str = Field("Fall", min_length=1)
    for_s: float = Field(2.0, ge=0, le=MAX_DURATION_S)

    def wanted_classes(self) -> tuple[str, ...]:
        return (self.fall_class,)


# The frame loop's rule types; a capability adds its own (Capability.rules).
CORE_RULES: tuple[type[Rule], ...] = (PresentRule, AbsentRule, CountRule, ZoneRule, LineRule, FallRule)
AnyRule = PresentRule | AbsentRule | CountRule | ZoneRule | LineRule | FallRule  # the frame loop's
RuleSpec = Rule  # one rule of a stream, of any type the build has


def _known_type(names: Sequence[str]) -> Callable[[Any], Any]:
    def known(value: Any) -> Any:
        # Say which key is wrong; pydantic's own message for a bad tag does not read well in a config.
        if isinstance(value, dict):
            kind = value.get("type")
            if kind is None:
                raise ValueError(f"type: missing; use one of {', '.join(names)}")
            if kind not in names:
                raise ValueError(f"type: {kind!r} is not a rule type; use one of {', '.join(names)}")
        return value

    return known


def check_unique_ids(rules: list[Rule]) -> list[Rule]:
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


def rule_list(types: Sequence[type[Rule]]) -> Any:
    """The type of a stream's whole rule list with these rule types: at most MAX_RULES (counted
    before any is validated), each told apart by its `type`, ids unique. Validation errors read
    `streams.0.rules.1.zone.polygon: ...` (the rule's type, then the key)."""
    names = [t.type_name() for t in types]
    if len(set(names)) != len(names):
        raise ValueError(f"a rule type is declared twice: {', '.join(sorted(names))}")
    one: Any = Annotated[Union[tuple(types)], Field(discriminator="type"), BeforeValidator(_known_type(names))]  # noqa: UP007
    return Annotated[list[one], BeforeValidator(_at_most_rules), AfterValidator(check_unique_ids)]


if TYPE_CHECKING:
    RuleList = list[Rule]
else:
    RuleList = rule_list(CORE_RULES)  # the core types only: the config's list has every capability's too
