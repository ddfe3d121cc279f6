"""``aggregator simulate``: flags, the paper preset, and the run from flags to report.

``aggregator simulate ...`` and ``python -m aggregator.sim ...`` are the same program.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, cast

from aggregator.engine.downlink.broadcast import DOWNLINK_MODES, DownlinkMode
from aggregator.engine.robust_round import parse_aggregation
from aggregator.sim.blas import single_threaded_blas
from aggregator.sim.experiment import (
    CADENCE_DEADLINE_S,
    DEFAULT_TARGETS,
    METRICS,
    RunResult,
    run_method,
)
from aggregator.sim.local import (
    add_local_arguments,
    local_config,
    local_records,
    local_table,
    run_local_cases,
)
from aggregator.sim.methods import Method, parse_method
from aggregator.sim.problem import Fleet, Problem, build_fleet, build_problem
from aggregator.sim.report import (
    DIRECTIONS,
    ProgressBar,
    gradient_lines,
    plot_results,
    plot_unavailable,
    summary_table,
    write_json,
)
from edge_agent.cli.parser import DefaultsFormatter
from edge_agent.data import SHARDINGS
from edge_agent.errors import CatEdgeError
from edge_agent.numerics.models import MODELS

# --------------------------------------------------------------------------- the paper preset
# The comparison protocol of docs/algorithm.md: an RCV1-sized logistic regression, one agent
# and a fleet of ten, two cost models (payload bits, packets), static T against CAT.

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
#: Methods only a fleet runs (error feedback matters when several agents average).
PAPER_FLEET_EXTRA: Final[tuple[str, ...]] = ("cat-topk+ef21", "cat-topk+ef")


# --------------------------------------------------------------------------- flags


def _problem_arguments(p: argparse.ArgumentParser) -> None:
    d = p.add_argument_group("data and model")
    d.add_argument("--data", metavar="FILE", help="LIBSVM or .npz file (default: generated)")
    d.add_argument("--rows", type=int, default=2000, help="rows of the generated RCV1-like set")
    d.add_argument("--features", type=int, default=47_236, help="features of the generated set")
    d.add_argument("--seed", type=int, default=0, help="data, shards and agents' random choices")
    d.add_argument("--model", default="logreg", choices=sorted(MODELS), help="the model trained")
    d.add_argument("--l2", type=float, default=1e-3, help="l2 regularisation lambda")
    d.add_argument("--split", default="iid", choices=sorted(SHARDINGS), help="shard rule")


def _fleet_arguments(p: argparse.ArgumentParser) -> None:
    f = p.add_argument_group("fleet and methods")
    f.add_argument("--agents", type=int, default=1, help="number of agents (equal shards)")
    f.add_argument("--profile", default="paper_payload_bits", help="cost profile of every agent")
    f.add_argument("--profiles", help="comma list of profiles cycled over the agents")
    f.add_argument(
        "--methods",
        default="dense,cat-topk",
        help="comma list: dense, topk:T, cat-topk, cat-signtopk, dynamic-signtopk, cat-randk, "
        "hybrid-topk:S, each optionally +ef or +ef21; with --batch-size, cat-* prices the "
        "noisy gradient's expected decrease (cat-signtopk:nominal: the deterministic gain) "
        "and +ef:model keeps the EF residual in model units",
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
    f.add_argument(
        "--batch-size",
        type=float,
        help="minibatch SGD: every agent's batch, rows (e.g. 64) or a fraction of its shard "
        "(e.g. 0.1); the step then decays as min(gamma, 2/(l2 (t + t0))) (AGG_BATCH_SIZE, "
        "AGG_SCHEDULE_L2). Default: full local gradients",
    )
    f.add_argument(
        "--schedule-t0",
        type=float,
        default=0.0,
        help="t0 of the stochastic step schedule (with --batch-size; AGG_SCHEDULE_T0)",
    )
    f.add_argument(
        "--snapshot-every",
        type=int,
        metavar="N",
        help="a full-model snapshot to every agent after each N-th version, next to the "
        "downlink's update (AGG_SNAPSHOT_EVERY; 0: none). Default: 0 with --cadence or "
        "--batch-size (nobody joins late; with SGD's hundreds of versions the snapshots "
        "outweigh the compressed traffic), else the engine's 50",
    )


def _downlink_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--downlink",
        help="comma list of downlink modes to run every method under (AGG_DOWNLINK): auto "
        "(per version the exact relay or the compressed change, whichever reduces what the "
        "copies miss the most per unit of receiving cost), exact (replicated steps, "
        "bit-identical), delta (float64 new values), cat (compressed broadcast with error "
        "feedback on the model, T chosen by CAT on the downlink profiles). Default: auto, "
        "exact with --preset paper (its published figures)",
    )


def _robust_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--aggregation",
        default="mean",
        help="how the engine combines a round's updates (AGG_AGGREGATION): mean, "
        "clipped_mean[:c] or trimmed_mean[:fraction]; robust rules broadcast delta for exact",
    )
    p.add_argument(
        "--hostile",
        type=float,
        metavar="S",
        help="agent 0 is hostile: its updates reach the engine scaled by S",
    )


def _pacing_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--multicast",
        metavar="PROFILE",
        help="a profile with a shared downlink (e.g. lorawan_eu868_dr0_sf12_mcast_c_dr3): "
        "the members of its technology and region receive every version on its group, "
        "once for all, and only their answers unicast (docs/multicast.md)",
    )
    p.add_argument(
        "--sign-downlink",
        action="store_true",
        help="sign every message to the agents (AGG_SIGNING_KEY_FILE, with a key made for "
        "the run) and have every agent check it: the downlink carries the 74-byte trailers",
    )
    p.add_argument(
        "--cadence",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="on a fleet with duty-cycled radios, every agent sends when its radio allows and "
        "a round does not wait for a silent EF21 member (AGG_CADENCE; docs/algorithm.md: "
        "less time, more bytes); default --no-cadence: lockstep rounds",
    )
    p.add_argument(
        "--round-deadline",
        type=float,
        default=CADENCE_DEADLINE_S,
        metavar="S",
        help="with --cadence: a round waits for every member whose radio is free within S "
        "seconds of its opening (AGG_ROUND_DEADLINE_S; larger: the slow members report in "
        f"more versions, fewer versions and bytes, more time) (default: {CADENCE_DEADLINE_S:g})",
    )
    p.add_argument(
        "--no-downlink-pacing",
        action="store_true",
        help="do not space versions by the agents' downlink caps and sender duty cycles "
        "(AGG_DOWNLINK_PACING=false); sim_time_s then ignores them",
    )


def _run_arguments(p: argparse.ArgumentParser) -> None:
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
    o.add_argument(
        "--plot-directions",
        default="up",
        help="comma list of panels per fleet: up (sent), down (received), total",
    )
    o.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``aggregator simulate`` flags."""
    parser.add_argument(
        "--preset",
        choices=["paper"],
        help="the paper's comparison (docs/algorithm.md): fixes rows, features, model, l2, "
        "fleets, profiles, methods and round budgets (--data, --seed, --targets, --step-size "
        "and outputs still apply)",
    )
    _problem_arguments(parser)
    _fleet_arguments(parser)
    _downlink_arguments(parser)
    _robust_arguments(parser)
    _pacing_arguments(parser)
    add_local_arguments(parser)
    _run_arguments(parser)


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Case:
    """A fleet (agents, profile names cycled over them), its methods and round budget."""

    agents: int
    profiles: tuple[str, ...]
    methods: tuple[Method, ...]
    max_rounds: int


