"""Minibatch sampling (edge_agent.numerics.sampling): sizes, without replacement per epoch."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.numerics.sampling import EpochSampler, PassSampler, batch_rows, batches_per_pass


def test_batch_rows_reads_a_fraction_or_a_row_count() -> None:
    assert batch_rows(0.1, 1000) == 100
    assert batch_rows(0.0001, 1000) == 1
    assert batch_rows(64, 1000) == 64
    assert batch_rows(5000, 1000) == 1000


@pytest.mark.parametrize("bad", [0.0, -1.0, 2.5])
def test_batch_rows_refuses_what_is_neither(bad: float) -> None:
    with pytest.raises(ValueError, match="batch size"):
        batch_rows(bad, 100)


def test_every_row_once_per_epoch_when_batches_divide_the_shard() -> None:
    s = EpochSampler(100, 10, np.random.default_rng(0))
    rows = np.concatenate([s.next() for _ in range(10)])
    assert np.array_equal(np.sort(rows), np.arange(100))


def test_a_batch_crossing_an_epoch_has_distinct_rows_and_epochs_stay_complete() -> None:
    s = EpochSampler(10, 4, np.random.default_rng(1))
    batches = [s.next() for _ in range(5)]  # 20 rows: epochs of 10 rows, two crossings
    assert all(b.size == 4 and np.unique(b).size == 4 for b in batches)
    # 20 rows drawn = two whole epochs: every row exactly twice
    assert np.array_equal(np.bincount(np.concatenate(batches), minlength=10), np.full(10, 2))


def test_the_same_seed_draws_the_same_batches() -> None:
    a = EpochSampler(50, 7, np.random.default_rng(3))
    b = EpochSampler(50, 7, np.random.default_rng(3))
    assert all(np.array_equal(a.next(), b.next()) for _ in range(20))


def test_a_pass_splits_into_whole_batches_that_differ_by_at_most_a_row() -> None:
    s = PassSampler(103, 10, np.random.default_rng(4))
    first = [s.next() for _ in range(10)]
    assert {b.size for b in first} == {10, 11}
    assert np.array_equal(np.sort(np.concatenate(first)), np.arange(103))
    assert s.passes == 1
    second = [s.next() for _ in range(10)]
    assert s.passes == 2
    assert np.array_equal(np.sort(np.concatenate(second)), np.arange(103))
    assert not all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


def test_the_same_seed_draws_the_same_passes() -> None:
    a = PassSampler(40, 4, np.random.default_rng(9))
    b = PassSampler(40, 4, np.random.default_rng(9))
    assert all(np.array_equal(a.next(), b.next()) for _ in range(9))


@pytest.mark.parametrize(("fraction", "parts"), [(0.5, 2), (0.25, 4), (0.1, 10), (0.05, 20)])
def test_batches_per_pass_of_a_fraction(fraction: float, parts: int) -> None:
    assert batches_per_pass(fraction) == parts


@pytest.mark.parametrize(("bad", "needle"), [(64.0, "fraction"), (1.0, "fraction"),
                                             (0.3, "whole number")])  # fmt: skip
def test_batches_per_pass_refuses_what_does_not_split_a_pass(bad: float, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        batches_per_pass(bad)
