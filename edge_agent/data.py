"""Datasets: the container, file readers/writers, an RCV1-like generator and shard splitting.

* :class:`Dataset` pairs a design matrix (dense float64 array or
  :class:`~edge_agent.sparse.CSRMatrix`) with a label vector.
* Readers for LIBSVM/SVMlight text, ``.npz`` and CSV; :func:`load_dataset`
  picks one from the file extension. LIBSVM parsing is vectorised over the
  whole file (no Python loop over lines), so real RCV1 (20k rows, 47k
  features, 1.5M non-zeros) loads in a few seconds on a small board.
* :func:`make_rcv1_like` generates a seeded sparse text-classification
  problem with RCV1's shape statistics.
* :func:`split_shards` partitions a dataset among agents.

Label convention: binary labels are ``-1.0``/``+1.0`` (``{0, 1}`` files are
mapped on read); multiclass labels are kept as the integers the file holds
(stored as float64). Every random choice takes an explicit numpy Generator.
This module never imports :mod:`edge_agent.models` (models import us).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from edge_agent.errors import DataError, lookup
from edge_agent.sparse import CSRMatrix, FloatArray, IndexArray, Matrix

__all__ = [
    "LIBSVM_SUFFIXES",
    "READERS",
    "SHARDINGS",
    "Dataset",
    "load_dataset",
    "make_rcv1_like",
    "read_csv",
    "read_libsvm",
    "read_npz",
    "split_shards",
    "write_libsvm",
    "write_npz",
]

LIBSVM_SUFFIXES = (".svm", ".libsvm", ".txt", ".svmlight")
_LIBSVM_HINT = "LIBSVM lines look like '<label> <index>:<value> <index>:<value> ...'"


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


def _normalise_labels(y: FloatArray, *, map_binary: bool) -> FloatArray:
    """Map a ``{0, 1}`` label set to ``{-1, +1}``; leave anything else unchanged."""
    if not map_binary or y.size == 0:
        return y
    values = np.unique(y)
    if np.all(np.isin(values, (0.0, 1.0))) and values[0] == 0.0:
        return np.where(y > 0, 1.0, -1.0)
    return y


# --------------------------------------------------------------------------- LIBSVM
def _compact_indices(cols: IndexArray, n_features: int) -> npt.NDArray[np.int32] | IndexArray:
    """Column indices as int32 when they fit (halves the index memory on a device)."""
    if n_features <= np.iinfo(np.int32).max:
        return cols.astype(np.int32)
    return cols.astype(np.int64)


def _blank(buf: npt.NDArray[np.uint8], starts: IndexArray, ends: IndexArray) -> None:
    """Overwrite the disjoint byte ranges ``[starts[i], ends[i])`` of ``buf`` with spaces."""
    marks = np.zeros(buf.size + 1, dtype=np.int8)
    marks[starts] += 1
    marks[ends] -= 1
    buf[np.cumsum(marks[:-1], dtype=np.int8) > 0] = ord(" ")


def _line_error(name: str, line: int, what: str) -> DataError:
    return DataError(f"{name}: line {line}: {what}; {_LIBSVM_HINT}")


def _parse_tokens(
    tokens: npt.NDArray[np.bytes_],
    dtype: npt.DTypeLike,
    token_lines: IndexArray,
    name: str,
    what: str,
) -> npt.NDArray[Any]:
    """Cast byte tokens to ``dtype``; on failure locate the first bad token by bisection."""
    try:
        return tokens.astype(dtype)
    except ValueError:
        pass
    lo, hi = 0, tokens.size  # invariant: the first bad token lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            tokens[lo:mid].astype(dtype)
        except ValueError:
            hi = mid
        else:
            lo = mid
    bad = tokens[lo].decode("utf-8", "replace")
    raise _line_error(name, int(token_lines[lo]), f"cannot read {what} {bad!r}")


def _parse_libsvm(
    raw: bytes,
    name: str,
    n_features: int | None,
    zero_based: bool | Literal["auto"],
    map_binary: bool,
    line_offset: int = 0,
) -> Dataset:
    """Parse LIBSVM text held in ``raw``; ``name`` is used in error messages.

    ``line_offset`` is the number of lines before ``raw`` in the file (for error messages).
    """
    # Work on a byte array; only booleans are kept per byte (int arrays are per token),
    # so a 40 MB file needs a few hundred MB at most.
    buf = np.frombuffer(raw, dtype=np.uint8).copy()
    newlines = np.flatnonzero(buf == ord("\n"))

    # Comments: blank every byte from the first '#' of a line to the end of that line.
    hashes = np.flatnonzero(buf == ord("#"))
    if hashes.size:
        line = np.searchsorted(newlines, hashes)
        keep = np.concatenate(([True], line[1:] != line[:-1]))
        starts, line = hashes[keep], line[keep]
        ends = np.where(
            line < newlines.size, newlines[np.minimum(line, newlines.size - 1)], buf.size
        )
        _blank(buf, starts, ends)

    is_ws = (buf == ord(" ")) | ((buf >= ord("\t")) & (buf <= ord("\r")))

    # Query ids (learning-to-rank files): blank whole 'qid:<n>' tokens.
    if buf.size >= 4:
        q = np.flatnonzero(
            (buf[:-3] == ord("q"))
            & (buf[1:-2] == ord("i"))
            & (buf[2:-1] == ord("d"))
            & (buf[3:] == ord(":"))
        )
        q = q[(q == 0) | is_ws[np.maximum(q - 1, 0)]]
        if q.size:
            ws_pos = np.flatnonzero(is_ws)
            nxt = np.searchsorted(ws_pos, q)
            ends = np.where(nxt < ws_pos.size, ws_pos[np.minimum(nxt, ws_pos.size - 1)], buf.size)
            _blank(buf, q, ends)
            is_ws = (buf == ord(" ")) | ((buf >= ord("\t")) & (buf <= ord("\r")))

    # Tokens are maximal runs of non-whitespace bytes.
    solid = ~is_ws
    prev_ws = np.concatenate(([True], is_ws[:-1]))
    next_ws = np.concatenate((is_ws[1:], [True]))
    tok_start = np.flatnonzero(solid & prev_ws)
    tok_end = np.flatnonzero(solid & next_ws) + 1
    del solid, prev_ws, next_ws, is_ws
    tok_line = np.searchsorted(newlines, tok_start) + 1 + line_offset  # 1-based physical lines
    n_tok = tok_start.size
    first = np.ones(n_tok, dtype=bool)
    if n_tok:
        first[1:] = tok_line[1:] != tok_line[:-1]

    colons = np.flatnonzero(buf == ord(":"))
    colons_before_start = np.searchsorted(colons, tok_start)
    n_colons = np.searchsorted(colons, tok_end) - colons_before_start
    bad_label = first & (n_colons != 0)
    if bad_label.any():
        i = int(np.argmax(bad_label))
        raise _line_error(
            name,
            int(tok_line[i]),
            f"the first token {raw[tok_start[i] : tok_end[i]].decode('utf-8', 'replace')!r} "
            "must be a label",
        )
    bad_pair = ~first & (n_colons != 1)
    if bad_pair.any():
        i = int(np.argmax(bad_pair))
        raise _line_error(
            name,
            int(tok_line[i]),
            f"token {raw[tok_start[i] : tok_end[i]].decode('utf-8', 'replace')!r} "
            "is not '<index>:<value>'",
        )
    feat = ~first
    colon_pos = colons[colons_before_start[feat]]
    empty_part = (colon_pos == tok_start[feat]) | (colon_pos == tok_end[feat] - 1)
    if empty_part.any():
        i = int(np.flatnonzero(feat)[np.argmax(empty_part)])
        raise _line_error(
            name,
            int(tok_line[i]),
            f"token {raw[tok_start[i] : tok_end[i]].decode('utf-8', 'replace')!r} "
            "has an empty index or value",
        )

    # Split every 'i:v' into two tokens; the order is now label, i, v, i, v, ... per row.
    buf[colon_pos] = ord(" ")
    parts = np.array(buf.tobytes().split(), dtype=np.bytes_)
    per_token = np.where(first, 1, 2)
    if parts.size != int(per_token.sum()):  # cannot happen after the checks above
        raise DataError(f"{name}: could not tokenise the file; {_LIBSVM_HINT}")
    part_line = np.repeat(tok_line, per_token)
    part_is_label = np.repeat(first, per_token)
    # Within the pair of a feature token, the first part is the index.
    part_offset = np.arange(parts.size) - np.repeat(np.cumsum(per_token) - per_token, per_token)
    part_is_index = ~part_is_label & (part_offset == 0)
    part_is_value = ~part_is_label & (part_offset == 1)

    labels = np.asarray(
        _parse_tokens(
            parts[part_is_label], np.float64, part_line[part_is_label], name, "the label"
        ),
        dtype=np.float64,
    )
    raw_idx = np.asarray(
        _parse_tokens(
            parts[part_is_index], np.int64, part_line[part_is_index], name, "the feature index"
        ),
        dtype=np.int64,
    )
    values = np.asarray(
        _parse_tokens(
            parts[part_is_value], np.float64, part_line[part_is_value], name, "the feature value"
        ),
        dtype=np.float64,
    )
    value_lines = part_line[part_is_value]
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.argmax(bad))
        raise _line_error(name, int(value_lines[i]), f"feature value {values[i]} is not finite")
    bad = ~np.isfinite(labels)
    if bad.any():
        i = int(np.argmax(bad))
        raise _line_error(
            name, int(part_line[part_is_label][i]), f"label {labels[i]} is not finite"
        )

    if zero_based == "auto":
        zero_based = bool(raw_idx.size) and int(raw_idx.min()) == 0
    cols = raw_idx if zero_based else raw_idx - 1
    if cols.size and int(cols.min()) < 0:
        i = int(np.argmax(cols < 0))
        raise _line_error(
            name,
            int(value_lines[i]),
            f"feature index {int(raw_idx[i])} is below the first index "
            f"({0 if zero_based else 1}); pass zero_based=True for 0-based files",
        )
    seen = int(cols.max()) + 1 if cols.size else 0
    if n_features is None:
        n_features = seen
    elif seen > n_features:
        i = int(np.argmax(cols >= n_features))
        raise _line_error(
            name,
            int(value_lines[i]),
            f"feature index {int(raw_idx[i])} does not fit n_features={n_features}; "
            f"pass n_features >= {seen}",
        )

    n_rows = int(labels.size)
    row_of_token = np.cumsum(first) - 1
    counts = np.bincount(row_of_token[feat], minlength=n_rows)
    indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    if cols.size > 1:
        keys = np.repeat(np.arange(n_rows, dtype=np.int64), counts) * max(n_features, 1) + cols
        if np.any(np.diff(keys) < 0):  # indices out of order inside a row: sort them
            order = np.argsort(keys, kind="stable")
            cols, values = cols[order], values[order]
    X = CSRMatrix(values, _compact_indices(cols, n_features), indptr, (n_rows, n_features))
    return Dataset(X, _normalise_labels(labels, map_binary=map_binary))


def read_libsvm(
    path: str | Path,
    n_features: int | None = None,
    zero_based: bool | Literal["auto"] = "auto",
    *,
    map_binary: bool = True,
) -> Dataset:
    """Read a LIBSVM/SVMlight text file into a sparse :class:`Dataset`.

    Format: one row per line, ``<label> [qid:<n>] <index>:<value> ...``;
    ``#`` starts a comment, blank lines are skipped, ``qid`` is ignored.
    Indices are 1-based (the LIBSVM default) unless ``zero_based`` is True;
    ``"auto"`` treats the file as 0-based exactly when some index is 0.
    ``n_features`` defaults to the largest index seen; pass it to read a
    shard of a wider dataset. Out-of-order indices within a row are sorted;
    repeated indices are kept and summed by every matrix operation.

    Labels: ``{0, 1}`` becomes ``{-1, +1}`` when ``map_binary`` (default);
    ``{-1, +1}`` and multiclass integers are kept. Raises :class:`DataError`
    naming the file, the line and the offending token.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read the file ({exc.strerror}); check the path") from exc
    if n_features is not None and n_features < 0:
        raise DataError(f"{path}: n_features must be >= 0, got {n_features}")
    if len(raw) <= CHUNK_BYTES:
        return _parse_libsvm(raw, str(path), n_features, zero_based, map_binary)
    return _parse_libsvm_chunked(raw, str(path), n_features, zero_based, map_binary)


