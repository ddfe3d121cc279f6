"""CAT selection: exact argmax of gain/cost, same answer as the exhaustive sort."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import edge_agent as ea
from edge_agent.errors import UnknownNameError
from edge_agent.numerics import selection as sel
from edge_agent.protocol.wire import encoded_size


@dataclass(frozen=True)
class Link:
    """A packet-stepped link: per-message + per-packet + per-byte cost (a stand-in profile)."""

    per_message: float
    per_packet: float
    per_byte: float
    max_payload_bytes: int = 51

    def objective_cost(self, size_bytes: np.ndarray) -> np.ndarray:
        packets = np.ceil(np.asarray(size_bytes) / self.max_payload_bytes)
        return self.per_message + self.per_packet * packets + self.per_byte * np.asarray(size_bytes)


LINKS = [
    Link(0.0, 1.155, 0.03277, 51),  # LoRa SF12-like: airtime per packet + per byte
    Link(0.0, 1.0, 0.0, 1460),  # packet model
    Link(3.0, 0.0, 0.0004, 1200),  # NB-IoT-like: per-message cost dominates
    Link(0.0, 0.0, 8.0, 10**9),  # payload bits only
    Link(2000.0, 0.0, 1.0, 10**9),  # affine with a large fixed cost: T* is large
]


def heavy_tailed(rng: np.random.Generator, d: int) -> np.ndarray:
    return rng.standard_normal(d) * rng.pareto(1.5, d)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    d=st.integers(1, 20000),
    link=st.sampled_from(LINKS),
    compressor=st.sampled_from(["topk", "signtopk"]),
)
def test_select_equals_exhaustive(seed: int, d: int, link: Link, compressor: str) -> None:
    rng = np.random.default_rng(seed)
    g = heavy_tailed(rng, d)
    price = sel.make_price(link, compressor, d=d, job="demo", agent="pi-01", round=7)
    fast = sel.select(g, compressor, price)
    slow = sel.select_exhaustive(g, compressor, price)
    assert fast.t == slow.t
    assert fast.ratio == slow.ratio


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(2, 3000), levels=st.integers(1, 4))
def test_ties_go_to_the_smallest_t(seed: int, d: int, levels: int) -> None:
    """Gradients with many equal magnitudes: both paths agree and pick the smallest T."""
    rng = np.random.default_rng(seed)
    g = rng.integers(-levels, levels + 1, size=d).astype(np.float64)
    g[0] = levels  # at least one nonzero
    price = sel.make_price(Link(0.0, 0.0, 8.0, 10**9), "topk", d=d, job="j", agent="a")
    fast = sel.select(g, "topk", price)
    slow = sel.select_exhaustive(g, "topk", price)
    assert fast.t == slow.t
    ts = np.arange(1, d + 1)
    mags = np.sort(np.abs(g))[::-1]
    ratio = np.cumsum(mags**2) / price(ts)
    assert fast.t == int(np.flatnonzero(ratio == ratio.max())[0]) + 1


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    d=st.integers(2000, 30000),
    link=st.sampled_from(LINKS),
    compressor=st.sampled_from(["topk", "signtopk"]),
)
def test_equal_magnitudes_pick_the_same_entries_as_the_exhaustive_sort(
    seed: int, d: int, link: Link, compressor: str
) -> None:
    """The fast path's top set is canonical (equal magnitudes: the lowest indices), whatever
    candidate set its threshold passes found: the same update as the full stable sort."""
    rng = np.random.default_rng(seed)
    g = np.round(heavy_tailed(rng, d), 1)  # many entries share a magnitude
    price = sel.make_price(link, compressor, d=d, job="demo", agent="pi-01", round=3)
    fast = sel.select(g, compressor, price)
    slow = sel.select_exhaustive(g, compressor, price)
    assert fast.t == slow.t
    assert fast.indices is not None and slow.indices is not None
    np.testing.assert_array_equal(fast.indices, slow.indices)


def test_select_returns_the_top_t_indices() -> None:
    g = np.array([0.0, 5.0, -7.0, 1.0, 3.0, -0.5])
    price = sel.make_price(Link(100.0, 0.0, 1.0, 10**9), "topk", d=g.size, job="j", agent="a")
    out = sel.select(g, "topk", price)
    assert out.indices is not None
    assert out.indices.tolist() == sorted(np.argsort(-np.abs(g))[: out.t].tolist())


def test_t_min_and_t_max_are_respected() -> None:
    g = heavy_tailed(np.random.default_rng(0), 5000)
    price = sel.make_price(Link(2000.0, 0.0, 1.0, 10**9), "topk", d=g.size, job="j", agent="a")
    free = sel.select(g, "topk", price).t
    assert sel.select(g, "topk", price, t_max=free // 2).t <= free // 2
    assert sel.select(g, "topk", price, t_min=free + 10).t >= free + 10
    with pytest.raises(ValueError, match="t_min"):
        sel.select(g, "topk", price, t_min=0)


@pytest.mark.parametrize("link", LINKS)
def test_cat_is_never_worse_than_dense_per_unit_cost(link: Link) -> None:
    """gain(T*)/cost(T*) >= gain(d)/cost(d) under the selector's own model."""
    g = heavy_tailed(np.random.default_rng(1), 2000)
    price_topk = sel.make_price(link, "topk", d=g.size, job="j", agent="a")
    price_dense = sel.make_price(link, "dense", d=g.size, job="j", agent="a")
    best = sel.select(g, "topk", price_topk)
    dense = float(g @ g) / float(price_dense(np.array([g.size]))[0])
    assert best.ratio >= dense


