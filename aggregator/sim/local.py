"""``aggregator simulate --local-steps H``: local training (LoCoDL) with CAT both ways.

This path does **not** run the round engine or real agents: the engine steps once per
gradient and has no local-training semantics yet. It runs the method of
:mod:`edge_agent.numerics.local` with an explicit in-process aggregator (the ``dbar``, the
downlink memory ``e`` and the anchor of that module), on the same problem and fleet as the
engine path, and prices every message exactly as the wire would carry it:

* uplink: agent i's update ``d_i`` (the method's compressor and policy, CAT by default,
  on the vector ``x_i - y`` that travels), ``encoded_size`` of that update, on agent i's
  profile (``message_cost``);
* downlink: one job-wide sign-top-T message of the compressed broadcast ``dt``, T chosen
  by CAT on the fleet's receiving cost (every agent's ``downlink_objective_cost``
  relative to its cost of a dense float32 broadcast, as the engine's ``cat`` downlink
  does), charged to every agent (``receive_cost``: a ``--multicast`` group's member pays
  its reception of the group's one delivery, every other agent its unicast
  ``downlink_cost``); with ``--methods dense`` the broadcast is a dense float32 vector.

Time is lockstep, as the engine path's (aggregator.sim.experiment): a round waits for the
slowest uplink (airtime plus duty-cycle silence); its broadcast goes out once every agent's
downlink is free again (downlink pacing, ``AGG_DOWNLINK_PACING``: each message keeps a
link busy for :func:`~aggregator.engine.downlink.broadcast.downlink_interval_s`, its airtime
plus the sender's silence or its share of the network's daily cap, and a ``--multicast``
group's shared downlink for :func:`~aggregator.engine.downlink.broadcast.shared_limit`;
off with ``--no-downlink-pacing``), then the slowest reception (airtime plus the sender's
silence; a group member's is the group's busy time);
computing takes no time. Gradient evaluations are counted per agent, with the passes over
its shard they make (a full gradient is one; ``--batch-size b``, a fraction 1/k, makes
every local step one minibatch of a random reshuffling, b of a pass), and priced on each
agent's profile's compute part (``compute_energy_j``, 0 where the profile has none).
``--preset paper`` never takes this path.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from aggregator.engine.downlink.broadcast import downlink_interval_s, shared_limit
from aggregator.sim.methods import Method
from aggregator.sim.problem import Fleet, Problem, agent_seed, nonzeros
from edge_agent.links.cost import MessageCost
from edge_agent.links.profiles import CostProfile
from edge_agent.numerics.compressors import Update, compress
from edge_agent.numerics.local import (
    DEFAULT_ANCHOR,
    DEFAULT_CHI,
    DEFAULT_RHO,
    LOCAL_METHODS,
    Compress,
    LocalConfig,
    LocalMethod,
    LocalTraining,
    Schedule,
    check_passes,
    validate,
)
from edge_agent.numerics.sampling import PassSampler
from edge_agent.numerics.selection import make_price, parse_policy, select
from edge_agent.protocol.wire import encoded_size

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

JOB: Final = "sim"
DIVERGED: Final = 1e6
#: the engine-path flags this path cannot honour (flag -> the value that means "unused")
_UNSUPPORTED: Final[tuple[tuple[str, str, object], ...]] = (
    ("cadence", "--cadence", False),
    ("hostile", "--hostile", None),
    ("aggregation", "--aggregation", "mean"),
    ("sign_downlink", "--sign-downlink", False),
    ("step_size", "--step-size", None),
)


def add_local_arguments(p: argparse.ArgumentParser) -> None:
    """The local-training flags of ``aggregator simulate``."""
    g = p.add_argument_group("local training (LoCoDL, docs/algorithm.md 'Local training')")
    g.add_argument(
        "--local-steps",
        type=int,
        metavar="H",
        help="local gradient steps per communication; runs the methods under LoCoDL with "
        "an in-process aggregator (with --local-engine: the real engine). Default: one "
        "message per gradient",
    )
    g.add_argument(
        "--comm-prob",
        type=float,
        metavar="P",
        help="local training with Scaffnew/ProxSkip's coin instead of every H-th step "
        "(--local-steps is then not needed: H plays no part): in process, a coin after "
        "each step; with --local-engine, each round's count drawn by the aggregator and "
        "announced with the broadcast, as AGG_COMM_PROB does",
    )
    g.add_argument(
        "--local-step-factor",
        type=float,
        help="local step gamma = factor / L (default: min(1, 2/H), tuned on the preset class)",
    )
    g.add_argument("--local-chi", type=float, default=DEFAULT_CHI, help="LoCoDL's chi")
    g.add_argument("--local-rho", type=float, default=DEFAULT_RHO, help="LoCoDL's rho")
    g.add_argument(
        "--local-anchor",
        type=float,
        default=DEFAULT_ANCHOR,
        help="the anchor's weight in the consensus relative to all the agents' (LoCoDL: 1)",
    )
    g.add_argument(
        "--local-method",
        default="locodl",
        choices=LOCAL_METHODS,
        help="locodl (any compressor) or scaffnew (dense only)",
    )
    g.add_argument(
        "--local-engine",
        action="store_true",
        help="run local training through the real round engine and agents, as the service "
        "does (AGG_LOCAL_STEPS or AGG_COMM_PROB, edge-agent run --local-steps or "
        "--comm-prob): a = 1, LoCoDL, sparse compressors; the engine path's table and JSON",
    )


def local_config(args: argparse.Namespace) -> LocalConfig | None:
    """The run's LocalConfig, None without ``--local-steps``/``--comm-prob``; ValueError
    naming the flag for what this path refuses."""
    if args.local_steps is None and args.comm_prob is None:
        return None
    if args.preset is not None:
        raise ValueError("--local-steps: not with --preset paper (the preset is unchanged)")
    engine = bool(getattr(args, "local_engine", False))
    for attr, flag, unused in _UNSUPPORTED:
        if attr == "cadence" and engine:
            continue  # the real engine runs local jobs at cadence (aggregator.engine.cadence)
        if getattr(args, attr, unused) != unused:
            raise ValueError(f"--local-steps: {flag} is not supported with local training")
    if args.downlink not in (None, "cat"):
        raise ValueError(
            "--local-steps: --downlink must be cat (compressed broadcast with error memory)"
        )
    if args.batch_size is not None and args.local_steps is not None:
        check_passes(args.local_steps, args.batch_size, comm_prob=args.comm_prob)
    method: LocalMethod = args.local_method
    if getattr(args, "local_engine", False) and (args.local_anchor != 1.0 or method != "locodl"):
        raise ValueError(
            "--local-engine: the engine runs LoCoDL with a = 1 "
            "(no --local-anchor or --local-method scaffnew)"
        )
    return LocalConfig(
        local_steps=1 if args.local_steps is None else args.local_steps,
        comm_prob=args.comm_prob,
        step_factor=args.local_step_factor,
        chi=args.local_chi,
        rho=args.local_rho,
        method=method,
        anchor=args.local_anchor,
        batch_size=args.batch_size,
    )


def check_method(method: Method, cfg: LocalConfig) -> None:
    """ValueError for a method the local path cannot run."""
    if method.feedback != "none" or method.curvature != "global":
        raise ValueError(
            f"--local-steps: method {method.spec!r}: LoCoDL carries its own control variates; "
            "drop +ef/+ef21/+dir (e.g. cat-signtopk)"
        )
    if method.compressor == "randk":
        raise ValueError(f"--local-steps: method {method.spec!r}: randk is not supported here")
    validate(cfg, uplink=method.compressor, downlink=_downlink_of(method))


def _downlink_of(method: Method) -> str:
    return "dense" if method.compressor == "dense" else "signtopk"


# --------------------------------------------------------------------------- results


@dataclass
class LocalTrace:
    """Per round k = 0..R (R communications): relative suboptimality at the anchor and the
    cumulative cost of the k rounds that produced it (sums over agents)."""

    subopt: list[float] = field(default_factory=list)
    grad_evals: list[int] = field(default_factory=list)  # local steps, per agent
    passes: list[float] = field(default_factory=list)  # rows evaluated / shard rows, per agent
    up_bytes: list[int] = field(default_factory=list)
    down_bytes: list[int] = field(default_factory=list)
    energy_j: list[float] = field(default_factory=list)  # radio, up + down
    compute_energy_j: list[float] = field(default_factory=list)  # gradient evaluations
    time_s: list[float] = field(default_factory=list)
    t_up: list[int] = field(default_factory=list)  # sum of T sent up, this round
    t_down: list[int] = field(default_factory=list)


@dataclass
class LocalResult:
    """One method under local training on one fleet."""

    method: Method
    fleet: Fleet
    cfg: LocalConfig
    split: str
    trace: LocalTrace
    reached: dict[float, int]
    stop_reason: str
    gamma: float
    wall_s: float

    @property
    def label(self) -> str:
        c = self.cfg
        sched = f"p={c.comm_prob:g}" if c.comm_prob is not None else f"H={c.local_steps}"
        batch = "" if c.batch_size is None else f" b={c.batch_size:g}"
        return (f"{self.method.spec} {sched}{batch} gL={c.factor:.3g} chi={c.chi:g} "
                f"rho={c.rho:g} a={c.anchor:g}")  # fmt: skip


# --------------------------------------------------------------------------- pricing


def _up_compressor(
    method: Method, profile: CostProfile, d: int, agent: str
) -> Callable[[int, FloatArray], tuple[Update, int]]:
    policy = parse_policy(method.policy)

    def run(k: int, vec: FloatArray) -> tuple[Update, int]:
        if method.compressor == "dense":
            upd = compress(vec, "dense", d)
        else:
            price = make_price(profile, method.compressor, d=d, job=JOB, agent=agent,
                               round=k, seq=k)  # fmt: skip
            chosen = policy.choose(vec, method.compressor, price, k)
            order = chosen.indices if chosen.indices is not None else None
            if order is not None and order.size != chosen.t:
                order = None
            upd = compress(vec, method.compressor, chosen.t, order=order)
        size = int(encoded_size(upd.compressor, d=d, t=upd.t, job=JOB, agent=agent,
                                round=k, seq=k))  # fmt: skip
        return upd, size

    return run


def _down_size(d: int, t: int | IntArray, k: int) -> int | IntArray:
    return encoded_size("signtopk", d=d, t=t, job=JOB, agent="r", round=k, seq=0)


def _down_compressor(fleet: Fleet, d: int) -> Callable[[int, FloatArray], Update]:
    """Sign-top-T of the broadcast, T by CAT on the fleet's relative receiving cost."""
    dense = np.array(
        [int(encoded_size("dense", d=d, t=d, job=JOB, agent="r", round=0, seq=0))],
        dtype=np.int64,
    )
    refs = [(p, float(p.downlink_objective_cost(dense)[0])) for p in fleet.profiles]
    refs = [(p, r) for p, r in refs if r > 0]

    def run(k: int, vec: FloatArray) -> Update:
        def price(t: IntArray) -> FloatArray:
            sizes = np.asarray(_down_size(d, t, k), dtype=np.int64)
            total = np.zeros(sizes.shape)
            for p, ref in refs:
                total += p.downlink_objective_cost(sizes) / ref
            return total if total.any() else sizes.astype(np.float64)

        if not vec.any():
            return compress(vec, "signtopk", 0)
        chosen = select(vec, "signtopk", price)
        return compress(vec, "signtopk", chosen.t, order=chosen.indices)

    return run


