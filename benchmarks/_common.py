"""Shared helpers for the benchmarks: one JSON object per line, medians of repeats, --quick.

Benchmarks report ratios against a baseline measured in the same run; absolute times are
included only as context (they depend on the machine).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def emit(bench: str, record: dict[str, Any]) -> None:
    """Print one JSON line ``{"bench": bench, **record}`` (floats rounded for reading)."""
    print(json.dumps({"bench": bench, **_rounded(record)}), flush=True)


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return None
        return float(f"{obj:.4g}")
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_rounded(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return _rounded(float(obj))
    return obj


def environment() -> dict[str, Any]:
    """What the numbers were measured on (print once per run)."""
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }


def _calls_per_sample(fn: Callable[[], object], min_sample_s: float) -> tuple[int, float]:
    """How many calls of ``fn`` last at least ``min_sample_s`` (like timeit's autorange),
    after one warm-up call; and the seconds per call of that calibration run."""
    fn()
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_sample_s or number >= 1 << 20:
            return number, elapsed / number
        number *= 2 if elapsed <= 0 else max(2, min(10, math.ceil(min_sample_s / elapsed)))


def _sample(fn: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def median_seconds(
    fn: Callable[[], object], *, repeats: int = 7, min_sample_s: float = 0.005
) -> float:
    """Median wall time of one call of ``fn``, in seconds.

    Calls are batched so that each of the ``repeats`` samples lasts at least
    ``min_sample_s`` (like timeit's autorange); one warm-up call comes first.
    """
    number, first = _calls_per_sample(fn, min_sample_s)
    return statistics.median([first] + [_sample(fn, number) for _ in range(repeats - 1)])


def median_ratio(
    fn: Callable[[], object],
    baseline: Callable[[], object],
    *,
    repeats: int = 7,
    min_sample_s: float = 0.005,
) -> tuple[float, float, float]:
    """(median of time(fn) / time(baseline), median seconds of fn, of baseline).

    The samples alternate (fn, baseline, fn, ...) and each ratio is taken within one pair,
    so a change of load on a shared machine moves both sides of it alike."""
    n_fn, _ = _calls_per_sample(fn, min_sample_s)
    n_base, _ = _calls_per_sample(baseline, min_sample_s)
    pairs = [(_sample(fn, n_fn), _sample(baseline, n_base)) for _ in range(repeats)]
    return (
        statistics.median(a / b for a, b in pairs),
        statistics.median(a for a, _ in pairs),
        statistics.median(b for _, b in pairs),
    )


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser with ``--quick`` (a smoke run of a few seconds)."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few cases and repeats: a smoke run")
    return p
