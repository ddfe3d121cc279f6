"""One method on one fleet: train on the harness, record cost and suboptimality per round.

The engine runs lockstep rounds, one model version per round:

1. every agent takes the messages waiting in its inbox (:meth:`Agent.handle`);
2. every agent :meth:`Agent.step` s: gradient at its copy of ``x_k``, T, compress, encode,
   publish, account the cost in its ledger;
3. the engine handles the updates at the simulated time; the last one closes the round
   (``x_{k+1}``) and the engine's delta/snapshot messages are published to the agents.

Objective and targets
---------------------
``f(x_k)`` is *not* re-evaluated on the full data every round. Each agent's step already
computes its shard's objective ``f_i(x_k)`` (mean loss over its rows plus ``l2/2 |x|^2``) at
exactly the engine's ``x_k`` (the agent's copy is bit-identical), and
``f(x_k) = sum_i n_i f_i(x_k) / sum_i n_i`` holds exactly for the same model on the union
of the shards. So the relative suboptimality ``(f(x_k) - f*) / (f(x_0) - f*)`` is known at
*every* round for free, and each target is detected at the exact round. As a cross-check
the full-data objective is computed directly at round 0, at the last round and every
``eval_every`` rounds, and a mismatch beyond rounding raises.

What "cost to reach a target" means
-----------------------------------
For target ``eps``, the first ``k`` with relative suboptimality ``<= eps``; the cost is the
sum over agents of what their ledgers hold for the ``k`` update messages that produced
``x_k`` (bits, packets, airtime_s, energy_j, each agent priced by its own profile). Control
messages (hello, status, snapshot request: sent once at start) are excluded; a run checks
that no control message was sent after the start.

Simulated time: the rounds are lockstep. A round closes when the last update reaches the
engine (each agent sends when its radio's silence from its last send is over, its update
arrives when its airtime ends) and ends when the last agent holds the new version. A
member of a class B/C multicast group receives while its transmitter owes silence, so its
silence and the downlink overlap (the later governs); a class A member's reception waits
for its silence (aggregator.sim.timing).

At their own cadence (``cadence``, the default, on a fleet with duty-cycled radios): time
runs from event to event instead. Each agent sends as soon as it holds a version it has not
answered, its last reception is over and its radio's duty-cycle silence is served; its
update reaches the engine when its airtime ends; the engine (``EngineConfig.cadence``) does
not wait for a member its duty cycle keeps silent (aggregator.engine.cadence). So versions
advance as fast as the members that are due and the downlinks allow, and a member sends
at the version it holds when its radio is free. ``f(x_k)`` is then evaluated on the full
data at every version (not every agent computes at every version); the cost at version
``k`` is everything sent until it closed; a time step counts as a downlink wait while the
engine holds a closable round for downlinks or when it ends a reception, else as an uplink
wait (an update on air, a radio's silence). Version ``k``'s time is when the last agent
holds it (its reception over), as in lockstep; the audit's elapsed time runs until every
radio's owed silence and every downlink's pacing interval are over, in lockstep too (its
clock stops before the last round's uplink, whose updates are in the ledgers).
"""

from __future__ import annotations

import heapq
import math
import secrets
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from aggregator.engine.downlink.broadcast import DownlinkMode
from aggregator.engine.robust_round import parse_aggregation
from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.sim.audit import Margin, audit
from aggregator.sim.book import (
    DIVERGED,
    METRICS,
    RunBook,
    Trace,
    control_messages,
    down_busy_s,
)
from aggregator.sim.harness import FleetHarness
from aggregator.sim.hostile import make_hostile
from aggregator.sim.methods import Method
from aggregator.sim.problem import Fleet, Problem, agent_seed
from aggregator.sim.timing import (
    cap_spacing_s,
    receives_while_silent,
    reception_ends,
    uplink_arrivals,
)
from edge_agent.agent.loop import Agent, AgentConfig, RoundLog
from edge_agent.links.cost import COST_FIELDS, Cost
from edge_agent.numerics.local import LocalConfig
from edge_agent.protocol import topics
from edge_agent.protocol.signing import KEY_BYTES, CountingSigner, Signer
from edge_agent.transports import Message

FloatArray = npt.NDArray[np.float64]

