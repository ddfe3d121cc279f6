"""The wire codec: updates (agent -> aggregator) and model messages (aggregator -> agents).

The byte layout is a public spec: docs/wire-format.md. Everything here is pure: no I/O.

Sizes are closed-form: :func:`encoded_size` gives ``len(encode(...))`` from (compressor, d,
T, header fields) alone, vectorised over T, so the CAT selector prices every T without
encoding. :func:`decode` validates everything and raises only :class:`WireFormatError`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from edge_agent.errors import WireFormatError
from edge_agent.numerics.compressors import (
    COMPRESSOR_IDS,
    SEMANTICS,
    VALUE_DTYPES,
    Semantics,
    Update,
    ValueDtype,
)
from edge_agent.protocol.indexcode import (
    decode_indices,
    encode_indices,
    index_bytes,
)
from edge_agent.protocol.mac import FLAG_MAC, MAC_BYTES, compute

MAGIC = b"\xca\x7e"
_ID_RE = re.compile(r"[A-Za-z0-9._-]+")
VERSION = 1
TYPE_UPDATE = 1
TYPE_SNAPSHOT = 2
TYPE_DELTA = 3
MAX_D = 2**32 - 1
MAX_ID_BYTES = 64
FIXED_HEADER_BYTES = 6  # magic 2 + version 1 + type 1 + compressor 1 + flags 1

_DTYPE_CODES: dict[str, int] = {"float32": 0, "float16": 1, "float64": 2}
_CODE_DTYPES = {v: k for k, v in _DTYPE_CODES.items()}
_SEM_CODES: dict[str, int] = {s: i for i, s in enumerate(SEMANTICS)}
#: flags bit 5 extends the semantics code (bits 2-3) with its third bit (code 4: local)
_SEM_HIGH = 0x20


def _sem_flags(code: int) -> int:
    """The flags bits of semantics ``code``: its low two bits at bits 2-3, its third at 5."""
    return ((code & 0x03) << 2) | (_SEM_HIGH if code & 0x04 else 0)


_ID_COMPRESSORS = {v: k for k, v in COMPRESSOR_IDS.items()}

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class UpdateHeader:
    """Header fields of an update message (see docs/wire-format.md)."""

    job: str
    agent: str
    round: int  # the model version the gradient was computed at
    seq: int  # the agent's message counter, unique per (agent, round) retry
    compressor: str
    d: int
    t: int
    value_dtype: ValueDtype
    semantics: Semantics
    mac: bool = (
        False  # flags bit 4: an 8-byte MAC follows the body (edge_agent.protocol.mac.verify)
    )


@dataclass(frozen=True)
class Snapshot:
    """A full model: ``x`` (float64, d entries) at ``version``."""

    job: str
    version: int
    x: FloatArray


@dataclass(frozen=True)
class Delta:
    """Model change from ``base_version`` to ``version``: set ``x[indices] = values``."""

    job: str
    base_version: int
    version: int
    d: int
    indices: IntArray
    values: FloatArray

    def apply(self, x: FloatArray) -> None:
        """Apply in place; the result is bit-identical to the aggregator's model."""
        x[self.indices] = self.values


# ---------------------------------------------------------------- varints


def uvarint(n: int) -> bytes:
    """Unsigned LEB128."""
    if n < 0:
        raise ValueError(f"uvarint needs n >= 0, got {n}")
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


#: uvarint(n) is k + 1 bytes long for the k of these that are <= n
_UVARINT_STEPS = np.array([1 << (7 * k) for k in range(1, 9)], dtype=np.int64)


def uvarint_len(n: npt.ArrayLike) -> IntArray:
    """Length in bytes of uvarint(n), vectorised (n >= 0)."""
    arr = np.asarray(n, dtype=np.int64)
    out: IntArray = _UVARINT_STEPS.searchsorted(arr, side="right")
    out += 1
    return out


#: ids (job, agent names) already validated: a decoder sees the same few over and over
_VALID_IDS: dict[bytes, str] = {}
_VALID_IDS_MAX = 4096


