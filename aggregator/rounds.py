"""The round engine: validation, de-duplication, quorum, model stepping and EF21 state.

:class:`RoundEngine` is *pure*: no I/O, no threads, no clock reads (every entry point takes
``now``, seconds on any clock that survives restarts, e.g. ``time.time()``). The service
(:mod:`aggregator.service`) and the simulator drive the same class; the service persists
what the engine returns *before* it publishes anything (see :class:`Effects`).

Step rules (ALGORITHM.md)
-------------------------
``gamma`` is the configured step size, or ``1/L`` with ``L = sum n_i L_i / sum n_i`` over the
hellos of every registered agent (rows ``n_i``, local smoothness ``L_i``).

* ``plain`` / ``ef`` semantics (a gradient estimate u_i per agent):
  ``x <- x - gamma * mean_i(u_i)`` over the round's participants. Updates are summed into
  one dense accumulator with :meth:`Update.add_to` (only the T sent entries are touched).
* ``ef21`` semantics (a compressed change c_i of the agent's state h_i): every
  non-duplicate c_i is added to ``h_i`` and to ``sum_h`` exactly once, whenever it arrives
  (late ones included: it is state, not a gradient); the step is
  ``x <- x - gamma * sum_h / n`` with ``n`` the number of agents that have said hello.
  A hello with ``fresh=True`` resets that agent's ``h_i`` (and its de-duplication keys).

A job uses one family of semantics: the first accepted hello fixes ``{plain, ef}`` or
``{ef21}``; hellos of the other family are rejected (``wrong_semantics``).

Modes
-----
``sync``: the round for version ``v`` accepts updates tagged ``v``; it closes when every
live agent has reported, or once ``round_deadline_s`` has passed since it opened and
``max(quorum_min_agents, ceil(quorum_fraction * live))`` agents have reported. Round 0
closes only after ``min_agents`` agents have said hello (its deadline starts then).

``async``: updates up to ``max_staleness`` versions old are accepted; each is weighted by
``1 / (1 + staleness)`` (staleness = current version - the version it was computed at), and
every ``async_apply_every`` (K) accepted updates the model steps with
``x <- x - gamma * (1/K) * sum_j w_j u_j``. EF21 in async mode steps with
``x <- x - gamma * min(1, K/n) * sum_h / n``: only K of the n states were refreshed since
the last step, and without the ``K/n`` factor a step every K < n updates re-applies the
stale states n/K times per refresh (it diverges at gamma = 1/L); with K = n it is the sync
step.

Every new version produces a delta (the changed indices and their *new* values, so an
agent's copy stays bit-identical) on ``cat/<job>/delta`` (the service merges the deltas of
one ingest batch into one, :func:`merge_deltas`) and a retained snapshot on
``cat/<job>/model`` every ``snapshot_every`` versions. The engine stops (``Control(cmd="stop")``) when the version reaches
``max_rounds`` or the evaluated loss reaches ``target_loss``.

Bad messages are counted by reason (:data:`REJECT_REASONS`), logged once per reason and
dropped: :meth:`RoundEngine.handle` never raises and validates fully before it changes
anything.
"""

from __future__ import annotations

import json
import logging
import math
from array import array
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from edge_agent import messages, wire
from edge_agent.compressors import COMPRESSOR_IDS, Update
from edge_agent.errors import WireFormatError
from edge_agent.profiles import CostProfile
from edge_agent.transports import topics

log = logging.getLogger("aggregator.rounds")

FloatArray = npt.NDArray[np.float64]
Mode = Literal["sync", "async"]
EngineStateName = Literal["waiting", "running", "paused", "finished"]
Family = Literal["mean", "ef21"]

#: Every reason a message can be rejected for (the Prometheus label values).
REJECT_REASONS: Final[tuple[str, ...]] = (
    "malformed",
    "unexpected_topic",
    "wrong_job",
    "agent_mismatch",
    "unknown_agent",
    "wrong_d",
    "wrong_model",
    "wrong_compressor",
    "wrong_semantics",
    "duplicate",
    "stale",
    "ef21_reset",
    "future_version",
    "paused",
    "finished",
    "internal_error",
)

#: Largest payload handle() looks at (a dense float64 update of d = 2**24 fits).
MAX_PAYLOAD_BYTES: Final = 256 * 2**20


_NO_INDICES: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)


class _Reject(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


# ------------------------------------------------------------------------- value types


@dataclass(frozen=True, slots=True)
class DeltaParts:
    """What a delta message says (the *new* values at the changed indices), not yet
    encoded: the service merges a batch's consecutive deltas into one (:func:`merge_deltas`)
    and encodes only that."""

    job: str
    d: int
    base_version: int
    version: int
    indices: npt.NDArray[np.int64]  # sorted, distinct
    values: FloatArray

    def encode(self) -> bytes:
        return wire.encode_delta(
            self.indices,
            self.values,
            job=self.job,
            base_version=self.base_version,
            version=self.version,
            d=self.d,
        )


class Outbound:
    """A message to publish on every transport. A delta's bytes are encoded on first use."""

    __slots__ = ("_payload", "delta", "retain", "topic")

    def __init__(
        self,
        topic: str,
        payload: bytes | None = None,
        retain: bool = False,
        *,
        delta: DeltaParts | None = None,
    ) -> None:
        if (payload is None) == (delta is None):
            raise ValueError("an Outbound has either a payload or delta parts")
        self.topic = topic
        self.retain = retain
        self.delta = delta
        self._payload = payload

    @property
    def payload(self) -> bytes:
        if self._payload is None:
            assert self.delta is not None
            self._payload = self.delta.encode()
        return self._payload

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Outbound):
            return NotImplemented
        return (self.topic, self.payload, self.retain) == (other.topic, other.payload, other.retain)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        what = f"delta {self.delta.base_version}->{self.delta.version}" if self.delta else ""
        size = f"{len(self._payload)} bytes" if self._payload is not None else "not encoded"
        return f"Outbound({self.topic!r}, {what or size}, retain={self.retain})"


