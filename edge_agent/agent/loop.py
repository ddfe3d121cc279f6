"""The agent loop: what runs on a device next to a radio.

One :class:`Agent` owns a data shard, an exact copy of the model (a snapshot plus sparse
deltas), a cost profile for its own link, a policy for T, optional error feedback, and a
transport. Per model version it computes the local gradient, picks T, compresses, encodes
and publishes one update tagged with that version, then waits for the next version.

The loop is driven two ways with the same code: :meth:`Agent.run` (a real process: blocks
on the transport, honours the duty cycle, re-sends on silence) and :meth:`Agent.handle` +
:meth:`Agent.step` (the simulator pumps messages itself over ``memory://``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

import numpy as np
import numpy.typing as npt

from edge_agent.agent.answers import Answers
from edge_agent.agent.catchup import CatchUp, Want, want_for
from edge_agent.agent.config import AgentConfig, CurvatureName, FeedbackName
from edge_agent.agent.ledger import AgentCounters, CostLedger, RoundLog
from edge_agent.agent.localtrain import LocalMember
from edge_agent.agent.minibatch import for_agent
from edge_agent.agent.radio import Uplink
from edge_agent.agent.replica import Replica
from edge_agent.agent.sealer import Sealer
from edge_agent.agent.signatures import SignatureCheck
from edge_agent.data import Dataset
from edge_agent.errors import TransportError, WireFormatError
from edge_agent.links.cost import MessageCost
from edge_agent.links.profiles import CostProfile
from edge_agent.numerics.compressors import Semantics, compress
from edge_agent.numerics.curvature import (
    dense_curvature,
    directional_step,
    scale_for_step,
    select_directional,
)
from edge_agent.numerics.feedback import FEEDBACK, Feedback
from edge_agent.numerics.models import Model
from edge_agent.numerics.selection import Policy, Price, make_price, parse_policy
from edge_agent.protocol import jobinfo, messages, topics
from edge_agent.protocol.downlink import (
    StateSnapshot,
    decode_downlink,
    semantics_family,
)
from edge_agent.protocol.wire import MAGIC, Delta, Snapshot, encode
from edge_agent.transports import Message, Transport

log = logging.getLogger("edge_agent")

__all__ = [
    "Agent",
    "AgentConfig",
    "AgentCounters",
    "CostLedger",
    "CurvatureName",
    "FeedbackName",
    "RoundLog",
]

FloatArray = npt.NDArray[np.float64]


class Agent:
    """A CAT edge agent. Not thread-safe: one thread drives it (``stop()`` is the exception)."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        model: Model,
        data: Dataset,
        profile: CostProfile,
        transport: Transport,
        smoothness: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_round: Callable[[RoundLog], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        topics.validate_id(config.job, "job")
        topics.validate_id(config.agent_id, "agent id")
        self.config = config
        self.model = model
        self.data = data
        self.profile = profile
        self.clock = clock
        #: the counter and MAC of what it sends (the wall clock feeds the counter)
        self.sealer = Sealer(config.mac_key, config.job, config.agent_id, wall_clock)
        self.on_round = on_round
        self.rng = np.random.default_rng(config.seed)
        #: rows whose gradient was evaluated over all rounds (one full pass = data.n_rows)
        self.gradient_rows = 0
        self.policy: Policy = parse_policy(config.policy)
        self.feedback: Feedback = FEEDBACK[config.feedback](model.d)
        fit_rng = np.random.default_rng(config.seed)
        self.smoothness = model.smoothness(data, rng=fit_rng) if smoothness is None else smoothness
        #: minibatch SGD (sampler, variance, residual units), None for full gradients or
        #: local training (whose steps draw from ``self.local.batches``)
        self.minibatch = (
            None
            if config.local
            else for_agent(config, data, self.policy, self.smoothness, model.l2)
        )
        #: what the updates carry: the feedback's semantics, or ``dir`` (family *mean*)
        self.semantics: Semantics = (
            "dir" if config.curvature == "directional" else self.feedback.semantics
        )
        #: local training: this member's x_i, u_i and what it sent (None: no local training)
        self.local = (
            None
            if not config.local
            else LocalMember(
                config.agent_id,
                model.d,
                data.n_rows,
                batch_size=config.batch_size,
                seed=config.seed,
            )
        )
        if self.local is not None:
            self.semantics = "local"
        family = semantics_family(self.semantics)
        self._fit = jobinfo.Fit(
            config.job,
            config.agent_id,
            model.d,
            model.kind,
            self.semantics,
            config.compressor,
            config.batch_size,
            config.local_steps,
            config.comm_prob,
        )
        #: the model copy, kept bit-identical to the aggregator's (or its broadcast model)
        self.replica = Replica(model.d, family)
        self.sent_version: int | None = None
        self.seq = 0
        self.rounds = 0
        self.ledger = CostLedger()
        #: what it sends: priced into the ledger, paced by the radio's duty cycle
        self.uplink = Uplink(
            transport, profile, self.ledger, self.sealer, duty_cycle=config.duty_cycle, clock=clock
        )
        self.counters = AgentCounters()
        #: the aggregator's signatures, checked before anything is parsed
        self.signatures = SignatureCheck(
            config.aggregator_keys, self.counters, config.aggregator_not_before_us
        )
        self.last_log: RoundLog | None = None
        #: seconds spent per stage over all rounds (gradient, selection, compression, ...)
        self.timings_s = dict.fromkeys(("grad", "select", "compress", "encode", "send"), 0.0)
        self.paused = False
        #: True once the work is over: the aggregator said stop, or max_rounds were answered.
        self.finished = False
        self.gave_up: str | None = None  # why it gave up (its settings do not fit the job)
        self.answers = Answers(
            config.job, config.agent_id, config.max_refusals, self.counters.refused, clock()
        )
        self._stop = threading.Event()
        self._started = False
        self._closed = False
        self._last_blob: bytes | None = None
        self._last_progress = clock()
        self._resend_wanted = False
        #: what the replica lacks and when it may ask again (edge_agent/agent/catchup.py)
        self.catchup = CatchUp(config.resend_s or 30.0)
        self._fresh = True
        self._hello_interval_s = 1.0
        self._topic_update = topics.update(config.job, config.agent_id)
        self._topic_model = topics.model(config.job)
        self._topic_delta = topics.delta(config.job)
        self._topic_control = topics.control(config.job)
        self._topic_request = topics.request(config.job, config.agent_id)
        #: answers addressed to this agent alone (catch-up, snapshot, control)
        self._topic_to = topics.to_agent(config.job, config.agent_id)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Connect, subscribe to the job's model topics, say hello, ask for the model."""
        job, me = self.config.job, self.config.agent_id
        self.transport.set_will(topics.status(job, me), self.sealer.will())
        self._started = True
        self.transport.connect()
        for pattern in topics.agent_subscriptions(job, me):
            self.transport.subscribe(pattern)
        self._say_hello()

    def _say_hello(self) -> None:
        job, me = self.config.job, self.config.agent_id
        hello = messages.Hello(
            job=job,
            agent=me,
            d=self.model.d,
            rows=self.data.n_rows,
            smoothness=self.smoothness,
            model=self.model.kind,
            compressor=self.config.compressor,
            semantics=self.semantics,
            policy=self.config.policy,
            profile=self.profile.name,
            objective=self.profile.objective,
            fresh=self._fresh,
            next_seq=self.sealer.next_seq(self.seq),
            version=self.version,
            group=self.config.group,
            batch_size=self.config.batch_size,
            local_steps=self.config.local_steps,
            comm_prob=self.config.comm_prob,
            will_ctr=self.sealer.will_ctr,
        )
        # no separate "online" status: a hello marks the agent online at the aggregator, and
        # on a duty-cycled radio every message costs minutes of silence
        self.uplink.send_control(topics.hello(job, me), hello)
        self._last_progress = self.clock()
        if self.x is None:
            self._need("snapshot", startup=True)

    def _need(self, want: Want, *, startup: bool = False) -> None:
        """The replica lacks ``want``: ask now if the back-off and the radio allow, else
        :meth:`_tick` asks when they do."""
        self.catchup.need(want, startup=startup)
        self._maybe_request()

    def _maybe_request(self) -> bool:
        """Send the wanted request if its back-off passed and the radio may send."""
        if self.uplink.quiet():
            return False
        req = self.catchup.request(self.clock(), self.version)
        if req is None:
            return False
        self.counters.requests += 1
        self.uplink.publish(self._topic_request, self.sealer.seal(req), update=False)
        return True

    def stop(self) -> None:
        """Ask :meth:`run` to return (safe from a signal handler or another thread)."""
        self._stop.set()

    def close(self, state: Literal["offline", "done"] = "offline") -> None:
        """Say goodbye (status), then close the transport, which flushes it; idempotent.

        The goodbye is published even while the transport reports no connection: a ZeroMQ
        agent may be between reconnects to a live aggregator (its close() waits a bounded
        ``linger_ms`` for it), and without it a ZeroMQ aggregator shows the agent online
        until its liveness timeout (MQTT's Last Will only says ``offline``).
        """
        if self._closed:
            return
        self._closed = True
        try:
            quiet = self.uplink.quiet()
            if quiet:
                log.info("no goodbye: the radio owes %.1f s of duty-cycle silence",
                         self.uplink.owed_s())  # fmt: skip
            if self._started and not quiet:
                status = messages.Status(
                    state=state, agent=self.config.agent_id, round=self.version
                )
                self.uplink.goodbye(topics.status(self.config.job, self.config.agent_id), status)
        except TransportError as exc:  # the transport was closed under us: nothing to say
            log.warning("could not say goodbye (%s): %s", state, exc)
        finally:
            self.transport.close()

    # ------------------------------------------------------------------ inbound

    def handle(self, msg: Message) -> None:
        """One inbound message: :meth:`price` it, then :meth:`apply` it."""
        self.price(msg)
        self.apply(msg)

    def price(self, msg: Message) -> MessageCost:
        """What receiving ``msg`` cost, into the ledger's ``down`` direction, applied or not:
        whatever arrives was received over the radio, priced on the profile's downlink part
        (a job-wide message on the shared group's, if any). The simulator prices a message
        when it is published and applies it when its reception ends."""
        mine = msg.topic == self._topic_to
        cost = self.profile.receive_cost(len(msg.payload), job_wide=not mine)
        self.ledger.received(cost)
        return cost

    def apply(self, msg: Message) -> None:
        """Act on one inbound message (priced by :meth:`price`). A bad one is counted,
        logged and dropped, never raised."""
        mine = msg.topic == self._topic_to
        try:
            payload = self.signatures.admit(msg.topic, msg.payload)
            if payload is None:  # not the aggregator's word: counted, never acted on
                return
            self.answers.heard(self.clock())
            verdict = jobinfo.judge(msg.topic, payload, self._fit)
            if verdict is not None:  # the job's settings: edge_agent/protocol/jobinfo.py
                self._judged(verdict, addressed=mine)
                return
            if msg.topic == self._topic_delta or msg.topic == self._topic_model:
                self._handle_model(payload, addressed=False)
            elif msg.topic == self._topic_control:
                self._handle_control(messages.parse(messages.Control, payload))
            elif msg.topic == self._topic_to:  # binary: a model message, else JSON control
                if payload[:2] == MAGIC:
                    self._handle_model(payload, addressed=True)
                else:
                    self._handle_control(messages.parse(messages.Control, payload))
            else:
                self.counters.drop("unexpected_topic")
        except WireFormatError as exc:
            self.counters.drop("malformed")
            if self.counters.dropped["malformed"] == 1:
                log.warning("dropped a malformed message on %s: %s", msg.topic, exc.reason)

    @property
    def transport(self) -> Transport:
        """The transport it sends and receives on (owned by its :class:`Uplink`)."""
        return self.uplink.transport

    @property
    def x(self) -> FloatArray | None:
        """This agent's model copy (None until the first snapshot)."""
        return self.replica.x

    @property
    def version(self) -> int | None:
        return self.replica.version

    @property
    def radio_free_at(self) -> float:
        """When the radio may send again (clock time): the duty-cycle silence its last
        message owes is served then, whether ``duty_cycle`` waits for it or not."""
        return self.uplink.free_at

    def _handle_model(self, payload: bytes, *, addressed: bool) -> None:
        m = decode_downlink(payload)
        if m.job != self.config.job:
            self.counters.drop("wrong_job")
            return
        had, held = self.replica.x is not None, self.replica.version
        snapshot = isinstance(m, Snapshot | StateSnapshot)
        local = self.local
        if snapshot and not addressed and local is not None and local.skips(m.version, held):
            self.counters.drop("snapshot_ahead")  # the steps keep this member's own state
            self._need("steps")
            return
        refused = self.replica.apply(m)
        if refused is None and self.local is not None:
            if snapshot and self.local.started and m.version != held:  # lost track: rejoin
                self.replica.exchanges.clear()
                self._reset_state()
            self.local.received(self.replica.exchanges)
            self.replica.exchanges.clear()
        if refused is None:
            if snapshot:
                self.counters.snapshots += 1
                self.catchup.loaded(addressed=addressed)
            else:
                if isinstance(m, Delta):
                    self.counters.deltas += 1
                else:
                    self.counters.steps += 1
                self.catchup.followed()
            self._last_progress = self.clock()
            return
        if refused == "old":
            if snapshot:
                self.counters.drop("old_snapshot")
            return  # already have it
        if refused == "no_model" and not had:
            self._need("snapshot", startup=True)  # none yet: asked for (paced), not counted
            return
        n = self.counters.drop(refused)
        if refused == "wrong_d":
            if n == 1:
                log.error(
                    "a model message has another d than this agent's model (%d)", self.model.d
                )
            return
        # version_gap, no_aggregate, ...: ask for what is missing, paced (catchup.py)
        self.catchup.dropped(refused, n)
        self._need(want_for(refused))

    def _handle_control(self, ctl: messages.Control) -> None:
        if ctl.cmd == "stop":
            self.finished = True
            self._stop.set()
        elif ctl.cmd == "resync":
            if ctl.version is None or self.version is None:
                return
            if ctl.version == self.version == self.sent_version:
                # The aggregator restarted and may have lost the open round: the same
                # bytes again (same seq), which it de-duplicates if it had them, as soon
                # as the duty cycle allows.
                self._resend_wanted = True
                if self.config.duty_cycle == "ignore":
                    self._resend()
            elif ctl.version > self.version:
                self._need("steps")
        elif ctl.cmd == "reset":
            if ctl.agent == self.config.agent_id:
                self.answers.count("ef21_reset")
                self._reset_state()
        elif ctl.cmd == "refused":
            if ctl.agent == self.config.agent_id:
                self._refused(ctl.reason, ctl.detail)
        else:  # pause | resume: logged when it changes
            if (paused := ctl.cmd == "pause") != self.paused:
                log.info("job paused: waiting for resume" if paused else "job resumed")
            self.paused = paused

    def _judged(self, verdict: jobinfo.Verdict, *, addressed: bool) -> None:
        """The job's settings arrived: give up when this agent's do not fit (one ERROR
        line, even after refusals ended it). With signed downlinks only the settings
        addressed to it count (a signed old retained one could be replayed; the live ones
        come with every refusal of its settings)."""
        if self.signatures.enforced and not addressed:
            return
        if verdict.give_up is not None and self.gave_up != verdict.give_up:
            log.error("this agent's settings do not fit the job: %s", verdict.conflict)
            self.gave_up = verdict.give_up
            self._stop.set()

    def _refused(self, reason: str, detail: str) -> None:
        """Log and count a refusal; give up after too many that cannot heal; say hello
        again when the aggregator does not know us (EF21 state it never saw restarts)."""
        self.gave_up = self.answers.refusal(reason, detail) or self.gave_up  # jobinfo's stays
        if self.gave_up is not None:
            self._stop.set()
        elif reason == "unknown_agent" and self.x is not None:
            if self.feedback.semantics == "ef21":
                self._reset_state()
            else:
                self._say_hello()

    def _reset_state(self) -> None:
        """The aggregator dropped its copy of our EF21 state (one of our changes reached it
        too late to know whether it was applied): zero ours too and rejoin fresh. The update
        it refused is answered again, from the zero state, once the hello is through."""
        self.counters.resets += 1
        log.warning("the aggregator reset this agent's error-feedback state; rejoining fresh")
        self.feedback.reset()
        if self.minibatch is not None:
            self.minibatch.reset()
        if self.local is not None:
            self.local.reset()
        self._last_blob = None  # never re-send a change computed from the old state
        self.sent_version = None
        self._fresh = True
        self._say_hello()

    # ------------------------------------------------------------------ outbound

    @property
    def due(self) -> bool:
        """True when there is a model version this agent has not answered yet."""
        return (
            self.x is not None
            and self.version != self.sent_version
            and not self.paused
            and not self.finished
            and (self.config.max_rounds is None or self.rounds < self.config.max_rounds)
        )

    def step(self) -> RoundLog | None:
        """If due, compute, compress, encode and publish one update; return its log."""
        if not self.due:
            return None
        assert self.x is not None and self.version is not None
        cfg = self.config
        if cfg.mac_key is not None:  # a seq above every one it ever used, restarts included
            self.seq = self.sealer.take()
        t0 = time.perf_counter()
        mb = self.minibatch
        if self.local is not None:  # what travels is the local model's change
            loss, g = self.model.loss(self.x, self.data), self._local_change()
        else:
            batch = self.data if mb is None else mb.draw(self.data)
            loss, g = self.model.loss_grad(self.x, batch)
            self.gradient_rows += batch.n_rows
        variance = None if mb is None else mb.variance(self.model, self.x, batch, g)
        t1 = time.perf_counter()
        if mb is not None:
            mb.rescale(self.feedback, self.version)
        v = self.feedback.prepare(g)
        price = make_price(
            self.profile,
            cfg.compressor,
            d=v.size,
            job=cfg.job,
            agent=cfg.agent_id,
            round=self.version,
            seq=self.seq,
            value_dtype=cfg.value_dtype,
            mac=cfg.mac_key is not None,
        )
        step: float | None = None  # the directional step t along q, if any
        if cfg.curvature == "directional":
            t, order, step = self._choose_directional(v, price)
        else:
            chosen = self.policy.choose(v, cfg.compressor, price, self.rounds, variance)
            t = max(cfg.t_min, min(chosen.t, cfg.t_max or v.size, v.size))
            order = (
                chosen.indices if chosen.indices is not None and chosen.indices.size == t else None
            )
        t2 = time.perf_counter()
        update = compress(
            v,
            cfg.compressor,
            t,
            rng=self.rng,
            value_dtype=cfg.value_dtype,
            order=order,
            noise=0.0 if variance is None else float(variance.sum()),
        )
        if step is not None:
            update = scale_for_step(update, step, self.smoothness, value_dtype=cfg.value_dtype)
        update = replace(update, semantics=self.semantics)  # shares the arrays
        t3 = time.perf_counter()
        # value_dtype: the signtopk scale travels in the configured dtype (the price assumed
        # it, and the agent's memories and the directional step were rounded to it)
        blob = encode(
            update,
            job=cfg.job,
            agent=cfg.agent_id,
            round=self.version,
            seq=self.seq,
            value_dtype=cfg.value_dtype,
            mac_key=cfg.mac_key,
        )
        t4 = time.perf_counter()
        cost = self.uplink.publish(self._topic_update, blob, update=True)
        t5 = time.perf_counter()
        # Only once the transport has it: the memory must match what the aggregator applies.
        self.feedback.commit(v, update)
        if self.local is not None:
            self.local.sent(self.version, update.to_dense())
        entry = RoundLog(
            round=self.version,
            seq=self.seq,
            t=update.t,
            size_bytes=len(blob),
            packets=cost.packets,
            airtime_s=cost.airtime_s,
            energy_j=cost.energy_j,
            loss=loss,
            grad_s=t1 - t0,
            select_s=t2 - t1,
            compress_s=t3 - t2,
            encode_s=t4 - t3,
            send_s=t5 - t4,
        )
        for stage, seconds in zip(
            self.timings_s, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True
        ):
            self.timings_s[stage] += seconds
        self.sent_version = self.version
        self.seq += 1
        self.rounds += 1
        self._fresh = False
        self._last_blob = blob
        self._last_progress = self.clock()
        self.last_log = entry
        if self.on_round is not None:
            self.on_round(entry)
        return entry

    def _local_change(self) -> FloatArray:
        """Local training: this round's local steps and the change that travels."""
        assert self.local is not None and self.x is not None
        v = self.replica.aggregate
        v = np.zeros(self.model.d) if v is None else v
        before = self.local.rows
        change = self.local.change(
            self.x,
            v,
            lambda x, rows: self.model.grad(x, self.data if rows is None else self.data.take(rows)),
        )
        self.gradient_rows += self.local.rows - before
        return change

    def _choose_directional(
        self, g: FloatArray, price: Price
    ) -> tuple[int, npt.NDArray[np.int64] | None, float]:
        """T, its entries (None: dense) and the step t along q, from this agent's own rows:
        CAT with the directional gain for topk/signtopk, ``1/L_g`` along g for dense."""
        cfg = self.config
        if cfg.compressor == "dense":
            gg, bound = dense_curvature(g, self.model, self.data)
            return g.size, None, directional_step(gg, bound)
        sel = select_directional(
            g, cfg.compressor, price, self.model, self.data, t_min=cfg.t_min, t_max=cfg.t_max
        )
        return sel.t, sel.indices, sel.step

    def _resend(self) -> None:
        self._resend_wanted = False
        if self._last_blob is None:
            return
        self.counters.resends += 1
        log.info("re-sending the update for round %s (no new model for a while)", self.sent_version)
        self.uplink.publish(self._topic_update, self._last_blob, update=False)
        self._last_progress = self.clock()

    # ------------------------------------------------------------------ the loop

    def run(self, *, poll_s: float = 0.05) -> None:
        """Serve until stopped (control ``stop``, :meth:`stop`, or ``max_rounds`` answered)."""
        while not self._stop.is_set():
            self._drain(poll_s)
            if self._stop.is_set() or not self._tick():
                break

    def _drain(self, poll_s: float) -> None:
        """Handle what arrived (waiting up to ``poll_s`` for the first message)."""
        msg = self.transport.recv(timeout_s=poll_s)
        while msg is not None:
            self.handle(msg)
            msg = self.transport.recv(timeout_s=0)

    def _tick(self) -> bool:
        """Send at most one message, if any is due and the radio may send; False when the
        work is over (its last update was applied: it says "done", not "offline")."""
        cfg = self.config
        now = self.clock()
        if (
            cfg.max_rounds is not None
            and self.rounds >= cfg.max_rounds
            and self.version != self.sent_version
        ):
            self.finished = True
            return False
        if self.uplink.quiet():
            return True  # the radio owes silence: nothing may go out
        if self.uplink.waiting:
            self.uplink.flush_one()
        elif self.catchup.ready(now):  # the radio may send (checked above)
            self._maybe_request()
        elif self.due:
            self.step()
        elif self._resend_wanted:
            self._resend()
        elif self.x is None and now - self._last_progress >= self._hello_interval_s:
            # No model yet: the aggregator may not be up, or missed the hello. Back off.
            self.answers.hello_unanswered(now, self.transport.url)
            self._say_hello()
            self._hello_interval_s = min(2 * self._hello_interval_s, cfg.resend_s or 30.0)
        elif self._silent_for_s(now) >= (cfg.resend_s or float("inf")):
            self._resend()
        return True

    def _silent_for_s(self, now: float) -> float:
        """Seconds without a new model version while holding one (0 without a model)."""
        return 0.0 if self.x is None else now - self._last_progress
