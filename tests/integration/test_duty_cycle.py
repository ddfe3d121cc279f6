"""A LoRaWAN EU868 agent with default flags keeps its duty cycle (1 % in each of its two
sub-bands on TTN's plan, three on a multicast group's private plan) against a real
aggregator.

Default flags: ``duty_cycle="wait"`` and ``resend_s=10``. The agent starts before the
aggregator (so it says hello into the void, with its back-off) and the aggregator is
away for longer than ``resend_s`` in the middle of the run (so the agent re-sends its last
update): every kind of message it sends (hellos, requests, updates, re-sends) is on the
wire, counted below the agent by :class:`CountingTransport`.

Speed: the real ``lorawan_eu868_dr5_sf7`` profile owes about 5 s of silence per small
message (49 times 0.1 s of airtime per 40 B), so a few rounds would take minutes. The test
runs a copy of it with every airtime divided by :data:`SCALE` and the same duty cycle:
the law checked (airtime / elapsed time <= duty cycle, and every message waits for the
silence the previous one owes) does not depend on the scale, and the run takes ~20 s.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2e_helpers import AgentThread, make_problem, scaled_profile, service_settings, wait_until

from aggregator.localnet import HOST, free_port_pair
from aggregator.service.ingest import AggregatorService
from edge_agent.agent.loop import AgentConfig
from edge_agent.links.catalog import PROFILES_DIR_ENV, save_profile
from edge_agent.links.profiles import CostProfile
from edge_agent.protocol import topics

pytestmark = pytest.mark.integration

#: airtime divisor of the test's copy of the LoRaWAN profile (duty cycle unchanged)
SCALE = 40.0


#: the profiles run: TTN's plan (two 1 % sub-bands), and a multicast group member on a
#: private plan with a third (its SF12 airtimes scaled harder, to keep the run short)
PLANS = [
    ("lorawan_eu868_dr5_sf7", SCALE, 2),
    ("lorawan_eu868_dr0_sf12_mcast_c_dr3_3band", 400.0, 3),
]


def fast_lorawan(name: str = "lorawan_eu868_dr5_sf7", scale: float = SCALE,
                 bands: int = 2) -> CostProfile:  # fmt: skip
    """``name`` with every airtime / ``scale``, the same duty cycle: 1 % in each of
    ``bands`` sub-bands."""
    profile = scaled_profile(name, f"{name}_fast", scale)
    assert (profile.duty_cycle, profile.duty_cycle_bands) == (0.01, bands)
    return profile


def _version(services: list[AggregatorService]) -> int:
    return int(services[-1].read(lambda e: e.version))


@pytest.mark.parametrize(("name", "scale", "bands"), PLANS)
def test_lorawan_agent_with_default_flags_stays_within_its_duty_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, scale: float, bands: int
) -> None:
    profile = fast_lorawan(name, scale, bands)
    # the aggregator prices a hello's profile from its profiles directory (an unknown one is
    # refused): the test copy lives in a directory of its own
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    save_profile(profile, profiles / f"{profile.name}.json")
    monkeypatch.setenv(PROFILES_DIR_ENV, str(profiles))
    problem = make_problem(tmp_path / "data", rows=60, features=8, agents=1)
    url = f"zmq+tcp://{HOST}:{free_port_pair()}"
    job = "duty"
    config = AgentConfig(job=job, agent_id="lora-0", seed=0)
    assert (config.duty_cycle, config.resend_s) == ("wait", 10.0)  # the defaults
    agent = AgentThread(
        config, url=url, shard=problem.shards[0], features=problem.features, profile=profile
    )
    settings = service_settings(
        problem, job=job, url=url, data_dir=tmp_path / "agg", round_deadline_s=1.0,
        feedback="none",  # AgentConfig's default (the CLI's, like AGG_FEEDBACK's, is ef21)
    )  # fmt: skip
    services: list[AggregatorService] = []
    agent.start()
    try:
        time.sleep(2.5)  # no aggregator yet: hellos into the void, with back-off
        services.append(AggregatorService(settings))
        services[-1].start()
        wait_until(lambda: _version(services) >= 3, 20.0, "three versions")
        services[-1].stop()  # away for longer than resend_s: the agent re-sends
        wait_until(lambda: agent.agent.counters.resends >= 1, 15.0, "a re-send")
        services.append(AggregatorService(settings))
        services[-1].start()
        v = _version(services)
        wait_until(lambda: _version(services) >= v + 2, 20.0, "two more versions after the restart")
        agent.stop()
        stopped = time.monotonic()
    finally:
        agent.agent.stop()
        for s in services:
            s.stop()

    sent, ledger, dc = agent.transport.sent, agent.agent.ledger, profile.uplink_duty_share
    assert dc is not None and dc == pytest.approx(0.01 * bands)
    hello = topics.hello(job, "lora-0")
    update = topics.update(job, "lora-0")
    assert sum(s.topic == hello for s in sent) >= 2, "the hellos before the aggregator"
    assert agent.agent.counters.resends >= 1
    assert sum(s.topic == update for s in sent) >= 5 + agent.agent.counters.resends - 1
    # the ledger has every message the wire carried, re-sends and hellos included
    airtimes = [profile.message_cost(s.size).airtime_s for s in sent]
    assert ledger.up.messages == len(sent)
    assert ledger.up.airtime_s == pytest.approx(sum(airtimes), rel=1e-12)
    # every message waited for the silence the one before it owed
    for prev, nxt, air in zip(sent, sent[1:], airtimes, strict=False):
        assert nxt.at - prev.at >= air / dc, (
            f"{nxt.topic} sent {nxt.at - prev.at:.3f} s after {prev.topic}, "
            f"which owed {air / dc:.3f} s"
        )
    # airtime over the time elapsed (until the last message's silence is served) <= 2 %
    end = max(stopped, sent[-1].at + airtimes[-1] / dc)
    share = ledger.up.airtime_s / (end - agent.started_at)
    assert share <= dc, f"{share:.4%} airtime on a {dc:.0%} duty cycle"


def _private_lorawan(scale: float) -> CostProfile:
    """``lorawan_eu868_dr5_sf7_private`` with every airtime, both ways, / ``scale``: no daily
    cap, so what paces its downlinks is the gateway's duty cycle."""
    return scaled_profile(PRIVATE, f"{PRIVATE}_fast", scale, downlink=scale)


