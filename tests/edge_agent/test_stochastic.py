"""Minibatch SGD numerics: the variance estimator, the noisy gains, the step ratio."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.data import Dataset
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.compressors import compress, randk_probabilities
from edge_agent.numerics.feedback import ResidualMemory
from edge_agent.numerics.selection import (
    make_price,
    parse_policy,
    select_exhaustive,
    select_noisy,
)
from edge_agent.numerics.stochastic import (
    StepRatio,
    batch_variance,
    noisy_gain,
    scheduled_step,
    variance_scale,
)

FloatArray = np.ndarray


def _mean_rows(ds: Dataset) -> FloatArray:
    """A 'gradient' that is the mean of the rows: the per-row gradients are the rows."""
    return np.asarray(np.asarray(ds.X, dtype=np.float64).mean(axis=0), dtype=np.float64)


def _shard(n: int, d: int, seed: int) -> tuple[Dataset, FloatArray]:
    """Rows with per-column scales 0.1..3: the per-row variance of column j is known."""
    rng = np.random.default_rng(seed)
    scales = np.linspace(0.1, 3.0, d)
    rows = rng.standard_normal((n, d)) * scales + 1.0
    return Dataset(rows, np.ones(n)), rows.var(axis=0, ddof=1)


def test_batch_variance_estimates_the_variance_of_a_batch_mean_without_replacement() -> None:
    n, d, b = 400, 6, 40
    shard, per_row = _shard(n, d, 0)
    truth = (1 - b / n) * per_row / b  # the variance of a mean of b of n rows
    rng = np.random.default_rng(1)
    estimates, means = [], []
    for _ in range(3000):
        batch = shard.take(rng.choice(n, b, replace=False))
        g = _mean_rows(batch)
        means.append(g)
        estimates.append(batch_variance(_mean_rows, batch, n, g))
    avg = np.mean(estimates, axis=0)
    np.testing.assert_allclose(avg, truth, rtol=0.06)
    # and it is the spread the batch means really have
    np.testing.assert_allclose(np.var(means, axis=0), truth, rtol=0.1)


def test_batch_variance_is_zero_for_one_row_or_the_whole_shard() -> None:
    shard, _ = _shard(20, 3, 2)
    one = shard.take(np.array([4]))
    assert not batch_variance(_mean_rows, one, 20, _mean_rows(one)).any()
    assert not batch_variance(_mean_rows, shard, 20, _mean_rows(shard)).any()


def test_noisy_gains_fall_to_the_deterministic_ones_without_noise() -> None:
    mags = np.sort(np.random.default_rng(3).exponential(size=50))[::-1]
    t = np.arange(1, 51)
    zero = np.zeros(50)
    np.testing.assert_allclose(noisy_gain("topk", mags, zero, t), np.cumsum(mags**2))
    np.testing.assert_allclose(noisy_gain("signtopk", mags, zero, t), np.cumsum(mags) ** 2 / t)
    var = np.full(50, 0.01)
    assert (noisy_gain("topk", mags, var, t) < np.cumsum(mags**2)).all()
    assert (noisy_gain("signtopk", mags, var, t) < np.cumsum(mags) ** 2 / t).all()


def test_the_topk_gain_is_the_expected_decrease_of_the_noiseless_objective() -> None:
    """All entries sent (T = d, a fixed set): 2L E[decrease] = E[2 <m, v> - |v|^2]."""
    rng = np.random.default_rng(4)
    m = rng.standard_normal(8)
    s = rng.uniform(0.1, 2.0, 8)
    v = m + rng.standard_normal((40000, 8)) * np.sqrt(s)
    true = np.mean(2 * v @ m - np.einsum("ij,ij->i", v, v))
    est = [noisy_gain("topk", np.abs(r), s, np.array([8]))[0] for r in v[:4000]]
    assert np.mean(est) == pytest.approx(true, rel=0.05)
    assert true == pytest.approx(m @ m - s.sum(), rel=0.05)


def _price(compressor: str, d: int):  # type: ignore[no-untyped-def]
    return make_price(resolve_profile("paper_payload_bits"), compressor, d=d, job="j", agent="a")


@pytest.mark.parametrize("compressor", ["topk", "signtopk"])
def test_select_noisy_without_noise_is_the_exact_cat(compressor: str) -> None:
    g = np.random.default_rng(5).standard_normal(500) ** 3
    price = _price(compressor, 500)
    assert select_noisy(g, np.zeros(500), compressor, price).t == (
        select_exhaustive(g, compressor, price).t
    )


def _strong_and_weak(seed: int) -> FloatArray:
    """100 entries of about 2 and 1,900 of about 1.2, random signs: at unit noise variance
    the weak ones carry less signal than noise (1.2^2 < 2)."""
    rng = np.random.default_rng(seed)
    mags = np.where(np.arange(2000) < 100, 2.0, 1.2) * rng.uniform(0.95, 1.05, 2000)
    return np.asarray(rng.choice([-1.0, 1.0], 2000) * mags)


@pytest.mark.parametrize("compressor", ["topk", "signtopk"])
def test_noise_makes_cat_send_fewer_entries(compressor: str) -> None:
    g = _strong_and_weak(6)
    price = _price(compressor, 2000)
    exact = select_exhaustive(g, compressor, price)
    noisy = select_noisy(g, np.full(2000, 1.0), compressor, price)
    assert noisy.t < exact.t
    assert noisy.indices is not None and set(noisy.indices) <= set(range(100))


def test_the_cat_policy_uses_the_variance_and_nominal_does_not() -> None:
    g = _strong_and_weak(7)
    price, var = _price("signtopk", 2000), np.full(2000, 1.0)
    cat, nominal = parse_policy("cat"), parse_policy("cat:nominal")
    assert cat.wants_variance and not nominal.wants_variance
    assert (
        cat.choose(g, "signtopk", price, 0, var).t < nominal.choose(g, "signtopk", price, 0, var).t
    )
    assert cat.choose(g, "signtopk", price, 0).t == nominal.choose(g, "signtopk", price, 0).t
    assert parse_policy("fixed:7").choose(g, "signtopk", price, 0, var).t == 7
    with pytest.raises(ValueError, match="cat:nominal"):
        parse_policy("cat:noisy")


def test_randk_with_noise_shrinks_its_scale_by_the_noiseless_share() -> None:
    g = np.random.default_rng(8).standard_normal(300)
    norm2 = float(g @ g)
    plain = compress(g, "randk", 40, rng=np.random.default_rng(9), value_dtype="float64")
    noisy = compress(g, "randk", 40, rng=np.random.default_rng(9), value_dtype="float64",
                     noise=0.25 * norm2)  # fmt: skip
    assert plain.indices is not None and noisy.indices is not None
    np.testing.assert_array_equal(plain.indices, noisy.indices)
    np.testing.assert_allclose(noisy.dense_values(), 0.75 * plain.dense_values())
    _, v = randk_probabilities(np.abs(g), 40)
    assert variance_scale(norm2, 0.25 * norm2, v) == pytest.approx(0.75 * norm2 / v)
    assert variance_scale(norm2, 2 * norm2, v) == 0.0  # all noise: no step along it


def test_the_step_ratio_keeps_the_residual_in_model_units() -> None:
    gamma, l2, t0 = 1.0, 0.1, 50.0
    ratio = StepRatio(gamma, l2, t0)
    assert ratio.factor(100) == 1.0  # the first update: no residual yet
    expected = scheduled_step(gamma, 100, l2, t0) / scheduled_step(gamma, 101, l2, t0)
    assert expected == pytest.approx((101 + t0) / (100 + t0))  # > 1: the step decays
    assert ratio.factor(101) == pytest.approx(expected)
    assert ratio.factor(103) == pytest.approx((103 + t0) / (101 + t0))  # a missed version
    flat = StepRatio(gamma, 0.01, 0.0)
    flat.factor(10)
    assert flat.factor(11) == 1.0  # 2 / (l2 t) = 18 > gamma: the decay has not started


def test_model_unit_feedback_is_the_residual_of_the_scaled_messages() -> None:
    """e_{t+1} = e_t + gamma_t g_t - C(e_t + gamma_t g_t), in gradient units."""
    rng = np.random.default_rng(10)
    d, gamma, l2 = 200, 1.0, 0.05
    memory, ratio = ResidualMemory(d), StepRatio(gamma, l2)
    e_model = np.zeros(d)
    for t in range(40, 46):
        g = rng.standard_normal(d)
        step = scheduled_step(gamma, t, l2)
        memory.rescale(ratio.factor(t))
        v = memory.prepare(g)
        u = compress(v, "topk", 10, value_dtype="float64")
        memory.commit(v, u)
        m = e_model + step * g
        e_model = m - compress(m, "topk", 10, value_dtype="float64").to_dense()
        np.testing.assert_allclose(step * memory.state, e_model, atol=1e-12)
