"""What a simulation run reports: JSON records, a text table, a progress bar, a plot.

Records: one per (fleet, method, target). Costs are sums over agents of update messages
only, null where the target was not reached. Wall-clock timings (:data:`TIMING_FIELDS`)
are the only fields that differ between two runs with the same seed.
"""

from __future__ import annotations

import json
import math
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TextIO

import numpy as np
import numpy.typing as npt

from aggregator.sim.audit import binding, worst
from aggregator.sim.experiment import DEFAULT_TARGETS, DOWN_FIELDS, METRICS, RunResult
from aggregator.sim.problem import Fleet
from aggregator.web.eta import Eta, estimate

#: JSON fields measured on the wall clock: the only ones two same-seed runs disagree on.
TIMING_FIELDS: Final[tuple[str, ...]] = ("selection_s", "selection_s_per_round", "wall_s")
#: The version at which a record gives the ETA ``/status`` would have shown
#: (``eta_at_round_5_s``).
ETA_VERSION: Final = 5
#: What to tell a user who asked for a plot without matplotlib installed.
PLOT_HINT: Final = (
    "--plot needs matplotlib: pip install 'cat-edge[plot]' (or pip install matplotlib)"
)


# --------------------------------------------------------------------------- records


def _num(v: float) -> float | int:
    """Integral values as JSON integers (bits, packets), others as floats."""
    return int(v) if float(v).is_integer() and abs(v) < 2**53 else float(v)


#: The record fields measured at the round a target was reached, in record order.
_AT_TARGET: Final[tuple[str, ...]] = (
    *METRICS, "bytes", "bytes_fixed32_index", "mean_t", "sim_time_s", "up_wait_s",
    "down_wait_s",
    *(f"down_{m}" for m in DOWN_FIELDS), *(f"total_{m}" for m in DOWN_FIELDS),
    "compute_energy_j", "device_energy_j",
)  # fmt: skip


def not_modelled(fleet: Fleet) -> list[str]:
    """The fleet's profiles without a compute part: their agents' compute energy is not
    modelled (counted as 0 in ``compute_energy_j``)."""
    return sorted({p.name for p in fleet.profiles if p.compute is None})


def _at_target(result: RunResult, k: int | None) -> dict[str, Any]:
    """The :data:`_AT_TARGET` fields at round ``k`` (all null: the target was not reached)."""
    if k is None:
        return dict.fromkeys(_AT_TARGET)
    tr = result.trace
    return {
        **{m: _num(tr.cost[m][k]) for m in METRICS},
        "bytes": tr.bytes[k],
        "bytes_fixed32_index": tr.bytes_fixed32[k],
        "mean_t": None if k == 0 else tr.t_sum[k] / (k * result.fleet.agents),
        "sim_time_s": tr.sim_time_s[k],
        "up_wait_s": tr.up_wait_s[k],
        "down_wait_s": tr.down_wait_s[k],
        **{f"down_{m}": _num(tr.down[k].metric(m)) for m in DOWN_FIELDS},
        **{
            f"total_{m}": _num(
                (tr.bytes[k] if m == "bytes" else tr.cost[m][k]) + tr.down[k].metric(m)
            )
            for m in DOWN_FIELDS
        },
        "compute_energy_j": tr.compute_energy_j[k],
        "device_energy_j": tr.cost["energy_j"][k] + tr.down[k].energy_j + tr.compute_energy_j[k],
    }


def eta_at(result: RunResult, target: float, version: int = ETA_VERSION) -> float | None:
    """The ``sim_time_s`` at which ``/status``'s ETA (:func:`aggregator.web.eta.estimate`)
    said, at ``version``, that ``target`` would be reached: the fit over versions
    0..``version`` of their close times and losses (None: the run has fewer versions, or the
    ETA was unknown). The relative suboptimality stands in for the loss: it is an affine
    function of it (``(f - f*) / (f0 - f*)``), so the fit and the versions left are the same,
    and its floor is 0 (the service's loss floor at the optimum f*, as it solves it)."""
    eta = _eta_of(result, target, version)
    return None if eta is None else eta.at + eta.eta_s


def _eta_of(result: RunResult, target: float, version: int) -> Eta | None:
    """The :class:`~aggregator.web.eta.Eta` of versions 0..``version`` (None: fewer)."""
    tr = result.trace
    if len(tr.subopt) <= version:
        return None
    return estimate(
        [(k, tr.sim_time_s[k], tr.subopt[k]) for k in range(version + 1)], target, floor=0.0
    )


