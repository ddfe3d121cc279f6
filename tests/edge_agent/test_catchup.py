"""An agent whose model copy cannot follow the broadcast asks once, in the form that gets
it what it lacks, backs off, and respects its duty cycle (the MQTT-with-defaults stall: an
EF21 replica that loaded a snapshot without the aggregate h dropped every step and asked
for steps again, thousands of times)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from agent_harness import JOB, Clock, D, listen, make_agent

from edge_agent.agent.catchup import FIRST_BACKOFF_S, REPEATED_DROPS, CatchUp
from edge_agent.numerics.compressors import compress
from edge_agent.protocol import messages, topics, wire
from edge_agent.protocol.downlink import add_op, encode_state, encode_steps, step_op
from edge_agent.transports import Message, Transport


def requests(peer: Transport) -> list[messages.Request]:
    out = []
    while (m := peer.recv(timeout_s=0)) is not None:
        if topics.parse(m.topic).kind == "request":
            out.append(messages.parse(messages.Request, m.payload))
    return out


def ef21_steps(base: int) -> Message:
    """Steps base -> base+1 that add an EF21 change and step with the aggregate h."""
    upd = compress(np.arange(D, dtype=np.float64), "topk", 4, rng=np.random.default_rng(0))
    blob = wire.encode(upd, job=JOB, agent="a", round=base, seq=0)
    ops = [add_op(blob, wire.body_offset(blob), upd.t), step_op(0.1)]
    payload = encode_steps(ops, job=JOB, d=D, base_version=base, version=base + 1, family="ef21")
    return Message(topics.delta(JOB), payload)


def plain_snapshot(version: int) -> Message:
    """What the retained model topic held before the job's family was known: no h."""
    return Message(topics.model(JOB), encode_state(np.zeros(D), job=JOB, version=version))


def test_steps_without_the_aggregate_cost_one_snapshot_request(memory_url: str) -> None:
    clock = Clock()
    peer = listen(memory_url)
    agent = make_agent(memory_url, clock, feedback="ef21")
    agent.start()
    agent.handle(plain_snapshot(0))
    requests(peer)  # the start-up request
    clock.t += 10 * FIRST_BACKOFF_S  # its back-off is over
    for _ in range(50):
        agent.handle(ef21_steps(0))
    assert agent.counters.dropped["no_aggregate"] == 50
    assert [r.have for r in requests(peer)] == [None]  # one request, for a snapshot (h)
    agent.close()
    peer.close()


def test_a_state_snapshot_with_the_aggregate_lets_the_steps_apply(memory_url: str) -> None:
    clock = Clock()
    agent = make_agent(memory_url, clock, feedback="ef21")
    agent.start()
    agent.handle(plain_snapshot(0))
    agent.handle(ef21_steps(0))
    assert agent.version == 0 and agent.catchup.want == "snapshot"
    state = encode_state(np.zeros(D), job=JOB, version=0, aggregate=np.zeros(D))
    agent.handle(Message(topics.to_agent(JOB, "me"), state))
    agent.handle(ef21_steps(0))
    assert agent.version == 1 and agent.catchup.want is None and agent.counters.steps == 1
    agent.close()


def test_unanswered_requests_back_off_exponentially_to_a_bound(memory_url: str) -> None:
    clock = Clock()
    peer = listen(memory_url)
    agent = make_agent(memory_url, clock, feedback="ef21", resend_s=8.0)
    agent.start()
    agent.handle(plain_snapshot(0))
    requests(peer)
    sent_at: list[float] = []
    while clock.t < 1060.0:
        clock.t += 0.25
        agent.handle(ef21_steps(0))  # the fleet moves on; this agent cannot follow
        agent._tick()
        sent_at.extend(clock.t for _ in requests(peer))
    gaps = np.diff(sent_at)
    assert gaps.max() <= 8.0 + 0.25  # bounded by the cap
    assert list(gaps[:3]) == pytest.approx([2.0, 4.0, 8.0], abs=0.26)
    assert len(sent_at) <= 3 + 60 / 8 + 1
    agent.close()
    peer.close()


def test_requests_wait_for_the_duty_cycle(memory_url: str) -> None:
    clock = Clock()
    peer = listen(memory_url)
    agent = make_agent(
        memory_url, clock, profile="lorawan_eu868_dr5_sf7", duty_cycle="wait", feedback="ef21"
    )
    agent.start()
    agent.handle(plain_snapshot(0))
    quiet_until = agent.uplink.free_at
    assert quiet_until > clock.t + 1.0  # the hello owes the radio silence
    requests(peer)
    agent.handle(ef21_steps(0))
    assert requests(peer) == []  # wanted, but the radio must stay silent
    while clock.t < quiet_until - 0.1:
        clock.t += 0.1
        agent._tick()
    assert requests(peer) == []
    clock.t = quiet_until
    agent._tick()
    assert [r.have for r in requests(peer)] == [None]
    agent.close()
    peer.close()


def test_repeated_drops_are_logged_once_per_reason(
    memory_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    agent = make_agent(memory_url, Clock(), feedback="ef21")
    agent.start()
    agent.handle(plain_snapshot(0))
    with caplog.at_level(logging.INFO, logger="edge_agent"):
        for _ in range(3 * REPEATED_DROPS):
            agent.handle(ef21_steps(0))
    lines = [r for r in caplog.records if "no_aggregate" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO, logging.WARNING]
    agent.close()


def test_a_gap_asks_for_steps_and_a_snapshot_need_is_not_narrowed() -> None:
    c = CatchUp(30.0)
    c.need("steps")
    assert c.request(0.0, 7) == messages.Request(have=7)
    c.need("snapshot")
    c.need("steps")
    assert c.request(0.5, 7) is None  # backing off
    assert c.request(1.0, 7) == messages.Request(have=None)


def test_the_start_up_request_survives_the_retained_snapshot(memory_url: str) -> None:
    """Over MQTT the retained snapshot (the model as of the aggregator's start) may arrive
    before the start-up request leaves the radio: the request still goes, and only an
    answer addressed to the agent settles it."""
    clock = Clock()
    peer = listen(memory_url)
    agent = make_agent(memory_url, clock, feedback="ef21", duty_cycle="wait")
    agent.start()
    assert requests(peer) == []  # the hello's airtime: the request waits
    agent.handle(plain_snapshot(0))
    clock.t = agent.uplink.free_at
    agent._tick()
    assert [r.have for r in requests(peer)] == [None]
    answer = encode_state(np.zeros(D), job=JOB, version=5, aggregate=np.zeros(D))
    agent.handle(Message(topics.to_agent(JOB, "me"), answer))
    assert agent.catchup.want is None and agent.version == 5
    agent.close()
    peer.close()
