"""`aggregator simulate --multicast`: the LoRaWAN members receive versions on one group;
the time splits into uplink and downlink waits; the audit checks every limit."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from aggregator.sim import cli
from aggregator.sim.audit import Margin, worst

TINY = ["--rows", "300", "--features", "400", "--seed", "3", "--max-rounds", "400"]
FLEET = ["--agents", "2", "--profiles", "lorawan_eu868_dr5_sf7,lorawan_eu868_dr0_sf12",
         "--methods", "cat-signtopk+ef21", "--targets", "0.1"]  # fmt: skip
GROUP = "lorawan_eu868_dr0_sf12_mcast_c_dr3"


def _run(tmp_path: Path, name: str, *extra: str) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    assert cli.main([*TINY, *FLEET, "--no-progress", "--json", str(out), *extra]) == 0
    (rec,) = json.loads(out.read_text())
    assert isinstance(rec, dict)
    return rec


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("mc")
    return _run(tmp, "unicast"), _run(tmp, "group", "--multicast", GROUP)


def test_a_group_reaches_the_target_sooner_than_unicast_caps(
    runs: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    unicast, group = runs
    assert group["rounds"] is not None and unicast["rounds"] is not None
    assert group["sim_time_s"] < unicast["sim_time_s"] / 10


def test_the_time_splits_into_uplink_and_downlink_waits(
    runs: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    for rec in runs:
        assert math.isclose(rec["up_wait_s"] + rec["down_wait_s"], rec["sim_time_s"])


def test_every_limit_is_kept(runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    for rec in runs:
        assert rec["audit_worst_margin"] >= 0.0, rec["audit_worst_limit"]


def test_a_broken_limit_has_a_negative_margin() -> None:
    kept, broken = Margin("cap", "a", 5.0, 10.0), Margin("cap", "b", 12.0, 10.0)
    assert worst([kept, broken]) is broken and broken.margin < 0 < kept.margin
