"""Downlink: one agent's time to decode and apply a round's broadcast, against its own
select + compress + encode time for its update, both measured in the same run.

    python benchmarks/downlink.py [--quick] [--agents 10,100] [--modes exact,cat]
                                  [--methods cat-signtopk+ef21,cat-topk]

A real :class:`aggregator.engine.rounds.RoundEngine` and N real agents
(:class:`aggregator.sim.harness.FleetHarness`, set up exactly as ``aggregator simulate``
sets up a fleet) train logistic regression (l2 1e-3) on an RCV1-like set (d = 47,236;
``--rows-per-agent`` rows per shard, at most ``--max-rows`` in all). Profiles are the mixed
fleet of docs/results.md, cycled. After ``--warmup`` rounds, for ``--rounds`` rounds, agent 0
(the *probe*) is measured:

* ``uplink_ms``: its select (make_price + the policy's choice of T), compress and encode of
  the update it is about to send, the same calls as :meth:`edge_agent.agent.loop.Agent.step` on
  the same vector, repeated ``--repeats`` times (median); ``agent_own_ms``: the same stages
  from the agent's own ``timings_s`` for the one real call (a cross-check), and its
  gradient time for context.
* ``downlink_ms``: :func:`edge_agent.protocol.downlink.decode_downlink` of the round's broadcast and
  :meth:`edge_agent.agent.replica.Replica.apply` of it to a *copy* of the probe's replica (copied
  outside the timing), ``--repeats`` times (median); the copy must equal the probe's model
  after the probe handles the same message, bit for bit.

One JSON line per (method, downlink mode, N): medians over the measured rounds, ``ratio`` =
downlink / uplink (``target`` 1.0: the issue asks for no more), ``over_target_pct`` (how
far above it, 0 when met), ``ratio_per_round`` (its smallest and largest round), the
broadcast's ``kind``, ``bytes`` and ``indices`` (entries it carries: the relayed updates'
T summed, or a delta's changed entries). Where decode's time goes: ``index_decode_ms``
(the same index blocks decoded alone, one ``decode_indices`` call each) and
``decode_ns_per_index``. Ratios, not absolute times: both sides are measured in the same
run on the same machine.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, cast

import numpy as np
import numpy.typing as npt
from _common import emit, environment, parser

from aggregator.engine.downlink.broadcast import DOWNLINK_MODES, DownlinkMode
from aggregator.sim.experiment import open_fleet
from aggregator.sim.harness import FleetHarness
from aggregator.sim.methods import Method, parse_method
from aggregator.sim.problem import Problem, build_fleet
from edge_agent.agent.loop import Agent
from edge_agent.agent.replica import Replica
from edge_agent.data import make_rcv1_like
from edge_agent.numerics.compressors import compress
from edge_agent.numerics.models import make_model
from edge_agent.numerics.selection import make_price
from edge_agent.protocol import topics
from edge_agent.protocol.downlink import Add, Move, Steps, decode_downlink
from edge_agent.protocol.indexcode import decode_indices, encode_indices
from edge_agent.protocol.wire import Delta, encode

BENCH: Final = "downlink"
PROFILES: Final = (
    "lorawan_eu868_dr5_sf7",
    "lorawan_eu868_dr0_sf12",
    "ble5_2m_dle_notify",
    "nbiot_udp_psm_rai",
)
STAGES: Final = ("select", "compress", "encode")
IntArray = npt.NDArray[np.int64]


@dataclass
class Samples:
    """Per measured round: the probe's uplink and downlink times (seconds) and the
    broadcast it received."""

    up: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STAGES})
    own: dict[str, list[float]] = field(default_factory=dict)
    decode: list[float] = field(default_factory=list)
    apply: list[float] = field(default_factory=list)
    down_total: list[float] = field(default_factory=list)
    up_total: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    ops: list[int] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)
    index_decode: list[float] = field(default_factory=list)
    update_bytes: list[int] = field(default_factory=list)


# ------------------------------------------------------------------ set-up


def make_problem(rows: int, d: int, seed: int) -> Problem:
    """The data and model of ``aggregator simulate`` (f* is not solved: nothing here
    measures suboptimality, so ``f_star``/``f0`` are NaN)."""
    data = make_rcv1_like(rows, d, rng=np.random.default_rng(seed))
    model = make_model("logreg", n_features=data.n_features, n_classes=2, l2=1e-3)
    name = f"rcv1-like(rows={rows}, d={d}, seed={seed})"
    return Problem(name, model, data, math.nan, math.nan, "iid", seed)


# ------------------------------------------------------------------ the two sides


def copy_replica(rep: Replica) -> Replica:
    """An independent copy (what the probe holds before the message)."""
    out = Replica(rep.d, rep.family)
    out.x = None if rep.x is None else rep.x.copy()
    out.version = rep.version
    out.aggregate = None if rep.aggregate is None else rep.aggregate.copy()
    return out


def time_downlink(probe: Agent, payload: bytes, repeats: int, s: Samples) -> Replica:
    """decode + apply ``payload`` to fresh copies of the probe's replica; the last copy."""
    dec, app, tot = [], [], []
    copy = copy_replica(probe.replica)
    for _ in range(repeats):
        copy = copy_replica(probe.replica)
        t0 = time.perf_counter()
        msg = decode_downlink(payload)
        t1 = time.perf_counter()
        refused = copy.apply(msg)
        t2 = time.perf_counter()
        if refused is not None:
            raise RuntimeError(f"the probe's replica copy refused the broadcast: {refused}")
        dec.append(t1 - t0)
        app.append(t2 - t1)
        tot.append(t2 - t0)
    s.decode.append(statistics.median(dec))
    s.apply.append(statistics.median(app))
    s.down_total.append(statistics.median(tot))
    s.sizes.append(len(payload))
    s.kinds.append(type(msg).__name__)
    s.ops.append(len(getattr(msg, "ops", ())))
    if isinstance(msg, Steps | Delta):
        index_decode_time(msg, repeats, s)
    return copy


