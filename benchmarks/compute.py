"""What one gradient evaluation costs on this machine, as a function of rows and nonzeros.

    python benchmarks/compute.py [--quick]

One JSON line per shard: ``model.loss_grad`` (logreg, l2 1e-3, what the agent computes every
round) on an RCV1-like shard (``edge_agent.data.make_rcv1_like``, 47,236 features) of
``rows`` rows and about ``nnz_per_row`` nonzeros per row, median of repeats (``grad_s``),
with the shard's ``nnz`` beside it. Two row densities (74 nonzeros per row, as the preset
data, and 296) separate what a row costs from what a nonzero costs.

The last line (``case: fit``) is the least-squares fit (of relative errors) ``grad_s = a + b * nnz + c * rows``
over every shard, with its relative residuals, and the same with the nonzero term alone
(``a + b * nnz``) and the row term alone (``a + c * rows``): docs/cost-profiles.md ("Compute
energy") picks the model whose residuals are small on both densities. Times are this
machine's, single-threaded numpy; a device's figure scales them (docs/cost-profiles.md).
"""

from __future__ import annotations

from functools import partial

import numpy as np
from _common import emit, environment, median_seconds, parser

from edge_agent.data import Dataset, make_rcv1_like
from edge_agent.data.sparse import CSRMatrix
from edge_agent.numerics.models import Model, make_model

BENCH = "compute"
FEATURES = 47_236
DENSITIES = (74.0, 296.0)


def _grad(model: Model, data: Dataset, x: np.ndarray) -> object:
    return model.loss_grad(x, data)


def _fit(cols: list[np.ndarray], y: np.ndarray) -> tuple[list[float], float]:
    """Least squares of the relative error ``(cols @ coef - y) / y``; the coefficients and
    the largest relative residual."""
    a = np.column_stack(cols)
    coef, *_ = np.linalg.lstsq(a / y[:, None], np.ones_like(y), rcond=None)
    worst = float(np.max(np.abs(a @ coef - y) / y))
    return [float(c) for c in coef], worst


def main() -> None:
    args = parser(__doc__).parse_args()
    emit(BENCH, {"case": "environment", **environment()})
    sizes = (250, 1000) if args.quick else (250, 500, 1000, 2000, 4000)
    repeats = 3 if args.quick else 7
    model = make_model("logreg", n_features=FEATURES, l2=1e-3)
    x = np.random.default_rng(1).normal(size=FEATURES) * 0.01
    nnz, rows, secs = [], [], []
    for density in DENSITIES:
        for n in sizes:
            data = make_rcv1_like(n, FEATURES, rng=np.random.default_rng(n), nnz_per_row=density)
            s = median_seconds(partial(_grad, model, data, x), repeats=repeats)
            nz = int(data.X.nnz) if isinstance(data.X, CSRMatrix) else int(data.X.size)
            emit(BENCH, {"case": "shard", "rows": n, "nnz_per_row": density, "nnz": nz,
                         "grad_s": s, "s_per_nnz": s / nz, "s_per_row": s / n})  # fmt: skip
            nnz.append(nz)
            rows.append(n)
            secs.append(s)
    y = np.asarray(secs)
    one = np.ones_like(y)
    nz_a, r_a = np.asarray(nnz, dtype=float), np.asarray(rows, dtype=float)
    both, both_worst = _fit([one, nz_a, r_a], y)
    by_nnz, nnz_worst = _fit([one, nz_a], y)
    by_row, row_worst = _fit([one, r_a], y)
    emit(BENCH, {
        "case": "fit",
        "a_s": both[0], "b_s_per_nnz": both[1], "c_s_per_row": both[2],
        "worst_rel_residual": both_worst,
        "nnz_only": {"a_s": by_nnz[0], "b_s_per_nnz": by_nnz[1],
                     "worst_rel_residual": nnz_worst},
        "rows_only": {"a_s": by_row[0], "c_s_per_row": by_row[1],
                      "worst_rel_residual": row_worst},
    })  # fmt: skip


if __name__ == "__main__":
    main()
