"""Cost profiles: what one message costs on one link.

A cost profile (a JSON file in ``cost_profiles/``, one link per file) turns the size of an
encoded update into its cost on a link. For a message of ``B`` application bytes
(docs/cost-profiles.md and docs/algorithm.md, "The cost of a message on a link")::

    B_link       = B + message_overhead_bytes            # application framing, e.g. MQTT PUBLISH
    packets      = ceil(B_link / max_payload_bytes)
    cost(metric) = per_message[metric] + per_packet[metric] * packets + per_byte[metric] * B_link
    bytes_on_air = B_link + packets * per_packet_overhead_bytes

Metrics and units: ``bits`` (bits on the link), ``packets`` (link packets), ``airtime_s``
(seconds the radio is busy), ``energy_j`` (joules). CAT maximises gain per unit of the
profile's ``objective`` metric.

Three kinds share one schema (discriminator ``kind``):

- ``packet``: the formula above;
- ``affine``: ``cost(metric) = a + b * B_link`` per metric (a fit, as the paper's
  ZeroMQ-over-TCP cost);
- ``measured``: piecewise-linear through measured points, as written by
  ``edge-agent calibrate``.

Every cost is nondecreasing in the message size. This module does no I/O: the profile
files (where they live, reading and writing them, finding one by name) are
:mod:`edge_agent.links.catalog`.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Final, Literal, TypeAlias, overload

import numpy as np
from numpy.typing import NDArray

from edge_agent.errors import ProfileError
from edge_agent.links.cost import METRICS, Direction, MessageCost, Metric
from edge_agent.links.profile_errors import ProfileSchema, profile_error
from edge_agent.links.profile_parts import (
    METRIC,
    METRIC_COSTS,
    AffineCoefficients,
    ComputePart,
    DownlinkPart,
    MeasuredPoint,
    MetricCosts,
    ceil_div,
)
from edge_agent.links.shared import (
    DAY_SECONDS,
    FRACTION,
    NONNEGATIVE_INT,
    POSITIVE_INT,
    TEXTS,
    SharedDelivery,
    SharedDownlink,
    duty_share,
)
from edge_agent.validation import (
    Check,
    Invalid,
    Problem,
    build,
    dict_of,
    dump,
    literal,
    model,
    optional,
    revalidate,
    string,
    tuple_of,
)

__all__ = [
    "METRICS",
    "AffineCoefficients",
    "AffineProfile",
    "ComputePart",
    "CostProfile",
    "DownlinkPart",
    "MeasuredPoint",
    "MeasuredProfile",
    "MessageCost",
    "Metric",
    "PacketProfile",
    "SharedDelivery",
    "SharedDownlink",
    "parse_profile",
    "profile_to_json",
]

KINDS: Final[tuple[str, ...]] = ("packet", "affine", "measured")

IntArray: TypeAlias = NDArray[np.int64]
FloatArray: TypeAlias = NDArray[np.float64]
_NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


@dataclass(frozen=True, kw_only=True)
class CostProfile(ABC):
    """Base of the three profile kinds; use ``load_profile`` or ``parse_profile`` to build one.

    Sizes are in bytes (application bytes unless said otherwise); costs are in the metric's
    unit: bits, packets, seconds (``airtime_s``) or joules (``energy_j``)."""

    kind: str
    name: str
    description: str
    objective: Metric
    sources: tuple[str, ...] = ()
    estimated: tuple[str, ...] = ()
    duty_cycle: float | None = None
    duty_cycle_bands: int = 1
    """Sub-bands the uplink's channels lie in, each allowing ``duty_cycle`` on its own
    (EU868: 1 % per sub-band); the radio takes a channel in a band that is free, so it may be
    on the air ``duty_cycle * duty_cycle_bands`` of the time (:attr:`uplink_duty_share`)."""
    uplink_airtime_per_day_s: float | None = None
    """A network's fair-use cap on uplink airtime, s per device per day (TTN: 30 s); None."""
    notes: str | None = None
    message_overhead_bytes: int = 0
    """Application framing added once per message (bytes), e.g. MQTT PUBLISH header + topic."""
    per_packet_overhead_bytes: int = 0
    """Header bytes each link packet adds on air; only reported in ``bytes_on_air``."""
    max_payload_bytes: int | None = None
    """Largest link payload of one packet in bytes; None: one packet per message."""
    downlink: DownlinkPart | None = None
    """What receiving costs; None: a symmetric link (receiving a message costs what sending
    it would, with no downlink caps)."""
    compute: ComputePart | None = None
    """What a gradient evaluation costs the device; None: compute energy is not modelled."""

    #: the fields' checks, in order (pydantic's: a subclass's field keeps its base's place)
    CHECKS: ClassVar[Mapping[str, Check]] = {
        "kind": string(),
        "name": string(pattern=_NAME_PATTERN),
        "description": string(),
        "objective": METRIC,
        "sources": TEXTS,
        "estimated": TEXTS,
        "duty_cycle": optional(FRACTION),
        "duty_cycle_bands": POSITIVE_INT,
        "uplink_airtime_per_day_s": optional(DAY_SECONDS),
        "notes": optional(string()),
        "message_overhead_bytes": NONNEGATIVE_INT,
        "per_packet_overhead_bytes": NONNEGATIVE_INT,
        "max_payload_bytes": optional(POSITIVE_INT),
        "downlink": optional(model(DownlinkPart)),
        "compute": optional(model(ComputePart)),
    }

    def __post_init__(self) -> None:
        revalidate(self)
        self._check()

    def _check(self) -> None:
        """The cross-field rules (ValueError: the message names the field)."""
        self._check_objective_and_duty()

    # --- per-kind hooks -------------------------------------------------------------

    @abstractmethod
    def defined_metrics(self) -> frozenset[Metric]:
        """Metrics whose cost is not identically zero."""

    @abstractmethod
    def _packet_count(self, link_bytes: IntArray) -> IntArray:
        """Number of link packets for messages of ``link_bytes`` bytes."""

    @abstractmethod
    def _metric_cost(self, metric: Metric, link_bytes: IntArray) -> FloatArray:
        """Cost of ``metric`` for messages of ``link_bytes`` bytes (vectorised)."""

    @property
    @abstractmethod
    def packet_stepped(self) -> bool:
        """True when the objective cost is a step function of the packet count."""

    # --- shared validation ----------------------------------------------------------

    def _check_objective_and_duty(self) -> None:
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

    # --- public API -----------------------------------------------------------------

    def link_bytes(self, size_bytes: int) -> int:
        """Bytes on the link before packet headers: ``size_bytes + message_overhead_bytes``."""
        return _check_size(size_bytes) + self.message_overhead_bytes

    def cost(self, size_bytes: int) -> dict[str, float]:
        """Cost of one message of ``size_bytes`` application bytes, for every metric in METRICS.

        Units: bits, packets, seconds, joules; 0.0 for metrics the profile does not define.
        """
        link = np.array([self.link_bytes(size_bytes)], dtype=np.int64)
        return {m: float(self._metric_cost(m, link)[0]) for m in METRICS}

    @overload
    def objective_cost(self, size_bytes: int | np.integer[Any]) -> float: ...

    @overload
    def objective_cost(self, size_bytes: NDArray[np.integer[Any]]) -> FloatArray: ...

    def objective_cost(
        self, size_bytes: int | np.integer[Any] | NDArray[np.integer[Any]]
    ) -> float | FloatArray:
        """Cost in the objective's unit of messages of ``size_bytes`` application bytes.

        Vectorised: an integer array of sizes gives a float64 array of the same shape
        (no Python loop); a scalar gives a float.
        """
        sizes = np.asarray(size_bytes)
        if not np.issubdtype(sizes.dtype, np.integer):
            raise TypeError(f"size_bytes must be integers (bytes), got dtype {sizes.dtype}")
        if sizes.size and int(sizes.min()) < 0:
            raise ValueError(f"size_bytes must be >= 0, got {int(sizes.min())}")
        link = sizes.astype(np.int64) + self.message_overhead_bytes
        out = self._metric_cost(self.objective, link.reshape(-1)).reshape(link.shape)
        if out.ndim == 0:
            return float(out)
        return out

    def message_cost(self, size_bytes: int) -> MessageCost:
        """Full accounting of one message of ``size_bytes`` application bytes."""
        link_bytes = self.link_bytes(size_bytes)
        link = np.array([link_bytes], dtype=np.int64)
        packets = int(self._packet_count(link)[0])
        costs = {m: float(self._metric_cost(m, link)[0]) for m in METRICS}
        return MessageCost(
            size_bytes=int(size_bytes),
            link_bytes=link_bytes,
            packets=packets,
            bytes_on_air=link_bytes + packets * self.per_packet_overhead_bytes,
            bits=costs["bits"],
            airtime_s=costs["airtime_s"],
            energy_j=costs["energy_j"],
            silence_s=self.silence_s(costs["airtime_s"]),
        )

    def downlink_cost(self, size_bytes: int) -> MessageCost:
        """What receiving one message of ``size_bytes`` application bytes costs the device.

        ``silence_s`` is the silence the *sender* owes afterwards (the downlink's
        ``sender_duty_cycle``), 0.0 when it has none. Without a downlink part the link is
        symmetric: the uplink's costs, no silence.
        """
        down = self.downlink
        if down is None:
            return replace(self.message_cost(size_bytes), silence_s=0.0)
        link_bytes = _check_size(size_bytes) + down.message_overhead_bytes
        link = np.array([link_bytes], dtype=np.int64)
        packets = int(down.packet_count(link)[0])
        costs = {m: float(down.metric_cost(m, link)[0]) for m in METRICS}
        return MessageCost(
            size_bytes=int(size_bytes),
            link_bytes=link_bytes,
            packets=packets,
            bytes_on_air=link_bytes + packets * down.per_packet_overhead_bytes,
            bits=costs["bits"],
            airtime_s=costs["airtime_s"],
            energy_j=costs["energy_j"],
            silence_s=down.sender_silence_s(costs["airtime_s"]),
        )

    def price(self, size_bytes: int, direction: Direction = "up") -> MessageCost:
        """:meth:`message_cost` (``up``, what sending costs) or :meth:`downlink_cost` (``down``)."""
        if direction == "up":
            return self.message_cost(size_bytes)
        return self.downlink_cost(size_bytes)

    def downlink_objective_cost(self, size_bytes: NDArray[np.integer[Any]]) -> FloatArray:
        """Receiving cost in the profile's objective unit, vectorised over sizes (bytes)."""
        sizes = np.asarray(size_bytes, dtype=np.int64)
        down = self.downlink
        if down is None:
            return np.asarray(self.objective_cost(sizes), dtype=np.float64)
        link = sizes.reshape(-1) + down.message_overhead_bytes
        return down.metric_cost(self.objective, link).reshape(sizes.shape)

    def compute_energy_j(self, evaluations: float, rows: float, nonzeros: float) -> float:
        """Joules of gradient evaluations (:meth:`ComputePart.energy_j`); 0.0 without a
        compute part (not modelled: :attr:`compute` is None)."""
        if self.compute is None:
            return 0.0
        return self.compute.energy_j(evaluations, rows, nonzeros)

    @property
    def max_downlinks_per_day(self) -> int | None:
        return None if self.downlink is None else self.downlink.max_messages_per_day

    @property
    def shared_downlink(self) -> SharedDownlink | None:
        """The downlink part's shared delivery (a multicast group); None without one."""
        return None if self.downlink is None else self.downlink.shared

    def shared_delivery(self, size_bytes: int) -> SharedDelivery:
        """One message on the shared downlink (ValueError: the profile has none)."""
        shared = self.shared_downlink
        if shared is None:
            raise ValueError(f"profile {self.name!r} has no shared downlink (downlink.shared)")
        return shared.delivery_of(_check_size(size_bytes))

    def receive_cost(self, size_bytes: int, *, job_wide: bool) -> MessageCost:
        """A job-wide message as a member of the shared downlink, if any (``silence_s``: the
        rest of the group's busy time), else :meth:`downlink_cost`."""
        if not job_wide or self.shared_downlink is None:
            return self.downlink_cost(size_bytes)
        got = self.shared_delivery(size_bytes)
        return MessageCost(got.size_bytes, got.frame_bytes, got.frames, got.bytes_on_air,
                           8.0 * got.bytes_on_air, got.airtime_s, got.energy_j,
                           max(0.0, got.busy_s - got.airtime_s))  # fmt: skip

    @property
    def uplink_duty_share(self) -> float | None:
        """The share of time the uplink may be on the air (shared.duty_share: the duty cycle
        in each sub-band, or ``uplink_airtime_per_day_s / 86400`` when smaller)."""
        return duty_share(self.duty_cycle, self.duty_cycle_bands, self.uplink_airtime_per_day_s)

    def silence_s(self, airtime_s: float) -> float:
        """Seconds of enforced silence after ``airtime_s`` seconds on air (duty cycle): with
        several sub-bands the frames of a long message alternate between them (LoRaMac-node
        takes a channel whose band is free), so the silence is that of their summed share."""
        share = self.uplink_duty_share
        if share is None:
            return 0.0
        return airtime_s * (1.0 / share - 1.0)