def _slowest(costs: Sequence[MessageCost]) -> float:
    return max(c.airtime_s + c.silence_s for c in costs)


# --------------------------------------------------------------------------- the run


class _Ledger:
    """Running totals of one run, appended to the trace once per round; ``pacing``: the
    broadcast waits until every agent's downlink is free again (the engine's pacing)."""

    def __init__(self, fleet: Fleet, *, pacing: bool = True) -> None:
        self.fleet, self.pacing = fleet, pacing
        self.up_bytes = self.down_bytes = 0
        self.energy_j = self.time_s = 0.0
        self.t_up = self.t_down = 0
        #: when each downlink is free again: an agent's unicast link, or a shared group's
        self.free_at: dict[str, float] = {}
        rows = [s.n_rows for s in fleet.shards]
        #: one full gradient per agent: (evaluations, rows, nonzeros) per evaluation
        self._per_eval = [(1, r, nonzeros(s)) for r, s in zip(rows, fleet.shards, strict=True)]

    def add(self, ups: Sequence[tuple[Update, int]], down_size: int) -> None:
        fleet = self.fleet
        up_costs = [p.message_cost(s) for p, (_, s) in zip(fleet.profiles, ups, strict=True)]
        down_costs = [p.receive_cost(down_size, job_wide=True) for p in fleet.profiles]
        self.up_bytes += sum(s for _, s in ups)
        self.down_bytes += down_size * fleet.agents
        self.energy_j += sum(c.energy_j for c in up_costs) + sum(c.energy_j for c in down_costs)
        self.time_s += _slowest(up_costs)
        if self.pacing:  # the version closes once every link is free, then occupies them
            self.time_s = max([self.time_s, *self.free_at.values()])
            for key, interval in self._intervals(down_size).items():
                self.free_at[key] = max(self.time_s, self.free_at.get(key, 0.0)) + interval
        self.time_s += _slowest(down_costs)
        self.t_up = sum(u.t for u, _ in ups)

    def _intervals(self, size: int) -> dict[str, float]:
        """How long one broadcast of ``size`` bytes keeps each downlink busy: a shared
        group's once (its own law), every other agent's unicast link (the engine's)."""
        out: dict[str, float] = {}
        for i, p in enumerate(self.fleet.profiles):
            shared = p.shared_downlink
            if shared is None:
                out[f"a{i:03d}"] = downlink_interval_s(p, size)
            else:
                out["@" + shared.group] = shared_limit(shared, size)[0]
        return out

    def compute_energy_j(self, evals: int, passes: float) -> float:
        """What ``evals`` gradient evaluations per agent, over ``passes`` shards' worth of
        rows, cost the fleet (profiles' compute parts)."""
        return sum(p.compute_energy_j(evals * e, passes * r, passes * z)
                   for p, (e, r, z) in zip(self.fleet.profiles, self._per_eval, strict=True))  # fmt: skip

    def record(self, tr: LocalTrace, grad_evals: int, passes: float) -> None:
        tr.compute_energy_j.append(self.compute_energy_j(grad_evals, passes))
        tr.grad_evals.append(grad_evals)
        tr.passes.append(passes)
        tr.up_bytes.append(self.up_bytes)
        tr.down_bytes.append(self.down_bytes)
        tr.energy_j.append(self.energy_j)
        tr.time_s.append(self.time_s)
        tr.t_up.append(self.t_up)
        tr.t_down.append(self.t_down)


