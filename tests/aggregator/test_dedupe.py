"""The de-duplication keys: lookups, forgetting one agent, pruning old rounds, and the rows a
checkpoint stores."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.engine.dedupe import SeenKeys


def test_a_key_is_seen_once_added_and_per_agent() -> None:
    seen = SeenKeys()
    assert not seen.contains("a", 0, 0)
    seen.add("a", 0, 0, 0)
    assert seen.contains("a", 0, 0)
    assert not seen.contains("a", 0, 1) and not seen.contains("a", 1, 0)
    assert not seen.contains("b", 0, 0)


def test_forget_drops_one_agent_from_sets_and_rows() -> None:
    seen = SeenKeys()
    for r in range(3):
        seen.add("a", 0, r, 0)
        seen.add("b", 1, r, 5)
    seen.forget("a", 0)
    assert not any(seen.contains("a", r, 0) for r in range(3))
    assert all(seen.contains("b", r, 5) for r in range(3))
    assert seen.rows().tolist() == [[1, 0, 5], [1, 1, 5], [1, 2, 5]]


@pytest.mark.parametrize("jump", [1, 10, 200])  # one by one, and the bulk path (> 64 rounds)
def test_prune_forgets_rounds_below_the_floor(jump: int) -> None:
    seen = SeenKeys()
    for r in range(300):
        seen.add("a", 0, r, r % 7)
    floor = 0
    while floor + jump <= 250:
        floor += jump
        seen.prune(floor)
    rows = seen.rows()
    assert rows[:, 1].min() == floor and len(rows) == 300 - floor
    assert not seen.contains("a", floor - 1, (floor - 1) % 7)
    assert seen.contains("a", floor, floor % 7)
    seen.prune(floor - 5)  # the floor never goes back
    assert len(seen.rows()) == 300 - floor


def test_the_log_stays_bounded_under_steady_pruning() -> None:
    seen = SeenKeys()
    for r in range(20_000):
        seen.add("a", 0, r, 0)
        seen.prune(r - 10)
    assert len(seen._log) <= 3 * 3 * 4096  # compacted as it grows


def test_rows_restore_round_trip() -> None:
    seen = SeenKeys()
    seen.add("a", 0, 4, 1)
    seen.add("b", 1, 4, 2)
    seen.add("a", 0, 5, 0)
    rows = seen.rows()
    assert rows.dtype == np.int64 and rows.shape == (3, 3)
    again = SeenKeys.restore(rows, ["a", "b"])
    assert again.rows().tolist() == rows.tolist()
    assert again.contains("b", 4, 2) and again.contains("a", 5, 0)
    assert not again.contains("b", 5, 0)


def test_restore_refuses_rows_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match=r"shape \(k, 3\)"):
        SeenKeys.restore(np.zeros((2, 2), np.int64), ["a"])
    with pytest.raises(ValueError, match="agent index 3"):
        SeenKeys.restore(np.array([[3, 0, 0]], np.int64), ["a"])