def test_pure_payload_cost_picks_t_equal_one_for_topk() -> None:
    """With a cost proportional to T, A2(T)/T is non-increasing: T* = 1 (docs/algorithm.md)."""

    class PerEntry:
        def objective_cost(self, size_bytes: np.ndarray) -> np.ndarray:
            return np.asarray(size_bytes, dtype=np.float64) * 0 + 1.0

    g = heavy_tailed(np.random.default_rng(2), 1000)
    ts = np.arange(1, 1001)
    ratio = np.cumsum(np.sort(g**2)[::-1]) / ts
    assert int(np.argmax(ratio)) == 0
    price = lambda t: np.asarray(t, dtype=np.float64)  # noqa: E731  cost proportional to T
    assert sel.select(g, "topk", price).t == 1
    assert PerEntry().objective_cost(np.array([1]))[0] == 1.0


def test_randk_selection_is_exact_against_a_direct_sum() -> None:
    g = heavy_tailed(np.random.default_rng(3), 300)
    link = Link(0.0, 1.0, 0.0, 64)
    price = sel.make_price(link, "randk", d=g.size, job="j", agent="a")
    out = sel.select(g, "randk", price)
    from edge_agent.numerics.compressors import randk_probabilities

    norm2 = float(g @ g)
    ratios = []
    for t in range(1, 301):
        _, v = randk_probabilities(np.abs(g), t)
        ratios.append(norm2**2 / v / float(price(np.array([t]))[0]))
    assert out.t == int(np.argmax(np.array(ratios))) + 1


@pytest.mark.parametrize("compressor", ["topk", "signtopk", "randk"])
def test_encoded_size_is_nondecreasing_in_t(compressor: str) -> None:
    """The bound in select() relies on cost being nondecreasing in T."""
    for d in (7, 100, 4097, 47236):
        ts = np.arange(0, d + 1)
        sizes = encoded_size(compressor, d=d, t=ts, job="job", agent="agent", round=5, seq=1)
        assert np.all(np.diff(sizes) >= 0), d


def test_dynamic_rule_is_the_smallest_t_reaching_the_norm() -> None:
    g = heavy_tailed(np.random.default_rng(4), 10000)
    a1 = np.cumsum(np.sort(np.abs(g))[::-1])
    expected = int(np.argmax(a1 >= np.linalg.norm(g))) + 1
    assert sel.dynamic_t(g) == expected


def test_hybrid_policy_resolves_every_s_rounds() -> None:
    rng = np.random.default_rng(5)
    price = sel.make_price(Link(0.0, 1.155, 0.03277, 51), "topk", d=500, job="j", agent="a")
    policy = sel.parse_policy("hybrid:3")
    picks = [policy.choose(heavy_tailed(rng, 500), "topk", price, r) for r in range(7)]
    solved = [not np.isnan(p.ratio) for p in picks]
    assert solved == [True, False, False, True, False, False, True]
    assert picks[1].t == picks[0].t


def test_parse_policy_names_and_errors() -> None:
    assert isinstance(sel.parse_policy("fixed:12"), sel.FixedPolicy)
    assert isinstance(sel.parse_policy("dynamic"), sel.DynamicPolicy)
    assert sel.parse_policy("hybrid").every == 200  # type: ignore[attr-defined]
    with pytest.raises(UnknownNameError, match="valid names: cat, dynamic, fixed, hybrid"):
        sel.parse_policy("greedy")
    with pytest.raises(ValueError, match="positive integer"):
        sel.parse_policy("fixed:zero")


def test_select_t_public_api_prices_with_the_exact_size() -> None:
    g = heavy_tailed(np.random.default_rng(6), 3000)
    link = Link(0.0, 1.155, 0.03277, 51)
    t = ea.select_t(g, "topk", link, job="demo", agent="pi-01", round=3, seq=0)
    price = sel.make_price(link, "topk", d=g.size, job="demo", agent="pi-01", round=3)
    assert t == sel.select_exhaustive(g, "topk", price).t


def test_index_code_band_finds_the_global_minimum() -> None:
    """encoded_size prices with a band of (b, l); it must equal the minimum over all codes."""
    from edge_agent.protocol.indexcode import index_bits, index_bits_exhaustive

    for d in [*range(1, 200, 7), 1000, 4097, 47236, 10**6, 2**32 - 1]:
        ns = sorted(
            {
                *range(0, min(d, 120) + 1),
                d // 16,
                d // 4,
                d // 2,
                d,
                *np.linspace(0, d, 40).astype(int).tolist(),
            }
        )
        got = index_bits(d, ns)
        assert got.tolist() == [index_bits_exhaustive(d, n) for n in ns], d
