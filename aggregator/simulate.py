"""``aggregator simulate``: N real agents and the real round engine over one ``memory://`` broker.

Nothing is written twice. Every agent is an :class:`edge_agent.agent.Agent` (its own data
shard, cost profile, policy for T, compressor, error feedback and cost ledger) and the
aggregator is a :class:`aggregator.rounds.RoundEngine`; they talk through a fresh in-process
broker (``memory://simulate-<random>``) exactly as they would over MQTT. The simulator only
pumps messages, synchronously and deterministically, one model version per round:

1. every agent takes the messages waiting in its inbox (:meth:`Agent.handle`);
2. every agent :meth:`Agent.step` s: gradient at its copy of ``x_k``, T, compress, encode,
   publish, account the cost in its ledger;
3. the engine handles the updates (``handle(topic, payload, now)`` with a simulated clock);
   the last one closes the round (``x_{k+1}``), and the engine's delta/snapshot messages are
   published to the agents.

Objective and targets
---------------------
``f(x_k)`` is *not* re-evaluated on the full data every round. Each agent's step already
computes its shard's objective ``f_i(x_k)`` (mean loss over its rows plus ``l2/2 |x|^2``) at
exactly the engine's ``x_k`` (the agent's copy is bit-identical), and
``f(x_k) = sum_i n_i f_i(x_k) / sum_i n_i`` holds exactly for the same model on the
union of the shards (the plain average when shards are equal). So the relative
suboptimality ``(f(x_k) - f*) / (f(x_0) - f*)`` is known at *every* round for free, and each
target is detected at the exact round. As a cross-check the full-data objective is computed
directly at round 0, at the last round and every ``--eval-every`` rounds (default 0: only
those two), and a mismatch beyond rounding raises. ``f*`` comes from
:func:`aggregator.optimum.solve_optimum` (L-BFGS, gradient tolerance 1e-12 by default).

What "cost to reach a target" means
-----------------------------------
For target ``eps``, the first ``k`` with relative suboptimality ``<= eps``; the cost is the sum
over agents of what their ledgers hold for the ``k`` update messages that produced ``x_k``
(bits, packets, airtime_s, energy_j, each agent priced by its own profile). Control messages
(hello, status, snapshot request: sent once at start, counted in the ledger as non-updates)
are excluded; a run checks that no control message was sent after the start.

Each method stops at ``--max-rounds`` or when the smallest target is reached. Wall-clock
timings (``selection_s``: the sum of the agents' ``timings_s["select"]``; ``wall_s``) are the
only fields of the JSON that differ between two runs with the same seed
(:data:`TIMING_FIELDS`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import numpy as np
import numpy.typing as npt

from aggregator.optimum import solve_optimum
from aggregator.rounds import EngineConfig, Outbound, RoundEngine
from edge_agent.agent import Agent, AgentConfig, FeedbackName, RoundLog
from edge_agent.compressors import COMPRESSOR_IDS
from edge_agent.data import SHARDINGS, Dataset, load_dataset, make_rcv1_like, split_shards
from edge_agent.errors import CatEdgeError
from edge_agent.indexcode import index_bytes
from edge_agent.models import MODELS, Model, make_model
from edge_agent.profiles import CostProfile, resolve_profile
from edge_agent.selection import parse_policy
from edge_agent.transports import Transport, open_transport, topics
from edge_agent.transports.memory import drop_broker

FloatArray = npt.NDArray[np.float64]

JOB: Final = "sim"
METRICS: Final[tuple[str, ...]] = ("bits", "packets", "airtime_s", "energy_j")
DEFAULT_TARGETS: Final[tuple[float, ...]] = (1e-1, 1e-2, 1e-3)
#: JSON fields measured on the wall clock: the only ones two same-seed runs disagree on.
TIMING_FIELDS: Final[tuple[str, ...]] = ("selection_s", "selection_s_per_round", "wall_s")
#: Relative tolerance of the full-data cross-check of the agents' objective.
_EVAL_RTOL: Final = 1e-9
#: A run whose relative suboptimality exceeds this has diverged: it stops there.
DIVERGED: Final = 1e6

# The paper preset (ALGORITHM.md, "Reproducing the paper's comparison").
PAPER_FEATURES: Final = 47_236
PAPER_ROWS: Final = 10_000
PAPER_L2: Final = 1e-3
#: Rounds per method: one agent (slow methods need thousands), ten agents (every plain
#: method stalls at its noise floor within a few hundred rounds; see docs/results.md).
PAPER_MAX_ROUNDS: Final[dict[int, int]] = {1: 4000, 10: 500}
PAPER_PROFILES: Final[tuple[str, ...]] = ("paper_payload_bits", "paper_packet_model")
PAPER_STATIC_T: Final[tuple[int, ...]] = (64, 256, 1024, 4096, 16384)
PAPER_METHODS: Final[tuple[str, ...]] = (
    "dense",
    *(f"topk:{t}" for t in PAPER_STATIC_T),
    "cat-topk",
    "cat-signtopk",
    "dynamic-signtopk",
    "hybrid-topk:200",
)
PAPER_FLEET_EXTRA: Final[tuple[str, ...]] = ("cat-topk+ef21", "cat-topk+ef")


# --------------------------------------------------------------------------- BLAS threads

_BLAS_PREFIXES: Final = ("scipy_openblas_", "openblas_")
_BLAS_SUFFIXES: Final = ("64_", "")


def _openblas() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    """(set_num_threads, get_num_threads) of the OpenBLAS numpy loaded, if we can find it.

    The simulator's vectors are small (d ~ 5e4): a multithreaded level-1 BLAS call (np.dot)
    then costs about 1 ms on a busy 2-core machine instead of about 5 us single-threaded,
    which made the simulator 5-10x slower. Linux only (it reads /proc/self/maps, as
    threadpoolctl does); elsewhere BLAS is left alone.
    """
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = sorted(
                {
                    line.split()[-1]
                    for line in maps
                    if "openblas" in line.lower() and line.split()[-1].startswith("/")
                }
            )
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _BLAS_PREFIXES:
            for suffix in _BLAS_SUFFIXES:
                setter = getattr(lib, f"{prefix}set_num_threads{suffix}", None)
                getter = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
                if setter is not None and getter is not None:
                    getter.restype = ctypes.c_int
                    return (lambda n, f=setter: f(int(n))), (lambda f=getter: int(f()))
    return None


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """OpenBLAS runs on one thread inside the block, as before after it (best effort)."""
    api = _openblas()
    before = api[1]() if api is not None else 0
    if api is not None:
        api[0](1)
    try:
        yield
    finally:
        if api is not None and before > 0:
            api[0](before)


# --------------------------------------------------------------------------- methods


@dataclass(frozen=True)
class Method:
    """One way of training: compressor, policy for T, error feedback (``spec`` as given)."""

    spec: str
    compressor: str
    policy: str
    feedback: FeedbackName


_FEEDBACKS: Final[dict[str, FeedbackName]] = {"": "none", "ef": "ef", "ef21": "ef21"}


def parse_method(spec: str) -> Method:
    """``dense`` | ``<compressor>:T`` (static T) | ``<policy>-<compressor>[:arg]``, + ``+ef|+ef21``.

    Policies: ``cat``, ``dynamic``, ``hybrid`` (``:S``, default 200), ``fixed`` (``:T``);
    compressors: ``topk``, ``signtopk``, ``randk`` (and ``dense``). Examples: ``topk:64``,
    ``cat-topk``, ``dynamic-signtopk``, ``hybrid-topk:200``, ``cat-topk+ef21``.
    """
    text = spec.strip()
    base, _, fb = text.partition("+")
    if fb not in _FEEDBACKS:
        raise ValueError(f"method {spec!r}: unknown error feedback '+{fb}'; use +ef or +ef21")
    feedback = _FEEDBACKS[fb]
    head, _, arg = base.partition(":")
    if head == "dense" and not arg:
        return Method(text, "dense", "cat", feedback)
    if head in COMPRESSOR_IDS and head != "dense":
        policy = f"fixed:{arg}"
        compressor = head
    else:
        pol, dash, compressor = head.partition("-")
        if not dash or compressor not in COMPRESSOR_IDS or compressor == "dense":
            raise ValueError(
                f"method {spec!r}: expected dense, <compressor>:T or <policy>-<compressor>[:arg] "
                f"with compressor in topk, signtopk, randk (e.g. cat-topk, hybrid-topk:200)"
            )
        policy = f"{pol}:{arg}" if arg else pol
    try:
        parse_policy(policy)
    except (ValueError, CatEdgeError) as exc:
        raise ValueError(f"method {spec!r}: {exc}") from None
    if compressor == "randk" and policy.partition(":")[0] in ("dynamic",):
        raise ValueError(f"method {spec!r}: the dynamic rule is defined for topk/signtopk")
    return Method(text, compressor, policy, feedback)


# --------------------------------------------------------------------------- problem


@dataclass(frozen=True)
class Problem:
    """The data, the model, and the reference values every method is measured against."""

    name: str
    model: Model
    data: Dataset
    f_star: float
    f0: float
    split: str
    seed: int


@dataclass(frozen=True)
class Fleet:
    """N agents: shards (equal sizes, +-1 row), their link profiles and local smoothness."""

    shards: tuple[Dataset, ...]
    profiles: tuple[CostProfile, ...]
    smoothness: tuple[float, ...]

    @property
    def agents(self) -> int:
        return len(self.shards)

    @property
    def profile_label(self) -> str:
        names = list(dict.fromkeys(p.name for p in self.profiles))
        return names[0] if len(names) == 1 else "mixed:" + ",".join(names)

    @property
    def label(self) -> str:
        return f"{self.agents} agent{'s' if self.agents != 1 else ''}, {self.profile_label}"


def build_problem(
    *,
    data_path: str | None,
    rows: int,
    features: int,
    seed: int,
    model_kind: str,
    l2: float,
    split: str,
    optimum_tol: float,
) -> Problem:
    """Load or generate the data, build the model, solve for ``f*``."""
    if data_path is not None:
        data = load_dataset(data_path)
        name = Path(data_path).name
    else:
        data = make_rcv1_like(rows, features, rng=np.random.default_rng(seed))
        name = f"rcv1-like(rows={rows}, d={features}, seed={seed})"
    n_classes = 2
    if model_kind == "softmax":
        labels = np.unique(data.y)
        if not np.array_equal(labels, np.arange(labels.size)):
            data = Dataset(data.X, np.searchsorted(labels, data.y).astype(np.float64))
        n_classes = max(2, int(labels.size))
    model = make_model(model_kind, n_features=data.n_features, n_classes=n_classes, l2=l2)
    _, f_star = solve_optimum(model, data, tol=optimum_tol, max_iter=20_000)
    f0 = model.loss(model.initial_point(), data)
    if not f0 > f_star:
        raise ValueError(f"f(x0) = {f0!r} is not above f* = {f_star!r}: nothing to optimise")
    return Problem(name, model, data, f_star, f0, split, seed)


def agent_seed(seed: int, index: int) -> int:
    """The seed of agent ``index`` (its AgentConfig.seed: RNG of randk and of its L estimate)."""
    return seed * 1_000_003 + index


def build_fleet(problem: Problem, agents: int, profile_names: Sequence[str]) -> Fleet:
    """Split the data into ``agents`` shards; profiles are cycled over the agents."""
    if agents < 1:
        raise ValueError(f"--agents must be >= 1, got {agents}")
    if not profile_names:
        raise ValueError("need at least one cost profile")
    cache = {name: resolve_profile(name) for name in dict.fromkeys(profile_names)}
    rng = np.random.default_rng([problem.seed, agents])
    shards = (
        split_shards(problem.data, agents, how=problem.split, rng=rng)
        if agents > 1
        else [problem.data]
    )
    profiles = tuple(cache[profile_names[i % len(profile_names)]] for i in range(agents))
    # The same estimate an Agent makes when it is not given one (same rng seed), computed
    # once per shard instead of once per method.
    smoothness = tuple(
        problem.model.smoothness(s, rng=np.random.default_rng(agent_seed(problem.seed, i)))
        for i, s in enumerate(shards)
    )
    return Fleet(tuple(shards), profiles, smoothness)


# --------------------------------------------------------------------------- one run


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


@dataclass
class RunResult:
    """One method on one fleet."""

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

    def records(self, targets: Sequence[float]) -> list[dict[str, Any]]:
        """One JSON record per target (null costs where the target was not reached)."""
        out: list[dict[str, Any]] = []
        tr = self.trace
        for eps in targets:
            k = self.reached.get(eps)
            rec: dict[str, Any] = {
                "method": self.method.spec,
                "target": eps,
                "rounds": k,
                **{m: (None if k is None else _num(tr.cost[m][k])) for m in METRICS},
                "bytes": None if k is None else tr.bytes[k],
                "bytes_fixed32_index": None if k is None else tr.bytes_fixed32[k],
                "mean_t": None if k is None or k == 0 else tr.t_sum[k] / (k * self.fleet.agents),
                "sim_time_s": None if k is None else tr.sim_time_s[k],
                "agents": self.fleet.agents,
                "profile": self.fleet.profile_label,
                "rows": sum(s.n_rows for s in self.fleet.shards),
                "d": self.fleet.shards[0].n_features,
                "rounds_run": self.rounds_run,
                "final_suboptimality": tr.subopt[-1],
                "stop_reason": self.stop_reason,
                "step_size": self.step_size,
                "models_equal": self.models_equal,
                "selection_s": self.selection_s,
                "selection_s_per_round": self.selection_s / max(1, self.rounds_run + 1),
                "wall_s": self.wall_s,
            }
            out.append(rec)
        return out


def _num(v: float) -> float | int:
    return int(v) if float(v).is_integer() and abs(v) < 2**53 else float(v)


class _Clock:
    """The simulated clock (seconds) handed to the agents and the engine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