class Reader:
    """Reads a message front to back; every read names what it reads, and a short or bad
    field raises :class:`WireFormatError` saying which (shared with the downlink codec)."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def byte(self, what: str) -> int:
        if self.pos >= len(self.buf):
            raise WireFormatError(f"truncated: {what} missing")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def uvarint(self, what: str, limit: int) -> int:
        pos = self.pos
        if pos < len(self.buf) and self.buf[pos] < 0x80:  # one byte: the common case
            n = self.buf[pos]
            self.pos = pos + 1
            if n > limit:
                raise WireFormatError(f"{what}: {n} exceeds {limit}")
            return n
        n = 0
        shift = 0
        while True:
            b = self.byte(what)
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                if b == 0 and shift:
                    raise WireFormatError(f"{what}: varint not in its shortest form")
                break
            shift += 7
            if shift > 63:
                raise WireFormatError(f"{what}: varint too long")
        if n > limit:
            raise WireFormatError(f"{what}: {n} exceeds {limit}")
        return n

    def ident(self, what: str) -> str:
        n = self.uvarint(f"{what} length", MAX_ID_BYTES)
        if n == 0:
            raise WireFormatError(f"{what}: empty")
        raw = self.take(n, what)
        s = _VALID_IDS.get(raw)
        if s is not None:
            return s
        try:
            s = raw.decode("ascii")
        except UnicodeDecodeError:
            raise WireFormatError(f"{what}: not ASCII") from None
        if _ID_RE.fullmatch(s) is None:
            raise WireFormatError(f"{what}: {s!r} has characters outside [A-Za-z0-9._-]")
        if len(_VALID_IDS) >= _VALID_IDS_MAX:
            _VALID_IDS.clear()
        _VALID_IDS[raw] = s
        return s

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.buf):
            raise WireFormatError(f"truncated: {what} needs {n} bytes")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def array(self, n: int, dtype: np.dtype[np.generic], what: str) -> npt.NDArray[np.generic]:
        nbytes = n * dtype.itemsize
        if self.pos + nbytes > len(self.buf):
            raise WireFormatError(f"truncated: {what} needs {nbytes} bytes")
        arr = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos)
        self.pos += nbytes
        return arr

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise WireFormatError(f"{len(self.buf) - self.pos} trailing bytes")


def encode_ident(s: str, what: str) -> bytes:
    """``s`` as an id field (length, ASCII bytes); ValueError naming ``what`` if invalid."""
    raw = s.encode("ascii", errors="strict") if s.isascii() else b""
    if not raw or len(raw) > MAX_ID_BYTES or _ID_RE.fullmatch(s) is None:
        raise ValueError(f"{what} {s!r} must be 1..{MAX_ID_BYTES} characters of [A-Za-z0-9._-]")
    return uvarint(len(raw)) + raw


_ident = encode_ident  # the spelling encoded_size uses


def encode_header(kind: int, compressor: int, flags: int, job: str) -> bytes:
    """The common header: magic, version, message ``kind``, compressor and flags bytes,
    the job id."""
    return MAGIC + bytes([VERSION, kind, compressor, flags]) + encode_ident(job, "job")


def read_header(r: Reader, kind: int) -> tuple[int, int, str]:
    """(compressor byte, flags byte, job) of a message that must be of type ``kind``."""
    if r.take(2, "magic") != MAGIC:
        raise WireFormatError("bad magic: not a cat-edge message")
    version = r.byte("version")
    if version != VERSION:
        raise WireFormatError(f"unsupported version {version} (this decoder speaks {VERSION})")
    got = r.byte("type")
    if got != kind:
        raise WireFormatError(f"message type {got}, expected {kind}")
    comp = r.byte("compressor")
    flags = r.byte("flags")
    job = r.ident("job")
    return comp, flags, job


# ---------------------------------------------------------------- updates


@dataclass(frozen=True)
class UpdateSizer:
    """``len(encode(...))`` of an update as a function of T alone, every other field fixed.

    Built once (:func:`update_sizer`) per (compressor, d, header fields): what depends only
    on them (the header bytes, the value width, the index code tables of d) is computed
    here, so pricing an array of T is a few numpy passes."""

    compressor: str
    d: int
    fixed_bytes: int
    itemsize: int

    def __call__(self, t: IntArray) -> IntArray:
        """Sizes in bytes for the T in ``t`` (int64, 1-D)."""
        d = self.d
        if self.compressor == "dense":
            return np.full(t.shape, self.fixed_bytes + int(uvarint_len(d)) + d * self.itemsize)
        size = uvarint_len(t)
        size += self.fixed_bytes
        size += index_bytes(d, t)
        if self.compressor == "signtopk":
            size += np.where(t > 0, self.itemsize + (t + 7) // 8, 0)
        else:
            size += t * self.itemsize
        return size


def update_sizer(
    compressor: str,
    *,
    d: int,
    job: str,
    agent: str,
    round: int,
    seq: int,
    value_dtype: ValueDtype = "float32",
    mac: bool = False,
) -> UpdateSizer:
    """The :class:`UpdateSizer` of updates with these header fields (see :func:`encoded_size`)."""
    if compressor not in COMPRESSOR_IDS:
        raise ValueError(f"unknown compressor {compressor!r}; valid: {sorted(COMPRESSOR_IDS)}")
    fixed = (
        FIXED_HEADER_BYTES
        + len(_ident(job, "job"))
        + len(_ident(agent, "agent"))
        + len(uvarint(round))
        + len(uvarint(seq))
        + len(uvarint(d))
        + (MAC_BYTES if mac else 0)
    )
    return UpdateSizer(compressor, d, fixed, VALUE_DTYPES[value_dtype].itemsize)


def encoded_size(
    compressor: str,
    *,
    d: int,
    t: npt.ArrayLike,
    job: str,
    agent: str,
    round: int,
    seq: int,
    value_dtype: ValueDtype = "float32",
    mac: bool = False,
) -> int | IntArray:
    """Exact ``len(encode(update, ...))`` for an update of T entries; vectorised over ``t``.

    Returns an int for a scalar ``t`` and an int64 array otherwise. For randk, T is the
    actual number of sampled entries (the selector prices the expected one). ``mac``: the
    update is signed (``encode(..., mac_key=...)``), 8 bytes more. To price many arrays of T
    with the same fields, build :func:`update_sizer` once.
    """
    sizer = update_sizer(
        compressor,
        d=d,
        job=job,
        agent=agent,
        round=round,
        seq=seq,
        value_dtype=value_dtype,
        mac=mac,
    )
    size = sizer(np.atleast_1d(np.asarray(t, dtype=np.int64)))
    if np.ndim(t) == 0:
        return int(size[0])
    return size


def encode(
    u: Update,
    *,
    job: str,
    agent: str,
    round: int,
    seq: int,
    value_dtype: ValueDtype | None = None,
    mac_key: bytes | None = None,
) -> bytes:
    """Serialise an update. ``value_dtype`` defaults to the dtype of ``u.values``.

    ``mac_key``: sign it (flags bit 4, then ``HMAC-SHA256(mac_key, message)[:8]``
    appended: :mod:`edge_agent.protocol.mac`)."""
    if u.compressor not in COMPRESSOR_IDS:
        raise ValueError(f"unknown compressor {u.compressor!r}")
    if not 0 < u.d <= MAX_D:
        raise ValueError(f"d must be in [1, {MAX_D}], got {u.d}")
    if u.compressor == "signtopk":
        dtype_name: ValueDtype = value_dtype or "float32"
    else:
        dtype_name = value_dtype or _dtype_name(u.values.dtype)
    dt = VALUE_DTYPES[dtype_name]
    flags = _DTYPE_CODES[dtype_name] | _sem_flags(_SEM_CODES[u.semantics])
    if mac_key is not None:
        flags |= FLAG_MAC
    parts = [
        encode_header(TYPE_UPDATE, COMPRESSOR_IDS[u.compressor], flags, job),
        encode_ident(agent, "agent"),
        uvarint(round),
        uvarint(seq),
        uvarint(u.d),
        uvarint(u.t),
    ]
    if u.compressor == "dense":
        parts.append(np.asarray(u.values, dtype=dt).tobytes())
    elif u.t > 0:
        assert u.indices is not None
        parts.append(encode_indices(u.indices, u.d))
        if u.compressor == "signtopk":
            assert u.scale is not None
            parts.append(np.array([u.scale], dtype=dt).tobytes())
            parts.append(np.packbits(np.asarray(u.values) < 0, bitorder="little").tobytes())
        else:
            parts.append(np.asarray(u.values, dtype=dt).tobytes())
    blob = b"".join(parts)
    return blob if mac_key is None else blob + compute(mac_key, blob)


def _dtype_name(dt: np.dtype[np.generic]) -> ValueDtype:
    for name, known in VALUE_DTYPES.items():
        if known == dt.newbyteorder("<"):
            return name  # type: ignore[return-value]
    raise ValueError(f"values have dtype {dt}; expected one of {sorted(VALUE_DTYPES)}")


def decode(blob: bytes | bytearray | memoryview) -> tuple[UpdateHeader, Update]:
    """Parse and validate an update. Raises only WireFormatError."""
    try:
        return _decode(bytes(blob))
    except WireFormatError:
        raise
    except Exception as exc:  # defence in depth: a decoder bug must not crash a service
        raise WireFormatError(f"malformed update ({type(exc).__name__}: {exc})") from exc


#: (compressor, value dtype, semantics, job, agent, round, seq, d, T, offset of the body)
Head = tuple[str, ValueDtype, Semantics, str, str, int, int, int, int, int]
_UPDATE_PREFIX = MAGIC + bytes([VERSION, TYPE_UPDATE])
#: every valid flags byte -> (value dtype, semantics)
_FLAGS: dict[int, tuple[ValueDtype, Semantics]] = {
    code | _sem_flags(sem_code) | mac: (name, sem)  # type: ignore[misc]
    for name, code in _DTYPE_CODES.items()
    for sem_code, sem in enumerate(SEMANTICS)
    for mac in (0, FLAG_MAC)
}
_MAX_U63 = 2**63 - 1
_SIGNS = np.array([1, -1], dtype=np.int8)


def _uvarint_at(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, next offset) of the uvarint at ``pos``; value -1 unless it is in shortest
    form and at most 10 bytes long. IndexError when truncated."""
    b = buf[pos]
    if b < 0x80:  # one byte: the common case
        return b, pos + 1
    n = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return (-1 if b == 0 and shift else n), pos
        shift += 7
        if shift > 63:
            return -1, pos


