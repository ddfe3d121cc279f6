"""Robust aggregates of one round's updates, for fleets that do not trust every agent.

Pure numpy, float64, deterministic (fixed order and dtype). The input is the round's
*weighted* updates stacked densely, ``rows[i] = w_i u_i`` (shape (K, d): the dense stack is
the cost of these rules, K*d*8 bytes per round, fine for modest d), and each function
returns the sum ``S`` such that the step is ``x <- x - (gamma / K) * S``, as for the plain
mean (``S = sum_i rows[i]``):

* :func:`clipped_sum`: every row scaled down to a norm of at most ``c`` times the round's
  median row norm, then summed. One agent sending a gradient scaled by s moves the step by
  at most ``c * median / K`` instead of ``s * |g| / K``.
* :func:`trimmed_sum`: ``K`` times the coordinate-wise trimmed mean: per coordinate, the
  ``floor(trim * K)`` largest and smallest values are dropped and the rest averaged. With
  ``floor(trim * K) >= 1`` one agent's value never enters a coordinate it is extreme in.

Neither applies to EF21 (its step uses the sum of the agents' states h_i, which must stay
exactly the sum of what each agent sent, or the agents' and the aggregator's h_i part).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def _check_rows(rows: FloatArray) -> None:
    if rows.ndim != 2 or rows.shape[0] < 1:
        raise ValueError(f"robust aggregate: rows must have shape (K >= 1, d), got {rows.shape}")


def clipped_sum(rows: FloatArray, c: float) -> FloatArray:
    """``sum_i min(1, c * median_j |rows[j]| / |rows[i]|) * rows[i]`` (L2 norms).

    Raises ValueError for ``c <= 0`` or a malformed stack."""
    _check_rows(rows)
    if not c > 0:
        raise ValueError(f"clipped_sum: c must be > 0, got {c}")
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
    bound = c * float(np.median(norms))
    scale = np.ones_like(norms)
    over = norms > bound
    scale[over] = bound / norms[over]  # norms > bound >= 0: no division by zero
    out: FloatArray = scale @ rows
    return out


def trim_count(k: int, trim: float) -> int:
    """How many values per side :func:`trimmed_sum` drops for K = ``k`` rows: ``floor(trim
    * k)``, but never so many that nothing is left."""
    return min(math.floor(trim * k), (k - 1) // 2)


def trimmed_sum(rows: FloatArray, trim: float) -> FloatArray:
    """``K`` times the coordinate-wise mean of ``rows`` without the ``trim_count(K, trim)``
    largest and smallest values of each coordinate.

    Raises ValueError for ``trim`` outside [0, 0.5) or a malformed stack."""
    _check_rows(rows)
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"trimmed_sum: trim must be in [0, 0.5), got {trim}")
    k = rows.shape[0]
    b = trim_count(k, trim)
    if b == 0:
        plain: FloatArray = rows.sum(axis=0)
        return plain
    kept = np.sort(rows, axis=0)[b : k - b]
    out: FloatArray = kept.mean(axis=0) * k
    return out
