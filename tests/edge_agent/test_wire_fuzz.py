"""Fuzz edge_agent.protocol.wire.decode and decode_model: only WireFormatError may escape, and no
decode may allocate memory out of proportion to the bytes it was given.

The big loop uses a seeded numpy Generator (reproducible, fast), not hypothesis. Memory is
measured with tracemalloc (peak traced allocation of one decode), never with time.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from helpers import uvarint

from edge_agent.errors import WireFormatError
from edge_agent.numerics.compressors import Update
from edge_agent.protocol.wire import decode, decode_model, encode, encode_delta, encode_snapshot

N_INPUTS = 100_000
MiB = 1 << 20
# A decode of a message of at most a few KiB must peak under this (a 20-byte message that
# claims d = 2^32 - 1 must not allocate anything proportional to d).
SMALL_INPUT_PEAK = 2 * MiB
EXTREME = [
    0,
    1,
    2,
    127,
    128,
    255,
    2**14,
    2**31,
    2**32 - 1,
    2**32,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**70,
]
Decoder = Callable[[bytes], object]


def _pool(rng: np.random.Generator) -> list[bytes]:
    """Valid messages of every kind, small enough to keep the loop fast."""
    out: list[bytes] = []
    for compressor in ("dense", "topk", "signtopk", "randk"):
        for d in (1, 3, 20, 41, 100, 1000, 47236):
            if compressor == "dense" and d > 300:
                continue
            for t in sorted({0, 1, min(d, 5), min(d, 40), min(d, 81), min(d, 200)}):
                if compressor == "dense":
                    t = d
                idx = None if compressor == "dense" else np.sort(rng.choice(d, t, replace=False))
                for dtype in ("float32", "float16", "float64"):
                    if compressor == "signtopk":
                        u = Update(
                            "signtopk", d, idx, rng.choice(np.array([-1, 1], np.int8), t), scale=0.5
                        )
                    else:
                        vals = rng.standard_normal(t).astype(
                            {"float32": "<f4", "float16": "<f2", "float64": "<f8"}[dtype]
                        )
                        u = Update(
                            compressor,
                            d,
                            idx,
                            vals,
                            semantics=("plain", "ef", "ef21", "dir")[int(rng.integers(4))],
                        )
                    out.append(
                        encode(
                            u,
                            job="job-1",
                            agent="pi.01",
                            round=int(rng.integers(0, 2**20)),
                            seq=0,
                            value_dtype=dtype,
                        )
                    )
    for d in (1, 20, 41, 300, 47236):
        if d <= 300:
            out.append(encode_snapshot(rng.standard_normal(d), job="job-1", version=9))
        for n in sorted({0, 1, min(d, 5), min(d, 41), min(d, 200)}):
            idx = np.sort(rng.choice(d, n, replace=False))
            out.append(
                encode_delta(
                    idx, rng.standard_normal(n), job="job-1", base_version=8, version=9, d=d
                )
            )
    return out


def _header(rng: np.random.Generator) -> bytes:
    """A fixed header that is valid or nearly so, so random bytes reach deeper fields."""
    kind = int(rng.choice([1, 1, 2, 3, int(rng.integers(256))]))
    comp = int(rng.integers(0, 5)) if kind == 1 else int(rng.choice([0, 0, 0, 1]))
    flags = int(rng.integers(0, 16)) if rng.random() < 0.9 else int(rng.integers(256))
    return b"\xca\x7e" + bytes(
        [1 if rng.random() < 0.95 else int(rng.integers(256)), kind, comp, flags]
    )


def _extreme_varint(rng: np.random.Generator) -> bytes:
    r = rng.random()
    if r < 0.7:
        return uvarint(int(rng.choice(np.array(EXTREME, dtype=object))))
    if r < 0.8:  # overlong
        return b"\x80" * int(rng.integers(1, 12)) + b"\x00"
    if r < 0.9:  # never-ending
        return b"\xff" * int(rng.integers(1, 16))
    return uvarint(int(rng.integers(0, 2**40)))


def _crafted(rng: np.random.Generator) -> bytes:
    """Headers with extreme varints, huge d with tiny payloads."""
    head = _header(rng) + b"\x01j"
    kind = head[3]
    fields = 4 if kind in (1, 3) else 2  # update: round seq d T (+agent); delta: base version d n
    parts = [head]
    if kind == 1:
        parts.append(b"\x02ab")
    for _ in range(fields):
        parts.append(
            _extreme_varint(rng) if rng.random() < 0.6 else uvarint(int(rng.integers(0, 50)))
        )
    if rng.random() < 0.5:  # a huge d and a plausible T
        d = int(rng.choice([2**31, 2**32 - 1, 2**32 - 2, 10**9]))
        parts[-2] = uvarint(d)
        parts[-1] = uvarint(int(rng.choice([1, 2, 40, d, d - 1])))
    code = (
        bytes([int(rng.integers(256))]) if rng.random() < 0.5 else bytes([int(rng.integers(0, 34))])
    )
    parts.append(code + rng.bytes(int(rng.integers(0, 24))))
    return b"".join(parts)


def _mutated(rng: np.random.Generator, blob: bytes) -> bytes:
    buf = bytearray(blob)
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(6))
        pos = int(rng.integers(0, len(buf) + 1))
        hot = int(rng.integers(0, min(48, len(buf) + 1)))  # headers and index blocks live up front
        p = hot if rng.random() < 0.6 else pos
        if op == 0 and buf:
            buf[min(p, len(buf) - 1)] ^= 1 << int(rng.integers(8))
        elif op == 1 and buf:
            buf[min(p, len(buf) - 1)] = int(
                rng.choice([0, 0x7F, 0x80, 0xFF, int(rng.integers(256))])
            )
        elif op == 2:
            buf[p:p] = rng.bytes(int(rng.integers(1, 4)))
        elif op == 3 and buf:
            del buf[p : p + int(rng.integers(1, 4))]
        elif op == 4:
            del buf[pos:]
        else:  # replace a header varint by an extreme one
            lo = min(6, len(buf))
            at = int(rng.integers(lo, max(lo, min(len(buf), 24)) + 1))
            buf[at : at + int(rng.integers(1, 4))] = _extreme_varint(rng)
    return bytes(buf)


def _inputs(rng: np.random.Generator, pool: list[bytes]) -> Iterator[bytes]:
    for i in range(N_INPUTS):
        kind = i % 10
        if kind == 0:
            yield rng.bytes(int(rng.integers(0, 64)))
        elif kind == 1:
            yield _header(rng) + rng.bytes(int(rng.integers(0, 48)))
        elif kind in (2, 3):
            yield _crafted(rng)
        elif kind == 4:
            a, b = pool[int(rng.integers(len(pool)))], pool[int(rng.integers(len(pool)))]
            yield a[: int(rng.integers(len(a) + 1))] + b[int(rng.integers(len(b) + 1)) :]
        else:
            yield _mutated(rng, pool[int(rng.integers(len(pool)))])


@contextmanager
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def _decode_peak(fn: Decoder, blob: bytes) -> tuple[int, BaseException | None, bool]:
    """One decode: (peak traced bytes, an exception other than WireFormatError, accepted)."""
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    err: BaseException | None = None
    accepted = False
    try:
        fn(blob)
        accepted = True
    except WireFormatError:
        pass
    except BaseException as exc:  # the property under test: nothing else may escape
        err = exc
    return tracemalloc.get_traced_memory()[1] - base, err, accepted


@pytest.mark.slow
def test_decoders_raise_only_wire_format_error_and_stay_small() -> None:
    rng = np.random.default_rng(0xCA7E)
    pool = _pool(rng)
    assert all(len(b) < 4096 for b in pool)
    escaped: list[tuple[str, str, str]] = []
    heavy: list[tuple[str, str, int]] = []
    accepted = 0
    with traced():
        for blob in _inputs(rng, pool):
            for name, fn in (("decode", decode), ("decode_model", decode_model)):
                peak, err, ok = _decode_peak(fn, blob)
                if err is not None:
                    escaped.append((name, blob.hex(), repr(err)))
                if peak > SMALL_INPUT_PEAK:
                    heavy.append((name, blob.hex(), peak))
                accepted += ok
    assert not escaped, escaped[:5]
    assert not heavy, heavy[:5]
    assert accepted > 100  # the mutations also produce some valid messages: the loop is not vacuous


@pytest.mark.parametrize("d", [2**31, 2**32 - 1])
@pytest.mark.parametrize("kind", ["dense", "topk", "signtopk", "snapshot", "delta"])
def test_tiny_message_claiming_huge_d_fails_fast(kind: str, d: int) -> None:
    head = b"\xca\x7e\x01"
    if kind == "snapshot":
        blob = head + b"\x02\x00\x02\x01j" + uvarint(1) + uvarint(d) + bytes(8)
        fn: Decoder = decode_model
    elif kind == "delta":
        blob = (
            head
            + b"\x03\x00\x02\x01j"
            + uvarint(1)
            + uvarint(2)
            + uvarint(d)
            + uvarint(d)
            + b"\x00"
            + bytes(4)
        )
        fn = decode_model
    else:
        comp = {"dense": 0, "topk": 1, "signtopk": 2}[kind]
        blob = (
            head
            + bytes([1, comp, 0])
            + b"\x01j\x01a\x00\x00"
            + uvarint(d)
            + uvarint(d)
            + b"\x00"
            + bytes(4)
        )
        fn = decode
    assert len(blob) <= 32
    with traced():
        peak, err, _ = _decode_peak(fn, blob)
    assert err is None
    assert peak < 64 * 1024, f"{kind}: {peak} bytes traced for a {len(blob)}-byte message"


@pytest.mark.parametrize("ell", [0, 1, 16, 32])
def test_every_index_code_byte_on_a_huge_d_fails_fast(ell: int) -> None:
    d, t = 2**32 - 1, 3
    with traced():
        for b3 in (0, 0x80):
            blob = (
                b"\xca\x7e\x01\x01\x01\x00\x01j\x01a\x00\x00"
                + uvarint(d)
                + uvarint(t)
                + bytes([b3 | ell])
                + bytes(12)
            )
            peak, err, _ = _decode_peak(decode, blob)
            assert err is None and peak < 64 * 1024


@pytest.mark.parametrize(("d", "t"), [(10**6, 20_000), (2**32 - 1, 20_000)])
def test_decode_peak_memory_is_proportionate_to_the_message(d: int, t: int) -> None:
    # A decoder must return int64 indices (8 bytes each), so some amplification is inherent:
    # about 10x for these messages. 64x leaves room (the first reference decoder needed ~140x).
    rng = np.random.default_rng(1)
    idx = np.unique(rng.integers(0, d, t))
    u = Update("signtopk", d, idx, np.ones(idx.size, np.int8), scale=1.0)
    blob = encode(u, job="j", agent="a", round=0, seq=0)
    with traced():
        peak, err, _ = _decode_peak(decode, blob)
    assert err is None
    assert peak <= 64 * len(blob) + 64 * 1024, (
        f"peak {peak} B = {peak / len(blob):.0f}x a {len(blob)}-byte message"
    )