ProgressFn = Callable[[int, float], None]


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
) -> RunResult:
    """Train ``method`` on ``fleet`` until the smallest target or ``max_rounds``."""
    started = time.perf_counter()
    model, n = problem.model, fleet.agents
    url = f"memory://simulate-{uuid.uuid4().hex}"
    broker = url.removeprefix("memory://")
    clock = _Clock()
    lookup = {p.name: p for p in fleet.profiles}
    engine = RoundEngine(
        EngineConfig(
            job=JOB,
            d=model.d,
            model=model.kind,
            step_size=step_size,
            ef21_step_factor=ef21_step_factor,
            min_agents=n,
            quorum_fraction=1.0,
            round_deadline_s=1e18,
            liveness_timeout_s=1e18,
        ),
        x0=model.initial_point(),
        profiles=lookup.get,
    )
    agg = open_transport(url, role="aggregator", client_id="aggregator")
    agents: list[Agent] = []
    try:
        agg.connect()
        for pattern in topics.agent_inbound(JOB):
            agg.subscribe(pattern)
        for i in range(n):
            aid = f"a{i:03d}"
            cfg = AgentConfig(
                job=JOB,
                agent_id=aid,
                compressor=method.compressor,
                policy=method.policy,
                feedback=method.feedback,
                seed=agent_seed(problem.seed, i),
                resend_s=None,
                duty_cycle="ignore",
            )
            agents.append(
                Agent(
                    cfg,
                    model=model,
                    data=fleet.shards[i],
                    profile=fleet.profiles[i],
                    transport=open_transport(url, role="agent", client_id=aid),
                    smoothness=fleet.smoothness[i],
                    clock=clock,
                )
            )
        for a in agents:
            a.start()
        _pump_engine(engine, agg, clock.now)
        control_messages = [a.ledger.messages - a.ledger.updates for a in agents]
        base = {m: sum(float(getattr(a.ledger, m)) for a in agents) for m in METRICS}
        rows = np.array([s.n_rows for s in fleet.shards], dtype=np.float64)
        weights = rows / rows.sum()
        gap0 = problem.f0 - problem.f_star
        trace = Trace()
        reached: dict[float, int] = {}
        pending = sorted(set(targets), reverse=True)
        cum_bytes = cum_fixed = cum_t = 0
        stop_reason = f"max_rounds={max_rounds}"
        k = 0
        while True:
            for a in agents:
                _deliver(a)
            # Cost of the k rounds that produced x_k (before this round's updates).
            for m in METRICS:
                trace.cost[m].append(sum(float(getattr(a.ledger, m)) for a in agents) - base[m])
            trace.bytes.append(cum_bytes)
            trace.bytes_fixed32.append(cum_fixed)
            trace.t_sum.append(cum_t)
            trace.sim_time_s.append(clock.now)
            radio_before = [a.ledger.airtime_s + a.ledger.silence_s for a in agents]
            logs = [a.step() for a in agents]
            if any(entry is None for entry in logs) or any(a.version != k for a in agents):
                raise RuntimeError(
                    f"round {k}: not every agent holds model version {k} "
                    f"(engine state {engine.state!r}: {engine.finish_reason})"
                )
            done = [entry for entry in logs if entry is not None]
            f_k = float(np.dot(weights, [entry.loss for entry in done]))
            if k == 0 or (eval_every > 0 and k % eval_every == 0):
                _check_objective(problem, engine.x, f_k, k)
            sub = (f_k - problem.f_star) / gap0
            trace.subopt.append(sub)
            while pending and sub <= pending[0]:  # targets sorted largest first
                reached[pending.pop(0)] = k
            if progress is not None:
                progress(k, sub)
            if not pending:
                stop_reason = "reached every target"
                break
            if not sub <= DIVERGED:
                stop_reason = f"diverged (relative suboptimality {sub:.3g})"
                break
            if k >= max_rounds:
                break
            b, b32, ts = _bytes_of(done, model.d, method.compressor)
            cum_bytes += b
            cum_fixed += b32
            cum_t += ts
            # Lockstep rounds: the slowest radio (airtime plus duty-cycle silence) sets the pace.
            clock.now += max(
                a.ledger.airtime_s + a.ledger.silence_s - before
                for a, before in zip(agents, radio_before, strict=True)
            )
            version = engine.version
            _pump_engine(engine, agg, clock.now)
            if engine.version != version + 1:
                stop_reason = f"engine stopped at version {engine.version}: {engine.finish_reason}"
                break
            k += 1
        _check_objective(problem, engine.x, f_k, k)
        after = [a.ledger.messages - a.ledger.updates for a in agents]
        if after != control_messages:
            raise RuntimeError("agents sent control messages after the start (resends?)")
        models_equal = all(a.x is not None and np.array_equal(a.x, engine.x) for a in agents)
        if not models_equal:  # the protocol guarantees bit-identical copies: never let drift pass
            raise RuntimeError(f"{method}: an agent's model differs from the aggregator's")
        return RunResult(
            method=method,
            fleet=fleet,
            trace=trace,
            reached=reached,
            rounds_run=k,
            stop_reason=stop_reason,
            selection_s=sum(a.timings_s["select"] for a in agents),
            wall_s=time.perf_counter() - started,
            engine_version=engine.version,
            models_equal=models_equal,
            step_size=engine.gamma(),
        )
    finally:
        for a in agents:
            a.transport.close()
        agg.close()
        drop_broker(broker)


