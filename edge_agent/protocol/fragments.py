"""Fragments: one downlink message split into the frames of a shared (multicast) downlink.

A message larger than the group's payload is cut into ``n`` data frames, optionally followed
by ``r`` XOR parity frames, each behind a 7-byte header (docs/wire-format.md, "Fragmented
downlinks"). The layout, all integers little-endian::

    u16 message_id   the message (a version number modulo 65536)
    u16 index        0 .. n-1 data frames, n .. n+r-1 parity frames
    u16 data_count   n >= 1
    u8  parity_count r, 0 <= r <= min(n, 255)
    ... payload      >= 1 byte

The message is padded with one 0x80 byte (then zeros, never sent) to ``n`` blocks of ``L``
bytes; data frame ``i`` carries block ``i`` (the last one without its zero padding). Every
frame index ``k`` belongs to class ``k mod r``; the parity frame of class ``j`` (the one
index ``k >= n`` with ``k mod r == j``) carries the XOR of the data blocks of class ``j`` (an
interleaved code). A receiver recovers every pattern of losses with at most one lost frame
per class: in particular any run of up to ``r`` consecutive lost frames, wherever it falls. A member that cannot reassemble reports the missing data frames
(:meth:`Reassembler.missing`) and catches up through the unicast path.

Pure: no I/O, no clock. Every malformed frame raises :class:`WireFormatError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from edge_agent.errors import WireFormatError

__all__ = [
    "FRAME_HEADER_BYTES",
    "MAX_PARITY_FRAMES",
    "Fragment",
    "FragmentPlan",
    "Reassembler",
    "encode_fragments",
    "frame_cut",
    "parity_frames_for",
    "parse_fragment",
    "plan_fragments",
]

_HEADER: Final = struct.Struct("<HHHB")
FRAME_HEADER_BYTES: Final = _HEADER.size
"""Bytes of the header in front of every frame's payload (7)."""
MAX_PARITY_FRAMES: Final = 255
MAX_FRAMES: Final = 0xFFFF
"""Largest frame count ``n + r`` (the index is a u16)."""
_MARKER: Final = 0x80

ByteArray = NDArray[np.uint8]
IntArray = NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class FragmentPlan:
    """How a message of ``size_bytes`` is cut: ``data_frames`` blocks of ``block_bytes``
    (the last data frame carries ``last_bytes``), ``parity_frames`` parity frames of
    ``block_bytes``. ``frame_bytes`` is every frame's header and payload, added up."""

    size_bytes: int
    data_frames: int
    parity_frames: int
    block_bytes: int
    last_bytes: int

    @property
    def frames(self) -> int:
        return self.data_frames + self.parity_frames

    @property
    def frame_bytes(self) -> int:
        payload = (self.data_frames - 1 + self.parity_frames) * self.block_bytes + self.last_bytes
        return payload + self.frames * FRAME_HEADER_BYTES


def parity_frames_for(data_frames: IntArray, redundancy: float) -> IntArray:
    """Parity frames for ``data_frames`` (vectorised) at ``redundancy``, a fraction in
    [0, 1]: ``ceil(redundancy * n)``, at most ``min(n, 255)``."""
    if not 0.0 <= redundancy <= 1.0:
        raise ValueError(f"redundancy must be in [0, 1], got {redundancy}")
    n = np.asarray(data_frames, dtype=np.int64)
    wanted = np.ceil(redundancy * n - 1e-9).astype(np.int64)  # 0.1 * 30 is 3, not 4
    out: IntArray = np.minimum(np.minimum(wanted, n), MAX_PARITY_FRAMES)
    return out


