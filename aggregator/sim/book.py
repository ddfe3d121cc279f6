"""The record of one simulated run: the per-round trace and the book that fills it.

:class:`RunBook` owns everything a run accumulates (the trace, the targets reached, the
running byte totals, the uplink and downlink waits, dense gradient descent's priced
downlink); aggregator.sim.experiment drives the engine and the agents and tells the book
what happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from aggregator.sim.problem import Fleet, Problem, nonzeros
from edge_agent.agent.loop import Agent, RoundLog
from edge_agent.links.cost import ZERO, Cost
from edge_agent.protocol.indexcode import index_bytes
from edge_agent.protocol.wire import encoded_size

#: The cost metrics summed over agents (the ledger's attribute names).
METRICS: Final[tuple[str, ...]] = ("bits", "packets", "airtime_s", "energy_j")
#: A run whose relative suboptimality exceeds this has diverged: it stops there.
DIVERGED: Final = 1e6


@dataclass
class Trace:
    """Per round k = 0..R: relative suboptimality at x_k and the cumulative update cost of
    the k rounds that produced x_k (metric -> list), plus bytes and the T sent."""

    subopt: list[float] = field(default_factory=list)
    cost: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in METRICS})
    bytes: list[int] = field(default_factory=list)
    bytes_fixed32: list[int] = field(default_factory=list)
    t_sum: list[int] = field(default_factory=list)
    sim_time_s: list[float] = field(default_factory=list)
    #: the part of ``sim_time_s`` spent waiting for uplinks (the slowest radio's airtime and
    #: duty-cycle silence) and for downlinks (pacing, then the slowest reception); the
    #: agents' compute takes no simulated time
    up_wait_s: list[float] = field(default_factory=list)
    down_wait_s: list[float] = field(default_factory=list)
    #: what the agents received up to x_k, snapshots included (a Cost per round)
    down: list[Cost] = field(default_factory=list)
    #: rows whose gradient the agents evaluated up to x_k (one full pass: every row once)
    grad_rows: list[int] = field(default_factory=list)
    #: what those gradient evaluations cost the agents, on their profiles' compute parts
    #: (0 for an agent whose profile has none: not modelled)
    compute_energy_j: list[float] = field(default_factory=list)


def _ledger_sum(agents: Sequence[Agent], metric: str) -> float:
    return sum(float(getattr(a.ledger, metric)) for a in agents)


def compute_energy_j(agents: Sequence[Agent]) -> float:
    """What the agents' gradient evaluations so far cost them (their profiles' compute
    parts): one evaluation per update sent, over ``gradient_rows`` rows, each row with its
    shard's mean nonzeros (exact for full passes; a minibatch's expectation)."""
    total = 0.0
    for a in agents:
        rows = a.gradient_rows
        entries = rows * nonzeros(a.data) / max(1, a.data.n_rows)
        total += a.profile.compute_energy_j(a.ledger.updates, rows, entries)
    return total


def control_messages(agents: Sequence[Agent]) -> list[int]:
    return [a.ledger.messages - a.ledger.updates for a in agents]


def down_busy_s(agents: Sequence[Agent]) -> list[float]:
    """Each agent's downlink time so far: airtime received plus the senders' silence."""
    return [a.ledger.down.airtime_s + a.ledger.sender_silence_s for a in agents]


def _bytes_of(logs: Sequence[RoundLog], d: int, compressor: str) -> tuple[int, int, int]:
    """Update bytes this round, the same with 32-bit indices instead of the index code, sum T."""
    size = sum(e.size_bytes for e in logs)
    ts = np.array([e.t for e in logs], dtype=np.int64)
    if compressor == "dense":
        return size, size, int(ts.sum())
    fixed = size - int(index_bytes(d, ts).sum()) + 4 * int(ts.sum())
    return size, fixed, int(ts.sum())


class RunBook:
    """The per-round record of one run: the trace, the targets reached, running totals."""

    def __init__(
        self, problem: Problem, fleet: Fleet, agents: Sequence[Agent], targets: Sequence[float]
    ) -> None:
        self.problem = problem
        self.agents = agents
        self.trace = Trace()
        self.reached: dict[float, int] = {}
        self.pending = sorted(set(targets), reverse=True)  # largest first
        self.base = {m: _ledger_sum(agents, m) for m in METRICS}  # control messages at start
        self.control = control_messages(agents)
        self.down_at_start = Cost.sum(a.ledger.down for a in agents)  # after harness.deliver
        self.charged_at_start = ZERO
        rows = np.array([s.n_rows for s in fleet.shards], dtype=np.float64)
        self.weights = rows / rows.sum()
        self.gap0 = problem.f0 - problem.f_star
        self.cum_bytes = self.cum_fixed = self.cum_t = 0
        self.up_wait_s = self.down_wait_s = 0.0
        #: local training at cadence: changes refused stale (aggregator.sim.experiment)
        self.stale_updates = 0
        #: dense gradient descent's downlink, priced as one float32 model change per agent
        #: per round (not what the relay would carry: d floats from every agent)
        self.dense_down: list[Cost] | None = None
        self.cum_dense_down = ZERO

    def price_dense_downlink(self, fleet: Fleet, d: int, job: str) -> None:
        size = int(encoded_size("dense", d=d, t=d, job=job, agent="r", round=0, seq=0))
        self.dense_down = [p.downlink_cost(size).cost for p in fleet.profiles]

    def record_cost(self, now: float, pending_down_s: float = 0.0) -> None:
        """Cost of the k rounds that produced x_k (before this round's updates);
        ``pending_down_s``: x_k reaches the last agent that much after ``now``."""
        now += pending_down_s
        tr = self.trace
        for m in METRICS:
            tr.cost[m].append(_ledger_sum(self.agents, m) - self.base[m])
        tr.bytes.append(self.cum_bytes)
        tr.bytes_fixed32.append(self.cum_fixed)
        tr.t_sum.append(self.cum_t)
        tr.sim_time_s.append(now)
        tr.up_wait_s.append(self.up_wait_s)
        tr.down_wait_s.append(self.down_wait_s + pending_down_s)
        received = Cost.sum(a.ledger.down for a in self.agents)
        if self.dense_down is None:
            tr.down.append(received)
        else:  # the start's snapshots as received, then one model change per round
            start = tr.down[0] if tr.down else received
            tr.down.append(start + self.cum_dense_down)

    def record_gradients(self) -> None:
        """The gradient rows evaluated up to x_k and their compute energy."""
        self.trace.grad_rows.append(sum(a.gradient_rows for a in self.agents))
        self.trace.compute_energy_j.append(compute_energy_j(self.agents))

    def objective(self, logs: Sequence[RoundLog]) -> float:
        """f(x_k): the shards' objectives weighted by their rows."""
        return float(np.dot(self.weights, [entry.loss for entry in logs]))

    def observe(self, k: int, f_k: float) -> float:
        """Record the relative suboptimality at x_k and the targets it reaches; return it."""
        sub = (f_k - self.problem.f_star) / self.gap0
        self.trace.subopt.append(sub)
        while self.pending and sub <= self.pending[0]:
            self.reached[self.pending.pop(0)] = k
        return sub

    def add_round(self, logs: Sequence[RoundLog], d: int, compressor: str) -> None:
        self.add_updates(logs, d, compressor)
        self.add_version()

    def add_updates(self, logs: Sequence[RoundLog], d: int, compressor: str) -> None:
        """Updates sent: their bytes, the same with 32-bit indices, their T."""
        b, b32, ts = _bytes_of(logs, d, compressor)
        self.cum_bytes += b
        self.cum_fixed += b32
        self.cum_t += ts

    def add_version(self) -> None:
        """One more version: dense gradient descent's downlink, priced per version."""
        if self.dense_down is not None:
            self.cum_dense_down = self.cum_dense_down + Cost.sum(self.dense_down)

    def stop_reason(self, sub: float, k: int, max_rounds: int) -> str | None:
        """Why the run stops after observing round k, or None to go on."""
        if not self.pending:
            return "reached every target"
        if not sub <= DIVERGED:
            return f"diverged (relative suboptimality {sub:.3g})"
        if k >= max_rounds:
            return f"max_rounds={max_rounds}"
        return None


__all__ = [
    "DIVERGED",
    "METRICS",
    "RunBook",
    "Trace",
    "compute_energy_j",
    "control_messages",
    "down_busy_s",
]