def _eta_fields(result: RunResult, target: float, k: int | None) -> dict[str, Any]:
    """``eta_at_round_5_s``, its ratio to the time actually taken (``eta_ratio``), whether
    the decreases still grew then (``eta_early``: the ETA is the midpoint of a range) and
    that range's ends over the time taken (``eta_low_ratio``, ``eta_high_ratio``)."""
    eta = _eta_of(result, target, ETA_VERSION)
    if eta is None:
        keys = (f"eta_at_round_{ETA_VERSION}_s", "eta_ratio", "eta_early", "eta_low_ratio",
                "eta_high_ratio")  # fmt: skip
        return dict.fromkeys(keys)
    taken = None if k is None else result.trace.sim_time_s[k]

    def over_taken(eta_s: float | None) -> float | None:
        return None if eta_s is None or not taken else (eta.at + eta_s) / taken

    return {
        f"eta_at_round_{ETA_VERSION}_s": eta.at + eta.eta_s,
        "eta_ratio": over_taken(eta.eta_s),
        "eta_early": eta.early,
        "eta_low_ratio": over_taken(eta.eta_low_s),
        "eta_high_ratio": over_taken(eta.eta_high_s),
    }


def _gradients(result: RunResult, k: int | None) -> dict[str, Any]:
    """Minibatch and local-training runs only (the others keep their fields): the batch
    size and the gradient evaluations to round ``k``, in rows and in passes over all the
    data (with equal shards: the gradient evaluations per agent)."""
    if result.batch_size is None and not result.local:
        return {}
    rows = None if k is None else result.trace.grad_rows[k]
    total = sum(s.n_rows for s in result.fleet.shards)
    return {
        "batch_size": result.batch_size,
        "grad_rows": rows,
        "grad_passes": None if rows is None else rows / total,
    }


def gradient_lines(results: Sequence[RunResult], targets: Sequence[float]) -> str:
    """For minibatch and local-training runs: rounds, gradient passes and total bytes to
    each target, one line per (fleet, method, target); empty when there are none."""
    lines = []
    for r in results:
        for rec in records(r, targets):
            if "grad_passes" in rec:
                passes, batch = rec["grad_passes"], rec["batch_size"]
                grads = "full gradients" if batch is None else f"batch {batch:g}"
                lines.append(
                    f"{r.fleet.label}: {rec['method']} {grads} to "
                    f"{rec['target']:g}: rounds {_fmt(rec['rounds'])}, gradient passes "
                    f"{'-' if passes is None else f'{passes:.1f}'}, total bytes "
                    f"{_fmt(rec['total_bytes'])}"
                )
    return "\n".join(lines)


def records(result: RunResult, targets: Sequence[float]) -> list[dict[str, Any]]:
    """One JSON record per target (null costs where the target was not reached)."""
    fleet = result.fleet
    low, bind = worst(result.margins), binding(result.margins)
    law = {
        "audit_worst_margin": None if low is None else low.margin,
        "audit_worst_limit": None if low is None else f"{low.limit} of {low.who}",
        "law_elapsed_s": result.law_elapsed_s,
        # the time the law alone imposes on what the run sent and received (audit module)
        "law_floor_s": None if bind is None else bind.floor_s,
        "law_floor_limit": None if bind is None else f"{bind.limit} of {bind.who}",
        "law": [m.to_dict() for m in result.margins],
    }
    return [
        {
            "method": result.method.spec,
            "downlink": result.downlink,
            "target": eps,
            "rounds": result.reached.get(eps),
            **_at_target(result, result.reached.get(eps)),
            **_eta_fields(result, eps, result.reached.get(eps)),
            **_gradients(result, result.reached.get(eps)),
            "agents": fleet.agents,
            "profile": fleet.profile_label,
            "compute_not_modelled": not_modelled(fleet),
            "rows": sum(s.n_rows for s in fleet.shards),
            "d": fleet.shards[0].n_features,
            "rounds_run": result.rounds_run,
            "final_suboptimality": result.trace.subopt[-1],
            "stop_reason": result.stop_reason,
            "step_size": result.step_size,
            "models_equal": result.models_equal,
            "stale_updates": result.stale_updates,
            "selection_s": result.selection_s,
            "selection_s_per_round": result.selection_s / max(1, result.rounds_run + 1),
            **law,
            "wall_s": result.wall_s,
        }
        for eps in targets
    ]


def write_json(results: Sequence[RunResult], targets: Sequence[float], path: str | Path) -> None:
    """Every record of every result, as one JSON list."""
    recs = [rec for r in results for rec in records(r, targets)]
    Path(path).write_text(json.dumps(recs, indent=1) + "\n")


# --------------------------------------------------------------------------- progress


