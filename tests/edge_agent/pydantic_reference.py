"""The device's boundary schemas as they were in pydantic (before issue 17), kept as the
reference the dataclasses in edge_agent.links.profiles, edge_agent.links.shared and
edge_agent.protocol.jobinfo are checked against (tests/edge_agent/test_schema_equivalence.py):
the models' fields, bounds and validators, the discriminated union, and the old
translation of pydantic's errors into profile error lines. Nothing here prices a message.
The profiles' compute part (issue 21) came later; it is written here in the same style, so
the dataclass's checks of it are held to pydantic's too.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final, Literal, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails

from edge_agent.errors import ProfileError
from edge_agent.links.cost import METRICS, Metric
from edge_agent.protocol.fragments import FRAME_HEADER_BYTES

CostValue: TypeAlias = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
MetricCosts: TypeAlias = dict[Metric, CostValue]
Seconds: TypeAlias = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Watts: TypeAlias = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Period: TypeAlias = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
Fraction: TypeAlias = Annotated[float, Field(gt=0.0, le=1.0)]
KINDS: Final = ("packet", "affine", "measured")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class SharedDownlink(Frozen):
    group: str
    delivery: Literal["continuous", "slotted"]
    max_payload_bytes: PositiveInt
    per_packet_overhead_bytes: NonNegativeInt = 0
    frame_airtime_s: Seconds
    byte_airtime_s: Seconds
    sender_duty_cycle: Fraction | None = None
    rx_power_w: Watts
    listen_power_w: Watts
    session_guard_s: Seconds = 0.0
    slot_period_s: Period | None = None
    slot_listen_s: Seconds = 0.0
    sync_period_s: Period | None = None
    sync_listen_s: Seconds = 0.0
    redundancy: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    max_messages_per_day: PositiveInt | None = None
    estimated: tuple[str, ...] = ()
    notes: str | None = None

    @model_validator(mode="after")
    def check_delivery(self) -> SharedDownlink:
        if self.max_payload_bytes <= FRAME_HEADER_BYTES:
            raise ValueError(
                f"downlink.shared.max_payload_bytes must be > {FRAME_HEADER_BYTES} (the "
                f"fragment header), got {self.max_payload_bytes}"
            )
        slotted = self.delivery == "slotted"
        if slotted != (self.slot_period_s is not None):
            raise ValueError(
                "downlink.shared.slot_period_s: required for a slotted delivery and only there"
                f" (delivery {self.delivery!r})"
            )
        if not slotted and (self.sync_period_s is not None or self.slot_listen_s):
            raise ValueError(
                "downlink.shared: sync_period_s and slot_listen_s belong to a slotted delivery"
            )
        if slotted and self.session_guard_s:
            raise ValueError("downlink.shared.session_guard_s belongs to a continuous delivery")
        return self


class AffineCoefficients(Frozen):
    a: CostValue
    b: CostValue


class MeasuredPoint(Frozen):
    size_bytes: NonNegativeInt
    bits: CostValue | None = None
    packets: CostValue | None = None
    airtime_s: CostValue | None = None
    energy_j: CostValue | None = None

    def defined(self) -> frozenset[Metric]:
        return frozenset(m for m in METRICS if getattr(self, m) is not None)


class DownlinkPart(Frozen):
    max_payload_bytes: PositiveInt | None = None
    message_overhead_bytes: NonNegativeInt = 0
    per_packet_overhead_bytes: NonNegativeInt = 0
    per_message: MetricCosts = Field(default_factory=dict)
    per_packet: MetricCosts = Field(default_factory=dict)
    per_byte: MetricCosts = Field(default_factory=dict)
    sender_duty_cycle: Fraction | None = None
    sender_band: str | None = None
    max_messages_per_day: PositiveInt | None = None
    shared: SharedDownlink | None = None
    estimated: tuple[str, ...] = ()
    notes: str | None = None


class ComputePart(Frozen):
    per_gradient_j: CostValue = 0.0
    per_row_j: CostValue = 0.0
    per_nonzero_j: CostValue = 0.0
    features: PositiveInt | None = None
    device: str | None = None
    power_w: CostValue | None = None
    estimated: tuple[str, ...] = ()
    notes: str | None = None

    @model_validator(mode="after")
    def check_some_energy(self) -> ComputePart:
        if not (self.per_gradient_j > 0 or self.per_row_j > 0 or self.per_nonzero_j > 0):
            raise ValueError(
                "compute: per_gradient_j, per_row_j and per_nonzero_j are all 0; give at "
                "least one (or leave the compute part out: compute energy is then not modelled)"
            )
        return self


class CostProfile(Frozen):
    kind: str
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    description: str
    objective: Metric
    sources: tuple[str, ...] = ()
    estimated: tuple[str, ...] = ()
    duty_cycle: Fraction | None = None
    duty_cycle_bands: PositiveInt = 1
    uplink_airtime_per_day_s: Annotated[float, Field(gt=0.0, le=86_400.0)] | None = None
    notes: str | None = None
    message_overhead_bytes: NonNegativeInt = 0
    per_packet_overhead_bytes: NonNegativeInt = 0
    max_payload_bytes: PositiveInt | None = None
    downlink: DownlinkPart | None = None
    compute: ComputePart | None = None

    def defined_metrics(self) -> frozenset[Metric]:
        raise NotImplementedError

    @model_validator(mode="after")
    def check_objective_and_duty(self) -> CostProfile:
        defined = self.defined_metrics()
        if self.objective not in defined:
            have = ", ".join(m for m in METRICS if m in defined) or "none"
            raise ValueError(
                f"objective: {self.objective!r} is not defined by this profile "
                f"(it costs 0 at every size); metrics with a cost: {have}"
            )
        if self.duty_cycle is not None and "airtime_s" not in defined:
            raise ValueError("duty_cycle: a duty cycle needs an airtime_s cost, which is 0 here")
        if self.duty_cycle_bands > 1 and self.duty_cycle is None:
            raise ValueError("duty_cycle_bands: sub-bands need a duty_cycle, which is absent")
        return self


class PacketProfile(CostProfile):
    kind: Literal["packet"] = "packet"
    max_payload_bytes: PositiveInt
    per_message: MetricCosts = Field(default_factory=dict)
    per_packet: MetricCosts = Field(default_factory=dict)
    per_byte: MetricCosts = Field(default_factory=dict)

    def defined_metrics(self) -> frozenset[Metric]:
        return frozenset(
            m
            for m in METRICS
            if self.per_message.get(m, 0.0) > 0
            or self.per_packet.get(m, 0.0) > 0
            or self.per_byte.get(m, 0.0) > 0
        )


class AffineProfile(CostProfile):
    kind: Literal["affine"] = "affine"
    coefficients: dict[Metric, AffineCoefficients]

    def defined_metrics(self) -> frozenset[Metric]:
        return frozenset(m for m, c in self.coefficients.items() if c.a > 0 or c.b > 0)


class MeasuredProfile(CostProfile):
    kind: Literal["measured"] = "measured"
    points: tuple[MeasuredPoint, ...]
    _values: dict[Metric, tuple[float, ...]] = PrivateAttr()

    @model_validator(mode="after")
    def check_points(self) -> MeasuredProfile:
        if len(self.points) < 2:
            raise ValueError(f"points: at least 2 points are needed, got {len(self.points)}")
        metrics = self.points[0].defined()
        for i, point in enumerate(self.points):
            if point.defined() != metrics:
                raise ValueError(
                    f"points[{i}]: every point must give the same metrics as points[0] "
                    f"({', '.join(sorted(metrics)) or 'none'}), got "
                    f"{', '.join(sorted(point.defined())) or 'none'}"
                )
            if i == 0:
                continue
            prev = self.points[i - 1]
            if point.size_bytes <= prev.size_bytes:
                raise ValueError(
                    f"points[{i}].size_bytes: sizes must increase strictly, got "
                    f"{point.size_bytes} after {prev.size_bytes}"
                )
            for m in metrics:
                value, before = getattr(point, m), getattr(prev, m)
                if value < before:
                    raise ValueError(
                        f"points[{i}].{m}: costs must be nondecreasing in size, got "
                        f"{value} at {point.size_bytes} B after {before} at {prev.size_bytes} B"
                    )
        return self

    def model_post_init(self, context: Any, /) -> None:
        self._values = {m: tuple(float(getattr(p, m) or 0.0) for p in self.points) for m in METRICS}

    def defined_metrics(self) -> frozenset[Metric]:
        return frozenset(m for m in METRICS if any(v > 0 for v in self._values[m]))


AnyProfile: TypeAlias = PacketProfile | AffineProfile | MeasuredProfile
KIND_MODELS: Final[dict[str, type[BaseModel]]] = {
    "packet": PacketProfile,
    "affine": AffineProfile,
    "measured": MeasuredProfile,
}
NESTED_MODELS: Final[dict[str, type[BaseModel]]] = {
    "downlink": DownlinkPart,
    "compute": ComputePart,
    "shared": SharedDownlink,
    "points": MeasuredPoint,
    "coefficients": AffineCoefficients,
}


@functools.cache
def any_profile() -> TypeAdapter[AnyProfile]:
    return TypeAdapter[AnyProfile](Annotated[AnyProfile, Field(discriminator="kind")])


# --- the old translation of pydantic's errors (edge_agent/links/profile_errors.py) -------

BOUNDS: Final = {
    "greater_than": ("> ", "gt"),
    "greater_than_equal": (">= ", "ge"),
    "less_than": ("< ", "lt"),
    "less_than_equal": ("<= ", "le"),
}


def _loc_path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(error: ErrorDetails) -> str:
    loc: list[Any] = list(error["loc"])
    kind_model: type[BaseModel] | None = None
    head = loc[0] if loc else None
    if isinstance(head, str) and head in KIND_MODELS:
        kind_model = KIND_MODELS[head]
        loc.pop(0)
    etype, ctx = error["type"], error.get("ctx", {})
    if loc and loc[-1] == "[key]":
        return (
            f"{_loc_path(loc[:-2])}: key {loc[-2]!r} must be one of {', '.join(map(repr, METRICS))}"
        )
    field = _loc_path(loc)
    if etype == "value_error":
        return str(ctx.get("error", error["msg"]))
    if etype in ("union_tag_invalid", "union_tag_not_found"):
        allowed = ", ".join(repr(k) for k in KINDS)
        raw = error.get("input")
        shown = f", got {raw.get('kind')!r}" if isinstance(raw, dict) and "kind" in raw else ""
        return f"kind must be one of {allowed}{shown}"
    if etype == "extra_forbidden":
        model: type[BaseModel] | None = kind_model if len(loc) == 1 else None
        parents = [p for p in loc[:-1] if isinstance(p, str)]
        if len(loc) > 1 and parents and parents[-1] in NESTED_MODELS:
            model = NESTED_MODELS[parents[-1]]
        allowed = f"; allowed fields: {', '.join(model.model_fields)}" if model else ""
        return f"{field}: unknown field{allowed}"
    if etype == "missing":
        return f"{field}: required field is missing"
    got = _short(error.get("input"))
    if etype in BOUNDS:
        op, key = BOUNDS[etype]
        return f"{field} must be {op}{ctx.get(key)}, got {got}"
    if etype in ("literal_error", "enum"):
        return f"{field} must be one of {ctx.get('expected')}, got {got}"
    return f"{field}: {error['msg'][0].lower()}{error['msg'][1:]}, got {got}"


def parse_profile(data: Mapping[str, Any], source: str = "<data>") -> AnyProfile:
    """The old parse_profile: ProfileError with the old lines."""
    if not isinstance(data, Mapping):
        raise ProfileError(
            f"profile {source}: the top level must be a JSON object, got {type(data).__name__}"
        )
    if "kind" not in data:
        allowed = ", ".join(repr(k) for k in KINDS)
        raise ProfileError(f"profile {source}: kind: required field is missing ({allowed})")
    try:
        return any_profile().validate_python(dict(data))
    except ValidationError as exc:
        lines = [describe(e) for e in exc.errors(include_url=False)]
        if len(lines) == 1:
            raise ProfileError(f"profile {source}: {lines[0]}") from None
        raise ProfileError(f"profile {source}: {len(lines)} errors: " + "; ".join(lines)) from None


def profile_to_json(profile: BaseModel) -> str:
    return json.dumps(profile.model_dump(mode="json", exclude_none=True), indent=2) + "\n"


# --- the job's announcement (edge_agent/protocol/jobinfo.py) -----------------------------

Ident = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]


class JobInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    type: Literal["job"] = "job"
    job: Ident
    d: int = Field(gt=0)
    model: str
    feedback: Literal["none", "ef", "ef21", "dir", "local", "any"]
    family: Literal["mean", "ef21", "local"] | None = None
    compressors: tuple[str, ...]
    batch_size: float | None = Field(default=None, gt=0)
    local_steps: int | None = Field(default=None, gt=0)
    comm_prob: float | None = Field(default=None, gt=0)

    def dump(self) -> bytes:
        unset = {k for k in ("batch_size", "local_steps", "comm_prob") if getattr(self, k) is None}
        return self.model_dump_json(exclude=unset or None).encode()


def parse_job_info(obj: dict[str, Any]) -> JobInfo:
    """The old jobinfo.parse after its JSON and type checks: ValueError with its text."""
    try:
        return JobInfo.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"job info: {first.get('loc')}: {first.get('msg')}") from None
