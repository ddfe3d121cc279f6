"""The parts of a cost profile (:mod:`edge_agent.links.profiles`): a downlink part, a compute
part, a measured point, a pair of affine coefficients, and the checks of a cost and a metric.

Each is a frozen dataclass validated as :mod:`edge_agent.validation` describes; a profile
file holds them as JSON objects (docs/cost-profiles.md). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Final, TypeAlias

import numpy as np
from numpy.typing import NDArray

from edge_agent.links.cost import METRICS, Metric
from edge_agent.links.shared import (
    FRACTION,
    NONNEGATIVE,
    NONNEGATIVE_INT,
    POSITIVE_INT,
    TEXTS,
    SharedDownlink,
)
from edge_agent.validation import Check, dict_of, literal, model, optional, revalidate, string

__all__ = [
    "COST",
    "METRIC",
    "METRIC_COSTS",
    "AffineCoefficients",
    "ComputePart",
    "DownlinkPart",
    "MeasuredPoint",
    "MetricCosts",
    "ceil_div",
]

IntArray: TypeAlias = NDArray[np.int64]
FloatArray: TypeAlias = NDArray[np.float64]
#: a cost in the metric's unit: finite, >= 0
COST: Final = NONNEGATIVE
METRIC: Final = literal(*METRICS)
#: a metric -> its cost (per message, per packet, per byte)
METRIC_COSTS: Final = dict_of(METRIC, COST)
MetricCosts: TypeAlias = dict[Metric, float]


@dataclass(frozen=True, kw_only=True)
class AffineCoefficients:
    """``cost = a + b * B_link``: ``a`` in metric units, ``b`` in metric units per byte."""

    a: float
    b: float

    CHECKS: ClassVar[Mapping[str, Check]] = {"a": COST, "b": COST}

    def __post_init__(self) -> None:
        revalidate(self)


@dataclass(frozen=True, kw_only=True)
class MeasuredPoint:
    """One measurement: the cost of a message of ``size_bytes`` link bytes, per metric."""

    size_bytes: int
    bits: float | None = None
    packets: float | None = None
    airtime_s: float | None = None
    energy_j: float | None = None

    CHECKS: ClassVar[Mapping[str, Check]] = {
        "size_bytes": NONNEGATIVE_INT,
        **dict.fromkeys(METRICS, optional(COST)),
    }

    def __post_init__(self) -> None:
        revalidate(self)

    def defined(self) -> frozenset[Metric]:
        """The metrics this point gives a value for."""
        return frozenset(m for m in METRICS if getattr(self, m) is not None)


@dataclass(frozen=True, kw_only=True)
class DownlinkPart:
    """What *receiving* a message costs the device, and the caps its network sets.

    Same formula as a ``packet`` profile, on the downlink's own numbers: for a message of
    ``B`` application bytes, ``B_link = B + message_overhead_bytes``, ``packets =
    ceil(B_link / max_payload_bytes)`` (one packet when ``max_payload_bytes`` is None),
    ``cost(metric) = per_message + per_packet * packets + per_byte * B_link``: bits
    received, downlink packets, the downlink's airtime (seconds the device's radio listens
    to it) and the device's energy at its receive current (joules).

    ``sender_duty_cycle``: the duty cycle the *sender* of downlinks must keep (a LoRaWAN
    gateway's sub-band, for example); the aggregator paces what it sends to this device
    accordingly. ``sender_band``: the one sub-band the sender sends every downlink to this
    device on (a LoRaWAN answer in RX2: ``g3``, 869.4-869.65 MHz); None: the sub-band of the
    uplink before it (RX1), so a gateway may spend its share in each of the uplink's
    ``duty_cycle_bands`` (:meth:`sender_share`). ``max_messages_per_day``: the network's
    cap on downlinks to one device per day (community LoRaWAN networks: about 10, Sigfox:
    4). None: no such limit.

    ``shared``: a shared delivery (a multicast group, periodic advertising) that reaches
    every member with one transmission (:class:`edge_agent.links.shared.SharedDownlink`);
    the numbers above stay the device's own (unicast) downlink, its catch-up path.
    """

    max_payload_bytes: int | None = None
    message_overhead_bytes: int = 0
    per_packet_overhead_bytes: int = 0
    per_message: MetricCosts = field(default_factory=dict)
    per_packet: MetricCosts = field(default_factory=dict)
    per_byte: MetricCosts = field(default_factory=dict)
    sender_duty_cycle: float | None = None
    sender_band: str | None = None
    max_messages_per_day: int | None = None
    shared: SharedDownlink | None = None
    estimated: tuple[str, ...] = ()
    notes: str | None = None

    CHECKS: ClassVar[Mapping[str, Check]] = {
        "max_payload_bytes": optional(POSITIVE_INT),
        "message_overhead_bytes": NONNEGATIVE_INT,
        "per_packet_overhead_bytes": NONNEGATIVE_INT,
        "per_message": METRIC_COSTS,
        "per_packet": METRIC_COSTS,
        "per_byte": METRIC_COSTS,
        "sender_duty_cycle": optional(FRACTION),
        "sender_band": optional(string()),
        "max_messages_per_day": optional(POSITIVE_INT),
        "shared": optional(model(SharedDownlink)),
        "estimated": TEXTS,
        "notes": optional(string()),
    }

    def __post_init__(self) -> None:
        revalidate(self)

    def packet_count(self, link_bytes: IntArray) -> IntArray:
        if self.max_payload_bytes is None:
            return np.ones_like(link_bytes)
        return ceil_div(link_bytes, self.max_payload_bytes)

    def metric_cost(self, metric: Metric, link_bytes: IntArray) -> FloatArray:
        """Cost of ``metric`` for received messages of ``link_bytes`` bytes (vectorised)."""
        out = self.per_byte.get(metric, 0.0) * link_bytes.astype(np.float64)
        out += self.per_message.get(metric, 0.0)
        per_packet = self.per_packet.get(metric, 0.0)
        if per_packet:
            out += per_packet * self.packet_count(link_bytes)
        return out

    def sender_share(self, uplink_bands: int) -> float | None:
        """The share of time a gateway may spend sending this device's network its
        downlinks: ``sender_duty_cycle`` in each of the uplink's ``uplink_bands`` sub-bands
        (RX1), or in its one ``sender_band``; None without a sender duty cycle."""
        if self.sender_duty_cycle is None:
            return None
        bands = uplink_bands if self.sender_band is None else 1
        return min(1.0, self.sender_duty_cycle * bands)

    def sender_silence_s(self, airtime_s: float) -> float:
        """Seconds the sender must stay silent after ``airtime_s`` of downlink."""
        if self.sender_duty_cycle is None:
            return 0.0
        return airtime_s * (1.0 / self.sender_duty_cycle - 1.0)


@dataclass(frozen=True, kw_only=True)
class ComputePart:
    """What *computing* a gradient costs the device, in joules (docs/cost-profiles.md,
    "Compute energy"): for one evaluation over ``rows`` rows holding ``nonzeros`` nonzero
    entries, ``energy_j = per_gradient_j + per_row_j * rows + per_nonzero_j * nonzeros``.

    A sparse gradient's time is proportional to its nonzeros (``per_nonzero_j``) plus a
    fixed part for the d-sized vector work (``per_gradient_j``, at the ``features`` it was
    measured for); ``per_row_j`` serves dense data. ``device``: the computer it describes;
    ``power_w``: its active power above idle while one core computes (context only)."""

    per_gradient_j: float = 0.0
    per_row_j: float = 0.0
    per_nonzero_j: float = 0.0
    features: int | None = None
    device: str | None = None
    power_w: float | None = None
    estimated: tuple[str, ...] = ()
    notes: str | None = None

    CHECKS: ClassVar[Mapping[str, Check]] = {
        "per_gradient_j": COST,
        "per_row_j": COST,
        "per_nonzero_j": COST,
        "features": optional(POSITIVE_INT),
        "device": optional(string()),
        "power_w": optional(COST),
        "estimated": TEXTS,
        "notes": optional(string()),
    }

    def __post_init__(self) -> None:
        revalidate(self)
        if not (self.per_gradient_j > 0 or self.per_row_j > 0 or self.per_nonzero_j > 0):
            raise ValueError(
                "compute: per_gradient_j, per_row_j and per_nonzero_j are all 0; give at "
                "least one (or leave the compute part out: compute energy is then not modelled)"
            )

    def energy_j(self, evaluations: float, rows: float, nonzeros: float) -> float:
        """Joules of ``evaluations`` gradient evaluations over ``rows`` rows in all, holding
        ``nonzeros`` nonzero entries in all."""
        for name, value in (("evaluations", evaluations), ("rows", rows), ("nonzeros", nonzeros)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        return (self.per_gradient_j * evaluations + self.per_row_j * rows
                + self.per_nonzero_j * nonzeros)  # fmt: skip


def ceil_div(num: IntArray, den: int) -> IntArray:
    """``ceil(num / den)`` elementwise, in integers (packets for sizes of ``num`` bytes)."""
    return -(-num // den)