#: Files larger than this are parsed in pieces of about this size: the tokeniser needs
#: roughly ten times its input in temporaries, which a device cannot spare for a whole file.
CHUNK_BYTES = 1 << 20


def _parse_libsvm_chunked(
    raw: bytes,
    name: str,
    n_features: int | None,
    zero_based: bool | Literal["auto"],
    map_binary: bool,
) -> Dataset:
    """Parse ``raw`` chunk by chunk (split at line ends) and join the rows."""
    parts: list[Dataset] = []
    start = 0
    lines_before = 0
    while start < len(raw):
        end = raw.find(b"\n", min(start + CHUNK_BYTES, len(raw)) - 1)
        end = len(raw) if end < 0 else end + 1
        chunk = raw[start:end]
        # "auto" is decided on the whole file: keep raw indices (as 0-based) for now.
        zb: bool | Literal["auto"] = True if zero_based == "auto" else zero_based
        width_hint = None if zero_based == "auto" else n_features
        parts.append(_parse_libsvm(chunk, name, width_hint, zb, False, line_offset=lines_before))
        lines_before += chunk.count(b"\n")
        start = end
    mats = [p.X for p in parts if isinstance(p.X, CSRMatrix)]
    data = np.concatenate([m.data for m in mats])
    cols = np.concatenate([np.asarray(m.indices, dtype=np.int64) for m in mats])
    offsets = np.cumsum(np.array([0] + [m.nnz for m in mats[:-1]], dtype=np.int64))
    indptr = np.concatenate(
        [np.zeros(1, dtype=np.int64)]
        + [
            np.asarray(m.indptr[1:], dtype=np.int64) + off
            for m, off in zip(mats, offsets, strict=True)
        ]
    )
    labels = np.concatenate([np.asarray(p.y, dtype=np.float64) for p in parts])
    if zero_based == "auto" and cols.size and int(cols.min()) > 0:
        cols -= 1  # no index 0 anywhere: the file is 1-based (the LIBSVM default)
    seen = int(cols.max()) + 1 if cols.size else 0
    width = seen if n_features is None else n_features
    if seen > width:  # "auto" mode only: otherwise every chunk checked it, with line numbers
        raise DataError(
            f"{name}: feature index {seen} does not fit n_features={width}; pass n_features >= {seen}"
        )
    X = CSRMatrix(data, _compact_indices(cols, width), indptr, (labels.size, width))
    return Dataset(X, _normalise_labels(labels, map_binary=map_binary))


