"""Synthetic data and fleets: an RCV1-like generator and shard splitting among agents.

* :func:`make_rcv1_like` generates a seeded sparse text-classification
  problem with RCV1's shape statistics.
* :func:`split_shards` partitions a dataset among agents (:data:`SHARDINGS`).

Every random choice takes an explicit numpy Generator.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edge_agent.data.dataset import Dataset, compact_indices
from edge_agent.data.sparse import CSRMatrix, IndexArray
from edge_agent.errors import DataError, lookup

__all__ = ["SHARDINGS", "make_rcv1_like", "split_shards"]


# --------------------------------------------------------------------------- generator
def make_rcv1_like(
    n_rows: int,
    n_features: int = 47_236,
    *,
    rng: np.random.Generator,
    nnz_per_row: float = 74.0,
    zipf_exponent: float = 1.1,
    label_noise: float = 0.05,
    signal_density: float = 0.1,
    idf: bool = True,
) -> Dataset:
    """Generate a sparse binary text-classification set shaped like RCV1 (LYRL2004 binary).

    * Feature popularity follows a Zipf law: the feature of popularity rank
      ``r`` (1-based) is drawn with probability proportional to
      ``r ** -zipf_exponent``; ranks are assigned to column ids by a random
      permutation, so popular columns are scattered as in a real vocabulary.
    * Row lengths are log-normal (sigma 0.5) with mean ``nnz_per_row``,
      clipped to ``[1, n_features]``; each row holds distinct features
      (duplicates are redrawn for up to 64 rounds, so a few very long rows
      may end slightly short).
    * Values are log-tf times idf (``tf = 1 + log c``, ``c`` geometric;
      ``idf = 1 + log((1 + n_rows) / (1 + df))``; ``idf=False``: log-tf only, so
      popular columns keep their weight), then every row is scaled to unit
      Euclidean norm, as RCV1 is.
    * Labels: ``sign(A w)`` for a sparse ground truth ``w`` (a fraction
      ``signal_density`` of features, standard normal weights, the top 1 %
      most popular "stop words" carry no weight); ties broken at random;
      then a fraction ``label_noise`` of labels flipped. Classes come out
      balanced-ish (``w`` is symmetric), not exactly balanced.

    Deterministic for a given ``rng`` state; fully vectorised.
    """
    if n_rows < 1 or n_features < 1:
        raise DataError(
            f"make_rcv1_like: need n_rows >= 1 and n_features >= 1, got {n_rows}, {n_features}"
        )
    if not 0.0 <= label_noise <= 0.5:
        raise DataError(f"make_rcv1_like: label_noise must lie in [0, 0.5], got {label_noise}")
    ranks = np.arange(1, n_features + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-zipf_exponent)
    cdf /= cdf[-1]
    column_of_rank = rng.permutation(n_features).astype(np.int64)

    sigma = 0.5
    mu = np.log(max(nnz_per_row, 1.0)) - sigma**2 / 2
    lengths = np.clip(np.rint(rng.lognormal(mu, sigma, size=n_rows)), 1, n_features).astype(
        np.int64
    )
    # Distinct features per row: draw about twice the missing count from the Zipf law, drop
    # repeats (keeping the first draw), keep the first `need` new ones per row; repeat
    # for the few rows that are still short. Each round is vectorised.
    keys = np.empty(0, dtype=np.int64)  # row * n_features + column, sorted and unique
    need = lengths.copy()
    for _ in range(64):
        if not need.any():
            break
        draws = 2 * need + 4 * (need > 0)
        rows = np.repeat(np.arange(n_rows, dtype=np.int64), draws)
        drawn = np.searchsorted(cdf, rng.random(rows.size), side="right")
        cand = rows * n_features + column_of_rank[np.minimum(drawn, n_features - 1)]
        _, first_draw = np.unique(cand, return_index=True)
        first_draw.sort()  # back to draw order, which groups the candidates by row
        cand = cand[first_draw]
        fresh = cand
        if keys.size:
            pos = np.minimum(np.searchsorted(keys, cand), keys.size - 1)
            fresh = cand[keys[pos] != cand]
        fresh_rows = fresh // n_features
        group_start = np.searchsorted(fresh_rows, fresh_rows)
        rank_in_row = np.arange(fresh.size) - group_start
        fresh = fresh[rank_in_row < need[fresh_rows]]
        keys = np.sort(np.concatenate((keys, fresh)))
        need = lengths - np.bincount(keys // n_features, minlength=n_rows)
    row_ids = keys // n_features
    cols = keys % n_features

    df = np.bincount(cols, minlength=n_features)
    weight = 1.0 + np.log((1.0 + n_rows) / (1.0 + df)) if idf else np.ones(n_features)
    tf = 1.0 + np.log(rng.geometric(0.5, size=keys.size).astype(np.float64))
    values = tf * weight[cols]
    norms = np.sqrt(np.bincount(row_ids, weights=values * values, minlength=n_rows))
    values /= norms[row_ids]
    counts = np.bincount(row_ids, minlength=n_rows)
    indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    X = CSRMatrix(values, compact_indices(cols, n_features), indptr, (n_rows, n_features))

    w = rng.standard_normal(n_features) * (rng.random(n_features) < signal_density)
    w[column_of_rank[: max(1, n_features // 100)]] = 0.0
    margins = X.matvec(w)
    ties = rng.choice(np.array([-1.0, 1.0]), size=n_rows)
    y = np.where(margins > 0, 1.0, np.where(margins < 0, -1.0, ties))
    y[rng.random(n_rows) < label_noise] *= -1.0
    return Dataset(X, y)


# --------------------------------------------------------------------------- sharding
def _iid_order(ds: Dataset, rng: np.random.Generator, mix: float) -> IndexArray:
    return rng.permutation(ds.n_rows).astype(np.int64)


def _label_order(ds: Dataset, rng: np.random.Generator, mix: float) -> IndexArray:
    # Shuffle first so rows with equal labels land in random order, then sort stably by label.
    perm = rng.permutation(ds.n_rows).astype(np.int64)
    order = perm[np.argsort(ds.y[perm], kind="stable")]
    # Mixing: a random fraction `mix` of positions exchange their rows at random.
    n_mix = round(mix * ds.n_rows)
    if n_mix > 1:
        slots = rng.choice(ds.n_rows, size=n_mix, replace=False)
        order[slots] = order[rng.permutation(slots)]
    return order


SHARDINGS: dict[str, Callable[[Dataset, np.random.Generator, float], IndexArray]] = {
    "iid": _iid_order,
    "label": _label_order,
}
"""Sharding rule name -> function returning a row order that is cut into equal pieces."""


def split_shards(
    ds: Dataset,
    n_shards: int,
    *,
    how: str = "iid",
    rng: np.random.Generator,
    mix: float = 0.1,
) -> list[Dataset]:
    """Partition the rows of ``ds`` into ``n_shards`` datasets (every row in exactly one).

    Shard sizes differ by at most one row. ``how``:

    * ``"iid"``: a uniformly random permutation, cut into equal pieces.
    * ``"label"``: rows sorted by label (random order within a label), so each
      shard sees one or few classes (non-IID); then a random fraction ``mix``
      of the positions (default 10 %) swap rows among themselves, so shards
      are skewed but not pure. ``mix`` is ignored for ``"iid"``.

    Raises :class:`DataError` unless ``1 <= n_shards <= n_rows``, and
    :class:`~edge_agent.errors.UnknownNameError` for an unknown ``how``.
    """
    if not 1 <= n_shards <= ds.n_rows:
        raise DataError(
            f"split_shards: n_shards must lie in [1, n_rows={ds.n_rows}], got {n_shards}"
        )
    if not 0.0 <= mix <= 1.0:
        raise DataError(f"split_shards: mix must lie in [0, 1], got {mix}")
    rule = lookup(dict(SHARDINGS), how, "sharding rule")
    assert callable(rule)
    order = rule(ds, rng, mix)
    return [ds.take(part) for part in np.array_split(order, n_shards)]