@dataclass(frozen=True)
class Plan:
    """What to run: the problem's parameters and a list of cases."""

    rows: int
    features: int
    l2: float
    model: str
    cases: tuple[Case, ...]


def _paper_plan() -> Plan:
    cases = []
    for agents, max_rounds in PAPER_MAX_ROUNDS.items():
        specs = PAPER_METHODS + (PAPER_FLEET_EXTRA if agents > 1 else ())
        parsed = tuple(parse_method(m) for m in specs)
        for prof in PAPER_PROFILES:
            cases.append(Case(agents, (prof,), parsed, max_rounds))
    return Plan(PAPER_ROWS, PAPER_FEATURES, PAPER_L2, "logreg", tuple(cases))


def make_plan(args: argparse.Namespace) -> Plan:
    """The preset's plan, or one case from ``--agents/--profile(s)/--methods/--max-rounds``."""
    if args.preset == "paper":
        return _paper_plan()
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


#: the downlink a run uses without --downlink (the service's AGG_DOWNLINK default) and the
#: one the paper preset pins (its figures in docs/results.md were measured with it)
DEFAULT_DOWNLINK: Final[DownlinkMode] = "auto"
PAPER_DOWNLINK: Final[DownlinkMode] = "exact"


def default_downlink(args: argparse.Namespace) -> DownlinkMode:
    """The downlink mode a run uses when ``--downlink`` is not given."""
    return PAPER_DOWNLINK if args.preset == "paper" else DEFAULT_DOWNLINK


def _downlinks(text: str | None, default: DownlinkMode = DEFAULT_DOWNLINK) -> list[DownlinkMode]:
    if text is None:
        return [default]
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in DOWNLINK_MODES]
    if not modes or bad:
        raise ValueError(
            f"--downlink: expected a comma list of {', '.join(DOWNLINK_MODES)}; got {text!r}"
        )
    return [cast(DownlinkMode, m) for m in modes]


