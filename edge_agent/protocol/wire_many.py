"""Decode a batch of updates at once (the aggregator's ingest batches).

:func:`decode_many` returns, for every message, exactly what :func:`edge_agent.protocol.wire.decode`
returns or raises for it, about three times faster per message: the batch's index blocks and
values are checked in shared numpy passes. The byte layout is docs/wire-format.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from edge_agent.errors import WireFormatError
from edge_agent.numerics.compressors import VALUE_DTYPES, Update
from edge_agent.protocol.indexcode import BlockLayout, block_layout, decode_blocks
from edge_agent.protocol.mac import FLAG_MAC
from edge_agent.protocol.wire import (
    Head,
    UpdateHeader,
    decode,
    header_checked,
    header_fast,
    unsigned_part,
)

#: entries per vectorised value check: bounds its temporaries, and the array that the
#: sign values of a batch's signtopk updates share
_VALUES_CHUNK = 1 << 16
#: by T % 8: the padding bits of the last byte of T sign bits
_SIGN_PAD = np.array([0] + [0xFF & (0xFF << k) for k in range(1, 8)], dtype=np.uint8)


def _decode_one(blob: object) -> tuple[UpdateHeader, Update] | WireFormatError:
    try:
        return decode(blob)  # type: ignore[arg-type]
    except WireFormatError as exc:
        return exc


def decode_many(
    blobs: Sequence[bytes | bytearray | memoryview],
) -> list[tuple[UpdateHeader, Update] | WireFormatError]:
    """:func:`decode` for a batch of updates; element i is exactly what ``decode(blobs[i])``
    returns, or the WireFormatError it raises (returned, not raised). Never raises, except
    TypeError when ``blobs`` is not a sequence of messages.

    Faster per message than a loop of :func:`decode` (the aggregator receives updates in
    batches): the headers are parsed one by one, but the index blocks, value checks and
    sign bits of all sparse updates are decoded together in a few vectorised numpy passes
    (:func:`edge_agent.protocol.indexcode.decode_blocks`), whatever their d, T and index code. A
    message any of whose checks fails there is decoded again by :func:`decode`, so errors
    and their reasons are the same. Values of topk and randk updates are read-only views of
    their message, as decode's; indices (and signtopk signs) are views into arrays that a
    few dozen messages of the batch share (at most 8,000 indices / 65,536 signs each).
    """
    if isinstance(blobs, bytes | bytearray | memoryview | str) or not isinstance(blobs, Sequence):
        raise TypeError(f"decode_many takes a sequence of messages, got {type(blobs).__name__}")
    out: list[tuple[UpdateHeader, Update] | WireFormatError | None] = [None] * len(blobs)
    rows: list[tuple[int, bytes, Head, int]] = []  # index, message, header, value offset
    bodies: list[bytes] = []
    layouts: list[BlockLayout] = []
    full: list[object] = []  # the whole message of each row (a signed one: with its MAC)
    for i, blob in enumerate(blobs):
        if type(blob) is bytes:
            buf = blob
        elif isinstance(blob, bytes | bytearray | memoryview):
            buf = bytes(blob)
        else:
            out[i] = _decode_one(blob)
            continue
        try:
            buf, _ = unsigned_part(buf)  # a signed update: the body ends before its MAC
        except WireFormatError as exc:
            out[i] = exc
            continue
        head = header_fast(buf)
        if head is None:
            try:
                head = header_checked(buf)  # names not seen yet, or an error
            except WireFormatError:
                head = None
        if head is None or head[0] == "dense" or head[8] == 0 or head[9] >= len(buf):
            out[i] = _decode_one(blob)
            continue
        compressor, dtype_name, _, _, _, _, _, d, t, pos = head
        lay = block_layout(d, t, buf[pos])
        if lay is None:
            out[i] = _decode_one(blob)
            continue
        vpos = pos + 1 + lay.nbytes
        w = VALUE_DTYPES[dtype_name].itemsize
        if len(buf) != vpos + (w + (t + 7) // 8 if compressor == "signtopk" else t * w):
            out[i] = _decode_one(blob)
            continue
        rows.append((i, buf, head, vpos))
        full.append(blob)
        bodies.append(buf[pos + 1 : vpos])
        layouts.append(lay)
    if rows:
        try:
            _decode_rows(rows, bodies, layouts, out, full)
        except Exception:  # defence in depth: a bug here must not lose a batch
            for (i, _, _, _), whole in zip(rows, full, strict=True):
                if out[i] is None:
                    out[i] = _decode_one(whole)
    return out  # type: ignore[return-value]


def _decode_rows(
    rows: list[tuple[int, bytes, Head, int]],
    bodies: list[bytes],
    layouts: list[BlockLayout],
    out: list[tuple[UpdateHeader, Update] | WireFormatError | None],
    full: list[object],
) -> None:
    """Decode the sparse updates ``rows`` (headers parsed, lengths exact; a signed one
    without its MAC, which ``full`` holds) into ``out``."""
    indices = decode_blocks(bodies, layouts)
    values: list[npt.NDArray[np.generic] | None] = [None] * len(rows)
    scales: list[float | None] = [None] * len(rows)
    groups: dict[tuple[bool, str], list[int]] = {}
    for j, (_, _, head, _) in enumerate(rows):
        if indices[j] is not None:
            groups.setdefault((head[0] == "signtopk", head[1]), []).append(j)
    for (sign, dtype_name), members in groups.items():
        dt = VALUE_DTYPES[dtype_name]
        chunk: list[int] = []
        size = 0
        for j in members:
            chunk.append(j)
            size += rows[j][2][8]
            if size >= _VALUES_CHUNK:
                _values(rows, chunk, dt, sign, values, scales)
                chunk, size = [], 0
        if chunk:
            _values(rows, chunk, dt, sign, values, scales)
    for j, (i, buf, head, _) in enumerate(rows):
        idx = indices[j]
        vals = values[j]
        if idx is None or vals is None:
            out[i] = _decode_one(full[j])
            continue
        compressor, dtype_name, semantics, job, agent, rnd, seq, d, t, _ = head
        mac = bool(buf[5] & FLAG_MAC)
        header = UpdateHeader(job, agent, rnd, seq, compressor, d, t, dtype_name, semantics, mac)
        out[i] = header, Update(compressor, d, idx, vals, scale=scales[j], semantics=semantics)


def _values(
    rows: list[tuple[int, bytes, Head, int]],
    members: list[int],
    dt: np.dtype[np.floating],
    sign: bool,
    values: list[npt.NDArray[np.generic] | None],
    scales: list[float | None],
) -> None:
    """Check and set the values of updates ``members``, all of value dtype ``dt``: topk and
    randk (``sign`` false) or signtopk. Rows failing a check keep None."""
    if sign:
        _signs(rows, members, dt, values, scales)
        return
    joined = np.frombuffer(b"".join([rows[j][1][rows[j][3] :] for j in members]), dtype=dt)
    finite = np.isfinite(joined)
    bad: set[int] = set()
    if not finite.all():
        ends = np.cumsum([rows[j][2][8] for j in members])
        bad = set(np.searchsorted(ends, np.flatnonzero(~finite), side="right").tolist())
    del joined, finite
    for g, j in enumerate(members):
        if g not in bad:
            _, buf, head, pos = rows[j]
            values[j] = np.frombuffer(buf, dt, head[8], pos)  # a view of the message, as decode


def _signs(
    rows: list[tuple[int, bytes, Head, int]],
    members: list[int],
    dt: np.dtype[np.floating],
    values: list[npt.NDArray[np.generic] | None],
    scales: list[float | None],
) -> None:
    """Scales and sign bits of the signtopk updates ``members`` (value dtype ``dt``)."""
    w = dt.itemsize
    scale = np.frombuffer(
        b"".join([rows[j][1][rows[j][3] : rows[j][3] + w] for j in members]), dtype=dt
    )
    good = np.isfinite(scale) & (scale >= 0)
    raw = np.frombuffer(b"".join([rows[j][1][rows[j][3] + w :] for j in members]), dtype=np.uint8)
    t = np.array([rows[j][2][8] for j in members], dtype=np.int64)
    ends = np.cumsum((t + 7) >> 3)
    good &= (raw[ends - 1] & _SIGN_PAD[t & 7]) == 0
    signs = np.unpackbits(raw, bitorder="little").view(np.int8)
    signs *= -2
    signs += 1  # bit 1 -> -1, bit 0 -> +1
    starts = 8 * ends - 8 * ((t + 7) >> 3)
    for j, s, n, ok, sc in zip(
        members, starts.tolist(), t.tolist(), good.tolist(), scale.tolist(), strict=True
    ):
        if ok:
            values[j] = signs[s : s + n]
            scales[j] = sc