class ProgressBar:
    """A one-line text progress bar on a stream (stderr), redrawn at most every 0.2 s.

    Only on a terminal: on anything else (a log file, a pipe, CI) a carriage return would
    pile every redraw into one line, so each run gets one plain line when it ends instead.
    """

    def __init__(self, stream: TextIO, total_runs: int, *, enabled: bool = True) -> None:
        self.stream = stream
        self.total = total_runs
        self.enabled = enabled
        self.live = enabled and _is_terminal(stream)
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
        if not self.live or now - self._last < 0.2:
            return
        self._last = now
        self.stream.write("\r" + self._line(k, subopt))
        self.stream.flush()

    def _line(self, k: int, subopt: float) -> str:
        frac = k / self.max_rounds
        if 0 < subopt < 1:  # progress towards the goal on a log scale
            frac = max(frac, math.log(subopt) / math.log(self.goal))
        frac = min(1.0, max(0.0, frac))
        width = 24
        bar = "#" * round(frac * width)
        return (
            f"[{self.index}/{self.total}] {self.label[:48]:<48} |{bar:<{width}}| "
            f"round {k:>6} subopt {subopt:9.3e}"
        )

    def end(self, result: RunResult) -> None:
        if not self.enabled:
            return
        last = self._line(result.rounds_run, result.trace.subopt[-1])
        redraw = "\r" if self.live else ""
        self.stream.write(f"{redraw}{last}  {result.wall_s:6.1f}s\n")
        self.stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    """True when ``stream`` is a terminal (a stream without ``isatty`` is not)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


# --------------------------------------------------------------------------- table


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _by_fleet(results: Sequence[RunResult]) -> dict[str, list[RunResult]]:
    fleets: dict[str, list[RunResult]] = {}
    for r in results:
        fleets.setdefault(r.fleet.label, []).append(r)
    return fleets


#: the table's columns after method, downlink, target and rounds: bytes both ways, the
#: objective's cost summed both ways, and the lockstep time to the target
_TABLE_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("up_bytes", "bytes"),
    ("down_bytes", "down_bytes"),
    ("total_bytes", "total_bytes"),
    *((f"total_{m}", f"total_{m}") for m in METRICS),
    ("compute_J", "compute_energy_j"),
    ("device_J", "device_energy_j"),
    ("sim_time_s", "sim_time_s"),
    ("up_wait_s", "up_wait_s"),
    ("down_wait_s", "down_wait_s"),
    (f"eta@{ETA_VERSION}_s", f"eta_at_round_{ETA_VERSION}_s"),  # only where time passes
    ("law_margin", "audit_worst_margin"),
    ("law_floor_s", "law_floor_s"),
)


#: columns only for fleets where time passes (not the paper's bit counts)
_TIMED_ONLY: Final = frozenset({f"eta_at_round_{ETA_VERSION}_s", "law_floor_s"})


def _cell(rec: dict[str, Any], key: str) -> str:
    """``rec[key]`` as the table shows it; an ETA made while the decreases still grew (the
    midpoint of a range) reads "~..."."""
    text = _fmt(rec[key])
    return "~" + text if key.startswith("eta_") and rec.get("eta_early") else text


def _unmodelled_note(fleet: Fleet) -> str:
    missing = not_modelled(fleet)
    return f"\n   compute energy not modelled (0) for: {', '.join(missing)}" if missing else ""


def summary_table(results: Sequence[RunResult], targets: Sequence[float]) -> str:
    """A plain-text table: one line per (fleet, method, downlink, target), with the bytes
    sent (up), received (down) and both (total), every metric summed both ways, and
    ``sim_time_s`` (the lockstep time to the target, with duty cycles and pacing)."""
    lines: list[str] = []
    for label, group in _by_fleet(results).items():
        recs = [rec for r in group for rec in records(r, targets)]
        # the ETA and law-floor columns only for fleets where time passes (not bit counts)
        timed = any(r.trace.sim_time_s[-1] > 0 for r in group)
        shown = [(c, k) for c, k in _TABLE_COLUMNS if timed or k not in _TIMED_ONLY]
        cols = ("method", "downlink", "target", "rounds", *(c for c, _ in shown),
                "final", "sel_ms/rnd")  # fmt: skip
        rows = [cols]
        for rec in recs:
            rows.append(
                (
                    rec["method"],
                    rec["downlink"],
                    f"{rec['target']:g}",
                    _fmt(rec["rounds"]),
                    *(_cell(rec, key) for _, key in shown),
                    f"{rec['final_suboptimality']:.2e}",
                    f"{1e3 * rec['selection_s_per_round']:.3f}",
                )
            )
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(cols))]
        lines.append(
            f"== {label}  (sums over agents to the target: up = sent, down = received, "
            "total = both; compute_J: gradient evaluations, device_J: total_energy_j + "
            f"compute_J; '-': not reached){_unmodelled_note(group[0].fleet)}"
        )
        for row in rows:
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        if timed:
            lines += _law_lines(group)
        lines.append("")
    return "\n".join(lines)


def _law_lines(results: Sequence[RunResult]) -> list[str]:
    """Per run, the limit that alone makes it longest and the time the audit checked (the
    table's ``law_floor_s`` says how long, this line which limit)."""
    out = []
    for r in results:
        bind = binding(r.margins)
        if bind is None or bind.floor_s <= 0.0:
            continue
        out.append(
            f"   law floor of {r.method.spec} ({r.downlink}): {bind.floor_s:.4g} s, "
            f"{bind.limit} of {bind.who} (used {bind.used:.4g} of {bind.allowed:.4g}); "
            f"checked over {r.law_elapsed_s:.4g} s"
        )
    return out


# --------------------------------------------------------------------------- plot


def plot_unavailable() -> str | None:
    """None if :func:`plot_results` can run, else a one-line install hint."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return PLOT_HINT
    return None


def _metric_for(fleet: Fleet, override: str | None) -> str:
    if override is not None:
        return override
    objectives = {p.objective for p in fleet.profiles}
    return objectives.pop() if len(objectives) == 1 else "airtime_s"


def _plot_points(n: int, limit: int = 1500) -> npt.NDArray[np.int64]:
    """Indices 1..n-1 thinned log-uniformly (round 0 has zero cost: off a log axis)."""
    if n <= 1:
        return np.zeros(0, dtype=np.int64)
    if n - 1 <= limit:
        return np.arange(1, n, dtype=np.int64)
    return np.unique(np.geomspace(1, n - 1, num=limit).astype(np.int64))


#: what a panel's x axis counts: what the agents sent, received, or both
DIRECTIONS: Final[tuple[str, ...]] = ("up", "down", "total")


def _series(r: RunResult, m: str, direction: str) -> npt.NDArray[np.float64]:
    """The cumulative cost ``m`` of ``direction`` at every round of ``r``."""
    up = np.asarray(r.trace.cost[m], dtype=np.float64)
    down = np.array([c.metric(m) for c in r.trace.down], dtype=np.float64)
    if direction == "up":
        return up
    return down if direction == "down" else up + down


def _plot_fleet(ax: Any, label: str, group: Sequence[RunResult], metric: str | None,
                targets: Sequence[float], colors: Sequence[Any],
                direction: str = "up") -> None:  # fmt: skip
    """One panel: suboptimality vs cumulative cost, one line per method (dashed: static T)."""
    m = _metric_for(group[0].fleet, metric)
    for i, r in enumerate(group):
        cost = _series(r, m, direction)
        sub = np.asarray(r.trace.subopt, dtype=np.float64)
        keep = _plot_points(cost.size)
        style = "--" if r.method.spec.startswith(("topk:", "signtopk:", "randk:")) else "-"
        ax.plot(
            cost[keep],
            sub[keep],
            style,
            color=colors[(2 * i) % 20 + (2 * i) // 20 % 2],
            label=r.method.spec if r.downlink == "exact" else f"{r.method.spec} [{r.downlink}]",
            linewidth=1.2,
        )
    for eps in targets:
        ax.axhline(eps, color="grey", linewidth=0.5, linestyle=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    what = {"up": "sent (updates)", "down": "received", "total": "sent + received"}[direction]
    ax.set_xlabel(f"cumulative {m}, all agents, {what}")
    ax.set_ylabel("(f - f*) / (f(x0) - f*)")
    ax.set_title("\n".join(textwrap.wrap(label, 60)), fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)


def plot_results(
    results: Sequence[RunResult],
    path: str | Path,
    *,
    metric: str | None = None,
    targets: Sequence[float] = DEFAULT_TARGETS,
    directions: Sequence[str] = ("up",),
) -> None:
    """Suboptimality vs cumulative cost, one row per fleet, one panel per direction
    (``up``, ``down``, ``total``), one line per method (log-log).

    ``metric``: the x axis (default: the fleet's profile objective, airtime if mixed).
    Needs matplotlib (check :func:`plot_unavailable` first).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fleets = _by_fleet(results)
    panels = [(label, group, d) for label, group in fleets.items() for d in directions]
    n = len(panels)
    ncols = len(directions) if len(directions) > 1 else (2 if n > 1 else 1)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7 * ncols, 5 * nrows), squeeze=False)
    colors = plt.get_cmap("tab20").colors  # type: ignore[attr-defined]
    for ax, (label, group, direction) in zip(axes.flat, panels, strict=False):
        _plot_fleet(ax, label, group, metric, targets, colors, direction)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = [
    "PLOT_HINT",
    "TIMING_FIELDS",
    "ProgressBar",
    "gradient_lines",
    "not_modelled",
    "plot_results",
    "plot_unavailable",
    "records",
    "summary_table",
    "write_json",
]