def run_local(
    problem: Problem,
    fleet: Fleet,
    method: Method,
    cfg: LocalConfig,
    *,
    targets: Sequence[float],
    max_rounds: int,
    progress: Callable[[int, float], None] | None = None,
    downlink_pacing: bool = True,
) -> LocalResult:
    """Train ``method`` under local training until the smallest target, divergence or
    ``max_rounds`` communications; ``downlink_pacing``: as ``AGG_DOWNLINK_PACING``."""
    check_method(method, cfg)
    started = time.perf_counter()
    model, d, n = problem.model, problem.model.d, fleet.agents
    rows = np.array([s.n_rows for s in fleet.shards], dtype=np.float64)
    big_l = float(np.dot(rows, fleet.smoothness) / rows.sum())
    gamma = cfg.factor / big_l
    state = LocalTraining(cfg, model.initial_point(), n, gamma)
    schedule = Schedule(cfg, np.random.default_rng([problem.seed, n, 21]))
    ups = [_up_compressor(method, fleet.profiles[i], d, f"a{i:03d}") for i in range(n)]
    down = None if method.compressor == "dense" else _down_compressor(fleet, d)
    sent: list[tuple[Update, int]] = []

    def up_fn(i: int) -> Compress:
        def run(k: int, vec: FloatArray) -> Update:
            upd, size = ups[i](k, vec)
            sent.append((upd, size))
            return upd

        return run

    up_calls = [up_fn(i) for i in range(n)]
    trace, ledger = LocalTrace(), _Ledger(fleet, pacing=downlink_pacing)
    pending = sorted(set(targets), reverse=True)
    reached: dict[float, int] = {}
    gap0 = problem.f0 - problem.f_star

    batch = 1.0 if cfg.batch_size is None else cfg.batch_size
    samplers = _samplers(problem, fleet, cfg)

    def grad(i: int, x: FloatArray) -> FloatArray:
        shard = fleet.shards[i]
        return model.grad(x, shard if samplers is None else shard.take(samplers[i].next()))

    k = 0
    while True:
        sub = (model.loss(state.model, problem.data) - problem.f_star) / gap0
        trace.subopt.append(sub)
        ledger.record(trace, state.gradients // n, batch * (state.gradients // n))
        while pending and sub <= pending[0]:
            reached[pending.pop(0)] = k
        if progress is not None:
            progress(k, sub)
        reason = _stop(pending, sub, k, max_rounds)
        if reason is not None:
            break
        while True:
            state.local_step(grad)
            if schedule.communicate():
                break
        sent.clear()
        exchange = state.communicate(k, up_calls, down)
        if exchange.down is None:
            down_size = int(encoded_size("dense", d=d, t=d, job=JOB, agent="r", round=k, seq=0))
            ledger.t_down = d
        else:
            down_size = int(_down_size(d, exchange.down.t, k))
            ledger.t_down = exchange.down.t
        ledger.add(sent, down_size)
        k += 1
    return LocalResult(method, fleet, cfg, problem.split, trace, reached, reason, gamma,
                       time.perf_counter() - started)  # fmt: skip


def _samplers(problem: Problem, fleet: Fleet, cfg: LocalConfig) -> list[PassSampler] | None:
    """Every agent's minibatch sampler, seeded as the engine path's agent (its seed, stream
    1); None for full local gradients."""
    if cfg.batch_size is None:
        return None
    return [
        PassSampler.of(cfg.batch_size, s.n_rows, agent_seed(problem.seed, i))
        for i, s in enumerate(fleet.shards)
    ]


def _stop(pending: Sequence[float], sub: float, k: int, max_rounds: int) -> str | None:
    if not pending:
        return "reached every target"
    if not math.isfinite(sub) or sub > DIVERGED:
        return f"diverged (relative suboptimality {sub:.3g})"
    if k >= max_rounds:
        return f"max_rounds={max_rounds}"
    return None


def run_local_cases(
    problem: Problem,
    cases: Sequence[tuple[Fleet, Sequence[Method], int]],
    cfg: LocalConfig,
    targets: Sequence[float],
    *,
    downlink_pacing: bool = True,
) -> list[LocalResult]:
    """Every (fleet, methods, max_rounds) case under local training (ValueError: a
    refused method, before anything runs)."""
    for _, methods, _ in cases:
        for method in methods:
            check_method(method, cfg)
    results = [
        run_local(
            problem,
            fleet,
            method,
            cfg,
            targets=targets,
            max_rounds=max_rounds,
            downlink_pacing=downlink_pacing,
        )
        for fleet, methods, max_rounds in cases
        for method in methods
    ]
    return results


def local_records(results: Sequence[LocalResult], targets: Sequence[float]) -> list[dict[str, Any]]:
    """The JSON records of ``--json`` under local training: one per (run, target), with the
    table's fields in their units (bytes, J, s) and None where the target was not reached."""
    out: list[dict[str, Any]] = []
    for r in results:
        for eps in sorted(targets, reverse=True):
            k = r.reached.get(eps)
            rec: dict[str, Any] = {"method": r.label, "split": r.split, "agents": r.fleet.agents,
                                   "target": eps, "rounds": k, "stop_reason": r.stop_reason,
                                   "gamma": r.gamma, "wall_s": r.wall_s}  # fmt: skip
            if k is not None:
                tr = r.trace
                rec.update(grad_evals_per_agent=int(tr.grad_evals[k]),
                           grad_passes=float(tr.passes[k]),
                           up_bytes=int(tr.up_bytes[k]), down_bytes=int(tr.down_bytes[k]),
                           total_bytes=int(tr.up_bytes[k] + tr.down_bytes[k]),
                           energy_j=float(tr.energy_j[k]),
                           compute_energy_j=float(tr.compute_energy_j[k]),
                           sim_time_s=float(tr.time_s[k]))  # fmt: skip
            out.append(rec)
    return out


def local_table(results: Sequence[LocalResult], targets: Sequence[float]) -> str:
    """One line per (run, target): rounds, passes over its shard per agent, bytes both ways
    (sums over agents, and per agent), energy (radio both ways, compute, and both) and
    time to reach it."""
    head = (
        f"{'method':<46} {'split':<5} {'target':>6} {'rounds':>6} {'passes/agent':>12} "
        f"{'up kB':>9} {'down kB':>9} {'total kB':>9} {'kB/agent':>9} {'energy J':>9} "
        f"{'compute J':>9} {'device J':>9} {'time s':>9}"
    )
    lines = [
        "# local training (in-process aggregator, docs/algorithm.md); energy J: radio "
        "both ways, compute J: gradient evaluations, device J: both",
        head,
    ]
    missing = sorted({p.name for r in results for p in r.fleet.profiles if p.compute is None})
    if missing:
        lines.insert(1, f"# compute energy not modelled (0) for: {', '.join(missing)}")
    for r in results:
        for eps in sorted(targets, reverse=True):
            k = r.reached.get(eps)
            if k is None:
                lines.append(f"{r.label:<46} {r.split:<5} {eps:>6g} not reached ({r.stop_reason})")
                continue
            tr = r.trace
            up, dn = tr.up_bytes[k] / 1e3, tr.down_bytes[k] / 1e3
            lines.append(
                f"{r.label:<46} {r.split:<5} {eps:>6g} {k:>6} {tr.passes[k]:>12g} "
                f"{up:>9.1f} {dn:>9.1f} {up + dn:>9.1f} {(up + dn) / r.fleet.agents:>9.2f} "
                f"{tr.energy_j[k]:>9.3g} {tr.compute_energy_j[k]:>9.3g} "
                f"{tr.energy_j[k] + tr.compute_energy_j[k]:>9.3g} {tr.time_s[k]:>9.3g}"
            )
    return "\n".join(lines)


__all__ = [
    "LocalResult",
    "LocalTrace",
    "add_local_arguments",
    "check_method",
    "local_config",
    "local_records",
    "local_table",
    "run_local",
    "run_local_cases",
]
