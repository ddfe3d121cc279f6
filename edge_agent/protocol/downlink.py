"""Downlink messages beyond the dense model: replicated steps and state snapshots.

What the aggregator sends so that every agent's copy of the model stays bit-identical to
the aggregator's *without* the change of ``x`` travelling (docs/wire-format.md, "Steps"):

- :class:`Steps` (message type 4): the operations the aggregator performed to go from
  ``base_version`` to ``version``, in its own order: the accepted compressed updates
  (each re-encoded without its job/agent/round/seq header), the step coefficient of every
  version, and the rare corrections of an EF21 aggregate (an agent's state dropped). A
  replica (:mod:`edge_agent.agent.replica`) performs the very same float operations.
- :class:`StateSnapshot` (message type 5): the model, and for EF21 jobs the aggregate
  ``h = (1/n) sum_i h_i`` the replica needs to step by itself; each array dense or as its
  nonzeros (whichever is smaller: the usual all-zero start costs a few bytes, not 8*d).

Everything here is pure: no I/O. :func:`decode_downlink` validates fully and raises only
:class:`~edge_agent.errors.WireFormatError`; it also decodes the older snapshot (type 2)
and delta (type 3) messages of :mod:`edge_agent.protocol.wire`.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from edge_agent.errors import WireFormatError
from edge_agent.numerics.compressors import Update
from edge_agent.numerics.local import MAX_ROUND_STEPS, LocalCoefs
from edge_agent.protocol import wire
from edge_agent.protocol.indexcode import decode_indices, encode_indices, index_bytes

__all__ = [
    "TYPE_STATE",
    "TYPE_STEPS",
    "Add",
    "Family",
    "Local",
    "Move",
    "Op",
    "StateSnapshot",
    "Step",
    "Steps",
    "Sub",
    "Zero",
    "add_op",
    "decode_downlink",
    "encode_state",
    "encode_steps",
    "local_op",
    "member_tag",
    "move_op",
    "semantics_family",
    "step_op",
    "sub_op",
    "zero_op",
]

TYPE_STEPS: Final = 4
TYPE_STATE: Final = 5

Family: TypeAlias = Literal["mean", "ef21", "local"]
_FAMILY_FLAGS: Final[dict[str, int]] = {"mean": 0, "ef21": 1, "local": 2}


def semantics_family(semantics: str) -> Family:
    """The update family of a semantics (or a feedback setting): ``"ef21"`` for EF21,
    ``"mean"`` for the others (plain, ef, dir). The one mapping both sides use.

    ``dir`` (a directional step, pre-scaled for ``gamma = 1/L``) is averaged like a plain
    update, so it can never share a job with ``ef21`` (whose step and state differ).
    ``local`` (local training) is a family of its own."""
    if semantics in ("ef21", "local"):
        return semantics  # type: ignore[return-value]
    return "mean"


_FLAG_FAMILIES: Final[dict[int, Family]] = {0: "mean", 1: "ef21", 2: "local"}

OP_ADD: Final = 1  # an update, weight 1
OP_ADDW: Final = 2  # float64 weight, then an update
OP_STEP: Final = 3  # float64 coefficient; ends one version
OP_SUB: Final = 4  # aggregate[indices] -= float64 values
OP_ZERO: Final = 5  # aggregate[:] = 0
OP_MOVE: Final = 6  # a compressed model change (compressed downlink); ends one version
OP_LOCAL: Final = 7  # local training: coefficients, then the broadcast dt; ends one version
OP_LOCAL_NEXT: Final = 8  # OP_LOCAL with the next round's local steps (a drawn schedule)

_F64: Final = struct.Struct("<d")
_MAX_U63: Final = 2**63 - 1
_REPLICA_AGENT: Final = wire.encode_ident("r", "agent")
_ZERO_VARINT: Final = wire.uvarint(0)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# ---------------------------------------------------------------- value types


@dataclass(frozen=True)
class Add:
    """``target += weight * update``: the round's accumulator (mean jobs) or the EF21
    aggregate (EF21 jobs)."""

    update: Update
    weight: float = 1.0


@dataclass(frozen=True)
class Step:
    """Mean jobs: ``x -= coef * acc`` then ``acc = 0``; EF21 jobs: ``x -= coef * h``."""

    coef: float


@dataclass(frozen=True)
class Sub:
    """EF21: ``h[indices] -= values`` (an agent's state left the aggregate)."""

    indices: IntArray
    values: FloatArray


@dataclass(frozen=True)
class Zero:
    """EF21: ``h[:] = 0`` (no agent state is left: exact zero, no rounding residue)."""


@dataclass(frozen=True)
class Move:
    """Compressed downlink: ``w += update`` (the broadcast model moves toward the true one)."""

    update: Update


@dataclass(frozen=True)
class Local:
    """Local training, one communication: the anchor's ``coefs.steps`` local steps
    ``y += gamma v``, then ``y += rho dt`` and ``v += c_v dt`` with ``dt`` the broadcast
    (:mod:`edge_agent.numerics.local`); the aggregate of a local job is ``v``."""

    coefs: LocalCoefs
    update: Update
    #: the :func:`member_tag` of every member whose change did not enter, of every agent
    #: this communication made a member, and of every member it dropped (usually none)
    absent: frozenset[bytes] = frozenset()
    joined: frozenset[bytes] = frozenset()
    left: frozenset[bytes] = frozenset()


#: bytes of a member's tag in a LOCAL operation
TAG_BYTES: Final = 4


def member_tag(agent: str) -> bytes:
    """A member's tag in a LOCAL operation's list of absent members: the first
    :data:`TAG_BYTES` bytes of SHA-256 of its id (UTF-8)."""
    return hashlib.sha256(agent.encode("utf-8")).digest()[:TAG_BYTES]


Op: TypeAlias = Add | Step | Sub | Zero | Move | Local


@dataclass(frozen=True)
class Steps:
    """What the aggregator did from ``base_version`` to ``version``, in its order."""

    job: str
    base_version: int
    version: int
    d: int
    family: Family
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class StateSnapshot:
    """The model at ``version`` and, for EF21 jobs replicated exactly, the aggregate ``h``."""

    job: str
    version: int
    x: FloatArray
    aggregate: FloatArray | None = None


# ---------------------------------------------------------------- encoding (aggregator)


def add_op(blob: bytes, body_offset: int, t: int, weight: float = 1.0) -> bytes:
    """An ADD operation for an accepted update message ``blob`` (its body starts at
    ``body_offset``, :func:`edge_agent.protocol.wire.body_offset`): the compressor and flags bytes,
    T and the body, without the job, agent, round, seq and d of its header."""
    entry = blob[4:6] + wire.uvarint(t) + blob[body_offset:]
    head = bytes([OP_ADD]) if weight == 1.0 else bytes([OP_ADDW]) + _F64.pack(weight)
    return head + wire.uvarint(len(entry)) + entry


def move_op(update: Update, *, job: str) -> bytes:
    """A MOVE operation carrying a compressed model change (its values' own dtype)."""
    blob = wire.encode(update, job=job, agent="r", round=0, seq=0)
    pos = wire.body_offset(blob)
    entry = blob[4:6] + wire.uvarint(update.t) + blob[pos:]
    return bytes([OP_MOVE]) + wire.uvarint(len(entry)) + entry


def local_op(
    update: Update,
    coefs: LocalCoefs,
    *,
    job: str,
    absent: Sequence[str] = (),
    joined: Sequence[str] = (),
    left: Sequence[str] = (),
) -> bytes:
    """A LOCAL operation: ``steps`` (uvarint), ``gamma``, ``rho``, ``c``, ``c_v`` (float64
    each), three lists of tags (:func:`member_tag`; each a uvarint count, then the sorted
    tags): the absent members, the agents that joined and the members that left; then the
    broadcast ``dt`` as a relayed entry (its values' own dtype). With ``coefs.next_steps``
    it is a LOCAL_NEXT operation: the same with that count (uvarint) after ``steps``."""
    lists: list[bytes] = []
    for names in (absent, joined, left):
        tags = sorted({member_tag(a) for a in names})
        lists += [wire.uvarint(len(tags)), *tags]
    blob = wire.encode(update, job=job, agent="r", round=0, seq=0)
    pos = wire.body_offset(blob)
    entry = blob[4:6] + wire.uvarint(update.t) + blob[pos:]
    code, counts = OP_LOCAL, [wire.uvarint(coefs.steps)]
    if coefs.next_steps is not None:
        code, counts = OP_LOCAL_NEXT, [*counts, wire.uvarint(coefs.next_steps)]
    return b"".join(
        [
            bytes([code]),
            *counts,
            *(_F64.pack(v) for v in (coefs.gamma, coefs.rho, coefs.c, coefs.c_v)),
            *lists,
            wire.uvarint(len(entry)),
            entry,
        ]
    )


def step_op(coef: float) -> bytes:
    return bytes([OP_STEP]) + _F64.pack(coef)


def sub_op(indices: IntArray, values: FloatArray, d: int) -> bytes:
    idx = np.asarray(indices, dtype=np.int64)
    vals = np.ascontiguousarray(values, dtype="<f8")
    return b"".join(
        [bytes([OP_SUB]), wire.uvarint(idx.size), encode_indices(idx, d), vals.tobytes()]
    )


def zero_op() -> bytes:
    return bytes([OP_ZERO])


def encode_steps(
    ops: list[bytes], *, job: str, d: int, base_version: int, version: int, family: Family
) -> bytes:
    """A Steps message from encoded operations (exactly ``version - base_version`` of them
    end a version: STEP or MOVE)."""
    if version <= base_version:
        raise ValueError(f"version {version} must exceed base_version {base_version}")
    return b"".join(
        [
            wire.encode_header(TYPE_STEPS, 0, _FAMILY_FLAGS[family], job),
            wire.uvarint(base_version),
            wire.uvarint(version),
            wire.uvarint(d),
            *ops,
        ]
    )


def _array_part(arr: FloatArray) -> bytes:
    """A float64 array, dense (flag 0) or as its nonzeros (flag 1), whichever is smaller."""
    nz = np.flatnonzero(arr)
    d = arr.size
    sparse_size = len(wire.uvarint(nz.size)) + int(index_bytes(d, nz.size)[0]) + 8 * nz.size
    if sparse_size < 8 * d:
        values = np.ascontiguousarray(arr[nz], dtype="<f8")
        return b"\x01" + wire.uvarint(nz.size) + encode_indices(nz, d) + values.tobytes()
    return b"\x00" + np.ascontiguousarray(arr, dtype="<f8").tobytes()


def encode_state(
    x: npt.ArrayLike, *, job: str, version: int, aggregate: npt.ArrayLike | None = None
) -> bytes:
    """A StateSnapshot message: x, and the EF21 aggregate when given (same length)."""
    xs = np.asarray(x, dtype=np.float64)
    if xs.ndim != 1 or not 0 < xs.size <= wire.MAX_D:
        raise ValueError(f"model must be a 1-D array of 1..{wire.MAX_D} entries")
    parts = [
        wire.encode_header(TYPE_STATE, 0, 0 if aggregate is None else 1, job),
        wire.uvarint(version),
        wire.uvarint(xs.size),
        _array_part(xs),
    ]
    if aggregate is not None:
        agg = np.asarray(aggregate, dtype=np.float64)
        if agg.shape != xs.shape:
            raise ValueError(f"aggregate has shape {agg.shape}, model {xs.shape}")
        parts.append(_array_part(agg))
    return b"".join(parts)


# ---------------------------------------------------------------- decoding (agents)


def decode_downlink(
    blob: bytes | bytearray | memoryview,
) -> wire.Snapshot | wire.Delta | Steps | StateSnapshot:
    """Parse any aggregator -> agent model message. Raises only WireFormatError."""
    buf = bytes(blob)
    try:
        if len(buf) < 4 or buf[:2] != wire.MAGIC:
            raise WireFormatError("bad magic: not a cat-edge message")
        if buf[3] == TYPE_STEPS:
            return _decode_steps(buf)
        if buf[3] == TYPE_STATE:
            return _decode_state(buf)
        return wire.decode_model(buf)
    except WireFormatError:
        raise
    except Exception as exc:
        raise WireFormatError(f"malformed downlink message ({type(exc).__name__}: {exc})") from exc


def _head(r: wire.Reader, kind: int) -> tuple[int, str]:
    comp, flags, job = wire.read_header(r, kind)
    if comp != 0 or flags not in (0, 1, 2) or (kind == TYPE_STATE and flags == 2):
        raise WireFormatError(f"downlink message: compressor byte {comp} / flags {flags:#04x}")
    return flags, job


def _decode_state(buf: bytes) -> StateSnapshot:
    r = wire.Reader(buf)
    flags, job = _head(r, TYPE_STATE)
    version = r.uvarint("version", _MAX_U63)
    d = r.uvarint("d", wire.MAX_D)
    if d == 0:
        raise WireFormatError("d must be > 0")
    x = _read_array(r, buf, d, "model")
    aggregate = _read_array(r, buf, d, "aggregate") if flags else None
    r.end()
    return StateSnapshot(job, version, x, aggregate)


def _read_array(r: wire.Reader, buf: bytes, d: int, what: str) -> FloatArray:
    form = r.byte(f"{what} form")
    if form == 0:
        arr = np.array(r.array(d, np.dtype("<f8"), what), dtype=np.float64)
    elif form == 1:
        n = r.uvarint(f"{what} nonzeros", d)
        arr = np.zeros(d)
        if n:
            idx, r.pos = decode_indices(buf, r.pos, d, n)
            arr[idx] = r.array(n, np.dtype("<f8"), what)
    else:
        raise WireFormatError(f"{what}: unknown array form {form}")
    if not np.isfinite(arr).all():
        raise WireFormatError(f"{what} contains nan or inf")
    return arr


def _decode_steps(buf: bytes) -> Steps:
    r = wire.Reader(buf)
    flags, job = _head(r, TYPE_STEPS)
    base = r.uvarint("base_version", _MAX_U63)
    version = r.uvarint("version", _MAX_U63)
    if version <= base:
        raise WireFormatError(f"steps: version {version} <= base_version {base}")
    d = r.uvarint("d", wire.MAX_D)
    if d == 0:
        raise WireFormatError("d must be > 0")
    job_ident = wire.encode_ident(job, "job")
    ops: list[Op] = []
    ends = 0
    while r.pos < len(buf):
        op = _read_op(r, buf, d, job_ident)
        ends += isinstance(op, Step | Move | Local)
        ops.append(op)
    if ends != version - base:
        raise WireFormatError(
            f"steps: {ends} versions end in the message, expected {version - base}"
        )
    return Steps(job, base, version, d, _FLAG_FAMILIES[flags], tuple(ops))


def _read_op(r: wire.Reader, buf: bytes, d: int, job_ident: bytes) -> Op:
    code = r.byte("operation")
    if code in (OP_ADD, OP_ADDW, OP_MOVE):
        weight = 1.0
        if code == OP_ADDW:
            weight = _finite(r, "weight")
        update = _read_entry(r, d, job_ident)
        return Move(update) if code == OP_MOVE else Add(update, weight)
    if code == OP_STEP:
        return Step(_finite(r, "step coefficient"))
    if code == OP_SUB:
        n = r.uvarint("n", d)
        idx, r.pos = decode_indices(buf, r.pos, d, n) if n else (np.zeros(0, np.int64), r.pos)
        vals = np.array(r.array(n, np.dtype("<f8"), "values"), dtype=np.float64)
        if not np.isfinite(vals).all():
            raise WireFormatError("sub values contain nan or inf")
        return Sub(idx, vals)
    if code == OP_ZERO:
        return Zero()
    if code in (OP_LOCAL, OP_LOCAL_NEXT):
        steps = r.uvarint("local steps", MAX_ROUND_STEPS)
        ahead = r.uvarint("next local steps", MAX_ROUND_STEPS) if code == OP_LOCAL_NEXT else None
        gamma, rho, c, c_v = (_finite(r, what) for what in ("gamma", "rho", "c", "c_v"))
        if not (gamma > 0 and 0 < rho <= 1 and steps >= 1 and ahead != 0):
            raise WireFormatError(
                f"local: steps {steps} (next {ahead}), gamma {gamma}, rho {rho} out of range"
            )
        absent, joined, left = (_tags(r, what) for what in ("absent", "joined", "left"))
        coefs = LocalCoefs(steps, gamma, rho, c, c_v, ahead)
        return Local(coefs, _read_entry(r, d, job_ident), absent, joined, left)
    raise WireFormatError(f"unknown operation code {code}")


def _tags(r: wire.Reader, what: str) -> frozenset[bytes]:
    """One list of member tags of a LOCAL operation."""
    n = r.uvarint(f"{what} members", len(r.buf) // TAG_BYTES)
    return frozenset(r.take(TAG_BYTES, f"{what} member tag") for _ in range(n))


def _finite(r: wire.Reader, what: str) -> float:
    value = float(_F64.unpack(r.take(8, what))[0])
    if not np.isfinite(value):
        raise WireFormatError(f"{what} is not finite: {value}")
    return value


def _read_entry(r: wire.Reader, d: int, job_ident: bytes) -> Update:
    """One relayed update: rebuilt into a full update message and checked by wire.decode."""
    size = r.uvarint("entry length", len(r.buf))
    entry = r.take(size, "entry")
    if len(entry) < 3:
        raise WireFormatError("entry too short")
    blob = b"".join(
        [
            wire.MAGIC,
            bytes([wire.VERSION, wire.TYPE_UPDATE]),
            entry[:2],
            job_ident,
            _REPLICA_AGENT,
            _ZERO_VARINT,
            _ZERO_VARINT,
            wire.uvarint(d),
            entry[2:],
        ]
    )
    _, update = wire.decode(blob)
    return update