JOB: Final = "sim"
#: The downlink fields of a record (sums over agents of what each received).
DOWN_FIELDS: Final[tuple[str, ...]] = ("bytes", *METRICS)
DEFAULT_TARGETS: Final[tuple[float, ...]] = (1e-1, 1e-2, 1e-3)
#: Relative tolerance of the full-data cross-check of the agents' objective.
_EVAL_RTOL: Final = 1e-9
#: At cadence: a round waits for the members whose radio is free before this deadline.
CADENCE_DEADLINE_S: Final = 900.0

ProgressFn = Callable[[int, float], None]


@dataclass
class RunResult:
    """One method on one fleet. ``reached``: target -> first round at or below it."""

    method: Method
    fleet: Fleet
    trace: Trace
    reached: dict[float, int]
    rounds_run: int
    stop_reason: str
    selection_s: float
    wall_s: float
    engine_version: int
    models_equal: bool
    step_size: float
    downlink: DownlinkMode = "exact"
    #: every limit the cost model knows, checked on the ledgers at the end (aggregator.sim.audit)
    margins: tuple[Margin, ...] = ()
    #: the time those limits were checked over: to the end of the run's last message
    #: (after the target's version: its broadcast and what the last sends owe)
    law_elapsed_s: float = 0.0
    #: the agents' minibatch (rows or a fraction of each shard); None: full gradients
    batch_size: float | None = None
    #: local training at cadence: changes refused stale (their version closed while on air)
    stale_updates: int = 0
    #: local training (the engine's local job): its gradient evaluations are reported
    local: bool = False


# --------------------------------------------------------------------------- set-up


def open_fleet(
    problem: Problem,
    fleet: Fleet,
    method: Method,
    *,
    step_size: float | None = None,
    ef21_step_factor: float = 0.5,
    downlink: DownlinkMode = "exact",
    downlink_pacing: bool = True,
    aggregation: str = "mean",
    hostile: float | None = None,
    batch_size: float | None = None,
    schedule_t0: float = 0.0,
    sign_downlink: bool = False,
    cadence: bool = False,
    deadline_s: float = 1e18,
    snapshot_every: int | None = None,
    local: LocalConfig | None = None,
) -> FleetHarness:
    """The engine (full quorum, no deadline or liveness timeout) and one agent per shard,
    not started. Close the harness when done. ``aggregation``: ``AGG_AGGREGATION``;
    ``hostile``: agent 0's updates reach the engine scaled by it (aggregator.sim.hostile);
    ``batch_size``: minibatch SGD, the engine then decays the step as
    ``min(gamma, 2 / (l2 (t + schedule_t0)))`` (aggregator.engine.stepsize.scheduled);
    ``sign_downlink``: every message to the agents is signed with a key made for the run,
    and every agent checks it (docs/wire-format.md section 13);
    ``cadence``: ``EngineConfig.cadence`` (aggregator.engine.cadence), with the rounds'
    ``deadline_s`` (the full quorum still waits for every member it does not excuse);
    ``snapshot_every``: ``EngineConfig.snapshot_every`` (None: 0 with cadence or
    ``batch_size``, else the engine's default); ``local``: local training (the job's
    ``AGG_LOCAL_STEPS`` and damping; every agent runs ``--local-steps``)."""
    model = problem.model
    lookup = {p.name: p for p in fleet.profiles}
    engine = RoundEngine(
        EngineConfig(
            job=JOB,
            d=model.d,
            model=model.kind,
            step_size=step_size,
            ef21_step_factor=ef21_step_factor,
            downlink=downlink,
            downlink_pacing=downlink_pacing,
            aggregation=parse_aggregation(aggregation),
            min_agents=fleet.agents,
            quorum_fraction=1.0,
            round_deadline_s=deadline_s,
            liveness_timeout_s=1e18,
            # every agent runs the method's feedback, so the first hello's family is the
            # method's; "any" (not announced) keeps runs byte-comparable with earlier ones
            feedback="any" if local is None else "local",
            local=local,
            batch_size=batch_size,
            # local training keeps its step fixed (LocalHub): no schedule
            schedule_l2=(
                model.l2 if batch_size is not None and local is None and model.l2 > 0 else None
            ),
            schedule_t0=schedule_t0,
            cadence=cadence,
            # no periodic snapshot (8 d bytes to each) at cadence (hours on air), with SGD
            # (hundreds of versions: they outweigh the rest) or under local training (every
            # copy is exact); nobody joins late here
            snapshot_every=_snapshot_every(
                snapshot_every, cadence or batch_size is not None or local is not None
            ),
        ),
        x0=model.initial_point(),
        profiles=lookup.get,
    )
    local_steps, comm_prob = engine.config.local_schedule  # what every agent's hello says
    keys: tuple[bytes, ...] = ()
    seal = None
    if sign_downlink:
        signer = Signer(secrets.token_bytes(KEY_BYTES))
        keys, seal = (signer.public_key,), CountingSigner(signer)
    harness = FleetHarness(engine, name="simulate", seal=seal)
    if hostile is not None:
        make_hostile(harness, JOB, "a000", hostile)
    try:
        for i in range(fleet.agents):
            config = AgentConfig(
                job=JOB,
                agent_id=f"a{i:03d}",
                compressor=method.compressor,
                policy=method.policy,
                feedback=method.feedback,
                curvature=method.curvature,
                seed=agent_seed(problem.seed, i),
                resend_s=None,
                duty_cycle="ignore",
                batch_size=batch_size,
                schedule_t0=schedule_t0 if method.ef_model_units else None,  # +ef:model
                aggregator_keys=keys,
                local_steps=local_steps,
                comm_prob=comm_prob,
            )
            harness.add_agent(
                config,
                model=model,
                data=fleet.shards[i],
                profile=fleet.profiles[i],
                smoothness=fleet.smoothness[i],
            )
    except BaseException:
        harness.close()
        raise
    return harness


