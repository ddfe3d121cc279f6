"""What accepted updates cost: :class:`Spend` totals, the per-agent sums of one round
(:class:`RoundCosts`), the record of a committed version (:class:`RoundRecord`), and the
:class:`Pricer` that prices an update on its sender's cost profile.

Every update is priced twice on the same profile: as sent, and as the dense float32 update
with the same header it replaces (the baseline the savings are measured against). A profile
turns a message size in bytes into bits, packets, airtime (seconds) and energy (joules);
see :meth:`edge_agent.profiles.CostProfile.message_cost`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from edge_agent import wire
from edge_agent.cost import Cost
from edge_agent.profiles import CostProfile

log = logging.getLogger("aggregator.accounting")

#: resolves the profile name an agent announced (None: unknown here, bytes only)
ProfileLookup = Callable[[str], CostProfile | None]

#: bound on each pricing cache (entries); a full cache is cleared, not evicted piecewise
_CACHE_MAX: Final = 65536


@dataclass
class Spend:
    """Communication received in accepted updates, and what dense float32 would have cost.

    ``bytes`` are encoded update bytes (application bytes); ``bits``, ``packets``,
    ``airtime_s`` (seconds) and ``energy_j`` (joules) price each update with the sending
    agent's cost profile (0 when its profile is unknown here). ``dense_*``: the same for a
    dense float32 update with the same header, on the same profile.
    """

    updates: int = 0
    bytes: int = 0
    bits: float = 0.0
    packets: int = 0
    airtime_s: float = 0.0
    energy_j: float = 0.0
    dense_bytes: int = 0
    dense_bits: float = 0.0
    dense_packets: int = 0
    dense_airtime_s: float = 0.0
    dense_energy_j: float = 0.0

    def add(self, other: Spend) -> None:
        # spelled out: this runs three times per accepted update
        self.updates += other.updates
        self.bytes += other.bytes
        self.bits += other.bits
        self.packets += other.packets
        self.airtime_s += other.airtime_s
        self.energy_j += other.energy_j
        self.dense_bytes += other.dense_bytes
        self.dense_bits += other.dense_bits
        self.dense_packets += other.dense_packets
        self.dense_airtime_s += other.dense_airtime_s
        self.dense_energy_j += other.dense_energy_j

    def to_dict(self) -> dict[str, float | int]:
        return dict(vars(self))  # every field is a number: no deep copy needed

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Spend:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


#: per agent and round: entries (T) and bytes sent, updates, and their priced cost
AGENT_ROUND_ZERO: Final[dict[str, float]] = {
    "t": 0, "bytes": 0, "updates": 0, "packets": 0, "airtime_s": 0.0, "energy_j": 0.0,
}  # fmt: skip
_AGENT_ROUND_FLOATS: Final = frozenset({"airtime_s", "energy_j"})


def agent_round_from_dict(data: dict[str, Any]) -> dict[str, float]:
    """A per-agent round entry from JSON (older entries lack the cost fields: zero)."""
    out = dict(AGENT_ROUND_ZERO)
    for k, v in data.items():
        out[str(k)] = float(v) if k in _AGENT_ROUND_FLOATS else int(v)
    return out


@dataclass
class RoundCosts:
    """What the open round's accepted updates cost: per agent (see :class:`RoundRecord`)
    and in total. A committed :class:`RoundRecord` keeps these very objects, so the engine
    starts a new ``RoundCosts`` for the next round instead of clearing this one."""

    agents: dict[str, dict[str, float]] = field(default_factory=dict)
    spend: Spend = field(default_factory=Spend)

    def add(self, agent: str, t: int, size: int, spend: Spend) -> None:
        """One accepted update of ``agent``: ``t`` entries, ``size`` encoded bytes."""
        self.spend.add(spend)
        per = self.agents.get(agent)
        if per is None:
            per = self.agents[agent] = dict(AGENT_ROUND_ZERO)
        per["t"] += t
        per["bytes"] += size
        per["updates"] += 1
        per["packets"] += spend.packets
        per["airtime_s"] += spend.airtime_s
        per["energy_j"] += spend.energy_j

    def export(self) -> dict[str, Any]:
        """The JSON-able part of a checkpoint (keys ``agents`` and ``spend``)."""
        return {
            "agents": {k: dict(v) for k, v in self.agents.items()},
            "spend": self.spend.to_dict(),
        }

    @classmethod
    def restore(cls, data: dict[str, Any]) -> RoundCosts:
        """The inverse of :meth:`export` (also reads entries written before the cost fields)."""
        return cls(
            agents={k: agent_round_from_dict(v) for k, v in data["agents"].items()},
            spend=Spend.from_dict(data["spend"]),
        )


@dataclass(frozen=True, kw_only=True)
class RoundRecord:
    """One committed model version: what produced it and what it cost.

    ``agents`` maps each agent whose updates were accepted since the previous version to
    ``{"t": entries sent (sum), "bytes": encoded bytes (sum), "updates": count, "packets",
    "airtime_s", "energy_j": their cost on the agent's own profile (sums)}``;
    ``participants`` are the agents whose update entered this step (sync: reported for
    ``base_version``; async: among the K applied). ``latency_s = closed_at - opened_at``.
    """

    version: int
    base_version: int
    opened_at: float
    closed_at: float
    reason: str
    gamma: float
    participants: tuple[str, ...]
    agents: dict[str, dict[str, float]]
    spend: Spend
    loss: float | None
    accuracy: float | None

    @property
    def latency_s(self) -> float:
        return max(0.0, self.closed_at - self.opened_at)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["participants"] = list(self.participants)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoundRecord:
        return cls(
            version=int(data["version"]),
            base_version=int(data["base_version"]),
            opened_at=float(data["opened_at"]),
            closed_at=float(data["closed_at"]),
            reason=str(data["reason"]),
            gamma=float(data["gamma"]),
            participants=tuple(data["participants"]),
            agents={str(k): agent_round_from_dict(v) for k, v in data["agents"].items()},
            spend=Spend.from_dict(data["spend"]),
            loss=None if data.get("loss") is None else float(data["loss"]),
            accuracy=None if data.get("accuracy") is None else float(data["accuracy"]),
        )


def uvarint_len(n: int) -> int:
    """``len(wire.uvarint(n))`` for n >= 0."""
    return 1 if n < 0x80 else (n.bit_length() + 6) // 7


class Pricer:
    """Prices updates on their sender's cost profile, with bounded caches.

    An engine prices every accepted update, and a fleet sends the same few sizes over and
    over: the dense size depends on the header only through the agent id and the varint
    lengths of round and seq, and a (profile, size) pair always costs the same. A profile
    that cannot be resolved is logged once and priced as bytes only.
    """

    def __init__(self, profiles: ProfileLookup | None = None) -> None:
        self._profiles = profiles
        self._profile_cache: dict[str, CostProfile | None] = {}
        self._price_cache: dict[tuple[str, int], tuple[float, int, float, float]] = {}
        self._dense_cache: dict[tuple[str, int, int], int] = {}
        #: priced Spend per (profile, size, dense size): shared, never mutated
        self._spend_cache: dict[tuple[str | None, int, int], Spend] = {}
        self._down_cache: dict[tuple[str, int], Cost] = {}
        self._logged: set[str] = set()

    def price(self, profile_name: str, header: wire.UpdateHeader, size: int) -> Spend:
        """What an update of ``size`` encoded bytes with ``header`` cost, and what its dense
        float32 twin would have (``updates=1``). The result is shared: never mutate it."""
        dense_size = self.dense_size(header)
        profile = self.profile(profile_name)
        skey = (None if profile is None else profile.name, size, dense_size)
        cached = self._spend_cache.get(skey)
        if cached is not None:
            return cached
        if len(self._spend_cache) > _CACHE_MAX:
            self._spend_cache.clear()
        spend = self._spend_cache[skey] = Spend(updates=1, bytes=size, dense_bytes=dense_size)
        if profile is not None:
            spend.bits, spend.packets, spend.airtime_s, spend.energy_j = self._cost(profile, size)
            (
                spend.dense_bits,
                spend.dense_packets,
                spend.dense_airtime_s,
                spend.dense_energy_j,
            ) = self._cost(profile, dense_size)
        return spend

    def dense_size(self, header: wire.UpdateHeader) -> int:
        """Encoded bytes of a dense float32 update with the same header."""
        key = (header.agent, uvarint_len(header.round), uvarint_len(header.seq))
        size = self._dense_cache.get(key)
        if size is None:
            if len(self._dense_cache) > _CACHE_MAX:
                self._dense_cache.clear()
            size = self._dense_cache[key] = int(
                wire.encoded_size(
                    "dense",
                    d=header.d,
                    t=header.d,
                    job=header.job,
                    agent=header.agent,
                    round=header.round,
                    seq=header.seq,
                    value_dtype="float32",
                )
            )
        return size

    def profile(self, name: str) -> CostProfile | None:
        """The profile called ``name`` (None: no name, no lookup, or it failed)."""
        if not name or self._profiles is None:
            return None
        if name not in self._profile_cache:
            try:
                self._profile_cache[name] = self._profiles(name)
            except Exception as exc:  # an unknown profile only loses the pricing
                if name not in self._logged:
                    self._logged.add(name)
                    log.warning("cannot resolve cost profile %r: %s", name, exc)
                self._profile_cache[name] = None
        return self._profile_cache[name]

    def down_cost(self, profile_name: str, size: int) -> Cost:
        """What receiving one message of ``size`` bytes costs an agent with this profile
        (its downlink part; bytes only when the profile is unknown here)."""
        profile = self.profile(profile_name)
        key = ("\0down:" + (profile.name if profile else ""), size)
        hit = self._down_cache.get(key)
        if hit is None:
            if len(self._down_cache) > _CACHE_MAX:
                self._down_cache.clear()
            hit = Cost(1, size) if profile is None else profile.downlink_cost(size).cost
            self._down_cache[key] = hit
        return hit

    def down_prices(
        self, profile_names: Iterable[str]
    ) -> list[Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float64]]]:
        """Each known profile's receiving cost function (objective unit, vectorised)."""
        out: list[Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float64]]] = []
        for name in dict.fromkeys(profile_names):
            profile = self.profile(name)
            if profile is not None:
                out.append(profile.downlink_objective_cost)
        return out

    def _cost(self, profile: CostProfile, size: int) -> tuple[float, int, float, float]:
        key = (profile.name, size)
        hit = self._price_cache.get(key)
        if hit is None:
            if len(self._price_cache) > _CACHE_MAX:
                self._price_cache.clear()
            mc = profile.message_cost(size)
            hit = self._price_cache[key] = (mc.bits, mc.packets, mc.airtime_s, mc.energy_j)
        return hit


def dense_down_size(job: str, d: int, version: int) -> int:
    """Bytes of the downlink baseline for one version: the dense float32 model change
    (``4*d`` bytes of values plus a message header, framed like a dense update)."""
    return int(
        wire.encoded_size(
            "dense", d=d, t=d, job=job, agent="r", round=version, seq=0, value_dtype="float32"
        )
    )


@dataclass
class DenseDownlink:
    """What the downlink would have cost if every committed version were sent to every
    live agent as a dense float32 model change (the baseline of the downlink savings).

    Kept by the service (it charges :meth:`charge` once per committed version, under the
    engine lock), not checkpointed: after a restart in the middle of a job it is unknown.
    """

    pricer: Pricer
    per_agent: dict[str, Cost] = field(default_factory=dict)
    total: Cost = field(default_factory=Cost)

    def charge(self, job: str, d: int, version: int, agents: Iterable[tuple[str, str]]) -> None:
        """One version sent to ``agents`` (pairs of agent id and profile name)."""
        size = dense_down_size(job, d, version)
        for agent, profile in agents:
            cost = self.pricer.down_cost(profile, size)
            self.per_agent[agent] = self.per_agent.get(agent, Cost()) + cost
            self.total = self.total + cost