def _check_size(size_bytes: int) -> int:
    size = int(size_bytes)
    if size != size_bytes:
        raise TypeError(f"size_bytes must be an integer number of bytes, got {size_bytes!r}")
    if size < 0:
        raise ValueError(f"size_bytes must be >= 0, got {size}")
    return size


@dataclass(frozen=True, kw_only=True)
class PacketProfile(CostProfile):
    """A link that splits each message into packets of at most ``max_payload_bytes``.

    ``per_message``, ``per_packet`` and ``per_byte`` map a metric to its cost per
    message, per packet and per link byte (missing metrics cost 0). The per-packet
    cost already includes what the packet's own headers cost (their airtime, energy,
    and 8 bits per header byte): each byte is counted once.
    """

    kind: Literal["packet"] = "packet"
    max_payload_bytes: int = field()  # required here (a bare annotation inherits None)
    per_message: MetricCosts = field(default_factory=dict)
    per_packet: MetricCosts = field(default_factory=dict)
    per_byte: MetricCosts = field(default_factory=dict)

    CHECKS: ClassVar[Mapping[str, Check]] = {
        **CostProfile.CHECKS,
        "kind": literal("packet"),
        "max_payload_bytes": POSITIVE_INT,
        "per_message": METRIC_COSTS,
        "per_packet": METRIC_COSTS,
        "per_byte": METRIC_COSTS,
    }

    def defined_metrics(self) -> frozenset[Metric]:
        return frozenset(
            m
            for m in METRICS
            if self.per_message.get(m, 0.0) > 0
            or self.per_packet.get(m, 0.0) > 0
            or self.per_byte.get(m, 0.0) > 0
        )

    @property
    def packet_stepped(self) -> bool:
        return self.per_packet.get(self.objective, 0.0) > 0

    def _packet_count(self, link_bytes: IntArray) -> IntArray:
        return ceil_div(link_bytes, self.max_payload_bytes)

    def _metric_cost(self, metric: Metric, link_bytes: IntArray) -> FloatArray:
        per_message = self.per_message.get(metric, 0.0)
        per_packet = self.per_packet.get(metric, 0.0)
        per_byte = self.per_byte.get(metric, 0.0)
        out = per_byte * link_bytes.astype(np.float64) + per_message
        if per_packet:
            out += per_packet * self._packet_count(link_bytes)
        return out


