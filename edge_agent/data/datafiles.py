"""Dataset files: LIBSVM/SVMlight text, ``.npz`` and CSV readers and writers.

:func:`load_dataset` picks a reader from the file extension (:data:`READERS`). LIBSVM
parsing is vectorised over the whole file (no Python loop over lines), so real RCV1 (20k
rows, 47k features, 1.5M non-zeros) loads in a few seconds on a small board; files larger
than :data:`CHUNK_BYTES` are read and parsed in pieces of about that size.

Labels: ``{0, 1}`` files are mapped to ``{-1, +1}`` on read (``map_binary``), anything
else is kept (:func:`~edge_agent.data.dataset.normalise_labels`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from edge_agent.data.dataset import Dataset, compact_indices, normalise_labels
from edge_agent.data.sparse import CSRMatrix, FloatArray, IndexArray
from edge_agent.errors import DataError

__all__ = [
    "CHUNK_BYTES",
    "LIBSVM_SUFFIXES",
    "READERS",
    "load_dataset",
    "read_csv",
    "read_libsvm",
    "read_npz",
    "write_libsvm",
    "write_npz",
]

LIBSVM_SUFFIXES = (".svm", ".libsvm", ".txt", ".svmlight")
_LIBSVM_HINT = "LIBSVM lines look like '<label> <index>:<value> <index>:<value> ...'"

BoolArray = npt.NDArray[np.bool_]


# --------------------------------------------------------------------------- LIBSVM
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


class _Tokens(NamedTuple):
    """The whitespace-separated tokens of a LIBSVM text, by byte position."""

    start: IndexArray  # first byte of each token
    end: IndexArray  # one past its last byte
    line: IndexArray  # 1-based physical line in the file
    first: BoolArray  # the token opens its line (so it must be a label)


class _Entries(NamedTuple):
    """The numbers of a LIBSVM text: one label per row, (index, value) per feature token."""

    labels: FloatArray
    label_lines: IndexArray
    indices: IndexArray  # as written in the file (0- or 1-based)
    values: FloatArray
    value_lines: IndexArray  # the line of each (index, value) pair


def _whitespace(buf: npt.NDArray[np.uint8]) -> BoolArray:
    is_ws: BoolArray = (buf == ord(" ")) | ((buf >= ord("\t")) & (buf <= ord("\r")))
    return is_ws


def _blank_comments(buf: npt.NDArray[np.uint8], newlines: IndexArray) -> None:
    """Blank every byte from the first '#' of a line to the end of that line."""
    hashes = np.flatnonzero(buf == ord("#"))
    if not hashes.size:
        return
    line = np.searchsorted(newlines, hashes)
    keep = np.concatenate(([True], line[1:] != line[:-1]))
    starts, line = hashes[keep], line[keep]
    ends = np.where(line < newlines.size, newlines[np.minimum(line, newlines.size - 1)], buf.size)
    _blank(buf, starts, ends)


def _blank_query_ids(buf: npt.NDArray[np.uint8]) -> BoolArray:
    """Blank whole 'qid:<n>' tokens (learning-to-rank files); return the whitespace mask."""
    is_ws = _whitespace(buf)
    if buf.size < 4:
        return is_ws
    q = np.flatnonzero(
        (buf[:-3] == ord("q"))
        & (buf[1:-2] == ord("i"))
        & (buf[2:-1] == ord("d"))
        & (buf[3:] == ord(":"))
    )
    q = q[(q == 0) | is_ws[np.maximum(q - 1, 0)]]
    if not q.size:
        return is_ws
    ws_pos = np.flatnonzero(is_ws)
    nxt = np.searchsorted(ws_pos, q)
    ends = np.where(nxt < ws_pos.size, ws_pos[np.minimum(nxt, ws_pos.size - 1)], buf.size)
    _blank(buf, q, ends)
    return _whitespace(buf)


def _tokenise(is_ws: BoolArray, newlines: IndexArray, line_offset: int) -> _Tokens:
    """Tokens are maximal runs of non-whitespace bytes."""
    solid = ~is_ws
    prev_ws = np.concatenate(([True], is_ws[:-1]))
    next_ws = np.concatenate((is_ws[1:], [True]))
    start = np.flatnonzero(solid & prev_ws)
    end = np.flatnonzero(solid & next_ws) + 1
    del solid, prev_ws, next_ws
    line = np.searchsorted(newlines, start) + 1 + line_offset  # 1-based physical lines
    first = np.ones(start.size, dtype=bool)
    if start.size:
        first[1:] = line[1:] != line[:-1]
    return _Tokens(start, end, line, first)


def _token_error(raw: bytes, tok: _Tokens, i: int, name: str, what: str, problem: str) -> DataError:
    """``what`` 'text' ``problem``, at the line of token ``i``."""
    text = raw[tok.start[i] : tok.end[i]].decode("utf-8", "replace")
    return _line_error(name, int(tok.line[i]), f"{what} {text!r} {problem}")


def _colons_of_pairs(raw: bytes, buf: npt.NDArray[np.uint8], tok: _Tokens, name: str) -> IndexArray:
    """Check that each line is a label then '<index>:<value>' tokens; return the colons."""
    colons = np.flatnonzero(buf == ord(":"))
    colons_before_start = np.searchsorted(colons, tok.start)
    n_colons = np.searchsorted(colons, tok.end) - colons_before_start
    bad_label = tok.first & (n_colons != 0)
    if bad_label.any():
        i = int(np.argmax(bad_label))
        raise _token_error(raw, tok, i, name, "the first token", "must be a label")
    bad_pair = ~tok.first & (n_colons != 1)
    if bad_pair.any():
        i = int(np.argmax(bad_pair))
        raise _token_error(raw, tok, i, name, "token", "is not '<index>:<value>'")
    feat = ~tok.first
    colon_pos: IndexArray = colons[colons_before_start[feat]]
    empty_part = (colon_pos == tok.start[feat]) | (colon_pos == tok.end[feat] - 1)
    if empty_part.any():
        i = int(np.flatnonzero(feat)[np.argmax(empty_part)])
        raise _token_error(raw, tok, i, name, "token", "has an empty index or value")
    return colon_pos


def _fixed_width(
    buf: npt.NDArray[np.uint8], start: IndexArray, end: IndexArray
) -> npt.NDArray[np.bytes_]:
    """The byte strings ``buf[start[i]:end[i]]`` as one fixed-width ``S`` array (zero-padded,
    as ``np.array(list_of_bytes)`` builds it), gathered one character column at a time: no
    Python object per token, temporaries of one index per token."""
    length = end - start
    width = max(1, int(length.max()) if length.size else 1)
    out = np.zeros((start.size, width), dtype=np.uint8)
    for j in range(width):
        has = np.flatnonzero(length > j)
        out[has, j] = buf[start[has] + j]
    return out.view(f"S{width}").ravel()


def _read_entries(
    buf: npt.NDArray[np.uint8], tok: _Tokens, colon_pos: IndexArray, name: str
) -> _Entries:
    """Split every 'i:v' at its colon and cast labels, indices and values."""
    feat = ~tok.first
    labels = np.asarray(
        _parse_tokens(
            _fixed_width(buf, tok.start[tok.first], tok.end[tok.first]),
            np.float64,
            tok.line[tok.first],
            name,
            "the label",
        ),
        dtype=np.float64,
    )
    value_lines = tok.line[feat]
    raw_idx = np.asarray(
        _parse_tokens(
            _fixed_width(buf, tok.start[feat], colon_pos),
            np.int64,
            value_lines,
            name,
            "the feature index",
        ),
        dtype=np.int64,
    )
    values = np.asarray(
        _parse_tokens(
            _fixed_width(buf, colon_pos + 1, tok.end[feat]),
            np.float64,
            value_lines,
            name,
            "the feature value",
        ),
        dtype=np.float64,
    )
    return _Entries(labels, tok.line[tok.first], raw_idx, values, value_lines)


def _check_finite(entries: _Entries, name: str) -> None:
    bad = ~np.isfinite(entries.values)
    if bad.any():
        i = int(np.argmax(bad))
        raise _line_error(
            name, int(entries.value_lines[i]), f"feature value {entries.values[i]} is not finite"
        )
    bad = ~np.isfinite(entries.labels)
    if bad.any():
        i = int(np.argmax(bad))
        raise _line_error(
            name, int(entries.label_lines[i]), f"label {entries.labels[i]} is not finite"
        )


def _columns(
    entries: _Entries, name: str, n_features: int | None, zero_based: bool | Literal["auto"]
) -> tuple[IndexArray, int]:
    """The 0-based column of every entry and the width, checked against ``n_features``."""
    raw_idx, value_lines = entries.indices, entries.value_lines
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
    return cols, n_features


class _Rows(NamedTuple):
    """Parsed rows: a label and an entry count per row, then every row's (column, value)
    entries in file order, columns sorted within each row; ``width``: the columns."""

    labels: FloatArray
    counts: IndexArray
    cols: IndexArray  # 0-based
    values: FloatArray
    width: int


def _sorted_rows(
    first: BoolArray, labels: FloatArray, cols: IndexArray, values: FloatArray, n_features: int
) -> _Rows:
    """Rows in file order, columns sorted within each row."""
    n_rows = int(labels.size)
    row_of_token = np.cumsum(first) - 1
    counts = np.bincount(row_of_token[~first], minlength=n_rows)
    if cols.size > 1:
        keys = np.repeat(np.arange(n_rows, dtype=np.int64), counts) * max(n_features, 1) + cols
        if np.any(np.diff(keys) < 0):  # indices out of order inside a row: sort them
            order = np.argsort(keys, kind="stable")
            cols, values = cols[order], values[order]
    return _Rows(labels, counts, cols, values, n_features)


def _indptr(counts: IndexArray) -> IndexArray:
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def _parse_libsvm(
    raw: bytes,
    name: str,
    n_features: int | None,
    zero_based: bool | Literal["auto"],
    map_binary: bool,
) -> Dataset:
    """Parse LIBSVM text held in ``raw`` (a whole file); ``name`` is used in error messages."""
    rows = _parse_rows(raw, name, n_features, zero_based)
    n_rows, width = int(rows.labels.size), rows.width
    indptr = _indptr(rows.counts)
    X = CSRMatrix(rows.values, compact_indices(rows.cols, width), indptr, (n_rows, width))
    return Dataset(X, normalise_labels(rows.labels, map_binary=map_binary))


def _parse_rows(
    raw: bytes,
    name: str,
    n_features: int | None,
    zero_based: bool | Literal["auto"],
    line_offset: int = 0,
) -> _Rows:
    """The rows of the LIBSVM text ``raw``, checked (DataError naming ``name`` and the line).

    ``line_offset`` is the number of lines before ``raw`` in the file (for error messages).
    """
    # Work on a byte array; only booleans are kept per byte (int arrays are per token),
    # so a 40 MB file needs a few hundred MB at most.
    buf = np.frombuffer(raw, dtype=np.uint8).copy()
    newlines = np.flatnonzero(buf == ord("\n"))
    _blank_comments(buf, newlines)
    is_ws = _blank_query_ids(buf)
    tok = _tokenise(is_ws, newlines, line_offset)
    del is_ws
    colon_pos = _colons_of_pairs(raw, buf, tok, name)
    entries = _read_entries(buf, tok, colon_pos, name)
    _check_finite(entries, name)
    cols, width = _columns(entries, name, n_features, zero_based)
    return _sorted_rows(tok.first, entries.labels, cols, entries.values, width)


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
    try:
        with Path(path).open("rb") as f:
            return _read_libsvm_file(f, str(path), n_features, zero_based, map_binary)
    except OSError as exc:  # (opening or reading: the parser itself does no I/O)
        raise DataError(f"{path}: cannot read the file ({exc.strerror}); check the path") from exc


def _read_libsvm_file(
    f: BinaryIO,
    name: str,
    n_features: int | None,
    zero_based: bool | Literal["auto"],
    map_binary: bool,
) -> Dataset:
    head = f.read(CHUNK_BYTES + 1)
    if n_features is not None and n_features < 0:
        raise DataError(f"{name}: n_features must be >= 0, got {n_features}")
    if len(head) <= CHUNK_BYTES:
        return _parse_libsvm(head, name, n_features, zero_based, map_binary)
    # one pass for the sizes (a colon per entry, a line end per row: upper bounds), so the
    # rows are parsed straight into arrays of their final size
    max_entries, max_rows = head.count(b":"), head.count(b"\n") + 1
    del head
    while block := f.read(CHUNK_BYTES):
        max_entries += block.count(b":")
        max_rows += block.count(b"\n")
    f.seek(0)
    out = _Output(max_entries, max_rows, n_features)
    chunks = _line_chunks(f, f.read(CHUNK_BYTES + 1))
    return _parse_libsvm_chunked(chunks, out, name, n_features, zero_based, map_binary)


#: Files larger than this are parsed in pieces of about this size, read one at a time: the
#: tokeniser needs several times its input in temporaries, which a device cannot spare for
#: a whole file (64 KiB: about 1 MB less at peak than 256 KiB pieces on a 3.8 MB shard, at
#: the same speed within the noise).
CHUNK_BYTES = 1 << 16


def _line_chunks(f: BinaryIO, head: bytes) -> Iterator[bytes]:
    """``head`` and the rest of ``f`` in pieces of about :data:`CHUNK_BYTES` that end at a
    line end (the last one at the end of the file)."""
    pending = head
    while True:
        block = f.read(CHUNK_BYTES)
        if not block:
            if pending:
                yield pending
            return
        pending += block
        cut = pending.rfind(b"\n") + 1
        if cut:
            yield pending[:cut]
            pending = pending[cut:]


class _Output:
    """The arrays a chunked read fills, allocated once at their upper bounds: labels and
    entry counts per row, columns and values per entry (columns int32 while they fit)."""

    def __init__(self, max_entries: int, max_rows: int, n_features: int | None) -> None:
        self.labels = np.empty(max_rows, dtype=np.float64)
        self.counts = np.empty(max_rows, dtype=np.int64)
        self.values = np.empty(max_entries, dtype=np.float64)
        wide = n_features is not None and n_features > _INT32_MAX
        self.cols: npt.NDArray[np.int32] | IndexArray = (
            np.empty(max_entries, dtype=np.int64) if wide else np.empty(max_entries, dtype=np.int32)
        )
        self.rows = 0
        self.entries = 0

    def add(self, part: _Rows) -> None:
        """Append the rows of one chunk."""
        r, e = self.rows, self.entries
        n, m = int(part.labels.size), int(part.values.size)
        self.labels[r : r + n] = part.labels
        self.counts[r : r + n] = part.counts
        self.values[e : e + m] = part.values
        if m and self.cols.dtype == np.int32 and int(part.cols.max()) > _INT32_MAX:
            self.cols = self.cols.astype(np.int64)  # (only for indices beyond 2^31)
        self.cols[e : e + m] = part.cols
        self.rows, self.entries = r + n, e + m

    def arrays(
        self,
    ) -> tuple[FloatArray, IndexArray, npt.NDArray[np.int32] | IndexArray, FloatArray]:
        """(labels, counts, cols, values), cut to what was filled."""
        return (
            _filled(self.labels, self.rows),
            _filled(self.counts, self.rows),
            _filled(self.cols, self.entries),
            _filled(self.values, self.entries),
        )


_INT32_MAX = int(np.iinfo(np.int32).max)


def _filled(buf: npt.NDArray[Any], n: int) -> npt.NDArray[Any]:
    """The first ``n`` items of ``buf``: a view when the bound was close (no copy), else a
    copy, so comments full of colons do not keep a much larger buffer alive."""
    return buf[:n] if 8 * n >= 7 * buf.size else buf[:n].copy()


def _parse_libsvm_chunked(
    chunks: Iterable[bytes],
    out: _Output,
    name: str,
    n_features: int | None,
    zero_based: bool | Literal["auto"],
    map_binary: bool,
) -> Dataset:
    """Parse the ``chunks`` of a file (each ending at a line end) into ``out``, then check
    the whole (the columns of "auto" and their width)."""
    lines_before = 0
    for chunk in chunks:
        # "auto" is decided on the whole file: keep raw indices (as 0-based) for now.
        zb: bool | Literal["auto"] = True if zero_based == "auto" else zero_based
        width_hint = None if zero_based == "auto" else n_features
        out.add(_parse_rows(chunk, name, width_hint, zb, line_offset=lines_before))
        lines_before += chunk.count(b"\n")
    labels, counts, cols, data = out.arrays()
    if zero_based == "auto" and cols.size and int(cols.min()) > 0:
        cols -= 1  # no index 0 anywhere: the file is 1-based (the LIBSVM default)
    seen = int(cols.max()) + 1 if cols.size else 0
    width = seen if n_features is None else n_features
    if seen > width:  # "auto" mode only: otherwise every chunk checked it, with line numbers
        raise DataError(
            f"{name}: feature index {seen} does not fit n_features={width}; pass n_features >= {seen}"
        )
    X = CSRMatrix(data, compact_indices(cols, width), _indptr(counts), (labels.size, width))
    return Dataset(X, normalise_labels(labels, map_binary=map_binary))


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
                    normalise_labels(np.asarray(z["y"], dtype=np.float64), map_binary=map_binary),
                )
            if {"data", "indices", "indptr", "shape", "y"} <= keys:
                shape = tuple(int(s) for s in np.asarray(z["shape"]).reshape(-1))
                if len(shape) != 2:
                    raise DataError(f"{path}: 'shape' must hold 2 integers, got {shape}")
                X = CSRMatrix(z["data"], z["indices"], z["indptr"], (shape[0], shape[1]))
                y = np.asarray(z["y"], dtype=np.float64)
                return Dataset(X, normalise_labels(y, map_binary=map_binary))
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
    return Dataset(X, normalise_labels(y, map_binary=map_binary))


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