def frame_cut(
    size_bytes: IntArray, frame_payload_bytes: int
) -> tuple[IntArray, IntArray, IntArray]:
    """Vectorised cut of messages of ``size_bytes``: ``(data_frames, block_bytes, last_bytes)``
    for frames of at most ``frame_payload_bytes`` (header included)."""
    capacity = frame_payload_bytes - FRAME_HEADER_BYTES
    if capacity < 1:
        raise ValueError(
            f"frame_payload_bytes must be > {FRAME_HEADER_BYTES} (the header), got "
            f"{frame_payload_bytes}"
        )
    padded = np.asarray(size_bytes, dtype=np.int64) + 1
    block = np.minimum(capacity, padded)
    n = -(-padded // block)
    return n, block, padded - (n - 1) * block


def plan_fragments(
    size_bytes: int, frame_payload_bytes: int, parity_frames: int = 0
) -> FragmentPlan:
    """The cut of a ``size_bytes`` message into frames of at most ``frame_payload_bytes``
    (header included), with ``parity_frames`` parity frames."""
    if size_bytes < 0:
        raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
    n_arr, block, last = frame_cut(np.array([size_bytes]), frame_payload_bytes)
    n = int(n_arr[0])
    if not 0 <= parity_frames <= min(n, MAX_PARITY_FRAMES):
        raise ValueError(f"parity_frames must be in [0, min({n}, 255)], got {parity_frames}")
    if n + parity_frames > MAX_FRAMES:
        raise ValueError(
            f"a message of {size_bytes} B needs {n + parity_frames} frames of "
            f"{frame_payload_bytes} B, more than {MAX_FRAMES}: use larger frames"
        )
    return FragmentPlan(size_bytes, n, int(parity_frames), int(block[0]), int(last[0]))


def _parity(blocks: ByteArray, parity_frames: int) -> ByteArray:
    """XOR of the rows ``i`` with ``i mod r == j``, for each ``j`` (shape ``(r, L)``)."""
    n, width = blocks.shape
    rows = -(-n // parity_frames) * parity_frames
    grid = np.zeros((rows, width), dtype=np.uint8)
    grid[:n] = blocks
    out: ByteArray = np.bitwise_xor.reduce(grid.reshape(-1, parity_frames, width), axis=0)
    return out


def encode_fragments(
    message: bytes, message_id: int, frame_payload_bytes: int, parity_frames: int = 0
) -> list[bytes]:
    """``message`` as frames of at most ``frame_payload_bytes`` bytes: data frames first,
    then ``parity_frames`` parity frames. ``message_id`` is taken modulo 65536."""
    plan = plan_fragments(len(message), frame_payload_bytes, parity_frames)
    n, r, width = plan.data_frames, plan.parity_frames, plan.block_bytes
    padded = np.zeros(n * width, dtype=np.uint8)
    padded[: len(message)] = np.frombuffer(message, dtype=np.uint8)
    padded[len(message)] = _MARKER
    blocks = padded.reshape(n, width)
    mid = message_id & 0xFFFF
    frames = [_HEADER.pack(mid, i, n, r) + blocks[i].tobytes() for i in range(n - 1)]
    frames.append(_HEADER.pack(mid, n - 1, n, r) + blocks[-1, : plan.last_bytes].tobytes())
    if r:
        parity = _parity(blocks, r)
        frames += [_HEADER.pack(mid, k, n, r) + parity[k % r].tobytes() for k in range(n, n + r)]
    return frames


@dataclass(frozen=True, slots=True)
class Fragment:
    """One parsed frame: its header fields and payload."""

    message_id: int
    index: int
    data_count: int
    parity_count: int
    payload: bytes

    @property
    def is_parity(self) -> bool:
        return self.index >= self.data_count


def parse_fragment(frame: bytes) -> Fragment:
    """Parse one frame; raises WireFormatError for a frame that breaks the layout."""
    if len(frame) <= FRAME_HEADER_BYTES:
        raise WireFormatError(
            f"fragment: {len(frame)} B, a frame is a {FRAME_HEADER_BYTES}-byte header and "
            "at least 1 byte of payload"
        )
    mid, index, n, r = _HEADER.unpack_from(frame)
    if n == 0:
        raise WireFormatError("fragment: data_count 0, a message has at least one data frame")
    if r > n:
        raise WireFormatError(f"fragment: parity_count {r} exceeds data_count {n}")
    if index >= n + r:
        raise WireFormatError(
            f"fragment: index {index} not below data_count + parity_count {n + r}"
        )
    if n + r > MAX_FRAMES:
        raise WireFormatError(f"fragment: {n + r} frames exceed {MAX_FRAMES}")
    return Fragment(mid, index, n, r, bytes(frame[FRAME_HEADER_BYTES:]))


class Reassembler:
    """Collects the frames of one message in any order; duplicates are ignored.

    :meth:`add` raises WireFormatError for a malformed frame or one that contradicts the
    frames already held (another message, other counts, other lengths, another payload at
    the same index); the frames held are kept."""

    def __init__(self) -> None:
        self._key: tuple[int, int, int] | None = None
        self._block_bytes: int | None = None
        self._frames: dict[int, bytes] = {}

    @property
    def message_id(self) -> int | None:
        return None if self._key is None else self._key[0]

    def add(self, frame: bytes | Fragment) -> bool:
        """Take one frame; True when the message can now be reassembled."""
        frag = frame if isinstance(frame, Fragment) else parse_fragment(frame)
        key = (frag.message_id, frag.data_count, frag.parity_count)
        if self._key is not None and key != self._key:
            raise WireFormatError(
                f"fragment: message {frag.message_id} ({frag.data_count}+{frag.parity_count} "
                f"frames) does not belong to message {self._key[0]} "
                f"({self._key[1]}+{self._key[2]} frames)"
            )
        held = self._frames.get(frag.index)
        if held is not None:
            if held != frag.payload:
                raise WireFormatError(f"fragment: index {frag.index} arrived with two payloads")
            return self.complete
        block = self._check_length(frag)
        self._key, self._block_bytes = key, block
        self._frames[frag.index] = frag.payload
        return self.complete

    def _check_length(self, frag: Fragment) -> int | None:
        """The block length once known; raises for a payload of the wrong length."""
        size = len(frag.payload)
        last = frag.index == frag.data_count - 1
        if last and frag.payload[-1] != _MARKER:
            raise WireFormatError("fragment: the last data frame does not end with 0x80")
        full = not last or frag.data_count == 1
        block = self._block_bytes
        if full:
            if block is not None and size != block:
                raise WireFormatError(
                    f"fragment: index {frag.index} has {size} B, blocks are {block} B"
                )
            tail = self._frames.get(frag.data_count - 1)
            if tail is not None and len(tail) > size:
                raise WireFormatError(
                    f"fragment: last data frame has {len(tail)} B, blocks are {size} B"
                )
            return size
        if block is not None and size > block:
            raise WireFormatError(f"fragment: last data frame has {size} B, blocks are {block} B")
        return block

    def _masks(self) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        """Received data frames by index, received parity frames by class."""
        assert self._key is not None
        _, n, r = self._key
        have = np.zeros(n + r, dtype=np.bool_)
        have[np.fromiter(self._frames, dtype=np.int64, count=len(self._frames))] = True
        parity = np.zeros(r, dtype=np.bool_)
        parity[np.arange(n, n + r) % max(r, 1)] = have[n:]
        return have[:n], parity

    def missing(self) -> tuple[int, ...]:
        """Data frame indices neither received nor recoverable from parity (empty: complete).
        Before the first frame the message is unknown: ``(0,)``."""
        if self._key is None:
            return (0,)
        _, n, r = self._key
        data, parity = self._masks()
        lost = ~data
        if r == 0:
            return tuple(int(i) for i in np.flatnonzero(lost))
        cls = np.arange(n) % r
        lost_per_class = np.bincount(cls[lost], minlength=r)
        fixable = (lost_per_class == 1) & parity
        return tuple(int(i) for i in np.flatnonzero(lost & ~fixable[cls]))

    @property
    def complete(self) -> bool:
        return self._key is not None and not self.missing()

    def message(self) -> bytes:
        """The reassembled message; WireFormatError when frames are still missing."""
        gaps = self.missing()
        if gaps:
            shown = ", ".join(str(i) for i in gaps[:8]) + (", ..." if len(gaps) > 8 else "")
            raise WireFormatError(f"fragment: message incomplete, data frames missing: {shown}")
        assert self._key is not None and self._block_bytes is not None
        _, n, r = self._key
        width = self._block_bytes
        blocks = np.zeros((n, width), dtype=np.uint8)
        for index, payload in self._frames.items():
            if index < n:
                blocks[index, : len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        data, _ = self._masks()
        lost = np.flatnonzero(~data)
        if lost.size:
            held = [self._frames.get(n + (j - n) % r, bytes(width)) for j in range(r)]
            parity = np.stack([np.frombuffer(p, dtype=np.uint8) for p in held])
            blocks[lost] = (_parity(blocks, r) ^ parity)[lost % r]
        flat = blocks.reshape(-1)
        nonzero = np.flatnonzero(flat)
        if nonzero.size == 0 or flat[nonzero[-1]] != _MARKER:
            raise WireFormatError("fragment: the reassembled message has no 0x80 end marker")
        return flat[: nonzero[-1]].tobytes()
