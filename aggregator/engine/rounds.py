"""The round engine: quorum, model stepping and EF21 state for one job.

:class:`RoundEngine` is *pure*: no I/O, no threads, no clock reads (every entry point takes
``now``, seconds on any clock that survives restarts, e.g. ``time.time()``). The service
(:mod:`aggregator.service.ingest`) and the simulator drive the same class; the service
persists what the engine returns *before* it publishes anything (see :class:`Effects`). It
composes the parts of :mod:`aggregator.engine` (admission, de-duplication, accounting, the
downlink, outbound messages, types) and :mod:`edge_agent.numerics.aggregation`.

An update is validated (it fits the job and its sender's hello), admitted (duplicate,
stale, paused? does it enter this round's step?), then recorded. The step rules (``gamma``,
the mean and EF21 steps, sync and async modes, quorum and deadline) are in
docs/algorithm.md; the path of one round through these modules in docs/architecture.md.
Every new version is broadcast by :class:`aggregator.engine.broadcast.Broadcast` (replicated
steps, a delta, or a compressed model change) so agents hold the model the aggregator
serves; the job stops at ``max_rounds`` or ``target_loss``. Bad messages are counted by
reason (:data:`REJECT_REASONS`), logged once per reason and dropped:
:meth:`RoundEngine.handle` never raises and validates fully before it changes anything.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final, Literal, NamedTuple

import numpy as np

from aggregator.engine import admission, participation, presence, safety, stepsize, traffic
from aggregator.engine import state as engine_state
from aggregator.engine.accounting import Pricer, ProfileLookup, RoundCosts, RoundRecord, Spend
from aggregator.engine.admission import REJECT_REASONS, Decoded, Family, Reject, semantics_family
from aggregator.engine.broadcast import Broadcast
from aggregator.engine.dedupe import SeenKeys
from aggregator.engine.guard import UpdateGuard
from aggregator.engine.outbound import Outbound, addressed, control_message
from aggregator.engine.refusals import Refusals, job_info
from aggregator.engine.robust_round import accumulator, downlink, restored
from aggregator.engine.types import (
    AgentInfo,
    Effects,
    EngineConfig,
    EngineSnapshot,
    EngineStateName,
    Evaluator,
    FloatArray,
)
from edge_agent.links.cost import ZERO
from edge_agent.numerics.aggregation import EF21Mirror, StepResult
from edge_agent.numerics.compressors import Update
from edge_agent.protocol import messages, wire

__all__ = [
    "REJECT_REASONS",
    "AgentInfo",
    "Decoded",
    "Effects",
    "EngineConfig",
    "EngineSnapshot",
    "Evaluator",
    "FloatArray",
    "RoundEngine",
]

log = logging.getLogger("aggregator.engine.rounds")

#: shared, immutable results of the common cases (no allocation per message)
_NOTHING: Final = Effects()
_JOURNAL_ONLY: Final = Effects(journal=True)


class _Admission(NamedTuple):
    """An admitted update: does it enter this round's step, and with what weight."""

    contributes: bool
    weight: float


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
        self._ef21 = EF21Mirror(d)
        self._seen = SeenKeys()
        self._agent_index: dict[str, int] = {}  # position in self.agents
        self.accepted = 0
        self.rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        self.rounds = 0
        self.totals = Spend()
        self.totals_down = ZERO  # what the agents received, summed over agents
        #: downlink pacing: no version closes before this time (every link is free again)
        self.next_version_at = 0.0
        self._down_free_at: dict[str, float] = {}  # per agent: its downlink is free again
        self.last_record: RoundRecord | None = None
        self.loss: float | None = None
        self.accuracy: float | None = None
        # the open round
        self._mean = accumulator(config)  # mean, or a robust rule (aggregator.engine.robust_round)
        self._gamma: float | None = None  # cached step size (hellos change it)
        self._guard = UpdateGuard(config.limits)
        self._contrib: dict[str, int] = {}  # participant -> number of contributing updates
        self._count = 0  # contributing updates (the async K counter)
        self._round_costs = RoundCosts()
        self._opened_at: float | None = None
        self._evaluator = evaluator
        self._pricer = Pricer(profiles)
        self._logged: set[str] = set()
        self.refusals = Refusals(config.job, announce=job_info(config))  # rate-limited
        self._topics = admission.TopicParser(config.job)
        self._down = Broadcast(config.job, d, downlink(config), window=config.downlink_window)
        self.traffic = traffic.Traffic(config.job, self._pricer)  # answers, per-agent accounts
        self._evaluate()

    # ------------------------------------------------------------------ public API

    @property
    def h(self) -> dict[str, FloatArray]:
        """EF21: each agent's state h_i (live view of the mirror)."""
        return self._ef21.h

    @property
    def sum_h(self) -> FloatArray | None:
        """EF21: the sum of every h_i (None before the first change arrived)."""
        return self._ef21.sum_h

    def handle(
        self, topic: str, payload: bytes, now: float, *, decoded: Decoded | None = None
    ) -> Effects:
        """Process one inbound message (any agent topic of this job). Never raises.

        ``decoded``: what :func:`edge_agent.protocol.wire.decode` returns (or raises) for ``payload``
        when the caller already decoded it (the service decodes a batch of updates at once
        with :func:`edge_agent.protocol.wire.decode_many`); used only for an update topic.
        """
        agent: str | None = None
        kind = ""
        try:
            agent, kind = self._topics.parse(topic)
            blob = admission.check_payload(payload)
            if kind == "update":
                return self._on_update(agent, blob, now, decoded)
            if kind == "hello":
                return self._on_hello(agent, blob, now)
            if kind == "status":
                return self._on_status(agent, blob, now)
            if kind == "request":
                return self._on_request(agent, blob, now)
            raise Reject("unexpected_topic", topic[:80])  # cat/<job>/to/<agent>: ours
        except Reject as rej:
            told = now if kind in ("hello", "update") else None  # refusals answer these only
            return self._reject(rej.reason, rej.detail, agent, told)
        except Exception as exc:  # a bug must not kill the ingest loop
            log.exception("internal error handling %s", topic[:80])
            return self._reject("internal_error", f"{type(exc).__name__}: {exc}", agent)
        finally:  # what a known agent's radio spent, whatever became of the message
            if agent is not None:
                self.traffic.sent(self.agents.get(agent), len(payload))

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
            # a job an older version finished as diverged kept its last finite model
            if cmd != "resume" or not self.finish_reason.startswith("diverged"):
                return Effects()
            self.state, self._resume_to, self.finish_reason = "paused", "running", ""
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
        reason = self.finish_reason if cmd == "stop" else ""
        out = [control_message(job, messages.Control(cmd=cmd, version=self.version, reason=reason))]
        more = self._maybe_close(now) if cmd == "resume" else Effects()
        return Effects(outbound=(*out, *more.outbound), committed=more.committed, changed=True)

    def resync_message(self) -> Outbound:
        """Control ``resync``: the aggregator (re)started at this version."""
        ctl = messages.Control(cmd="resync", version=self.version, reason="aggregator started")
        return control_message(self.config.job, ctl)

    def snapshot_message(self) -> Outbound:
        """The model agents hold (and for EF21 jobs replicated exactly, the aggregate h
        their steps need) as a retained state snapshot on ``cat/<job>/model``."""
        return self._down.snapshot(self.x, self.version, self.sum_h, self.family)

    def charge_downlink(
        self, outbound: Sequence[traffic.Published], now: float | None = None
    ) -> None:
        """Account what agents receive and count what is published, by kind: the caller
        passes exactly what it publishes (after merging), and the time it does. A job-wide
        message costs every live agent, one addressed to an agent (``target``) that agent
        only (:func:`aggregator.engine.traffic.charge_downlink`; pacing there)."""
        self.traffic.count(outbound)
        traffic.charge_downlink(self, outbound, now)

    @property
    def broadcast_model(self) -> FloatArray:
        """The model the agents hold: ``x``, or the compressed downlink's ``w``."""
        return self._down.model(self.x)

    def _answer(
        self, agent: str, have: int | None, now: float, controls: bool = True
    ) -> tuple[Outbound, ...]:
        """What ``agent`` (holding version ``have``) misses, on its own topic: merged steps,
        else a snapshot (rate-limited, :mod:`aggregator.engine.traffic`); with ``controls``, the
        pause/stop it must see."""
        steps = self._down.catch_up(have, self.version)
        extra = self.state_controls(settings=False) if controls else ()
        return self.traffic.answer(agent, steps, self.snapshot_message, now, extra)

    @property
    def live_agents(self) -> int:
        return sum(1 for a in self.agents.values() if a.live)

    def gamma(self) -> float:
        """The step size: configured, else 1/L with L from the hellos' L_i under
        ``step_rule`` (:mod:`aggregator.engine.stepsize`; times ``ef21_step_factor`` in an EF21
        job). A job with ``dir`` agents steps exactly 1/L: they are family *mean* (factor
        1), and admission refuses them when a step size is configured."""
        cfg = self.config
        if cfg.step_size is not None:
            return cfg.step_size
        if self._gamma is None:  # cached until the next hello
            factor = cfg.ef21_step_factor if self.family == "ef21" else 1.0
            hellos = [a.hello for a in self.agents.values()]
            self._gamma = stepsize.gamma(hellos, cfg.step_rule, cfg.limits, factor)
        return self._gamma

    def counted(self) -> participation.Participation:
        """Who the open sync round counts (:mod:`aggregator.engine.participation`)."""
        window = self.config.participation_window
        return participation.participation(self.agents.values(), self.version, window)

    def quorum(self, base: int | None = None) -> int:
        """Contributions a sync round needs at its deadline: a fraction of the agents that
        take part (:mod:`aggregator.engine.participation`), at least ``quorum_min_agents``."""
        n = self.counted().quorum_base if base is None else base
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
        hello = admission.check_hello(
            blob,
            agent=agent,
            job=cfg.job,
            d=cfg.d,
            model=cfg.model,
            family=self.family,
            alone=all(a == agent for a in self.agents),
            fixed_step=cfg.step_size is not None,
            limits=cfg.limits,
            feedback=cfg.feedback,
        )
        fam = semantics_family(hello.semantics)
        self.refusals.refused_agents.forget(agent)
        # --- apply
        self._gamma = None  # a hello may change L (rows, smoothness) or the family
        info = self.agents.get(agent)
        if info is None:
            admission.check_capacity(agent, len(self.agents), cfg.max_agents)
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
        info.live, info.state = True, "online"
        if self.family != fam:
            if self.family is not None:
                self._reset_agent_state(agent)  # the only agent switched semantics
            self.family = fam
        out: list[Outbound] = []
        if hello.version is not None and hello.version != self.version:
            out.extend(self._answer(agent, hello.version, now, controls=False))
        out.extend(self.traffic.to(agent, self.state_controls()))
        if info.needs_reset:
            out.append(self._reset_message(agent))
        if self.state == "waiting":
            self._maybe_start(now)
        return Effects(outbound=tuple(out), journal=True)

    def _on_status(self, agent: str, blob: bytes, now: float) -> Effects:
        status = admission.check_status(blob, agent=agent)
        info = self.agents.get(agent)
        if info is None:
            raise Reject("unknown_agent", agent)
        changed = presence.apply_status(info, status.state, now, self.config.liveness_timeout_s)
        return _JOURNAL_ONLY if changed else _NOTHING  # a repeat is not journalled

    def _on_request(self, agent: str, blob: bytes, now: float) -> Effects:
        have = admission.check_request(blob).have
        info = self.agents.get(agent)
        if info is not None:
            info.last_seen = max(info.last_seen, now)
            info.live = True
            info.state = "online"
        return Effects(outbound=self._answer(agent, have, now))

    def _on_update(self, agent: str, blob: bytes, now: float, decoded: Decoded | None) -> Effects:
        header, update, info = self._validate_update(agent, blob, decoded)
        admitted = self._admit(agent, info, header, now)
        if isinstance(admitted, Effects):
            return admitted
        sized = safety.guarded(self, agent, info, update, admitted.weight)
        if isinstance(sized, Effects):
            return sized
        self._record(agent, info, header, update, blob, now, admitted)
        self._guard.accepted(*sized, ef21=update.semantics == "ef21", weight=admitted.weight)
        if self._opened_at is None and self.state != "waiting":
            self._opened_at = now
        closed = self._maybe_close(now)
        if closed is _NOTHING:
            return _JOURNAL_ONLY
        return replace(closed, journal=True)

    def _validate_update(
        self, agent: str, blob: bytes, decoded: Decoded | None
    ) -> tuple[wire.UpdateHeader, Update, AgentInfo]:
        """Decode the update and check it fits the job and the agent's hello (or reject)."""
        info = self.agents.get(agent)
        header, update = admission.check_update(
            blob,
            decoded,
            agent=agent,
            job=self.config.job,
            d=self.config.d,
            hello=None if info is None else info.hello,
            mac=self.config.mac,
        )
        assert info is not None  # check_update rejects an agent without a hello
        return header, update, info

    def _admit(
        self, agent: str, info: AgentInfo, header: wire.UpdateHeader, now: float
    ) -> _Admission | Effects:
        """Whether a valid update is applied, and whether it enters this round's step.

        Returns Effects (nothing applied) when the update is refused with an answer to the
        agent; raises Reject when it is refused silently."""
        cfg = self.config
        if self._seen.contains(agent, header.round, header.seq):
            return self._duplicate(agent, header, now)
        if self.state == "finished":
            raise Reject("finished")
        if header.round > self.version:
            raise Reject(
                "future_version", f"{agent}: round {header.round} > version {self.version}"
            )
        staleness = self.version - header.round
        ef21 = header.semantics == "ef21"
        if ef21 and (info.needs_reset or staleness > cfg.dedupe_window):
            return self._ef21_reset(agent, info, staleness)
        if staleness > cfg.dedupe_window:
            raise Reject("stale", f"{agent}: {staleness} versions old (beyond the dedupe window)")
        contributes = self._contributes(agent, header.round, staleness, ef21)
        if not ef21 and not contributes:
            if self.state == "paused":
                raise Reject("paused", f"{agent}: round {header.round}")
            # The round closed without this agent (deadline + quorum) and it may have missed
            # the delta: answer with the model, or it would re-send this update forever.
            eff = self._reject("stale", f"{agent}: round {header.round}", agent)
            out = self._answer(agent, header.round, now, controls=False)
            return Effects(outbound=out, reason=eff.reason)
        weight = 1.0 if cfg.mode == "sync" else 1.0 / (1.0 + staleness)
        return _Admission(contributes, weight)

    def _duplicate(self, agent: str, header: wire.UpdateHeader, now: float) -> Effects:
        """An update whose (round, seq) key was applied already."""
        detail = f"{agent} round {header.round} seq {header.seq}"
        if header.round < self.version:
            # A re-send of an update already applied to an older version: the agent
            # never saw the versions since (e.g. a restart recovered a version that was
            # persisted but not yet published, and ZeroMQ dropped the start-up snapshot
            # before the agent re-subscribed). Without the model it would re-send forever.
            eff = self._reject("duplicate", detail, agent)
            return Effects(outbound=self._answer(agent, header.round, now), reason=eff.reason)
        raise Reject("duplicate", detail)

    def _contributes(self, agent: str, round: int, staleness: int, ef21: bool) -> bool:
        """Whether an admissible update enters the open round's step (else: EF21 state
        only, or a refusal for the mean family)."""
        cfg = self.config
        contributes = self.state != "paused"
        if cfg.mode != "sync":
            return contributes and staleness <= cfg.max_staleness
        contributes = contributes and staleness == 0
        if agent in self._contrib and staleness == 0:
            if not ef21:
                raise Reject("duplicate", f"{agent} already reported for round {round}")
            contributes = False  # a second EF21 change for the same round: state only
        return contributes

    def _record(
        self,
        agent: str,
        info: AgentInfo,
        header: wire.UpdateHeader,
        update: Update,
        blob: bytes,
        now: float,
        admitted: _Admission,
    ) -> None:
        """Apply an admitted update: keys, agent and cost accounting, aggregation state."""
        size = len(blob)
        spend = self._pricer.price(info.hello.profile, header, size)
        # nothing below can fail on a validated update
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
        self._round_costs.add(agent, header.t, spend)
        ef21 = header.semantics == "ef21"
        if ef21:
            self._ef21.apply(agent, update)
            self._down.add(blob, header.t, 1.0)
        if admitted.contributes:
            self._contrib[agent] = self._contrib.get(agent, 0) + 1
            self._count += 1
            if not ef21:
                self._mean.add(update, admitted.weight)
                self._down.add(blob, header.t, admitted.weight)

    # ------------------------------------------------------------------ internals

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
        return addressed(control_message(self.config.job, ctl), self.config.job, agent)

    def _reset_agent_state(self, agent: str) -> None:
        h = self._ef21.h.get(agent)
        self._ef21.reset_agent(agent)
        if h is not None:
            self._guard.state_dropped(h)
            self._down.drop_state(h, none_left=not self._ef21.h)
        self._seen.forget(agent, self._agent_index[agent])

    def state_controls(self, *, settings: bool = True) -> list[Outbound]:
        """What agents must see now: the job's settings (start, hello) and pause/stop, if any."""
        out = [self.refusals.announce] if settings and self.refusals.announce else []
        if self.state in ("paused", "finished"):
            cmd: Literal["pause", "stop"] = "pause" if self.state == "paused" else "stop"
            ctl = messages.Control(cmd=cmd, version=self.version, reason=self.finish_reason)
            out.append(control_message(self.config.job, ctl))
        return out

    def _maybe_start(self, now: float) -> None:
        if self.state == "waiting" and len(self.agents) >= self.config.min_agents:
            self.state = "running"
            self._opened_at = now

    def _maybe_close(self, now: float) -> Effects:
        if self.state != "running" or not self._contrib or now < self.next_version_at:
            return _NOTHING
        cfg = self.config
        if cfg.mode == "async":
            if self._count >= cfg.async_apply_every:
                return self._close(now, "async")
            return _NOTHING
        counted = self.counted()
        if counted.awaited <= self._contrib.keys():
            return self._close(now, "all_reported")
        opened = self._opened_at if self._opened_at is not None else now
        quorum = self.quorum(counted.quorum_base)
        if now >= opened + cfg.round_deadline_s and len(self._contrib) >= quorum:
            return self._close(now, "deadline")
        return Effects()

    def _step(self, gamma: float) -> tuple[StepResult, float]:
        """Step ``self.x`` in place with the open round's state (see the module doc);
        returns what the step did and its coefficient (replicas step with the same one)."""
        if self.family == "ef21":
            n = len(self.agents)
            # async: only `count` of the n states are fresh; a full step per K updates
            # would re-apply stale states n/K times per refresh of all agents
            scale = 1.0 if self.config.mode == "sync" else min(1.0, self._count / n)
            coef = gamma * scale / n
            return self._ef21.step(self.x, coef), coef
        coef = gamma / self._count
        return self._mean.step(self.x, coef), coef

    def _close(self, now: float, reason: str) -> Effects:
        cfg = self.config
        gamma = self.gamma()
        step, coef = self._step(gamma)
        if not step.finite:
            return safety.drop_round(self, now)
        self._guard.stepped(self.x, step.changed)
        base = self.version
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
            agents=self._round_costs.agents,
            spend=self._round_costs.spend,
            loss=self.loss,
            accuracy=self.accuracy,
        )
        self.last_record = record
        sent = self._down.close(
            x=self.x,
            changed=step.changed,
            base=base,
            version=self.version,
            family=self.family or "mean",
            coef=coef,
            prices=self._pricer.down_prices(a.hello.profile for a in self.agents.values()),
            aggregate=self.sum_h,
        )
        out = [sent or self.snapshot_message()]
        if sent is not None and cfg.snapshot_every and self.version % cfg.snapshot_every == 0:
            out.append(self.snapshot_message())
        self._reset_round(now)
        self._prune_seen()
        if cfg.max_rounds is not None and self.version >= cfg.max_rounds:
            self._finish(f"reached max_rounds={cfg.max_rounds}")
        elif cfg.target_loss is not None and self.loss is not None and self.loss <= cfg.target_loss:
            self._finish(f"loss {self.loss:.6g} <= target_loss {cfg.target_loss:g}")
        out.extend(self.state_controls(settings=False))
        return Effects(outbound=tuple(out), committed=record)

    def _reset_round(self, now: float) -> None:
        """Open the next round (the closed round's record keeps its costs object)."""
        self._mean.reset()
        self._contrib = {}
        self._count = 0
        self._round_costs = RoundCosts()
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

    def _reject(
        self, reason: str, detail: str, agent: str | None, now: float | None = None
    ) -> Effects:
        """Count a rejection; with ``now`` (a hello or update from ``agent``), also tell the
        agent when the reason concerns it (:mod:`aggregator.engine.refusals`, rate-limited)."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        if agent is not None and agent in self.agents:
            self.agents[agent].rejected += 1
        self._log_once(
            reason,
            "rejected a message: %s%s (logged once per reason)",
            reason,
            f" ({detail})" if detail else "",
        )
        if agent is None or now is None:
            return Effects(reason=reason)
        told = self.refusals.answer(agent, reason, detail, now, self.version)
        return Effects(outbound=told, reason=reason)

    def _log_once(self, key: str, fmt: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(fmt, *args)

    # ------------------------------------------------------------------ persistence

    def export(self) -> EngineSnapshot:
        """A deep copy of the whole state (for a checkpoint)."""
        return engine_state.export_engine(self)

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
        eng = cls(config, x0=snap.x, evaluator=None, profiles=profiles)
        engine_state.restore_engine(eng, snap)
        eng._mean = restored(config, eng._mean)
        eng._evaluator = evaluator
        return eng