def _snapshot_every(given: int | None, quiet: bool) -> int:
    return (0 if quiet else EngineConfig.snapshot_every) if given is None else given


# --------------------------------------------------------------------------- checks


def _check_objective(problem: Problem, x: FloatArray, f_agents: float, k: int) -> None:
    f_full = problem.model.loss(x, problem.data)
    if abs(f_full - f_agents) > _EVAL_RTOL * max(1.0, abs(f_full)):
        raise RuntimeError(
            f"round {k}: the agents' objective {f_agents!r} differs from the full-data "
            f"objective {f_full!r} (shards do not partition the data?)"
        )


def _updates_of_round(harness: FleetHarness, k: int) -> list[RoundLog]:
    """Every agent steps; each must answer model version ``k``."""
    logs = harness.step()
    done = [entry for entry in logs if entry is not None]
    if len(done) != len(logs) or any(a.version != k for a in harness.agents):
        engine = harness.engine
        raise RuntimeError(
            f"round {k}: not every agent holds model version {k} "
            f"(engine state {engine.state!r}: {engine.finish_reason})"
        )
    return done


def _check_end(harness: FleetHarness, book: RunBook, method: Method) -> bool:
    """No control message after the start; what the agents received is what the engine
    charged them; every agent holds the engine's broadcast model bit for bit
    (returns True; the protocol guarantees identical copies, so drift raises)."""
    if control_messages(harness.agents) != book.control:
        raise RuntimeError("agents sent control messages after the start (resends?)")
    # since the start (an agent that has not said hello yet receives the answers to the
    # others' hellos, which the engine cannot charge to an agent it does not know)
    received = Cost.sum(a.ledger.down for a in harness.agents) - book.down_at_start
    charged = harness.engine.totals_down - book.charged_at_start
    same = all(
        math.isclose(received.metric(f), charged.metric(f), rel_tol=1e-9, abs_tol=1e-12)
        for f in COST_FIELDS
    )  # floats summed in another order
    if not same:
        raise RuntimeError(
            f"{method}: the agents received {received}, the engine charged {charged}"
        )
    x = harness.engine.broadcast_model
    models_equal = all(a.x is not None and np.array_equal(a.x, x) for a in harness.agents)
    if not models_equal:
        raise RuntimeError(f"{method}: an agent's model differs from the aggregator's")
    return models_equal


# --------------------------------------------------------------------------- the run


