"""The agent's receive path with signed downlinks: forged stop and job settings are ignored
by an agent that has the aggregator's key and obeyed by one that has not."""

from __future__ import annotations

import logging

import pytest
from agent_harness import JOB, Clock, D, make_agent

from edge_agent.agent.loop import Agent
from edge_agent.protocol import jobinfo, messages, topics
from edge_agent.protocol.downlink import encode_state
from edge_agent.protocol.signing import Signer
from edge_agent.transports import Message

AGGREGATOR = Signer(bytes(range(32)))
FORGER = Signer(bytes(range(5, 37)))
STOP = messages.dump(messages.Control(cmd="stop", version=3))
CONTROL = topics.control(JOB)
TO_ME = topics.to_agent(JOB, "me")


def _job(d: int) -> bytes:
    return jobinfo.JobInfo(
        job=JOB, d=d, model="logreg", feedback="none", family="mean", compressors=("topk",)
    ).dump()


def _agent(memory_url: str, *, keyed: bool, not_before_us: int = 0) -> Agent:
    keys = (AGGREGATOR.public_key,) if keyed else ()
    return make_agent(
        memory_url, Clock(), aggregator_keys=keys, aggregator_not_before_us=not_before_us
    )


def test_a_keyed_agent_ignores_forged_stop_and_job_and_logs_once_per_reason(
    memory_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    agent = _agent(memory_url, keyed=True)
    with caplog.at_level(logging.WARNING, logger="edge_agent"):
        for _ in range(2):
            agent.handle(Message(CONTROL, STOP))  # unsigned
            agent.handle(Message(CONTROL, FORGER.seal(CONTROL, STOP, 10**18)))  # another key
            agent.handle(Message(topics.job_info(JOB), _job(D + 1)))  # unsigned, retained
            agent.handle(Message(TO_ME, FORGER.seal(TO_ME, _job(D + 1), 10**18)))
    assert not agent.finished and agent.gave_up is None and not agent._stop.is_set()
    assert agent.counters.dropped == {"unsigned": 4, "bad_signature": 4}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "unsigned" in warnings[0] and "does not verify" in warnings[1]


def test_a_keyed_agent_acts_on_the_aggregators_signed_messages(memory_url: str) -> None:
    agent = _agent(memory_url, keyed=True)
    state = encode_state([0.5] * D, job=JOB, version=2)
    agent.handle(Message(topics.model(JOB), AGGREGATOR.seal(topics.model(JOB), state, 1)))
    assert agent.version == 2 and agent.x is not None and agent.x.tolist() == [0.5] * D
    agent.handle(Message(TO_ME, AGGREGATOR.seal(TO_ME, _job(D + 1), 2)))
    assert agent.gave_up is not None and f"d={D + 1}" in agent.gave_up
    agent.handle(Message(CONTROL, AGGREGATOR.seal(CONTROL, STOP, 3)))
    assert agent.finished
    assert agent.counters.dropped == {}


def test_a_replayed_or_misdirected_signed_message_is_refused(memory_url: str) -> None:
    agent = _agent(memory_url, keyed=True)
    pause = messages.dump(messages.Control(cmd="pause"))
    agent.handle(Message(CONTROL, AGGREGATOR.seal(CONTROL, pause, 20)))
    assert agent.paused
    old_stop = AGGREGATOR.seal(CONTROL, STOP, 10)  # recorded before the pause
    agent.handle(Message(CONTROL, old_stop))
    agent.handle(Message(CONTROL, AGGREGATOR.seal(CONTROL, pause, 20)))  # delivered again
    other = topics.to_agent(JOB, "other")  # signed for another agent, re-published to me
    agent.handle(Message(TO_ME, AGGREGATOR.seal(other, STOP, 30)))
    agent.handle(Message(topics.delta(JOB), AGGREGATOR.seal(CONTROL, STOP, 31)))
    assert not agent.finished
    assert agent.counters.dropped == {"replayed": 1, "repeated": 1, "bad_signature": 2}
    agent.handle(Message(CONTROL, AGGREGATOR.seal(CONTROL, STOP, 21)))
    assert agent.finished


def test_a_fresh_agent_refuses_control_signed_before_it_started(memory_url: str) -> None:
    agent = _agent(memory_url, keyed=True, not_before_us=1_000)
    agent.handle(Message(CONTROL, AGGREGATOR.seal(CONTROL, STOP, 999)))  # an old run's stop
    agent.handle(Message(TO_ME, AGGREGATOR.seal(TO_ME, STOP, 999)))
    assert not agent.finished and agent.counters.dropped == {"replayed": 2}
    # a retained job topic may hold an old valid message: its settings are never fatal
    # by themselves; the ones addressed in answer to a hello are
    agent.handle(Message(topics.job_info(JOB), AGGREGATOR.seal(topics.job_info(JOB), _job(7), 5)))
    assert agent.gave_up is None
    agent.handle(Message(CONTROL, AGGREGATOR.seal(CONTROL, STOP, 1_000)))
    assert agent.finished


def test_an_agent_without_the_key_takes_unsigned_and_signed_messages_as_before(
    memory_url: str,
) -> None:
    agent = _agent(memory_url, keyed=False)
    agent.handle(Message(topics.job_info(JOB), _job(D + 1)))  # unsigned: as today
    assert agent.gave_up is not None
    other = _agent(memory_url, keyed=False)
    state = encode_state([0.25] * D, job=JOB, version=4)
    other.handle(Message(topics.model(JOB), FORGER.seal(topics.model(JOB), state, 1)))
    assert other.version == 4  # the trailer is skipped, not checked
    other.handle(Message(CONTROL, AGGREGATOR.seal(CONTROL, STOP, 2)))
    assert other.finished and other.counters.dropped == {}
    third = _agent(memory_url, keyed=False)
    third.handle(Message(CONTROL, STOP))
    assert third.finished


def test_the_received_bytes_are_priced_with_the_signature(memory_url: str) -> None:
    keyed, plain = _agent(memory_url, keyed=True), _agent(memory_url, keyed=False)
    state = encode_state([0.5] * D, job=JOB, version=2)
    sealed = AGGREGATOR.seal(topics.model(JOB), state, 1)
    keyed.handle(Message(topics.model(JOB), sealed))
    plain.handle(Message(topics.model(JOB), state))
    assert keyed.ledger.down.bytes - plain.ledger.down.bytes == len(sealed) - len(state) == 74