@dataclass(frozen=True, kw_only=True)
class _UnsplitMixin(CostProfile):
    """Shared by affine and measured: one packet per message unless a max payload is given."""

    @property
    def packet_stepped(self) -> bool:
        return False

    def _packet_count(self, link_bytes: IntArray) -> IntArray:
        if self.max_payload_bytes is None:
            return np.ones_like(link_bytes)
        return ceil_div(link_bytes, self.max_payload_bytes)


@dataclass(frozen=True, kw_only=True)
class AffineProfile(_UnsplitMixin):
    """``cost(metric) = a + b * B_link`` for each metric in ``coefficients`` (others cost 0)."""

    kind: Literal["affine"] = "affine"
    coefficients: dict[Metric, AffineCoefficients]

    CHECKS: ClassVar[Mapping[str, Check]] = {
        **CostProfile.CHECKS,
        "kind": literal("affine"),
        "coefficients": dict_of(METRIC, model(AffineCoefficients)),
    }

    def defined_metrics(self) -> frozenset[Metric]:
        return frozenset(m for m, c in self.coefficients.items() if c.a > 0 or c.b > 0)

    def _metric_cost(self, metric: Metric, link_bytes: IntArray) -> FloatArray:
        coef = self.coefficients.get(metric)
        if coef is None:
            return np.zeros(link_bytes.shape, dtype=np.float64)
        return coef.b * link_bytes.astype(np.float64) + coef.a