def _format_numbers(values: FloatArray) -> list[str]:
    """Shortest round-trip text for each number (integers without a decimal point)."""
    if values.size and np.all(values == np.round(values)) and np.all(np.abs(values) < 2**53):
        return list(map(str, values.astype(np.int64).tolist()))
    return list(map(repr, values.tolist()))


def write_libsvm(ds: Dataset, path: str | Path, *, zero_based: bool = False) -> None:
    """Write ``ds`` as LIBSVM text (1-based indices unless ``zero_based``).

    Only non-zero entries of a dense ``X`` are written. Values are written in
    Python's shortest round-trip form, so :func:`read_libsvm` reads back the
    exact float64 values. Note that the reader infers the column count from
    the largest index: pass ``n_features`` when trailing columns are empty.
    """
    X = ds.X if isinstance(ds.X, CSRMatrix) else CSRMatrix.from_dense(ds.X)
    offset = 0 if zero_based else 1
    idx = np.array(list(map(str, (X.indices.astype(np.int64) + offset).tolist())), dtype=str)
    vals = np.array(_format_numbers(X.data), dtype=str)
    labels = np.array(_format_numbers(ds.y), dtype=str)
    pairs = np.char.add(np.char.add(idx, ":"), vals) if X.nnz else np.array([], dtype=str)
    n_rows = X.shape[0]
    # Row i occupies slots indptr[i] + i (its label) .. indptr[i + 1] + i (its last pair).
    items = np.empty(n_rows + X.nnz, dtype=object)
    label_slot = X.indptr[:-1] + np.arange(n_rows)
    items[label_slot] = labels
    pair_slot = np.arange(X.nnz) + X.row_ids + 1
    items[pair_slot] = pairs
    seps = np.full(items.size, " ", dtype=object)
    seps[X.indptr[1:] + np.arange(n_rows)] = "\n"
    text = "".join((items + seps).tolist())
    try:
        Path(path).write_text(text, encoding="ascii")
    except OSError as exc:
        raise DataError(f"{path}: cannot write the file ({exc.strerror}); check the path") from exc


