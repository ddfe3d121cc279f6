"""docs/wire-format.md is the contract: a clean-room decoder written from it alone must agree
with the reference encoder/decoder (edge_agent.protocol.wire), and the doc's examples must not drift.

The decoder below deliberately imports nothing from edge_agent.protocol.wire or edge_agent.protocol.indexcode:
it is plain Python + numpy, following the spec section by section. The tests use the
reference code only as the thing under test (encoder output, decoder output).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# ================================================================ the clean-room decoder

SPEC = Path(__file__).resolve().parents[2] / "docs" / "wire-format.md"

MAGIC = b"\xca\x7e"
COMPRESSORS = {0: "dense", 1: "topk", 2: "signtopk", 3: "randk"}
DTYPES = {0: ("float32", "<f4"), 1: ("float16", "<f2"), 2: ("float64", "<f8")}
SEMANTICS = {
    0: "plain",
    1: "ef",
    2: "ef21",
    3: "dir",
    4: "local",
}  # section 2, flags bits 2-3 and 5
ID_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
MAX_U63 = 2**63 - 1
MAX_D = 2**32 - 1


#: the key of the doc's signed example (section 8.3): bytes 0x00 .. 0x1f
DOC_MAC_KEY = bytes(range(32))


class SpecError(Exception):
    """The message violates docs/wire-format.md."""


@dataclass
class SpecUpdate:
    job: str
    agent: str
    round: int
    seq: int
    compressor: str
    d: int
    t: int
    dtype: str
    semantics: str
    indices: npt.NDArray[np.int64] | None  # None for dense
    values: npt.NDArray[Any]  # wire dtype; signtopk: int8 signs (+1 / -1)
    scale: float | None  # signtopk with T > 0 only
    mac: bytes | None = None  # flags bit 4: the 8 MAC bytes at the end (section 3.3)


@dataclass
class SpecSnapshot:
    job: str
    version: int
    x: npt.NDArray[np.float64]


@dataclass
class SpecDelta:
    job: str
    base_version: int
    version: int
    d: int
    indices: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]


class Cursor:
    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise SpecError(f"truncated at byte {self.pos}: need {n} bytes")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        return self.take(1)[0]

    def uvarint(self, lo: int, hi: int) -> int:  # section 1 + rule 8
        value = 0
        raw = []
        for k in range(10):
            b = self.byte()
            raw.append(b)
            value |= (b & 0x7F) << (7 * k)
            if not b & 0x80:
                break
        else:
            raise SpecError("uvarint longer than 10 bytes")
        if len(raw) > 1 and raw[-1] == 0:
            raise SpecError("uvarint not in shortest form")
        if not lo <= value <= hi:
            raise SpecError(f"uvarint {value} outside [{lo}, {hi}]")
        return value

    def ident(self) -> str:
        n = self.uvarint(1, 64)
        raw = self.take(n)
        if not set(raw) <= ID_CHARS:
            raise SpecError("identifier has a byte outside [A-Za-z0-9._-]")
        return raw.decode("ascii")

    def floats(self, n: int, code: str) -> npt.NDArray[Any]:
        dt = np.dtype(code)
        return np.frombuffer(self.take(n * dt.itemsize), dtype=dt).copy()

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise SpecError("trailing bytes")


def trit_bits(n: int) -> int:
    """TB(n), section 5.1."""
    return 64 * (n // 40) + int(3 ** (n % 40) - 1).bit_length()


def block_bits(d: int, n: int, b: int, ell: int) -> int:
    """B(d, n, b, l), section 5.2."""
    return n * (ell + 1) + (d - 1) // (b << ell) + (trit_bits(n) if b == 3 else 0)


def best_pair(d: int, n: int) -> tuple[int, int, int]:
    """(b, l, B) the encoder must choose: smallest B, ties in the order of section 5.2."""
    cands = [(b, ell) for b in (1, 3) for ell in range(d.bit_length() + 1)]
    b, ell = min(cands, key=lambda bl: (block_bits(d, n, *bl), cands.index(bl)))
    return b, ell, block_bits(d, n, b, ell)


def index_block_bytes(d: int, n: int) -> int:
    """I(d, n), section 5.2."""
    return 0 if n == 0 else 1 + (best_pair(d, n)[2] + 7) // 8


def uvlen(v: int) -> int:
    return max(1, math.ceil(v.bit_length() / 7))


def _word(bits: npt.NDArray[np.uint8]) -> int:
    """An LSB-first bit run as a Python int."""
    return int.from_bytes(np.packbits(bits, bitorder="little").tobytes(), "little")


def read_index_block(cur: Cursor, d: int, n: int) -> npt.NDArray[np.int64]:
    """Section 5.1."""
    code = cur.byte()
    b = 3 if code & 0x80 else 1
    ell = code & 0x7F
    if ell > d.bit_length():
        raise SpecError(f"l={ell} > bit_length(d)={d.bit_length()}")
    m = b << ell
    high = n + (d - 1) // m
    total = high + n * ell + (trit_bits(n) if b == 3 else 0)
    raw = np.frombuffer(cur.take((total + 7) // 8), dtype=np.uint8)
    bits = np.unpackbits(raw, bitorder="little")
    if bits[total:].any():
        raise SpecError("index padding bits not zero")
    ones = np.flatnonzero(bits[:high])
    if ones.size != n:
        raise SpecError(f"high part has {ones.size} ones, expected {n}")
    q = ones.astype(np.int64) - np.arange(n, dtype=np.int64)
    low = np.zeros(n, dtype=np.int64)
    if ell:
        block = bits[high : high + n * ell].reshape(n, ell).astype(np.int64)
        low = block @ (np.int64(1) << np.arange(ell, dtype=np.int64))
    trits = np.zeros(n, dtype=np.int64)
    if b == 3:
        pos = high + n * ell
        out: list[int] = []
        for start in range(0, n, 40):
            k = min(40, n - start)
            width = 64 if k == 40 else (3**k - 1).bit_length()
            w = _word(bits[pos : pos + width]) if width else 0
            pos += width
            if w >= 3**k:
                raise SpecError("trit word out of range")
            for _ in range(k):
                w, digit = divmod(w, 3)
                out.append(digit)
        trits = np.array(out, dtype=np.int64)
    idx = q * m + low + (trits << ell)
    if (n > 1 and not (np.diff(idx) > 0).all()) or idx[-1] >= d:
        raise SpecError("indices not strictly increasing in [0, d)")
    return idx


def _header(cur: Cursor, types: tuple[int, ...]) -> tuple[int, int, int, str]:
    if cur.take(2) != MAGIC:
        raise SpecError("bad magic")
    if cur.byte() != 1:
        raise SpecError("unsupported version")
    kind = cur.byte()
    if kind not in types:
        raise SpecError(f"type {kind} not in {types}")
    comp = cur.byte()
    flags = cur.byte()
    return kind, comp, flags, cur.ident()


def _sem_code(flags: int) -> int:
    """Section 3.2: bits 2-3 hold the semantics code's low two bits, bit 5 its third."""
    return ((flags >> 2) & 3) | (4 if flags & 0x20 else 0)


