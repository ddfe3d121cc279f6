"""An agent hears its refusals (logs, counts, gives up on those that cannot heal) and says
so when nothing answers its hellos (issue 12, finding 2)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from agent_harness import JOB, Clock, D, listen, make_agent

from edge_agent.agent.answers import NO_ANSWER_WARN_S
from edge_agent.protocol import messages, topics, wire
from edge_agent.transports import Message, Transport


def refused(agent: str, reason: str, detail: str = "") -> Message:
    ctl = messages.Control(cmd="refused", agent=agent, reason=reason, detail=detail)
    return Message(topics.control(JOB), messages.dump(ctl))


def hellos(peer: Transport) -> int:
    n = 0
    while (m := peer.recv(timeout_s=0)) is not None:
        n += topics.parse(m.topic).kind == "hello"
    return n


def test_refusals_are_logged_counted_and_end_the_agent_when_they_cannot_heal(
    memory_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    agent = make_agent(memory_url, Clock(), max_refusals=3)
    agent.start()
    with caplog.at_level(logging.WARNING, logger="edge_agent"):
        agent.handle(refused("someone-else", "wrong_d"))  # not for us: ignored
        assert agent.counters.refused == {}
        for i in range(2):
            agent.handle(refused("me", "wrong_semantics", "ef21 in a mean job"))
            assert agent.gave_up is None and agent.counters.refused["wrong_semantics"] == i + 1
        agent.handle(refused("me", "wrong_semantics", "ef21 in a mean job"))
    assert agent.counters.refused == {"wrong_semantics": 3}
    assert agent.gave_up is not None and "wrong_semantics" in agent.gave_up
    assert "ef21 in a mean job" in agent.gave_up
    agent.run(poll_s=0)  # returns at once: the agent stopped
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3 and "refused" in warnings[0].getMessage()
    agent.close()


def test_a_refusal_that_can_heal_never_ends_the_agent(memory_url: str) -> None:
    peer = listen(memory_url)
    agent = make_agent(memory_url, Clock(), max_refusals=1)
    agent.start()
    hellos(peer)
    # an update before an accepted hello: the agent (holding a model) says hello again
    agent.handle(Message(topics.model(JOB), wire.encode_snapshot(np.zeros(D), job=JOB, version=0)))
    assert agent.x is not None
    for _ in range(5):
        agent.handle(refused("me", "unknown_agent"))
    assert agent.gave_up is None and agent.counters.refused == {"unknown_agent": 5}
    assert hellos(peer) == 5
    agent.close()


def test_a_reset_counts_as_an_ef21_reset_refusal(memory_url: str) -> None:
    agent = make_agent(memory_url, Clock(), feedback="ef21")
    agent.start()
    ctl = messages.Control(cmd="reset", agent="me", version=0)
    agent.handle(Message(topics.control(JOB), messages.dump(ctl)))
    assert agent.counters.refused == {"ef21_reset": 1} and agent.counters.resets == 1
    assert agent.gave_up is None
    agent.close()


def test_an_agent_that_hears_nothing_says_so_with_what_it_tried(
    memory_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    agent = make_agent(memory_url, clock, resend_s=10.0)
    agent.start()
    with caplog.at_level(logging.WARNING, logger="edge_agent"):
        while clock.t < 1000.0 + NO_ANSWER_WARN_S - 1:
            clock.t += 0.5
            assert agent._tick()
        assert not caplog.records  # not yet
        while clock.t < 1000.0 + NO_ANSWER_WARN_S + 11:
            clock.t += 0.5
            agent._tick()
    [rec] = caplog.records
    line = rec.getMessage()
    assert rec.levelno == logging.WARNING and "no answer from the aggregator" in line
    assert memory_url in line and f"job {JOB}" in line
    assert topics.hello(JOB, "me") in line and topics.model(JOB) in line
    agent.close()


def test_anything_heard_keeps_the_warning_quiet(
    memory_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    agent = make_agent(memory_url, clock, resend_s=10.0)
    agent.start()
    resync = messages.dump(messages.Control(cmd="resync", version=0))
    with caplog.at_level(logging.WARNING, logger="edge_agent"):
        while clock.t < 1000.0 + 3 * NO_ANSWER_WARN_S:
            clock.t += 0.5
            if clock.t % 30 == 0:
                agent.handle(Message(topics.control(JOB), resync))
            agent._tick()
    assert not caplog.records
    agent.close()
