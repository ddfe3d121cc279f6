"""A job-wide message to a multicast group is sent once: the group's airtime once, each
member its energy, the group paced by its own busy time; answers stay unicast."""

from __future__ import annotations

import math

import numpy as np

from aggregator.engine.downlink.outbound import Outbound
from aggregator.engine.rounds import EngineConfig, RoundEngine
from edge_agent.links.catalog import resolve_profile
from edge_agent.protocol import messages, topics

JOB = "mc"
GROUP = "lorawan_eu868_dr0_sf12_mcast_c_dr3"
UNICAST = "lorawan_eu868_dr0_sf12"
SIZE = 1700


def _engine(profiles: dict[str, str]) -> RoundEngine:
    eng = RoundEngine(
        EngineConfig(job=JOB, d=50, downlink_pacing=True, feedback="any", min_agents=9),
        x0=np.zeros(50),
        profiles=resolve_profile,
    )
    for agent, profile in profiles.items():
        hello = messages.Hello(job=JOB, agent=agent, d=50, rows=10, smoothness=1.0,
                               model="logreg", compressor="topk", profile=profile)  # fmt: skip
        eng.handle(topics.hello(JOB, agent), messages.dump(hello), 0.0)
    return eng


def _job_wide() -> Outbound:
    return Outbound(topics.delta(JOB), b"x" * SIZE)


def test_a_group_is_sent_once_and_paced_by_its_busy_time() -> None:
    eng = _engine({"a": GROUP, "b": GROUP, "c": GROUP})
    before = {a: eng.registry.get(a).down for a in "abc"}  # type: ignore[union-attr]
    eng.charge_downlink([_job_wide()], 100.0)
    got = resolve_profile(GROUP).shared_delivery(SIZE)
    (acct,) = eng.traffic.groups.values()
    assert acct["messages"] == 1.0 and math.isclose(acct["airtime_s"], got.airtime_s)
    assert math.isclose(eng.next_version_at, 100.0 + got.busy_s)
    for a in "abc":
        down = eng.registry.get(a).down - before[a]  # type: ignore[union-attr]
        assert math.isclose(down.energy_j, got.energy_j)


def test_an_answer_to_a_member_goes_unicast() -> None:
    eng = _engine({"a": GROUP})
    eng.charge_downlink([Outbound(topics.to_agent(JOB, "a"), b"x" * SIZE, target="a")], 0.0)
    assert eng.traffic.groups == {}
    unicast = resolve_profile(GROUP).downlink_cost(SIZE)
    assert eng.traffic.free_at("a") >= unicast.airtime_s


def test_a_member_without_a_shared_part_is_paced_per_device() -> None:
    eng = _engine({"a": UNICAST})
    eng.charge_downlink([_job_wide()], 0.0)
    assert eng.traffic.groups == {}
    assert eng.next_version_at >= 86_400.0 * 34 / 10  # TTN: 34 frames at 10 a day


def test_an_answer_to_a_member_holds_its_own_link_not_the_versions() -> None:
    """What is addressed to a group member goes on its own unicast link, under its daily
    cap (TTN: 10 a day), but the versions reach it on the group: the next version does not
    wait for that link (it held a 100-agent fleet 2.4 days for one member's catch-up). An
    answer to a unicast agent still holds them: its versions use that very link."""
    eng = _engine({"a": GROUP, "u": UNICAST})
    frames = resolve_profile(GROUP).downlink_cost(SIZE).packets
    eng.charge_downlink([Outbound(topics.to_agent(JOB, "a"), b"x" * SIZE, target="a")], 0.0)
    assert eng.next_version_at == 0.0
    assert eng.traffic.own_free_at("a") == eng.traffic.free_at("a") >= 86_400.0 * frames / 10
    restored = RoundEngine.restore(eng.config, eng.export(), profiles=resolve_profile)
    assert restored.traffic.own_free_at("a") == eng.traffic.own_free_at("a")  # checkpointed
    eng.charge_downlink([Outbound(topics.to_agent(JOB, "u"), b"x" * SIZE, target="u")], 0.0)
    assert eng.next_version_at >= 86_400.0 * frames / 10
    assert eng.traffic.own_free_at("u") == 0.0


def test_a_members_stale_update_is_answered_only_when_it_is_sent_again() -> None:
    """A stale update (its version closed without it) of a group member is not answered
    the first time (the versions since reach it on its group); the same round again means
    it missed them, and is answered with the catch-up. A unicast agent is always answered."""
    eng = _engine({"a": GROUP, "u": UNICAST})
    member, unicast = eng.registry.get("a"), eng.registry.get("u")
    assert member is not None and unicast is not None
    assert eng.traffic.defer_stale(member, 3) is True
    assert eng.traffic.defer_stale(member, 3) is False  # a re-send: it missed the versions
    assert eng.traffic.defer_stale(member, 4) is True
    assert eng.traffic.defer_stale(unicast, 3) is False