@dataclass(frozen=True, kw_only=True)
class MeasuredProfile(_UnsplitMixin):
    """Piecewise-linear cost through measured ``points`` (sizes in link bytes).

    Between points the cost is interpolated linearly; below the first point it
    follows the first segment's slope, beyond the last the last segment's slope,
    and it is never below 0. Sizes must increase strictly and every metric's values
    must be nondecreasing, so the cost is nondecreasing in size.
    """

    kind: Literal["measured"] = "measured"
    points: tuple[MeasuredPoint, ...]

    CHECKS: ClassVar[Mapping[str, Check]] = {
        **CostProfile.CHECKS,
        "kind": literal("measured"),
        "points": tuple_of(model(MeasuredPoint)),
    }
    # derived from the points in _prepare (== and the JSON compare the points only)
    _sizes: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _values: dict[Metric, tuple[float, ...]] = field(init=False, repr=False, compare=False)

    def _check(self) -> None:
        # first the derived state defined_metrics reads, then the rules
        object.__setattr__(self, "_sizes", tuple(float(p.size_bytes) for p in self.points))
        values = {m: tuple(float(getattr(p, m) or 0.0) for p in self.points) for m in METRICS}
        object.__setattr__(self, "_values", values)
        super()._check()
        self._check_points()

    def _check_points(self) -> None:
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

    def defined_metrics(self) -> frozenset[Metric]:
        return frozenset(m for m in METRICS if any(v > 0 for v in self._values[m]))

    def _metric_cost(self, metric: Metric, link_bytes: IntArray) -> FloatArray:
        xs = np.asarray(self._sizes, dtype=np.float64)
        ys = np.asarray(self._values[metric], dtype=np.float64)
        x = link_bytes.astype(np.float64)
        out = np.interp(x, xs, ys)
        first_slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        last_slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(x < xs[0], ys[0] + first_slope * (x - xs[0]), out)
        out = np.where(x > xs[-1], ys[-1] + last_slope * (x - xs[-1]), out)
        return np.maximum(out, 0.0)


