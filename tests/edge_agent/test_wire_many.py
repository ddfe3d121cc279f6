"""wire.decode_many against wire.decode, element by element.

decode_many must return, for every message of a batch, exactly what decode returns (the
same header, indices, values, scale) or the WireFormatError decode raises (the same
reason). Every test here compares with decode itself, never with decode_many's own output.
Messages are generated with a seeded numpy Generator; index blocks with an arbitrary (b, l)
come from a small encoder written from docs/wire-format.md section 5, independent of
edge_agent.protocol.indexcode, so that non-optimal codes and crafted invalid blocks are covered.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Sequence
from typing import cast

import numpy as np
import pytest
from helpers import uvarint

from edge_agent.errors import WireFormatError
from edge_agent.numerics.compressors import Update
from edge_agent.protocol import wire, wire_many
from edge_agent.protocol.indexcode import best_code
from edge_agent.protocol.wire import decode, encode
from edge_agent.protocol.wire_many import decode_many

DTYPES = {"float32": "<f4", "float16": "<f2", "float64": "<f8"}
DTYPE_CODES = {"float32": 0, "float16": 1, "float64": 2}
COMPRESSOR_IDS = {"dense": 0, "topk": 1, "signtopk": 2, "randk": 3}
SEMANTICS = ("plain", "ef", "ef21", "dir", "local")
NAMES = ["pi-01", "pi-02", "node.7", "a", "x" * 64, "edge_12", "Z-9.z"]
ROUNDS = [0, 1, 127, 128, 1000, 2**14, 2**35, 2**63 - 1]


# ---------------------------------------------------------------- helpers


def ident(s: str) -> bytes:
    return uvarint(len(s)) + s.encode("ascii")


def bit_length_trits(k: int) -> int:
    return (int(3**k) - 1).bit_length()  # int ** int is typed Any (negative k gives float)


def index_block(
    indices: Sequence[int], d: int, b: int, ell: int, *, trit_words: dict[int, int] | None = None
) -> bytes:
    """Spec section 5.1, bit by bit, for any (b, l). ``indices`` need not be valid (sorted,
    distinct, < d) as long as every q_j + j falls inside the high part; ``trit_words``
    overrides trit word values (to write out-of-range ones)."""
    n = len(indices)
    m = b << ell
    high = [0] * (n + (d - 1) // m)
    for j, i in enumerate(indices):
        high[i // m + j] = 1
    bits = list(high)
    for i in indices:
        r = (i % m) & ((1 << ell) - 1)
        bits += [(r >> k) & 1 for k in range(ell)]
    if b == 3:
        trits = [(i % m) >> ell for i in indices]
        for w, start in enumerate(range(0, n, 40)):
            group = trits[start : start + 40]
            value = sum(t * 3**e for e, t in enumerate(group))
            if trit_words and w in trit_words:
                value = trit_words[w]
            width = 64 if len(group) == 40 else bit_length_trits(len(group))
            bits += [(value >> k) & 1 for k in range(width)]
    bits += [0] * (-len(bits) % 8)
    body = bytes(sum(bits[8 * i + k] << k for k in range(8)) for i in range(len(bits) // 8))
    return bytes([(0x80 if b == 3 else 0) | ell]) + body


def message(
    compressor: str,
    d: int,
    t: int,
    body: bytes,
    *,
    dtype: str = "float32",
    semantics: str = "plain",
    job: str = "job-1",
    agent: str = "pi-01",
    round: int = 7,
    seq: int = 0,
) -> bytes:
    flags = DTYPE_CODES[dtype] | (SEMANTICS.index(semantics) << 2)
    return b"".join(
        [
            b"\xca\x7e\x01\x01",
            bytes([COMPRESSOR_IDS[compressor], flags]),
            ident(job),
            ident(agent),
            uvarint(round),
            uvarint(seq),
            uvarint(d),
            uvarint(t),
            body,
        ]
    )


def values_bytes(rng: np.random.Generator, compressor: str, t: int, dtype: str) -> bytes:
    if compressor == "signtopk":
        scale = np.array([abs(rng.standard_normal())], dtype=DTYPES[dtype]).tobytes()
        signs = rng.integers(0, 2, t).astype(np.uint8)
        return scale + np.packbits(signs, bitorder="little").tobytes()
    return rng.standard_normal(t).astype(DTYPES[dtype]).tobytes()


def random_code(rng: np.random.Generator, d: int) -> tuple[int, int]:
    b = int(rng.choice([1, 3]))
    return b, int(rng.integers(0, max(1, d.bit_length()) + 1))


def crafted(
    rng: np.random.Generator,
    compressor: str,
    d: int,
    t: int,
    code: tuple[int, int] | None = None,
    dtype: str = "float32",
    **fields: object,
) -> bytes:
    """A valid sparse update of t >= 1 entries sent with index code ``code`` (b, l)."""
    b, ell = code if code is not None else random_code(rng, d)
    idx = sorted(rng.choice(d, t, replace=False).tolist())
    body = index_block(idx, d, b, ell) + values_bytes(rng, compressor, t, dtype)
    return message(compressor, d, t, body, dtype=dtype, **fields)  # type: ignore[arg-type]


def random_update(rng: np.random.Generator, d: int, t: int) -> bytes:
    """A valid update from the reference encoder (its own choice of index code)."""
    compressor = str(rng.choice(["dense", "topk", "signtopk", "randk"]))
    dtype = str(rng.choice(list(DTYPES)))
    semantics = str(rng.choice(SEMANTICS))
    if compressor == "dense":
        d = min(d, 300)
        t = d
    idx = None if compressor == "dense" else np.sort(rng.choice(d, t, replace=False))
    if compressor == "signtopk":
        u = Update(
            "signtopk",
            d,
            idx,
            np.where(rng.random(t) < 0.5, -1, 1).astype(np.int8),
            scale=float(abs(rng.standard_normal())) * float(rng.random() < 0.9),
            semantics=semantics,  # type: ignore[arg-type]
        )
    else:
        vals = rng.standard_normal(t).astype(DTYPES[dtype])
        u = Update(compressor, d, idx, vals, semantics=semantics)  # type: ignore[arg-type]
    return encode(
        u,
        job=str(rng.choice(NAMES)),
        agent=str(rng.choice(NAMES)),
        round=int(rng.choice(ROUNDS)),
        seq=int(rng.choice(ROUNDS)),
        value_dtype=dtype,  # type: ignore[arg-type]
    )


def reference(blob: object) -> object:
    try:
        return decode(blob)  # type: ignore[arg-type]
    except WireFormatError as exc:
        return exc


def assert_same(got: object, want: object, where: str) -> None:
    if isinstance(want, WireFormatError):
        assert isinstance(got, WireFormatError), f"{where}: decode raised {want}, got {got!r}"
        assert type(got) is type(want)
        assert str(got) == str(want) and got.reason == want.reason, where
        return
    assert isinstance(want, tuple)
    assert isinstance(got, tuple), f"{where}: decode returned a message, got {got!r}"
    (h1, u1), (h2, u2) = got, want
    assert h1 == h2, where
    assert (u1.compressor, u1.d, u1.semantics) == (u2.compressor, u2.d, u2.semantics), where
    assert type(u1.scale) is type(u2.scale) and u1.scale == u2.scale, where
    if u2.indices is None:
        assert u1.indices is None, where
    else:
        assert u1.indices is not None, where
        assert u1.indices.dtype == u2.indices.dtype == np.int64, where
        assert np.array_equal(u1.indices, u2.indices), where
    assert u1.values.dtype == u2.values.dtype, where
    assert u1.values.shape == u2.values.shape, where
    assert u1.values.tobytes() == u2.values.tobytes(), where
    assert u1.values.flags.writeable == u2.values.flags.writeable, where


def check(batch: Sequence[object]) -> list[object]:
    """decode_many(batch) equals [decode(b) for b in batch]; returns decode's results.

    Also: every valid sparse update of a few KiB was decoded by the vectorised path, not
    handed back to decode (which decode_many does for any message that fails a check, and
    for everything when the vectorised path raises: that must not hide its bugs).
    """
    want = [reference(b) for b in batch]
    fell_back: list[object] = []
    single = wire_many._decode_one

    def counting(blob: object) -> object:
        fell_back.append(bytes(blob) if isinstance(blob, bytes | bytearray | memoryview) else blob)
        return single(blob)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wire_many, "_decode_one", counting)
        got = decode_many(batch)  # type: ignore[arg-type]
    assert isinstance(got, list) and len(got) == len(batch)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(g, w, f"message {i}")
    for i, (blob, w) in enumerate(zip(batch, want, strict=True)):
        if isinstance(w, tuple) and w[0].compressor != "dense" and w[0].t > 0:
            assert isinstance(blob, bytes | bytearray | memoryview)
            if len(blob) <= 4096:  # so its index block is one the vectorised path takes
                assert bytes(blob) not in fell_back, f"message {i} fell back to decode"
    return want


def n_ok(results: Sequence[object]) -> int:
    return sum(not isinstance(r, WireFormatError) for r in results)


# ---------------------------------------------------------------- valid batches


@pytest.mark.parametrize("seed", range(4))
def test_random_valid_batch_equals_decode(seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch: list[bytes] = []
    for _ in range(300):
        d = int(rng.choice([1, 2, 3, 5, 7, 13, 20, 41, 100, 1000, 47_236]))
        r = rng.random()
        if r < 0.1:
            t = 0
        elif r < 0.2:
            t = d
        elif r < 0.6 and d >= 100:
            t = min(d, int(rng.choice([100, 101, 40, 80])))  # repeated T: identical layouts
        else:
            t = int(rng.integers(1, min(d, 500) + 1))
        batch.append(random_update(rng, d, t))
    results = check(batch)
    assert n_ok(results) == len(batch)
    decoded = cast(list[tuple[wire.UpdateHeader, Update]], results)  # n_ok: all decoded
    sparse = [h for h, _ in decoded if h.compressor != "dense" and h.t > 0]
    assert {best_code(h.d, h.t)[0] for h in sparse} == {1, 3}  # both index codes occur
    assert {h.compressor for h in sparse} == {"topk", "signtopk", "randk"}
    assert len({(h.value_dtype, h.semantics) for h in sparse}) == 15
    # the same messages shuffled, and as bytearray / memoryview
    perm = rng.permutation(len(batch))
    check([bytearray(batch[i]) if i % 3 == 0 else memoryview(batch[i]) for i in perm])


def test_rcv1_batches_same_and_distinct_t() -> None:
    """The aggregator's case: d = 47,236 top-k float32 from 10 agents, T fixed or varying."""
    rng = np.random.default_rng(47_236)
    d = 47_236
    same = [random_topk(rng, d, 100, f"pi-{i % 10:02d}", round=1000 + i // 10) for i in range(400)]
    varied = [
        random_topk(rng, d, int(rng.integers(50, 501)), f"pi-{i % 10:02d}", round=i)
        for i in range(400)
    ]
    assert n_ok(check(same)) == 400
    assert n_ok(check(varied)) == 400
    assert n_ok(check(same + varied)) == 800


def random_topk(rng: np.random.Generator, d: int, t: int, agent: str, round: int) -> bytes:
    idx = np.sort(rng.choice(d, t, replace=False))
    u = Update("topk", d, idx, rng.standard_normal(t).astype("<f4"))
    return encode(u, job="bench", agent=agent, round=round, seq=0)


@pytest.mark.parametrize("seed", range(3))
def test_every_index_code_equals_decode(seed: int) -> None:
    """Index blocks with any (b, l) the decoder accepts, not only the encoder's choice."""
    rng = np.random.default_rng(100 + seed)
    batch: list[bytes] = []
    for _ in range(250):
        d = int(rng.choice([1, 2, 3, 4, 9, 17, 20, 41, 100, 1000, 47_236, 2**20 + 3]))
        t = int(rng.integers(1, min(d, 120) + 1))
        compressor = str(rng.choice(["topk", "signtopk", "randk"]))
        dtype = str(rng.choice(list(DTYPES)))
        b, ell = random_code(rng, d)
        if (t + (d - 1) // (b << ell)) > 20_000:  # keep the pure-Python encoder quick
            ell = max(1, d.bit_length() - 4)
        for _ in range(int(rng.integers(1, 4))):  # the same layout two or three times
            batch.append(crafted(rng, compressor, d, t, (b, ell), dtype))
    assert n_ok(check(batch)) == len(batch)


def test_all_t_from_0_to_d_for_tiny_d() -> None:
    rng = np.random.default_rng(7)
    batch = [
        crafted(rng, c, d, t, (b, ell)) if t else random_update(rng, d, 0)
        for d in range(1, 21)
        for t in range(d + 1)
        for c in ("topk", "signtopk")
        for b in (1, 3)
        for ell in {0, 1, d.bit_length()}
    ]
    results = check(batch)
    assert n_ok(results) == len(results)


def test_large_blocks_and_dense_take_the_single_path() -> None:
    """Blocks over the vectorised pass's size limit, and dense updates, mixed in."""
    rng = np.random.default_rng(3)
    batch = [random_update(rng, 47_236, 100) for _ in range(20)]
    big = np.sort(rng.choice(10**6, 20_000, replace=False))
    batch.insert(
        5,
        encode(
            Update("topk", 10**6, big, np.ones(20_000, "<f4")), job="j", agent="a", round=1, seq=1
        ),
    )
    batch.insert(
        9, encode(Update("dense", 50, None, np.ones(50, "<f8")), job="j", agent="a", round=1, seq=2)
    )
    assert n_ok(check(batch)) == len(batch)


def test_many_passes() -> None:
    """More indices than one vectorised pass holds: the batch is split, results still line up."""
    rng = np.random.default_rng(11)
    batch = [random_topk(rng, 47_236, int(rng.integers(200, 900)), "pi-01", i) for i in range(120)]
    batch[60] = batch[60][:-1]  # and one bad message in the middle
    results = check(batch)
    assert n_ok(results) == 119


# ---------------------------------------------------------------- malformed messages


def corrupt(rng: np.random.Generator, blob: bytes, head: int, block: int) -> tuple[str, bytes]:
    """One random corruption; ``head`` is the header length, ``block`` the index block's."""
    buf = bytearray(blob)
    kind = str(
        rng.choice(
            [
                "flip-block",
                "flip-block",
                "flip-block",
                "pad",
                "value",
                "trailing",
                "truncate",
                "magic",
                "flip-any",
                "code",
            ]
        )
    )
    if kind == "flip-block":
        k = int(rng.integers(1, block)) if block > 1 else 0
        buf[head + k] ^= 1 << int(rng.integers(8))
    elif kind == "pad":
        buf[head + block - 1] |= 0x80
    elif kind == "value":
        at = int(rng.integers(head + block, len(buf)))
        buf[at] = 0xFF
        buf[at - 1 if at > head + block else at] = 0xFF
    elif kind == "trailing":
        buf += rng.bytes(int(rng.integers(1, 4)))
    elif kind == "truncate":
        del buf[int(rng.integers(0, len(buf))) :]
    elif kind == "magic":
        buf[int(rng.integers(0, 4))] ^= 0x10
    elif kind == "flip-any":
        buf[int(rng.integers(0, len(buf)))] ^= 1 << int(rng.integers(8))
    else:
        buf[head] = int(rng.integers(256))
    return kind, bytes(buf)


@pytest.mark.parametrize("seed", range(3))
def test_corrupted_rows_inside_valid_groups(seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    batch: list[bytes] = []
    for _ in range(60):
        d = int(rng.choice([20, 41, 100, 1000, 47_236]))
        t = int(rng.integers(1, min(d, 150) + 1))
        compressor = str(rng.choice(["topk", "signtopk", "randk"]))
        dtype = str(rng.choice(list(DTYPES)))
        b, ell = best_code(d, t)[:2] if rng.random() < 0.5 else random_code(rng, d)
        group = [crafted(rng, compressor, d, t, (b, ell), dtype) for _ in range(6)]
        head = len(message(compressor, d, t, b""))
        block = len(index_block(list(range(t)), d, b, ell))
        for j in rng.choice(6, int(rng.integers(1, 4)), replace=False).tolist():
            group[j] = corrupt(rng, group[j], head, block)[1]
        batch += group
    results = check(batch)
    errors = {str(r).split(":")[0].split(" ")[0] for r in results if isinstance(r, WireFormatError)}
    assert n_ok(results) > len(batch) // 2
    assert len(errors) >= 6, errors  # the corruptions reach many different checks


def test_every_index_block_check_inside_a_valid_group() -> None:
    """One invalid block per check, each among valid blocks of the same (d, n, code)."""
    rng = np.random.default_rng(5)
    d, t = 1000, 45  # b = 3 with one full trit word and a short one
    b, ell = 3, 2
    good = sorted(rng.choice(d, t, replace=False).tolist())

    def row(block: bytes, compressor: str = "topk", vals: bytes | None = None) -> bytes:
        v = vals if vals is not None else values_bytes(rng, compressor, t, "float32")
        return message(compressor, d, t, block + v)

    valid = index_block(good, d, b, ell)
    # trits all 0: an out-of-range trit word (3**40, 3**5) then has the right digits, so
    # only the range check of the trit words rejects it
    flat = sorted(rng.choice([i for i in range(d) if i % 12 < 4], t, replace=False).tolist())
    cases: dict[str, bytes] = {
        "ones": row(valid[:1] + bytes([valid[1] ^ 0x01]) + valid[2:]),
        "padding": row(valid[:-1] + bytes([valid[-1] | 0x80])),
        "increasing": row(index_block([*good[:10], good[9], *good[11:]], d, b, ell)),
        "decreasing": row(index_block([*good[:10], good[10] + 1, good[10], *good[12:]], d, b, ell)),
        "range": row(index_block([*good[:-1], 1001], d, b, ell)),
        "full trit word": row(index_block(flat, d, b, ell, trit_words={0: 3**40})),
        "last trit word": row(index_block(flat, d, b, ell, trit_words={1: 3**5})),
        "nan": row(valid, vals=np.array([np.nan] + [1.0] * (t - 1), "<f4").tobytes()),
        "inf": row(valid, vals=np.array([1.0] * (t - 1) + [np.inf], "<f4").tobytes()),
        "scale nan": row(valid, "signtopk", np.array([np.nan], "<f4").tobytes() + bytes(6)),
        "scale negative": row(valid, "signtopk", np.array([-1.0], "<f4").tobytes() + bytes(6)),
        "sign padding": row(
            valid, "signtopk", np.array([1.0], "<f4").tobytes() + bytes(5) + b"\x80"
        ),
        "trailing": row(valid) + b"\x00",
        "short": row(valid)[:-1],
        "code": row(bytes([0x80 | 11]) + valid[1:]),
    }
    # the crafted cases differ from valid blocks only where they should
    assert decode(row(index_block([*good[:-1], 999], d, b, ell)))
    assert decode(row(index_block(flat, d, b, ell)))
    batch: list[bytes] = []
    for bad in cases.values():
        batch += [row(valid), row(valid, "signtopk"), bad, row(valid, "randk")]
    results = check(batch)
    reasons = [str(results[4 * i + 2]) for i in range(len(cases))]
    assert all(isinstance(results[4 * i + 2], WireFormatError) for i in range(len(cases))), reasons
    assert n_ok(results) == 3 * len(cases)
    for needle in (
        "ones in the high part",
        "padding bits are not zero",
        "not strictly increasing",
        "out of range for d",
        "trit word out of range",
        "nan or inf",
        "signtopk scale",
        "sign bits",
        "trailing bytes",
        "truncated",
        "index code",
    ):
        assert any(needle in r for r in reasons), (needle, reasons)


def test_header_errors_and_odd_elements() -> None:
    rng = np.random.default_rng(9)
    ok = random_topk(rng, 47_236, 100, "pi-01", 3)
    batch: list[object] = [
        ok,
        b"",
        b"\xca",
        b"\xca\x7e\x02" + ok[3:],  # version
        b"\xca\x7e\x01\x02" + ok[4:],  # type
        ok[:4] + b"\x09" + ok[5:],  # compressor id
        ok[:5] + b"\x30" + ok[6:],  # reserved flags
        ok[:5] + b"\x03" + ok[6:],  # dtype code
        ok[:6] + b"\x00" + ok[7:],  # empty job
        ok[:6] + b"\x05bad!!" + ok[12:],  # job characters
        message("topk", 20, 21, b""),  # T > d
        message("topk", 0, 0, b""),  # d = 0
        message("dense", 5, 4, b""),  # dense T != d
        message("topk", 20, 3, b"", round=2**63),  # round too large
        crafted(rng, "topk", 100, 5, round=2**63),  # the same, with a valid body
        crafted(rng, "topk", 100, 5, seq=2**63),
        crafted(rng, "topk", 100, 5, round=2**63 - 1, seq=2**63 - 1),  # valid
        ok[:19] + b"\x80\x00" + ok[20:],  # round not in shortest form (1 byte -> 2)
        None,
        12,
        "text",
        bytearray(ok),
        memoryview(ok),
        memoryview(b"xx" + ok)[2:],
        ok,
    ]
    results = check(batch)
    assert n_ok(results) == 6


def test_empty_single_and_argument_types() -> None:
    rng = np.random.default_rng(1)
    assert decode_many([]) == []
    assert decode_many(()) == []
    one = random_update(rng, 1000, 30)
    check([one])
    check((one,))
    check([bytearray(one)])
    check([memoryview(one)])
    check([one[:-3]])
    for bad in (one, bytearray(one), memoryview(one), "abc", 5, None, iter([one])):
        with pytest.raises(TypeError):
            decode_many(bad)  # type: ignore[arg-type]


def test_results_are_independent_of_the_batch() -> None:
    """Decoding a message in a batch gives the same as decoding it alone or elsewhere."""
    rng = np.random.default_rng(2)
    batch = [random_topk(rng, 47_236, 100, "pi-01", i) for i in range(50)]
    alone = [decode_many([b])[0] for b in batch]
    together = decode_many(batch)
    for a, t in zip(alone, together, strict=True):
        assert_same(t, a, "batch vs alone")


# ---------------------------------------------------------------- memory


def test_hostile_batch_memory_is_proportionate() -> None:
    """Blocks with the most indices a small block can hold (one bit per index, l = 0): the
    batch decoder's temporaries stay bounded whatever the batch (here 150 messages, 2.25
    million indices), and it keeps no more than decode's results do."""
    rng = np.random.default_rng(4)
    d = 16_000
    batch = []
    for i in range(150):
        idx = np.sort(rng.choice(d, 15_000, replace=False))
        u = Update("signtopk", d, idx, np.ones(idx.size, np.int8), scale=1.0)
        batch.append(encode(u, job="j", agent="a", round=i, seq=0))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        one_by_one = [reference(b) for b in batch]
        kept_loop = tracemalloc.get_traced_memory()[0] - base
        del one_by_one
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        many = decode_many(batch)
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n_ok(many) == len(batch)
    kept, temporaries = now - base, peak - now
    assert kept <= 1.02 * kept_loop, (kept, kept_loop)
    assert temporaries <= 2 << 20, temporaries  # measured: 0.6 MiB (34 MiB in one pass)
