"""Minibatch sampling for stochastic gradients: without replacement within an epoch.

A batch size is given either as a number of rows (an integer >= 1) or as a fraction of the
shard (a float in (0, 1)); :func:`batch_rows` turns it into rows. :class:`EpochSampler`
draws a fresh permutation of the shard's rows each epoch (one ``Generator.permutation``
call, no Python loop over rows) and hands out consecutive slices of it, so every row is
used exactly once per epoch; a batch that would cross the epoch's end is completed from
the next permutation, so every batch has exactly the requested size.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IndexArray = npt.NDArray[np.int64]


def batch_rows(batch_size: float, n_rows: int) -> int:
    """Rows per batch for ``batch_size`` (rows, or a fraction in (0, 1)) on ``n_rows`` rows.

    A fraction rounds to the nearest row, at least 1; a row count is capped at ``n_rows``.
    ValueError for a non-positive size, a non-integral count above 1, or an empty shard.
    """
    if n_rows < 1:
        raise ValueError(f"batch_rows: the shard has no rows (n_rows={n_rows})")
    if not batch_size > 0:
        raise ValueError(
            f"batch size must be > 0 (rows, or a fraction in (0, 1)), got {batch_size}"
        )
    if batch_size < 1:
        return max(1, round(batch_size * n_rows))
    if batch_size != int(batch_size):
        raise ValueError(
            f"batch size {batch_size} is neither a row count (an integer) nor a fraction < 1"
        )
    return min(int(batch_size), n_rows)


class EpochSampler:
    """Row indices of successive minibatches of ``rows`` out of ``n_rows``, per-epoch shuffled."""

    def __init__(self, n_rows: int, rows: int, rng: np.random.Generator) -> None:
        if not 1 <= rows <= n_rows:
            raise ValueError(f"EpochSampler: rows must lie in [1, n_rows={n_rows}], got {rows}")
        self.n_rows = n_rows
        self.rows = rows
        self.rng = rng
        self.epochs = 0
        self._order: IndexArray = np.empty(0, dtype=np.int64)
        self._pos = 0

    @property
    def full(self) -> bool:
        """True when a batch is the whole shard (the gradient is then exact)."""
        return self.rows == self.n_rows

    def _new_epoch(self) -> None:
        self._order = self.rng.permutation(self.n_rows).astype(np.int64, copy=False)
        self._pos = 0
        self.epochs += 1

    def next(self) -> IndexArray:
        """The next batch's row indices (distinct within the batch, sorted)."""
        if self._pos >= self._order.size:
            self._new_epoch()
        take = self._order[self._pos : self._pos + self.rows]
        self._pos += take.size
        if take.size < self.rows:  # finish the batch from the next epoch, no repeats
            self._new_epoch()
            fresh = self._order[~np.isin(self._order, take)][: self.rows - take.size]
            # the next epoch starts with the rows lent to this batch, in its own order
            self._order = np.concatenate((fresh, self._order[~np.isin(self._order, fresh)]))
            self._pos = fresh.size
            take = np.concatenate((take, fresh))
        return np.sort(take).astype(np.int64, copy=False)


def batches_per_pass(batch_size: float) -> int:
    """The number of batches a pass over a shard splits into under local training with a
    minibatch fraction ``batch_size`` (``1 / batch_size``, which must be a whole number: 0.5,
    0.25, 0.2, 0.1, 0.05, ...). The same on every agent whatever its shard size, so a job's
    local steps can be set to whole passes. ValueError for anything else."""
    if not 0.0 < batch_size < 1.0:
        raise ValueError(
            f"local training takes its minibatch as a fraction of the shard (0.5, 0.25, 0.1, "
            f"...), got {batch_size:g}"
        )
    parts = round(1.0 / batch_size)
    if abs(parts * batch_size - 1.0) > 1e-9:
        raise ValueError(
            f"local training: the batch fraction {batch_size:g} must split a pass into a whole "
            f"number of batches (1/{batch_size:g} = {1.0 / batch_size:.4g}); use 1/k, e.g. 0.1"
        )
    return parts


class PassSampler:
    """Random reshuffling in whole passes: every pass draws a fresh permutation of the shard's
    rows and splits it into ``parts`` batches whose sizes differ by at most one row
    (``numpy.array_split``); :meth:`next` hands them out in order. Local training uses it so
    that the local steps between two messages visit every row the same number of times."""

    def __init__(self, n_rows: int, parts: int, rng: np.random.Generator) -> None:
        if not 1 <= parts <= n_rows:
            raise ValueError(
                f"PassSampler: a pass of {n_rows} rows cannot split into {parts} batches"
            )
        self.n_rows = n_rows
        self.parts = parts
        self.rng = rng
        self.passes = 0
        self._batches: list[IndexArray] = []

    @classmethod
    def of(cls, batch_size: float, n_rows: int, seed: int) -> PassSampler:
        """The sampler of a member's local steps: ``1 / batch_size`` batches a pass
        (:func:`batches_per_pass`) from the member's seed, stream 1 (an agent and the
        simulator's in-process aggregator draw the same batches)."""
        return cls(n_rows, batches_per_pass(batch_size), np.random.default_rng([seed, 1]))

    def next(self) -> IndexArray:
        """The next batch's row indices (sorted); a new pass starts when one is used up."""
        if not self._batches:
            order = self.rng.permutation(self.n_rows).astype(np.int64, copy=False)
            self._batches = [np.sort(b) for b in np.array_split(order, self.parts)][::-1]
            self.passes += 1
        return self._batches.pop()


__all__ = ["EpochSampler", "PassSampler", "batch_rows", "batches_per_pass"]
