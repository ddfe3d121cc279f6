"""Refusals reach the refused (control ``refused``, rate-limited per agent and reason), and
an agent of another job is counted as rejected ``wrong_job`` (issue 12, findings 2 and 3)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.engine.refusals import MAX_TRACKED, REFUSAL_INTERVAL_S, Refusals
from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.service.ingest import AggregatorService
from aggregator.service.settings import load_settings
from edge_agent.numerics.compressors import compress
from edge_agent.protocol import messages, topics, wire
from edge_agent.transports import Message, Transport, open_transport

JOB = "job1"
D = 16


def make_engine() -> RoundEngine:
    return RoundEngine(EngineConfig(job=JOB, d=D, step_size=0.5))


def hello(agent: str, job: str = JOB, **fields: Any) -> tuple[str, bytes]:
    base: dict[str, Any] = {
        "job": job,
        "agent": agent,
        "d": D,
        "rows": 10,
        "smoothness": 2.0,
        "model": "logreg",
        "compressor": "topk",
    }
    base.update(fields)
    return topics.hello(job, agent), messages.dump(messages.Hello(**base))


def update(agent: str, semantics: str = "plain") -> tuple[str, bytes]:
    u = compress(np.arange(D, dtype=np.float64), "topk", 3)
    u = type(u)(u.compressor, u.d, u.indices, u.values, semantics=semantics)  # type: ignore[arg-type]
    return topics.update(JOB, agent), wire.encode(u, job=JOB, agent=agent, round=0, seq=0)


def refusals(outbound: tuple[Any, ...]) -> list[messages.Control]:
    ctls = [
        messages.parse(messages.Control, o.payload)
        for o in outbound
        if o.topic == topics.control(JOB)
    ]
    return [c for c in ctls if c.cmd == "refused"]


# ---------------------------------------------------------------- the engine


@pytest.mark.parametrize(
    ("fields", "reason", "in_detail"),
    [
        ({"d": D + 1}, "wrong_d", f"d={D + 1}"),
        ({"model": "lsq"}, "wrong_model", "'lsq'"),
        ({"compressor": "zip"}, "wrong_compressor", "'zip'"),
    ],
)
def test_a_refused_hello_is_answered_to_that_agent(
    fields: dict[str, Any], reason: str, in_detail: str
) -> None:
    eng = make_engine()
    eff = eng.handle(*hello("bad", **fields), 0.0)
    assert eff.reason == reason and eng.rejected[reason] == 1
    [ctl] = refusals(eff.outbound)
    assert (ctl.agent, ctl.reason) == ("bad", reason)
    assert in_detail in ctl.detail


@pytest.mark.parametrize(
    ("fields", "in_detail"),
    [({}, "full gradients"), ({"batch_size": 0.2}, "batch size 0.2")],
)
def test_a_minibatch_job_refuses_a_hello_with_another_batch_and_takes_its_own(
    fields: dict[str, Any], in_detail: str
) -> None:
    eng = RoundEngine(EngineConfig(job=JOB, d=D, step_size=0.5, batch_size=0.1))
    eff = eng.handle(*hello("bad", **fields), 0.0)
    assert eff.reason == "wrong_batch_size" and eng.rejected["wrong_batch_size"] == 1
    [ctl] = refusals(eff.outbound)
    assert (ctl.agent, ctl.reason) == ("bad", "wrong_batch_size")
    assert in_detail in ctl.detail and "--batch-size 0.1" in ctl.detail
    assert "wrong_batch_size" in messages.REFUSAL_FATAL  # the agent gives up, as on wrong_d
    assert eng.handle(*hello("good", batch_size=0.1), 1.0).reason is None
    # a job without AGG_BATCH_SIZE takes any batch, full gradients included
    anyjob = make_engine()
    assert anyjob.handle(*hello("sgd", batch_size=0.2), 0.0).reason is None
    assert anyjob.handle(*hello("gd"), 0.0).reason is None


def test_wrong_semantics_is_answered_and_the_update_before_a_hello_too() -> None:
    eng = make_engine()
    assert eng.handle(*hello("a"), 0.0).reason is None
    assert eng.handle(*hello("b"), 0.0).reason is None  # the job is plain (family mean)
    eff = eng.handle(*hello("e", semantics="ef21"), 1.0)
    [ctl] = refusals(eff.outbound)
    assert (ctl.agent, ctl.reason) == ("e", "wrong_semantics")
    assert "ef21 in a mean job" in ctl.detail
    # the refused agent got the model anyway (request) and sends updates: unknown_agent
    eff = eng.handle(*update("e", "ef21"), 2.0)
    [ctl] = refusals(eff.outbound)
    assert (ctl.agent, ctl.reason) == ("e", "unknown_agent")


def test_refusals_are_rate_limited_per_agent_and_reason() -> None:
    eng = make_engine()
    bad = hello("bad", d=D + 1)
    assert len(refusals(eng.handle(*bad, 100.0).outbound)) == 1
    for now in (101.0, 110.0, 100.0 + REFUSAL_INTERVAL_S - 0.5):
        assert refusals(eng.handle(*bad, now).outbound) == []
    # another agent, or another reason of the same agent, is told at once
    assert len(refusals(eng.handle(*hello("bad2", d=D + 1), 101.0).outbound)) == 1
    assert len(refusals(eng.handle(*hello("bad", model="lsq"), 101.0).outbound)) == 1
    # and the first again once the interval is over
    assert len(refusals(eng.handle(*bad, 100.0 + REFUSAL_INTERVAL_S).outbound)) == 1
    assert eng.rejected["wrong_d"] == 6  # every one counted, told or not


def test_rejections_that_do_not_concern_a_sender_are_not_answered() -> None:
    eng = make_engine()
    eng.handle(*hello("a"), 0.0)
    # a status of an unknown agent, a duplicate, a wrong job: counted, nobody told
    status = messages.dump(messages.Status(state="offline", agent="ghost"))
    assert eng.handle(topics.status(JOB, "ghost"), status, 1.0).reason == "unknown_agent"
    assert eng.handle(*update("a"), 1.0).reason is None
    eff = eng.handle(*update("a"), 3.0)  # a duplicate: answered with the model, not refused
    assert eff.reason == "duplicate" and refusals(eff.outbound) == []
    eff = eng.handle(*hello("x", job="other"), 4.0)
    assert eff.reason == "wrong_job" and eff.outbound == ()


def test_the_rate_limit_memory_is_bounded() -> None:
    r = Refusals(JOB)
    for i in range(MAX_TRACKED + 10):
        assert r.tell(f"a{i}", "wrong_d", "", float(i), 0) is not None
    assert len(r._told_at) <= MAX_TRACKED
    assert r.tell("a1", "stale", "", 0.0, 0) is None  # not a reason that concerns it


# ---------------------------------------------------------------- the service


@pytest.fixture
def service(tmp_path: Path, memory_url: str) -> Iterator[AggregatorService]:
    settings = load_settings(job=JOB, d=D, transports=[memory_url], data_dir=tmp_path / "agg")
    svc = AggregatorService(settings)
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


def _client(url: str, job: str) -> Transport:
    t = open_transport(url, role="agent", client_id=f"test-{job}")
    t.connect()
    for pattern in topics.agent_subscriptions(job):
        t.subscribe(pattern)
    return t


def _wait_for(what: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(0.02)
    return what()


def test_an_agent_of_another_job_is_counted_as_wrong_job(
    service: AggregatorService, memory_url: str
) -> None:
    agent = _client(memory_url, "demo")
    try:
        agent.publish(*hello("lost", job="demo"))
        assert _wait_for(lambda: service.read(lambda e: e.rejected["wrong_job"]) == 1)
        assert service.read(lambda e: dict(e.agents)) == {}
    finally:
        agent.close()


def test_the_service_publishes_the_refusal_to_the_agent(
    service: AggregatorService, memory_url: str
) -> None:
    agent = _client(memory_url, JOB)
    try:
        agent.publish(*hello("wide", d=D * 2))
        got: list[messages.Control] = []

        def refused() -> bool:
            msg: Message | None = agent.recv(timeout_s=0)
            while msg is not None:
                if msg.topic == topics.control(JOB):
                    ctl = messages.parse(messages.Control, msg.payload)
                    if ctl.cmd == "refused":
                        got.append(ctl)
                msg = agent.recv(timeout_s=0)
            return bool(got)

        assert _wait_for(refused)
        assert (got[0].agent, got[0].reason) == ("wide", "wrong_d")
    finally:
        agent.close()


# ---------------------------------------------------------------- engine and agent


def test_an_ef21_agent_in_a_plain_job_hears_why_and_gives_up(memory_url: str) -> None:
    """The issue's case: the agent sat through hundreds of rounds, refused, none the wiser."""
    from edge_agent.agent.loop import Agent, AgentConfig
    from edge_agent.data import make_rcv1_like
    from edge_agent.links.catalog import resolve_profile
    from edge_agent.numerics.models import make_model

    now = [0.0]
    eng = make_engine()
    eng.handle(*hello("plain-1"), now[0])  # the job's family: mean
    agg = open_transport(memory_url, role="aggregator", client_id="agg")
    agg.connect()
    for pattern in topics.agent_inbound(JOB):
        agg.subscribe(pattern)
    agg.publish(*_retained(eng), retain=True)
    agent = Agent(
        AgentConfig(job=JOB, agent_id="e", feedback="ef21", duty_cycle="ignore", resend_s=10.0),
        model=make_model("logreg", n_features=D),
        data=make_rcv1_like(20, D, rng=np.random.default_rng(1), nnz_per_row=4),
        profile=resolve_profile("wifi_rpi4_mqtt_tls13"),
        transport=open_transport(memory_url, role="agent", client_id="e"),
        smoothness=1.0,
        clock=lambda: now[0],
    )
    agent.start()
    while agent.gave_up is None and now[0] < 600.0:
        now[0] += 0.5
        while (m := agg.recv(timeout_s=0)) is not None:
            for o in eng.handle(m.topic, m.payload, now[0]).outbound:
                agg.publish(o.topic, o.payload, retain=o.retain)
        while (m := agent.transport.recv(timeout_s=0)) is not None:
            agent.handle(m)
        agent._tick()
    assert agent.gave_up is not None and "wrong_semantics" in agent.gave_up
    assert agent.counters.refused["wrong_semantics"] == 3
    assert agent.counters.refused.get("unknown_agent", 0) >= 1  # its updates, then a hello
    # three refusals 30 s apart at most: about a minute, not 961 rounds
    assert now[0] <= 3 * REFUSAL_INTERVAL_S + 20
    assert "e" not in eng.agents and eng.rejected["wrong_semantics"] >= 3
    agent.close()
    agg.close()


def _retained(eng: RoundEngine) -> tuple[str, bytes]:
    snap = eng.snapshot_message()
    return snap.topic, snap.payload