def header_fast(buf: bytes) -> Head | None:
    """The update header when every field is valid and both names are in the cache of
    validated ids (the common case); None otherwise, and :func:`header_checked` then
    parses it again and raises the exact error. Accepts exactly what that one accepts."""
    if buf[:4] != _UPDATE_PREFIX:
        return None
    try:
        compressor = _ID_COMPRESSORS.get(buf[4])
        dtype_sem = _FLAGS.get(buf[5])
        if compressor is None or dtype_sem is None:
            return None
        pos = 7 + buf[6]
        job = _VALID_IDS.get(buf[7:pos])  # cached ids are 1..64 bytes: a one-byte length
        start = pos + 1
        pos = start + buf[pos]
        agent = _VALID_IDS.get(buf[start:pos])
        if job is None or agent is None or pos > len(buf):  # (a truncated slice is shorter)
            return None
        rnd, pos = _uvarint_at(buf, pos)
        seq, pos = _uvarint_at(buf, pos)
        d, pos = _uvarint_at(buf, pos)
        t, pos = _uvarint_at(buf, pos)
    except IndexError:
        return None
    if not (0 <= rnd <= _MAX_U63 and 0 <= seq <= _MAX_U63 and 0 < d <= MAX_D and 0 <= t <= d):
        return None
    return compressor, dtype_sem[0], dtype_sem[1], job, agent, rnd, seq, d, t, pos


