"""The engine's downlink: what every agent receives so its model copy follows the aggregator.

Four modes (``AGG_DOWNLINK``, docs/algorithm.md "Both directions"):

- ``auto`` (the service's default): per version, whichever of the exact relay and the
  compressed change (below) reduces what the agents' copies miss, ``|x - w|^2``, the most
  per unit of the fleet's receiving cost (docs/algorithm.md, "The automatic downlink").
  The exact relay is the version's replicated steps while the copies are exact, else a
  *resync*: a float64 delta of every entry where ``w`` differs from ``x`` (mean jobs) or a
  state snapshot with the EF21 aggregate; after it the copies are exact again.
- ``exact``: every version is broadcast as *replicated steps*
  (:mod:`edge_agent.protocol.downlink`): the version's accepted compressed updates, re-encoded
  without their per-message header, and the step coefficient. Every replica performs the
  aggregator's float operations and holds the same bits; a version costs each agent at most
  the sum of that version's update sizes plus a header of a few bytes. In a mean-family job
  a float64 delta of the changed entries goes instead when it is smaller.
- ``delta``: the previous protocol, the float64 new values of the changed entries (kept
  for comparison).
- ``cat``: a *compressed* downlink with error feedback on the model (EF21-P: Gruntkowska,
  Tyurin and Richtarik 2023; EF21-BC in Fatkhullin et al. 2021). The aggregator keeps the
  true model ``x`` and the broadcast model ``w`` every agent holds; each version it sends
  ``C(x - w)`` and sets ``w += C(x - w)``; agents compute their gradients at ``w``. The
  level T of the sign-top-T compressor ``C`` is chosen by CAT against the fleet's downlink
  profiles: it maximises the guaranteed reduction of ``|x - w|^2`` (``A1(T)^2 / T``) per
  unit of the fleet's receiving cost, each agent's cost relative to its cost of a dense
  float32 broadcast.

A late joiner, or an agent that missed messages, gets the merged steps since its version
while they are held (``window`` versions), else a state snapshot (the model, and for EF21
jobs replicated exactly the aggregate the replicas step with).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from aggregator.engine.downlink.history import StepsHistory
from aggregator.engine.downlink.outbound import DeltaParts, Outbound, StepsParts
from edge_agent.links.profiles import CostProfile
from edge_agent.links.shared import SharedDownlink
from edge_agent.numerics.compressors import Update, compress
from edge_agent.numerics.selection import select
from edge_agent.protocol import downlink, topics, wire
from edge_agent.protocol.indexcode import index_bytes

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
DownlinkMode = Literal["exact", "delta", "cat", "auto"]
DOWNLINK_MODES: Final[tuple[str, ...]] = ("exact", "delta", "cat", "auto")
#: what the automatic downlink sent for a version: the replicated steps (or, in a mean
#: job, the delta of the changed entries), a resync of inexact copies, or a compressed change
AutoChoice = Literal["exact", "resync", "cat"]
#: an agent's receiving cost of a message of each size (its profile's objective unit)
DownPrice = Callable[[IntArray], FloatArray]


@dataclass(frozen=True, slots=True)
class _Relay:
    """The automatic downlink's exact candidate: what it is, its size, the steps it
    replays (None: a resync) and the delta that goes instead (None: the steps, or for a
    resync the state snapshot the engine sends)."""

    choice: AutoChoice
    size_bytes: int
    steps: StepsParts | None
    delta: DeltaParts | None

    def outbound(self, job: str) -> Outbound | None:
        if self.delta is not None:
            return Outbound(topics.delta(job), delta=self.delta)
        if self.steps is not None:
            return Outbound(topics.delta(job), steps=self.steps)
        return None


class Broadcast:
    """The downlink state of one job (pure; the engine drives it)."""

    def __init__(
        self,
        job: str,
        d: int,
        mode: DownlinkMode = "exact",
        *,
        window: int = 64,
        relay: bool = True,
    ) -> None:
        if mode not in DOWNLINK_MODES:
            raise ValueError(f"downlink mode {mode!r}; use one of {', '.join(DOWNLINK_MODES)}")
        self.job = job
        self.d = d
        self.mode: DownlinkMode = mode
        #: replicas can replay this job's step (False for a robust aggregation rule: the
        #: automatic downlink's exact relay is then always a resync delta)
        self.relay = relay
        #: auto mode: the copies hold ``x`` bit for bit (and, EF21, the aggregate)
        self.synced = True
        #: auto mode: how many versions went out by each choice (this process)
        self.chosen: dict[str, int] = {"exact": 0, "resync": 0, "cat": 0}
        self._ops: list[bytes] = []  # the open version's operations (exact mode)
        #: False after a restore: the open version's operations before it are not known,
        #: so its close broadcasts a state snapshot instead of steps
        self._ops_complete = True
        #: the newest broadcasts that chain, for catch-ups and a restart (history.py)
        self.history = StepsHistory(job, d, window)
        self.w: FloatArray | None = None  # the broadcast model (cat mode)
        #: the EF21 aggregate as it was when the current version closed (exact mode): a
        #: state snapshot of version v must not include the changes already on their way
        #: in the steps v -> v+1, or a replica would add them twice. None: not known (after
        #: a restore, until the next close; the next version then goes out as a snapshot)
        self._agg_at_version: FloatArray | None = np.zeros(d)
        self.t_down: int | None = None  # the last compressed broadcast's level
        self._rng = np.random.default_rng(0)

    # ------------------------------------------------------------- recording (exact mode)

    def add(self, blob: bytes, t: int, weight: float) -> None:
        """An update entered the aggregation state (the mean accumulator or EF21 aggregate)."""
        if self.mode in ("exact", "auto"):
            self._ops.append(downlink.add_op(blob, wire.body_offset(blob), t, weight))

    def drop_state(self, h: FloatArray, *, none_left: bool) -> None:
        """An agent's EF21 state ``h`` left the aggregate (``none_left``: it was the last)."""
        if self.mode in ("exact", "auto"):
            nz = np.flatnonzero(h)
            self._ops.append(
                downlink.zero_op() if none_left else downlink.sub_op(nz, h[nz], self.d)
            )

    # ------------------------------------------------------------- the model agents hold

    def model(self, x: FloatArray) -> FloatArray:
        """The model the agents hold: ``x``, or ``w`` under the compressed (and the
        automatic) downlink."""
        if self.mode in ("cat", "auto"):
            if self.w is None:
                self.w = x.copy()
            return self.w
        return x

    def snapshot(
        self, x: FloatArray, version: int, aggregate: FloatArray | None, family: str | None
    ) -> Outbound:
        """A state snapshot (retained on ``cat/<job>/model``) of what the agents hold."""
        agg = None
        exact = self.mode == "exact" or (self.mode == "auto" and self.synced)
        if exact and family == "ef21":
            if self._agg_at_version is not None and self._ops_complete:
                agg = self._agg_at_version
            else:  # the next version is a snapshot too: the current state is consistent
                agg = np.zeros(self.d) if aggregate is None else aggregate
        blob = downlink.encode_state(self.model(x), job=self.job, version=version, aggregate=agg)
        return Outbound(topics.model(self.job), blob, retain=True)

    def settle(
        self, x: FloatArray, version: int, aggregate: FloatArray | None, family: str | None
    ) -> Outbound | None:
        """The job ends between versions (an operator's stop): a state snapshot of ``x`` if
        the copies are not ``x`` (compressed downlinks), so the fleet keeps the trained
        model; None when they already are."""
        if self.mode not in ("cat", "auto") or self.w is None or np.array_equal(self.w, x):
            return None
        self._resynced(x)
        return self.snapshot(x, version, aggregate, family)

    def _resynced(self, x: FloatArray) -> None:
        """A state snapshot of ``x`` goes out: the copies become ``x``, and the steps before
        it do not chain to it."""
        self.w, self.synced = x.copy(), True
        self.history.clear()

    # ------------------------------------------------------------- one version

    def close(
        self,
        *,
        x: FloatArray,
        changed: IntArray,
        base: int,
        version: int,
        family: downlink.Family,
        coef: float,
        prices: Sequence[DownPrice],
        aggregate: FloatArray | None = None,
        final: bool = False,
    ) -> Outbound | None:
        """The broadcast for version ``base -> version``; None: send a state snapshot.
        ``aggregate``: the EF21 aggregate after this version's step (exact mode keeps a
        copy for state snapshots of this version). ``final``: the job's last version: the
        compressed downlinks send what makes every copy exact (auto: the exact relay; cat:
        None, a state snapshot of ``x``), so the fleet ends holding the trained model."""
        ops, self._ops = self._ops, []
        if self.mode == "auto":
            return self._close_auto(
                x, changed, base, version, family, coef, prices, aggregate, ops, final=final
            )
        if self.mode == "cat" and final:
            self._resynced(x)
            return None
        if self.mode == "exact" and family == "ef21":
            self._agg_at_version = np.zeros(self.d) if aggregate is None else aggregate.copy()
        if self.mode == "delta":
            return Outbound(
                topics.delta(self.job),
                delta=DeltaParts(self.job, self.d, base, version, changed, x[changed]),
            )
        if self.mode == "cat":
            ops = [self._move(x, prices)]
        else:
            ops.append(downlink.step_op(coef))
        steps = StepsParts(self.job, self.d, base, version, family, tuple(ops))
        complete, self._ops_complete = self._ops_complete, True
        if not complete:
            self.history.clear()
            return None
        self.history.append(steps)
        if (
            self.mode == "exact"
            and family == "mean"
            and _delta_size(self.d, changed) < steps.size_bytes
        ):
            delta = DeltaParts(self.job, self.d, base, version, changed, x[changed])
            return Outbound(topics.delta(self.job), delta=delta)
        return Outbound(topics.delta(self.job), steps=steps)

    # ------------------------------------------------------------- the automatic downlink

    def _close_auto(
        self,
        x: FloatArray,
        changed: IntArray,
        base: int,
        version: int,
        family: downlink.Family,
        coef: float,
        prices: Sequence[DownPrice],
        aggregate: FloatArray | None,
        ops: list[bytes],
        *,
        final: bool = False,
    ) -> Outbound | None:
        """Auto mode: the exact relay or the compressed change, whichever reduces
        ``|x - w|^2`` the most per unit of the fleet's receiving cost (ties: exact; the
        job's ``final`` version: exact). None: the exact relay is a state snapshot (the
        engine sends it)."""
        w = self.model(x)
        complete, self._ops_complete = self._ops_complete, True
        fleet = self._fleet_cost(prices)
        r = x - w
        miss = float(r @ r)
        relay = self._exact_relay(x, w, changed, base, version, family, coef, ops, aggregate,
                                  complete)  # fmt: skip
        if not final and (miss > 0.0 or not self.synced):
            t = 0 if miss == 0.0 else select(r, "signtopk", self._t_price(fleet)).t
            u = compress(r, "signtopk", t, rng=self._rng)
            moved = w.copy()
            u.add_to(moved)
            left = x - moved
            move = (downlink.move_op(u, job=self.job),)
            cat = StepsParts(self.job, self.d, base, version, family, move)
            gain = miss - float(left @ left)  # the exact relay's gain is all of ``miss``
            if (miss == 0.0 and not self.synced) or gain * _one(fleet, relay.size_bytes) > (
                miss * _one(fleet, cat.size_bytes)
            ):
                self.t_down, self.w, self.synced = t, moved, False
                self.history.append(cat)
                self.chosen["cat"] += 1
                return Outbound(topics.delta(self.job), steps=cat)
        self.w = x.copy()
        self.synced = True
        if family == "ef21":
            self._agg_at_version = np.zeros(self.d) if aggregate is None else aggregate.copy()
        if relay.steps is not None:
            self.history.append(relay.steps)
        else:  # a resync: the steps before it do not chain to it
            self.history.clear()
        self.chosen[relay.choice] += 1
        return relay.outbound(self.job)

    def _exact_relay(
        self,
        x: FloatArray,
        w: FloatArray,
        changed: IntArray,
        base: int,
        version: int,
        family: downlink.Family,
        coef: float,
        ops: list[bytes],
        aggregate: FloatArray | None,
        complete: bool,
    ) -> _Relay:
        """The message that makes every copy exact: the version's replicated steps while
        the copies are exact (in a mean job the delta of the changed entries when that is
        smaller), else a resync: a delta of the entries where ``w`` differs from ``x``
        (mean jobs) or a state snapshot with the EF21 aggregate."""
        if self.synced and complete and self.relay:
            steps = StepsParts(
                self.job, self.d, base, version, family, (*ops, downlink.step_op(coef))
            )
            if family == "mean" and _delta_size(self.d, changed) < steps.size_bytes:
                delta = DeltaParts(self.job, self.d, base, version, changed, x[changed])
                return _Relay("exact", _delta_size(self.d, changed), steps, delta)
            return _Relay("exact", steps.size_bytes, steps, None)
        if family == "mean":
            idx = np.flatnonzero(x != w).astype(np.int64)
            delta = DeltaParts(self.job, self.d, base, version, idx, x[idx])
            return _Relay("resync", _delta_size(self.d, idx), None, delta)
        agg = np.zeros(self.d) if aggregate is None else aggregate
        size = len(downlink.encode_state(x, job=self.job, version=version, aggregate=agg))
        return _Relay("resync", size, None, None)

    def _move(self, x: FloatArray, prices: Sequence[DownPrice]) -> bytes:
        """Compressed downlink: choose T by CAT, send ``C(x - w)``, move ``w`` by it."""
        w = self.model(x)
        r = x - w
        if not r.any():
            self.t_down = 0
            u = compress(r, "signtopk", 0, rng=self._rng)
        else:
            t = select(r, "signtopk", self._fleet_price(prices)).t
            self.t_down = t
            u = compress(r, "signtopk", t, rng=self._rng)
        u.add_to(w)
        return downlink.move_op(u, job=self.job)

    def _fleet_price(self, prices: Sequence[DownPrice]) -> DownPrice:
        return self._t_price(self._fleet_cost(prices))

    def _fleet_cost(self, prices: Sequence[DownPrice]) -> DownPrice:
        """The fleet's receiving cost of a job-wide message of each size (bytes): every
        receiver's cost (a unicast profile, or a shared group once) relative to its cost
        of a dense float32 broadcast, summed; the size itself if nothing is priced."""
        dense = wire.encoded_size(
            "dense", d=self.d, t=self.d, job=self.job, agent="r", round=0, seq=0
        )

        # each receiver's cost of a dense broadcast, once per version (not once per call)
        refs = [(p, float(p(np.array([dense], dtype=np.int64))[0])) for p in prices]
        refs = [(p, ref) for p, ref in refs if ref > 0]

        def cost(sizes: IntArray) -> FloatArray:
            total = np.zeros(sizes.shape)
            for p, ref in refs:
                total += p(sizes) / ref
            return total if total.any() else sizes.astype(np.float64)

        return cost

    def _t_price(self, fleet: DownPrice) -> DownPrice:
        """The fleet's cost of a sign-top-T change for each T (the selector's price)."""

        def price(t: IntArray) -> FloatArray:
            sizes = np.asarray(
                wire.encoded_size(
                    "signtopk", d=self.d, t=t, job=self.job, agent="r", round=0, seq=0
                ),
                dtype=np.int64,
            )
            return fleet(sizes)

        return price

    # ------------------------------------------------------------- local training

    def compress_change(self, r: FloatArray, prices: Sequence[DownPrice]) -> Update:
        """A local-training broadcast: ``r`` compressed by sign-top-T with T chosen by CAT
        on the fleet's receiving cost (as the compressed downlink's change), and passed
        through the codec, so the aggregator uses the very values every member decodes."""
        t = 0 if not r.any() else select(r, "signtopk", self._fleet_price(prices)).t
        self.t_down = t
        u = compress(r, "signtopk", t, rng=self._rng)
        return wire.decode(wire.encode(u, job=self.job, agent="r", round=0, seq=0))[1]

    def local(self, base: int, version: int, op: bytes) -> Outbound:
        """The broadcast of a local-training version (its LOCAL operation): every copy of
        the anchor stays exact, so it is kept for catch-ups."""
        steps = StepsParts(self.job, self.d, base, version, "local", (op,))
        self.history.append(steps)
        return Outbound(topics.delta(self.job), steps=steps)

    # ------------------------------------------------------------- catching up

    def catch_up(self, have: int | None, version: int) -> Outbound | None:
        """The merged steps from ``have`` to ``version`` if every one is held, else None."""
        return None if self.mode == "delta" else self.history.catch_up(have, version)

    def latest(self, version: int) -> Outbound | None:
        """The broadcast that ended at ``version``, if held: a restart's (None: a snapshot)."""
        return None if self.mode == "delta" else self.history.latest(version)

    # ------------------------------------------------------------- persistence

    def export(self) -> dict[str, Any]:
        """JSON-able state, so a restored engine goes on as the live one: the broadcast
        model of the compressed downlinks; in the exact and auto modes the open version's
        operations and the EF21 aggregate of the last version (auto: also whether the
        copies are exact); the newest broadcasts (history.py), for catch-ups and for the
        restart's own broadcast."""
        out: dict[str, Any] = {"mode": self.mode}
        if self.w is not None:
            out["w"] = b64_array(self.w)
        if self.mode in ("exact", "auto"):
            out["synced"] = self.synced
            out["complete"] = self._ops_complete
            out["ops"] = [base64.b64encode(op).decode("ascii") for op in self._ops]
            agg = self._agg_at_version
            out["agg_at_version"] = None if agg is None else b64_array(agg)
        out["history"] = self.history.export()
        return out

    def restore(self, data: dict[str, Any] | None) -> None:
        """The inverse of :meth:`export` (ValueError for a history that does not chain).
        From a checkpoint of another mode (or without the open version's operations) the
        next version goes out as a state snapshot."""
        self._ops_complete = False
        self._agg_at_version = None
        data = data or {}
        same = data.get("mode") == self.mode
        self.history.restore(data.get("history", data.get("local_history", [])) if same else [])
        if self.mode in ("cat", "auto") and data.get("w"):
            self.w = array_from_b64(data["w"], self.d)
        if self.mode == "cat":  # its change is computed from w: no operation to lose
            self._ops_complete = self.w is not None
        if self.mode == "auto" and (not same or self.w is None):
            self.synced = False  # resync at the next version
            return
        if self.mode in ("exact", "auto") and same and "ops" in data:
            self.synced = bool(data.get("synced", False))
            self._ops = [base64.b64decode(op) for op in data["ops"]]
            self._ops_complete = bool(data.get("complete", False))
            agg = data.get("agg_at_version")
            self._agg_at_version = None if agg is None else array_from_b64(agg, self.d)


