"""The in-process fleet harness: real agents and engine over a private memory:// broker."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.sim.harness import FleetHarness
from edge_agent.agent.loop import AgentConfig
from edge_agent.data import make_rcv1_like
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.models import make_model
from edge_agent.protocol import topics
from edge_agent.transports import get_broker, open_transport

JOB = "harness"
D = 60


def _fleet(agents: int = 2) -> FleetHarness:
    engine = RoundEngine(EngineConfig(job=JOB, d=D, min_agents=agents, step_size=0.5))
    harness = FleetHarness(engine, name="test")
    for i in range(agents):
        harness.add_agent(
            AgentConfig(job=JOB, agent_id=f"a{i}", policy="fixed:6", resend_s=None,
                        duty_cycle="ignore", seed=i),
            model=make_model("logreg", n_features=D),
            data=make_rcv1_like(40, D, rng=np.random.default_rng(i), nnz_per_row=8),
            profile=resolve_profile("paper_payload_bits"),
        )  # fmt: skip
    return harness


def test_rounds_advance_one_version_each_and_every_copy_is_the_engines() -> None:
    with _fleet() as fleet:
        fleet.start()
        assert fleet.engine.version == 0 and fleet.deliver() == 0  # nothing pumped yet
        fleet.pump(strict=True)  # hellos in, the model out
        for k in range(4):
            assert fleet.deliver() > 0
            logs = fleet.step()
            assert [e.round if e is not None else None for e in logs] == [k, k]
            fleet.clock.now += 1.0
            fleet.pump(strict=True)
            assert fleet.engine.version == k + 1
        fleet.deliver()
        for agent in fleet.agents:
            assert agent.version == 4 and agent.x is not None
            assert agent.x.tobytes() == fleet.engine.x.tobytes()
            assert agent.clock() == 4.0  # the harness's simulated clock, not the wall clock
        assert all(e is not None for e in fleet.step())  # the answers to version 4...
        assert fleet.step() == [None, None]  # ...and nothing more until the engine moves


def test_pump_returns_effects_and_strict_raises_on_a_rejection() -> None:
    with _fleet() as fleet:
        fleet.start()
        effects = fleet.pump()
        assert [e.reason for e in effects[:-1]] == [None] * (len(effects) - 1)
        intruder = open_transport(fleet.url, role="agent", client_id="x")
        intruder.connect()
        intruder.publish(topics.update(JOB, "a0"), b"not an update")
        (rejected, _tick) = fleet.pump()
        assert rejected.reason is not None and rejected.outbound == ()
        intruder.publish(topics.update(JOB, "a0"), b"not an update")
        with pytest.raises(RuntimeError, match="rejected"):
            fleet.pump(strict=True)
        intruder.close()


def test_held_messages_can_be_handed_over_later() -> None:
    with _fleet() as fleet:
        fleet.start()
        fleet.pump(strict=True)
        fleet.deliver()
        fleet.step()
        held = list(fleet.waiting())
        assert [topics.parse(m.topic).kind for m in held] == ["update", "update"]
        assert fleet.pump(tick=False) == [] and fleet.engine.version == 0
        for msg in held:
            fleet.handle(msg, strict=True)
        assert fleet.engine.version == 1


def test_close_forgets_the_broker_and_closes_every_transport() -> None:
    fleet = _fleet()
    broker = get_broker(fleet.broker)
    with pytest.raises(KeyError), fleet:
        fleet.start()
        raise KeyError("a failing test body")
    assert get_broker(fleet.broker) is not broker  # a fresh one: the old name was dropped
    fleet.close()  # idempotent
    with pytest.raises(Exception):  # noqa: B017 - any transport error: it is closed
        fleet.agents[0].transport.publish(topics.update(JOB, "a0"), b"x")


def test_an_agent_for_another_job_is_refused() -> None:
    with _fleet(1) as fleet, pytest.raises(ValueError, match="job"):
        fleet.add_agent(
            AgentConfig(job="other", agent_id="z"),
            model=make_model("logreg", n_features=D),
            data=make_rcv1_like(10, D, rng=np.random.default_rng(0)),
            profile=resolve_profile("paper_payload_bits"),
        )