def _train(
    harness: FleetHarness,
    book: RunBook,
    method: Method,
    *,
    max_rounds: int,
    eval_every: int,
    progress: ProgressFn | None,
) -> tuple[int, str, float]:
    """Rounds until a stop reason; returns (last round k, stop reason, f(x_k))."""
    problem, engine, clock = book.problem, harness.engine, harness.clock
    k = 0
    while True:
        harness.deliver()
        book.record_cost(clock.now)
        silence_before = [a.ledger.silence_s for a in harness.agents]
        book.record_gradients()
        done = _updates_of_round(harness, k)
        # minibatch losses are not f_i(x_k): evaluate the objective on all the data
        stochastic = harness.engine.config.batch_size is not None
        f_k = (
            problem.model.loss(engine.broadcast_model, problem.data)
            if stochastic
            else book.objective(done)
        )
        if k == 0 or (eval_every > 0 and k % eval_every == 0):
            _check_objective(problem, engine.broadcast_model, f_k, k)
        sub = book.observe(k, f_k)
        if progress is not None:
            progress(k, sub)
        reason = book.stop_reason(sub, k, max_rounds)
        if reason is not None:
            return k, reason, f_k
        book.add_round(done, problem.model.d, method.compressor)
        # Lockstep rounds: the last update's arrival closes the round, the last reception
        # ends it; a radio's silence overlaps receptions where it physically can
        # (aggregator.sim.timing).
        agents = harness.agents
        added = [a.ledger.silence_s - s for a, s in zip(agents, silence_before, strict=True)]
        arrivals = uplink_arrivals([a.radio_free_at for a in agents], added)
        up_s = max(0.0, max(arrivals) - clock.now)
        clock.now += up_s
        book.up_wait_s += up_s
        sent_at = clock.now
        down_before = down_busy_s(agents)
        version = engine.version
        harness.pump(strict=True)
        if engine.version == version and engine.next_version_at > clock.now:
            clock.now = engine.next_version_at  # downlink caps: wait until every link is free
            harness.pump(strict=True)
        harness.deliver()
        busy = [a - b for a, b in zip(down_busy_s(agents), down_before, strict=True)]
        ends = reception_ends(clock.now, busy, [a.radio_free_at for a in agents],
                              [receives_while_silent(a.profile) for a in agents])  # fmt: skip
        ends = [
            max(end, own_delivered_at(engine, a, sent_at))
            for end, a in zip(ends, agents, strict=True)
        ]
        heard = clock.now + max(0.0, *busy)  # every reception over, had none waited
        done_at = max(clock.now, *ends)
        book.down_wait_s += min(heard, done_at) - sent_at
        book.up_wait_s += max(0.0, done_at - heard)  # class A members waiting for their silence
        clock.now = done_at
        if engine.version != version + 1:
            return k, f"engine stopped at version {engine.version}: {engine.finish_reason}", f_k
        k += 1


def own_delivered_at(engine: RoundEngine, agent: Agent, since: float) -> float:
    """When what was addressed to a group member alone after ``since`` has all reached it
    on its own unicast link (its last frame, under its network's daily cap); ``since``
    when nothing was (the engine paces that link without holding the versions)."""
    own = engine.traffic.own_free_at(agent.config.agent_id)
    return own - cap_spacing_s(agent.profile) if own > since else since


