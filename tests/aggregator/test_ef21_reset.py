"""EF21 state reset, end to end: real Agents and the RoundEngine over memory://.

An EF21 agent's state h_i must equal the aggregator's copy at all times. One of its
changes is held back (a broker queue, a sleeping radio) until it is older than the
de-duplication window; when it finally arrives the engine can no longer tell whether it
was applied, drops its copy and asks the agent to reset; afterwards both sides agree
again, bit for bit.
"""

from __future__ import annotations

import numpy as np

from aggregator.rounds import EngineConfig, RoundEngine
from edge_agent.agent import Agent, AgentConfig
from edge_agent.data import make_rcv1_like
from edge_agent.models import make_model
from edge_agent.profiles import resolve_profile
from edge_agent.transports import Message, Transport, open_transport, topics

JOB = "reset"
D = 200


def _agent(url: str, name: str, seed: int) -> Agent:
    shard = make_rcv1_like(120, D, rng=np.random.default_rng(seed), nnz_per_row=15)
    return Agent(
        AgentConfig(job=JOB, agent_id=name, feedback="ef21", policy="fixed:20",
                    duty_cycle="ignore", resend_s=None),
        model=make_model("logreg", n_features=D),
        data=shard,
        profile=resolve_profile("lorawan_eu868_dr5_sf7"),
        transport=open_transport(url, role="agent", client_id=name),
    )  # fmt: skip


class Fleet:
    def __init__(self, url: str) -> None:
        self.engine = RoundEngine(
            EngineConfig(job=JOB, d=D, mode="async", async_apply_every=1, max_staleness=2,
                         dedupe_window=2, min_agents=2, step_size=0.5)
        )  # fmt: skip
        self.hub: Transport = open_transport(url, role="aggregator", client_id="engine")
        self.hub.connect()
        for pattern in topics.agent_inbound(JOB):
            self.hub.subscribe(pattern)
        self.agents = [_agent(url, "a1", 1), _agent(url, "a2", 2)]
        self.held: list[Message] = []
        self.hold_next_update_of: str | None = None
        self.reasons: list[str | None] = []
        for a in self.agents:
            a.start()
        self.publish(self.engine.snapshot_message())

    def publish(self, *outs: object) -> None:
        for out in outs:
            self.hub.publish(out.topic, out.payload, retain=out.retain)  # type: ignore[attr-defined]

    def deliver(self, m: Message) -> None:
        eff = self.engine.handle(m.topic, m.payload, 1.0)
        self.reasons.append(eff.reason)
        self.publish(*eff.outbound)

    def turn(self) -> None:
        for a in self.agents:
            while (m := a.transport.recv(timeout_s=0)) is not None:
                a.handle(m)
            a.step()
        while (m := self.hub.recv(timeout_s=0)) is not None:
            agent = topics.parse(m.topic).agent
            if topics.parse(m.topic).kind == "update" and agent == self.hold_next_update_of:
                self.held.append(m)
                self.hold_next_update_of = None
                continue
            self.deliver(m)


def test_a_change_older_than_the_window_resets_both_sides_and_they_agree_again(
    memory_url: str,
) -> None:
    fleet = Fleet(memory_url)
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
    for a in fleet.agents:  # take the last deltas
        while (m := a.transport.recv(timeout_s=0)) is not None:
            a.handle(m)
    versions = [a.version for a in fleet.agents]
    assert versions == [eng.version] * 2  # everyone on the newest model
    for a in fleet.agents:
        a.transport.close()
    fleet.hub.close()
