"""Compressors: what they send, their pre-scaling, and their guaranteed gains."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import edge_agent as ea
from edge_agent.errors import UnknownNameError
from edge_agent.numerics.compressors import randk_probabilities, top_indices

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=64)
grads = arrays(np.float64, st.integers(1, 300), elements=finite, unique=True)


@given(grads, st.data())
def test_topk_to_dense_is_the_top_t_of_g(g: np.ndarray, data: st.DataObject) -> None:
    assume(np.unique(np.abs(g)).size == g.size)  # the top-T set is unique
    t = data.draw(st.integers(0, g.size))
    u = ea.compress(g, "topk", t, value_dtype="float64")
    expected = np.zeros_like(g)
    keep = np.argsort(-np.abs(g), kind="stable")[:t]
    expected[keep] = g[keep]
    assert np.array_equal(u.to_dense(), expected)


@given(grads, st.data())
def test_signtopk_sends_scaled_signs_on_the_top_t(g: np.ndarray, data: st.DataObject) -> None:
    assume(np.unique(np.abs(g)).size == g.size)
    t = data.draw(st.integers(1, g.size))
    u = ea.compress(g, "signtopk", t, value_dtype="float64")
    keep = np.argsort(-np.abs(g), kind="stable")[:t]
    s = np.abs(g[keep]).sum() / t
    assert u.scale == pytest.approx(s, rel=1e-12)
    dense = u.to_dense()
    assert np.allclose(dense[keep], s * np.where(g[keep] < 0, -1.0, 1.0))
    assert np.count_nonzero(dense) <= t


@given(grads)
def test_dense_sends_everything(g: np.ndarray) -> None:
    u = ea.compress(g, "dense", 0, value_dtype="float64")
    assert u.t == g.size
    assert np.array_equal(u.to_dense(), g)


def test_float32_values_are_rounded_inside_the_update() -> None:
    g = np.array([1.0 + 1e-12, -3.0, 0.5])
    u = ea.compress(g, "topk", 3)
    assert u.values.dtype == np.float32
    assert np.array_equal(u.to_dense(), g.astype(np.float32).astype(np.float64))


def test_float16_overflow_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="float16 range"):
        ea.compress(np.array([1e6, 1.0]), "topk", 1, value_dtype="float16")


def test_unknown_compressor_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError, match="valid names: dense, randk, signtopk, topk"):
        ea.compress(np.ones(3), "top-k", 1)


def test_nonfinite_gradient_is_refused() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        ea.compress(np.array([1.0, np.nan]), "topk", 1)


def test_randk_needs_an_explicit_generator() -> None:
    with pytest.raises(ValueError, match="rng"):
        ea.compress(np.ones(4), "randk", 2)


@given(arrays(np.float64, st.integers(2, 200), elements=finite), st.data())
def test_randk_probabilities_sum_to_t_and_are_capped(g: np.ndarray, data: st.DataObject) -> None:
    nnz = int(np.count_nonzero(g))
    if nnz == 0:
        return
    t = data.draw(st.integers(1, nnz))
    p, v = randk_probabilities(np.abs(g), t)
    assert np.all((p >= 0) & (p <= 1))
    assert p.sum() == pytest.approx(t, rel=1e-9, abs=1e-9)
    nz = p > 0
    assert v == pytest.approx(float(np.sum(g[nz] ** 2 / p[nz])), rel=1e-9)


def test_randk_is_unbiased_up_to_rho() -> None:
    rng = np.random.default_rng(0)
    g = rng.standard_normal(50) * rng.pareto(2.0, 50)
    t = 10
    _, v = randk_probabilities(np.abs(g), t)
    rho = float(g @ g) / v
    mean = np.zeros_like(g)
    n = 20000
    for _ in range(n):
        mean += ea.compress(g, "randk", t, rng=rng, value_dtype="float64").to_dense()
    mean /= n
    assert np.allclose(mean, rho * g, atol=0.05 * np.abs(g).max())


def test_randk_same_seed_same_update() -> None:
    g = np.random.default_rng(1).standard_normal(1000)
    a = ea.compress(g, "randk", 30, rng=np.random.default_rng(7))
    b = ea.compress(g, "randk", 30, rng=np.random.default_rng(7))
    assert a.indices is not None and b.indices is not None
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.values, b.values)


def _descent(g: np.ndarray, u: np.ndarray, lipschitz: float) -> float:
    """Guaranteed decrease of a quadratic f = L/2 |x|^2 + g.x at x=0 after x <- -u/L."""
    x = -u / lipschitz
    return -(lipschitz / 2 * float(x @ x) + float(g @ x))


@given(grads, st.data())
def test_gains_match_the_descent_lemma_on_the_worst_case_quadratic(
    g: np.ndarray, data: st.DataObject
) -> None:
    """On f(x) = g.x + L/2|x|^2 the descent lemma is tight: the decrease equals gain(T)."""
    lip = 2.0
    t = data.draw(st.integers(1, g.size))
    mags = np.sort(np.abs(g))[::-1]
    topk = ea.compress(g, "topk", t, value_dtype="float64").to_dense()
    assert _descent(g, topk, lip) == pytest.approx(
        np.sum(mags[:t] ** 2) / (2 * lip), rel=1e-9, abs=1e-9
    )
    sign = ea.compress(g, "signtopk", t, value_dtype="float64").to_dense()
    assert _descent(g, sign, lip) == pytest.approx(
        mags[:t].sum() ** 2 / (2 * lip * t), rel=1e-9, abs=1e-6
    )


def test_top_indices_are_sorted_ascending() -> None:
    absg = np.array([0.1, 5.0, 0.3, 4.0, 2.0])
    assert top_indices(absg, 3).tolist() == [1, 3, 4]


@pytest.mark.parametrize("t", [1, 3, 17, 64, 199, 200])
def test_top_indices_take_the_lowest_indices_among_equal_magnitudes(t: int) -> None:
    rng = np.random.default_rng(t)
    absg = rng.integers(0, 5, size=200).astype(np.float64)  # ties everywhere
    want = np.sort(np.argsort(-absg, kind="stable")[:t])
    assert top_indices(absg, t).tolist() == want.tolist()