#: a private network server's LoRaWAN members: no TTN caps, one gateway for all
PRIVATE = "lorawan_eu868_dr5_sf7_private"
#: three members: the gateway's 1 % in each of two sub-bands is less than their three links' 1 %
MEMBERS = 3


def test_the_service_paces_one_gateway_for_a_networks_unicast_members(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three agents on a private network's LoRaWAN profile (time-scaled), default flags,
    the service's downlink pacing on: what the gateway sent them, counted by the service and
    by the agents, stays within its duty cycle over the run: the service's pacing kept the
    gateway busy for all of it, one message after another."""
    profile = _private_lorawan(10.0)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    save_profile(profile, profiles / f"{profile.name}.json")
    monkeypatch.setenv(PROFILES_DIR_ENV, str(profiles))
    problem = make_problem(tmp_path / "data", rows=90, features=8, agents=MEMBERS)
    url = f"zmq+tcp://{HOST}:{free_port_pair()}"
    job = "gateway"
    agents = [AgentThread(AgentConfig(job=job, agent_id=f"lora-{i}", seed=i), url=url,
                          shard=problem.shards[i], features=problem.features, profile=profile)
              for i in range(MEMBERS)]  # fmt: skip
    settings = service_settings(problem, job=job, url=url, data_dir=tmp_path / "agg",
                                round_deadline_s=1.0, feedback="none",
                                downlink_pacing=True)  # fmt: skip
    service = AggregatorService(settings)
    started = time.time()
    service.start()
    try:
        for a in agents:
            a.start()
        wait_until(lambda: service.read(lambda e: e.version) >= 4, 60.0, "four versions")
        engine_state = service.read(
            lambda e: (e.traffic.free_at("#lorawan_eu868"), [i.down for i in e.agents.values()])
        )
    finally:
        for a in agents:
            a.agent.stop()
        service.stop()
    gateway_free_at, accounts = engine_state
    share = 0.01 * profile.duty_cycle_bands
    # the service's accounts: everything the gateway sent, at its duty cycle, one after another
    sent_s = sum(c.airtime_s for c in accounts)
    assert sent_s > 0.0
    assert gateway_free_at - started >= sent_s / share * (1 - 1e-9)
    # what the agents received (their own ledgers) agrees with the service's accounts
    received_s = sum(a.agent.ledger.down.airtime_s for a in agents)
    assert received_s <= sent_s * (1 + 1e-9)
    # and one member's link alone would have allowed the versions sooner: the gateway binds
    assert sent_s / share > max(c.airtime_s for c in accounts) / 0.01