def merge_deltas(outbound: Iterable[Outbound]) -> list[Outbound]:
    """Replace every run of consecutive, chained deltas (each one's base is the previous
    one's version) by one delta from the first base to the last version.

    Applying the merged delta sets every index to the value the last delta of the run gave
    it, exactly what applying the run in order does, so agents reach the same bits with one
    message. Everything else keeps its place. The service publishes a batch's messages
    through this: a batch that committed 37 versions broadcasts one delta, not 37 (agents
    only ever hold broadcast versions, so none needs the ones in between).
    """
    out: list[Outbound] = []
    run: list[Outbound] = []

    def flush() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            out.append(_merged(run))
        run.clear()

    for o in outbound:
        d = o.delta
        if d is None:
            flush()
            out.append(o)
            continue
        prev = run[-1].delta if run else None
        if prev is not None and (prev.version != d.base_version or o.topic != run[-1].topic):
            flush()
        run.append(o)
    flush()
    return out


def _merged(run: list[Outbound]) -> Outbound:
    parts = [o.delta for o in run if o.delta is not None]
    first, last = parts[0], parts[-1]
    idx = np.concatenate([p.indices for p in parts])
    vals = np.concatenate([p.values for p in parts])
    order = np.argsort(idx, kind="stable")  # equal indices stay in version order
    idx, vals = idx[order], vals[order]
    last_of_each = np.empty(idx.size, dtype=bool)
    if idx.size:
        np.not_equal(idx[1:], idx[:-1], out=last_of_each[:-1])
        last_of_each[-1] = True
    merged = DeltaParts(
        job=first.job,
        d=first.d,
        base_version=first.base_version,
        version=last.version,
        indices=idx[last_of_each],
        values=vals[last_of_each],
    )
    return Outbound(run[0].topic, retain=run[0].retain, delta=merged)


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """What the engine needs to know; built from :class:`aggregator.settings.Settings`.

    Times are seconds, ``max_rounds`` and ``max_staleness`` are model versions.
    ``dedupe_window``: (agent, round, seq) keys are remembered for this many versions;
    an update older than that is rejected as ``stale`` (it could not be de-duplicated).
    """

    job: str
    d: int
    model: str = "logreg"
    mode: Mode = "sync"
    step_size: float | None = None
    max_rounds: int | None = None
    target_loss: float | None = None
    quorum_min_agents: int = 1
    quorum_fraction: float = 0.5
    min_agents: int = 1
    round_deadline_s: float = 30.0
    async_apply_every: int = 1
    max_staleness: int = 4
    liveness_timeout_s: float = 60.0
    dedupe_window: int = 1024
    #: also publish the retained snapshot every N versions (0: only on start, on request and
    #: to a rejoining agent). Agents follow deltas; the snapshot is for late joiners.
    snapshot_every: int = 50
    #: EF21 jobs without a configured step use gamma = ef21_step_factor / L: theory asks
    #: gamma <= 1/(L (1 + sqrt(beta/theta))), far below 1/L when T << d; 1/(2L) is the
    #: practical choice ALGORITHM.md names (at 1/L the paper preset diverged on one profile).
    ef21_step_factor: float = 0.5

    def __post_init__(self) -> None:
        topics.validate_id(self.job, "job id")
        checks = [
            (self.d >= 1, "d must be >= 1"),
            (self.mode in ("sync", "async"), "mode must be 'sync' or 'async'"),
            (self.step_size is None or self.step_size > 0, "step_size must be > 0"),
            (self.max_rounds is None or self.max_rounds >= 1, "max_rounds must be >= 1"),
            (self.quorum_min_agents >= 1, "quorum_min_agents must be >= 1"),
            (0.0 <= self.quorum_fraction <= 1.0, "quorum_fraction must be in [0, 1]"),
            (self.min_agents >= 1, "min_agents must be >= 1"),
            (self.round_deadline_s > 0, "round_deadline_s must be > 0"),
            (self.async_apply_every >= 1, "async_apply_every must be >= 1"),
            (self.max_staleness >= 0, "max_staleness must be >= 0"),
            (self.liveness_timeout_s > 0, "liveness_timeout_s must be > 0"),
            (self.snapshot_every >= 0, "snapshot_every must be >= 0"),
            (0 < self.ef21_step_factor <= 1, "ef21_step_factor must be in (0, 1]"),
            (
                self.dedupe_window >= max(1, self.max_staleness),
                "dedupe_window must be >= max_staleness",
            ),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"EngineConfig: {msg}")


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
            agents={str(k): _agent_round(v) for k, v in data["agents"].items()},
            spend=Spend.from_dict(data["spend"]),
            loss=None if data.get("loss") is None else float(data["loss"]),
            accuracy=None if data.get("accuracy") is None else float(data["accuracy"]),
        )


@dataclass(frozen=True, slots=True)
class Effects:
    """What one engine call did.

    ``outbound``: publish these, in order, on every transport — but only after
    ``committed`` (a new model version) has been persisted. ``journal``: the inbound
    message changed engine state (persist it to replay after a crash). ``changed``: state
    changed in a way only a checkpoint captures (control commands). ``reason``: why the
    message was rejected, else None.
    """

    outbound: tuple[Outbound, ...] = ()
    committed: RoundRecord | None = None
    journal: bool = False
    changed: bool = False
    reason: str | None = None


_TOPIC_CACHE_MAX: Final = 8192

#: per agent and round: entries (T) and bytes sent, updates, and their priced cost
_AGENT_ROUND_ZERO: Final[dict[str, float]] = {
    "t": 0, "bytes": 0, "updates": 0, "packets": 0, "airtime_s": 0.0, "energy_j": 0.0,
}  # fmt: skip
_AGENT_ROUND_FLOATS: Final = frozenset({"airtime_s", "energy_j"})


def _agent_round(data: dict[str, Any]) -> dict[str, float]:
    """A per-agent round entry from JSON (older entries lack the cost fields: zero)."""
    out = dict(_AGENT_ROUND_ZERO)
    for k, v in data.items():
        out[str(k)] = float(v) if k in _AGENT_ROUND_FLOATS else int(v)
    return out


#: shared, immutable results of the common cases (no allocation per message)
_NOTHING: Final = Effects()
_JOURNAL_ONLY: Final = Effects(journal=True)