def spec_decode(buf: bytes) -> SpecUpdate:
    """Decode an update message (section 3); raise SpecError on any rule of section 7."""
    cur = Cursor(buf)
    _, comp, flags, job = _header(cur, (1,))
    if comp not in COMPRESSORS:
        raise SpecError("unknown compressor")
    if flags & 0xC0 or (flags & 3) not in DTYPES or _sem_code(flags) not in SEMANTICS:
        raise SpecError(f"bad flags {flags:#04x}")
    mac: bytes | None = None
    if flags & 0x10:  # section 3.3: the last 8 bytes are the MAC, the body ends before them
        if len(buf) < cur.pos + 8:
            raise SpecError("truncated MAC")
        mac = buf[-8:]
        cur.buf = buf[:-8]
    dtype, code = DTYPES[flags & 3]
    agent = cur.ident()
    rnd = cur.uvarint(0, MAX_U63)
    seq = cur.uvarint(0, MAX_U63)
    d = cur.uvarint(1, MAX_D)
    t = cur.uvarint(0, d)
    name = COMPRESSORS[comp]
    indices: npt.NDArray[np.int64] | None = None
    scale: float | None = None
    if name == "dense":
        if t != d:
            raise SpecError("dense with T != d")
        values = cur.floats(d, code)
    elif t == 0:
        indices = np.zeros(0, dtype=np.int64)
        values = np.zeros(0, dtype=np.int8 if name == "signtopk" else code)
    else:
        indices = read_index_block(cur, d, t)
        if name == "signtopk":
            scale = float(cur.floats(1, code)[0])
            if not (math.isfinite(scale) and scale >= 0):
                raise SpecError("bad scale")
            bits = np.unpackbits(np.frombuffer(cur.take((t + 7) // 8), np.uint8), bitorder="little")
            if bits[t:].any():
                raise SpecError("sign padding not zero")
            values = np.where(bits[:t] == 1, -1, 1).astype(np.int8)
        else:
            values = cur.floats(t, code)
    cur.end()
    if name != "signtopk" and not np.isfinite(values).all():
        raise SpecError("non-finite value")
    sem = SEMANTICS[_sem_code(flags)]
    return SpecUpdate(job, agent, rnd, seq, name, d, t, dtype, sem, indices, values, scale, mac)


def spec_mac_valid(key: bytes, buf: bytes) -> bool:
    """Section 3.3: HMAC-SHA256 under ``key`` of every byte before the MAC, first 8 bytes."""
    expected = hmac.new(key, buf[:-8], hashlib.sha256).digest()[:8]
    return spec_decode(buf).mac is not None and hmac.compare_digest(expected, buf[-8:])


def spec_decode_model(buf: bytes) -> SpecSnapshot | SpecDelta:
    """Decode a snapshot or a delta (section 4)."""
    cur = Cursor(buf)
    kind, comp, flags, job = _header(cur, (2, 3))
    if comp != 0 or flags != 0x02:
        raise SpecError("model message: compressor must be 0 and flags 0x02")
    if kind == 2:
        version = cur.uvarint(0, MAX_U63)
        d = cur.uvarint(1, MAX_D)
        x = cur.floats(d, "<f8")
        cur.end()
        if not np.isfinite(x).all():
            raise SpecError("non-finite model value")
        return SpecSnapshot(job, version, x)
    base = cur.uvarint(0, MAX_U63)
    version = cur.uvarint(0, MAX_U63)
    if version <= base:
        raise SpecError("version <= base_version")
    d = cur.uvarint(1, MAX_D)
    n = cur.uvarint(0, d)
    idx = read_index_block(cur, d, n) if n else np.zeros(0, dtype=np.int64)
    vals = cur.floats(n, "<f8")
    cur.end()
    if not np.isfinite(vals).all():
        raise SpecError("non-finite delta value")
    return SpecDelta(job, base, version, d, idx, vals)


def spec_update_size(
    compressor: str, *, d: int, t: int, job: str, agent: str, round: int, seq: int, w: int
) -> int:
    """Section 6."""
    header = 6 + 1 + len(job) + 1 + len(agent) + uvlen(round) + uvlen(seq) + uvlen(d) + uvlen(t)
    if compressor == "dense":
        return header + d * w
    if t == 0:
        return header
    if compressor == "signtopk":
        return header + index_block_bytes(d, t) + w + (t + 7) // 8
    return header + index_block_bytes(d, t) + t * w


# ================================================================ the reference, under test

from edge_agent.errors import WireFormatError  # noqa: E402
from edge_agent.numerics.compressors import Update, ValueDtype  # noqa: E402
from edge_agent.protocol.wire import (  # noqa: E402
    Delta,
    Snapshot,
    decode,
    decode_model,
    encode,
    encode_delta,
    encode_snapshot,
    encoded_size,
)

VALUE_DTYPE_NAMES: tuple[ValueDtype, ...] = ("float32", "float16", "float64")
WIDTH = {"float32": 4, "float16": 2, "float64": 8}
CODE = {"float32": "<f4", "float16": "<f2", "float64": "<f8"}


def same_bits(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_same_as_reference(spec: SpecUpdate, blob: bytes) -> None:
    header, u = decode(blob)
    assert (spec.job, spec.agent, spec.round, spec.seq) == (
        header.job,
        header.agent,
        header.round,
        header.seq,
    )
    assert (spec.compressor, spec.d, spec.t, spec.dtype, spec.semantics) == (
        header.compressor,
        header.d,
        header.t,
        header.value_dtype,
        header.semantics,
    )
    assert (u.compressor, u.d, u.t, u.semantics) == (
        spec.compressor,
        spec.d,
        spec.t,
        spec.semantics,
    )
    if spec.indices is None:
        assert u.indices is None
    else:
        assert u.indices is not None and np.array_equal(u.indices, spec.indices)
    assert np.array_equal(np.asarray(u.values), spec.values)
    if spec.compressor != "signtopk":
        assert same_bits(np.asarray(u.values), spec.values)
    elif spec.t > 0:
        assert u.scale is not None and spec.scale is not None
        assert np.float64(u.scale).tobytes() == np.float64(spec.scale).tobytes()


# ---------------------------------------------------------------- strategies

ident = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-",
    min_size=1,
    max_size=64,
)
u63 = st.one_of(
    st.integers(0, 300), st.integers(0, MAX_U63), st.sampled_from([127, 128, 2**14, MAX_U63])
)
dims = st.one_of(
    st.integers(1, 64),
    st.integers(1, 2000),
    st.integers(1, 10**5),
    st.sampled_from([1, 2, 20, 41, 47236]),
)


def sample_indices(rng: np.random.Generator, d: int, t: int) -> npt.NDArray[np.int64]:
    if t > d // 2:  # cheaper and covers dense-ish sets: drop d - t
        keep = np.ones(d, dtype=bool)
        keep[rng.choice(d, d - t, replace=False)] = False
        return np.flatnonzero(keep).astype(np.int64)
    return np.sort(rng.choice(d, t, replace=False)).astype(np.int64)


def sample_values(rng: np.random.Generator, n: int, code: str) -> npt.NDArray[Any]:
    dt = np.dtype(code)
    fin = np.finfo(dt)
    vals = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3)).astype(dt)
    special = np.array(
        [0.0, -0.0, fin.max, -fin.max, fin.tiny, fin.smallest_subnormal, 1.0], dtype=dt
    )
    if n:
        k = int(rng.integers(0, min(n, 8) + 1))
        vals[rng.integers(0, n, k)] = special[rng.integers(0, special.size, k)]
    return vals


@st.composite
def updates(draw: st.DrawFn) -> tuple[Update, dict[str, Any]]:
    compressor = draw(st.sampled_from(["dense", "topk", "signtopk", "randk"]))
    d = draw(dims)
    if compressor == "dense":
        d = min(d, 20_000)
    t = (
        d
        if compressor == "dense"
        else draw(st.one_of(st.integers(0, d), st.integers(0, min(d, 50)), st.just(d)))
    )
    dtype = draw(st.sampled_from(["float32", "float16", "float64"]))
    semantics = draw(st.sampled_from(["plain", "ef", "ef21", "dir", "local"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    idx = None if compressor == "dense" else sample_indices(rng, d, t)
    scale = None
    if compressor == "signtopk":
        values = rng.choice(np.array([-1, 1], dtype=np.int8), t)
        scale = float(abs(sample_values(rng, 1, CODE[dtype])[0])) if t else 0.0
    else:
        values = sample_values(rng, t, CODE[dtype])
    u = Update(compressor, d, idx, values, scale=scale, semantics=semantics)  # type: ignore[arg-type]
    meta = {
        "job": draw(ident),
        "agent": draw(ident),
        "round": draw(u63),
        "seq": draw(u63),
        "value_dtype": dtype,
    }
    return u, meta


FAST = settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- updates


@FAST
@given(updates())
def test_spec_decoder_reads_what_the_reference_encoder_writes(
    case: tuple[Update, dict[str, Any]],
) -> None:
    u, meta = case
    blob = encode(u, **meta)
    got = spec_decode(blob)
    assert (got.job, got.agent, got.round, got.seq) == (
        meta["job"],
        meta["agent"],
        meta["round"],
        meta["seq"],
    )
    assert (got.compressor, got.d, got.t, got.dtype, got.semantics) == (
        u.compressor,
        u.d,
        u.t,
        meta["value_dtype"],
        u.semantics,
    )
    if u.indices is None:
        assert got.indices is None
    else:
        assert got.indices is not None and np.array_equal(got.indices, u.indices)
    if u.compressor == "signtopk":
        assert np.array_equal(got.values, u.values)
        if u.t:
            assert got.scale == float(np.asarray(u.scale, dtype=CODE[meta["value_dtype"]]))
    else:
        assert same_bits(got.values, np.asarray(u.values))
    assert_same_as_reference(got, blob)


@FAST
@given(updates())
def test_size_formula_matches_encoder_and_encoded_size(case: tuple[Update, dict[str, Any]]) -> None:
    u, meta = case
    blob = encode(u, **meta)
    w = WIDTH[meta["value_dtype"]]
    expected = spec_update_size(
        u.compressor,
        d=u.d,
        t=u.t,
        job=meta["job"],
        agent=meta["agent"],
        round=meta["round"],
        seq=meta["seq"],
        w=w,
    )
    assert len(blob) == expected
    assert encoded_size(u.compressor, d=u.d, t=u.t, **meta) == expected


@FAST
@given(updates())
def test_encoder_chooses_the_cheapest_index_code_with_the_spec_tie_break(
    case: tuple[Update, dict[str, Any]],
) -> None:
    u, meta = case
    if u.compressor == "dense" or u.t == 0:
        return
    blob = encode(u, **meta)
    header = (
        6
        + 1
        + len(meta["job"])
        + 1
        + len(meta["agent"])
        + uvlen(meta["round"])
        + uvlen(meta["seq"])
        + uvlen(u.d)
        + uvlen(u.t)
    )
    code = blob[header]
    b, ell, _ = best_pair(u.d, u.t)
    assert code == (0x80 if b == 3 else 0) | ell


@pytest.mark.parametrize("compressor", ["topk", "signtopk", "randk"])
@pytest.mark.parametrize("t", [39_999, 6_250, 50_000, 100_000])
def test_large_updates_agree(compressor: str, t: int) -> None:
    # hypothesis favours small d and T; make sure the big end (d = 10^5) is always covered.
    d = 100_000
    rng = np.random.default_rng(t)
    idx = sample_indices(rng, d, t)
    if compressor == "signtopk":
        u = Update(compressor, d, idx, rng.choice(np.array([-1, 1], np.int8), t), scale=0.75)
    else:
        u = Update(compressor, d, idx, sample_values(rng, t, "<f2"), semantics="ef")
    blob = encode(u, job="big", agent="a", round=2**40, seq=3, value_dtype="float16")
    got = spec_decode(blob)
    assert got.indices is not None and np.array_equal(got.indices, idx)
    assert len(blob) == spec_update_size(
        compressor, d=d, t=t, job="big", agent="a", round=2**40, seq=3, w=2
    )
    assert_same_as_reference(got, blob)


def spec_index_bytes_all(d: int, n: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """I(d, n) for many n at once: the minimum over *every* (b, l) of section 5.2."""
    tb = np.array([(3**k - 1).bit_length() for k in range(40)], dtype=np.int64)
    trits = 64 * (n // 40) + tb[n % 40]
    best = np.full(n.shape, np.iinfo(np.int64).max)
    for b in (1, 3):
        for ell in range(d.bit_length() + 1):
            bits = n * (ell + 1) + (d - 1) // (b << ell) + (trits if b == 3 else 0)
            best = np.minimum(best, bits)
    return np.where(n == 0, 0, 1 + (best + 7) // 8)


@pytest.mark.parametrize(
    "d", [*range(1, 130), 255, 256, 1000, 4097, 47236, 10**6, 2**31 + 7, 2**32 - 1]
)
def test_priced_index_block_is_the_minimum_over_every_code(d: int) -> None:
    # the encoder may search fewer (b, l) than the spec's full range; the size must not differ
    n = np.unique(
        np.concatenate([np.arange(min(d, 3000) + 1), np.geomspace(1, d, 400).astype(np.int64)])
    )
    kw: dict[str, Any] = {"job": "j", "agent": "a", "round": 0, "seq": 0}
    header = 6 + 2 + 2 + 1 + 1 + uvlen(d) + np.array([uvlen(int(t)) for t in n])
    got = np.asarray(encoded_size("topk", d=d, t=n, **kw)) - header - 4 * n
    assert got.tolist() == spec_index_bytes_all(d, n).tolist()


def test_encoded_size_is_vectorised_over_t() -> None:
    d = 47236
    ts = np.array([0, 1, 39, 40, 41, 127, 128, 1000, d // 16, d], dtype=np.int64)
    kw: dict[str, Any] = {"job": "demo", "agent": "pi-01", "round": 7, "seq": 0}
    for compressor in ("topk", "signtopk", "randk"):
        got = encoded_size(compressor, d=d, t=ts, **kw)
        want = [spec_update_size(compressor, d=d, t=int(t), w=4, **kw) for t in ts]
        assert np.asarray(got).tolist() == want


# ---------------------------------------------------------------- model messages


@FAST
@given(job=ident, version=u63, d=dims, seed=st.integers(0, 2**32 - 1))
def test_snapshot_round_trip(job: str, version: int, d: int, seed: int) -> None:
    x = sample_values(np.random.default_rng(seed), d, "<f8")
    blob = encode_snapshot(x, job=job, version=version)
    got = spec_decode_model(blob)
    assert isinstance(got, SpecSnapshot)
    assert (got.job, got.version) == (job, version)
    assert same_bits(got.x, x)
    assert len(blob) == 6 + 1 + len(job) + uvlen(version) + uvlen(d) + 8 * d
    ref = decode_model(blob)
    assert isinstance(ref, Snapshot) and same_bits(ref.x, got.x) and ref.version == version


@FAST
@given(
    job=ident, base=st.integers(0, MAX_U63 - 1), step=st.integers(1, 2**40), d=dims, data=st.data()
)
def test_delta_round_trip_sets_values_bit_identically(
    job: str, base: int, step: int, d: int, data: st.DataObject
) -> None:
    version = min(base + step, MAX_U63)
    n = data.draw(st.one_of(st.integers(0, d), st.integers(0, min(d, 50))))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    idx = sample_indices(rng, d, n)
    vals = sample_values(rng, n, "<f8")
    blob = encode_delta(idx, vals, job=job, base_version=base, version=version, d=d)
    got = spec_decode_model(blob)
    assert isinstance(got, SpecDelta)
    assert (got.job, got.base_version, got.version, got.d) == (job, base, version, d)
    assert np.array_equal(got.indices, idx) and same_bits(got.values, vals)
    size = (
        6
        + 1
        + len(job)
        + uvlen(base)
        + uvlen(version)
        + uvlen(d)
        + uvlen(n)
        + index_block_bytes(d, n)
        + 8 * n
    )
    assert len(blob) == size
    ref = decode_model(blob)
    assert isinstance(ref, Delta)
    assert np.array_equal(ref.indices, got.indices) and same_bits(ref.values, got.values)
    model = rng.standard_normal(d)
    mine, theirs = model.copy(), model.copy()
    mine[got.indices] = got.values  # section 4.2: SET, not add
    ref.apply(theirs)
    assert mine.tobytes() == theirs.tobytes()


@pytest.mark.security
@FAST
@given(updates())
def test_spec_decoder_reads_signed_updates(case: tuple[Update, dict[str, Any]]) -> None:
    """Section 3.3 alone: a signed message is the unsigned one with flags bit 4 set and
    HMAC-SHA256(key, everything before)[:8] appended; the body decodes the same."""
    u, meta = case
    plain = encode(u, **meta)
    signed = encode(u, **meta, mac_key=DOC_MAC_KEY)
    assert len(signed) == len(plain) + 8
    assert signed[:5] == plain[:5] and signed[5] == plain[5] | 0x10
    assert signed[6:-8] == plain[6:]
    assert spec_mac_valid(DOC_MAC_KEY, signed)
    got, ref = spec_decode(signed), spec_decode(plain)
    assert got.mac == signed[-8:] and ref.mac is None
    assert (got.job, got.agent, got.round, got.seq, got.t) == (
        ref.job,
        ref.agent,
        ref.round,
        ref.seq,
        ref.t,
    )
    assert same_bits(got.values, ref.values)
    assert_same_as_reference(got, signed)
    assert decode(signed)[0].mac and not decode(plain)[0].mac
    # section 6: a signed update costs 8 bytes more, and encoded_size(mac=True) says so
    assert (
        len(plain) + 8 == len(signed) == encoded_size(u.compressor, d=u.d, t=u.t, mac=True, **meta)
    )


# ---------------------------------------------------------------- accept/reject agreement


def _pool(rng: np.random.Generator) -> list[bytes]:
    out = []
    for compressor in ("dense", "topk", "signtopk", "randk"):
        for d in (1, 2, 20, 41, 300, 5000):
            for t in {0, 1, min(d, 3), min(d, 40), min(d, 41), d}:
                if compressor == "dense":
                    t = d
                dtype = VALUE_DTYPE_NAMES[int(rng.integers(3))]
                idx = None if compressor == "dense" else sample_indices(rng, d, t)
                if compressor == "signtopk":
                    u = Update(
                        compressor, d, idx, rng.choice(np.array([-1, 1], np.int8), t), scale=0.5
                    )
                else:
                    u = Update(
                        compressor, d, idx, sample_values(rng, t, CODE[dtype]), semantics="ef21"
                    )
                out.append(
                    encode(
                        u,
                        job="j",
                        agent="a.b-c_9",
                        round=int(rng.integers(0, 300)),
                        seq=1,
                        value_dtype=dtype,
                        mac_key=DOC_MAC_KEY if rng.random() < 0.3 else None,
                    )
                )
        for d in (1, 41, 5000):
            out.append(encode_snapshot(rng.standard_normal(d), job="j", version=5))
            for n in (0, 1, min(d, 5), min(d, 45)):
                idx = sample_indices(rng, d, n)
                out.append(
                    encode_delta(
                        idx, rng.standard_normal(n), job="j", base_version=4, version=5, d=d
                    )
                )
    return out


def _mutate(rng: np.random.Generator, blob: bytes) -> bytes:
    buf = bytearray(blob)
    op = int(rng.integers(5))
    pos = int(rng.integers(0, len(buf) + 1))
    if op == 0 and buf:  # flip one bit, mostly in the first 40 bytes (headers, index blocks)
        p = (
            min(pos, len(buf) - 1)
            if rng.random() < 0.5
            else int(rng.integers(0, min(40, len(buf))))
        )
        buf[p] ^= 1 << int(rng.integers(8))
    elif op == 1 and buf:
        buf[min(pos, len(buf) - 1)] = int(rng.integers(256))
    elif op == 2:
        buf[pos:pos] = bytes([int(rng.integers(256))])
    elif op == 3 and buf:
        del buf[min(pos, len(buf) - 1)]
    else:
        del buf[pos:]
    return bytes(buf)


def _outcome_update(blob: bytes) -> tuple[str, Any]:
    try:
        got = spec_decode(blob)
    except SpecError:
        spec = "reject"
    else:
        spec = "accept"
    try:
        decode(blob)
    except WireFormatError:
        ref = "reject"
    else:
        ref = "accept"
        if spec == "accept":
            assert_same_as_reference(got, blob)
    return spec, ref


def _outcome_model(blob: bytes) -> tuple[str, str]:
    try:
        got = spec_decode_model(blob)
        spec = "accept"
    except SpecError:
        spec = "reject"
    try:
        ref = decode_model(blob)
        outcome = "accept"
    except WireFormatError:
        outcome = "reject"
    if spec == outcome == "accept":
        if isinstance(got, SpecSnapshot):
            assert isinstance(ref, Snapshot) and same_bits(ref.x, got.x)
        else:
            assert isinstance(ref, Delta) and np.array_equal(ref.indices, got.indices)
            assert same_bits(ref.values, got.values) and (ref.base_version, ref.version) == (
                got.base_version,
                got.version,
            )
    return spec, outcome


def test_spec_and_reference_accept_and_reject_the_same_mutated_messages() -> None:
    rng = np.random.default_rng(20240611)
    pool = _pool(rng)
    disagreements = []
    for _ in range(6000):
        original = pool[int(rng.integers(len(pool)))]
        blob = _mutate(rng, original)
        for _ in range(int(rng.integers(0, 3))):
            blob = _mutate(rng, blob)
        model = len(blob) > 3 and blob[3] in (2, 3)
        spec, ref = _outcome_model(blob) if model else _outcome_update(blob)
        if spec != ref:
            disagreements.append((blob.hex(), spec, ref))
    assert not disagreements, disagreements[:5]


# ---------------------------------------------------------------- individual rules (section 7)


def _topk_blob(**kw: Any) -> bytes:
    u = Update("topk", 20, np.array([2, 9, 17]), np.array([0.5, -1.25, 2.0], dtype="<f4"))
    return encode(u, job="demo", agent="pi-01", round=7, seq=0, **kw)


def _patched(blob: bytes, offset: int, new: bytes, old_len: int = 1) -> bytes:
    return blob[:offset] + new + blob[offset + old_len :]


# offsets in the doc's topk example: 4 compressor, 5 flags, 17 round, 19 d, 20 T, 21 code byte
BAD_UPDATES = {
    "bad magic": _patched(_topk_blob(), 0, b"\xca\x7f", 2),
    "unknown version": _patched(_topk_blob(), 2, b"\x02"),
    "wrong type": _patched(_topk_blob(), 3, b"\x02"),
    "unknown compressor": _patched(_topk_blob(), 4, b"\x04"),
    "dtype code 3": _patched(_topk_blob(), 5, b"\x03"),
    "reserved flag bit": _patched(_topk_blob(), 5, b"\x40"),
    "semantics code 5": _patched(_topk_blob(), 5, b"\x24"),
    "reserved flag bit 7": _patched(_topk_blob(), 5, b"\x80"),
    "MAC bit, no MAC": _patched(_topk_blob(), 5, b"\x10"),
    "empty job": _patched(_topk_blob(), 6, b"\x00", 5),
    "job with a slash": _patched(_topk_blob(), 7, b"d/mo", 4),
    "65-byte agent": _patched(_topk_blob(), 11, b"\x41" + b"a" * 65, 6),
    "round 2^63": _patched(_topk_blob(), 17, b"\x80" * 9 + b"\x01"),
    "11-byte varint": _patched(_topk_blob(), 17, b"\x80" * 10 + b"\x00"),
    "d = 0": _patched(_topk_blob(), 19, b"\x00"),
    "d = 2^32": _patched(_topk_blob(), 19, b"\x80\x80\x80\x80\x10"),
    "T > d": _patched(_topk_blob(), 20, b"\x15"),
    "l > bit_length(d)": _patched(_topk_blob(), 21, b"\x06"),
    "wrong number of ones": _patched(_topk_blob(), 22, b"\x4b"),
    "index padding": _patched(_topk_blob(), 23, b"\x8b"),
    # l = 3 with indices 2, 9, 23: well-formed except that 23 >= d = 20
    "index >= d": _patched(_topk_blob(), 21, b"\x03\x55\x39", 3),
    # ones at 0, 1, 2 give buckets 0, 0, 0 and remainders 2, 1, 1: not increasing
    "indices not increasing": _patched(_topk_blob(), 22, b"\x07"),
    "nan value": _patched(_topk_blob(), 32, b"\x00\x00\xc0\x7f", 4),
    "inf value": _patched(_topk_blob(), 32, b"\x00\x00\x80\x7f", 4),
    "trailing byte": _topk_blob() + b"\x00",
    "truncated": _topk_blob()[:-1],
    "dense with T != d": encode(
        Update("dense", 3, None, np.zeros(3, "<f4")), job="j", agent="a", round=0, seq=0
    )[:-13]
    + b"\x02"
    + bytes(8),
    "negative scale": encode(
        Update("signtopk", 20, np.array([2]), np.array([1], np.int8), scale=1.0),
        job="j",
        agent="a",
        round=0,
        seq=0,
    )[:-5]
    + np.array([-1.0], "<f4").tobytes()
    + b"\x00",
    "sign padding": encode(
        Update("signtopk", 20, np.array([2]), np.array([1], np.int8), scale=1.0),
        job="j",
        agent="a",
        round=0,
        seq=0,
    )[:-1]
    + b"\x02",
}


@pytest.mark.parametrize("name", sorted(BAD_UPDATES))
def test_both_decoders_reject(name: str) -> None:
    blob = BAD_UPDATES[name]
    model = blob[3] in (2, 3)
    with pytest.raises(SpecError):
        (spec_decode_model if model else spec_decode)(blob)
    with pytest.raises(WireFormatError):
        (decode_model if model else decode)(blob)


def test_trit_word_out_of_range_is_rejected() -> None:
    # d = 21, n = 5: the encoder picks b = 3, l = 0 (section 8 mentions the pair); a last
    # word of 5 trits must be < 3^5 = 243 but has 8 bits of room.
    good = encode_delta([0, 1, 2, 3, 4], np.zeros(5), job="j", base_version=0, version=1, d=21)
    block = 6 + 2 + 1 + 1 + 1 + 1  # header, job, base, version, d, n
    assert good[block] == 0x80
    bits = np.unpackbits(np.frombuffer(good[block + 1 : block + 4], np.uint8), bitorder="little")
    bits[11:19] = np.unpackbits(np.array([250], np.uint8), bitorder="little")  # H = 11; 250 >= 243
    bad = good[: block + 1] + np.packbits(bits, bitorder="little").tobytes() + good[block + 4 :]
    with pytest.raises(SpecError, match="trit"):
        spec_decode_model(bad)
    with pytest.raises(WireFormatError, match="trit"):
        decode_model(bad)


def test_delta_version_must_exceed_base() -> None:
    good = encode_delta([1], [1.0], job="j", base_version=4, version=5, d=3)
    bad = _patched(good, 9, b"\x04")  # version := base
    with pytest.raises(SpecError):
        spec_decode_model(bad)
    with pytest.raises(WireFormatError):
        decode_model(bad)


def test_model_messages_need_flags_0x02() -> None:
    bad = _patched(encode_snapshot([1.0], job="j", version=0), 5, b"\x06")
    with pytest.raises(SpecError):
        spec_decode_model(bad)
    with pytest.raises(WireFormatError):
        decode_model(bad)


@pytest.mark.parametrize("field", ["round", "d"])
def test_both_decoders_reject_non_shortest_uvarints(field: str) -> None:
    offset = {"round": 17, "d": 19}[field]
    blob = _topk_blob()
    overlong = _patched(blob, offset, bytes([blob[offset] | 0x80, 0x00]))
    with pytest.raises(SpecError, match="shortest"):
        spec_decode(overlong)
    with pytest.raises(WireFormatError):
        decode(overlong)


# ---------------------------------------------------------------- the doc cannot drift


def _doc() -> str:
    return SPEC.read_text(encoding="utf-8")


def _hex_blocks() -> dict[str, bytes]:
    return {
        m[1]: bytes.fromhex(m[2]) for m in re.finditer(r"```hex ([\w-]+)\n(.*?)```", _doc(), re.S)
    }


def test_doc_hex_examples_are_what_the_encoder_emits() -> None:
    blocks = _hex_blocks()
    assert set(blocks) == {
        "topk-update",
        "signtopk-update",
        "signed-topk-update",
        "delta",
        "snapshot",
    }
    topk = Update("topk", 20, np.array([2, 9, 17]), np.array([0.5, -1.25, 2.0], dtype="<f4"))
    sign = Update("signtopk", 20, np.array([2, 9, 17]), np.array([1, -1, 1], np.int8), scale=1.25)
    assert blocks["topk-update"] == encode(topk, job="demo", agent="pi-01", round=7, seq=0)
    assert blocks["signtopk-update"] == encode(sign, job="demo", agent="pi-01", round=7, seq=1)
    signed = encode(topk, job="demo", agent="pi-01", round=7, seq=0, mac_key=DOC_MAC_KEY)
    assert blocks["signed-topk-update"] == signed
    assert blocks["delta"] == encode_delta(
        [3, 10, 11, 25, 40],
        [0.5, -2.0, 0.125, 1.0, -0.75],
        job="demo",
        base_version=7,
        version=8,
        d=41,
    )
    assert blocks["snapshot"] == encode_snapshot([0.0, 1.5, -2.25], job="demo", version=8)


def test_doc_hex_examples_decode_by_the_spec() -> None:
    blocks = _hex_blocks()
    u = spec_decode(blocks["topk-update"])
    assert (u.job, u.agent, u.round, u.seq, u.d, u.t) == ("demo", "pi-01", 7, 0, 20, 3)
    assert u.indices is not None and u.indices.tolist() == [2, 9, 17]
    assert u.values.tolist() == [0.5, -1.25, 2.0]
    s = spec_decode(blocks["signtopk-update"])
    assert s.values.tolist() == [1, -1, 1] and s.scale == 1.25
    m = spec_decode(blocks["signed-topk-update"])
    assert m.mac is not None and u.mac is None
    assert (m.indices is not None) and m.indices.tolist() == [2, 9, 17]
    assert m.values.tolist() == u.values.tolist()
    assert spec_mac_valid(DOC_MAC_KEY, blocks["signed-topk-update"])
    assert not spec_mac_valid(bytes(32), blocks["signed-topk-update"])
    delta = spec_decode_model(blocks["delta"])
    assert isinstance(delta, SpecDelta)
    assert delta.indices.tolist() == [3, 10, 11, 25, 40]
    assert best_pair(41, 5) == (3, 1, 24) and best_pair(20, 3) == (1, 2, 13)


def test_doc_size_table_matches_the_encoder() -> None:
    doc = _doc()
    start = doc.index("<!-- size-table:")
    rows = re.findall(r"^\| (\d+) \| \((\d), (\d+)\) \|(.*)$", doc[start:], re.M)
    assert [int(r[0]) for r in rows] == [1, 10, 100, 1000]
    d = 47236
    kw: dict[str, Any] = {"job": "demo", "agent": "pi-01", "round": 7, "seq": 0}
    rng = np.random.default_rng(0)
    for t_s, b_s, l_s, rest in rows:
        t = int(t_s)
        cells = [c.strip() for c in rest.strip().strip("|").split("|")]
        bits, block, bound, ratio, int32, topk, topk16, sign, naive, vs_naive = cells
        b, ell, body = best_pair(d, t)
        bound_bits = (math.lgamma(d + 1) - math.lgamma(t + 1) - math.lgamma(d - t + 1)) / math.log(
            2
        )
        topk_size = encoded_size("topk", d=d, t=t, **kw)
        naive_size = topk_size - index_block_bytes(d, t) + 4 * t
        idx = sample_indices(rng, d, t)
        real = encode(Update("topk", d, idx, np.ones(t, "<f4")), **kw)
        assert (int(b_s), int(l_s), int(bits), int(block)) == (
            b,
            ell,
            body,
            index_block_bytes(d, t),
        )
        assert (int(bound), ratio) == (math.ceil(bound_bits), f"{body / bound_bits:.2f}")
        assert int(int32) == 4 * t
        assert int(topk) == topk_size == len(real)
        assert int(topk16) == encoded_size("topk", d=d, t=t, value_dtype="float16", **kw)
        assert int(sign) == encoded_size("signtopk", d=d, t=t, **kw)
        assert (int(naive), vs_naive) == (naive_size, f"{topk_size / naive_size:.2f}")