def _deliver(agent: Agent) -> None:
    tr = agent.transport
    msg = tr.recv(timeout_s=0)
    while msg is not None:
        agent.handle(msg)
        msg = tr.recv(timeout_s=0)


def _publish(agg: Transport, out: Sequence[Outbound]) -> None:
    for o in out:
        agg.publish(o.topic, o.payload, retain=o.retain)


def _pump_engine(engine: RoundEngine, agg: Transport, now: float) -> None:
    """Hand every message waiting for the aggregator to the engine; publish what it returns."""
    msg = agg.recv(timeout_s=0)
    while msg is not None:
        eff = engine.handle(msg.topic, msg.payload, now)
        if eff.reason is not None:
            raise RuntimeError(f"the engine rejected a simulated message: {eff.reason}")
        _publish(agg, eff.outbound)
        msg = agg.recv(timeout_s=0)
    _publish(agg, engine.tick(now).outbound)


def _bytes_of(logs: Sequence[RoundLog], d: int, compressor: str) -> tuple[int, int, int]:
    """Update bytes this round, the same with 32-bit indices instead of the index code, sum T."""
    size = sum(e.size_bytes for e in logs)
    ts = np.array([e.t for e in logs], dtype=np.int64)
    if compressor == "dense":
        return size, size, int(ts.sum())
    fixed = size - int(index_bytes(d, ts).sum()) + 4 * int(ts.sum())
    return size, fixed, int(ts.sum())


