"""The one cost value type: what messages cost on a link, in both directions.

Every place that adds costs up (an agent's ledger, the aggregator's per-agent and per-round
accounts, the history, the HTTP schemas, ``/metrics``, the simulator) uses these types:

- :class:`Cost`: one direction. ``messages`` (count), ``bytes`` (application bytes: the
  encoded messages), ``bits``, ``packets`` (link packets), ``airtime_s`` (seconds the radio
  is busy), ``energy_j`` (joules), each as priced by a cost profile
  (:mod:`edge_agent.links.profiles`); a metric the profile does not define costs 0.
- :class:`Traffic`: ``up`` (what a device sent) and ``down`` (what it received), and their
  ``total``;
- :class:`MessageCost`: one message priced on one link (sizes, packets, airtime, energy
  and the silence its duty cycle owes), which a profile returns and :attr:`MessageCost.cost`
  turns into a :class:`Cost`.

Both are immutable; costs add with ``+``; ``to_dict``/``from_dict`` give the JSON form used in
checkpoints, history rows and the HTTP API (``from_dict`` accepts older records that lack a
field or a direction: missing means 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final, Literal, TypeAlias

__all__ = [
    "COST_FIELDS",
    "METRICS",
    "ZERO",
    "Cost",
    "Direction",
    "Metric",
    "Traffic",
]

Metric: TypeAlias = Literal["bits", "packets", "airtime_s", "energy_j"]
#: the metrics a cost profile can price (and CAT can optimise)
METRICS: Final[tuple[Metric, ...]] = ("bits", "packets", "airtime_s", "energy_j")
Direction: TypeAlias = Literal["up", "down"]


@dataclass(frozen=True, slots=True)
class Cost:
    """What some messages cost in one direction of one or more links (sums).

    ``messages`` and ``packets`` are counts, ``bytes`` application bytes; ``bits``,
    ``airtime_s`` (seconds) and ``energy_j`` (joules) are profile-priced metrics.
    """

    messages: int = 0
    bytes: int = 0
    bits: float = 0.0
    packets: int = 0
    airtime_s: float = 0.0
    energy_j: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        # spelled out: this runs several times per message on the aggregator's hot path
        return Cost(
            self.messages + other.messages,
            self.bytes + other.bytes,
            self.bits + other.bits,
            self.packets + other.packets,
            self.airtime_s + other.airtime_s,
            self.energy_j + other.energy_j,
        )

    def __sub__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(
            self.messages - other.messages,
            self.bytes - other.bytes,
            self.bits - other.bits,
            self.packets - other.packets,
            self.airtime_s - other.airtime_s,
            self.energy_j - other.energy_j,
        )

    def metric(self, name: str) -> float:
        """One field by name (``bits``, ``packets``, ``airtime_s``, ``energy_j``, ``bytes``,
        ``messages``) as a float; raises ValueError for another name."""
        if name not in COST_FIELDS:
            raise ValueError(f"unknown cost field {name!r}; use one of {', '.join(COST_FIELDS)}")
        return float(getattr(self, name))

    def to_dict(self) -> dict[str, float | int]:
        return {
            "messages": self.messages,
            "bytes": self.bytes,
            "bits": self.bits,
            "packets": self.packets,
            "airtime_s": self.airtime_s,
            "energy_j": self.energy_j,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Cost:
        """From :meth:`to_dict` output; missing fields are 0 (older records)."""
        if not data:
            return ZERO
        return cls(
            messages=int(data.get("messages", data.get("updates", 0))),
            bytes=int(data.get("bytes", 0)),
            bits=float(data.get("bits", 0.0)),
            packets=int(data.get("packets", 0)),
            airtime_s=float(data.get("airtime_s", 0.0)),
            energy_j=float(data.get("energy_j", 0.0)),
        )

    @staticmethod
    def sum(costs: Iterable[Cost]) -> Cost:
        out = ZERO
        for c in costs:
            out = out + c
        return out


#: every field of :class:`Cost`, in order
COST_FIELDS: Final[tuple[str, ...]] = tuple(f.name for f in fields(Cost))
ZERO: Final = Cost()


@dataclass(frozen=True, slots=True)
class Traffic:
    """Both directions of a device's (or a fleet's) link: ``up`` sent, ``down`` received."""

    up: Cost = ZERO
    down: Cost = ZERO

    @property
    def total(self) -> Cost:
        return self.up + self.down

    def to_dict(self) -> dict[str, dict[str, float | int]]:
        return {"up": self.up.to_dict(), "down": self.down.to_dict(), "total": self.total.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Traffic:
        """From :meth:`to_dict` output (``total`` is recomputed, not read)."""
        if not data:
            return cls()
        return cls(Cost.from_dict(data.get("up")), Cost.from_dict(data.get("down")))


@dataclass(frozen=True, slots=True)
class MessageCost:
    """What one message costs on a link.

    ``size_bytes``: application bytes (the encoded update); ``link_bytes``: plus the
    profile's message overhead; ``packets``: number of link packets the message is split
    into (a count, not the ``packets`` metric); ``bytes_on_air``: link bytes plus the
    per-packet overhead of every packet. ``bits``, ``airtime_s`` (seconds) and
    ``energy_j`` (joules) are the profile's costs for those metrics (0.0 where the
    profile does not define them). ``silence_s``: seconds the radio must stay silent
    after this message under the profile's duty cycle (0.0 without a duty cycle).
    """

    size_bytes: int
    link_bytes: int
    packets: int
    bytes_on_air: int
    bits: float
    airtime_s: float
    energy_j: float
    silence_s: float

    @property
    def cost(self) -> Cost:
        """This message as a :class:`Cost` (one message), for adding up."""
        return Cost(1, self.size_bytes, self.bits, self.packets, self.airtime_s, self.energy_j)
