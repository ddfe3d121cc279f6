"""CAT with the directional gain: selection time vs the gradient time on the device path.

    python benchmarks/curvature.py [--quick]

One JSON line per (shard, point, profile, compressor) on RCV1-like shards
(``edge_agent.data.make_rcv1_like``, 47,236 features; 2,000 and 10,000 rows, logreg, l2 1e-3):

* ``grad_s``: one ``model.loss_grad`` on the shard (what the agent computes every round);
* ``select_dir_s``: one ``curvature.select_directional`` (top-entry order, the incremental
  pass over their columns, the early stop, the exact pricing), median of repeats;
  ``ratio_to_grad`` = select_dir_s / grad_s, measured in the same run;
* ``select_classic_s``: the classic ``selection.select`` (global L) for context;
* ``t``: T* with the directional gain, ``t_classic`` with the global L.

Points: ``x0`` (zeros, the first round) and ``x10`` (after 10 rounds of gradient descent with
directional CAT-signtopk on the same shard), as the gradient's shape changes along a run. The
column index (a CSC copy of the shard) is built once per shard; its time is ``columns_s`` on
a line of its own per shard, not part of select_dir_s.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import numpy as np
from _common import emit, environment, median_seconds, parser

from edge_agent.data import Dataset, make_rcv1_like
from edge_agent.data.sparse import CSRMatrix, FloatArray
from edge_agent.links.catalog import load_profile
from edge_agent.numerics.compressors import compress
from edge_agent.numerics.curvature import scale_for_step, select_directional
from edge_agent.numerics.models import Model, make_model
from edge_agent.numerics.selection import make_price, select

BENCH = "curvature"
ROOT = Path(__file__).resolve().parents[1]
PROFILES = ("paper_payload_bits", "paper_packet_model")
FEATURES = 47_236
JOB, AGENT = "bench", "pi-01"


def point_after(model: Model, data: Dataset, rounds: int, big_l: float) -> FloatArray:
    """x after ``rounds`` of directional CAT-signtopk at the payload-bits profile."""
    prof = load_profile(ROOT / "cost_profiles" / "paper_payload_bits.json")
    x = model.initial_point()
    for k in range(rounds):
        g = model.grad(x, data)
        price = make_price(prof, "signtopk", d=model.d, job=JOB, agent=AGENT, round=k, seq=k)
        sel = select_directional(g, "signtopk", price, model, data)
        update = compress(g, "signtopk", sel.t, order=sel.indices)
        x = x - scale_for_step(update, sel.step, big_l).to_dense() / big_l
    return np.asarray(x, dtype=np.float64)


def bench_point(
    model: Model, data: Dataset, x: FloatArray, repeats: int
) -> list[dict[str, object]]:
    """One record per (profile, compressor) at the point ``x``."""
    g = model.grad(x, data)
    grad_s = median_seconds(partial(model.loss_grad, x, data), repeats=repeats)
    out: list[dict[str, object]] = []
    for name in PROFILES:
        prof = load_profile(ROOT / "cost_profiles" / f"{name}.json")
        for comp in ("topk", "signtopk"):
            price = make_price(prof, comp, d=model.d, job=JOB, agent=AGENT)
            directional = partial(select_directional, g, comp, price, model, data)
            dir_s = median_seconds(directional, repeats=repeats)
            classic_s = median_seconds(partial(select, g, comp, price), repeats=repeats)
            out.append(
                {
                    "profile": name,
                    "compressor": comp,
                    "t": directional().t,
                    "t_classic": select(g, comp, price).t,
                    "grad_s": grad_s,
                    "select_dir_s": dir_s,
                    "ratio_to_grad": dir_s / grad_s,
                    "select_classic_s": classic_s,
                }
            )
    return out


def main() -> None:
    args = parser(__doc__).parse_args()
    sizes = (2_000,) if args.quick else (2_000, 10_000)
    repeats = 3 if args.quick else 7
    emit(BENCH, {"environment": environment()})
    for rows in sizes:
        data = make_rcv1_like(rows, FEATURES, rng=np.random.default_rng(0))
        assert isinstance(data.X, CSRMatrix)
        model = make_model("logreg", n_features=FEATURES, l2=1e-3)
        start = time.perf_counter()
        data.X.columns()
        emit(BENCH, {"rows": rows, "nnz": data.X.nnz, "columns_s": time.perf_counter() - start})
        big_l = model.smoothness(data, rng=np.random.default_rng(0))
        points = {"x0": model.initial_point(), "x10": point_after(model, data, 10, big_l)}
        for point, x in points.items():
            for record in bench_point(model, data, x, repeats):
                emit(BENCH, {"rows": rows, "d": FEATURES, "point": point, **record})


if __name__ == "__main__":
    main()