def index_decode_time(msg: Steps | Delta, repeats: int, s: Samples) -> None:
    """Where decode's time goes: the same index blocks decoded alone
    (:func:`edge_agent.protocol.indexcode.decode_indices`, one call per relayed update or delta)."""
    parts: list[tuple[IntArray | None, int]]
    if isinstance(msg, Delta):
        parts = [(msg.indices, msg.d)]
    else:
        parts = [(op.update.indices, msg.d) for op in msg.ops if isinstance(op, Add | Move)]
    blocks = [(encode_indices(i, d), d, i.size) for i, d in parts if i is not None and i.size]
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for block, d, t in blocks:
            decode_indices(block, 0, d, t)
        runs.append(time.perf_counter() - t0)
    s.indices.append(sum(t for _, _, t in blocks))
    s.index_decode.append(statistics.median(runs))


def time_uplink(probe: Agent, repeats: int, s: Samples) -> None:
    """The probe's select, compress and encode for the update it is about to send: the
    calls of Agent.step on the same vector (the gradient and the feedback's ``prepare``
    are outside the timing; a private rng leaves the agent's own untouched)."""
    cfg = probe.config
    assert probe.x is not None and probe.version is not None
    _, g = probe.model.loss_grad(probe.x, probe.data)
    v = probe.feedback.prepare(g)
    stages: dict[str, list[float]] = {st: [] for st in STAGES}
    totals, size = [], 0
    for _ in range(repeats):
        t1 = time.perf_counter()
        price = make_price(
            probe.profile,
            cfg.compressor,
            d=v.size,
            job=cfg.job,
            agent=cfg.agent_id,
            round=probe.version,
            seq=probe.seq,
            value_dtype=cfg.value_dtype,
        )
        chosen = probe.policy.choose(v, cfg.compressor, price, probe.rounds)
        t = max(cfg.t_min, min(chosen.t, cfg.t_max or v.size, v.size))
        t2 = time.perf_counter()
        order = chosen.indices if chosen.indices is not None and chosen.indices.size == t else None
        rng = np.random.default_rng(cfg.seed)
        update = compress(v, cfg.compressor, t, rng=rng, value_dtype=cfg.value_dtype, order=order)
        if update.semantics != probe.feedback.semantics:
            update = replace(update, semantics=probe.feedback.semantics)
        t3 = time.perf_counter()
        blob = encode(update, job=cfg.job, agent=cfg.agent_id, round=probe.version, seq=probe.seq)
        t4 = time.perf_counter()
        for st, sec in zip(STAGES, (t2 - t1, t3 - t2, t4 - t3), strict=True):
            stages[st].append(sec)
        totals.append(t4 - t1)
        size = len(blob)
    for st in STAGES:
        s.up[st].append(statistics.median(stages[st]))
    s.up_total.append(statistics.median(totals))
    s.update_bytes.append(size)


# ------------------------------------------------------------------ one round


def deliver(harness: FleetHarness, repeats: int, s: Samples | None) -> None:
    """Every agent handles its inbox; the probe's model broadcasts are timed first
    (``s`` None: not measured) and the copy checked against the probe's own result."""
    probe = harness.agents[0]
    delta_topic = topics.delta(harness.job)
    while (msg := probe.transport.recv(timeout_s=0)) is not None:
        copy = None
        if s is not None and msg.topic == delta_topic:
            copy = time_downlink(probe, msg.payload, repeats, s)
        probe.handle(msg)
        if copy is not None and not (
            copy.version == probe.version and np.array_equal(copy.x, probe.x)  # type: ignore[arg-type]
        ):
            raise RuntimeError("the timed replica copy differs from the probe's model")
    for agent in harness.agents[1:]:
        while (msg := agent.transport.recv(timeout_s=0)) is not None:
            agent.handle(msg)


