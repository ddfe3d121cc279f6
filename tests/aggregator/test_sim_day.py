"""Issue 19's first goal at the size users run (d = 47,236, 10,000 rows, the mixed fleet of
docs/results.md): on a multicast group whose private network gives the members a third
1 % uplink sub-band, at cadence with EF21's step at 0.45/L, the compressed run reaches
1e-2 within a day with at least 34x fewer bytes, both ways, than dense gradient descent,
and every legal limit the simulator models holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from aggregator.sim import cli

pytestmark = pytest.mark.slow

FLEET = ["--rows", "10000", "--agents", "10", "--targets", "1e-2", "--no-progress",
         "--profiles", "lorawan_eu868_dr5_sf7,lorawan_eu868_dr0_sf12,ble5_2m_dle_notify,"
         "nbiot_udp_psm_rai"]  # fmt: skip
THREE = "lorawan_eu868_dr0_sf12_mcast_c_dr3_3band"
DAY_S = 86_400.0


def _records(tmp_path: Path, name: str, *extra: str) -> list[dict[str, Any]]:
    out = tmp_path / f"{name}.json"
    assert cli.main([*FLEET, "--json", str(out), *extra]) == 0
    recs = json.loads(out.read_text())
    assert isinstance(recs, list)
    return recs


def test_the_mixed_fleet_trains_in_a_day_at_34x(tmp_path: Path) -> None:
    (dense,) = _records(tmp_path, "dense", "--methods", "dense", "--downlink", "exact")
    (cat,) = _records(tmp_path, "cat", "--methods", "cat-signtopk+ef21", "--multicast", THREE,
                      "--cadence", "--round-deadline", "4500", "--ef21-step-factor", "0.45")  # fmt: skip
    assert dense["rounds"] is not None and cat["rounds"] is not None
    assert cat["d"] == 47_236 == dense["d"]
    assert cat["sim_time_s"] <= DAY_S
    assert cat["total_bytes"] * 34 <= dense["total_bytes"]
    assert cat["audit_worst_margin"] >= 0.0, cat["audit_worst_limit"]
    assert dense["sim_time_s"] > 30 * DAY_S  # dense gradient descent, for scale: months


def test_unicast_on_the_things_network_waits_for_its_policy(tmp_path: Path) -> None:
    """The same fleet unicast, defaults (docs/results.md "Unicast on The Things Network:
    what the law allows"): the run takes as long as The Things Network's caps force for
    what its SF12 members send and receive, and those alone forbid 60 days."""
    (cat,) = _records(tmp_path, "unicast", "--methods", "cat-signtopk+ef21")
    assert cat["rounds"] is not None and cat["audit_worst_margin"] >= 0.0
    # the engine schedules to within 5 % of the law's floor: the caps, not the rounds, wait
    assert cat["law_floor_s"] >= 0.95 * cat["law_elapsed_s"]
    assert cat["law_floor_limit"].startswith("unicast daily cap of ")
    sf12 = {m["who"] for m in cat["law"] if m["limit"] == "uplink fair-use cap"
            and m["used"] > 1_000.0}  # fmt: skip
    assert len(sf12) == 3  # agents 1, 5, 9: the SF12 members
    for m in cat["law"]:
        if m["who"] in sf12 and m["limit"] in ("uplink fair-use cap", "unicast daily cap"):
            assert m["floor_s"] > 60 * DAY_S, m  # each of the two caps alone: over 60 days


def test_unicast_on_a_private_network_trains_within_60_days(tmp_path: Path) -> None:
    """The same fleet unicast on a private network server (the LoRaWAN members' profiles
    without The Things Network's policy): the gateway's duty cycle paces the downlinks,
    and the run takes well under 60 days, every limit held."""
    profiles = ("lorawan_eu868_dr5_sf7_private,lorawan_eu868_dr0_sf12_private,"
                "ble5_2m_dle_notify,nbiot_udp_psm_rai")  # fmt: skip
    (cat,) = _records(tmp_path, "private", "--methods", "cat-signtopk+ef21", "--profiles", profiles)
    assert cat["rounds"] is not None and cat["d"] == 47_236
    assert cat["sim_time_s"] <= 60 * DAY_S
    assert cat["audit_worst_margin"] >= 0.0, cat["audit_worst_limit"]
    assert cat["law_floor_limit"] == "gateway duty cycle of lorawan_eu868"
