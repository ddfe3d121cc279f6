"""`aggregator simulate --multicast`: the LoRaWAN members receive versions on one group;
the time splits into uplink and downlink waits; the audit checks every limit."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from aggregator.sim import cli
from aggregator.sim.audit import Margin, audit, worst
from aggregator.sim.problem import on_group
from edge_agent.links.catalog import resolve_profile

TINY = ["--rows", "300", "--features", "400", "--seed", "3", "--max-rounds", "400"]
FLEET = ["--agents", "2", "--profiles", "lorawan_eu868_dr5_sf7,lorawan_eu868_dr0_sf12",
         "--methods", "cat-signtopk+ef21", "--targets", "0.1"]  # fmt: skip
GROUP = "lorawan_eu868_dr0_sf12_mcast_c_dr3"
DUTY, FUP = "uplink duty cycle", "uplink fair-use cap"


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


def test_every_limit_is_reported_with_its_floor(
    runs: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    for rec in runs:
        law = rec["law"]
        assert {m["limit"] for m in law} >= {DUTY, "unicast daily cap"}
        # every limit kept: none needs a longer run than the one checked
        assert all(0.0 <= m["floor_s"] <= rec["law_elapsed_s"] for m in law)
        top = max(law, key=lambda m: m["floor_s"])
        assert rec["law_floor_s"] == top["floor_s"] > 0.0
        assert rec["law_floor_limit"] == f"{top['limit']} of {top['who']}"


def test_a_private_network_is_paced_by_its_gateway_and_keeps_every_limit(
    tmp_path: Path, runs: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    private = _run(tmp_path, "private", "--profiles",
                   "lorawan_eu868_dr5_sf7_private,lorawan_eu868_dr0_sf12_private")  # fmt: skip
    unicast, _ = runs
    assert private["rounds"] is not None
    assert private["sim_time_s"] < unicast["sim_time_s"] / 10  # no TTN caps to wait for
    (gw,) = (m for m in private["law"] if m["limit"] == "gateway duty cycle")
    assert gw["who"] == "lorawan_eu868" and gw["margin"] >= 0.0
    assert private["audit_worst_margin"] >= 0.0, private["audit_worst_limit"]
    assert not [m for m in private["law"] if m["limit"] in (FUP, "unicast daily cap")]


def test_rx2_answers_share_the_gateways_ten_percent_apart_from_rx1(tmp_path: Path) -> None:
    """SF12 members answered in RX2 and SF7 members in RX1 on one private network: the
    audit checks two gateway budgets, the RX2 sub-band's 10 % and RX1's 1 % per uplink
    sub-band, and both are kept (the engine paces them apart)."""
    rec = _run(tmp_path, "rx2", "--agents", "4", "--profiles",
               "lorawan_eu868_dr5_sf7_private,lorawan_eu868_dr0_sf12_rx2_private")  # fmt: skip
    assert rec["rounds"] is not None
    gateways = {m["who"]: m for m in rec["law"] if m["limit"] == "gateway duty cycle"}
    assert set(gateways) == {"lorawan_eu868", "lorawan_eu868/g3"}
    assert all(m["margin"] >= 0.0 for m in gateways.values())
    assert rec["audit_worst_margin"] >= 0.0, rec["audit_worst_limit"]


def test_the_table_names_each_runs_binding_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*TINY, *FLEET, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "law_floor_s" in out
    (line,) = [ln for ln in out.splitlines() if "law floor of cat-signtopk+ef21" in ln]
    assert " of a00" in line and "checked over" in line  # the limit and whose it is


def test_a_limits_floor_is_the_shortest_run_that_keeps_it() -> None:
    ttn = resolve_profile("lorawan_eu868_dr0_sf12")
    (fup,) = (m for m in audit([_radio(ttn, 91.0)], {}, {}, 86_400.0) if m.limit == FUP)
    # 91 s at 30 s a day, less the one day's allowance the audit adds: 2 days and 1 s of 30
    assert fup.floor_s == pytest.approx(91.0 / 30.0 * 86_400.0 - 86_400.0)
    assert fup.margin < 0.0  # in the one day it ran, the 91 s broke the cap
    (idle,) = (m for m in audit([_radio(ttn, 0.0)], {}, {}, 86_400.0) if m.limit == FUP)
    assert idle.floor_s == 0.0
    assert Margin("cap", "a", 1.0, 0.0).floor_s == math.inf  # a limit that allows nothing


def test_a_broken_limit_has_a_negative_margin() -> None:
    kept, broken = Margin("cap", "a", 5.0, 10.0), Margin("cap", "b", 12.0, 10.0)
    assert worst([kept, broken]) is broken and broken.margin < 0 < kept.margin


def _radio(profile: Any, up_airtime_s: float) -> Any:
    """An agent as the audit reads it: its profile, id and ledger."""
    down = SimpleNamespace(airtime_s=0.0, packets=0)
    ledger = SimpleNamespace(up=SimpleNamespace(airtime_s=up_airtime_s), down=down)
    return SimpleNamespace(profile=profile, config=SimpleNamespace(agent_id="a"), ledger=ledger)


def test_the_uplink_audit_allows_each_sub_band_its_duty_cycle() -> None:
    two = resolve_profile("lorawan_eu868_dr0_sf12")  # TTN's plan: two 1 % sub-bands
    one = dataclasses.replace(two, duty_cycle_bands=1)
    elapsed_s, used_s = 10_000.0, 150.0  # 1.5 % of the time plus the hour's allowance
    (m2,) = (m for m in audit([_radio(two, used_s)], {}, {}, elapsed_s) if m.limit == DUTY)
    (m1,) = (m for m in audit([_radio(one, used_s)], {}, {}, elapsed_s) if m.limit == DUTY)
    assert m2.allowed == pytest.approx(0.02 * (elapsed_s + 3600.0))
    assert m2.margin > 0 > m1.margin


def test_a_short_round_deadline_does_not_wait_for_the_slow_member(tmp_path: Path) -> None:
    fast = _run(tmp_path, "fast", "--multicast", GROUP, "--cadence", "--round-deadline", "10")
    slow = _run(tmp_path, "slow", "--multicast", GROUP, "--cadence", "--round-deadline", "1e5")
    assert fast["rounds"] is not None and slow["rounds"] is not None
    assert fast["sim_time_s"] < slow["sim_time_s"] / 2  # the SF12 member's silence, skipped
    # the versions advance without it: more of them, most without the SF12 member's change
    assert fast["rounds"] > slow["rounds"]
    assert min(fast["audit_worst_margin"], slow["audit_worst_margin"]) >= 0.0


def test_the_round_deadline_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*TINY, *FLEET, "--no-progress", "--round-deadline", "0"]) == 2
    assert "--round-deadline must be > 0" in capsys.readouterr().err


def test_the_audit_checks_the_fair_use_cap_on_uplink_airtime() -> None:
    ttn = resolve_profile("lorawan_eu868_dr0_sf12")  # The Things Network: 30 s a day
    assert ttn.uplink_airtime_per_day_s == 30.0
    elapsed_s = 2 * 86_400.0  # two days: 30 s for each, plus one day's allowance
    (kept,) = (m for m in audit([_radio(ttn, 89.0)], {}, {}, elapsed_s) if m.limit == FUP)
    (broken,) = (m for m in audit([_radio(ttn, 91.0)], {}, {}, elapsed_s) if m.limit == FUP)
    assert kept.allowed == pytest.approx(90.0)
    assert kept.margin > 0 > broken.margin
    private = dataclasses.replace(ttn, uplink_airtime_per_day_s=None)
    assert not [m for m in audit([_radio(private, 91.0)], {}, {}, elapsed_s) if m.limit == FUP]


def test_the_fair_use_cap_paces_the_uplink_when_below_the_duty_cycle() -> None:
    ttn = resolve_profile("lorawan_eu868_dr0_sf12")
    assert ttn.uplink_duty_share == pytest.approx(30.0 / 86_400.0)  # below 2 %
    assert ttn.silence_s(30.0) == pytest.approx(86_400.0 - 30.0)  # 30 s on air: a day
    loose = dataclasses.replace(ttn, uplink_airtime_per_day_s=86_400.0)
    assert loose.uplink_duty_share == pytest.approx(0.02)  # the duty cycle binds


def test_a_group_on_a_private_network_server_has_no_fair_use_cap() -> None:
    member = on_group(resolve_profile("lorawan_eu868_dr0_sf12"), resolve_profile(GROUP))
    assert member.uplink_airtime_per_day_s is None
    assert member.uplink_duty_share == pytest.approx(0.02)


THREE = "lorawan_eu868_dr0_sf12_mcast_c_dr3_3band"  # a private plan with a third 1 % sub-band


def test_the_groups_channel_plan_replaces_the_members() -> None:
    sf12, sf7 = resolve_profile("lorawan_eu868_dr0_sf12"), resolve_profile("lorawan_eu868_dr5_sf7")
    for member in (on_group(sf12, resolve_profile(THREE)), on_group(sf7, resolve_profile(THREE))):
        assert member.duty_cycle_bands == 3
        assert member.uplink_duty_share == pytest.approx(0.03)
    assert on_group(sf12, resolve_profile(GROUP)).duty_cycle_bands == 2  # TTN's plan
    ble = resolve_profile("ble5_2m_dle_notify")  # not on the group: untouched
    assert on_group(ble, resolve_profile(THREE)) is ble


def test_a_third_sub_band_shortens_the_run_and_keeps_every_limit(
    runs: tuple[dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    _, two = runs
    three = _run(tmp_path, "three", "--multicast", THREE)
    assert three["audit_worst_margin"] >= 0.0, three["audit_worst_limit"]
    assert three["rounds"] == two["rounds"] and three["total_bytes"] == two["total_bytes"]
    # the SF12 member's silence binds: 32.3 t instead of 49 t per update
    assert three["up_wait_s"] < 0.8 * two["up_wait_s"]
    assert three["sim_time_s"] < two["sim_time_s"]