# --------------------------------------------------------------------------- npz / csv
def read_npz(path: str | Path, *, map_binary: bool = True) -> Dataset:
    """Read a ``.npz`` archive: keys ``X``, ``y`` (dense) or ``data``, ``indices``,
    ``indptr``, ``shape``, ``y`` (CSR). Pickled objects are refused."""
    try:
        with np.load(Path(path), allow_pickle=False) as z:
            keys = set(z.files)
            if {"X", "y"} <= keys:
                return Dataset(
                    np.asarray(z["X"], dtype=np.float64),
                    _normalise_labels(np.asarray(z["y"], dtype=np.float64), map_binary=map_binary),
                )
            if {"data", "indices", "indptr", "shape", "y"} <= keys:
                shape = tuple(int(s) for s in np.asarray(z["shape"]).reshape(-1))
                if len(shape) != 2:
                    raise DataError(f"{path}: 'shape' must hold 2 integers, got {shape}")
                X = CSRMatrix(z["data"], z["indices"], z["indptr"], (shape[0], shape[1]))
                y = np.asarray(z["y"], dtype=np.float64)
                return Dataset(X, _normalise_labels(y, map_binary=map_binary))
    except DataError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise DataError(f"{path}: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read as .npz ({exc}); write it with write_npz") from exc
    raise DataError(
        f"{path}: found keys {sorted(keys)}; need 'X' and 'y' (dense) or "
        "'data', 'indices', 'indptr', 'shape' and 'y' (CSR)"
    )


