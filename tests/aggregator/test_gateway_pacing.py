"""One gateway sends every unicast downlink of a network: on a private LoRaWAN network
(no daily cap) the versions wait for the gateway's duty cycle, summed over the members,
not only for each member's own link; the pacing is checkpointed, and the hold names the
gateway when it is what the version waits for."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.engine.downlink.broadcast import gateway_limit, network_of
from aggregator.engine.rounds import EngineConfig, RoundEngine
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.compressors import compress
from edge_agent.protocol import messages, topics, wire

JOB = "gw"
D = 64
PRIVATE = "lorawan_eu868_dr5_sf7_private"  # no daily cap: airtime and duty cycles only
TTN = "lorawan_eu868_dr5_sf7"  # 10 downlinks a day
RNG = np.random.default_rng(11)


def _published(profile: str, members: int) -> tuple[RoundEngine, int]:
    """An engine whose ``members`` agents on ``profile`` reported at t=0; version 1 is
    published to them at t=1. Returns the engine and the published message's size."""
    cfg = EngineConfig(job=JOB, d=D, step_size=0.1, downlink_pacing=True)
    eng = RoundEngine(cfg, profiles=resolve_profile)
    names = [f"m{i}" for i in range(members)]
    for agent in names:
        hello = messages.Hello(job=JOB, agent=agent, d=D, rows=10, smoothness=2.0,
                               model="logreg", compressor="topk", profile=profile)  # fmt: skip
        assert eng.handle(topics.hello(JOB, agent), messages.dump(hello), 0.0).reason is None
    for agent in names:
        u = compress(RNG.standard_normal(D), "topk", 8)
        blob = wire.encode(u, job=JOB, agent=agent, round=0, seq=0)
        eff = eng.handle(topics.update(JOB, agent), blob, 0.0)
        assert eff.reason is None, eff.reason
    assert eng.version == 1
    (message,) = [o for o in eff.outbound if o.target is None]
    eng.charge_downlink([message], 1.0)
    return eng, len(message.payload)


def test_the_gateway_sends_the_members_downlinks_one_after_another() -> None:
    profile = resolve_profile(PRIVATE)
    eng, size = _published(PRIVATE, 3)
    gateway = gateway_limit(profile, size)
    assert gateway is not None
    network, busy_s = gateway
    assert network == network_of(PRIVATE) == "lorawan_eu868"
    # RX1 goes out on the uplink's sub-band: the gateway's 1 % in each of the 2 sub-bands
    cost = profile.downlink_cost(size)
    assert busy_s == pytest.approx(cost.airtime_s / 0.02)
    own_s = cost.airtime_s + cost.silence_s  # one member's link: the sender's 1 %
    assert 3 * busy_s > own_s  # three members: the gateway is what binds
    assert eng.next_version_at == pytest.approx(1.0 + 3 * busy_s)
    # once every member's own link is free, the version still waits: for the gateway
    hold_at = 1.0 + own_s + 1.0
    assert eng.traffic.hold(hold_at) is None  # no round waits yet (none could close)
    eng.traffic.may_close(hold_at, None, eng.registry)
    hold = eng.traffic.hold(hold_at, eng.registry)
    assert hold is not None and hold.held_by == ("#lorawan_eu868",)
    assert hold.held_until == pytest.approx(1.0 + 3 * busy_s)
    back = RoundEngine.restore(eng.config, eng.export(), profiles=resolve_profile)
    assert back.next_version_at == eng.next_version_at  # checkpointed with the pacing


def test_rx2_answers_go_through_the_gateways_ten_percent_sub_band() -> None:
    """Members answered in RX2 (869.525 MHz) share the gateway's one 10 % sub-band: each
    downlink keeps it busy for ten times its airtime, on a timeline of its own."""
    name = "lorawan_eu868_dr0_sf12_rx2_private"
    profile = resolve_profile(name)
    eng, size = _published(name, 3)
    gateway = gateway_limit(profile, size)
    assert gateway is not None
    network, busy_s = gateway
    assert network == "lorawan_eu868/g3"
    cost = profile.downlink_cost(size)
    assert busy_s == pytest.approx(cost.airtime_s / 0.1)
    assert eng.next_version_at == pytest.approx(1.0 + 3 * busy_s)
    eng.traffic.may_close(1.0 + 2 * busy_s, None, eng.registry)
    hold = eng.traffic.hold(1.0 + 2 * busy_s, eng.registry)
    assert hold is not None and hold.held_by == ("#lorawan_eu868/g3",)


def test_a_capped_network_waits_for_its_cap_not_for_the_gateway() -> None:
    eng, size = _published(TTN, 3)
    profile = resolve_profile(TTN)
    packets = profile.downlink_cost(size).packets
    assert eng.next_version_at == pytest.approx(1.0 + 86_400.0 * packets / 10)
    eng.traffic.may_close(2.0, None, eng.registry)
    hold = eng.traffic.hold(2.0, eng.registry)
    assert hold is not None and hold.reason == "daily_cap"
    assert hold.held_by == ("m0", "m1", "m2")  # the gateway, free long before, is not named


def test_radios_without_a_sender_duty_cycle_have_no_gateway() -> None:
    assert gateway_limit(resolve_profile("ble5_2m_dle_notify"), 500) is None
    assert gateway_limit(resolve_profile("nbiot_udp_psm_rai"), 500) is None