def _check_objective(problem: Problem, x: FloatArray, f_agents: float, k: int) -> None:
    f_full = problem.model.loss(x, problem.data)
    if abs(f_full - f_agents) > _EVAL_RTOL * max(1.0, abs(f_full)):
        raise RuntimeError(
            f"round {k}: the agents' objective {f_agents!r} differs from the full-data "
            f"objective {f_full!r} (shards do not partition the data?)"
        )


# --------------------------------------------------------------------------- output


class ProgressBar:
    """A one-line text progress bar on a stream (stderr), redrawn at most every 0.2 s."""

    def __init__(self, stream: TextIO, total_runs: int, *, enabled: bool = True) -> None:
        self.stream = stream
        self.total = total_runs
        self.enabled = enabled
        self.index = 0
        self.label = ""
        self.max_rounds = 1
        self.goal = 1e-3
        self._last = 0.0

    def begin(self, label: str, max_rounds: int, goal: float) -> None:
        self.index += 1
        self.label, self.max_rounds, self.goal = label, max(1, max_rounds), goal
        self._last = 0.0
        self.update(0, 1.0)

    def update(self, k: int, subopt: float) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < 0.2:
            return
        self._last = now
        frac = k / self.max_rounds
        if 0 < subopt < 1:
            frac = max(frac, math.log(subopt) / math.log(self.goal))
        frac = min(1.0, max(0.0, frac))
        width = 24
        bar = "#" * round(frac * width)
        self.stream.write(
            f"\r[{self.index}/{self.total}] {self.label[:48]:<48} |{bar:<{width}}| "
            f"round {k:>6} subopt {subopt:9.3e}"
        )
        self.stream.flush()

    def end(self, result: RunResult) -> None:
        if not self.enabled:
            return
        self._last = 0.0
        self.update(result.rounds_run, result.trace.subopt[-1])
        self.stream.write(f"  {result.wall_s:6.1f}s\n")
        self.stream.flush()


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def summary_table(results: Sequence[RunResult], targets: Sequence[float]) -> str:
    """A plain-text table: one line per (fleet, method, target)."""
    cols = ("method", "target", "rounds", *METRICS, "final", "sel_ms/rnd")
    lines: list[str] = []
    fleets: dict[str, list[RunResult]] = {}
    for r in results:
        fleets.setdefault(r.fleet.label, []).append(r)
    for label, group in fleets.items():
        rows = [cols]
        for r in group:
            for rec in r.records(targets):
                rows.append(
                    (
                        rec["method"],
                        f"{rec['target']:g}",
                        _fmt(rec["rounds"]),
                        *(_fmt(rec[m]) for m in METRICS),
                        f"{rec['final_suboptimality']:.2e}",
                        f"{1e3 * rec['selection_s_per_round']:.3f}",
                    )
                )
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(cols))]
        lines.append(f"== {label}  (costs: sum over agents, update messages only)")
        for row in rows:
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        lines.append("")
    return "\n".join(lines)