def header_checked(buf: bytes) -> Head:
    """The update header, every check in spec order, raising WireFormatError."""
    r = Reader(buf)
    comp_id, flags, job = read_header(r, TYPE_UPDATE)
    compressor = _ID_COMPRESSORS.get(comp_id)
    if compressor is None:
        raise WireFormatError(f"unknown compressor id {comp_id}")
    if flags & ~(0x0F | FLAG_MAC | _SEM_HIGH):
        raise WireFormatError(f"reserved flag bits set: {flags:#04x}")
    dtype_name = _CODE_DTYPES.get(flags & 0x03)
    if dtype_name is None:
        raise WireFormatError(f"unknown value dtype code {flags & 0x03}")
    sem_code = ((flags >> 2) & 0x03) | (0x04 if flags & _SEM_HIGH else 0)
    if sem_code >= len(SEMANTICS):
        raise WireFormatError(f"unknown semantics code {sem_code}")
    semantics = SEMANTICS[sem_code]
    agent = r.ident("agent")
    rnd = r.uvarint("round", _MAX_U63)
    seq = r.uvarint("seq", _MAX_U63)
    d = r.uvarint("d", MAX_D)
    if d == 0:
        raise WireFormatError("d must be > 0")
    t = r.uvarint("T", d)
    return compressor, dtype_name, semantics, job, agent, rnd, seq, d, t, r.pos  # type: ignore[return-value]