def write_npz(ds: Dataset, path: str | Path) -> None:
    """Write ``ds`` as a compressed ``.npz`` that :func:`read_npz` reads back exactly."""
    try:
        with Path(path).open("wb") as fh:
            if isinstance(ds.X, CSRMatrix):
                np.savez_compressed(
                    fh,
                    data=ds.X.data,
                    indices=ds.X.indices,
                    indptr=ds.X.indptr,
                    shape=np.array(ds.X.shape, dtype=np.int64),
                    y=ds.y,
                )
            else:
                np.savez_compressed(fh, X=ds.X, y=ds.y)
    except OSError as exc:
        raise DataError(f"{path}: cannot write the file ({exc.strerror}); check the path") from exc


def read_csv(
    path: str | Path,
    label_column: int = 0,
    *,
    delimiter: str = ",",
    map_binary: bool = True,
) -> Dataset:
    """Read a dense CSV file; column ``label_column`` (negative counts from the end) holds labels.

    A first line that does not parse as numbers is taken as a header and skipped.
    """
    p = Path(path)
    try:
        with p.open("r", encoding="utf-8") as fh:
            first_line = fh.readline()
    except OSError as exc:
        raise DataError(f"{path}: cannot read the file ({exc.strerror}); check the path") from exc
    try:
        np.array(first_line.strip().split(delimiter), dtype=np.float64)
        header = 0
    except ValueError:
        header = 1
    try:
        table = np.loadtxt(p, delimiter=delimiter, skiprows=header, ndmin=2, dtype=np.float64)
    except ValueError as exc:
        raise DataError(
            f"{path}: {exc}; every row needs the same number of numeric fields "
            f"separated by {delimiter!r}"
        ) from exc
    n_cols = table.shape[1]
    if not -n_cols <= label_column < n_cols:
        raise DataError(
            f"{path}: label_column={label_column} is outside the {n_cols} columns; "
            f"pass a value in [{-n_cols}, {n_cols})"
        )
    col = label_column % n_cols
    y = np.ascontiguousarray(table[:, col])
    X = np.delete(table, col, axis=1)
    return Dataset(X, _normalise_labels(y, map_binary=map_binary))


def _read_libsvm_default(path: Path) -> Dataset:
    return read_libsvm(path)


def _read_npz_default(path: Path) -> Dataset:
    return read_npz(path)


def _read_csv_default(path: Path) -> Dataset:
    return read_csv(path)


READERS: dict[str, Callable[[Path], Dataset]] = {
    **dict.fromkeys(LIBSVM_SUFFIXES, _read_libsvm_default),
    ".npz": _read_npz_default,
    ".csv": _read_csv_default,
}
"""File extension -> reader used by :func:`load_dataset`."""


def load_dataset(path: str | Path, *, n_features: int | None = None) -> Dataset:
    """Read a dataset, choosing the reader from the file extension (see :data:`READERS`).

    ``n_features`` pads a LIBSVM file to that width (for shards of a wider
    set) and is checked against the width of other formats.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in READERS:
        valid = ", ".join(sorted(READERS))
        raise DataError(f"{path}: unknown data file extension {suffix!r}; use one of {valid}")
    if suffix in LIBSVM_SUFFIXES:
        return read_libsvm(p, n_features=n_features)
    ds = READERS[suffix](p)
    if n_features is not None and ds.n_features != n_features:
        raise DataError(f"{path}: has {ds.n_features} features, expected n_features={n_features}")
    return ds


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
      ``idf = 1 + log((1 + n_rows) / (1 + df))``), then every row is scaled to
      unit Euclidean norm, as RCV1 is.
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
    idf = 1.0 + np.log((1.0 + n_rows) / (1.0 + df))
    tf = 1.0 + np.log(rng.geometric(0.5, size=keys.size).astype(np.float64))
    values = tf * idf[cols]
    norms = np.sqrt(np.bincount(row_ids, weights=values * values, minlength=n_rows))
    values /= norms[row_ids]
    counts = np.bincount(row_ids, minlength=n_rows)
    indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    X = CSRMatrix(values, _compact_indices(cols, n_features), indptr, (n_rows, n_features))

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