@dataclass
class AgentInfo:
    """The engine's view of one agent (internal, mutable; the API copies it)."""

    agent: str
    hello: messages.Hello
    first_seen: float
    last_seen: float
    live: bool = True
    state: str = "online"  # online | offline | done | lost
    joined_version: int = 0
    accepted: int = 0
    rejected: int = 0
    last_round: int | None = None
    last_t: int | None = None
    spend: Spend = field(default_factory=Spend)
    #: EF21: its state h_i was dropped; its updates are refused until a fresh hello
    needs_reset: bool = False

    def to_dict(self) -> dict[str, Any]:
        # not asdict(): it deep-copies the (immutable) pydantic hello on every call
        out = dict(vars(self))
        out["hello"] = self.hello.model_dump(mode="json")
        out["spend"] = self.spend.to_dict()
        return out

    def copy(self) -> AgentInfo:
        """An independent copy (the hello is immutable and shared)."""
        return replace(self, spend=replace(self.spend))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentInfo:
        fields = dict(data)
        fields["hello"] = messages.Hello.model_validate(data["hello"])
        fields["spend"] = Spend.from_dict(data["spend"])
        return cls(**fields)


@dataclass(frozen=True)
class EngineSnapshot:
    """Everything needed to rebuild a :class:`RoundEngine` (arrays + a JSON-able ``meta``)."""

    x: FloatArray
    acc: FloatArray
    h_agents: tuple[str, ...]
    h: FloatArray  # shape (len(h_agents), d)
    sum_h: FloatArray  # shape (d,) or (0,) when no EF21 state exists
    seen: npt.NDArray[np.int64]  # shape (k, 3): agent index in meta["agents"], round, seq
    meta: dict[str, Any]


Evaluator = Callable[[FloatArray], tuple[float, float | None]]
#: an update's decoding: what wire.decode returns, or the error it raises
Decoded = tuple[wire.UpdateHeader, Update] | WireFormatError
ProfileLookup = Callable[[str], CostProfile | None]

_STATE_FORMAT: Final = 1


def _uvarint_len(n: int) -> int:
    """``len(wire.uvarint(n))`` for n >= 0."""
    return 1 if n < 0x80 else (n.bit_length() + 6) // 7