def _metric_for(fleet: Fleet, override: str | None) -> str:
    if override is not None:
        return override
    objectives = {p.objective for p in fleet.profiles}
    return objectives.pop() if len(objectives) == 1 else "airtime_s"


def plot_results(
    results: Sequence[RunResult],
    path: str | Path,
    *,
    metric: str | None = None,
    targets: Sequence[float] = DEFAULT_TARGETS,
) -> None:
    """Suboptimality vs cumulative cost, one panel per fleet, one line per method (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fleets: dict[str, list[RunResult]] = {}
    for r in results:
        fleets.setdefault(r.fleet.label, []).append(r)
    n = len(fleets)
    ncols = 2 if n > 1 else 1
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7 * ncols, 5 * nrows), squeeze=False)
    for ax, (label, group) in zip(axes.flat, fleets.items(), strict=False):
        m = _metric_for(group[0].fleet, metric)
        colors = plt.get_cmap("tab20").colors  # type: ignore[attr-defined]
        for i, r in enumerate(group):
            cost = np.asarray(r.trace.cost[m], dtype=np.float64)
            sub = np.asarray(r.trace.subopt, dtype=np.float64)
            keep = _plot_points(cost.size)
            style = "--" if r.method.spec.startswith(("topk:", "signtopk:", "randk:")) else "-"
            ax.plot(
                cost[keep],
                sub[keep],
                style,
                color=colors[(2 * i) % 20 + (2 * i) // 20 % 2],
                label=r.method.spec,
                linewidth=1.2,
            )
        for eps in targets:
            ax.axhline(eps, color="grey", linewidth=0.5, linestyle=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"cumulative {m} (all agents, updates)")
        ax.set_ylabel("(f - f*) / (f(x0) - f*)")
        ax.set_title("\n".join(textwrap.wrap(label, 60)), fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_points(n: int, limit: int = 1500) -> npt.NDArray[np.int64]:
    """Indices 1..n-1 thinned log-uniformly (round 0 has zero cost: off a log axis)."""
    if n <= 1:
        return np.zeros(0, dtype=np.int64)
    if n - 1 <= limit:
        return np.arange(1, n, dtype=np.int64)
    return np.unique(np.geomspace(1, n - 1, num=limit).astype(np.int64))


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``aggregator simulate`` flags."""
    p = parser
    p.add_argument(
        "--preset",
        choices=["paper"],
        help="the protocol of ALGORITHM.md: fixes rows, features, model, l2, fleets, profiles, "
        "methods and round budgets (--data, --seed, --targets, --step-size and outputs still apply)",
    )
    d = p.add_argument_group("data and model")
    d.add_argument("--data", metavar="FILE", help="LIBSVM or .npz file (default: generated)")
    d.add_argument("--rows", type=int, default=2000, help="rows of the generated RCV1-like set")
    d.add_argument("--features", type=int, default=47_236, help="features of the generated set")
    d.add_argument("--seed", type=int, default=0, help="data, shards and agents' random choices")
    d.add_argument("--model", default="logreg", choices=sorted(MODELS))
    d.add_argument("--l2", type=float, default=1e-3, help="l2 regularisation lambda")
    d.add_argument("--split", default="iid", choices=sorted(SHARDINGS), help="shard rule")
    f = p.add_argument_group("fleet and methods")
    f.add_argument("--agents", type=int, default=1, help="number of agents (equal shards)")
    f.add_argument("--profile", default="paper_payload_bits", help="cost profile of every agent")
    f.add_argument("--profiles", help="comma list of profiles cycled over the agents")
    f.add_argument(
        "--methods",
        default="dense,cat-topk",
        help="comma list: dense, topk:T, cat-topk, cat-signtopk, dynamic-signtopk, cat-randk, "
        "hybrid-topk:S, each optionally +ef or +ef21",
    )
    f.add_argument(
        "--step-size",
        type=float,
        help="aggregator step for every method (default: the engine's, 1/L from the hellos, "
        "times --ef21-step-factor for +ef21 methods)",
    )
    f.add_argument(
        "--ef21-step-factor",
        type=float,
        default=0.5,
        help="EF21 methods step with factor/L unless --step-size is given (AGG_EF21_STEP_FACTOR)",
    )
    r = p.add_argument_group("stopping and evaluation")
    r.add_argument("--max-rounds", type=int, default=2000, help="rounds per method at most")
    r.add_argument(
        "--targets",
        default=",".join(f"{t:g}" for t in DEFAULT_TARGETS),
        help="relative suboptimality targets",
    )
    r.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="also evaluate f on the full data every K rounds as a cross-check (0: first "
        "and last round only; targets use the agents' exact per-round objectives anyway)",
    )
    r.add_argument("--optimum-tol", type=float, default=1e-12, help="L-BFGS tolerance for f*")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="FILE", help="write the per-(method, target) records")
    o.add_argument("--plot", metavar="FILE.png", help="plot suboptimality vs cumulative cost")
    o.add_argument("--plot-metric", choices=METRICS, help="x axis (default: profile objective)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


@dataclass(frozen=True)
class Plan:
    """What to run: the problem's parameters and a list of cases."""

    rows: int
    features: int
    l2: float
    model: str
    cases: tuple[Case, ...]


@dataclass(frozen=True)
class Case:
    """A fleet (agents, profile names cycled over them), its methods and round budget."""

    agents: int
    profiles: tuple[str, ...]
    methods: tuple[Method, ...]
    max_rounds: int


def make_plan(args: argparse.Namespace) -> Plan:
    if args.preset == "paper":
        cases = []
        for agents, max_rounds in PAPER_MAX_ROUNDS.items():
            specs = PAPER_METHODS + (PAPER_FLEET_EXTRA if agents > 1 else ())
            parsed = tuple(parse_method(m) for m in specs)
            for prof in PAPER_PROFILES:
                cases.append(Case(agents, (prof,), parsed, max_rounds))
        return Plan(
            rows=PAPER_ROWS,
            features=PAPER_FEATURES,
            l2=PAPER_L2,
            model="logreg",
            cases=tuple(cases),
        )
    profiles = tuple(s.strip() for s in (args.profiles or args.profile).split(",") if s.strip())
    methods = tuple(parse_method(m) for m in args.methods.split(",") if m.strip())
    if not methods:
        raise ValueError("--methods is empty")
    return Plan(
        rows=args.rows,
        features=args.features,
        l2=args.l2,
        model=args.model,
        cases=(Case(args.agents, profiles, methods, args.max_rounds),),
    )


def _targets(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(sorted({float(t) for t in text.split(",") if t.strip()}, reverse=True))
    except ValueError:
        raise ValueError(f"--targets: expected a comma list of numbers, got {text!r}") from None
    if not vals or any(not 0 < v < 1 for v in vals):
        raise ValueError(f"--targets must lie in (0, 1), got {text!r}")
    return vals


def run(args: argparse.Namespace) -> int:
    """Run the simulation described by parsed ``args``; 0 on success, 2 on bad input."""
    with single_threaded_blas():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        targets = _targets(args.targets)
        plan = make_plan(args)
        if any(c.max_rounds < 1 for c in plan.cases):
            raise ValueError(f"--max-rounds must be >= 1, got {args.max_rounds}")
        if args.eval_every < 0:
            raise ValueError(f"--eval-every must be >= 0, got {args.eval_every}")
        problem = build_problem(
            data_path=args.data,
            rows=plan.rows,
            features=plan.features,
            seed=args.seed,
            model_kind=plan.model,
            l2=plan.l2,
            split=args.split,
            optimum_tol=args.optimum_tol,
        )
        fleets = [(build_fleet(problem, c.agents, c.profiles), c) for c in plan.cases]
    except (ValueError, CatEdgeError, OSError) as exc:
        print(f"aggregator simulate: {exc}", file=sys.stderr)
        return 2
    bar = ProgressBar(
        sys.stderr, sum(len(c.methods) for _, c in fleets), enabled=not args.no_progress
    )
    print(
        f"# {problem.name}: {problem.data.n_rows} rows, d={problem.model.d}, "
        f"{problem.model.kind} l2={problem.model.l2:g}; f*={problem.f_star:.12g}, "
        f"f(x0)={problem.f0:.12g}",
        flush=True,
    )
    results: list[RunResult] = []
    for fleet, case in fleets:
        for method in case.methods:
            bar.begin(f"{fleet.label}: {method.spec}", case.max_rounds, min(targets))
            res = run_method(
                problem,
                fleet,
                method,
                targets=targets,
                max_rounds=case.max_rounds,
                step_size=args.step_size,
                ef21_step_factor=args.ef21_step_factor,
                eval_every=args.eval_every,
                progress=bar.update,
            )
            bar.end(res)
            results.append(res)
    print(summary_table(results, targets), flush=True)
    if args.json:
        records = [rec for r in results for rec in r.records(targets)]
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    if args.plot:
        plot_results(results, args.plot, metric=args.plot_metric, targets=targets)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m aggregator.simulate ...`` and ``aggregator simulate ...``."""
    parser = argparse.ArgumentParser(
        prog="aggregator simulate",
        description="Run N real agents and the real round engine in-process over memory:// "
        "and report the communication each method needs to reach each suboptimality target.",
    )
    add_arguments(parser)
    return run(parser.parse_args(None if argv is None else list(argv)))


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "DEFAULT_TARGETS",
    "METRICS",
    "TIMING_FIELDS",
    "Fleet",
    "Method",
    "Problem",
    "RunResult",
    "add_arguments",
    "build_fleet",
    "build_problem",
    "main",
    "parse_method",
    "plot_results",
    "run",
    "run_method",
]