def one_round(harness: FleetHarness, repeats: int, s: Samples | None) -> None:
    """Deliver the last broadcast, every agent steps, the engine closes the round."""
    deliver(harness, repeats, s)
    probe = harness.agents[0]
    if s is not None:
        time_uplink(probe, repeats, s)
    before = dict(probe.timings_s)
    version = harness.engine.version
    logs = harness.step()
    if any(entry is None for entry in logs):
        raise RuntimeError(f"version {version}: an agent did not answer (engine state?)")
    if s is not None:
        for st, sec in probe.timings_s.items():
            s.own.setdefault(st, []).append(sec - before[st])
    harness.clock.now += 1.0
    harness.pump(strict=True)
    if harness.engine.version != version + 1:
        raise RuntimeError(f"the engine did not close version {version}")


# ------------------------------------------------------------------ one case


def ms(values: Sequence[float]) -> float:
    return 1e3 * statistics.median(values)


def summarise(s: Samples) -> dict[str, Any]:
    up = statistics.median(s.up_total)
    down = statistics.median(s.down_total)
    per_round = [dn / u for dn, u in zip(s.down_total, s.up_total, strict=True)]
    ratio = down / up
    own_total = [sum(s.own[st][i] for st in STAGES) for i in range(len(s.up_total))]
    return {
        "uplink_ms": {**{st: ms(s.up[st]) for st in STAGES}, "total": 1e3 * up},
        "agent_own_ms": {
            **{st: ms(s.own[st]) for st in (*STAGES, "grad")},
            "total": ms(own_total),
        },
        "downlink_ms": {"decode": ms(s.decode), "apply": ms(s.apply), "total": 1e3 * down},
        "ratio": ratio,
        "ratio_per_round": [min(per_round), max(per_round)],
        "target": 1.0,
        "meets_target": ratio <= 1.0,
        "over_target_pct": max(0.0, 100.0 * (ratio - 1.0)),
        "broadcast": {
            "kind": sorted(set(s.kinds)),
            "bytes": statistics.median(s.sizes),
            "bytes_max": max(s.sizes),
            "ops": statistics.median(s.ops),
            "indices": statistics.median(s.indices) if s.indices else 0,
        },
        "index_decode_ms": ms(s.index_decode) if s.index_decode else None,
        "decode_ns_per_index": (
            1e9 * statistics.median(s.decode) / statistics.median(s.indices)
            if s.indices and statistics.median(s.indices)
            else None
        ),
        "update_bytes": statistics.median(s.update_bytes),
    }


def run_case(
    problem: Problem, agents: int, method: Method, mode: DownlinkMode, args: Any
) -> dict[str, Any]:
    fleet = build_fleet(problem, agents, PROFILES)
    with open_fleet(problem, fleet, method, downlink=mode, downlink_pacing=False) as harness:
        harness.start()
        harness.pump(strict=True)
        for _ in range(args.warmup):
            one_round(harness, args.repeats, None)
        s = Samples()
        for _ in range(args.rounds):
            one_round(harness, args.repeats, s)
        return {
            "case": "round",
            "method": method.spec,
            "downlink": mode,
            "agents": agents,
            "d": problem.model.d,
            "rows_per_agent": problem.data.n_rows // agents,
            "probe_profile": fleet.profiles[0].name,
            "warmup": args.warmup,
            "rounds": len(s.down_total),
            "repeats": args.repeats,
            **summarise(s),
        }


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--agents", default="10,100", help="comma list of fleet sizes")
    p.add_argument("--modes", default="exact,cat", help="comma list of downlink modes")
    p.add_argument("--methods", default="cat-signtopk+ef21,cat-topk", help="comma list")
    p.add_argument("--features", type=int, default=47_236, help="d of the RCV1-like set")
    p.add_argument("--rows-per-agent", type=int, default=1000, help="rows of each shard")
    p.add_argument("--max-rows", type=int, default=20_000, help="rows in all, at most")
    p.add_argument("--warmup", type=int, default=5, help="rounds before measuring")
    p.add_argument("--rounds", type=int, default=10, help="rounds measured")
    p.add_argument("--repeats", type=int, default=7, help="timings per round (median)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.warmup < 1 or args.rounds < 1:
        p.error("--warmup and --rounds must be >= 1 (round 0 receives a snapshot, not steps)")
    if args.quick:
        args.features, args.rows_per_agent, args.max_rows = 5_000, 100, 2_000
        args.warmup, args.rounds, args.repeats = 2, 3, 3
    emit(BENCH, {"case": "environment", **environment()})
    methods = [parse_method(m) for m in args.methods.split(",") if m.strip()]
    for agents in (int(n) for n in args.agents.split(",")):
        rows = agents * min(args.rows_per_agent, args.max_rows // agents)
        problem = make_problem(rows, args.features, args.seed)
        for method in methods:
            for mode in (m.strip() for m in args.modes.split(",") if m.strip()):
                if mode not in DOWNLINK_MODES:
                    raise SystemExit(f"--modes: {mode!r} is not one of {', '.join(DOWNLINK_MODES)}")
                emit(BENCH, run_case(problem, agents, method, cast(DownlinkMode, mode), args))


if __name__ == "__main__":
    main()
