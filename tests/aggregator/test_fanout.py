"""Bounded fan-out (aggregator.engine.downlink.pacing): an answer meant for one agent goes on that agent's
``cat/<job>/to/<agent>`` only, costs that agent only, snapshot answers are rate-limited per
agent, everything published is counted by kind, and every message a known agent sends is
priced into its ``sent`` account."""

from __future__ import annotations

from typing import Any

import numpy as np

from aggregator.engine.downlink.outbound import PUBLISHED_KINDS, Outbound
from aggregator.engine.downlink.pacing import SNAPSHOT_ANSWER_INTERVAL_S
from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.web.metrics import AggregatorMetrics
from edge_agent.links.catalog import resolve_profile
from edge_agent.links.cost import ZERO
from edge_agent.numerics.compressors import Update
from edge_agent.protocol import messages, topics, wire

JOB = "fan"
D = 64
LORA = "lorawan_eu868_dr5_sf7"


def _engine(**overrides: Any) -> RoundEngine:
    cfg: dict[str, Any] = {"job": JOB, "d": D, "step_size": 0.1, "round_deadline_s": 10.0}
    cfg.update(overrides)
    x0 = np.linspace(-1.0, 1.0, D)  # a model that does not compress: snapshots are ~8*d
    return RoundEngine(EngineConfig(**cfg), x0=x0, profiles=resolve_profile)


def _hello(agent: str, **fields: Any) -> tuple[str, bytes]:
    hello = messages.Hello(
        job=JOB,
        agent=agent,
        d=D,
        rows=10,
        smoothness=2.0,
        model="logreg",
        compressor="dense",
        profile=LORA,
        **fields,
    )
    return topics.hello(JOB, agent), messages.dump(hello)


def _update(agent: str, round: int, seq: int = 0) -> tuple[str, bytes]:
    vals = np.full(D, 0.01, dtype=np.float32)
    u = Update("dense", D, None, vals, semantics="plain")
    return topics.update(JOB, agent), wire.encode(u, job=JOB, agent=agent, round=round, seq=seq)


def _request(agent: str, have: int | None) -> tuple[str, bytes]:
    return topics.request(JOB, agent), messages.dump(messages.Request(have=have))


def _fleet(eng: RoundEngine, *agents: str, now: float = 0.0) -> None:
    for a in agents:
        assert eng.handle(*_hello(a), now).reason is None


def _publish(eng: RoundEngine, out: tuple[Outbound, ...], now: float) -> None:
    """What the service does with an engine's outbound (charge, count)."""
    eng.charge_downlink(out, now)


def _reaches(agent: str, out: Outbound) -> bool:
    """Whether ``out`` is delivered to ``agent`` by its subscriptions (MQTT semantics, which
    the memory and ZeroMQ transports implement with the same matcher)."""
    return any(topics.matches(p, out.topic) for p in topics.agent_subscriptions(JOB, agent))


def _round(eng: RoundEngine, agents: tuple[str, ...], now: float) -> tuple[Outbound, ...]:
    """Every agent reports for the current version: the round closes."""
    out: tuple[Outbound, ...] = ()
    for a in agents:
        eff = eng.handle(*_update(a, eng.version), now)
        assert eff.reason is None, eff.reason
        out += eff.outbound
    return out


def test_a_request_is_answered_on_the_requesters_topic_only() -> None:
    eng = _engine()
    _fleet(eng, "a", "b", "c")
    before = {k: v.down for k, v in eng.agents.items()}
    eff = eng.handle(*_request("a", None), 1.0)
    assert eff.outbound, "a request must be answered"
    for o in eff.outbound:
        assert o.topic == topics.to_agent(JOB, "a") and o.target == "a" and not o.retain
        assert _reaches("a", o) and not _reaches("b", o) and not _reaches("c", o)
    assert [o.kind for o in eff.outbound] == ["agent_snapshot"]
    _publish(eng, eff.outbound, 1.0)
    size = len(eff.outbound[0].payload)
    assert eng.agents["a"].down.messages == before["a"].messages + 1
    assert eng.agents["a"].down.bytes == before["a"].bytes + size
    assert eng.agents["b"].down == before["b"] and eng.agents["c"].down == before["c"]
    # the job-wide broadcast still reaches (and costs) everyone
    wide = (eng.snapshot_message(),)
    assert all(_reaches(a, wide[0]) for a in "abc")
    _publish(eng, wide, 2.0)
    assert all(eng.agents[a].down.messages == before[a].messages + 1 + (a == "a") for a in "abc")


