"""Closed-form-size coding of a sorted set of distinct indices in [0, d).

A generalised Elias-Fano code (docs/wire-format.md, "Index block"). Each index i is split
by a bucket size ``m = b * 2**l`` (``b`` in {1, 3}) into a bucket ``q = i // m`` and a
remainder ``r = i % m``:

* high part: the buckets in unary: for the j-th index (0-based) a one at bit ``q_j + j``;
  exactly ``n + (d - 1) // m`` bits (trailing zeros pad it to that length);
* low part: ``r & (2**l - 1)`` as ``l`` raw bits per index; when ``b == 3`` also the trit
  ``r >> l`` per index, packed 40 trits per 64-bit word (base 3, little-endian digits), the
  last word holding the remaining ``k`` trits in ``bit_length(3**k - 1)`` bits.

The size depends only on (d, n, b, l), never on the indices, so the CAT selector prices
every T without encoding. The encoder picks the (b, l) with the fewest bits; the choice
travels in one byte, so a decoder needs no search. With b in {1, 3} the code is within
1.10x of log2 C(d, n) for n <= d/16 (benchmarks/codec.py measures it).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from edge_agent.errors import WireFormatError

TRITS_PER_WORD = 40  # 3**40 < 2**64
_TRIT_BITS = np.array([(3**k - 1).bit_length() for k in range(TRITS_PER_WORD + 1)], dtype=np.int64)
_POW3 = np.array([3**k for k in range(TRITS_PER_WORD)], dtype=np.uint64)
MAX_L = 62

IntArray = npt.NDArray[np.int64]


def _trit_bits(n: IntArray | int) -> IntArray:
    n = np.asarray(n, dtype=np.int64)
    return np.asarray(64 * (n // TRITS_PER_WORD) + _TRIT_BITS[n % TRITS_PER_WORD], dtype=np.int64)


def _max_l(d: int) -> int:
    return min(MAX_L, max(1, int(d).bit_length()))


def _bits_for(d: int, n: IntArray, b: IntArray, l: IntArray) -> IntArray:
    """Exact bit count of the code (b, l) for n indices; arrays broadcast together."""
    m = b << l
    bits = n * l + n + (d - 1) // m
    return np.asarray(bits + np.where(b == 3, _trit_bits(n), 0), dtype=np.int64)


def _band(d: int, n: IntArray) -> tuple[IntArray, IntArray]:
    """Candidate (b, l) per n, shape (len(n), 8): l within 2 of the continuous optimum.

    For fixed n and b the bit count is n*l + d/(b*2^l) up to one bit of rounding, convex in
    l with its minimum at log2(d*ln2/(b*n)); the integer optimum lies within one step of it,
    so this band holds the minimum over every l (a test checks it against all l).
    """
    top = _max_l(d)
    b = np.array([1, 1, 1, 1, 3, 3, 3, 3], dtype=np.int64)
    step = np.array([-2, -1, 0, 1, -2, -1, 0, 1], dtype=np.int64)
    centre = np.floor(np.log2(d * np.log(2) / (b[None, :] * np.maximum(n[:, None], 1)))).astype(
        np.int64
    )
    l = np.clip(centre + 1 + step[None, :], 0, top)
    return np.broadcast_to(b, l.shape), l


@functools.lru_cache(maxsize=4096)
def best_code(d: int, n: int) -> tuple[int, int, int]:
    """Return (b, l, bits) of the cheapest code for n indices out of d (ties: b=1, smaller l).

    Cached: a pure function of (d, n), and every delta the aggregator encodes asks again."""
    if n == 0:
        return 1, 0, 0
    nn = np.array([n], dtype=np.int64)
    b, l = _band(d, nn)
    bits = _bits_for(d, nn[:, None], b, l)[0]
    # among equal sizes prefer b = 1 (plain Elias-Fano), then the smaller l
    order = np.lexsort((l[0], b[0], bits))
    k = int(order[0])
    return int(b[0, k]), int(l[0, k]), int(bits[k])


class _Codes(NamedTuple):
    """Per d, for b = 1 and b = 3: ``neg_gain[l]`` = -(bits saved by l + 1 over l, beyond
    the n it costs), for l = 0 .. top - 1 (ascending), and ``high[l]`` = (d - 1) // (b * 2^l)
    for l = 0 .. top."""

    neg_gain1: IntArray
    high1: IntArray
    neg_gain3: IntArray
    high3: IntArray


@functools.lru_cache(maxsize=256)
def _codes(d: int) -> _Codes:
    """The closed form of the cheapest l per b, a pure function of d (cached).

    bits(l) = n*(l + 1) + (d - 1) // (b * 2^l) (+ the trits, which do not depend on l), so
    bits(l + 1) - bits(l) = n - D_l with D_l = h_l - h_{l+1} = ceil(h_l / 2), h_l =
    (d - 1) // (b * 2^l). D_l is nonincreasing in l, so the bit count is convex in l and the
    cheapest l (the smallest on ties) is the number of l < top with D_l > n.
    """
    top = _max_l(d)
    out: list[IntArray] = []
    for b in (1, 3):
        high = np.array([(d - 1) // (b << l) for l in range(top + 1)], dtype=np.int64)
        neg_gain = high[1:] - high[:-1]  # -D_l, ascending
        neg_gain.flags.writeable = False
        high.flags.writeable = False
        out += [neg_gain, high]
    return _Codes(*out)


def index_bits(d: int, n: npt.ArrayLike) -> IntArray:
    """Bits of the index block body for n indices out of d, vectorised over n (0 for n == 0).

    The minimum over every code the decoder accepts, in closed form (:func:`_codes`): a few
    numpy passes over n whatever d, so the selector prices thousands of T at once."""
    n_arr = np.atleast_1d(np.asarray(n, dtype=np.int64))
    codes = _codes(d)
    neg_n = -n_arr
    l1 = codes.neg_gain1.searchsorted(neg_n)
    l3 = codes.neg_gain3.searchsorted(neg_n)
    bits = n_arr * (l1 + 1)
    bits += codes.high1[l1]
    bits3 = n_arr * (l3 + 1)
    bits3 += codes.high3[l3]
    bits3 += 64 * (n_arr // TRITS_PER_WORD)
    bits3 += _TRIT_BITS[n_arr % TRITS_PER_WORD]
    np.minimum(bits, bits3, out=bits)
    bits[n_arr == 0] = 0
    return bits


def index_bits_exhaustive(d: int, n: int) -> int:
    """Reference: the minimum over every (b, l) the decoder accepts (for tests)."""
    if n == 0:
        return 0
    ls = np.arange(_max_l(d) + 1, dtype=np.int64)
    nn = np.array([n], dtype=np.int64)
    return int(min(_bits_for(d, nn, np.full_like(ls, b), ls).min() for b in (1, 3)))


def index_bytes(d: int, n: npt.ArrayLike) -> IntArray:
    """Bytes of the whole index block (1 code byte + body) for n indices; 0 when n == 0."""
    n_arr = np.atleast_1d(np.asarray(n, dtype=np.int64))
    out = index_bits(d, n_arr)
    out += 15  # 1 code byte + the body rounded up to bytes: (bits + 7) // 8 + 1
    out >>= 3
    out[n_arr == 0] = 0
    return out


def _bits_of_words(words: npt.NDArray[np.uint64], width: int) -> npt.NDArray[np.uint8]:
    shifts = np.arange(width, dtype=np.uint64)
    return ((words[:, None] >> shifts[None, :]) & np.uint64(1)).astype(np.uint8).ravel()


_SMALL_BITS = 1 << 15  # up to this many bits, _read_words unpacks (<= 256 KiB of temporaries)


def _read_words(
    raw: npt.NDArray[np.uint8], bit_pos: int, count: int, width: int
) -> npt.NDArray[np.uint64]:
    """``count`` little-endian words of ``width`` bits (1..64) starting at bit ``bit_pos``.

    Small blocks (the common case: a few hundred indices) are unpacked bit by bit, which
    costs few numpy calls; large ones gather the (up to) nine bytes under each word one
    byte column at a time, so temporaries stay a few bytes per word (a decoder must not
    amplify hostile input).
    """
    nbits = count * width
    if count == 1:
        first, last = bit_pos >> 3, (bit_pos + width + 7) >> 3
        value = int.from_bytes(raw[first:last].tobytes(), "little") >> (bit_pos & 7)
        return np.array([value & ((1 << width) - 1)], dtype=np.uint64)
    if nbits <= _SMALL_BITS:
        first = bit_pos >> 3
        off = bit_pos - 8 * first
        bits = np.unpackbits(raw[first : (bit_pos + nbits + 7) >> 3], bitorder="little")
        words = bits[off : off + nbits].reshape(count, width).astype(np.uint64)
        weights = np.uint64(1) << np.arange(width, dtype=np.uint64)
        out: npt.NDArray[np.uint64] = (words * weights).sum(axis=1, dtype=np.uint64)
        return out
    pos = np.arange(count, dtype=np.int64)
    pos *= width
    pos += bit_pos
    shift = (pos & 7).astype(np.uint64)
    pos >>= 3
    padded = np.concatenate([raw, np.zeros(9, dtype=np.uint8)])
    word = np.zeros(count, dtype=np.uint64)
    for k in range(8):
        word |= padded[pos].astype(np.uint64) << np.uint64(8 * k)
        pos += 1
    word >>= shift
    # the ninth byte supplies the top `shift` bits; (x << 64 - shift) is undefined for shift 0
    word |= (padded[pos].astype(np.uint64) << np.uint64(1)) << (np.uint64(63) - shift)
    if width < 64:
        word &= np.uint64((1 << width) - 1)
    return word


def encode_indices(indices: npt.NDArray[np.integer], d: int) -> bytes:
    """Encode sorted, distinct indices in [0, d). Returns b"" for an empty set."""
    n = int(indices.size)
    if n == 0:
        return b""
    idx = indices.astype(np.int64, copy=False)
    b, l, total = best_code(d, n)
    m = b << l
    q = idx // m
    r = idx % m
    high = np.zeros(n + (d - 1) // m, dtype=np.uint8)
    high[q + np.arange(n, dtype=np.int64)] = 1
    parts = [high]
    if l:
        parts.append(_bits_of_words((r & ((1 << l) - 1)).astype(np.uint64), l))
    if b == 3:
        trits = (r >> l).astype(np.uint64)
        full = n // TRITS_PER_WORD
        if full:
            words = (trits[: full * TRITS_PER_WORD].reshape(full, TRITS_PER_WORD) * _POW3).sum(
                axis=1, dtype=np.uint64
            )
            parts.append(_bits_of_words(words, 64))
        rest = n - full * TRITS_PER_WORD
        if rest:
            word = (trits[full * TRITS_PER_WORD :] * _POW3[:rest]).sum(dtype=np.uint64)
            parts.append(_bits_of_words(np.array([word], dtype=np.uint64), int(_TRIT_BITS[rest])))
    bits = np.concatenate(parts)
    assert bits.size == total
    code = (0x80 if b == 3 else 0) | l
    return bytes([code]) + np.packbits(bits, bitorder="little").tobytes()


_WEIGHTS = [np.uint64(1) << np.arange(w, dtype=np.uint64) for w in range(65)]
_SMALL_N = 4096
_ARANGE = np.arange(_SMALL_N, dtype=np.int64)
_ARANGE.flags.writeable = False
_TRIT_LIMIT_INT = 3**TRITS_PER_WORD
_FEW_WORDS = 8  # up to this many full trit words, _decode_small reads them as Python ints
_WORD_MASK = (1 << 64) - 1
_TRIT_BITS_INT = [int(v) for v in _TRIT_BITS]


def _words_of_bits(
    bits: npt.NDArray[np.uint8], start: int, count: int, width: int
) -> npt.NDArray[np.uint64]:
    """``count`` little-endian ``width``-bit words from unpacked ``bits`` at ``start``."""
    out: npt.NDArray[np.uint64] = (
        bits[start : start + count * width].reshape(count, width) @ _WEIGHTS[width]
    )
    return out


def _decode_small(raw: npt.NDArray[np.uint8], n: int, b: int, l: int, high_len: int) -> IntArray:
    """:func:`decode_indices` for a block of at most ``_SMALL_BITS`` bits: everything is
    unpacked once and each part is a reshape and a product with cached bit weights (the
    same checks, in the same order, as the general path)."""
    bits = np.unpackbits(raw, bitorder="little")
    ones = bits[:high_len].view(np.bool_).nonzero()[0]  # (13x faster than on uint8)
    if ones.size != n:
        raise WireFormatError(f"index block: {ones.size} ones in the high part, expected {n}")
    q = ones
    q -= _ARANGE[:n] if n <= _SMALL_N else np.arange(n, dtype=np.int64)
    pos = high_len
    r = _words_of_bits(bits, pos, n, l).view(np.int64) if l else np.zeros(n, dtype=np.int64)
    pos += n * l
    if b == 3:
        full = n // TRITS_PER_WORD
        rest = n - full * TRITS_PER_WORD
        if full <= _FEW_WORDS:  # the common case: a few words, read as one Python int
            stream = int.from_bytes(raw[pos >> 3 :].tobytes(), "little") >> (pos & 7)
            found = []
            for _ in range(full):
                found.append(stream & _WORD_MASK)
                stream >>= 64
            if found and max(found) >= _TRIT_LIMIT_INT:
                raise WireFormatError("index block: trit word out of range")
            if rest:
                last = stream & ((1 << _TRIT_BITS_INT[rest]) - 1)
                if last >= 3**rest:
                    raise WireFormatError("index block: trit word out of range")
                found.append(last)
            words = np.array(found, dtype=np.uint64)
        else:
            words = np.zeros(full + (1 if rest else 0), dtype=np.uint64)
            words[:full] = _words_of_bits(bits, pos, full, 64)
            pos += 64 * full
            if max(words[:full].tolist()) >= _TRIT_LIMIT_INT:
                raise WireFormatError("index block: trit word out of range")
            if rest:
                width = _TRIT_BITS_INT[rest]
                last = int.from_bytes(raw[pos >> 3 :].tobytes(), "little") >> (pos & 7)
                last &= (1 << width) - 1
                if last >= 3**rest:
                    raise WireFormatError("index block: trit word out of range")
                words[full] = last
        # the last word is < 3**rest, so its digits beyond `rest` are zero and cut off
        digits = (words[:, None] // _POW3[None, :]) % np.uint64(3)
        r |= digits.ravel()[:n].view(np.int64) << l
    idx = q
    idx *= b << l
    idx += r
    return idx


def _block_body(
    buf: bytes | memoryview, offset: int, d: int, n: int
) -> tuple[npt.NDArray[np.uint8], int, int, int, int, int]:
    """Read the code byte of the block at ``buf[offset]`` and locate its body.

    Return (body bytes, b, l, high part bits, body bits, offset past the block) after
    checking that the code is one the decoder accepts, that the body is all there and that
    its padding bits are zero."""
    if offset >= len(buf):
        raise WireFormatError("truncated: index code byte missing")
    code = buf[offset]
    b = 3 if code & 0x80 else 1
    l = code & 0x7F
    if l > _max_l(d):
        raise WireFormatError(f"index code: l={l} too large for d={d}")
    m = b << l
    high_len = n + (d - 1) // m
    trit_bits = 64 * (n // TRITS_PER_WORD) + _TRIT_BITS_INT[n % TRITS_PER_WORD]
    total = high_len + n * l + (trit_bits if b == 3 else 0)
    nbytes = (total + 7) // 8
    end = offset + 1 + nbytes
    if end > len(buf):
        raise WireFormatError(f"truncated: index block needs {nbytes} bytes")
    raw = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=offset + 1)
    if total % 8 and raw[-1] >> (total % 8):
        raise WireFormatError("index block: padding bits are not zero")
    return raw, b, l, high_len, total, end


def _trits_large(raw: npt.NDArray[np.uint8], pos: int, n: int) -> IntArray:
    """The ``n`` trits of a large block, from its trit words at bit ``pos``."""
    full = n // TRITS_PER_WORD
    rest = n - full * TRITS_PER_WORD
    trits = np.empty(n, dtype=np.int64)
    if full:
        w = _read_words(raw, pos, full, 64)
        pos += 64 * full
        if (w >= np.uint64(3**TRITS_PER_WORD)).any():
            raise WireFormatError("index block: trit word out of range")
        digits = (w[:, None] // _POW3[None, :]) % np.uint64(3)
        trits[: full * TRITS_PER_WORD] = digits.ravel().astype(np.int64)
    if rest:
        width = int(_TRIT_BITS[rest])
        last = int(_read_words(raw, pos, 1, width)[0]) if width else 0
        if last >= 3**rest:
            raise WireFormatError("index block: trit word out of range")
        trits[full * TRITS_PER_WORD :] = (last // _POW3[:rest].astype(np.int64)) % 3
    return trits


def _decode_large(raw: npt.NDArray[np.uint8], n: int, b: int, l: int, high_len: int) -> IntArray:
    """:func:`decode_indices` for a block of more than ``_SMALL_BITS`` bits.

    Only the high part is unpacked bit by bit (about 2.5 bits per index); the low part and
    the trit words are gathered straight from the bytes: memory stays proportionate."""
    high = np.unpackbits(raw[: (high_len + 7) // 8], bitorder="little")[:high_len]
    ones = high.view(np.bool_).nonzero()[0]  # (13x faster than on uint8)
    del high
    if ones.size != n:
        raise WireFormatError(f"index block: {ones.size} ones in the high part, expected {n}")
    q = ones
    q -= np.arange(n, dtype=np.int64)
    pos = high_len
    r = _read_words(raw, pos, n, l).view(np.int64) if l else np.zeros(n, dtype=np.int64)
    pos += n * l
    if b == 3:
        r |= _trits_large(raw, pos, n) << l
    idx = q
    idx *= b << l
    idx += r
    return idx


def decode_indices(buf: bytes | memoryview, offset: int, d: int, n: int) -> tuple[IntArray, int]:
    """Decode n indices from buf[offset:]; return (indices, new offset). Validates everything."""
    if n == 0:
        return np.zeros(0, dtype=np.int64), offset
    raw, b, l, high_len, total, end = _block_body(buf, offset, d, n)
    if total <= _SMALL_BITS:
        idx = _decode_small(raw, n, b, l, high_len)
    else:
        idx = _decode_large(raw, n, b, l, high_len)
    # (inline, not a helper: a call costs ~3 % of decoding a typical block of 100 indices)
    top = int(idx[-1])
    if top >= d:
        raise WireFormatError(f"index {top} out of range for d={d}")
    if n > 1 and not (idx[1:] > idx[:-1]).all():
        raise WireFormatError("indices not strictly increasing")
    return idx, end


# ---------------------------------------------------------------- many blocks at once

#: one pass of :func:`decode_blocks` holds at most this many indices and body bits (or one
#: block, if larger), so its temporaries stay under 1 MiB whatever the batch: a hostile
#: batch needs about twice what decode_indices needs for its largest block, never memory
#: that grows with the batch. Small passes are also faster: with per-index arrays of at
#: most 64 KiB the heap is reused from pass to pass, while larger ones were page-faulted
#: anew (passes of 12,000 indices: ~300 faults per batch of 400 updates).
_BATCH_INDICES = 8_000
_BATCH_BITS = 1 << 18
#: the low bits of an index are read as one unaligned 64-bit word: l + 7 bits must fit
_BATCH_MAX_L = 56
_LAYOUT_FIELDS = 7  # d, n, b, l, high_len, bits, nbytes
_TRIT_LIMIT = np.uint64(3**TRITS_PER_WORD)
_TRIT_MASKS = np.array([(1 << int(w)) - 1 for w in _TRIT_BITS[:TRITS_PER_WORD]], dtype=np.uint64)
#: by bits % 8 of a stream: the padding bits of its last byte / the bits it uses there
_PAD_MASKS = np.array([0] + [0xFF & (0xFF << k) for k in range(1, 8)], dtype=np.uint8)
_USED_MASKS = np.array([0xFF] + [(1 << k) - 1 for k in range(1, 8)], dtype=np.uint8)
#: a trit word is split into 8 base-243 digits by scalar divisions (numpy divides by a
#: scalar much faster than by a vector); each digit's 5 trits come from this table
_TRIT_CHUNK = np.uint64(3**5)
_TRITS5 = (
    np.array([[(v // 3**e) % 3 for e in range(5)] for v in range(3**5)], dtype=np.uint8)
    .view(np.dtype("V5"))
    .ravel()
)
_DIGIT = np.arange(TRITS_PER_WORD, dtype=np.int64)


class BlockLayout(NamedTuple):
    """Where the parts of an index block body lie, from (d, n, code byte) alone."""

    nbytes: int  # body bytes (after the code byte)
    bits: int  # body bits B (the rest of the last byte is padding)
    n: int
    b: int
    l: int
    packed: bytes  # d, n, b, l, high_len, bits, nbytes as int64, for decode_blocks


@functools.lru_cache(maxsize=4096)
def block_layout(d: int, n: int, code: int) -> BlockLayout | None:
    """The layout of an index block of ``n >= 1`` indices out of ``d`` sent with this code
    byte, or None when :func:`decode_indices` rejects the code byte (``l`` too large)."""
    b = 3 if code & 0x80 else 1
    l = code & 0x7F
    if l > _max_l(d):
        return None
    high_len = n + (d - 1) // (b << l)
    trit_bits = 64 * (n // TRITS_PER_WORD) + _TRIT_BITS_INT[n % TRITS_PER_WORD]
    total = high_len + n * l + (trit_bits if b == 3 else 0)
    nbytes = (total + 7) // 8
    packed = np.array([d, n, b, l, high_len, total, nbytes], dtype=np.int64).tobytes()
    return BlockLayout(nbytes, total, n, b, l, packed)


def decode_blocks(bodies: Sequence[bytes], layouts: Sequence[BlockLayout]) -> list[IntArray | None]:
    """Decode many index blocks in a few vectorised passes (a batch of messages).

    ``bodies[i]`` is the body of block i (the ``layouts[i].nbytes`` bytes after its code
    byte); the blocks may differ in d, n and code. Element i of the result is what
    :func:`decode_indices` returns for the block, or None where it would raise (or where
    the block is too large for a batch pass): call it then, for the exact error. Accepted
    blocks are views into one array per pass.
    """
    out: list[IntArray | None] = [None] * len(bodies)
    # blocks with trits first: their trits are then a prefix of the pass's indices
    order = sorted(range(len(layouts)), key=lambda i: layouts[i].b != 3)
    todo: list[int] = []
    n_sum = bits_sum = 0
    for i in order:
        lay = layouts[i]
        if lay.bits > _SMALL_BITS or lay.l > _BATCH_MAX_L or len(bodies[i]) != lay.nbytes:
            continue
        if todo and (n_sum + lay.n > _BATCH_INDICES or bits_sum + lay.bits > _BATCH_BITS):
            _decode_pass(bodies, layouts, todo, out)
            todo, n_sum, bits_sum = [], 0, 0
        todo.append(i)
        n_sum += lay.n
        bits_sum += lay.bits
    if todo:
        _decode_pass(bodies, layouts, todo, out)
    return out


def _pass_ones(
    raw: npt.NDArray[np.uint8], start: IntArray, high: IntArray
) -> tuple[IntArray, IntArray, IntArray]:
    """The high parts of a pass: (positions of their ones in the gathered high bytes, the
    first byte of each block's high part there, the count of ones per block)."""
    hbytes = (high + 7) >> 3
    hend = np.cumsum(hbytes)
    hstart = hend - hbytes
    gather = np.arange(int(hend[-1]), dtype=np.int64)
    gather += np.repeat(start - hstart, hbytes)
    hb = raw[gather]
    del gather
    hb[hend - 1] &= _USED_MASKS[high & 7]
    ones = np.unpackbits(hb, bitorder="little").view(np.bool_).nonzero()[0]
    del hb
    counts = np.diff(np.searchsorted(ones, 8 * hend), prepend=0)
    return ones, hstart, counts


def _pass_low_bits(
    words: npt.NDArray[np.uint64],
    ar: IntArray,
    low_start: IntArray,
    nstart: IntArray,
    n: IntArray,
    l: IntArray,
    l_rep: IntArray | None,
) -> IntArray:
    """The low bits of every index of a pass: l per index, from the unaligned 64-bit word
    at its bit position (``l_rep`` is None when every block has the same l)."""
    l0 = int(l[0])
    if l_rep is None and l0 == 0:
        return np.zeros(ar.size, dtype=np.int64)
    pos = ar * l0 if l_rep is None else ar * l_rep
    pos += np.repeat(low_start - nstart * l, n)
    w = np.take(words, pos >> 3)
    pos &= 7
    w >>= pos.view(np.uint64)
    del pos
    if l_rep is None:
        w &= np.uint64((1 << l0) - 1)
    else:
        w &= np.repeat(((1 << l) - 1).view(np.uint64), n)
    r: IntArray = w.view(np.int64)
    return r


def _pass_trits(
    words: npt.NDArray[np.uint64],
    padded: npt.NDArray[np.uint8],
    trit_start: IntArray,
    n3: IntArray,
    ok: npt.NDArray[np.bool_],
) -> IntArray:
    """The trits of the blocks with b = 3 (the first ``n3.size`` of a pass), in index order.

    Their trit words (64 bits of 40 trits, the last one shorter) start at bit
    ``trit_start``; a block with a word out of range is marked False in ``ok``."""
    nw = (n3 + TRITS_PER_WORD - 1) // TRITS_PER_WORD
    wend = np.cumsum(nw)
    nwords = int(wend[-1])
    tpos = np.arange(nwords, dtype=np.int64)
    tpos *= 64
    tpos += np.repeat(trit_start - 64 * (wend - nw), nw)
    byte = tpos >> 3
    shift = (tpos & 7).view(np.uint64)
    tw = np.take(words, byte) >> shift
    # the ninth byte supplies the top `shift` bits ((x << 64 - 0) would be undefined)
    tw |= (np.take(padded, byte + 8).astype(np.uint64) << np.uint64(1)) << (np.uint64(63) - shift)
    limit = np.full(nwords, _TRIT_LIMIT, dtype=np.uint64)
    used = np.full(nwords, TRITS_PER_WORD, dtype=np.int64)
    rest = n3 % TRITS_PER_WORD
    part = np.flatnonzero(rest)
    if part.size:
        last = wend[part] - 1
        tw[last] &= _TRIT_MASKS[rest[part]]
        limit[last] = _POW3[rest[part]]
        used[last] = rest[part]
    bad = np.flatnonzero(tw >= limit)
    if bad.size:
        ok[np.searchsorted(wend, bad, side="right")] = False
        tw[bad] = 0  # (their blocks are rejected; keep the digits below in range)
    chunks = np.empty((nwords, 8), dtype=np.uint64)
    for c in range(8):
        nxt = tw // _TRIT_CHUNK
        chunks[:, c] = tw - nxt * _TRIT_CHUNK
        tw = nxt
    digits = np.take(_TRITS5, chunks.view(np.int64)).view(np.uint8)  # (nwords, 40)
    trits: IntArray = digits[_DIGIT[None, :] < used[:, None]].astype(np.int64)
    return trits


def _pass_check_order(idx: IntArray, nend: IntArray, ok: npt.NDArray[np.bool_]) -> None:
    """Mark False in ``ok`` every block whose indices do not strictly increase."""
    if idx.size > 1:
        down = idx[1:] <= idx[:-1]
        down[nend[:-1] - 1] = False  # across two blocks
        bad = np.flatnonzero(down)
        if bad.size:
            ok[np.searchsorted(nend, bad, side="right")] = False


def _decode_pass(
    bodies: Sequence[bytes],
    layouts: Sequence[BlockLayout],
    rows: list[int],
    out: list[IntArray | None],
) -> None:
    """Decode blocks ``rows`` (those with b = 3 first) into ``out``; None where a check fails.

    The blocks' bytes are joined into one stream, and each part of each block is located by
    per-block offsets expanded to per-index ones with np.repeat. High parts start on byte
    boundaries: their bytes are gathered, the bits past each high part cleared, and one
    nonzero() finds every one (a block must hold exactly n: otherwise it is dropped and the
    pass restarts without it, as the ones would no longer line up with the blocks). Low bits
    and trit words are read as unaligned 64-bit words at their bit positions.
    """
    k = len(rows)
    raw = np.frombuffer(b"".join([bodies[i] for i in rows]), dtype=np.uint8)
    lay = np.frombuffer(b"".join([layouts[i].packed for i in rows]), dtype=np.int64)
    d, n, b, l, high, bits, nbytes = lay.reshape(k, _LAYOUT_FIELDS).T.copy()
    ok = np.ones(k, dtype=np.bool_)
    end = np.cumsum(nbytes)
    start = end - nbytes
    ok &= (raw[end - 1] & _PAD_MASKS[bits & 7]) == 0

    # high parts: the positions of the ones, block by block
    ones, hstart, counts = _pass_ones(raw, start, high)
    if not (counts == n).all():
        del ones
        good = [rows[j] for j in np.flatnonzero(counts == n).tolist()]
        if good:
            _decode_pass(bodies, layouts, good, out)
        return
    nend = np.cumsum(n)
    nstart = nend - n
    total = int(nend[-1])
    ar = np.arange(total, dtype=np.int64)
    q = ones
    q -= ar
    q -= np.repeat(8 * hstart - nstart, n)

    # low bits, read through an unaligned 64-bit view of the (padded) stream
    padded = np.zeros(raw.size + 16, dtype=np.uint8)
    padded[: raw.size] = raw
    words = np.ndarray((raw.size + 8,), dtype=np.dtype("<u8"), buffer=padded, strides=(1,))
    low_start = 8 * start + high
    l_rep: IntArray | None = None if bool((l == l[0]).all()) else np.repeat(l, n)
    r = _pass_low_bits(words, ar, low_start, nstart, n, l, l_rep)
    del ar

    # trits (the first k3 blocks)
    k3 = int(np.count_nonzero(b == 3))
    if k3:
        n_3 = int(nend[k3 - 1])
        trits = _pass_trits(words, padded, low_start[:k3] + n[:k3] * l[:k3], n[:k3], ok)
        r[:n_3] |= trits << (int(l[0]) if l_rep is None else l_rep[:n_3])

    idx = q
    m = b << l
    idx *= int(m[0]) if (m == m[0]).all() else np.repeat(m, n)
    idx += r
    del r
    ok &= idx[nend - 1] < d
    _pass_check_order(idx, nend, ok)
    for i, s, e, good_row in zip(rows, nstart.tolist(), nend.tolist(), ok.tolist(), strict=True):
        if good_row:
            out[i] = idx[s:e]