def _sorted_unique(parts: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    """The distinct values of ``parts`` (each sorted and distinct), ascending."""
    if not parts:
        return _NO_INDICES
    if len(parts) == 1:
        return parts[0]
    idx = np.concatenate(parts)
    if idx.size == 0:  # every part empty (updates with T = 0)
        return idx
    idx.sort()
    keep = np.empty(idx.size, dtype=bool)
    keep[0] = True
    np.not_equal(idx[1:], idx[:-1], out=keep[1:])
    return idx[keep]


def _family(semantics: str) -> Family:
    return "ef21" if semantics == "ef21" else "mean"


class _Seen:
    """De-duplication keys: (agent, round, seq) of every applied update in the window.

    A set per (agent, round) answers "seen before?"; a flat int64 log of
    ``(agent index, round, seq)`` rows (agent index: position in the engine's agent
    registry) lets a checkpoint copy every key with one numpy call instead of walking the
    sets. Rounds older than the window floor are dropped from the sets at once and from the
    log lazily (at :meth:`rows`, or when it has doubled), so both stay bounded.
    """

    __slots__ = ("_floor", "_log", "_log_floor", "_logged_rows", "sets")

    def __init__(self) -> None:
        self.sets: dict[str, dict[int, set[int]]] = {}
        self._log: array[int] = array("q")
        self._logged_rows = 0  # rows right after the last compaction
        self._floor = 0  # rounds below this are gone from the sets
        self._log_floor = 0  # ... and from the log

    def contains(self, agent: str, round: int, seq: int) -> bool:
        rounds = self.sets.get(agent)
        return rounds is not None and seq in rounds.get(round, ())

    def add(self, agent: str, index: int, round: int, seq: int) -> None:
        self.sets.setdefault(agent, {}).setdefault(round, set()).add(seq)
        self._log.extend((index, round, seq))

    def forget(self, agent: str, index: int) -> None:
        """Drop every key of one agent (a fresh rejoin)."""
        if self.sets.pop(agent, None) is not None:
            rows = self._rows()
            self._set_log(rows[rows[:, 0] != index])

    def prune(self, floor: int) -> None:
        """Forget rounds below ``floor`` (which only grows, one version at a time)."""
        if floor <= self._floor:
            return
        if floor - self._floor <= 64:
            gone = range(self._floor, floor)
            for rounds in self.sets.values():
                for r in gone:
                    rounds.pop(r, None)
        else:
            for rounds in self.sets.values():
                for r in [r for r in rounds if r < floor]:
                    del rounds[r]
        self._floor = floor
        if len(self._log) // 3 > 2 * max(self._logged_rows, 4096):  # rows doubled
            self.rows()

    def rows(self) -> npt.NDArray[np.int64]:
        """Every key as a (k, 3) int64 array (a copy), compacting the log."""
        rows = self._rows()
        if self._log_floor < self._floor:
            rows = rows[rows[:, 1] >= self._floor]
            self._set_log(rows)
            self._log_floor = self._floor
        return rows.copy()

    def _rows(self) -> npt.NDArray[np.int64]:
        return np.frombuffer(self._log, dtype=np.int64).reshape(-1, 3)

    def _set_log(self, rows: npt.NDArray[np.int64]) -> None:
        self._log = array("q", np.ascontiguousarray(rows, dtype=np.int64).tobytes())
        self._logged_rows = len(rows)


class RoundEngine:
    """Round logic for one job. Not thread-safe: the caller serialises calls.

    ``evaluator(x) -> (loss, accuracy or None)`` is called once per new version (and once
    at start); ``profiles(name) -> CostProfile | None`` resolves the profile name an agent
    announced, for pricing what it sent (None: bytes only).
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        x0: FloatArray | None = None,
        evaluator: Evaluator | None = None,
        profiles: ProfileLookup | None = None,
    ) -> None:
        self.config = config
        d = config.d
        self.x: FloatArray = np.zeros(d) if x0 is None else np.array(x0, dtype=np.float64)
        if self.x.shape != (d,):
            raise ValueError(f"x0 must have shape ({d},), got {self.x.shape}")
        self.version = 0
        self.state: EngineStateName = "waiting"
        self._resume_to: EngineStateName = "waiting"
        self.finish_reason = ""
        self.family: Family | None = None
        self.agents: dict[str, AgentInfo] = {}
        self.h: dict[str, FloatArray] = {}
        self.sum_h: FloatArray | None = None
        self._seen = _Seen()
        self._agent_index: dict[str, int] = {}  # position in self.agents
        self.accepted = 0
        self.rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        self.rounds = 0
        self.totals = Spend()
        self.last_record: RoundRecord | None = None
        self.loss: float | None = None
        self.accuracy: float | None = None
        # the open round
        self._acc: FloatArray = np.zeros(d)
        #: indices the open round's plain updates touched (None: unknown or all), so a
        #: step costs O(touched) instead of several passes over d; same floats either way
        self._touched: list[npt.NDArray[np.int64]] | None = []
        #: sparse plain updates not yet added to _acc, with their weights, in arrival order;
        #: one np.add.at per round adds them in that order (the same floats as one
        #: ``update.add_to(acc, w)`` per update, for a fraction of the numpy calls)
        self._pending: list[tuple[Update, float]] = []
        self._gamma: float | None = None  # cached step size (hellos change it)
        self._contrib: dict[str, int] = {}  # participant -> number of contributing updates
        self._count = 0  # contributing updates (the async K counter)
        self._round_agents: dict[str, dict[str, float]] = {}
        self._round_spend = Spend()
        self._opened_at: float | None = None
        self._evaluator = evaluator
        self._profiles = profiles
        self._profile_cache: dict[str, CostProfile | None] = {}
        self._price_cache: dict[tuple[str, int], tuple[float, int, float, float]] = {}
        self._dense_cache: dict[tuple[str, int, int], int] = {}
        #: priced Spend per (profile, size, dense size): shared, never mutated
        self._spend_cache: dict[tuple[str | None, int, int], Spend] = {}
        self._logged: set[str] = set()
        self._topics: dict[str, topics.Topic] = {}  # parsed topics: each agent uses a few
        self._evaluate()

    # ------------------------------------------------------------------ public API

    def handle(
        self, topic: str, payload: bytes, now: float, *, decoded: Decoded | None = None
    ) -> Effects:
        """Process one inbound message (any agent topic of this job). Never raises.

        ``decoded``: what :func:`edge_agent.wire.decode` returns (or raises) for ``payload``
        when the caller already decoded it (the service decodes a batch of updates at once
        with :func:`edge_agent.wire.decode_many`); used only for an update topic.
        """
        agent: str | None = None
        try:
            parsed = self._topics.get(topic)
            if parsed is None:
                try:
                    parsed = topics.parse(topic)
                except ValueError:
                    raise _Reject("unexpected_topic", topic[:80]) from None
                if len(self._topics) >= _TOPIC_CACHE_MAX:
                    self._topics.clear()
                self._topics[topic] = parsed
            if parsed.job != self.config.job:
                raise _Reject("wrong_job", parsed.job)
            if parsed.agent is None:
                raise _Reject("unexpected_topic", topic)
            agent = parsed.agent
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise _Reject("malformed", "payload is not bytes")
            if len(payload) > MAX_PAYLOAD_BYTES:
                raise _Reject("malformed", f"{len(payload)} bytes")
            blob = bytes(payload)
            if parsed.kind == "update":
                return self._on_update(agent, blob, now, decoded)
            if parsed.kind == "hello":
                return self._on_hello(agent, blob, now)
            if parsed.kind == "status":
                return self._on_status(agent, blob, now)
            return self._on_request(agent, blob, now)
        except _Reject as rej:
            return self._reject(rej.reason, rej.detail, agent)
        except Exception as exc:  # a bug must not kill the ingest loop
            log.exception("internal error handling %s", topic[:80])
            return self._reject("internal_error", f"{type(exc).__name__}: {exc}", agent)

    def tick(self, now: float) -> Effects:
        """Advance time: mark silent agents dead, close a sync round at its deadline.

        ``journal`` is set when the tick changed anything, so a replay of the journal
        reproduces the state exactly (ticks that change nothing need not be stored).
        """
        changed = False
        for info in self.agents.values():
            if info.live and now - info.last_seen > self.config.liveness_timeout_s:
                info.live = False
                info.state = "lost"
                changed = True
        if self.state == "waiting":
            self._maybe_start(now)
            changed = changed or self.state != "waiting"
        closed = self._maybe_close(now)
        if changed or closed.committed is not None or closed.changed:
            return Effects(
                outbound=closed.outbound,
                committed=closed.committed,
                journal=True,
                changed=closed.changed,
            )
        return closed

    def control(self, cmd: Literal["pause", "resume", "stop"], now: float) -> Effects:
        """Operator command. Returns the control message to broadcast (``changed``: checkpoint)."""
        job = self.config.job
        if self.state == "finished":
            return Effects()
        if cmd == "pause":
            if self.state == "paused":
                return Effects()
            self._resume_to, self.state = self.state, "paused"
        elif cmd == "resume":
            if self.state != "paused":
                return Effects()
            self.state = self._resume_to
            if self._opened_at is not None:
                self._opened_at = now  # the deadline restarts after a pause
        else:
            self._finish("stopped by operator")
        ctl = messages.Control(
            cmd=cmd, version=self.version, reason=self.finish_reason if cmd == "stop" else ""
        )
        out = [Outbound(topics.control(job), messages.dump(ctl))]
        more = self._maybe_close(now) if cmd == "resume" else Effects()
        return Effects(outbound=(*out, *more.outbound), committed=more.committed, changed=True)

    def resync_message(self) -> Outbound:
        """Control ``resync``: the aggregator (re)started at this version."""
        ctl = messages.Control(cmd="resync", version=self.version, reason="aggregator started")
        return Outbound(topics.control(self.config.job), messages.dump(ctl))

    def snapshot_message(self) -> Outbound:
        """The current model as a retained snapshot on ``cat/<job>/model``."""
        blob = wire.encode_snapshot(self.x, job=self.config.job, version=self.version)
        return Outbound(topics.model(self.config.job), blob, retain=True)

    @property
    def live_agents(self) -> int:
        return sum(1 for a in self.agents.values() if a.live)

    def gamma(self) -> float:
        """The step size: configured, else 1/L with L = sum n_i L_i / sum n_i over hellos
        (times ``ef21_step_factor`` in an EF21 job)."""
        if self.config.step_size is not None:
            return self.config.step_size
        if self._gamma is not None:
            return self._gamma
        factor = self.config.ef21_step_factor if self.family == "ef21" else 1.0
        hellos = [a.hello for a in self.agents.values()]
        if not hellos:
            return 0.0
        rows = sum(h.rows for h in hellos)
        if rows > 0:
            big_l = sum(h.rows * h.smoothness for h in hellos) / rows
        else:
            big_l = sum(h.smoothness for h in hellos) / len(hellos)
        self._gamma = factor / big_l  # until the next hello
        return self._gamma

    def quorum(self, live: int | None = None) -> int:
        n = self.live_agents if live is None else live
        return max(self.config.quorum_min_agents, math.ceil(self.config.quorum_fraction * n))

    @property
    def open_round(self) -> dict[str, Any]:
        """Participants and age of the open round (for the status API)."""
        return {
            "participants": sorted(self._contrib),
            "updates": self._count,
            "opened_at": self._opened_at,
        }

    # ------------------------------------------------------------------ messages

    def _on_hello(self, agent: str, blob: bytes, now: float) -> Effects:
        cfg = self.config
        try:
            hello = messages.parse(messages.Hello, blob)
        except WireFormatError as exc:
            raise _Reject("malformed", exc.reason) from None
        if hello.agent != agent:
            raise _Reject("agent_mismatch", f"hello from {hello.agent!r} on {agent!r}'s topic")
        if hello.job != cfg.job:
            raise _Reject("wrong_job", hello.job)
        if hello.d != cfg.d:
            raise _Reject("wrong_d", f"{agent}: d={hello.d}, job has d={cfg.d}")
        if hello.model != cfg.model:
            raise _Reject("wrong_model", f"{agent}: model {hello.model!r}, job runs {cfg.model!r}")
        if hello.compressor not in COMPRESSOR_IDS:
            raise _Reject("wrong_compressor", f"{agent}: {hello.compressor!r}")
        fam = _family(hello.semantics)
        others = [a for a in self.agents if a != agent]
        if self.family is not None and fam != self.family and others:
            raise _Reject("wrong_semantics", f"{agent}: {hello.semantics} in a {self.family} job")
        # --- apply
        self._gamma = None  # a hello may change L (rows, smoothness) or the family
        info = self.agents.get(agent)
        if info is None:
            info = AgentInfo(
                agent, hello, first_seen=now, last_seen=now, joined_version=self.version
            )
            self.agents[agent] = info
            self._agent_index[agent] = len(self._agent_index)
        else:
            if hello.fresh:
                self._reset_agent_state(agent)
                info.needs_reset = False
            info.hello = hello
        info.last_seen = max(info.last_seen, now)
        info.live = True
        info.state = "online"
        if self.family != fam:
            if self.family is not None:
                self._reset_agent_state(agent)  # the only agent switched semantics
            self.family = fam
        out: list[Outbound] = []
        if hello.version is not None and hello.version != self.version:
            out.append(self.snapshot_message())
        out.extend(self.state_controls())
        if info.needs_reset:
            out.append(self._reset_message(agent))
        if self.state == "waiting":
            self._maybe_start(now)
        return Effects(outbound=tuple(out), journal=True)

    def _on_status(self, agent: str, blob: bytes, now: float) -> Effects:
        try:
            status = messages.parse(messages.Status, blob)
        except WireFormatError as exc:
            raise _Reject("malformed", exc.reason) from None
        if status.agent is not None and status.agent != agent:
            raise _Reject("agent_mismatch", f"status for {status.agent!r} on {agent!r}'s topic")
        info = self.agents.get(agent)
        if info is None:
            raise _Reject("unknown_agent", agent)
        info.state = status.state
        info.live = status.state == "online"
        if info.live:
            info.last_seen = max(info.last_seen, now)
        return Effects(journal=True)

    def _on_request(self, agent: str, blob: bytes, now: float) -> Effects:
        try:
            messages.parse(messages.Request, blob)
        except WireFormatError as exc:
            raise _Reject("malformed", exc.reason) from None
        info = self.agents.get(agent)
        if info is not None:
            info.last_seen = max(info.last_seen, now)
            info.live = True
            info.state = "online"
        return Effects(outbound=(self.snapshot_message(), *self.state_controls()))

    def _on_update(self, agent: str, blob: bytes, now: float, decoded: Decoded | None) -> Effects:
        cfg = self.config
        if decoded is None:
            try:
                decoded = wire.decode(blob)
            except WireFormatError as exc:
                decoded = exc
        if isinstance(decoded, WireFormatError):
            raise _Reject("malformed", decoded.reason)
        header, update = decoded
        if header.job != cfg.job:
            raise _Reject("wrong_job", header.job)
        if header.agent != agent:
            raise _Reject("agent_mismatch", f"update from {header.agent!r} on {agent!r}'s topic")
        info = self.agents.get(agent)
        if info is None:
            raise _Reject("unknown_agent", f"{agent} sent an update before its hello")
        if header.d != cfg.d:
            raise _Reject("wrong_d", f"{agent}: d={header.d}, job has d={cfg.d}")
        if header.compressor != info.hello.compressor:
            raise _Reject(
                "wrong_compressor",
                f"{agent}: {header.compressor}, hello said {info.hello.compressor}",
            )
        if header.semantics != info.hello.semantics:
            raise _Reject(
                "wrong_semantics", f"{agent}: {header.semantics}, hello said {info.hello.semantics}"
            )
        if self._seen.contains(agent, header.round, header.seq):
            detail = f"{agent} round {header.round} seq {header.seq}"
            if header.round < self.version:
                # A re-send of an update already applied to an older version: the agent
                # never saw the versions since (e.g. a restart recovered a version that was
                # persisted but not yet published, and ZeroMQ dropped the start-up snapshot
                # before the agent re-subscribed). Without the model it would re-send forever.
                eff = self._reject("duplicate", detail, agent)
                out = (self.snapshot_message(), *self.state_controls())
                return Effects(outbound=out, reason=eff.reason)
            raise _Reject("duplicate", detail)
        if self.state == "finished":
            raise _Reject("finished")
        if header.round > self.version:
            raise _Reject(
                "future_version", f"{agent}: round {header.round} > version {self.version}"
            )
        staleness = self.version - header.round
        ef21 = header.semantics == "ef21"
        if ef21 and (info.needs_reset or staleness > cfg.dedupe_window):
            return self._ef21_reset(agent, info, staleness)
        if staleness > cfg.dedupe_window:
            raise _Reject("stale", f"{agent}: {staleness} versions old (beyond the dedupe window)")
        sync = cfg.mode == "sync"
        contributes = self.state != "paused"
        if sync:
            contributes = contributes and staleness == 0
            if not ef21 and agent in self._contrib and staleness == 0:
                raise _Reject("duplicate", f"{agent} already reported for round {header.round}")
        else:
            contributes = contributes and staleness <= cfg.max_staleness
        if not ef21 and not contributes:
            if self.state == "paused":
                raise _Reject("paused", f"{agent}: round {header.round}")
            # The round closed without this agent (deadline + quorum) and it may have missed
            # the delta: answer with the model, or it would re-send this update forever.
            eff = self._reject("stale", f"{agent}: round {header.round}", agent)
            return Effects(outbound=(self.snapshot_message(),), reason=eff.reason)
        if ef21 and sync and contributes and agent in self._contrib:
            contributes = False  # a second change for the same round: state only
        spend = self._price(info, header, len(blob))
        # --- apply (nothing below can fail on a validated update)
        self._seen.add(agent, self._agent_index[agent], header.round, header.seq)
        info.last_seen = max(info.last_seen, now)
        info.live = True
        info.state = "online"
        info.accepted += 1
        info.last_round = header.round
        info.last_t = header.t
        info.spend.add(spend)
        self.accepted += 1
        self.totals.add(spend)
        self._round_spend.add(spend)
        per = self._round_agents.get(agent)
        if per is None:
            per = self._round_agents[agent] = dict(_AGENT_ROUND_ZERO)
        per["t"] += header.t
        per["bytes"] += len(blob)
        per["updates"] += 1
        per["packets"] += spend.packets
        per["airtime_s"] += spend.airtime_s
        per["energy_j"] += spend.energy_j
        if ef21:
            self._apply_ef21(agent, update)
        if contributes:
            self._contrib[agent] = self._contrib.get(agent, 0) + 1
            self._count += 1
            if not ef21:
                weight = 1.0 if sync else 1.0 / (1.0 + staleness)
                if (
                    self._touched is not None
                    and update.indices is not None
                    and update.scale is None
                ):
                    self._pending.append((update, weight))
                    self._touched.append(update.indices)
                else:
                    self._flush_pending()
                    update.add_to(self._acc, weight)
                    if self._touched is not None:
                        if update.indices is None:
                            self._touched = None
                        else:
                            self._touched.append(update.indices)
        if self._opened_at is None and self.state != "waiting":
            self._opened_at = now
        closed = self._maybe_close(now)
        if closed is _NOTHING:
            return _JOURNAL_ONLY
        return replace(closed, journal=True)

    # ------------------------------------------------------------------ internals

    def _apply_ef21(self, agent: str, update: Update) -> None:
        h = self.h.get(agent)
        if h is None:
            h = self.h[agent] = np.zeros(self.config.d)
        if self.sum_h is None:
            self.sum_h = np.zeros(self.config.d)
        update.add_to(h)
        update.add_to(self.sum_h)

    def _ef21_reset(self, agent: str, info: AgentInfo, staleness: int) -> Effects:
        """An EF21 change older than the de-duplication window may or may not have been
        applied already: applying it could count it twice, dropping it would leave the
        agent's h_i and ours apart for good. Drop our h_i instead and ask the agent to zero
        its own and rejoin fresh (refusing its changes until then)."""
        if not info.needs_reset:
            self._reset_agent_state(agent)
            info.needs_reset = True
            log.warning(
                "%s: EF21 update %d versions old (beyond the de-duplication window of %d); "
                "its state was reset, waiting for a fresh hello",
                agent,
                staleness,
                self.config.dedupe_window,
            )
        eff = self._reject("ef21_reset", f"{agent}: waiting for a fresh hello", agent)
        # journalled: the reset changed state a replay must reproduce
        return Effects(outbound=(self._reset_message(agent),), journal=True, reason=eff.reason)

    def _reset_message(self, agent: str) -> Outbound:
        ctl = messages.Control(cmd="reset", agent=agent, version=self.version)
        return Outbound(topics.control(self.config.job), messages.dump(ctl))

    def _reset_agent_state(self, agent: str) -> None:
        h = self.h.pop(agent, None)
        if h is not None and self.sum_h is not None:
            self.sum_h -= h
            if not self.h:
                self.sum_h[:] = 0.0  # exact zero, no rounding residue
        self._seen.forget(agent, self._agent_index[agent])

    def _price(self, info: AgentInfo, header: wire.UpdateHeader, size: int) -> Spend:
        # The dense size depends on round and seq only through their varint lengths.
        key = (header.agent, _uvarint_len(header.round), _uvarint_len(header.seq))
        dense_size = self._dense_cache.get(key)
        if dense_size is None:
            if len(self._dense_cache) > 65536:
                self._dense_cache.clear()
            dense_size = self._dense_cache[key] = int(
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
        profile = self._profile(info.hello.profile)
        skey = (None if profile is None else profile.name, size, dense_size)
        cached = self._spend_cache.get(skey)
        if cached is not None:
            return cached
        if len(self._spend_cache) > 65536:
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

    def _profile(self, name: str) -> CostProfile | None:
        if not name or self._profiles is None:
            return None
        if name not in self._profile_cache:
            try:
                self._profile_cache[name] = self._profiles(name)
            except Exception as exc:  # an unknown profile only loses the pricing
                self._log_once(f"profile:{name}", "cannot resolve cost profile %r: %s", name, exc)
                self._profile_cache[name] = None
        return self._profile_cache[name]

    def _cost(self, profile: CostProfile, size: int) -> tuple[float, int, float, float]:
        key = (profile.name, size)
        hit = self._price_cache.get(key)
        if hit is None:
            if len(self._price_cache) > 65536:
                self._price_cache.clear()
            mc = profile.message_cost(size)
            hit = self._price_cache[key] = (mc.bits, mc.packets, mc.airtime_s, mc.energy_j)
        return hit

    def state_controls(self) -> list[Outbound]:
        """The control message agents must see now (pause/stop), if any."""
        if self.state in ("paused", "finished"):
            cmd: Literal["pause", "stop"] = "pause" if self.state == "paused" else "stop"
            ctl = messages.Control(cmd=cmd, version=self.version, reason=self.finish_reason)
            return [Outbound(topics.control(self.config.job), messages.dump(ctl))]
        return []

    def _maybe_start(self, now: float) -> None:
        if self.state == "waiting" and len(self.agents) >= self.config.min_agents:
            self.state = "running"
            self._opened_at = now

    def _maybe_close(self, now: float) -> Effects:
        if self.state != "running" or not self._contrib:
            return _NOTHING
        cfg = self.config
        if cfg.mode == "async":
            if self._count >= cfg.async_apply_every:
                return self._close(now, "async")
            return _NOTHING
        live = {a for a, info in self.agents.items() if info.live}
        if live <= self._contrib.keys():
            return self._close(now, "all_reported")
        opened = self._opened_at if self._opened_at is not None else now
        if now >= opened + cfg.round_deadline_s and len(self._contrib) >= self.quorum(len(live)):
            return self._close(now, "deadline")
        return Effects()

    def _flush_pending(self) -> None:
        """Add the pending sparse updates to ``_acc``, in arrival order."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if len(pending) == 1:
            update, weight = pending[0]
            update.add_to(self._acc, weight)
            return
        updates = [u for u, _ in pending]
        idx = np.concatenate([u.indices for u in updates if u.indices is not None])
        # float16/32 -> float64 is exact, so promoting first changes no value
        vals = np.concatenate([u.values for u in updates]).astype(np.float64, copy=False)
        if any(w != 1.0 for _, w in pending):
            vals = vals * np.repeat([w for _, w in pending], [u.t for u in updates])
        np.add.at(self._acc, idx, vals)

    def _close(self, now: float, reason: str) -> Effects:
        cfg = self.config
        self._flush_pending()
        gamma = self.gamma()
        if self.family == "ef21":
            assert self.sum_h is not None
            n = len(self.agents)
            # async: only `count` of the n states are fresh; a full step per K updates
            # would re-apply stale states n/K times per refresh of all agents
            scale = 1.0 if cfg.mode == "sync" else min(1.0, self._count / n)
            x_new = self.x - (gamma * scale / n) * self.sum_h
        elif self._touched is not None:
            # x - c*0 == x exactly, so only the touched entries can change
            idx = _sorted_unique(self._touched)
            vals = self.x[idx] - (gamma / self._count) * self._acc[idx]
            x_new = self.x  # stepped in place below, once the step is known to be finite
        else:
            x_new = self.x - (gamma / self._count) * self._acc
        if self._touched is not None and self.family != "ef21":
            finite = bool(np.isfinite(vals).all())
            changed = idx[vals != self.x[idx]]
        else:
            finite = bool(np.isfinite(x_new).all())
            changed = np.flatnonzero(x_new != self.x)
        if not finite:
            self._finish("diverged: the step produced nan or inf (step size too large?)")
            self._reset_round(now)
            return Effects(outbound=tuple(self.state_controls()), changed=True)
        base = self.version
        if x_new is self.x:
            self.x[idx] = vals
        else:
            self.x = x_new
        self.version += 1
        self.rounds += 1
        self._evaluate()
        record = RoundRecord(
            version=self.version,
            base_version=base,
            opened_at=self._opened_at if self._opened_at is not None else now,
            closed_at=now,
            reason=reason,
            gamma=gamma,
            participants=tuple(sorted(self._contrib)),
            agents=self._round_agents,
            spend=self._round_spend,
            loss=self.loss,
            accuracy=self.accuracy,
        )
        self.last_record = record
        job = cfg.job
        delta = DeltaParts(job, cfg.d, base, self.version, changed, self.x[changed])
        out = [Outbound(topics.delta(job), delta=delta)]
        if cfg.snapshot_every and self.version % cfg.snapshot_every == 0:
            out.append(self.snapshot_message())
        self._reset_round(now, idx if self._touched is not None and self.family != "ef21" else None)
        self._prune_seen()
        if cfg.max_rounds is not None and self.version >= cfg.max_rounds:
            self._finish(f"reached max_rounds={cfg.max_rounds}")
        elif cfg.target_loss is not None and self.loss is not None and self.loss <= cfg.target_loss:
            self._finish(f"loss {self.loss:.6g} <= target_loss {cfg.target_loss:g}")
        out.extend(self.state_controls())
        return Effects(outbound=tuple(out), committed=record)

    def _reset_round(self, now: float, touched: npt.NDArray[np.int64] | None = None) -> None:
        """Open the next round. ``touched``: every index the closing round's accumulator
        touched, when the caller has it at hand (it is cheaper to zero at once)."""
        self._pending = []
        if self._touched is None:
            self._acc = np.zeros(self.config.d)
        elif touched is not None:
            self._acc[touched] = 0.0
        else:
            for part in self._touched:
                self._acc[part] = 0.0
        self._touched = []
        self._contrib = {}
        self._count = 0
        self._round_agents = {}
        self._round_spend = Spend()
        self._opened_at = now

    def _prune_seen(self) -> None:
        self._seen.prune(self.version - self.config.dedupe_window)

    def _finish(self, reason: str) -> None:
        self.state = "finished"
        self.finish_reason = reason
        log.info("job %s finished at version %d: %s", self.config.job, self.version, reason)

    def _evaluate(self) -> None:
        if self._evaluator is None:
            return
        try:
            loss, accuracy = self._evaluator(self.x)
        except Exception as exc:
            self._log_once("evaluator", "evaluation failed: %s", exc)
            return
        self.loss = float(loss)
        self.accuracy = None if accuracy is None else float(accuracy)

    def _reject(self, reason: str, detail: str, agent: str | None) -> Effects:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        if agent is not None and agent in self.agents:
            self.agents[agent].rejected += 1
        self._log_once(
            reason,
            "rejected a message: %s%s (logged once per reason)",
            reason,
            f" ({detail})" if detail else "",
        )
        return Effects(reason=reason)

    def _log_once(self, key: str, fmt: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(fmt, *args)

    # ------------------------------------------------------------------ persistence

    def export(self) -> EngineSnapshot:
        """A deep copy of the whole state (for a checkpoint)."""
        names = list(self.agents)
        self._prune_seen()
        self._flush_pending()
        seen = self._seen.rows()
        h_agents = tuple(self.h)
        d = self.config.d
        h = np.stack([self.h[a] for a in h_agents]) if h_agents else np.zeros((0, d))
        meta = {
            "format": _STATE_FORMAT,
            "job": self.config.job,
            "d": d,
            "model": self.config.model,
            "version": self.version,
            "state": self.state,
            "resume_to": self._resume_to,
            "finish_reason": self.finish_reason,
            "family": self.family,
            "agents": [self.agents[a].to_dict() for a in names],
            "accepted": self.accepted,
            "rejected": dict(self.rejected),
            "rounds": self.rounds,
            "totals": self.totals.to_dict(),
            "last_record": None if self.last_record is None else self.last_record.to_dict(),
            "loss": self.loss,
            "accuracy": self.accuracy,
            "round": {
                "contrib": dict(self._contrib),
                "count": self._count,
                "agents": {k: dict(v) for k, v in self._round_agents.items()},
                "spend": self._round_spend.to_dict(),
                "opened_at": self._opened_at,
            },
        }
        json.dumps(meta)  # fail here, not in the writer, if something is not JSON-able
        return EngineSnapshot(
            x=self.x.copy(),
            acc=self._acc.copy(),
            h_agents=h_agents,
            h=h,
            sum_h=np.zeros(0) if self.sum_h is None else self.sum_h.copy(),
            seen=seen,
            meta=meta,
        )

    @classmethod
    def restore(
        cls,
        config: EngineConfig,
        snap: EngineSnapshot,
        *,
        evaluator: Evaluator | None = None,
        profiles: ProfileLookup | None = None,
    ) -> RoundEngine:
        """Rebuild an engine from :meth:`export`; raises ValueError if it does not fit ``config``."""
        meta = snap.meta
        d = config.d
        if meta.get("format") != _STATE_FORMAT:
            raise ValueError(f"state format {meta.get('format')!r}, expected {_STATE_FORMAT}")
        if meta["job"] != config.job or meta["d"] != d or meta["model"] != config.model:
            raise ValueError(
                f"checkpoint is for job={meta['job']!r} d={meta['d']} model={meta['model']!r}; "
                f"configured job={config.job!r} d={d} model={config.model!r} "
                "(use another data_dir or fix AGG_JOB / AGG_D / AGG_MODEL)"
            )
        shapes_ok = (
            snap.x.shape == (d,)
            and snap.acc.shape == (d,)
            and snap.h.shape == (len(snap.h_agents), d)
            and snap.sum_h.shape in ((d,), (0,))
            and snap.seen.ndim == 2
            and snap.seen.shape[1] == 3
        )
        if not shapes_ok:
            raise ValueError("checkpoint arrays have inconsistent shapes")
        for arr in (snap.x, snap.acc, snap.h, snap.sum_h):
            if not np.isfinite(arr).all():
                raise ValueError("checkpoint arrays contain nan or inf")
        eng = cls(config, x0=snap.x, evaluator=None, profiles=profiles)
        eng._evaluator = evaluator
        eng.version = int(meta["version"])
        eng.state = meta["state"]
        eng._resume_to = meta["resume_to"]
        eng.finish_reason = meta["finish_reason"]
        eng.family = meta["family"]
        agent_list = [AgentInfo.from_dict(a) for a in meta["agents"]]
        eng.agents = {a.agent: a for a in agent_list}
        eng._agent_index = {a.agent: i for i, a in enumerate(agent_list)}
        eng.accepted = int(meta["accepted"])
        eng.rejected = {**dict.fromkeys(REJECT_REASONS, 0), **meta["rejected"]}
        eng.rounds = int(meta["rounds"])
        eng.totals = Spend.from_dict(meta["totals"])
        rec = meta["last_record"]
        eng.last_record = None if rec is None else RoundRecord.from_dict(rec)
        eng.loss = meta["loss"]
        eng.accuracy = meta["accuracy"]
        rnd = meta["round"]
        eng._acc = snap.acc.astype(np.float64, copy=True)
        eng._touched = None  # which entries the open round touched is not in the checkpoint
        eng._contrib = {str(k): int(v) for k, v in rnd["contrib"].items()}
        eng._count = int(rnd["count"])
        eng._round_agents = {k: _agent_round(v) for k, v in rnd["agents"].items()}
        eng._round_spend = Spend.from_dict(rnd["spend"])
        eng._opened_at = rnd["opened_at"]
        eng.h = {a: snap.h[i].astype(np.float64, copy=True) for i, a in enumerate(snap.h_agents)}
        eng.sum_h = snap.sum_h.astype(np.float64, copy=True) if snap.sum_h.size else None
        for ai, r, s in snap.seen.tolist():
            eng._seen.add(agent_list[ai].agent, ai, r, s)
        eng._prune_seen()
        return eng


def replay(engine: RoundEngine, items: Iterable[tuple[str, bytes, float]]) -> list[Effects]:
    """Feed journaled ``(topic, payload, now)`` messages back into ``engine`` (after a restore)."""
    return [engine.handle(topic, payload, now) for topic, payload, now in items]
