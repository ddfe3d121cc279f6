"""`eta_at_round_5_s`: the ETA `/status` would have shown at version 5, next to the time
the run actually took (aggregator/sim/report.py, aggregator/web/eta.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from aggregator.sim import cli
from aggregator.sim.experiment import Trace
from aggregator.sim.report import ETA_VERSION, eta_at


def _result(subopt: list[float], times: list[float]) -> Any:
    return SimpleNamespace(trace=Trace(subopt=subopt, sim_time_s=times))


def test_a_linear_run_at_a_steady_pace_is_predicted_exactly() -> None:
    rho, per_version_s = 0.8, 100.0
    subopt = [rho**k for k in range(40)]
    times = [per_version_s * k for k in range(40)]
    reached = next(k for k, s in enumerate(subopt) if s <= 1e-2)
    assert eta_at(_result(subopt, times), 1e-2) == pytest.approx(times[reached])


def test_the_prediction_follows_the_pace_of_the_first_versions() -> None:
    subopt = [0.8**k for k in range(40)]
    slow = eta_at(_result(subopt, [200.0 * k for k in range(40)]), 1e-2)
    fast = eta_at(_result(subopt, [100.0 * k for k in range(40)]), 1e-2)
    assert slow is not None and fast is not None and slow == pytest.approx(2 * fast)


def test_unknown_before_the_version_and_a_midpoint_while_the_decreases_grow() -> None:
    assert eta_at(_result([1.0, 0.9, 0.8], [0.0, 1.0, 2.0]), 1e-2) is None
    growing = [1.0 - 0.01 * k * k for k in range(ETA_VERSION + 1)]  # decreases 0.01, 0.03, ...
    # at version 5 (0.75): 0.74 left; the last two decreases' mean 0.08 held gives 10
    # versions; the suboptimality's ratio over the last two (0.75 / 0.91) held gives 45
    # (floor 0: the optimum); the ETA is their geometric mean, 21 versions of 1 s
    high = math.ceil(math.log(1e-2 / 0.75) / (0.5 * math.log(0.75 / 0.91)))
    assert high == 45
    eta = eta_at(_result(growing, [float(k) for k in range(ETA_VERSION + 1)]), 1e-2)
    assert eta == pytest.approx(ETA_VERSION + round(math.sqrt(10 * high)))


def test_records_carry_the_eta_and_its_ratio(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    argv = ["--rows", "300", "--features", "400", "--seed", "3", "--agents", "2",
            "--profile", "nbiot_udp_psm_rai", "--methods", "dense", "--targets", "0.1",
            "--no-progress", "--json", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    (rec,) = json.loads(out.read_text())
    eta = rec[f"eta_at_round_{ETA_VERSION}_s"]
    assert eta is not None and 0 < eta < rec["sim_time_s"] * 10
    assert rec["eta_ratio"] == pytest.approx(eta / rec["sim_time_s"])
    assert isinstance(rec["eta_early"], bool)
    assert rec["eta_low_ratio"] <= rec["eta_ratio"] <= rec["eta_high_ratio"]


@pytest.mark.parametrize(
    ("profile", "shown"), [("paper_payload_bits", False), ("nbiot_udp_psm_rai", True)]
)
def test_the_table_shows_the_eta_only_where_time_passes(
    capsys: pytest.CaptureFixture[str], profile: str, shown: bool
) -> None:
    argv = ["--rows", "300", "--features", "400", "--seed", "3", "--agents", "2",
            "--profile", profile, "--methods", "dense", "--targets", "0.1", "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0
    assert (f"eta@{ETA_VERSION}_s" in capsys.readouterr().out) is shown


def test_the_table_marks_an_eta_made_while_the_decreases_grew() -> None:
    from aggregator.sim.report import _cell

    key = f"eta_at_round_{ETA_VERSION}_s"
    assert _cell({key: 1234.0, "eta_early": True}, key).startswith("~")
    assert not _cell({key: 1234.0, "eta_early": False}, key).startswith("~")
    assert _cell({"sim_time_s": 1234.0, "eta_early": True}, "sim_time_s") == _cell(
        {"sim_time_s": 1234.0}, "sim_time_s"
    )