def test_a_storm_of_requests_yields_at_most_the_rate_limits_snapshots() -> None:
    """500 requests from one agent over 50 s of engine time: one snapshot per interval
    (25 at 2 s), the rest withheld; the other agents receive and pay nothing."""
    eng = _engine()
    _fleet(eng, "a", "b", "c")
    snapshot_size = len(eng.snapshot_message().payload)
    assert snapshot_size > 8 * D
    sent: list[Outbound] = []
    for i in range(500):
        now = 100.0 + 0.1 * i
        eff = eng.handle(*_request("a", None), now)
        _publish(eng, eff.outbound, now)
        sent.extend(eff.outbound)
    span = 0.1 * 499
    limit = int(span // SNAPSHOT_ANSWER_INTERVAL_S) + 1
    snapshots = [o for o in sent if o.kind == "agent_snapshot"]
    assert len(snapshots) == limit == 25
    assert eng.traffic.withheld == 500 - limit
    assert all(o.target == "a" for o in sent)
    assert eng.agents["b"].down == ZERO and eng.agents["c"].down == ZERO
    published = eng.traffic.published
    assert published["agent_snapshot"] == [limit, limit * snapshot_size]
    assert sum(n for n, _ in published.values()) == len(sent)


def test_catch_up_steps_go_every_time_and_a_duplicate_is_answered_alone() -> None:
    eng = _engine()
    agents = ("a", "b")
    _fleet(eng, *agents)
    out = _round(eng, agents, 1.0)
    assert eng.version == 1
    wide = [o for o in out if o.target is None]
    assert wide and all(o.kind in ("steps", "delta") for o in wide)
    for i in range(20):  # small: never rate-limited
        eff = eng.handle(*_request("a", 0), 2.0 + 0.01 * i)
        assert [o.kind for o in eff.outbound] == ["catchup"]
        assert eff.outbound[0].topic == topics.to_agent(JOB, "a")
    # a re-send of a's applied update for version 0: the answer goes to a alone
    eff = eng.handle(*_update("a", 0), 3.0)
    assert eff.reason == "duplicate"
    assert eff.outbound and all(o.target == "a" for o in eff.outbound)
    assert eng.traffic.withheld == 0


def test_a_paused_job_tells_the_requester_alone() -> None:
    eng = _engine()
    _fleet(eng, "a", "b")
    eng.control("pause", 1.0)
    eff = eng.handle(*_request("a", 0), 2.0)
    kinds = [o.kind for o in eff.outbound]
    assert "agent_control" in kinds and all(o.target == "a" for o in eff.outbound)
    ctl = next(o for o in eff.outbound if o.kind == "agent_control")
    assert messages.parse(messages.Control, ctl.payload).cmd == "pause"


def test_published_messages_are_counted_by_kind_in_metrics() -> None:
    eng = _engine()
    agents = ("a", "b")
    _fleet(eng, *agents)
    start = (eng.snapshot_message(), eng.resync_message())
    _publish(eng, start, 0.0)
    out = _round(eng, agents, 1.0)
    _publish(eng, out, 1.0)
    answer = eng.handle(*_request("b", None), 2.0).outbound
    _publish(eng, answer, 2.0)
    everything = [*start, *out, *answer]
    expected: dict[str, list[int]] = {k: [0, 0] for k in PUBLISHED_KINDS}
    for o in everything:
        expected[o.kind][0] += 1
        expected[o.kind][1] += len(o.payload)
    assert expected["snapshot"][0] == 1 and expected["control"][0] == 1
    assert expected["agent_snapshot"][0] == 1
    assert expected["steps"][0] + expected["delta"][0] == 1
    assert eng.traffic.published == expected

    metrics = AggregatorMetrics()
    snap = {
        "healthy": True,
        "rounds": eng.rounds,
        "version": eng.version,
        "accepted": eng.accepted,
        "rejected": dict(eng.rejected),
        "totals": eng.totals.to_dict(),
        "totals_down": eng.totals_down.to_dict(),
        "published": {k: tuple(v) for k, v in eng.traffic.published.items()},
        "snapshots_withheld": eng.traffic.withheld,
        "agents": len(eng.agents),
        "live_agents": eng.live_agents,
        "loss": None,
        "accuracy": None,
    }
    metrics.bind(lambda: snap)
    text = metrics.render().decode()
    for kind, (n, size) in expected.items():
        assert f'cat_published_messages_total{{kind="{kind}"}} {float(n)}' in text
        assert f'cat_published_bytes_total{{kind="{kind}"}} {float(size)}' in text
    assert "cat_snapshot_answers_withheld_total 0.0" in text


def test_sent_prices_every_message_of_a_known_agent_on_its_uplink() -> None:
    """Hellos, requests, status and refused updates count in ``sent``; ``spend`` stays the
    accepted updates only. Messages before the first hello (unknown agent) do not count."""
    eng = _engine()
    lora = resolve_profile(LORA)
    early = _request("a", None)
    assert eng.handle(*early, 0.0).reason == "unknown_agent"  # before its hello: not counted
    msgs = [
        _hello("a"),
        _request("a", None),
        _update("a", 0),
        _update("a", 0),  # a duplicate: refused
        _update("a", 7),  # from the future: refused
        (topics.status(JOB, "a"), messages.dump(messages.Status(state="online", agent="a"))),
    ]
    for m in msgs:
        eng.handle(*m, 1.0)
    info = eng.agents["a"]
    expected = ZERO
    for _, payload in msgs:
        expected = expected + lora.message_cost(len(payload)).cost
    assert info.sent.messages == len(msgs) and info.sent.bytes == expected.bytes
    assert info.sent.packets == expected.packets
    assert np.isclose(info.sent.airtime_s, expected.airtime_s, rtol=1e-12)
    assert np.isclose(info.sent.energy_j, expected.energy_j, rtol=1e-12)
    assert info.spend.actual.messages == info.accepted == 1
    # survives a checkpoint
    again = RoundEngine.restore(eng.config, eng.export(), profiles=resolve_profile)
    assert again.agents["a"].sent == info.sent
