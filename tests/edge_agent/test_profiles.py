"""Tests for edge_agent.links.profiles: schema, formula, shipped profiles, errors."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.errors import ProfileError
from edge_agent.links.catalog import (
    PROFILES_DIR_ENV,
    default_profiles_dir,
    list_profiles,
    load_profile,
    resolve_profile,
    save_profile,
)
from edge_agent.links.profile_fit import fit_affine, measured_profile
from edge_agent.links.profiles import (
    METRICS,
    CostProfile,
    MessageCost,
    PacketProfile,
    parse_profile,
)

REPO_PROFILES = Path(__file__).resolve().parents[2] / "cost_profiles"
SHIPPED = sorted(p.stem for p in REPO_PROFILES.glob("*.json"))
REQUIRED = {
    "lorawan_eu868_dr0_sf12",
    "lorawan_eu868_dr3_sf9",
    "lorawan_eu868_dr5_sf7",
    "lorawan_us915_dr0_sf10",
    "lorawan_us915_dr3_sf7",
    "ble42_1m_nodle_notify",
    "ble5_2m_dle_notify",
    "ieee802154_6lowpan_udp_threadlike",
    "zigbee_aps_nwk_encrypted",
    "nbiot_udp_psm_rai",
    "ltem_udp_psm",
    "sigfox_rc1",
    "wifi_esp32_mqtt_tcp",
    "wifi_rpi4_mqtt_tls13",
    "paper_payload_bits",
    "paper_packet_model",
    "zmq_tcp_affine_example",
}
SIZES = np.array([0, 1, 10, 11, 12, 50, 51, 52, 100, 1000, 1459, 1460, 1461, 10_000, 123_457])


def _packet(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": "packet",
        "name": "lora",
        "description": "test link",
        "objective": "airtime_s",
        "max_payload_bytes": 51,
        "per_packet_overhead_bytes": 13,
        "per_packet": {"bits": 104, "packets": 1, "airtime_s": 1.155},
        "per_byte": {"bits": 8, "airtime_s": 0.03277},
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def _write(tmp_path: Path, data: object, name: str = "lora.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


# --- shipped profiles ---------------------------------------------------------------


def test_required_profiles_are_shipped() -> None:
    assert set(SHIPPED) >= REQUIRED


@pytest.mark.parametrize("stem", SHIPPED)
def test_shipped_profile_loads_and_is_named_after_its_file(stem: str) -> None:
    profile = load_profile(REPO_PROFILES / f"{stem}.json")
    assert profile.name == stem
    assert profile.sources, "every shipped profile names its sources"
    assert all(": " in s for s in profile.sources), "sources are 'KEY: where'"
    assert profile.description


@pytest.mark.parametrize("stem", SHIPPED)
def test_shipped_profile_objective_vectorised_equals_cost(stem: str) -> None:
    profile = load_profile(REPO_PROFILES / f"{stem}.json")
    vec = profile.objective_cost(SIZES.astype(np.int64))
    one_by_one = [profile.cost(int(s))[profile.objective] for s in SIZES]
    np.testing.assert_allclose(vec, one_by_one, rtol=1e-12)
    assert np.all(np.diff(vec) >= 0)
    assert vec[-1] > vec[0]


def test_list_profiles_is_sorted_and_complete() -> None:
    names = [p.name for p in list_profiles(REPO_PROFILES)]
    assert names == sorted(names)
    assert set(names) == set(SHIPPED)


@pytest.mark.parametrize(
    ("stem", "objective", "duty"),
    [
        ("lorawan_eu868_dr0_sf12", "airtime_s", 0.01),
        ("lorawan_us915_dr0_sf10", "airtime_s", None),
        ("sigfox_rc1", "airtime_s", 0.01),
        ("ble5_2m_dle_notify", "energy_j", None),
        ("nbiot_udp_psm_rai", "energy_j", None),
        ("wifi_esp32_mqtt_tcp", "energy_j", None),
        ("paper_payload_bits", "bits", None),
        ("paper_packet_model", "packets", None),
    ],
)
def test_shipped_objectives_and_duty_cycles(stem: str, objective: str, duty: float | None) -> None:
    profile = resolve_profile(stem)
    assert profile.objective == objective
    assert profile.duty_cycle == duty


# --- the formula, by hand ------------------------------------------------------------


def test_lora_dr0_by_hand() -> None:
    profile = resolve_profile("lorawan_eu868_dr0_sf12")
    cost = profile.cost(100)  # 100 B over 51 B packets: 2 packets
    assert cost["packets"] == 2
    assert cost["airtime_s"] == pytest.approx(2 * 1.155 + 0.03277 * 100)
    assert cost["energy_j"] == pytest.approx(2 * 0.1525 + 0.004325 * 100)
    assert cost["bits"] == pytest.approx(8 * 100 + 2 * 8 * 13)
    mc = profile.message_cost(100)
    assert (mc.size_bytes, mc.link_bytes, mc.packets, mc.bytes_on_air) == (100, 100, 2, 126)
    # 1 % in each of TTN's two uplink sub-bands: on the air 2 % of the time, less under
    # TTN's fair-use cap of 30 s a day; a private network has no such cap
    private = dataclasses.replace(profile, uplink_airtime_per_day_s=None)
    assert profile.duty_cycle_bands == 2 and private.uplink_duty_share == pytest.approx(0.02)
    assert private.message_cost(100).silence_s == pytest.approx(mc.airtime_s * 49)
    assert profile.uplink_duty_share == pytest.approx(30 / 86_400)
    assert mc.silence_s == pytest.approx(mc.airtime_s * (86_400 / 30 - 1))
    assert profile.packet_stepped
    assert profile.max_payload_bytes == 51


def test_wifi_message_overhead_counts_once_per_message() -> None:
    profile = resolve_profile("wifi_esp32_mqtt_tcp")
    oh = profile.message_overhead_bytes
    assert oh > 0
    size = 1460 - oh + 1  # one byte too many for a single packet once MQTT framing is added
    mc = profile.message_cost(size)
    assert mc.link_bytes == 1461
    assert mc.packets == 2
    assert mc.bytes_on_air == 1461 + 2 * 76
    assert mc.silence_s == 0.0
    # relative to an empty update (1 packet of `oh` bytes): one more packet, 1461 - oh more bytes
    extra = 0.00014 * 1 + 7.3e-8 * (1461 - oh)
    assert mc.energy_j == pytest.approx(profile.cost(0)["energy_j"] + extra)


def test_paper_payload_model_is_eight_bits_per_byte() -> None:
    profile = resolve_profile("paper_payload_bits")
    assert profile.cost(0)["bits"] == 0.0
    assert profile.cost(1000) == {"bits": 8000.0, "packets": 0.0, "airtime_s": 0.0, "energy_j": 0.0}
    assert not profile.packet_stepped


def test_paper_packet_model_counts_packets() -> None:
    profile = resolve_profile("paper_packet_model")
    costs = profile.objective_cost(np.array([1, 1460, 1461, 2920, 2921], dtype=np.int64))
    np.testing.assert_array_equal(costs, [1, 1, 2, 2, 3])
    assert profile.packet_stepped


def test_objective_cost_scalar_is_float_and_array_keeps_shape() -> None:
    profile = parse_profile(_packet())
    scalar = profile.objective_cost(100)
    assert isinstance(scalar, float)
    grid = profile.objective_cost(np.arange(12, dtype=np.int64).reshape(3, 4))
    assert isinstance(grid, np.ndarray)
    assert grid.shape == (3, 4)
    assert grid[2, 3] == pytest.approx(profile.cost(11)["airtime_s"])


def test_objective_cost_rejects_negative_and_float_sizes() -> None:
    profile = parse_profile(_packet())
    with pytest.raises(ValueError, match=">= 0"):
        profile.objective_cost(np.array([3, -1], dtype=np.int64))
    with pytest.raises(TypeError, match="integers"):
        profile.objective_cost(np.array([1.5]))
    with pytest.raises(ValueError, match=">= 0"):
        profile.cost(-1)


def test_duty_cycle_silence() -> None:
    profile = parse_profile(_packet(duty_cycle=0.1))
    mc = profile.message_cost(10)
    assert mc.airtime_s == pytest.approx(1.155 + 0.3277)
    assert mc.silence_s == pytest.approx(mc.airtime_s * 9)
    assert parse_profile(_packet()).message_cost(10).silence_s == 0.0


def test_duty_cycle_bands_share_the_silence() -> None:
    one = parse_profile(_packet(duty_cycle=0.01)).message_cost(500)
    two = parse_profile(_packet(duty_cycle=0.01, duty_cycle_bands=2)).message_cost(500)
    assert two.airtime_s == one.airtime_s
    assert one.silence_s == pytest.approx(one.airtime_s * 99)
    assert two.silence_s == pytest.approx(two.airtime_s * 49)
    # the share is capped at 1: no negative silence
    many = parse_profile(_packet(duty_cycle=0.5, duty_cycle_bands=3))
    assert many.uplink_duty_share == 1.0 and many.message_cost(10).silence_s == 0.0


@pytest.mark.parametrize(
    ("extra", "match"),
    [({"duty_cycle_bands": 2}, "duty_cycle_bands: sub-bands need a duty_cycle"),
     ({"duty_cycle": 0.01, "duty_cycle_bands": 0}, "duty_cycle_bands")],
)  # fmt: skip
def test_duty_cycle_bands_checked(tmp_path: Path, extra: dict[str, object], match: str) -> None:
    with pytest.raises(ProfileError, match=match):
        load_profile(_write(tmp_path, _packet(**extra)))


def test_message_cost_is_frozen() -> None:
    mc = parse_profile(_packet()).message_cost(1)
    assert isinstance(mc, MessageCost)
    with pytest.raises(AttributeError):
        mc.packets = 3  # type: ignore[misc]


# --- affine and measured --------------------------------------------------------------


def test_affine_profile() -> None:
    profile = parse_profile(
        {
            "kind": "affine",
            "name": "zmq",
            "description": "fit",
            "objective": "airtime_s",
            "message_overhead_bytes": 10,
            "coefficients": {"airtime_s": {"a": 0.001, "b": 1e-6}},
        }
    )
    mc = profile.message_cost(90)
    assert mc.link_bytes == 100
    assert mc.packets == 1
    assert mc.airtime_s == pytest.approx(0.001 + 1e-4)
    assert mc.energy_j == 0.0
    assert not profile.packet_stepped
    assert profile.max_payload_bytes is None


def test_affine_profile_splits_when_max_payload_given() -> None:
    profile = parse_profile(
        {
            "kind": "affine",
            "name": "zmq",
            "description": "fit",
            "objective": "bits",
            "max_payload_bytes": 100,
            "per_packet_overhead_bytes": 40,
            "coefficients": {"bits": {"a": 0, "b": 8}},
        }
    )
    mc = profile.message_cost(250)
    assert (mc.packets, mc.bytes_on_air, mc.bits) == (3, 370, 2000.0)


def test_measured_profile_interpolates_and_extrapolates() -> None:
    profile = measured_profile(
        "meas",
        [
            {"size_bytes": 100, "energy_j": 1.0},
            {"size_bytes": 200, "energy_j": 2.0},
            {"size_bytes": 400, "energy_j": 2.5},
        ],
        "energy_j",
    )
    sizes = np.array([0, 50, 100, 150, 300, 400, 800], dtype=np.int64)
    # below the first point: first slope 0.01/B, clamped at 0; beyond: last slope 0.0025/B
    np.testing.assert_allclose(profile.objective_cost(sizes), [0.0, 0.5, 1.0, 1.5, 2.25, 2.5, 3.5])
    assert profile.kind == "measured"
    assert not profile.packet_stepped


def test_measured_profile_clamps_at_zero_below_first_point() -> None:
    profile = measured_profile(
        "meas", [{"size_bytes": 10, "bits": 1.0}, {"size_bytes": 20, "bits": 100.0}], "bits"
    )
    assert profile.cost(0)["bits"] == 0.0
    assert profile.cost(5)["bits"] == 0.0


def test_measured_profile_roundtrips_through_save(tmp_path: Path) -> None:
    profile = measured_profile(
        "calibrated",
        [{"size_bytes": 0, "airtime_s": 0.01}, {"size_bytes": 1000, "airtime_s": 0.02}],
        "airtime_s",
        duty_cycle=0.5,
        sources=["measured: edge-agent calibrate"],
    )
    path = save_profile(profile, tmp_path / "calibrated.json")
    loaded = load_profile(path)
    assert loaded == profile
    assert loaded.message_cost(500).silence_s == pytest.approx(0.015)


def test_fit_affine_recovers_a_line() -> None:
    a, b = fit_affine([10, 20, 30, 40], [1.1, 1.2, 1.3, 1.4])
    assert a == pytest.approx(1.0)
    assert b == pytest.approx(0.01)


def test_fit_affine_never_returns_a_negative_coefficient() -> None:
    a, b = fit_affine([1, 2, 3], [0.0, 5.0, 10.0])  # unconstrained a = -5
    assert a == 0.0
    assert b == pytest.approx(40 / 14)  # x.y / x.x
    a, b = fit_affine([1, 2, 3], [3.0, 2.0, 1.0])  # unconstrained b < 0
    assert a == pytest.approx(2.0)
    assert b == 0.0
    with pytest.raises(ValueError, match="two distinct sizes"):
        fit_affine([5, 5], [1.0, 2.0])


# --- errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field", "allowed"),
    [
        ({"max_payload_bytes": 0}, "max_payload_bytes", "must be > 0, got 0"),
        ({"colour": "red"}, "colour", "unknown field"),
        ({"objective": "watts"}, "objective", "'energy_j'"),
        ({"objective": "energy_j"}, "objective", "not defined"),
        ({"duty_cycle": 1.5}, "duty_cycle", "<= 1"),
        ({"per_byte": {"watts": 1.0}}, "per_byte", "'airtime_s'"),
        ({"per_packet": {"airtime_s": -1.0}}, "per_packet.airtime_s", ">= 0"),
        ({"kind": "magic"}, "kind", "'measured'"),
    ],
)
def test_bad_profile_error_names_file_field_and_rule(
    tmp_path: Path, overrides: dict[str, Any], field: str, allowed: str
) -> None:
    path = _write(tmp_path, _packet(**overrides))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert "lora.json" in message
    assert field in message
    assert allowed in message


def test_error_message_matches_house_style(tmp_path: Path) -> None:
    path = _write(tmp_path, _packet(max_payload_bytes=0))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert str(info.value).endswith("lora.json: max_payload_bytes must be > 0, got 0")


def test_duty_cycle_without_airtime_is_rejected(tmp_path: Path) -> None:
    data = _packet(objective="bits", duty_cycle=0.01, per_packet={}, per_byte={"bits": 8})
    with pytest.raises(ProfileError, match=r"lora\.json: duty_cycle: .*airtime_s"):
        load_profile(_write(tmp_path, data))


@pytest.mark.parametrize(
    ("points", "field"),
    [
        ([{"size_bytes": 10, "bits": 1}, {"size_bytes": 10, "bits": 2}], "points[1].size_bytes"),
        ([{"size_bytes": 10, "bits": 1}, {"size_bytes": 5, "bits": 2}], "points[1].size_bytes"),
        ([{"size_bytes": 10, "bits": 3}, {"size_bytes": 20, "bits": 2}], "points[1].bits"),
        ([{"size_bytes": 10, "bits": 1}, {"size_bytes": 20, "airtime_s": 2}], "points[1]"),
        ([{"size_bytes": 10, "bits": 1}], "points"),
    ],
)
def test_bad_measured_points(tmp_path: Path, points: list[dict[str, float]], field: str) -> None:
    data = {
        "kind": "measured",
        "name": "m",
        "description": "d",
        "objective": "bits",
        "points": points,
    }
    with pytest.raises(ProfileError) as info:
        load_profile(_write(tmp_path, data, "meas.json"))
    assert "meas.json" in str(info.value)
    assert field in str(info.value)


def test_invalid_json_names_file_and_position(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"kind": "packet",\n  "name": }')
    with pytest.raises(ProfileError, match=r"broken\.json: invalid JSON at line 2"):
        load_profile(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"nothere\.json: file not found"):
        load_profile(tmp_path / "nothere.json")


def test_top_level_must_be_an_object(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"list\.json: the top level must be a JSON object"):
        load_profile(_write(tmp_path, [1, 2], "list.json"))


def test_unknown_profile_name_lists_known_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, _packet(name="alpha"), "alpha.json")
    monkeypatch.setenv(PROFILES_DIR_ENV, str(tmp_path))
    with pytest.raises(ProfileError, match="known profiles: alpha"):
        resolve_profile("beta")


def test_profiles_dir_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, _packet(name="zeta"), "zeta.json")
    _write(tmp_path, _packet(name="alpha"), "alpha.json")
    monkeypatch.setenv(PROFILES_DIR_ENV, str(tmp_path))
    assert default_profiles_dir() == tmp_path
    assert [p.name for p in list_profiles()] == ["alpha", "zeta"]
    assert resolve_profile("zeta").name == "zeta"
    assert resolve_profile(str(tmp_path / "alpha.json")).name == "alpha"


def test_default_profiles_dir_is_the_repo_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROFILES_DIR_ENV, raising=False)
    assert default_profiles_dir() == REPO_PROFILES


def test_duplicate_names_in_a_directory_are_rejected(tmp_path: Path) -> None:
    _write(tmp_path, _packet(name="same"), "a.json")
    _write(tmp_path, _packet(name="same"), "b.json")
    with pytest.raises(ProfileError, match=r"b\.json: name: 'same' is already defined"):
        list_profiles(tmp_path)


def test_profiles_are_frozen() -> None:
    profile = parse_profile(_packet())
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign"):
        profile.name = "other"  # type: ignore[misc]


# --- properties ----------------------------------------------------------------------

_metric_costs = st.dictionaries(
    st.sampled_from(METRICS), st.floats(min_value=0, max_value=1e3, allow_nan=False), max_size=4
)


@st.composite
def _packet_profiles(draw: st.DrawFn) -> CostProfile:
    data = _packet(
        objective="bits",
        message_overhead_bytes=draw(st.integers(0, 100)),
        max_payload_bytes=draw(st.integers(1, 2000)),
        per_packet_overhead_bytes=draw(st.integers(0, 100)),
        per_message=draw(_metric_costs),
        per_packet=draw(_metric_costs),
        per_byte={**draw(_metric_costs), "bits": 8.0},
    )
    return parse_profile(data)


@st.composite
def _measured_profiles(draw: st.DrawFn) -> CostProfile:
    n = draw(st.integers(2, 8))
    sizes = sorted(draw(st.sets(st.integers(0, 100_000), min_size=n, max_size=n)))
    steps = draw(st.lists(st.floats(0, 10, allow_nan=False), min_size=n, max_size=n))
    values = np.cumsum(steps) + 1.0
    points = [{"size_bytes": s, "energy_j": float(v)} for s, v in zip(sizes, values, strict=True)]
    return measured_profile("prop", points, "energy_j")


@given(
    profile=st.one_of(_packet_profiles(), _measured_profiles()),
    sizes=st.lists(st.integers(0, 1_000_000), min_size=2, max_size=50),
)
def test_costs_are_nondecreasing_in_size(profile: CostProfile, sizes: list[int]) -> None:
    ordered = np.array(sorted(sizes), dtype=np.int64)
    for metric in METRICS:
        values = [profile.cost(int(s))[metric] for s in ordered]
        assert all(b >= a for a, b in itertools.pairwise(values)), metric
        assert all(v >= 0 and math.isfinite(v) for v in values)
    objective = profile.objective_cost(ordered)
    assert np.all(np.diff(objective) >= 0)
    np.testing.assert_allclose(
        objective, [profile.cost(int(s))[profile.objective] for s in ordered]
    )


# --- the downlink part -----------------------------------------------------------------

LORAWAN = [s for s in SHIPPED if s.startswith("lorawan_")]
LORAWAN_EU868 = [s for s in LORAWAN if "_eu868_" in s]
LORAWAN_RX2 = [s for s in LORAWAN if "_rx2" in s]  # class A answers in RX2 at DR3
# radios whose receive current is well below their transmit current, and whose downlink
# adds no transmission or listening window of its own: receiving any message costs less
RX_CHEAPER = [*LORAWAN, "nbiot_udp_psm_rai", "ltem_udp_psm"]


@pytest.mark.parametrize("stem", SHIPPED)
def test_shipped_profile_has_a_valid_downlink_part(stem: str) -> None:
    profile = load_profile(REPO_PROFILES / f"{stem}.json")
    down = profile.downlink
    assert down is not None, f"{stem}: no downlink part"
    # the downlink prices the objective too, so CAT can choose a downlink size on this link
    assert np.all(profile.downlink_objective_cost(np.array([1, 100, 10_000])) > 0)
    assert (down.max_messages_per_day is None) == (profile.max_downlinks_per_day is None)


@pytest.mark.parametrize("stem", SHIPPED)
def test_shipped_downlink_cost_is_nondecreasing_and_vectorised(stem: str) -> None:
    profile = load_profile(REPO_PROFILES / f"{stem}.json")
    costs = [profile.downlink_cost(int(s)) for s in SIZES]
    for field in ("bits", "packets", "airtime_s", "energy_j", "bytes_on_air"):
        values = [getattr(c, field) for c in costs]
        assert all(b >= a for a, b in itertools.pairwise(values)), field
        assert all(v >= 0 and math.isfinite(v) for v in values), field
    by_hand = [getattr(c.cost, profile.objective) for c in costs]
    np.testing.assert_allclose(profile.downlink_objective_cost(SIZES), by_hand)


@pytest.mark.parametrize("stem", LORAWAN)
def test_lorawan_downlinks_split_at_the_rx1_payload_size(stem: str) -> None:
    profile = load_profile(REPO_PROFILES / f"{stem}.json")
    assert profile.downlink is not None
    n = profile.downlink.max_payload_bytes
    # EU868 RX1 uses the uplink's data rate, hence its N; US915 RX1 uses DR10-DR13 (N = 242);
    # an EU868 answer in RX2 goes at DR3 (N = 115)
    rx1 = profile.max_payload_bytes if stem in LORAWAN_EU868 else 242
    assert n == (115 if stem in LORAWAN_RX2 else rx1)
    assert n is not None
    assert profile.downlink_cost(n).packets == 1
    assert profile.downlink_cost(n + 1).packets == 2
    assert profile.downlink_cost(2 * n + 1).packets == 3
    assert profile.downlink_cost(n).bytes_on_air == n + 13


def test_lora_dr0_downlink_by_hand() -> None:
    c = resolve_profile("lorawan_eu868_dr0_sf12").downlink_cost(100)
    assert c.packets == 2 and c.bytes_on_air == 126 and c.bits == 1008
    assert c.airtime_s == pytest.approx(2 * 1.155 + 100 * 0.03277)
    assert c.energy_j == pytest.approx(2 * 0.04193 + 100 * 0.001189)
    # the gateway keeps the RX1 sub-band's 1 %: silent 99 times the downlink's airtime
    assert c.silence_s == pytest.approx(c.airtime_s * 99)


@pytest.mark.parametrize("stem", LORAWAN_EU868)
def test_lorawan_eu868_downlinks_are_capped_at_ten_a_day(stem: str) -> None:
    profile = load_profile(REPO_PROFILES / f"{stem}.json")
    private = stem.endswith("_private")  # a private network server: the law's limits only
    assert profile.max_downlinks_per_day == (None if private else 10)
    assert profile.downlink is not None
    if stem in LORAWAN_RX2:  # the gateway's 10 % on 869.525 MHz, one sub-band for all
        assert (profile.downlink.sender_duty_cycle, profile.downlink.sender_band) == (0.1, "g3")
        assert profile.downlink.sender_share(profile.duty_cycle_bands) == 0.1
    else:  # RX1: 1 % on the uplink's sub-band, so the gateway's share spans its bands
        assert (profile.downlink.sender_duty_cycle, profile.downlink.sender_band) == (0.01, None)
        share = profile.downlink.sender_share(profile.duty_cycle_bands)
        assert share == pytest.approx(0.01 * profile.duty_cycle_bands)


@pytest.mark.parametrize("stem", LORAWAN_RX2)
def test_an_rx2_profile_is_its_sf12_radio_answered_at_dr3(stem: str) -> None:
    """The uplink is the RX1 profile's, bit for bit; the downlink is DR3's (SF9, 115 B): a
    full frame 144.4 ms + 115 x 4.551 ms on air, received at 36.3 mW."""
    rx2 = load_profile(REPO_PROFILES / f"{stem}.json")
    rx1 = load_profile(REPO_PROFILES / f"{stem.replace('_rx2', '')}.json")
    for size in (1, 51, 500):
        assert rx2.message_cost(size) == rx1.message_cost(size)
    assert rx2.uplink_airtime_per_day_s == rx1.uplink_airtime_per_day_s
    assert rx2.max_downlinks_per_day == rx1.max_downlinks_per_day
    frame = rx2.downlink_cost(115)
    assert frame.packets == 1 and frame.bytes_on_air == 128
    assert frame.airtime_s == pytest.approx(0.1444 + 115 * 0.004551)
    assert frame.energy_j == pytest.approx(frame.airtime_s * 0.0363, rel=1e-3)
    # the same 1.7 kB message: 15 frames instead of 34, a ninth of the time on air
    big, old = rx2.downlink_cost(1700), rx1.downlink_cost(1700)
    assert (big.packets, old.packets) == (15, 34)
    assert big.airtime_s < old.airtime_s / 9


@pytest.mark.parametrize("stem", [s for s in LORAWAN_EU868 if s.endswith("_private")])
def test_a_private_profile_is_its_radio_without_the_things_networks_policy(stem: str) -> None:
    private = load_profile(REPO_PROFILES / f"{stem}.json")
    ttn = load_profile(REPO_PROFILES / f"{stem.removesuffix('_private')}.json")
    assert ttn.uplink_airtime_per_day_s == 30.0 and private.uplink_airtime_per_day_s is None
    assert ttn.downlink is not None and private.downlink is not None
    assert private.downlink.max_messages_per_day is None
    # the radio itself is the same: its costs both ways and its duty cycle; after an uplink
    # it owes the duty cycle's silence only, not the fair-use cap's (TTN: a day per 30 s)
    for size in (1, 51, 500):
        up, ttn_up = private.message_cost(size), ttn.message_cost(size)
        assert dataclasses.replace(up, silence_s=0.0) == dataclasses.replace(ttn_up, silence_s=0.0)
        assert up.silence_s == pytest.approx(up.airtime_s * (1 / 0.02 - 1))
        assert up.silence_s < ttn_up.silence_s
        assert private.downlink_cost(size) == ttn.downlink_cost(size)
    assert (private.duty_cycle, private.duty_cycle_bands) == (ttn.duty_cycle, ttn.duty_cycle_bands)


def test_sigfox_downlinks_are_four_a_day_of_eight_bytes() -> None:
    profile = resolve_profile("sigfox_rc1")
    assert profile.max_downlinks_per_day == 4
    assert profile.downlink is not None and profile.downlink.max_payload_bytes == 8
    assert profile.downlink_cost(8).packets == 1 and profile.downlink_cost(9).packets == 2


@pytest.mark.parametrize("stem", RX_CHEAPER)
def test_receiving_costs_less_energy_than_sending(stem: str) -> None:
    profile = load_profile(REPO_PROFILES / f"{stem}.json")
    for size in SIZES[SIZES > 0]:  # 0 bytes: no packet, nothing to compare
        down, up = profile.downlink_cost(int(size)), profile.message_cost(int(size))
        assert down.energy_j < up.energy_j, int(size)


def test_receiving_on_wifi_and_ble_costs_less_per_byte() -> None:
    # ESP32: the device transmits the PUBACK, so only a message of at least a full segment
    # is cheaper to receive; BLE: RX 6.26 mA against TX 6.4 mA, the receiver sends the ACKs
    esp32 = resolve_profile("wifi_esp32_mqtt_tcp")
    for size in (1460, 10_000, 123_457):
        assert esp32.downlink_cost(size).energy_j < esp32.message_cost(size).energy_j
    for stem in ("wifi_esp32_mqtt_tcp", "ble42_1m_nodle_notify", "ble5_2m_dle_notify"):
        profile = resolve_profile(stem)
        assert isinstance(profile, PacketProfile) and profile.downlink is not None
        assert profile.downlink.per_byte["energy_j"] < profile.per_byte["energy_j"], stem


@pytest.mark.parametrize(
    "stem", ["paper_payload_bits", "paper_packet_model", "zmq_tcp_affine_example"]
)
def test_abstract_profiles_write_out_a_symmetric_downlink(stem: str) -> None:
    profile = load_profile(REPO_PROFILES / f"{stem}.json")
    assert profile.downlink is not None and profile.max_downlinks_per_day is None
    for size in SIZES:
        assert profile.downlink_cost(int(size)) == profile.message_cost(int(size))


def test_profile_without_downlink_is_symmetric() -> None:
    profile = parse_profile(_packet(duty_cycle=0.01))
    assert profile.downlink is None and profile.max_downlinks_per_day is None
    for size in SIZES:
        up = profile.message_cost(int(size))
        assert up.silence_s > 0 or size == 0
        assert profile.downlink_cost(int(size)) == dataclasses.replace(up, silence_s=0.0)
    np.testing.assert_array_equal(
        profile.downlink_objective_cost(SIZES), profile.objective_cost(SIZES)
    )


def test_unknown_field_in_downlink_lists_the_allowed_fields(tmp_path: Path) -> None:
    path = _write(tmp_path, _packet(downlink={"max_payload_bytes": 51, "colour": "red"}))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert f"profile {path}: downlink.colour: unknown field; allowed fields: " in message
    for field in ("max_payload_bytes", "per_byte", "sender_duty_cycle", "max_messages_per_day"):
        assert field in message


@pytest.mark.parametrize("stem", SHIPPED)
def test_price_picks_the_direction(stem: str) -> None:
    profile = load_profile(REPO_PROFILES / f"{stem}.json")
    for size in (0, 100, 5000):
        assert profile.price(size, "down") == profile.downlink_cost(size)
        assert profile.price(size, "up") == profile.message_cost(size)
        assert profile.price(size) == profile.message_cost(size)