def _targets(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(sorted({float(t) for t in text.split(",") if t.strip()}, reverse=True))
    except ValueError:
        raise ValueError(f"--targets: expected a comma list of numbers, got {text!r}") from None
    if not vals or any(not 0 < v < 1 for v in vals):
        raise ValueError(f"--targets must lie in (0, 1), got {text!r}")
    return vals


def _prepare(
    args: argparse.Namespace,
) -> tuple[tuple[float, ...], Problem, list[tuple[Fleet, Case]]]:
    """Validate the flags, build the problem (solves f*) and the fleets. ValueError etc."""
    targets = _targets(args.targets)
    _downlinks(args.downlink, default_downlink(args))
    parse_aggregation(args.aggregation)
    bad = {d.strip() for d in args.plot_directions.split(",")} - set(DIRECTIONS)
    if bad:
        raise ValueError(f"--plot-directions: {sorted(bad)}; use up, down and/or total")
    plan = make_plan(args)
    local_config(args)  # refuses what local training cannot run, before f* is solved
    if any(c.max_rounds < 1 for c in plan.cases):
        raise ValueError(f"--max-rounds must be >= 1, got {args.max_rounds}")
    if args.batch_size is not None and not args.batch_size > 0:
        raise ValueError(f"--batch-size must be > 0 (rows or a fraction), got {args.batch_size}")
    if args.snapshot_every is not None and args.snapshot_every < 0:
        raise ValueError(f"--snapshot-every must be >= 0, got {args.snapshot_every}")
    if args.schedule_t0 < 0:
        raise ValueError(f"--schedule-t0 must be >= 0, got {args.schedule_t0}")
    if args.eval_every < 0:
        raise ValueError(f"--eval-every must be >= 0, got {args.eval_every}")
    if not args.round_deadline > 0:
        raise ValueError(f"--round-deadline must be > 0 seconds, got {args.round_deadline}")
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
    mc = args.multicast
    return (
        targets,
        problem,
        [(build_fleet(problem, c.agents, c.profiles, multicast=mc), c) for c in plan.cases],
    )


# --------------------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> int:
    """Run the simulation described by parsed ``args``; 0 on success, 2 on bad input."""
    if args.plot and (hint := plot_unavailable()) is not None:
        print(f"aggregator simulate: {hint}", file=sys.stderr)
        return 2
    with single_threaded_blas():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        targets, problem, fleets = _prepare(args)
    except (ValueError, CatEdgeError, OSError) as exc:
        print(f"aggregator simulate: {exc}", file=sys.stderr)
        return 2
    base = default_downlink(args)
    bar = ProgressBar(
        sys.stderr,
        sum(len(c.methods) for _, c in fleets) * len(_downlinks(args.downlink, base)),
        enabled=not args.no_progress,
    )
    print(
        f"# {problem.name}: {problem.data.n_rows} rows, d={problem.model.d}, "
        f"{problem.model.kind} l2={problem.model.l2:g}; f*={problem.f_star:.12g}, "
        f"f(x0)={problem.f0:.12g}",
        flush=True,
    )
    cfg = local_config(args)
    if cfg is not None and not args.local_engine:  # in-process aggregator (aggregator.sim.local)
        try:
            cases = [(fleet, case.methods, case.max_rounds) for fleet, case in fleets]
            done = run_local_cases(
                problem, cases, cfg, targets, downlink_pacing=not args.no_downlink_pacing
            )
            print(local_table(done, targets), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(local_records(done, targets), indent=2))
        except ValueError as exc:
            print(f"aggregator simulate: {exc}", file=sys.stderr)
            return 2
        return 0
    results: list[RunResult] = []
    for fleet, case in fleets:
        for method in case.methods:
            for downlink in _downlinks(args.downlink, base):
                label = method.spec if downlink == base else f"{method.spec} [{downlink}]"
                if args.aggregation != "mean" or args.hostile is not None:
                    label += f" [{args.aggregation}, hostile={args.hostile}]"
                if args.sign_downlink:
                    label += " [signed]"
                bar.begin(f"{fleet.label}: {label}", case.max_rounds, min(targets))
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
                    downlink=downlink,
                    downlink_pacing=not args.no_downlink_pacing,
                    aggregation=args.aggregation,
                    hostile=args.hostile,
                    batch_size=args.batch_size,
                    schedule_t0=args.schedule_t0,
                    sign_downlink=args.sign_downlink,
                    cadence=args.cadence,
                    deadline_s=args.round_deadline,
                    snapshot_every=args.snapshot_every,
                    local=cfg,
                )
                bar.end(res)
                results.append(res)
    print(summary_table(results, targets), flush=True)
    if args.batch_size is not None:
        print(gradient_lines(results, targets), flush=True)
    if args.json:
        write_json(results, targets, args.json)
    if args.plot:
        directions = [d.strip() for d in args.plot_directions.split(",") if d.strip()]
        plot_results(
            results, args.plot, metric=args.plot_metric, targets=targets, directions=directions
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aggregator simulate",
        description="Run N real agents and the real round engine in-process over memory:// "
        "and report the communication each method needs to reach each suboptimality target.",
        formatter_class=DefaultsFormatter,
    )
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``aggregator simulate ...`` and ``python -m aggregator.sim ...``."""
    return run(build_parser().parse_args(None if argv is None else list(argv)))


__all__ = ["Case", "Plan", "add_arguments", "build_parser", "main", "make_plan", "run"]
