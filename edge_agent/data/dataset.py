"""The dataset container: a design matrix with one label per row.

* :class:`Dataset` pairs a design matrix (dense float64 array or
  :class:`~edge_agent.data.sparse.CSRMatrix`) with a label vector.
* :func:`normalise_labels` and :func:`compact_indices` are the conventions every reader
  and the generator share (labels ``{0, 1}`` -> ``{-1, +1}``; int32 column indices when
  they fit).

Label convention: binary labels are ``-1.0``/``+1.0`` (``{0, 1}`` files are
mapped on read); multiclass labels are kept as the integers the file holds
(stored as float64). This module never imports :mod:`edge_agent.numerics.models` (models import us).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from edge_agent.data.sparse import CSRMatrix, FloatArray, IndexArray, Matrix
from edge_agent.errors import DataError

__all__ = ["Dataset", "compact_indices", "normalise_labels"]


# --------------------------------------------------------------------------- container
@dataclass(frozen=True, eq=False)
class Dataset:
    """Rows of features ``X`` with one label per row in ``y``.

    ``X`` is a dense float64 ``(n_rows, n_features)`` array or a
    :class:`CSRMatrix`; ``y`` is float64 of shape ``(n_rows,)``. Checked on
    construction (:class:`DataError` otherwise); dense inputs are converted
    to contiguous float64.
    """

    X: Matrix
    y: FloatArray

    def __post_init__(self) -> None:
        x = self.X
        if not isinstance(x, CSRMatrix):
            x = np.ascontiguousarray(x, dtype=np.float64)
            if x.ndim != 2:
                raise DataError(f"Dataset: X must be 2-D (rows, features), got {x.ndim}-D")
        y = np.ascontiguousarray(self.y, dtype=np.float64)
        if y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise DataError(
                f"Dataset: y must have one label per row ({x.shape[0]},), got shape {y.shape}"
            )
        object.__setattr__(self, "X", x)
        object.__setattr__(self, "y", y)

    @property
    def n_rows(self) -> int:
        """Number of rows (examples)."""
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        """Number of feature columns."""
        return int(self.X.shape[1])

    @property
    def is_sparse(self) -> bool:
        """True when ``X`` is a :class:`CSRMatrix`."""
        return isinstance(self.X, CSRMatrix)

    def take(self, rows: npt.ArrayLike) -> Dataset:
        """Return the rows ``rows`` (any order, repeats allowed) as a new dataset."""
        idx = np.asarray(rows, dtype=np.int64).reshape(-1)
        if isinstance(self.X, CSRMatrix):
            return Dataset(self.X.take_rows(idx), self.y[idx])
        return Dataset(self.X[idx], self.y[idx])

    def __repr__(self) -> str:
        kind = f"CSR nnz={self.X.nnz}" if isinstance(self.X, CSRMatrix) else "dense"
        return f"Dataset(n_rows={self.n_rows}, n_features={self.n_features}, {kind})"


def normalise_labels(y: FloatArray, *, map_binary: bool) -> FloatArray:
    """Map a ``{0, 1}`` label set to ``{-1, +1}``; leave anything else unchanged."""
    if not map_binary or y.size == 0:
        return y
    # (not np.unique: it imports numpy.ma, about 1.2 MB on a device that never uses it)
    zero = y == 0.0
    if zero.any() and bool(np.all(zero | (y == 1.0))):
        return np.where(y > 0, 1.0, -1.0)
    return y


def compact_indices(
    cols: npt.NDArray[np.int32] | IndexArray, n_features: int
) -> npt.NDArray[np.int32] | IndexArray:
    """Column indices as int32 when they fit (halves the index memory on a device); no copy
    when they already are of that type."""
    if n_features <= np.iinfo(np.int32).max:
        return cols.astype(np.int32, copy=False)
    return cols.astype(np.int64, copy=False)
