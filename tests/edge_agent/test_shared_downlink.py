"""Tests for shared downlinks (edge_agent.links.shared) and the shipped multicast profiles."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent.errors import ProfileError
from edge_agent.links.catalog import load_profile, resolve_profile
from edge_agent.links.profiles import parse_profile, profile_to_json
from edge_agent.links.shared import SharedDownlink
from edge_agent.protocol.fragments import FRAME_HEADER_BYTES, encode_fragments

REPO_PROFILES = Path(__file__).resolve().parents[2] / "cost_profiles"
MULTICAST = {
    "lorawan_eu868_dr0_sf12_mcast_c_dr3": "lorawan_eu868_dr0_sf12",
    "lorawan_eu868_dr0_sf12_mcast_b_dr3": "lorawan_eu868_dr0_sf12",
    "lorawan_eu868_dr0_sf12_mcast_c_dr3_3band": "lorawan_eu868_dr0_sf12",
    "lorawan_eu868_dr0_sf12_mcast_b_dr3_3band": "lorawan_eu868_dr0_sf12",
    "lorawan_us915_dr0_sf10_mcast_c_dr10": "lorawan_us915_dr0_sf10",
    "lorawan_us915_dr0_sf10_mcast_b_dr10": "lorawan_us915_dr0_sf10",
    "ble5_2m_dle_notify_periodic_adv": "ble5_2m_dle_notify",
}
UNSHARED = sorted(p.stem for p in REPO_PROFILES.glob("*.json") if p.stem not in MULTICAST)
SIZES = np.arange(0, 6000, 7)
DOC = Path(__file__).resolve().parents[2] / "docs" / "multicast.md"


def _shared(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "group": "test group",
        "delivery": "continuous",
        "max_payload_bytes": 115,
        "frame_airtime_s": 0.1444,
        "byte_airtime_s": 0.004551,
        "sender_duty_cycle": 0.1,
        "rx_power_w": 0.0363,
        "listen_power_w": 0.0363,
    }
    data.update(overrides)
    return data


def _fields(obj: object, skip: set[str]) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name not in skip}  # type: ignore[arg-type]


def _profile_with(shared: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REPO_PROFILES / "lorawan_eu868_dr0_sf12.json").read_text())
    data["downlink"]["shared"] = shared
    return data


@pytest.mark.parametrize("stem", UNSHARED)
def test_profiles_without_a_shared_part_have_none(stem: str) -> None:
    profile = load_profile(REPO_PROFILES / f"{stem}.json")
    assert profile.shared_downlink is None
    with pytest.raises(ValueError, match="has no shared downlink"):
        profile.shared_delivery(100)


@pytest.mark.parametrize(("stem", "base"), MULTICAST.items())
def test_multicast_profile_keeps_the_unicast_profile_it_names(stem: str, base: str) -> None:
    mc, uni = resolve_profile(stem), resolve_profile(base)
    assert base in mc.description
    # the group needs a private network server (no TTN fair-use cap on its uplinks either)
    skip = {"name", "description", "sources", "notes", "downlink", "estimated"}
    skip |= {"uplink_airtime_per_day_s", "duty_cycle_bands"}
    assert mc.uplink_airtime_per_day_s is None
    # ... and its channel plan: TTN's two sub-bands, or a third where the name says so
    assert mc.duty_cycle_bands == (3 if stem.endswith("_3band") else uni.duty_cycle_bands)
    assert _fields(mc, skip) == _fields(uni, skip)
    assert mc.downlink is not None and uni.downlink is not None
    assert _fields(mc.downlink, {"shared"}) == _fields(uni.downlink, {"shared"})
    uni = dataclasses.replace(uni, uplink_airtime_per_day_s=None,
                              duty_cycle_bands=mc.duty_cycle_bands)  # fmt: skip
    for size in (0, 100, 1700, 10_000):
        assert mc.message_cost(size) == uni.message_cost(size)
        assert mc.downlink_cost(size) == uni.downlink_cost(size)
    assert set(uni.sources) <= set(mc.sources)
    assert {e for e in mc.estimated if not e.startswith("duty_cycle_bands")} <= set(uni.estimated)


@pytest.mark.parametrize("stem", MULTICAST)
def test_shipped_shared_downlinks_are_sourced_and_monotone(stem: str) -> None:
    profile = resolve_profile(stem)
    shared = profile.shared_downlink
    assert shared is not None and shared.estimated and shared.notes
    keys = {s.split(":")[0] for s in profile.sources}
    for key in ("LMN-CB", "TS005", "TS004") if stem.startswith("lorawan_") else ("BT-CORE",):
        assert key in keys, key
    for values in (shared.airtime_s(SIZES), shared.busy_s(SIZES), shared.member_energy_j(SIZES)):
        assert np.all(np.isfinite(values)) and np.all(values > 0)
        assert np.all(np.diff(values) >= -1e-12)
    assert np.all(shared.busy_s(SIZES) >= shared.airtime_s(SIZES))


@pytest.mark.parametrize("stem", MULTICAST)
def test_delivery_matches_the_vectorised_functions_and_the_codec(stem: str) -> None:
    profile = resolve_profile(stem)
    shared = profile.shared_downlink
    assert shared is not None
    for size in (0, 1, 107, 108, 1700, 5000):
        d = profile.shared_delivery(size)
        frames = encode_fragments(bytes(size), 1, shared.max_payload_bytes, d.parity_frames)
        assert len(frames) == d.frames and sum(map(len, frames)) == d.frame_bytes
        assert max(map(len, frames)) <= shared.max_payload_bytes
        assert d.bytes_on_air == d.frame_bytes + d.frames * shared.per_packet_overhead_bytes
        sizes = np.array([size])
        assert d.airtime_s == pytest.approx(shared.airtime_s(sizes)[0])
        assert d.busy_s == pytest.approx(shared.busy_s(sizes)[0])
        assert d.energy_j == pytest.approx(shared.member_energy_j(sizes)[0])
        assert d.energy_j == pytest.approx(d.rx_energy_j + d.listen_energy_j)


def test_class_c_eu868_by_hand() -> None:
    d = resolve_profile("lorawan_eu868_dr0_sf12_mcast_c_dr3").shared_delivery(1700)
    # 1701 padded bytes in 108 B blocks: 16 data frames, ceil(0.2 * 16) = 4 parity frames
    assert (d.data_frames, d.parity_frames) == (16, 4)
    assert d.frame_bytes == 1701 + 4 * 108 + 20 * FRAME_HEADER_BYTES
    airtime = 20 * 0.1444 + 0.004551 * d.frame_bytes
    assert d.airtime_s == pytest.approx(airtime)
    assert d.busy_s == pytest.approx(airtime / 0.1)  # the gateway's 10 % on 869.525 MHz
    last = 0.1444 + 0.004551 * (108 + FRAME_HEADER_BYTES)
    listen = 1.0 + airtime / 0.1 - 9 * last - airtime
    assert d.listen_s == pytest.approx(listen)
    assert d.energy_j == pytest.approx((airtime + listen) * 0.0363)


def test_class_b_eu868_by_hand() -> None:
    d = resolve_profile("lorawan_eu868_dr0_sf12_mcast_b_dr3").shared_delivery(1700)
    # 20 frames, one per 7.68 s ping slot (slower than the 10 % duty cycle allows)
    assert d.busy_s == pytest.approx(20 * 7.68)
    listen = 20 * 0.03277 + 2 * 0.1854  # a window per slot, two beacons in 153.6 s
    assert d.listen_s == pytest.approx(listen)
    assert d.energy_j == pytest.approx((d.airtime_s + listen) * 0.0363)


def test_class_b_costs_a_member_less_than_class_c() -> None:
    c = resolve_profile("lorawan_eu868_dr0_sf12_mcast_c_dr3").shared_delivery(1700)
    b = resolve_profile("lorawan_eu868_dr0_sf12_mcast_b_dr3").shared_delivery(1700)
    assert b.airtime_s == c.airtime_s and b.busy_s > c.busy_s
    assert b.energy_j < c.energy_j / 5


def test_no_duty_cycle_means_busy_is_airtime() -> None:
    d = resolve_profile("lorawan_us915_dr0_sf10_mcast_c_dr10").shared_delivery(1700)
    assert d.busy_s == d.airtime_s
    assert d.listen_s == pytest.approx(1.0)  # only the session guard


def test_group_beats_unicast_under_the_daily_cap() -> None:
    profile = resolve_profile("lorawan_eu868_dr0_sf12_mcast_c_dr3")
    unicast = profile.downlink_cost(1700)
    cap = profile.max_downlinks_per_day
    assert cap == 10 and unicast.packets == 34
    days_per_member = math.ceil(unicast.packets / cap)
    group = profile.shared_delivery(1700)
    assert days_per_member == 4 and group.busy_s < 3600
    shared = profile.shared_downlink
    assert shared is not None and shared.days_at_cap(1700) is None
    capped = dataclasses.replace(shared, max_messages_per_day=10)
    assert capped.days_at_cap(1700) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("shared", "reason"),
    [
        (_shared(delivery="slotted"), "slot_period_s: required for a slotted delivery"),
        (_shared(slot_period_s=1.0), "slot_period_s: required for a slotted delivery"),
        (_shared(max_payload_bytes=7), r"max_payload_bytes must be > 7 \(the fragment header\)"),
        (_shared(sync_period_s=128.0), "belong to a slotted delivery"),
        (
            _shared(delivery="slotted", slot_period_s=1.0, session_guard_s=1.0),
            "session_guard_s belongs to a continuous delivery",
        ),
        (_shared(redundancy=1.5), "downlink.shared.redundancy must be <= 1"),
        (_shared(delivery="sometimes"), "downlink.shared.delivery must be one of"),
    ],
)
def test_bad_shared_parts_are_profile_errors(shared: dict[str, Any], reason: str) -> None:
    with pytest.raises(ProfileError, match=reason):
        parse_profile(_profile_with(shared), "mc.json")


def test_unknown_field_in_shared_lists_the_allowed_fields() -> None:
    with pytest.raises(ProfileError) as info:
        parse_profile(_profile_with(_shared(colour="red")), "mc.json")
    message = str(info.value)
    assert "downlink.shared.colour: unknown field; allowed fields: group, delivery" in message


def test_a_shared_part_round_trips_through_json() -> None:
    profile = resolve_profile("lorawan_eu868_dr0_sf12_mcast_b_dr3")
    again = parse_profile(json.loads(profile_to_json(profile)))
    assert again == profile
    assert isinstance(again.shared_downlink, SharedDownlink)


def test_multicast_doc_quotes_the_profiles() -> None:
    text = DOC.read_text(encoding="utf-8")
    for stem in MULTICAST:
        d = resolve_profile(stem).shared_delivery(1700)
        row = f"| `{stem}` | {d.frames} | {d.airtime_s:.2f} | {d.busy_s:.1f} | {d.energy_j:.3g} |"
        assert row in text, row
