"""The aggregation state: the mean accumulator's and the EF21 mirror's steps are exactly the
straightforward formulas (bit for bit), refuse non-finite results, and survive export."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.numerics.aggregation import EF21Mirror, MeanAccumulator, sorted_unique
from edge_agent.numerics.compressors import Update, ValueDtype, compress

D = 64


def _updates(seed: int, n: int, *, dense_at: int | None = None) -> list[tuple[Update, float]]:
    """Overlapping sparse updates in mixed wire dtypes and compressors (signtopk has a
    scale), with staleness-like weights; one dense update at ``dense_at``."""
    rng = np.random.default_rng(seed)
    dtypes: list[ValueDtype] = ["float16", "float32", "float64"]
    out: list[tuple[Update, float]] = []
    for k in range(n):
        g = rng.standard_normal(D) * 3
        name = "dense" if k == dense_at else ("signtopk" if k % 5 == 4 else "topk")
        u = compress(g, name, int(rng.integers(1, 12)), value_dtype=dtypes[k % 3])
        out.append((u, 1.0 / (1.0 + k % 3)))
    return out


def _reference(x0: np.ndarray, ups: list[tuple[Update, float]], coef: float) -> np.ndarray:
    """The textbook step: acc = sum_j w_j u_j one update at a time, then x - coef * acc."""
    acc = np.zeros(D)
    for u, w in ups:
        vals = u.dense_values()
        if w != 1.0:
            vals = vals * w
        if u.indices is None:
            acc += vals
        else:
            acc[u.indices] += vals
    return x0 - coef * acc


@pytest.mark.parametrize("dense_at", [None, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mean_step_is_the_reference_step_bit_for_bit(seed: int, dense_at: int | None) -> None:
    ups = _updates(seed, 9, dense_at=dense_at)
    x0 = np.random.default_rng(100 + seed).standard_normal(D)
    coef = 0.37 / len(ups)
    acc = MeanAccumulator(D)
    for u, w in ups:
        acc.add(u, w)
    x = x0.copy()
    res = acc.step(x, coef)
    expected = _reference(x0, ups, coef)
    assert res.finite
    assert x.tobytes() == expected.tobytes()
    assert np.array_equal(res.changed, np.flatnonzero(expected != x0))


def test_mean_step_only_touches_the_sent_entries_and_reset_zeroes_acc() -> None:
    acc = MeanAccumulator(D)
    u = Update("topk", D, np.array([2, 9], dtype=np.int64), np.array([1.0, -2.0], np.float32))
    acc.add(u)
    x = np.ones(D)
    res = acc.step(x, 0.5)
    assert res.finite and res.changed.tolist() == [2, 9]
    assert x[2] == 0.5 and x[9] == 2.0 and np.count_nonzero(x == 1.0) == D - 2
    acc.reset()
    assert not acc.acc.any() and not acc.export().any()
    assert acc.step(x, 0.5).changed.size == 0  # an empty round changes nothing


def test_a_non_finite_mean_step_is_refused_and_changes_nothing() -> None:
    for dense in (False, True):
        acc = MeanAccumulator(D)
        idx = None if dense else np.array([1, 5], dtype=np.int64)
        vals = np.full(D if dense else 2, 1e308)
        acc.add(Update("dense" if dense else "topk", D, idx, vals), 1.0)
        x = np.arange(D, dtype=np.float64)
        before = x.tobytes()
        with np.errstate(over="ignore"):
            res = acc.step(x, -1e10)  # 1e308 * 1e10 overflows to inf
        assert not res.finite and res.changed.size == 0
        assert x.tobytes() == before
        acc.reset()
        assert not acc.acc.any()


def test_mean_export_flushes_and_restore_steps_the_same() -> None:
    ups = _updates(7, 6)
    acc = MeanAccumulator(D)
    for u, w in ups:
        acc.add(u, w)
    saved = acc.export()
    restored = MeanAccumulator.restore(saved)
    x1, x2 = np.ones(D), np.ones(D)
    assert acc.step(x1, 0.1).finite and restored.step(x2, 0.1).finite
    assert x1.tobytes() == x2.tobytes() == _reference(np.ones(D), ups, 0.1).tobytes()
    with pytest.raises(ValueError, match="nan or inf"):
        MeanAccumulator.restore(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="vector"):
        MeanAccumulator.restore(np.zeros((2, 2)))


def test_ef21_mirror_sums_states_and_steps_with_sum_h() -> None:
    rng = np.random.default_rng(3)
    mirror = EF21Mirror(D)
    states = {a: np.zeros(D) for a in ("a", "b")}
    sum_h = np.zeros(D)  # every change added once, in arrival order
    for k in range(8):
        agent = "ab"[k % 2]
        u = compress(rng.standard_normal(D), "topk", 5)
        mirror.apply(agent, u)
        u.add_to(states[agent])
        u.add_to(sum_h)
    assert all(np.array_equal(mirror.h[a], states[a]) for a in states)
    assert mirror.sum_h is not None and mirror.sum_h.tobytes() == sum_h.tobytes()
    x0 = rng.standard_normal(D)
    x = x0.copy()
    coef = 0.5 * 1.0 / 2
    res = mirror.step(x, coef)
    expected = x0 - coef * sum_h
    assert res.finite and x.tobytes() == expected.tobytes()
    assert np.array_equal(res.changed, np.flatnonzero(expected != x0))
    mirror.reset_agent("a")
    assert "a" not in mirror.h
    mirror.reset_agent("b")
    assert mirror.sum_h is not None and not mirror.sum_h.any()  # exactly zero, no residue


def test_ef21_export_restore_round_trip_and_refusals() -> None:
    mirror = EF21Mirror(D)
    with pytest.raises(ValueError, match="before any agent"):
        mirror.step(np.zeros(D), 1.0)
    agents, h, sum_h = mirror.export()
    assert agents == () and h.shape == (0, D) and sum_h.shape == (0,)
    assert EF21Mirror.restore(D, agents, h, sum_h).sum_h is None
    mirror.apply("a", Update("topk", D, np.array([3], np.int64), np.array([1e308])))
    again = EF21Mirror.restore(D, *mirror.export())
    assert np.array_equal(again.h["a"], mirror.h["a"])
    x = np.zeros(D)
    with np.errstate(over="ignore"):
        assert not again.step(x, -1e10).finite and not x.any()
    with pytest.raises(ValueError, match="shapes"):
        EF21Mirror.restore(D, ("a", "b"), np.zeros((1, D)), np.zeros(D))


def test_sorted_unique_merges_sorted_parts() -> None:
    parts = [np.array([1, 4, 9]), np.array([0, 4]), np.array([], dtype=np.int64)]
    assert sorted_unique(parts).tolist() == [0, 1, 4, 9]
    assert sorted_unique([]).size == 0
    assert sorted_unique([np.array([], dtype=np.int64)] * 2).size == 0
