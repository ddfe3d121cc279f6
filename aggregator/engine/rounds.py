"""The round engine of one job: the composition of its parts.

:class:`RoundEngine` is *pure*: no I/O, no threads, no clock reads (every entry point takes
``now``, seconds on any clock that survives restarts, e.g. ``time.time()``). The service
(:mod:`aggregator.service.ingest`) and the simulator drive the same class; the service
persists what the engine returns *before* it publishes anything (see :class:`Effects`).

It holds no state of its own. Each part owns its state, changes it through its own methods
and exports and restores it itself (a checkpoint is their composition); the engine hands
each input to the parts and applies what they decide: the :class:`~.lifecycle.Lifecycle`
and the :class:`~.accounting.Tally` (version, counters); the :class:`~.registry.AgentRegistry`
(records; it checks and applies hellos, status messages and requests); the
:class:`~.intake.UpdateIntake` (the de-duplication keys; its verdict on each update); the
:class:`~.model.JobModel` (``x``, the EF21 mirror, the guard, the broadcast); the
:class:`~.openround.OpenRound` and the :class:`~.closing.Closing` policy (who a round
counts, why it closes, the cadence); the :class:`~.downlink.pacing.DownlinkTraffic`
(answers, charges, pacing); the :class:`~.refusals.Refusals`. :class:`~.view.EngineView`
is what readers see. The step rules are in docs/algorithm.md, the path of one round
through these modules in docs/architecture.md. Bad messages are counted by reason
(:data:`REJECT_REASONS`), logged once per reason and dropped: :meth:`RoundEngine.handle`
never raises and validates fully before it changes anything.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from aggregator.engine import admission
from aggregator.engine.accounting import Pricer, ProfileLookup, Tally
from aggregator.engine.admission import REJECT_REASONS, Decoded, Reject
from aggregator.engine.closing import Closing
from aggregator.engine.downlink.outbound import Outbound, reset_message
from aggregator.engine.downlink.pacing import DownlinkTraffic, Published
from aggregator.engine.intake import Admit, Answer, Refresh, Rejoin, UpdateIntake
from aggregator.engine.lifecycle import ControlCmd, Lifecycle
from aggregator.engine.model import JobModel
from aggregator.engine.openround import OpenRound
from aggregator.engine.refusals import Refusals, job_info
from aggregator.engine.registry import AgentRegistry
from aggregator.engine.types import (
    STATE_FORMAT,
    AgentInfo,
    Effects,
    EngineConfig,
    EngineSnapshot,
    Evaluator,
    FloatArray,
)
from aggregator.engine.view import EngineView
from edge_agent.protocol.downlink import semantics_family

__all__ = ["REJECT_REASONS", "AgentInfo", "Decoded", "Effects", "EngineConfig",
           "EngineSnapshot", "Evaluator", "FloatArray", "RoundEngine"]  # fmt: skip

log = logging.getLogger("aggregator.engine.rounds")

#: shared, immutable results of the common cases (no allocation per message)
_NOTHING: Final = Effects()
_JOURNAL_ONLY: Final = Effects(journal=True)


class RoundEngine(EngineView):
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
        self._pricer = Pricer(profiles)
        #: x, the family, EF21 states, the guard, the broadcast (read it; it changes itself)
        self.model = JobModel(config, x0, self._pricer, evaluator)
        #: the model version, rounds committed, the last record, accepted updates, totals
        self.tally = Tally()
        self.lifecycle = Lifecycle(config.job)
        self.registry = AgentRegistry(
            liveness_timeout_s=config.liveness_timeout_s,
            max_agents=config.max_agents,
            window=config.participation_window,
            unproven_ttl_s=config.unproven_ttl_s,
        )
        #: the open round (read it only: its methods are for the engine)
        self.round_state = OpenRound(config.d, config.aggregation)
        #: who a round counts, why it closes, when the job is done (and the members' cadence)
        self.closing = Closing(config, self._pricer, registry=self.registry, round=self.round_state)
        #: rejections by reason, and what the refused agents are told (rate-limited)
        self.refusals = Refusals(config.job, announce=job_info(config))
        self._topics = admission.TopicParser(config.job)
        #: answers, downlink accounts and pacing, published counters
        self.traffic = DownlinkTraffic(config.job, self._pricer, pacing=config.downlink_pacing)
        #: the de-duplication keys and what becomes of each update (verdicts the engine applies)
        self.intake = UpdateIntake(config, model=self.model, registry=self.registry,
                                   round=self.round_state, traffic=self.traffic)  # fmt: skip
        self.model.evaluate()

    # ------------------------------------------------------------------ inputs

    def handle(
        self, topic: str, payload: bytes, now: float, *, decoded: Decoded | None = None
    ) -> Effects:
        """Process one inbound message (any agent topic of this job). Never raises.

        ``decoded``: what :func:`edge_agent.protocol.wire.decode` returns (or raises) for
        ``payload`` when the caller already decoded it (the service decodes a batch of
        updates at once with :func:`edge_agent.protocol.wire_many.decode_many`); used only
        for an update topic.
        """
        agent, kind, forged = None, "", False  # forged: not provably the agent's (bad_mac)
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
            forged = rej.reason == "bad_mac"
            told = now if kind in ("hello", "update") else None  # refusals answer these only
            return self._reject(rej.reason, rej.detail, agent, told)
        except Exception as exc:  # a bug must not kill the ingest loop
            log.exception("internal error handling %s", topic[:80])
            return self._reject("internal_error", f"{type(exc).__name__}: {exc}", agent)
        finally:  # what a known agent's radio spent, whatever became of the message
            info = None if agent is None else self.registry.get(agent)
            if info is not None and not forged:
                self.registry.add_sent(
                    agent, self._pricer.up_cost(info.hello.profile, len(payload))
                )

    def tick(self, now: float) -> Effects:
        """Advance time: mark silent agents dead, close a sync round at its deadline.

        ``journal`` is set when the tick changed anything, so a replay of the journal
        reproduces the state exactly (ticks that change nothing need not be stored).
        """
        changed = bool(self.registry.expire(now))
        changed = self.registry.forget_unproven(now, self.intake.renumber) or changed
        if self.state == "waiting":
            changed = self._maybe_start(now) or changed
        closed = self._maybe_close(now)
        if changed or closed.committed is not None or closed.changed or closed.journal:
            return replace(closed, journal=True)  # closing refuses nothing: no reason
        return closed

    def control(self, cmd: ControlCmd, now: float) -> Effects:
        """Operator command. Returns the control message to broadcast (``changed``: checkpoint)."""
        told = self.lifecycle.control(cmd, self.version)
        if told is None:
            return Effects()
        if cmd == "resume":
            self.round_state.restart_deadline(now)  # the deadline restarts after a pause
        settled = self.model.settle(self.version) if cmd == "stop" else None  # copies = x
        out = [*([settled] if settled else []), told]
        more = self._maybe_close(now) if cmd == "resume" else Effects()
        return Effects(outbound=(*out, *more.outbound), committed=more.committed, changed=True)

    def charge_downlink(self, outbound: Sequence[Published], now: float | None = None) -> bytes:
        """Account what agents receive and count what is published, by kind: a job-wide
        message costs every live agent, one addressed to an agent (``target``) that agent
        only; with pacing on, the next version waits until their links are free again.
        Returns the journal form :meth:`replay_charge` re-applies
        (:meth:`~aggregator.engine.downlink.pacing.DownlinkTraffic.charge_published`)."""
        return self.traffic.charge_published(outbound, now, self.registry)

    def replay_charge(self, blob: bytes, now: float) -> None:
        """Re-apply a journalled :meth:`charge_downlink` (not counted again as published:
        those counters are this process's). Raises ValueError for a malformed blob."""
        self.traffic.replay(blob, now, self.registry)

    # ------------------------------------------------------------------ outbound

    def resync_message(self) -> Outbound:
        """Control ``resync``: the aggregator (re)started at this version."""
        return self.lifecycle.resync(self.version)

    def restart_message(self) -> Outbound:
        """What the fleet receives when the service (re)starts: the current version's own
        steps when they are held (a member one version behind, because the process died
        before it published them, applies them; the others drop them as old), else the
        retained state snapshot (a fresh job's initial model, or steps no longer held)."""
        return self.model.latest(self.version) or self.snapshot_message()

    def snapshot_message(self) -> Outbound:
        """The model agents hold (and for EF21 jobs replicated exactly, the aggregate h
        their steps need) as a retained state snapshot on ``cat/<job>/model``."""
        return self.model.snapshot(self.version)

    def state_controls(self, *, settings: bool = True) -> list[Outbound]:
        """What agents must see now: the job's settings (start, hello) and pause/stop, if any."""
        out = [self.refusals.announce] if settings and self.refusals.announce else []
        return out + self.lifecycle.controls(self.version)

    def _answer(
        self, agent: str, have: int | None, now: float, controls: bool = True
    ) -> tuple[Outbound, ...]:
        """What ``agent`` (holding version ``have``) misses, on its own topic: merged steps,
        else a snapshot (rate-limited, :mod:`aggregator.engine.downlink.pacing`); with
        ``controls``, the pause/stop it must see."""
        steps = self.model.catch_up(have, self.version)
        extra = self.state_controls(settings=False) if controls else ()
        return self.traffic.answer(agent, steps, self.snapshot_message, now, extra)

    # ------------------------------------------------------------------ messages

    def _open(self, kind: str, agent: str, blob: bytes) -> tuple[bytes, bool]:
        """The JSON of a hello, status or request, and whether it was signed (raises)."""
        return self.config.mac.open_json(kind, self.config.job, agent, blob)

    def _on_hello(self, agent: str, blob: bytes, now: float) -> Effects:
        text, signed = self._open("hello", agent, blob)
        hello = self.registry.check_hello(agent, text, signed=signed, config=self.config,
                                          family=self.family)  # fmt: skip
        # --- apply
        self.refusals.refused_agents.forget(agent)
        self.model.hellos_changed()
        high = self.intake.highest(agent)  # a fresh hello forgets the keys
        if hello.fresh and self.registry.get(agent) is not None:
            self._forget(agent)
        floor = -1 if high is None else high + 1
        self.registry.welcome(agent, hello, now, self.version, signed=signed, seq_floor=floor)
        self.closing.heard(agent, hello.profile, len(blob), now)
        if self.model.set_family(semantics_family(hello.semantics)):
            self._forget(agent)  # the only agent switched semantics
        out: list[Outbound] = []
        if hello.version is not None and hello.version != self.version:
            out.extend(self._answer(agent, hello.version, now, controls=False))
        # the job's settings are not repeated to an agent whose hello fits them (it would
        # judge nothing from them; a misfit's refusal carries them): on LoRaWAN under a
        # unicast cap their 150-odd JSON bytes cost an SF12 member half a day of downlinks
        out.extend(self.traffic.to(agent, self.state_controls(settings=False)))
        if self.agents[agent].needs_reset:
            out.append(self._rejoin(agent, drop=False))  # still waiting for a fresh hello
        if self.state == "waiting":
            self._maybe_start(now)
        return Effects(outbound=tuple(out), journal=True)

    def _on_status(self, agent: str, blob: bytes, now: float) -> Effects:
        text, signed = self._open("status", agent, blob)
        journal = self.registry.on_status(agent, text, now, signed=signed)
        return _JOURNAL_ONLY if journal else _NOTHING  # a repeat is not journalled

    def _on_request(self, agent: str, blob: bytes, now: float) -> Effects:
        text, signed = self._open("request", agent, blob)
        req = self.registry.on_request(agent, text, now, signed=signed)
        return Effects(outbound=self._answer(agent, req.have, now), journal=signed)

    def _on_update(self, agent: str, blob: bytes, now: float, decoded: Decoded | None) -> Effects:
        verdict = self.intake.judge(agent, blob, decoded, now, version=self.version,
                                    state=self.state)  # fmt: skip
        if not isinstance(verdict, Admit):
            return self._refused(agent, verdict, now)
        self._record(agent, blob, now, verdict)
        if self.state != "waiting":
            self.round_state.open(now)
        closed = self._maybe_close(now)
        if closed is _NOTHING:
            return _JOURNAL_ONLY
        return replace(closed, journal=True)

    def _refused(self, agent: str, verdict: Refresh | Answer | Rejoin, now: float) -> Effects:
        """Apply a verdict of :meth:`UpdateIntake.judge` that refuses the update."""
        if isinstance(verdict, Refresh):
            return _JOURNAL_ONLY if self.registry.refresh(agent, now) else _NOTHING
        if isinstance(verdict, Answer):
            self._reject(verdict.reason, verdict.detail, agent)
            info = self.registry.get(agent)
            if (
                verdict.reason == "stale"
                and info is not None
                and self.traffic.defer_stale(info, verdict.have)
            ):
                return Effects(reason=verdict.reason)
            out = self._answer(agent, verdict.have, now, controls=verdict.controls)
            return Effects(outbound=out, reason=verdict.reason)
        told = self._rejoin(agent, drop=verdict.drop)
        self._reject(verdict.reason, verdict.detail, agent)
        # journalled: the reset changed state a replay must reproduce
        return Effects(outbound=(told,), journal=True, reason=verdict.reason)

    def _record(self, agent: str, blob: bytes, now: float, admit: Admit) -> None:
        """Apply an admitted update: keys, agent and cost accounting, aggregation state."""
        info, header, update = admit.info, admit.header, admit.update
        spend = self._pricer.price(info.hello.profile, header, len(blob))
        # nothing below can fail on a validated update
        contributes, weight = admit.contributes, admit.weight
        self.intake.applied(agent, self.registry.index(agent), header)
        self.model.apply(agent, header, update, blob, contributes=contributes,
                         weight=weight, norms=admit.norms)  # fmt: skip
        self.registry.accepted(agent, header.round, header.t, spend, now)
        self.closing.heard(agent, info.hello.profile, len(blob), now)
        self.tally.accepted_update(spend)
        self.round_state.cost(agent, header.t, spend)
        if contributes:
            ef21 = header.semantics == "ef21"
            self.round_state.contribute(agent, None if ef21 else update, weight)

    # ------------------------------------------------------------------ refused state

    def _forget(self, agent: str) -> None:
        """Drop ``agent``'s EF21 state and forget its de-duplication keys."""
        self.model.reset_agent(agent)
        self.intake.forget(agent, self.registry.index(agent))

    def _rejoin(self, agent: str, *, drop: bool = True) -> Outbound:
        """The control ``reset`` that asks ``agent`` to rejoin fresh; ``drop``: first drop
        its EF21 state and keys, its updates waiting for that hello (else: a repeat)."""
        if drop:
            self._forget(agent)
            self.registry.set_needs_reset(agent, True)
        return reset_message(self.config.job, agent, self.version)

    def _drop_round(self, now: float) -> Effects:
        """The open round's step would make the model non-finite although every update
        passed the guard (the step size grew since, e.g. a hello lowered L): its updates
        are refused (``would_diverge``), the model is kept, the job runs on. Senders may
        send again: mean-family keys are forgotten; every EF21 state is dropped (sum_h
        held the overflow) and its agent asked to rejoin fresh."""
        detail = f"round {self.version} at gamma={self.gamma():.3g}"
        for _ in range(self.round_state.count):
            self._reject("would_diverge", detail, None)
        ef21 = self.family == "ef21"
        out: list[Outbound] = []
        for agent in list(self.h) if ef21 else list(self.round_state.participants):
            if ef21:  # drops h_i and asks the agent to rejoin
                out.append(self._rejoin(agent))
            else:  # its keys are forgotten: it may send the update again
                self._forget(agent)
        self.model.round_dropped()
        self.round_state.reset(now)
        return Effects(outbound=tuple(out), changed=True)

    # ------------------------------------------------------------------ rounds

    def _maybe_start(self, now: float) -> bool:
        if len(self.registry) >= self.config.min_agents and self.lifecycle.start():
            self.round_state.open(now, again=True)
            return True
        return False

    def _maybe_close(self, now: float) -> Effects:
        """Close the open round if it may (``journal``: a downlink hold started or ran out)."""
        reason = self.closing.reason(now, state=self.state, version=self.version,
                                     family=self.family)  # fmt: skip
        if reason is None:
            return _NOTHING
        may, changed = self.traffic.may_close(now, self.config.max_hold_s, self.registry)
        if not may:
            return _JOURNAL_ONLY if changed else _NOTHING
        return self._close(now, reason)

    def _close(self, now: float, reason: str) -> Effects:
        """Step the model with the open round, commit the new version, broadcast it."""
        gamma = self.gamma()
        profiles = [(a.hello.profile, self.traffic.group_of(a)) for a in self.registry]
        step, coef = self.model.step(self.round_state, gamma, profiles)
        if not step.finite:
            return self._drop_round(now)
        base = self.version
        self.model.evaluate()
        record = self.round_state.record(base + 1, base, now, reason, gamma, self.loss,
                                         self.accuracy)  # fmt: skip
        self.tally.committed(record)
        done = self.closing.done(self.version, self.loss)
        out = self.model.stepped(step, base, self.version, coef, profiles, final=done is not None)
        self.round_state.reset(now)
        self.traffic.closed(now)
        self.intake.prune(self.version)
        if done is not None:
            self.lifecycle.finish(done, self.version)
        out.extend(self.state_controls(settings=False))
        return Effects(outbound=tuple(out), committed=record)

    def _reject(
        self, reason: str, detail: str, agent: str | None, now: float | None = None
    ) -> Effects:
        """Count a rejection; with ``now`` (a hello or update from ``agent``), also tell the
        agent when the reason concerns it (:mod:`aggregator.engine.refusals`, rate-limited)."""
        told = self.refusals.refuse(reason, detail, agent, now, self.version)
        self.registry.rejected(agent)
        return Effects(outbound=told, reason=reason)

    # ------------------------------------------------------------------ persistence

    def export(self) -> EngineSnapshot:
        """A deep copy of the whole state (for a checkpoint): each part exports its own."""
        self.intake.prune(self.version)
        model = self.model.export()
        cfg = self.config
        meta = {
            **{"format": STATE_FORMAT, "job": cfg.job, "d": cfg.d, "model": cfg.model},
            **self.tally.export(),
            **self.lifecycle.export(),
            "agents": self.registry.export(),
            "cadence": self.closing.export(),
            "rejected": self.refusals.export(),
            **self.traffic.export(),
            **model["meta"],
            "round": self.round_state.export(),
        }
        arrays = {
            **model["arrays"],
            "acc": self.round_state.export_sum(),
            "seen": self.intake.export(),
        }
        return EngineSnapshot(meta=meta, **arrays)

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
        snap.check(config)
        eng = cls(config, x0=snap.x, evaluator=None, profiles=profiles)
        eng._load(snap)
        eng.model.evaluator = evaluator
        return eng

    def _load(self, snap: EngineSnapshot) -> None:
        meta = snap.meta
        self.tally.restore(meta)
        self.lifecycle.restore(meta)
        self.registry.restore(meta["agents"])
        self.closing.restore(meta.get("cadence"))
        self.refusals.restore(meta["rejected"])
        self.traffic.restore(meta)
        self.round_state.restore(meta["round"], snap.acc)
        self.model.restore(snap)
        self.intake.restore(snap.seen, list(self.registry.records))
        self.intake.prune(self.version)
