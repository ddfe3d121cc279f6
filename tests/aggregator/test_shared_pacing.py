"""A job-wide message to a multicast group is sent once: the group's airtime once, each
member its energy, the group paced by its own busy time; answers stay unicast."""

from __future__ import annotations

import math

import numpy as np

from aggregator.engine.downlink.outbound import Outbound
from aggregator.engine.rounds import EngineConfig, RoundEngine
from edge_agent.links.profiles import resolve_profile
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
