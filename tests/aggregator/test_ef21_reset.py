"""EF21 state reset, end to end: real Agents and the RoundEngine over memory://.

An EF21 agent's state h_i must equal the aggregator's copy at all times. One of its
changes is held back (a broker queue, a sleeping radio) until it is older than the
de-duplication window; when it finally arrives the engine can no longer tell whether it
was applied, drops its copy and asks the agent to reset; afterwards both sides agree
again, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.sim.harness import FleetHarness
from edge_agent.agent.loop import AgentConfig
from edge_agent.data import make_rcv1_like
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.models import make_model
from edge_agent.protocol import topics
from edge_agent.transports import Message

JOB = "reset"
D = 200


class Fleet:
    """Two EF21 agents and an async engine on the shared harness; ``turn()`` is one step of
    every agent followed by the engine taking what arrived, except an update held back."""

    def __init__(self) -> None:
        engine = RoundEngine(
            EngineConfig(job=JOB, d=D, mode="async", async_apply_every=1, max_staleness=2,
                         dedupe_window=2, min_agents=2, step_size=0.5)
        )  # fmt: skip
        self.harness = FleetHarness(engine, name="ef21-reset")
        self.harness.clock.now = 1.0
        self.engine = engine
        for name, seed in (("a1", 1), ("a2", 2)):
            self.harness.add_agent(
                AgentConfig(job=JOB, agent_id=name, feedback="ef21", policy="fixed:20",
                            duty_cycle="ignore", resend_s=None),
                model=make_model("logreg", n_features=D),
                data=make_rcv1_like(120, D, rng=np.random.default_rng(seed), nnz_per_row=15),
                profile=resolve_profile("lorawan_eu868_dr5_sf7"),
            )  # fmt: skip
        self.agents = self.harness.agents
        self.held: list[Message] = []
        self.hold_next_update_of: str | None = None
        self.reasons: list[str | None] = []
        self.harness.start()
        self.harness.publish(engine.snapshot_message())

    def deliver(self, m: Message) -> None:
        self.reasons.append(self.harness.handle(m).reason)

    def turn(self) -> None:
        self.harness.deliver()
        self.harness.step()
        for m in self.harness.waiting():
            parsed = topics.parse(m.topic)
            if parsed.kind == "update" and parsed.agent == self.hold_next_update_of:
                self.held.append(m)
                self.hold_next_update_of = None
                continue
            self.deliver(m)


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    made = Fleet()
    with made.harness:  # every transport closed, the broker dropped, whatever happens
        yield made


def test_a_change_older_than_the_window_resets_both_sides_and_they_agree_again(
    fleet: Fleet,
) -> None:
    eng = fleet.engine
    a1 = fleet.agents[0]
    for _ in range(3):
        fleet.turn()
    assert eng.version >= 2 and np.array_equal(eng.h["a1"], a1.feedback.state)
    fleet.hold_next_update_of = "a1"  # a1's next change is delayed...
    for _ in range(8):  # ...while the fleet moves on, well past the window of 2 versions
        fleet.turn()
    (late,) = fleet.held
    assert eng.version - 2 > 2
    # a1 counted the delayed change in its own h_1; the engine has not seen it
    assert not np.array_equal(eng.h["a1"], a1.feedback.state)
    fleet.deliver(late)
    assert fleet.reasons[-1] == "ef21_reset" and eng.agents["a1"].needs_reset
    assert "a1" not in eng.h
    for _ in range(4):
        fleet.turn()
    assert a1.counters.resets == 1 and not eng.agents["a1"].needs_reset
    # both sides rebuilt h_1 from zero with the same changes
    assert np.array_equal(eng.h["a1"], a1.feedback.state)
    assert np.array_equal(eng.h["a2"], fleet.agents[1].feedback.state)
    assert eng.sum_h is not None
    np.testing.assert_allclose(eng.sum_h, eng.h["a1"] + eng.h["a2"], rtol=1e-12, atol=1e-12)
    fleet.harness.deliver()  # take the last deltas
    versions = [a.version for a in fleet.agents]
    assert versions == [eng.version] * 2  # everyone on the newest model