class _Events:
    """The event loop of a fleet at its own cadence: updates on air, each agent's reception."""

    def __init__(self, harness: FleetHarness) -> None:
        self.harness = harness
        self.on_air: list[tuple[float, int, Message]] = []  # (arrival, order, message)
        self.sent = 0
        #: local-training changes refused stale (their version closed while on air)
        self.stale = 0
        #: each agent's reception of everything published so far is over then
        self.ready_at = [0.0] * len(harness.agents)
        #: per agent, what it is receiving: (when its reception ends, the message), in order
        self.incoming: list[deque[tuple[float, Message]]] = [deque() for _ in harness.agents]

    def receive(self, now: float) -> None:
        """Every agent prices what was published as it goes on air and applies each message
        when its reception ends: after its downlink time (airtime received plus the
        senders' silence), one message after another, a class A member's not before its
        silence is over (timing), and a group member's own unicast messages not before
        their last frame arrived under its daily cap (the engine paces that link without
        holding the fleet's versions). A member thus holds each version when it has
        received it, and may answer it while the next one is still arriving."""
        engine = self.harness.engine
        for i, agent in enumerate(self.harness.agents):
            while (msg := agent.transport.recv(timeout_s=0)) is not None:
                cost = agent.price(msg)
                busy = cost.cost.airtime_s + cost.silence_s
                end = start = max(self.ready_at[i], now)
                if busy > 0.0:
                    end = reception_ends(start, [busy], [agent.radio_free_at],
                                         [receives_while_silent(agent.profile)])[0]  # fmt: skip
                if msg.topic == topics.to_agent(JOB, agent.config.agent_id):
                    end = max(end, own_delivered_at(engine, agent, now))
                self.ready_at[i] = end
                self.incoming[i].append((end, msg))
            self.deliver(i, agent, now)

    def deliver(self, i: int, agent: Agent, now: float | None) -> None:
        """``agent`` applies what it has received by ``now`` (None: everything)."""
        queue = self.incoming[i]
        while queue and (now is None or queue[0][0] <= now):
            agent.apply(queue.popleft()[1])

    def flush(self) -> None:
        """Every agent applies everything published (the end of a run)."""
        for i, agent in enumerate(self.harness.agents):
            self.deliver(i, agent, None)

    def may_send(self, agent: Agent, now: float) -> bool:
        """Due (a version it holds is not answered yet) and its radio free: it answers the
        version it holds, even while a newer one is arriving (it cannot know; the engine
        refuses a local change whose version closed meanwhile as ``stale``)."""
        return agent.due and now >= agent.radio_free_at

    def send(self, now: float) -> list[RoundLog]:
        """Every agent that may send does; its update goes on air."""
        logs: list[RoundLog] = []
        for agent in self.harness.agents:
            if not self.may_send(agent, now):
                continue
            entry = agent.step()
            if entry is None:
                continue
            logs.append(entry)
            for msg in self.harness.waiting():
                self.sent += 1
                heapq.heappush(self.on_air, (now + entry.airtime_s, self.sent, msg))
        return logs

    def arrive(self, now: float) -> None:
        """The engine handles what reached it by ``now``, then ticks. In a local-training
        job a change still on air when its version closed without it is ``stale`` (it was
        computed from that version's anchor): refused as the service refuses it, counted in
        :attr:`stale`, and its agent answers the next version when its radio is free again.
        Any other rejection is a bug."""
        local = self.harness.engine.config.local is not None
        while self.on_air and self.on_air[0][0] <= now:
            msg = heapq.heappop(self.on_air)[2]
            effects = self.harness.handle(msg)
            if local and effects.reason == "stale":
                self.stale += 1
            elif effects.reason is not None:
                raise RuntimeError(f"the engine rejected {msg.topic}: {effects.reason}")
        self.harness.pump(strict=True)

    def next_event(self, now: float) -> tuple[float, bool] | None:
        """The next time anything happens after ``now``, and whether the wait until then
        is a downlink's (None: nothing ever will)."""
        engine = self.harness.engine
        times: list[tuple[float, bool]] = []
        if self.on_air:
            times.append((self.on_air[0][0], False))
        for queue, agent in zip(self.incoming, self.harness.agents, strict=True):
            if queue:
                times.append((queue[0][0], True))
            if agent.due:
                times.append((agent.radio_free_at, False))
        if engine.next_version_at > now:
            times.append((engine.next_version_at, True))
        later = [(t, down) for t, down in times if t > now]
        if not later:
            return None
        at, down = min(later)
        return at, down or engine.hold(now) is not None


def _train_at_cadence(
    harness: FleetHarness, book: RunBook, method: Method, *, max_rounds: int,
    progress: ProgressFn | None,
) -> tuple[int, str, float]:  # fmt: skip
    """Events until a stop reason (see the module doc); returns (last version k, stop
    reason, f(x_k))."""
    problem, engine, clock = book.problem, harness.engine, harness.clock
    events = _Events(harness)
    k = -1
    while True:
        events.receive(clock.now)
        if engine.version != k:
            k = engine.version
            book.record_cost(clock.now, max(0.0, max(events.ready_at) - clock.now))
            book.record_gradients()
            f_k = problem.model.loss(engine.broadcast_model, problem.data)
            sub = book.observe(k, f_k)
            if progress is not None:
                progress(k, sub)
            reason = book.stop_reason(sub, k, max_rounds)
            if reason is None and engine.state == "finished":
                reason = f"engine stopped at version {k}: {engine.finish_reason}"
            if reason is not None:
                events.flush()  # every copy after its receptions (the run's end checks)
                return k, reason, f_k
            book.add_version()
        logs = events.send(clock.now)
        if logs:
            book.add_updates(logs, problem.model.d, method.compressor)
        nxt = events.next_event(clock.now)
        if nxt is None:
            raise RuntimeError(f"version {k}: no agent can send and nothing is on air")
        at, down = nxt
        if down:
            book.down_wait_s += at - clock.now
        else:
            book.up_wait_s += at - clock.now
        clock.now = at
        events.arrive(clock.now)
        book.stale_updates = events.stale


