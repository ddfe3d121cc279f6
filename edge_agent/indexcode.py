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


def index_bits(d: int, n: npt.ArrayLike) -> IntArray:
    """Bits of the index block body for n indices out of d, vectorised over n (0 for n == 0)."""
    n_arr = np.atleast_1d(np.asarray(n, dtype=np.int64))
    b, l = _band(d, n_arr)
    bits = _bits_for(d, n_arr[:, None], b, l).min(axis=1)
    return np.where(n_arr == 0, 0, bits)


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
    return np.where(n_arr == 0, 0, 1 + (index_bits(d, n_arr) + 7) // 8)


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
    ones = bits[:high_len].nonzero()[0]
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
        words = np.zeros(full + (1 if rest else 0), dtype=np.uint64)
        if full:
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


def decode_indices(buf: bytes | memoryview, offset: int, d: int, n: int) -> tuple[IntArray, int]:
    """Decode n indices from buf[offset:]; return (indices, new offset). Validates everything."""
    if n == 0:
        return np.zeros(0, dtype=np.int64), offset
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
    if total <= _SMALL_BITS:
        idx = _decode_small(raw, n, b, l, high_len)
        top = int(idx[-1])
        if top >= d:
            raise WireFormatError(f"index {top} out of range for d={d}")
        if n > 1 and not (idx[1:] > idx[:-1]).all():
            raise WireFormatError("indices not strictly increasing")
        return idx, end
    # Only the high part is unpacked bit by bit (about 2.5 bits per index); the low part
    # and the trit words are gathered straight from the bytes: memory stays proportionate.
    ones = np.flatnonzero(np.unpackbits(raw[: (high_len + 7) // 8], bitorder="little")[:high_len])
    if ones.size != n:
        raise WireFormatError(f"index block: {ones.size} ones in the high part, expected {n}")
    q = ones
    q -= np.arange(n, dtype=np.int64)
    pos = high_len
    r = _read_words(raw, pos, n, l).view(np.int64) if l else np.zeros(n, dtype=np.int64)
    pos += n * l
    if b == 3:
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
        r |= trits << l
    idx = q
    idx *= m
    idx += r
    if idx[-1] >= d:
        raise WireFormatError(f"index {int(idx[-1])} out of range for d={d}")
    if n > 1 and not (idx[1:] > idx[:-1]).all():
        raise WireFormatError("indices not strictly increasing")
    return idx, end