def b64_array(arr: FloatArray) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, dtype="<f8").tobytes()).decode("ascii")


def array_from_b64(text: str, d: int) -> FloatArray | None:
    """The float64 array :func:`_b64` wrote, None unless it has ``d`` finite entries."""
    arr = np.frombuffer(base64.b64decode(text), dtype="<f8").astype(np.float64)
    return arr if arr.shape == (d,) and np.isfinite(arr).all() else None


def downlink_interval_s(profile: CostProfile, size_bytes: int) -> float:
    """How long the link to an agent stays spent after it received a message of
    ``size_bytes``: the message's downlink airtime plus the silence its sender then owes
    (``sender_duty_cycle``), and at least the share of a day its network's cap allows
    (``max_messages_per_day``, counted in link packets: each packet is a downlink).
    0.0 for a link without a downlink part (no caps)."""
    return downlink_limit(profile, size_bytes)[0]


#: what keeps a downlink busy: airtime and the sender's duty cycle, or the network's daily cap
DownlinkLimit = Literal["downlink_busy", "daily_cap"]


def downlink_limit(profile: CostProfile, size_bytes: int) -> tuple[float, DownlinkLimit]:
    """:func:`downlink_interval_s` and which limit set it (``daily_cap`` when the
    network's downlinks per day allow less than airtime and duty cycle would)."""
    down = profile.downlink
    if down is None:
        return 0.0, "downlink_busy"
    cost = profile.downlink_cost(size_bytes)
    interval = cost.airtime_s + cost.silence_s
    if down.max_messages_per_day is not None:
        capped = 86_400.0 * max(1, cost.packets) / down.max_messages_per_day
        if capped > interval:
            return capped, "daily_cap"
    return interval, "downlink_busy"