def run_method(
    problem: Problem,
    fleet: Fleet,
    method: Method,
    *,
    targets: Sequence[float],
    max_rounds: int,
    step_size: float | None = None,
    ef21_step_factor: float = 0.5,
    eval_every: int = 0,
    progress: ProgressFn | None = None,
    downlink: DownlinkMode = "exact",
    downlink_pacing: bool = True,
    aggregation: str = "mean",
    hostile: float | None = None,
    batch_size: float | None = None,
    schedule_t0: float = 0.0,
    sign_downlink: bool = False,
    cadence: bool = False,
    deadline_s: float = CADENCE_DEADLINE_S,
    snapshot_every: int | None = None,
    local: LocalConfig | None = None,
) -> RunResult:
    """Train ``method`` on ``fleet`` until the smallest target or ``max_rounds``.

    ``step_size`` None: the engine's rule (1/L from the hellos, times ``ef21_step_factor``
    for EF21). ``cadence``: on a fleet with duty-cycled radios, each agent sends when its
    radio allows and rounds do not wait for an EF21 member whose radio is not free before
    the round's ``deadline_s`` (see the module doc). ``eval_every`` > 0 adds full-data cross-checks of the objective every that
    many rounds; ``progress(k, subopt)`` is called once per round. Raises RuntimeError if
    the protocol misbehaves (a rejection, a model copy that drifts, a resend).
    """
    started = time.perf_counter()
    at_cadence = cadence and any(p.duty_cycle is not None for p in fleet.profiles)
    with open_fleet(
        problem,
        fleet,
        method,
        step_size=step_size,
        ef21_step_factor=ef21_step_factor,
        downlink=downlink,
        downlink_pacing=downlink_pacing,
        aggregation=aggregation,
        hostile=hostile,
        batch_size=batch_size,
        schedule_t0=schedule_t0,
        sign_downlink=sign_downlink,
        cadence=at_cadence,
        deadline_s=deadline_s if at_cadence else 1e18,
        snapshot_every=snapshot_every,
        local=local,
    ) as harness:
        harness.start()
        harness.pump(strict=True)
        harness.deliver()  # the answers to the hellos: the start, on both sides
        book = RunBook(problem, fleet, harness.agents, targets)
        book.charged_at_start = harness.engine.totals_down
        if method.compressor == "dense":
            book.price_dense_downlink(fleet, problem.model.d, JOB)
        if at_cadence:
            k, stop_reason, f_k = _train_at_cadence(
                harness, book, method, max_rounds=max_rounds, progress=progress
            )
        else:
            k, stop_reason, f_k = _train(harness, book, method, max_rounds=max_rounds,
                                         eval_every=eval_every, progress=progress)  # fmt: skip
        _check_objective(problem, harness.engine.broadcast_model, f_k, k)
        models_equal = _check_end(harness, book, method)
        engine = harness.engine
        group_of = {
            a.config.agent_id: None if info is None else engine.traffic.group_of(info)
            for a in harness.agents
            for info in (engine.registry.get(a.config.agent_id),)
        }
        # the law's time includes what the last messages owe (module doc): lockstep too, whose
        # clock stops before the last round's uplink (its updates are in the ledgers)
        owed = [a.radio_free_at for a in harness.agents]
        owed += [engine.traffic.free_at(a.config.agent_id) for a in harness.agents]
        elapsed_s = max(harness.clock.now, book.trace.sim_time_s[-1], engine.next_version_at, *owed)
        margins = audit(harness.agents, engine.traffic.groups, group_of, elapsed_s)
        return RunResult(
            method=method,
            fleet=fleet,
            trace=book.trace,
            reached=book.reached,
            rounds_run=k,
            stop_reason=stop_reason,
            selection_s=sum(a.timings_s["select"] for a in harness.agents),
            wall_s=time.perf_counter() - started,
            engine_version=harness.engine.version,
            models_equal=models_equal,
            step_size=harness.engine.gamma(),
            downlink=downlink,
            margins=tuple(margins),
            law_elapsed_s=elapsed_s,
            batch_size=batch_size,
            stale_updates=book.stale_updates,
            local=harness.engine.config.local is not None,
        )


__all__ = [
    "DEFAULT_TARGETS",
    "DIVERGED",
    "JOB",
    "METRICS",
    "RunResult",
    "Trace",
    "open_fleet",
    "run_method",
]
