"""What accepted updates cost: :class:`Spend` totals, the per-agent sums of one round
(:class:`RoundCosts`), the record of a committed version (:class:`RoundRecord`), the
:class:`Tally` of a job (its model version, accepted updates and their totals), and the
:class:`Pricer` that prices an update on its sender's cost profile.

Every update is priced twice on the same profile: as sent, and as the dense float32 update
with the same header it replaces (the baseline the savings are measured against). A profile
turns a message size in bytes into bits, packets, airtime (seconds) and energy (joules);
see :meth:`edge_agent.links.profiles.CostProfile.message_cost`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from edge_agent.links.cost import ZERO, Cost
from edge_agent.links.profiles import CostProfile
from edge_agent.links.shared import SharedDownlink
from edge_agent.protocol import wire
from edge_agent.protocol.fragments import FRAME_HEADER_BYTES, frame_cut, parity_frames_for

log = logging.getLogger("aggregator.engine.accounting")

#: resolves the profile name an agent announced (None: unknown here, bytes only)
ProfileLookup = Callable[[str], CostProfile | None]

#: bound on each pricing cache (entries); a full cache is cleared, not evicted piecewise
_CACHE_MAX: Final = 65536


@dataclass
class Spend:
    """What accepted updates cost as sent (``actual``) and what the dense float32 updates
    with the same headers would have cost on the same profiles (``dense``): two
    :class:`~edge_agent.links.cost.Cost` values (``messages`` counts the updates).

    The JSON form (checkpoints, history rows) is the flat one of earlier versions:
    ``updates``, ``bytes``, ``bits``, ``packets``, ``airtime_s``, ``energy_j`` and the same
    prefixed ``dense_``; one ``updates`` count serves both (each update has one dense twin).
    """

    actual: Cost = ZERO
    dense: Cost = ZERO

    def add(self, other: Spend) -> None:
        self.actual = self.actual + other.actual
        self.dense = self.dense + other.dense

    def to_dict(self) -> dict[str, float | int]:
        a, d = self.actual, self.dense
        return {
            "updates": a.messages,
            "bytes": a.bytes,
            "bits": a.bits,
            "packets": a.packets,
            "airtime_s": a.airtime_s,
            "energy_j": a.energy_j,
            "dense_bytes": d.bytes,
            "dense_bits": d.bits,
            "dense_packets": d.packets,
            "dense_airtime_s": d.airtime_s,
            "dense_energy_j": d.energy_j,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Spend:
        """From :meth:`to_dict` output (missing fields: 0)."""
        dense = {k.removeprefix("dense_"): v for k, v in data.items() if k.startswith("dense_")}
        dense["updates"] = data.get("updates", 0)
        return cls(Cost.from_dict(data), Cost.from_dict(dense))


@dataclass(frozen=True, slots=True)
class AgentRound:
    """What one agent's accepted updates since the previous version held and cost: ``t``
    entries in all, and their :class:`~edge_agent.links.cost.Cost` on its own profile
    (``messages`` counts the updates). JSON: ``t``, ``updates``, ``bytes``, ``bits``,
    ``packets``, ``airtime_s``, ``energy_j``."""

    t: int = 0
    cost: Cost = ZERO

    def plus(self, t: int, cost: Cost) -> AgentRound:
        return AgentRound(self.t + t, self.cost + cost)

    def to_dict(self) -> dict[str, float | int]:
        c = self.cost
        return {
            "t": self.t,
            "updates": c.messages,
            "bytes": c.bytes,
            "bits": c.bits,
            "packets": c.packets,
            "airtime_s": c.airtime_s,
            "energy_j": c.energy_j,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentRound:
        """From :meth:`to_dict` output (older entries lack the cost fields: zero)."""
        return cls(int(data.get("t", 0)), Cost.from_dict(data))


@dataclass
class RoundCosts:
    """What the open round's accepted updates cost: per agent (see :class:`RoundRecord`)
    and in total. A committed :class:`RoundRecord` keeps these very objects, so the engine
    starts a new ``RoundCosts`` for the next round instead of clearing this one."""

    agents: dict[str, AgentRound] = field(default_factory=dict)
    spend: Spend = field(default_factory=Spend)

    def add(self, agent: str, t: int, spend: Spend) -> None:
        """One accepted update of ``agent`` with ``t`` entries, priced ``spend``."""
        self.spend.add(spend)
        self.agents[agent] = self.agents.get(agent, _NO_ROUND).plus(t, spend.actual)

    def export(self) -> dict[str, Any]:
        """The JSON-able part of a checkpoint (keys ``agents`` and ``spend``)."""
        return {
            "agents": {k: v.to_dict() for k, v in self.agents.items()},
            "spend": self.spend.to_dict(),
        }

    @classmethod
    def restore(cls, data: dict[str, Any]) -> RoundCosts:
        """The inverse of :meth:`export` (also reads entries written before the cost fields)."""
        return cls(
            agents={k: AgentRound.from_dict(v) for k, v in data["agents"].items()},
            spend=Spend.from_dict(data["spend"]),
        )


_NO_ROUND: Final = AgentRound()


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
    agents: dict[str, AgentRound]
    spend: Spend
    loss: float | None
    accuracy: float | None

    @property
    def latency_s(self) -> float:
        return max(0.0, self.closed_at - self.opened_at)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "base_version": self.base_version,
            "opened_at": self.opened_at,
            "closed_at": self.closed_at,
            "reason": self.reason,
            "gamma": self.gamma,
            "participants": list(self.participants),
            "agents": {k: v.to_dict() for k, v in self.agents.items()},
            "spend": self.spend.to_dict(),
            "loss": self.loss,
            "accuracy": self.accuracy,
        }

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
            agents={str(k): AgentRound.from_dict(v) for k, v in data["agents"].items()},
            spend=Spend.from_dict(data["spend"]),
            loss=None if data.get("loss") is None else float(data["loss"]),
            accuracy=None if data.get("accuracy") is None else float(data["accuracy"]),
        )


class Tally:
    """What a job has done: the model ``version`` (versions committed), the ``rounds``
    committed, the ``last_record``, the updates ``accepted`` and their ``totals``. The only
    writer of these counters (read them; :meth:`accepted_update` and :meth:`committed`
    change them); it exports and restores them itself (the checkpoint's ``version``,
    ``accepted``, ``rounds``, ``totals`` and ``last_record``)."""

    def __init__(self) -> None:
        self.version = 0
        self.rounds = 0
        self.accepted = 0
        self.totals = Spend()
        self.last_record: RoundRecord | None = None

    def accepted_update(self, spend: Spend) -> None:
        """An update costing ``spend`` was accepted."""
        self.accepted += 1
        self.totals.add(spend)

    def committed(self, record: RoundRecord) -> None:
        """The version of ``record`` was committed."""
        self.version = record.version
        self.rounds += 1
        self.last_record = record

    def export(self) -> dict[str, Any]:
        """The checkpoint's keys of the tally."""
        last = self.last_record
        return {
            "version": self.version,
            "accepted": self.accepted,
            "rounds": self.rounds,
            "totals": self.totals.to_dict(),
            "last_record": None if last is None else last.to_dict(),
        }

    def restore(self, meta: dict[str, Any]) -> None:
        """Load :meth:`export` (from a checkpoint's meta)."""
        self.version = int(meta["version"])
        self.accepted = int(meta["accepted"])
        self.rounds = int(meta["rounds"])
        self.totals = Spend.from_dict(meta["totals"])
        rec = meta["last_record"]
        self.last_record = None if rec is None else RoundRecord.from_dict(rec)


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
        self._price_cache: dict[tuple[str, int], Cost] = {}
        self._dense_cache: dict[tuple[str, int, int], int] = {}
        #: priced Spend per (profile, size, dense size): shared, never mutated
        self._spend_cache: dict[tuple[str | None, int, int], Spend] = {}
        self._down_cache: dict[tuple[str, int, bool], Cost] = {}
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
        actual, dense = Cost(1, size), Cost(1, dense_size)
        if profile is not None:
            actual = self._cost(profile, size)
            dense = self._cost(profile, dense_size)
        spend = self._spend_cache[skey] = Spend(actual, dense)
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

    def down_cost(self, profile_name: str, size: int, *, shared: bool = False) -> Cost:
        """What receiving one message of ``size`` bytes costs an agent with this profile:
        on its unicast downlink, or (``shared``, a job-wide message to a group member) as
        one member of its shared downlink (:meth:`CostProfile.receive_cost`); bytes only
        when the profile is unknown here."""
        profile = self.profile(profile_name)
        key = ("" if profile is None else profile.name, size, shared)
        hit = self._down_cache.get(key)
        if hit is None:
            if len(self._down_cache) > _CACHE_MAX:
                self._down_cache.clear()
            hit = (
                Cost(1, size)
                if profile is None
                else profile.receive_cost(size, job_wide=shared).cost
            )
            self._down_cache[key] = hit
        return hit

    def up_cost(self, profile_name: str, size: int) -> Cost:
        """What sending one message of ``size`` bytes costs an agent with this profile (its
        uplink; bytes only when the profile is unknown here)."""
        profile = self.profile(profile_name)
        return Cost(1, size) if profile is None else self._cost(profile, size)

    def up_silence_s(self, profile_name: str, size: int) -> float:
        """The duty-cycle silence an agent with this profile owes after sending ``size``
        bytes (0.0: no duty cycle, or the profile is unknown here)."""
        profile = self.profile(profile_name)
        if profile is None or profile.duty_cycle is None:
            return 0.0
        return profile.silence_s(self._cost(profile, size).airtime_s)

    def down_prices(
        self, receivers: Iterable[str | tuple[str, str | None]]
    ) -> list[Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float64]]]:
        """Each receiving cost function (objective unit, vectorised over message sizes):
        one per known unicast profile, and one per shared downlink group, counted once
        for the whole group (``receivers``: profile names, or (profile, group) pairs with
        the group None for a unicast receiver, as
        :meth:`aggregator.engine.downlink.pacing.DownlinkTraffic.group_of` says)."""
        out: dict[str, Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float64]]] = {}
        for item in receivers:
            name, group = (item, None) if isinstance(item, str) else item
            key = name if group is None else "@" + group
            profile = None if key in out else self.profile(name)
            if profile is None:
                continue
            shared = profile.shared_downlink
            if group is None or shared is None:
                out[key] = profile.downlink_objective_cost
            else:
                out[key] = _shared_price(shared, profile.objective)
        return list(out.values())

    def _cost(self, profile: CostProfile, size: int) -> Cost:
        """One update message of ``size`` bytes on ``profile`` (cached)."""
        key = (profile.name, size)
        hit = self._price_cache.get(key)
        if hit is None:
            if len(self._price_cache) > _CACHE_MAX:
                self._price_cache.clear()
            hit = self._price_cache[key] = profile.message_cost(size).cost
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


def _shared_price(
    shared: SharedDownlink, metric: str
) -> Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float64]]:
    """One message on a shared downlink, priced once for the group in ``metric``: the
    sender's airtime, a member's energy, the frames, or the bits of the frames on air."""

    def price(sizes: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        if metric == "airtime_s":
            return shared.airtime_s(sizes)
        if metric == "energy_j":
            return shared.member_energy_j(sizes)
        n, block, last = frame_cut(np.asarray(sizes, dtype=np.int64), shared.max_payload_bytes)
        r = parity_frames_for(n, shared.redundancy)
        frames = (n + r).astype(np.float64)
        if metric == "packets":
            return frames
        per_frame = FRAME_HEADER_BYTES + shared.per_packet_overhead_bytes
        on_air = (n - 1 + r) * block + last + frames * per_frame
        return np.asarray(8.0 * on_air, dtype=np.float64)

    return price
