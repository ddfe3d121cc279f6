"""A profile's compute part: what a gradient evaluation costs the device (joules)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from edge_agent.errors import ProfileError
from edge_agent.links.catalog import list_profiles, load_profile
from edge_agent.links.profiles import ComputePart, parse_profile, profile_to_json

FLEET = ("lorawan_eu868_dr5_sf7", "lorawan_eu868_dr0_sf12", "ble5_2m_dle_notify",
         "nbiot_udp_psm_rai", "wifi_rpi4_mqtt_tls13")  # fmt: skip


def _data(compute: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(profile_to_json(load_profile("paper_payload_bits")))
    data["compute"] = compute
    return data


def test_a_profile_without_a_compute_part_costs_no_compute_energy() -> None:
    old = load_profile("paper_payload_bits")
    assert old.compute is None
    assert old.compute_energy_j(10, 1_000, 70_000) == 0.0
    assert "compute" not in json.loads(profile_to_json(old))


def test_energy_is_affine_in_evaluations_rows_and_nonzeros() -> None:
    part = {"per_gradient_j": 1e-4, "per_row_j": 3e-7, "per_nonzero_j": 2e-8}
    prof = parse_profile(_data(part))
    assert prof.compute is not None
    got = prof.compute_energy_j(3, 900, 60_000)
    assert got == pytest.approx(3 * 1e-4 + 900 * 3e-7 + 60_000 * 2e-8, rel=1e-12)
    assert prof.compute_energy_j(0, 0, 0) == 0.0
    # the part survives a round trip through the JSON the loader reads
    again = parse_profile(json.loads(profile_to_json(prof)))
    assert again == prof and again.compute_energy_j(3, 900, 60_000) == got


@pytest.mark.parametrize(
    ("compute", "needle"),
    [
        ({}, "compute: per_gradient_j, per_row_j and per_nonzero_j are all 0"),
        ({"per_row_j": -1.0}, "compute.per_row_j must be >= 0"),
        ({"per_nonzero_j": float("nan")}, "compute.per_nonzero_j"),
        ({"per_rows_j": 1e-6}, "compute.per_rows_j: unknown field; allowed fields: per_gradient_j"),
        ({"per_row_j": 1e-6, "features": 0}, "compute.features must be > 0"),
        ({"per_row_j": 1e-6, "power_w": -2}, "compute.power_w must be >= 0"),
        ([1, 2], "compute"),
    ],
)
def test_a_bad_compute_part_is_refused_naming_the_field(compute: Any, needle: str) -> None:
    with pytest.raises(ProfileError, match=r"^profile x\.json: ") as info:
        parse_profile(_data(compute), "x.json")
    assert needle in str(info.value)


def test_negative_counts_are_refused() -> None:
    part = ComputePart(per_row_j=1e-6)
    with pytest.raises(ValueError, match="rows must be >= 0"):
        part.energy_j(1, -1, 0)
    prof = replace(load_profile("paper_payload_bits"), compute=part)
    with pytest.raises(ValueError, match="evaluations must be >= 0"):
        prof.compute_energy_j(-1, 0, 0)


def test_shipped_compute_parts_are_marked_as_estimates() -> None:
    shipped = {p.name: p for p in list_profiles()}
    for name in FLEET:
        part = shipped[name].compute
        assert part is not None, name
        assert part.estimated and part.device and part.features == 47_236
        assert part.per_nonzero_j > 0 and part.per_gradient_j > 0
        # a 1,000-row RCV1-like shard (74 nonzeros a row): millijoules, not joules
        assert 1e-4 < shipped[name].compute_energy_j(1, 1_000, 74_000) < 1e-2
    assert any(p.compute is None for p in shipped.values())  # the rest: not modelled
