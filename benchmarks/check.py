"""bench-check: quick runs of the selection, codec, footprint and ingest benchmarks, each
ratio against its target in benchmarks/targets.json.

    python benchmarks/check.py [--only selection,codec,agent_footprint,ingest] [--json PATH]

Runs each benchmark with ``--quick`` in a child process (a few seconds each), reads its
JSON lines and prints one line per target::

    met     selection.ratio_d1e6           0.62 <= 1      (...)
    missed  ingest.mqtt_ratio              0.41 >= 0.5    (...)

then one JSON line for the whole run (``"case": "bench_check"``: every target's value,
target, status and context, and each benchmark's wall time). Every value is a ratio against
a baseline the benchmark measured in the same run. Exit status 0 when every target is met,
1 when one is missed, 2 when a benchmark failed to run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import emit, environment

HERE = Path(__file__).resolve().parent
TARGETS = HERE / "targets.json"
Lines = list[dict[str, Any]]
#: benchmark -> extra arguments of its quick run
RUNS: dict[str, list[str]] = {
    "selection": ["--quick"],
    "codec": ["--quick"],
    "agent_footprint": ["--quick"],
    # (2,000 updates are mostly start-up; 6,000 take ~15 s)
    "ingest": ["--quick", "--transport", "mqtt", "--updates", "6000"],
}
TIMEOUT_S = 300


class BenchFailed(Exception):
    """A benchmark exited non-zero or printed no usable line."""


def run_bench(name: str) -> tuple[Lines, float]:
    """Its JSON lines and its wall time."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, str(HERE / f"{name}.py"), *RUNS[name]],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise BenchFailed(f"{name} exited {out.returncode}: {out.stderr.strip()[-1500:]}")
    lines = [json.loads(s) for s in out.stdout.splitlines() if s.startswith("{")]
    return lines, wall


def _select_ratios(lines: Lines, d: int) -> tuple[float, dict[str, Any]]:
    rows = [r for r in lines if r.get("case") == "select" and r["d"] == d]
    if not rows:
        raise BenchFailed(f"selection printed no case at d = {d}")
    ratios = [float(r["ratio_to_argpartition"]) for r in rows]
    worst = max(rows, key=lambda r: float(r["ratio_to_argpartition"]))
    context = {
        "cases": len(rows),
        "max": max(ratios),
        "max_case": [worst["profile"], worst["compressor"], worst["t"]],
        "median_select_ms": 1e3 * statistics.median(float(r["select_s"]) for r in rows),
        "median_argpartition_ms": 1e3 * statistics.median(float(r["argpartition_s"]) for r in rows),
        "all_exact": all(r.get("exact", True) for r in rows),
    }
    return statistics.median(ratios), context


def _one(lines: Lines, **match: Any) -> dict[str, Any]:
    for r in lines:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    raise BenchFailed(f"no line with {match}")


def _codec_bound(lines: Lines) -> tuple[float, dict[str, Any]]:
    rows = [r for r in lines if r.get("case") == "summary"]
    if not rows:
        raise BenchFailed("codec printed no summary")
    return max(float(r["max_bits_vs_bound_every_t"]) for r in rows), {"d": [r["d"] for r in rows]}


def _decode_many(batch: str) -> Callable[[Lines], tuple[float, dict[str, Any]]]:
    def metric(lines: Lines) -> tuple[float, dict[str, Any]]:
        r = _one(lines, case="decode_many", batch=batch)
        us = {k: r[k] for k in ("decode_us_per_msg", "decode_many_us_per_msg")}
        return float(r["ratio"]), us

    return metric


def _footprint_case(lines: Lines) -> dict[str, Any]:
    return next(r for r in lines if "profile" in r)


def _rss(lines: Lines) -> tuple[float, dict[str, Any]]:
    """Peak RSS in MB (memory is not timing noise); the same run's bare-numpy floor beside it."""
    row = _footprint_case(lines)
    base = float(_one(lines, baseline="python -c 'import numpy'")["peak_rss_mb"])
    mb = float(row["peak_rss_mb"])
    return mb, {"bare_numpy_mb": base, "over_bare_numpy": round(mb / base, 2)}


def _overhead(lines: Lines) -> tuple[float, dict[str, Any]]:
    row = _footprint_case(lines)
    return float(row["select_compress_encode_over_grad"]), {"per_round_ms": row["per_round_ms"]}


def _ingest(lines: Lines) -> tuple[float, dict[str, Any]]:
    r = next((r for r in lines if r.get("transport") == "mqtt" and "ratio" in r), None)
    if r is None:
        raise BenchFailed("ingest printed no mqtt ratio")
    ctx = {k: r.get(k) for k in ("aggregator_updates_per_s", "raw_updates_per_s")}
    return float(r["ratio"]), ctx


METRICS: dict[str, Callable[[Lines], tuple[float, dict[str, Any]]]] = {
    "selection.fixed_cost": lambda lines: _select_ratios(lines, 10**3),
    "selection.ratio_d1e5": lambda lines: _select_ratios(lines, 10**5),
    "selection.ratio_d1e6": lambda lines: _select_ratios(lines, 10**6),
    "codec.decode_many_t100": _decode_many("t100"),
    "codec.decode_many_t50_500": _decode_many("t50_500"),
    "codec.index_vs_bound": _codec_bound,
    "footprint.peak_rss_mb": _rss,
    "footprint.overhead_over_grad": _overhead,
    "ingest.mqtt_ratio": _ingest,
}


def verdict(value: float, op: str, target: float) -> bool:
    return value <= target if op == "<=" else value >= target


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--only", default=",".join(RUNS), help="comma-separated benchmarks")
    ap.add_argument("--json", type=Path, help="also write the run's JSON object to this file")
    args = ap.parse_args()
    targets = json.loads(TARGETS.read_text())["targets"]
    wanted = [b for b in args.only.split(",") if b]
    unknown = sorted(set(wanted) - set(RUNS))
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; valid: {sorted(RUNS)}")
    results: list[dict[str, Any]] = []
    walls: dict[str, float] = {}
    errors: dict[str, str] = {}
    for bench in wanted:
        try:
            lines, walls[bench] = run_bench(bench)
        except (BenchFailed, subprocess.TimeoutExpired) as exc:
            errors[bench] = str(exc)
            print(f"error   {bench}: {exc}", flush=True)
            continue
        for t in (t for t in targets if t["bench"] == bench):
            try:
                value, context = METRICS[t["name"]](lines)
            except BenchFailed as exc:
                errors[t["name"]] = str(exc)
                print(f"error   {t['name']}: {exc}", flush=True)
                continue
            ok = verdict(value, t["op"], float(t["target"]))
            status = "met" if ok else "missed"
            print(
                f"{status:<7} {t['name']:<30} {value:.3g} {t['op']} {t['target']:<6} ({t['reason']})",
                flush=True,
            )
            results.append(
                {
                    "name": t["name"],
                    "status": status,
                    "value": value,
                    "op": t["op"],
                    "target": t["target"],
                    "context": context,
                }
            )
    missed = [r["name"] for r in results if r["status"] == "missed"]
    record = {
        "case": "bench_check",
        "environment": environment(),
        "results": results,
        "missed": missed,
        "errors": errors,
        "wall_s": walls,
    }
    emit("check", record)
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    if errors:
        return 2
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
