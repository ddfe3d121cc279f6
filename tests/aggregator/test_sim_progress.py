"""`aggregator simulate`'s progress bar redraws with a carriage return on a terminal only."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any, cast

from aggregator.sim.report import ProgressBar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(stream: io.StringIO) -> str:
    bar = ProgressBar(stream, total_runs=2)
    for label in ("dense", "cat-topk"):
        bar.begin(label, max_rounds=100, goal=1e-3)
        result = SimpleNamespace(rounds_run=40, trace=SimpleNamespace(subopt=[1e-3]), wall_s=1.5)
        bar.end(cast(Any, result))
    return stream.getvalue()


def test_a_log_gets_one_plain_line_per_run() -> None:
    text = _run(io.StringIO())
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 2 and lines[0].startswith("[1/2] dense") and "round     40" in lines[0]


def test_a_terminal_gets_the_bar_redrawn_in_place() -> None:
    text = _run(Terminal())
    assert text.count("\r") >= 2 and text.count("\n") == 2