AnyProfile: TypeAlias = PacketProfile | AffineProfile | MeasuredProfile


_KIND_MODELS: Final[dict[str, type[CostProfile]]] = {
    "packet": PacketProfile,
    "affine": AffineProfile,
    "measured": MeasuredProfile,
}
_NESTED_MODELS: Final[dict[str, type[Any]]] = {
    "downlink": DownlinkPart,
    "compute": ComputePart,
    "shared": SharedDownlink,
    "points": MeasuredPoint,
    "coefficients": AffineCoefficients,
}
_SCHEMA: Final = ProfileSchema(KINDS, _KIND_MODELS, _NESTED_MODELS)


# --- building, loading, saving ----------------------------------------------------------


def parse_profile(data: Mapping[str, Any], source: str = "<data>") -> CostProfile:
    """Validate a profile from a mapping (as read from JSON); ``source`` names it in errors.

    Raises ProfileError naming ``source``, the field path and what is allowed.
    """
    if not isinstance(data, Mapping):
        raise ProfileError(
            f"profile {source}: the top level must be a JSON object, got {type(data).__name__}"
        )
    if "kind" not in data:
        allowed = ", ".join(repr(k) for k in KINDS)
        raise ProfileError(f"profile {source}: kind: required field is missing ({allowed})")
    try:
        return _build_profile(dict(data))
    except Invalid as exc:
        raise profile_error(source, exc.problems, _SCHEMA) from None


def _build_profile(data: dict[Any, Any]) -> CostProfile:
    """The profile of the kind ``data["kind"]`` names; Invalid as pydantic's discriminated
    union reported it (each problem's path starts with the kind)."""
    kind = data["kind"]
    cls = _KIND_MODELS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        expected = ", ".join(repr(k) for k in KINDS)
        msg = (
            f"Input tag '{kind}' found using 'kind' does not match any of the expected "
            f"tags: {expected}"
        )
        ctx = {"discriminator": "'kind'", "tag": str(kind), "expected_tags": expected}
        raise Invalid([Problem((), "union_tag_invalid", msg, data, ctx)])
    return build(cls, data, (kind,))


def profile_to_json(profile: CostProfile) -> str:
    """The profile as JSON text (the format ``load_profile`` reads), ending in a newline."""
    return json.dumps(dump(profile, exclude_none=True), indent=2) + "\n"