def unsigned_part(buf: bytes) -> tuple[bytes, bool]:
    """(the message without its MAC, whether it has one): flags bit 4 of an update says
    the last 8 bytes are a MAC over everything before them (docs/wire-format.md)."""
    if len(buf) > 5 and buf[5] & FLAG_MAC and buf[:4] == _UPDATE_PREFIX:
        if len(buf) < FIXED_HEADER_BYTES + MAC_BYTES:
            raise WireFormatError(f"truncated: the MAC needs {MAC_BYTES} bytes")
        return buf[:-MAC_BYTES], True
    return buf, False


def _decode(blob: bytes) -> tuple[UpdateHeader, Update]:
    buf, mac = unsigned_part(blob)
    head = header_fast(buf) or header_checked(buf)
    compressor, dtype_name, semantics, job, agent, rnd, seq, d, t, pos = head
    r = Reader(buf)
    r.pos = pos
    dt = VALUE_DTYPES[dtype_name]
    scale: float | None = None
    indices: IntArray | None
    if compressor == "dense":
        if t != d:
            raise WireFormatError(f"dense update with T={t} != d={d}")
        indices = None
        values: npt.NDArray[np.generic] = r.array(d, dt, "values")
    elif t == 0:
        indices = np.zeros(0, dtype=np.int64)
        values = np.zeros(0, dtype=np.int8 if compressor == "signtopk" else dt)
        if compressor == "signtopk":
            scale = 0.0
    else:
        indices, r.pos = decode_indices(buf, r.pos, d, t)
        if compressor == "signtopk":
            scale = float(r.array(1, dt, "scale")[0])
            if not math.isfinite(scale) or scale < 0:
                raise WireFormatError(f"signtopk scale must be finite and >= 0, got {scale}")
            raw = np.asarray(r.array((t + 7) // 8, np.dtype(np.uint8), "sign bits"), dtype=np.uint8)
            bits = np.unpackbits(raw, bitorder="little")
            if bits[t:].any():
                raise WireFormatError("sign bits: padding bits are not zero")
            values = _SIGNS[bits[:t]]  # bit 1 -> -1, bit 0 -> +1
        else:
            values = r.array(t, dt, "values")
    r.end()
    if compressor != "signtopk" and not np.isfinite(values).all():
        raise WireFormatError("values contain nan or inf")
    header = UpdateHeader(job, agent, rnd, seq, compressor, d, t, dtype_name, semantics, mac)
    return header, Update(compressor, d, indices, values, scale=scale, semantics=semantics)


# ---------------------------------------------------------------- model messages


def encode_snapshot(x: npt.ArrayLike, *, job: str, version: int) -> bytes:
    """Serialise the full model (float64, little-endian)."""
    arr = np.ascontiguousarray(x, dtype="<f8")
    if arr.ndim != 1 or not 0 < arr.size <= MAX_D:
        raise ValueError(f"model must be a 1-D array of 1..{MAX_D} entries, got shape {arr.shape}")
    return b"".join(
        [
            encode_header(TYPE_SNAPSHOT, 0, _DTYPE_CODES["float64"], job),
            uvarint(version),
            uvarint(arr.size),
            arr.tobytes(),
        ]
    )


def encode_delta(
    indices: npt.ArrayLike,
    values: npt.ArrayLike,
    *,
    job: str,
    base_version: int,
    version: int,
    d: int,
) -> bytes:
    """Serialise a sparse model change: the *new* values at the changed indices (sorted)."""
    idx = np.asarray(indices, dtype=np.int64)
    vals = np.ascontiguousarray(values, dtype="<f8")
    if idx.shape != vals.shape or idx.ndim != 1:
        raise ValueError("indices and values must be 1-D arrays of the same length")
    if version <= base_version:
        raise ValueError(f"version {version} must exceed base_version {base_version}")
    return b"".join(
        [
            encode_header(TYPE_DELTA, 0, _DTYPE_CODES["float64"], job),
            uvarint(base_version),
            uvarint(version),
            uvarint(d),
            uvarint(idx.size),
            encode_indices(idx, d),
            vals.tobytes(),
        ]
    )


def decode_model(blob: bytes | bytearray | memoryview) -> Snapshot | Delta:
    """Parse a snapshot or a delta. Raises only WireFormatError."""
    buf = bytes(blob)
    try:
        if len(buf) < 4 or buf[:2] != MAGIC:
            raise WireFormatError("bad magic: not a cat-edge message")
        if buf[3] == TYPE_SNAPSHOT:
            return _decode_snapshot(buf)
        if buf[3] == TYPE_DELTA:
            return _decode_delta(buf)
        raise WireFormatError(f"message type {buf[3]} is not a model message")
    except WireFormatError:
        raise
    except Exception as exc:
        raise WireFormatError(f"malformed model message ({type(exc).__name__}: {exc})") from exc


def _model_header(r: Reader, kind: int) -> str:
    comp, flags, job = read_header(r, kind)
    if comp != 0 or flags != _DTYPE_CODES["float64"]:
        raise WireFormatError(f"model message: compressor byte {comp} / flags {flags:#04x} invalid")
    return job


def _decode_snapshot(buf: bytes) -> Snapshot:
    r = Reader(buf)
    job = _model_header(r, TYPE_SNAPSHOT)
    version = r.uvarint("version", 2**63 - 1)
    d = r.uvarint("d", MAX_D)
    if d == 0:
        raise WireFormatError("d must be > 0")
    x = np.array(r.array(d, np.dtype("<f8"), "model values"), dtype=np.float64)
    r.end()
    if not np.isfinite(x).all():
        raise WireFormatError("model contains nan or inf")
    return Snapshot(job, version, x)


def _decode_delta(buf: bytes) -> Delta:
    r = Reader(buf)
    job = _model_header(r, TYPE_DELTA)
    base = r.uvarint("base_version", 2**63 - 1)
    version = r.uvarint("version", 2**63 - 1)
    if version <= base:
        raise WireFormatError(f"delta version {version} <= base_version {base}")
    d = r.uvarint("d", MAX_D)
    if d == 0:
        raise WireFormatError("d must be > 0")
    n = r.uvarint("n", d)
    idx, r.pos = decode_indices(buf, r.pos, d, n)
    vals = np.array(r.array(n, np.dtype("<f8"), "delta values"), dtype=np.float64)
    r.end()
    if not np.isfinite(vals).all():
        raise WireFormatError("delta contains nan or inf")
    return Delta(job, base, version, d, idx, vals)


def body_offset(blob: bytes) -> int:
    """Offset in a valid update message ``blob`` where its body (index code, values)
    starts: what follows the header fields. Raises WireFormatError for a bad header."""
    buf = bytes(blob)
    try:
        head = header_fast(buf) or header_checked(buf)
    except WireFormatError:
        raise
    except Exception as exc:
        raise WireFormatError(f"malformed update header ({type(exc).__name__}: {exc})") from exc
    return head[9]
