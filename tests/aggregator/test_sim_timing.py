"""The duty cycle restricts transmitting, not receiving: a class B/C group member's silence
overlaps its reception, a class A member's reception waits for its silence."""

from __future__ import annotations

import pytest

from aggregator.sim.problem import on_group
from aggregator.sim.timing import receives_while_silent, reception_ends, uplink_arrivals
from edge_agent.links.catalog import resolve_profile

GROUP = "lorawan_eu868_dr0_sf12_mcast_c_dr3"


def test_who_receives_while_silent() -> None:
    sf12 = resolve_profile("lorawan_eu868_dr0_sf12")
    ble = resolve_profile("ble5_2m_dle_notify")
    assert not receives_while_silent(sf12)  # class A: RX windows after its own uplinks
    assert receives_while_silent(on_group(sf12, resolve_profile(GROUP)))  # class C member
    assert receives_while_silent(ble)  # no duty cycle, no silence


def test_an_update_arrives_when_its_airtime_ends() -> None:
    # free again at 1,000 s after a send that added 900 s of silence: on air until 100 s
    assert uplink_arrivals([1000.0, 5.0], [900.0, 0.0]) == [100.0, 5.0]


def test_a_group_member_receives_during_its_silence() -> None:
    # published at 100 s, 50 s of reception, the transmitter silent until 4,000 s
    (end,) = reception_ends(100.0, [50.0], [4000.0], [True])
    assert end == pytest.approx(150.0)  # max(silence, reception) governs, not their sum


def test_a_class_a_member_receives_after_its_silence() -> None:
    (end,) = reception_ends(100.0, [50.0], [4000.0], [False])
    assert end == pytest.approx(4050.0)


def test_a_member_that_received_nothing_holds_the_version_when_published() -> None:
    assert reception_ends(100.0, [0.0], [4000.0], [False]) == [100.0]
