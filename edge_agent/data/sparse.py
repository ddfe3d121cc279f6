"""A minimal compressed-sparse-row matrix in pure numpy (no scipy on the device).

Only what the models and the data readers need: products with vectors and
thin dense matrices, row selection, row scaling and conversions. Every
operation is vectorised: rows and features are never visited in a Python loop.

Semantics follow the usual CSR conventions: row ``i`` owns the entries
``data[indptr[i]:indptr[i+1]]`` at columns ``indices[indptr[i]:indptr[i+1]]``.
Column indices inside a row need not be sorted; repeated (row, column) pairs are
summed, exactly as a dense matrix built by accumulation would be.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from edge_agent.errors import DataError

FloatArray: TypeAlias = npt.NDArray[np.float64]
IndexArray: TypeAlias = npt.NDArray[np.int64]

__all__ = [
    "CSRMatrix",
    "ColumnIndex",
    "ColumnPass",
    "FloatArray",
    "IndexArray",
    "Matrix",
    "matmat",
    "matvec",
    "n_rows",
    "prefix_sq_norms",
    "rmatmat",
    "rmatvec",
    "row_norms_sq",
    "stable_order",
    "sum_sq_norm",
    "take_rows",
    "to_dense",
]


@dataclass(frozen=True, eq=False)
class CSRMatrix:
    """An immutable ``(n_rows, n_cols)`` sparse matrix in CSR layout.

    Contract (checked on construction, :class:`DataError` otherwise):
    ``data`` is float64 with ``nnz`` entries, ``indices`` int32 or int64 with
    ``nnz`` entries in ``[0, n_cols)``, ``indptr`` int64 with ``n_rows + 1``
    non-decreasing entries from 0 to ``nnz``. The arrays are stored read-only;
    every operation returns new arrays.
    """

    data: FloatArray
    indices: npt.NDArray[np.int32] | IndexArray
    indptr: IndexArray
    shape: tuple[int, int]
    _row_ids: IndexArray = field(init=False, repr=False, compare=False)
    _columns: ColumnIndex | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        n_rows_, n_cols = (int(self.shape[0]), int(self.shape[1]))
        if n_rows_ < 0 or n_cols < 0:
            raise DataError(f"CSRMatrix: shape must be non-negative, got {self.shape}")
        data = np.ascontiguousarray(self.data, dtype=np.float64)
        indices = np.asarray(self.indices)
        if indices.dtype not in (np.int32, np.int64):
            indices = indices.astype(np.int64)
        indices = np.ascontiguousarray(indices)
        indptr = np.ascontiguousarray(self.indptr, dtype=np.int64)
        if data.ndim != 1 or indices.ndim != 1 or indptr.ndim != 1:
            raise DataError("CSRMatrix: data, indices and indptr must be 1-D arrays")
        if indptr.size != n_rows_ + 1:
            raise DataError(
                f"CSRMatrix: indptr must have n_rows + 1 = {n_rows_ + 1} entries, got {indptr.size}"
            )
        nnz = data.size
        if indices.size != nnz:
            raise DataError(
                f"CSRMatrix: data has {nnz} entries but indices has {indices.size}; they must match"
            )
        if indptr[0] != 0 or indptr[-1] != nnz or np.any(np.diff(indptr) < 0):
            raise DataError(f"CSRMatrix: indptr must rise from 0 to nnz = {nnz} without decreasing")
        if nnz and (int(indices.min()) < 0 or int(indices.max()) >= n_cols):
            raise DataError(
                f"CSRMatrix: column indices must lie in [0, {n_cols}), "
                f"got [{int(indices.min())}, {int(indices.max())}]"
            )
        row_ids = np.repeat(np.arange(n_rows_, dtype=np.int64), np.diff(indptr))
        for arr in (data, indices, indptr, row_ids):
            arr.flags.writeable = False
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "indptr", indptr)
        object.__setattr__(self, "shape", (n_rows_, n_cols))
        object.__setattr__(self, "_row_ids", row_ids)
        object.__setattr__(self, "_columns", None)

    # ------------------------------------------------------------------ basics
    @property
    def nnz(self) -> int:
        """Number of stored entries (explicit zeros and duplicates included)."""
        return int(self.data.size)

    @property
    def row_ids(self) -> IndexArray:
        """Row index of every stored entry (read-only, length ``nnz``)."""
        return self._row_ids

    def __repr__(self) -> str:
        return f"CSRMatrix(shape={self.shape}, nnz={self.nnz})"

    @classmethod
    def from_dense(cls, a: npt.ArrayLike) -> CSRMatrix:
        """Build from a 2-D dense array, keeping exactly its non-zero entries."""
        arr = np.asarray(a, dtype=np.float64)
        if arr.ndim != 2:
            raise DataError(f"CSRMatrix.from_dense: need a 2-D array, got {arr.ndim}-D")
        rows, cols = np.nonzero(arr)
        counts = np.bincount(rows, minlength=arr.shape[0])
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return cls(arr[rows, cols], cols.astype(np.int64), indptr, (arr.shape[0], arr.shape[1]))

    @classmethod
    def from_coo(
        cls,
        rows: npt.ArrayLike,
        cols: npt.ArrayLike,
        values: npt.ArrayLike,
        shape: tuple[int, int],
    ) -> CSRMatrix:
        """Build from coordinate triplets in any order (duplicates are kept and summed)."""
        r = np.asarray(rows, dtype=np.int64)
        c = np.asarray(cols, dtype=np.int64)
        v = np.asarray(values, dtype=np.float64)
        if not (r.shape == c.shape == v.shape) or r.ndim != 1:
            raise DataError("CSRMatrix.from_coo: rows, cols and values must be 1-D of equal length")
        if r.size and (int(r.min()) < 0 or int(r.max()) >= shape[0]):
            raise DataError(f"CSRMatrix.from_coo: row indices must lie in [0, {shape[0]})")
        order = np.lexsort((c, r))
        counts = np.bincount(r, minlength=shape[0])
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return cls(v[order], c[order], indptr, shape)

    def to_dense(self) -> FloatArray:
        """Return the dense ``(n_rows, n_cols)`` float64 array (duplicates summed)."""
        out = np.zeros(self.shape, dtype=np.float64)
        np.add.at(out, (self._row_ids, self.indices), self.data)
        return out

    # ---------------------------------------------------------------- products
    def matvec(self, x: npt.ArrayLike) -> FloatArray:
        """Return ``A @ x`` for ``x`` of shape ``(n_cols,)``; empty rows give 0."""
        xv = np.asarray(x, dtype=np.float64)
        if xv.shape != (self.shape[1],):
            raise DataError(
                f"CSRMatrix.matvec: x must have shape ({self.shape[1]},), got {xv.shape}"
            )
        # one nnz-sized temporary: the gathered x, multiplied in place (a * b == b * a)
        weights = xv[self.indices]
        weights *= self.data
        return np.bincount(self._row_ids, weights=weights, minlength=self.shape[0]).astype(
            np.float64, copy=False
        )

    def rmatvec(self, y: npt.ArrayLike) -> FloatArray:
        """Return ``A.T @ y`` for ``y`` of shape ``(n_rows,)``; empty columns give 0."""
        yv = np.asarray(y, dtype=np.float64)
        if yv.shape != (self.shape[0],):
            raise DataError(
                f"CSRMatrix.rmatvec: y must have shape ({self.shape[0]},), got {yv.shape}"
            )
        weights = yv[self._row_ids]
        weights *= self.data
        return np.bincount(self.indices, weights=weights, minlength=self.shape[1]).astype(
            np.float64, copy=False
        )

    def matmat(self, x: npt.ArrayLike) -> FloatArray:
        """Return ``A @ X`` for a dense ``X`` of shape ``(n_cols, k)``."""
        xm = np.asarray(x, dtype=np.float64)
        if xm.ndim != 2 or xm.shape[0] != self.shape[1]:
            raise DataError(
                f"CSRMatrix.matmat: X must have shape ({self.shape[1]}, k), got {xm.shape}"
            )
        k = xm.shape[1]
        products = xm[self.indices]
        products *= self.data[:, None]
        # One bincount over (row, class) pairs flattened row-major scatters all k columns at once.
        slots = self._row_ids[:, None] * k + np.arange(k, dtype=np.int64)
        flat = np.bincount(slots.ravel(), weights=products.ravel(), minlength=self.shape[0] * k)
        return np.asarray(flat, dtype=np.float64).reshape(self.shape[0], k)

    def rmatmat(self, y: npt.ArrayLike) -> FloatArray:
        """Return ``A.T @ Y`` for a dense ``Y`` of shape ``(n_rows, k)``."""
        ym = np.asarray(y, dtype=np.float64)
        if ym.ndim != 2 or ym.shape[0] != self.shape[0]:
            raise DataError(
                f"CSRMatrix.rmatmat: Y must have shape ({self.shape[0]}, k), got {ym.shape}"
            )
        k = ym.shape[1]
        products = ym[self._row_ids]
        products *= self.data[:, None]
        slots = self.indices.astype(np.int64)[:, None] * k + np.arange(k, dtype=np.int64)
        flat = np.bincount(slots.ravel(), weights=products.ravel(), minlength=self.shape[1] * k)
        return np.asarray(flat, dtype=np.float64).reshape(self.shape[1], k)

    # ------------------------------------------------------------- row helpers
    def row_norms_sq(self) -> FloatArray:
        """Squared Euclidean norm of every row, shape ``(n_rows,)`` (duplicates not merged)."""
        return np.bincount(
            self._row_ids, weights=self.data * self.data, minlength=self.shape[0]
        ).astype(np.float64, copy=False)

    def columns(self) -> ColumnIndex:
        """The entries grouped by column (a CSC copy), built on first use and cached.

        Costs one stable sort of the ``nnz`` column indices (a linear-time radix sort for
        fewer than 2^32 columns) and ``nnz`` floats and row ids of memory; built once
        per matrix (a shard), so every later column access is a slice.
        """
        cached = self._columns
        if cached is None:
            order = stable_order(self.indices, self.shape[1])
            counts = np.bincount(self.indices, minlength=self.shape[1])
            indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
            # row ids as int32 when they fit: half the memory traffic of every later gather
            rows = self._row_ids[order]
            if self.shape[0] <= np.iinfo(np.int32).max:
                rows = rows.astype(np.int32)
            cached = ColumnIndex(self.data[order], rows, indptr, self.shape)
            # a benign race: two threads would build equal copies and keep either one
            object.__setattr__(self, "_columns", cached)
        return cached

    def row_nnz(self) -> IndexArray:
        """Number of stored entries in every row."""
        return np.diff(self.indptr)

    def col_nnz(self) -> IndexArray:
        """Number of stored entries in every column (document frequency for text data)."""
        return np.bincount(self.indices, minlength=self.shape[1]).astype(np.int64)

    def scale_rows(self, s: npt.ArrayLike) -> CSRMatrix:
        """Return ``diag(s) @ A`` for ``s`` of shape ``(n_rows,)``."""
        sv = np.asarray(s, dtype=np.float64)
        if sv.shape != (self.shape[0],):
            raise DataError(
                f"CSRMatrix.scale_rows: s must have shape ({self.shape[0]},), got {sv.shape}"
            )
        return CSRMatrix(self.data * sv[self._row_ids], self.indices, self.indptr, self.shape)

    def take_rows(self, idx: npt.ArrayLike) -> CSRMatrix:
        """Return the rows ``idx`` (any order, repeats allowed) as a new matrix."""
        rows = np.asarray(idx, dtype=np.int64).reshape(-1)
        if rows.size and (int(rows.min()) < -self.shape[0] or int(rows.max()) >= self.shape[0]):
            raise DataError(f"CSRMatrix.take_rows: row indices must lie in [0, {self.shape[0]})")
        rows = np.where(rows < 0, rows + self.shape[0], rows)
        starts = self.indptr[rows]
        counts = self.indptr[rows + 1] - starts
        new_indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        total = int(new_indptr[-1])
        # Position of each kept entry = its row's old start + its offset inside the row.
        positions = np.repeat(starts - new_indptr[:-1], counts) + np.arange(total, dtype=np.int64)
        return CSRMatrix(
            self.data[positions],
            self.indices[positions],
            new_indptr,
            (int(rows.size), self.shape[1]),
        )


@dataclass(frozen=True, eq=False)
class ColumnIndex:
    """The entries of a :class:`CSRMatrix` grouped by column (compressed sparse column).

    Column ``j`` owns ``data[indptr[j]:indptr[j+1]]`` at rows ``rows[...]`` (ascending
    inside a column, duplicates kept). Built by :meth:`CSRMatrix.columns`; read-only.
    """

    data: FloatArray
    rows: npt.NDArray[np.int32] | IndexArray
    indptr: IndexArray
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        for arr in (self.data, self.rows, self.indptr):
            arr.flags.writeable = False

    def gather(
        self, cols: IndexArray
    ) -> tuple[npt.NDArray[np.int32] | IndexArray, FloatArray, IndexArray]:
        """Entries of the columns ``cols`` (any order, repeats allowed), column by column.

        Returns ``(rows, values, owner)`` where ``owner[e]`` is the position in ``cols``
        of the column entry ``e`` came from; entries appear in the order of ``cols``.
        Costs O(len(cols) + entries gathered).
        """
        starts = self.indptr[cols]
        counts = self.indptr[cols + 1] - starts
        new_indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        total = int(new_indptr[-1])
        positions = np.repeat(starts - new_indptr[:-1], counts) + np.arange(total, dtype=np.int64)
        owner = np.repeat(np.arange(cols.size, dtype=np.int64), counts)
        return self.rows[positions], self.data[positions], owner


Matrix: TypeAlias = FloatArray | CSRMatrix
"""A design matrix: dense float64 ``(n_rows, n_cols)`` array or :class:`CSRMatrix`."""


def matvec(a: Matrix, x: FloatArray) -> FloatArray:
    """Return ``a @ x`` for a dense or CSR matrix."""
    if isinstance(a, CSRMatrix):
        return a.matvec(x)
    return np.asarray(a @ x, dtype=np.float64)


def rmatvec(a: Matrix, y: FloatArray) -> FloatArray:
    """Return ``a.T @ y`` for a dense or CSR matrix."""
    if isinstance(a, CSRMatrix):
        return a.rmatvec(y)
    return np.asarray(y @ a, dtype=np.float64)


def matmat(a: Matrix, x: FloatArray) -> FloatArray:
    """Return ``a @ X`` for a dense ``X`` of shape ``(n_cols, k)``."""
    if isinstance(a, CSRMatrix):
        return a.matmat(x)
    return np.asarray(a @ x, dtype=np.float64)


def rmatmat(a: Matrix, y: FloatArray) -> FloatArray:
    """Return ``a.T @ Y`` for a dense ``Y`` of shape ``(n_rows, k)``."""
    if isinstance(a, CSRMatrix):
        return a.rmatmat(y)
    return np.asarray(a.T @ y, dtype=np.float64)


def row_norms_sq(a: Matrix) -> FloatArray:
    """Squared Euclidean norm of every row."""
    if isinstance(a, CSRMatrix):
        return a.row_norms_sq()
    return np.asarray(np.einsum("ij,ij->i", a, a), dtype=np.float64)


def take_rows(a: Matrix, idx: npt.ArrayLike) -> Matrix:
    """Return the rows ``idx`` of a dense or CSR matrix."""
    if isinstance(a, CSRMatrix):
        return a.take_rows(idx)
    return np.ascontiguousarray(a[np.asarray(idx, dtype=np.int64)])


def n_rows(a: Matrix) -> int:
    """Number of rows of a dense or CSR matrix."""
    return int(a.shape[0])


def to_dense(a: Matrix) -> FloatArray:
    """Return a dense float64 copy-or-view of ``a``."""
    if isinstance(a, CSRMatrix):
        return a.to_dense()
    return np.asarray(a, dtype=np.float64)


# ------------------------------------------------------------ column combinations
def stable_order(keys: npt.NDArray[np.integer], bound: int) -> IndexArray:
    """``np.argsort(keys, kind="stable")`` for integer keys in ``[0, bound)``.

    numpy sorts 16-bit keys by a linear-time radix sort but wider ones by a merge
    sort several times slower; keys below 2^32 are therefore sorted as two stable
    16-bit passes (low half, then high half), the classic least-significant-digit radix.
    """
    if bound <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable").astype(np.int64, copy=False)
    if bound <= 1 << 32:
        wide = keys.astype(np.uint32)
        low = np.argsort((wide & 0xFFFF).astype(np.uint16), kind="stable")
        high = np.argsort((wide[low] >> 16).astype(np.uint16), kind="stable")
        return low[high].astype(np.int64, copy=False)
    return np.argsort(keys, kind="stable").astype(np.int64, copy=False)


def _column_entries(
    a: Matrix, cols: IndexArray
) -> tuple[npt.NDArray[np.int32] | IndexArray, FloatArray, IndexArray]:
    """``(rows, values, owner)`` of the non-zero entries of the columns ``cols``, in order."""
    if isinstance(a, CSRMatrix):
        return a.columns().gather(cols)
    sub = np.asarray(a, dtype=np.float64)[:, cols].T  # (len(cols), n): owner-major
    owner, rows = np.nonzero(sub)
    return rows.astype(np.int64), sub[owner, rows], owner.astype(np.int64)


def _combination_entries(
    a: Matrix,
    cols: npt.ArrayLike,
    coefs: npt.ArrayLike,
    slots: npt.ArrayLike | None,
    n_slots: int,
) -> tuple[npt.NDArray[np.int32] | IndexArray, FloatArray, IndexArray, int, int]:
    """Scaled entries of the combination and their output cell ``row * n_slots + slot``."""
    c = np.asarray(cols, dtype=np.int64).reshape(-1)
    w = np.asarray(coefs, dtype=np.float64).reshape(-1)
    if c.shape != w.shape:
        raise DataError(
            f"column combination: {c.size} columns but {w.size} coefficients; they must match"
        )
    if c.size and (int(c.min()) < 0 or int(c.max()) >= int(a.shape[1])):
        raise DataError(f"column combination: columns must lie in [0, {int(a.shape[1])})")
    if n_slots < 1:
        raise DataError(f"column combination: n_slots must be >= 1, got {n_slots}")
    rows, vals, owner = _column_entries(a, c)
    cells = rows
    if slots is not None:
        s = np.asarray(slots, dtype=np.int64).reshape(-1)
        if s.shape != c.shape or (s.size and (int(s.min()) < 0 or int(s.max()) >= n_slots)):
            raise DataError(
                f"column combination: need one slot in [0, {n_slots}) per column, got {s.shape}"
            )
        cells = rows * n_slots + s[owner]
    return cells, vals * w[owner], owner, int(a.shape[0]) * n_slots, int(c.size)


def sum_sq_norm(
    a: Matrix,
    cols: npt.ArrayLike,
    coefs: npt.ArrayLike,
    *,
    slots: npt.ArrayLike | None = None,
    n_slots: int = 1,
) -> float:
    """``|A Q|_F^2`` for the sparse ``(n_cols, n_slots)`` matrix ``Q`` with entries
    ``Q[cols[j], slots[j]] = coefs[j]`` (slots default to 0; repeated pairs add up).

    Touches only the listed columns (through the cached column index for CSR): O(their
    non-zeros), ``Q`` is never densified.
    """
    cells, w, _, n_cells, _ = _combination_entries(a, cols, coefs, slots, n_slots)
    v = np.bincount(cells, weights=w, minlength=n_cells)
    return float(np.einsum("i,i->", v, v))


def prefix_sq_norms(
    a: Matrix,
    cols: npt.ArrayLike,
    coefs: npt.ArrayLike,
    *,
    slots: npt.ArrayLike | None = None,
    n_slots: int = 1,
) -> FloatArray:
    """``S[T-1] = |A Q_T|_F^2`` for every prefix ``Q_T`` of the first T listed entries
    (one :meth:`ColumnPass.extend` from ``Q = 0``)."""
    return ColumnPass(a, n_slots=n_slots).extend(cols, coefs, slots=slots)


class ColumnPass:
    """The running product ``v = A Q`` of a direction built entry by entry, and
    ``|A Q_T|_F^2`` after every entry.

    The incremental identity ``|v + s a|^2 = |v|^2 + 2 s <v, a> + s^2 |a|^2`` applied entry
    by entry, vectorised per :meth:`extend`: the entries of the new columns are grouped by
    output cell ``row * n_slots + slot`` keeping the list order inside a cell (a stable
    radix sort), a segmented running sum on top of ``v`` gives each entry its cell's value
    ``p`` before it, and entry ``w`` adds ``w (2 p + w)``; one bincount by list position and
    a cumulative sum give every prefix. ``v`` is dense over the cells (``n_rows * n_slots``
    floats); each call costs O(new entries + non-zeros of their columns + cells).
    """

    def __init__(self, a: Matrix, *, n_slots: int = 1) -> None:
        if n_slots < 1:
            raise DataError(f"ColumnPass: n_slots must be >= 1, got {n_slots}")
        self.a = a
        self.n_slots = n_slots
        self.v: FloatArray = np.zeros(int(a.shape[0]) * n_slots, dtype=np.float64)
        self.sq = 0.0
        self.count = 0

    def extend(
        self, cols: npt.ArrayLike, coefs: npt.ArrayLike, *, slots: npt.ArrayLike | None = None
    ) -> FloatArray:
        """Add the entries in order; return ``|A Q_T|_F^2`` after each of them."""
        cells, w, owner, n_cells, m = _combination_entries(self.a, cols, coefs, slots, self.n_slots)
        self.count += m
        if w.size == 0:  # no entries, or only empty columns: A Q does not change
            return np.full(m, self.sq, dtype=np.float64)
        order = stable_order(cells, n_cells)
        w_sorted = w[order]
        # entries are now grouped by cell, cells ascending: a segmented running sum that
        # starts from the cell's current value v[cell]
        counts = np.bincount(cells, minlength=n_cells)
        present = np.flatnonzero(counts)
        sizes = counts[present]
        running = np.cumsum(w_sorted)
        seg_end = np.cumsum(sizes)
        before_segment = np.concatenate(([0.0], running[seg_end[:-1] - 1]))
        offset = np.repeat(before_segment - self.v[present], sizes)
        prev = running - offset - w_sorted
        delta = np.bincount(owner[order], weights=w_sorted * (2.0 * prev + w_sorted), minlength=m)
        out = self.sq + np.cumsum(delta)
        # each touched cell's new value: its old value plus its segment's sum
        self.v[present] += running[seg_end - 1] - before_segment
        self.sq = float(out[-1])
        return np.asarray(out, dtype=np.float64)