def network_of(profile_name: str) -> str:
    """The network a member on ``profile_name`` belongs to, and whose gateway sends its
    unicast downlinks: the first two parts of the name (``lorawan_eu868_dr0_sf12`` and its
    group variants: ``lorawan_eu868``), the rule ``--multicast`` matches members by."""
    return "_".join(profile_name.split("_")[:2])


def gateway_limit(profile: CostProfile, size_bytes: int) -> tuple[str, float] | None:
    """The gateway a unicast downlink of ``size_bytes`` on ``profile`` takes, and for how
    long: ``(gateway, airtime / share)``. The sender's duty cycle is the gateway's; a class
    A answer in RX1 goes out on the sub-band of the uplink before it, so the gateway may
    spend its share in each sub-band the members' uplinks use, while answers in RX2 all
    share its one sub-band (:meth:`~edge_agent.links.profile_parts.DownlinkPart.sender_share`).
    The gateway is the network's (:func:`network_of`), with ``/<band>`` for a fixed
    ``sender_band``: every member of the network shares it (one gateway: more would allow
    more). None for a downlink without a sender duty cycle."""
    gateway = gateway_share(profile)
    if gateway is None:
        return None
    name, share = gateway
    return name, profile.downlink_cost(size_bytes).airtime_s / share


def gateway_share(profile: CostProfile) -> tuple[str, float] | None:
    """The gateway timeline a unicast member on ``profile`` is answered on (its network,
    and the sub-band when its downlinks all go on one: ``lorawan_eu868/g3`` for RX2) and
    the share of time the gateway may send on it; None without a sender duty cycle."""
    down = profile.downlink
    share = None if down is None else down.sender_share(profile.duty_cycle_bands)
    if down is None or share is None:
        return None
    network = network_of(profile.name)
    return (network if down.sender_band is None else f"{network}/{down.sender_band}"), share


def shared_limit(shared: SharedDownlink, size_bytes: int) -> tuple[float, DownlinkLimit]:
    """How long a group's shared downlink stays busy after one message of ``size_bytes``
    (the group's own law: the sender's airtime over its duty cycle, or the slots it
    takes), and at least the share of a day the group's cap allows when the network caps
    it (``max_messages_per_day``, counted in frames); which limit set it."""
    got = shared.delivery_of(size_bytes)
    if shared.max_messages_per_day is not None:
        capped = 86_400.0 * max(1, got.frames) / shared.max_messages_per_day
        if capped > got.busy_s:
            return capped, "daily_cap"
    return got.busy_s, "downlink_busy"


def _one(cost: DownPrice, size_bytes: int) -> float:
    """``cost`` of one message of ``size_bytes``."""
    return float(cost(np.array([size_bytes], dtype=np.int64))[0])


def _delta_size(d: int, changed: IntArray) -> int:
    """About ``len`` of a float64 delta of ``changed`` (header aside)."""
    n = int(changed.size)
    return int(index_bytes(d, n)[0]) + 8 * n + 16
