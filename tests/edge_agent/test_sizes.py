"""The closed-form sizes the selector prices with equal the per-T sizes they replaced.

``_reference_size`` is the size function as it stood before the closed form (a band of
eight (b, l) codes per T, a loop of comparisons for the varint): kept here, frozen, as the
oracle. The fast path (``update_sizer``, what ``make_price`` builds once) and the public
``encoded_size`` must give the same bytes for every (d, T, compressor, dtype, flags)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.numerics import selection as sel
from edge_agent.numerics.compressors import VALUE_DTYPES, ValueDtype
from edge_agent.protocol.indexcode import index_bits_exhaustive
from edge_agent.protocol.wire import encoded_size, update_sizer

IntArray = npt.NDArray[np.int64]
COMPRESSORS = ["topk", "signtopk", "randk", "dense"]
DTYPES: list[ValueDtype] = ["float32", "float16", "float64"]
ID = st.text("abcXYZ019._-", min_size=1, max_size=64)


def _reference_index_bytes(d: int, n: IntArray) -> IntArray:
    top = min(62, max(1, d.bit_length()))
    b = np.array([1, 1, 1, 1, 3, 3, 3, 3], dtype=np.int64)
    step = np.array([-2, -1, 0, 1, -2, -1, 0, 1], dtype=np.int64)
    centre = np.floor(np.log2(d * np.log(2) / (b[None, :] * np.maximum(n[:, None], 1))))
    ls = np.clip(centre.astype(np.int64) + 1 + step[None, :], 0, top)
    nn = n[:, None]
    trits = 64 * (nn // 40) + np.array([(3**k - 1).bit_length() for k in range(41)])[nn % 40]
    bits = (nn * ls + nn + (d - 1) // (b << ls) + np.where(b == 3, trits, 0)).min(axis=1)
    return np.where(n == 0, 0, 1 + (bits + 7) // 8)


def _reference_size(
    compressor: str,
    d: int,
    t: int,
    ids: tuple[str, str],
    round_seq: tuple[int, int],
    dtype: str,
    mac: bool,
) -> int:
    def varint_len(n: int) -> int:
        return 1 + sum(n >= (1 << (7 * k)) for k in range(1, 9))

    t = d if compressor == "dense" else t
    size = 6 + sum(varint_len(len(s)) + len(s) for s in ids)
    size += varint_len(round_seq[0]) + varint_len(round_seq[1]) + varint_len(d) + varint_len(t)
    size += 8 if mac else 0
    item = VALUE_DTYPES[dtype].itemsize
    if compressor == "dense":
        return size + d * item
    size += int(_reference_index_bytes(d, np.array([t], dtype=np.int64))[0])
    if compressor == "signtopk":
        return size + (item + (t + 7) // 8 if t > 0 else 0)
    return size + t * item


@settings(max_examples=300, deadline=None)
@given(
    d=st.one_of(st.integers(1, 5000), st.integers(1, 2**32 - 1)),
    frac=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20),
    compressor=st.sampled_from(COMPRESSORS),
    dtype=st.sampled_from(DTYPES),
    mac=st.booleans(),
    ids=st.tuples(ID, ID),
    round_seq=st.tuples(st.integers(0, 2**40), st.integers(0, 2**20)),
)
def test_closed_form_sizes_equal_the_per_t_reference(
    d: int,
    frac: list[float],
    compressor: str,
    dtype: ValueDtype,
    mac: bool,
    ids: tuple[str, str],
    round_seq: tuple[int, int],
) -> None:
    ts = np.array(sorted({int(f * d) for f in frac} | {0, 1, d}), dtype=np.int64)
    meta = dict(job=ids[0], agent=ids[1], round=round_seq[0], seq=round_seq[1])
    sizer = update_sizer(compressor, d=d, value_dtype=dtype, mac=mac, **meta)  # type: ignore[arg-type]
    want = [_reference_size(compressor, d, int(t), ids, round_seq, dtype, mac) for t in ts]
    assert sizer(ts).tolist() == want
    got = [encoded_size(compressor, d=d, t=int(t), value_dtype=dtype, mac=mac, **meta) for t in ts]  # type: ignore[arg-type]
    assert got == want


@settings(max_examples=200, deadline=None)
@given(d=st.integers(1, 2**32 - 1), n=st.integers(0, 2**32 - 1))
def test_reference_index_size_is_the_minimum_over_every_code(d: int, n: int) -> None:
    """(So the reference above is itself right: its band holds the global minimum.)"""
    n = min(n, d)
    bits = index_bits_exhaustive(d, n)
    want = 0 if n == 0 else 1 + (bits + 7) // 8
    assert int(_reference_index_bytes(d, np.array([n], dtype=np.int64))[0]) == want


def test_price_keeps_the_shape_of_t() -> None:
    class PerByte:
        def objective_cost(self, size_bytes: IntArray) -> npt.NDArray[np.float64]:
            return np.asarray(size_bytes, dtype=np.float64)

    price = sel.make_price(PerByte(), "topk", d=1000, job="j", agent="a")
    grid = np.arange(1, 7, dtype=np.int64).reshape(2, 3)
    want = [
        [encoded_size("topk", d=1000, t=int(t), job="j", agent="a", round=0, seq=0) for t in row]
        for row in grid
    ]
    assert price(grid).tolist() == want
