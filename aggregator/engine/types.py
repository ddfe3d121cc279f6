"""The round engine's interface types: its configuration (:class:`EngineConfig`), what a
call returns (:class:`Effects`), its view of an agent (:class:`AgentInfo`) and the state a
checkpoint holds (:class:`EngineSnapshot`). The engine itself is
:class:`aggregator.engine.rounds.RoundEngine`, which re-exports these names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from aggregator.engine.accounting import RoundRecord, Spend
from aggregator.engine.admission import Limits, MacPolicy
from aggregator.engine.downlink.broadcast import DOWNLINK_MODES, DownlinkMode
from aggregator.engine.downlink.outbound import Outbound
from aggregator.engine.robust_round import Aggregation
from edge_agent.links.cost import ZERO, Cost
from edge_agent.numerics.local import LocalConfig
from edge_agent.protocol import messages, topics
from edge_agent.protocol.jobinfo import FEEDBACK_SETTINGS, FeedbackSetting

FloatArray = npt.NDArray[np.float64]
Mode = Literal["sync", "async"]
EngineStateName = Literal["waiting", "running", "paused", "finished"]
#: ``evaluator(x) -> (loss, accuracy or None)``
Evaluator = Callable[[FloatArray], tuple[float, float | None]]

#: the version of :attr:`EngineSnapshot.meta`'s layout
STATE_FORMAT: Final = 1


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """What the engine needs to know; built from :class:`aggregator.service.settings.Settings`.

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
    #: gamma <= 1/(L (1 + sqrt(beta/theta))), far below 1/L when T << d, so 1/(2L) is the
    #: practical default (at 1/L the paper preset diverged on one profile); see
    #: docs/algorithm.md.
    ef21_step_factor: float = 0.5
    #: how agents follow the model: ``exact`` replicated steps, ``delta`` (float64 new
    #: values), ``cat`` a compressed broadcast with error feedback (aggregator.engine.downlink.broadcast)
    downlink: DownlinkMode = "exact"
    #: versions of steps kept to catch up an agent that missed some
    downlink_window: int = 64
    #: space the versions so that no live agent receives more than its profile's downlink
    #: part allows: its network's downlinks per day and its sender's duty cycle
    #: (aggregator.engine.downlink.broadcast.downlink_interval_s)
    downlink_pacing: bool = False
    #: with ``downlink_pacing``: a round that could close waits at most this many seconds
    #: for busy downlinks, then closes without the agents whose links hold it (they catch
    #: up when their links are free: aggregator.engine.downlink.pacing). None: no bound
    max_hold_s: float | None = None
    #: bounds on what agents claim (hello fields, update magnitude): aggregator.engine.admission
    limits: Limits = field(default_factory=Limits)
    #: which updates must carry a valid MAC (per-agent keys; docs/wire-format.md 3.3)
    mac: MacPolicy = field(default_factory=MacPolicy)
    #: how L is formed from the hellos' L_i without a configured step: the row-weighted
    #: ``mean`` (trusts every claim) or a ``median`` one liar cannot move (aggregator.engine.stepsize)
    step_rule: Literal["mean", "median"] = "mean"
    #: how a round's updates are combined: the plain mean, or a robust rule for untrusted
    #: fleets (aggregator.engine.robust_round; not EF21)
    aggregation: Aggregation = field(default_factory=Aggregation)
    #: K: a sync round counts agents with an accepted update in the last K versions, and
    #: waits for agents that joined in the last K versions (aggregator.engine.registry)
    participation_window: int = 10
    #: sync EF21 jobs: a round does not wait for a member whose duty cycle keeps its radio
    #: silent (its h_i keeps counting), unless its last update is ``cadence_max_lag``
    #: versions old or more (aggregator.engine.cadence)
    cadence: bool = False
    cadence_max_lag: int = 16
    #: registered agents at most; a hello from one more is refused ``too_many_agents``
    max_agents: int = 1000
    #: an agent with no accepted update is forgotten (its slot freed) this many seconds
    #: after its first hello (aggregator.engine.registry); None: never
    unproven_ttl_s: float | None = None
    #: the update family the job runs: ``ef21``, or ``none``/``ef``/``dir`` (family *mean*,
    #: they may share a job); a hello of the other family is refused ``wrong_semantics``.
    #: ``any``: the first accepted hello fixes it (the library default; the service's
    #: ``AGG_FEEDBACK`` defaults to ``ef21``, the agent's default)
    feedback: FeedbackSetting = "any"
    #: stochastic jobs: the step decays as min(gamma, 2 / (schedule_l2 (t + schedule_t0)))
    #: at version t (aggregator.engine.stepsize.scheduled); schedule_l2 is the objective's
    #: strong-convexity constant (the model's l2). None: the constant step.
    schedule_l2: float | None = None
    schedule_t0: float = 0.0
    #: the minibatch an agent of this job must use: rows (an integer) or a fraction of its
    #: shard; None: any (full gradients included). A hello claiming another is refused.
    batch_size: float | None = None
    #: local training (feedback ``local``): H, the damping and the step factor of LoCoDL
    #: (edge_agent.numerics.local); None for every other job
    local: LocalConfig | None = None

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
            (self.downlink in DOWNLINK_MODES, "downlink must be exact, delta, cat or auto"),
            (self.downlink_window >= 1, "downlink_window must be >= 1"),
            (self.max_hold_s is None or self.max_hold_s >= 0, "max_hold_s must be >= 0"),
            (self.step_rule in ("mean", "median"), "step_rule must be mean or median"),
            (self.participation_window >= 1, "participation_window must be >= 1"),
            (self.max_agents >= 1, "max_agents must be >= 1"),
            (self.cadence_max_lag >= 1, "cadence_max_lag must be >= 1"),
            (self.unproven_ttl_s is None or self.unproven_ttl_s > 0, "unproven_ttl_s must be > 0"),
            (self.schedule_l2 is None or self.schedule_l2 > 0, "schedule_l2 must be > 0"),
            (self.schedule_t0 >= 0, "schedule_t0 must be >= 0"),
            (self.batch_size is None or self.batch_size > 0, "batch_size must be > 0"),
            (
                self.feedback in FEEDBACK_SETTINGS,
                "feedback must be none, ef, ef21, dir, local or any",
            ),
            (
                (self.feedback == "local") == (self.local is not None),
                "feedback 'local' and a local-training configuration go together",
            ),
            (
                self.local is None or self.mode == "sync",
                "local training runs sync rounds",
            ),
            (
                self.local is None or self.local.method == "locodl",
                "local training in the service runs LoCoDL",
            ),
            (
                self.dedupe_window >= max(1, self.max_staleness),
                "dedupe_window must be >= max_staleness",
            ),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"EngineConfig: {msg}")

    @property
    def local_schedule(self) -> tuple[int | None, float | None]:
        """The local-training schedule ``(local_steps, comm_prob)`` the job announces and
        every hello must say (:attr:`LocalConfig.schedule`); ``(None, None)`` without."""
        return (None, None) if self.local is None else self.local.schedule

    @property
    def participation_span(self) -> int:
        """Versions a member counts as taking part after its last update (a local-training
        member: communications it may miss in a row): ``participation_window``, or with
        cadence in sync mode ``max(window, cadence_max_lag + 1)``, so that the lag bound
        bites before a silent member stops counting (aggregator.engine.cadence)."""
        if self.cadence and self.mode == "sync":
            return max(self.participation_window, self.cadence_max_lag + 1)
        return self.participation_window


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
    #: everything broadcast to it while it was live, priced on its profile's downlink part
    down: Cost = ZERO
    #: every message it sent that reached the engine once it was known (hellos, status,
    #: requests, refused and duplicate updates too, not those refused ``bad_mac``: not
    #: provably its), priced on its profile's uplink; ``spend`` is the accepted updates only
    sent: Cost = ZERO
    #: EF21: its state h_i was dropped; its updates are refused until a fresh hello
    needs_reset: bool = False
    #: signed messages (docs/wire-format.md 11.1): the last accepted ``ctr``, the counter
    #: of the ``offline`` status its MQTT Last Will carries (accepted once: then
    #: ``will_spent``), and the seq below which its updates are refused ``replayed``
    ctr: int | None = None
    will_ctr: int | None = None
    will_spent: int | None = None
    seq_floor: int = 0

    def to_dict(self) -> dict[str, Any]:
        # not asdict(): it deep-copies the (immutable) hello on every call
        out = dict(vars(self))
        out["hello"] = self.hello.to_dict()
        out["spend"] = self.spend.to_dict()
        out["down"] = self.down.to_dict()
        out["sent"] = self.sent.to_dict()
        return out

    def copy(self) -> AgentInfo:
        """An independent copy (the hello is immutable and shared)."""
        return replace(self, spend=replace(self.spend))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentInfo:
        fields = dict(data)
        fields["hello"] = messages.Hello.from_dict(data["hello"])
        fields["spend"] = Spend.from_dict(data["spend"])
        fields["down"] = Cost.from_dict(data.get("down"))
        fields["sent"] = Cost.from_dict(data.get("sent"))
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

    def check(self, config: EngineConfig) -> None:
        """Raise ValueError unless this is a snapshot of ``config``'s job with sound arrays."""
        meta = self.meta
        d = config.d
        if meta.get("format") != STATE_FORMAT:
            raise ValueError(f"state format {meta.get('format')!r}, expected {STATE_FORMAT}")
        if meta["job"] != config.job or meta["d"] != d or meta["model"] != config.model:
            raise ValueError(
                f"checkpoint is for job={meta['job']!r} d={meta['d']} model={meta['model']!r}; "
                f"configured job={config.job!r} d={d} model={config.model!r} "
                "(use another data_dir or fix AGG_JOB / AGG_D / AGG_MODEL)"
            )
        shapes_ok = (
            self.x.shape == (d,)
            and self.acc.shape == (d,)
            and self.h.shape == (len(self.h_agents), d)
            and self.sum_h.shape in ((d,), (0,))
            and self.seen.ndim == 2
            and self.seen.shape[1] == 3
        )
        if not shapes_ok:
            raise ValueError("checkpoint arrays have inconsistent shapes")
        for arr in (self.x, self.acc, self.h, self.sum_h):
            if not np.isfinite(arr).all():
                raise ValueError("checkpoint arrays contain nan or inf")
