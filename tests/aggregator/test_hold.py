"""A round held by downlink pacing says so, keeps its transmitting agents, and is bounded.

A LoRaWAN agent may receive 10 downlinks a day: once a version is published to it, the
next one waits 8640 s for its link. The engine exposes that hold (reason, the agents
whose downlink holds it, until when), does not lose or refuse the agents that keep
re-sending their update meanwhile, and closes after ``max_hold_s`` without the agent
whose link holds it.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from aggregator.engine.rounds import EngineConfig, RoundEngine
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.compressors import compress
from edge_agent.protocol import messages, topics, wire

JOB = "held"
D = 32
LORA = "lorawan_eu868_dr5_sf7"  # 10 downlinks a day: 8640 s per downlink packet
WIFI = "wifi_esp32_mqtt_tcp"
MAX_HOLD_S = 900.0
RNG = np.random.default_rng(5)


def _engine() -> RoundEngine:
    cfg = EngineConfig(
        job=JOB, d=D, step_size=0.1, downlink_pacing=True, max_hold_s=MAX_HOLD_S,
        liveness_timeout_s=60.0, round_deadline_s=30.0,
    )  # fmt: skip
    eng = RoundEngine(cfg, profiles=resolve_profile)
    for agent, profile in (("wifi", WIFI), ("lora", LORA)):
        hello = messages.Hello(job=JOB, agent=agent, d=D, rows=10, smoothness=2.0,
                               model="logreg", compressor="topk", profile=profile)  # fmt: skip
        assert eng.handle(topics.hello(JOB, agent), messages.dump(hello), 0.0).reason is None
    return eng


def _update(agent: str, round: int) -> tuple[str, bytes]:
    u = compress(RNG.standard_normal(D), "topk", 4)
    return topics.update(JOB, agent), wire.encode(u, job=JOB, agent=agent, round=round, seq=round)


def _held_engine() -> tuple[RoundEngine, dict[str, tuple[str, bytes]]]:
    """Version 1 published at t=1 (the LoRaWAN link is spent for 8640 s), then both agents
    report for version 2 at t=2: the round could close, but it is held."""
    eng = _engine()
    for agent in ("wifi", "lora"):
        eff = eng.handle(*_update(agent, 0), 1.0)
    assert eng.version == 1
    eng.charge_downlink(eff.outbound, 1.0)
    sent = {a: _update(a, 1) for a in ("wifi", "lora")}
    for agent in ("wifi", "lora"):
        assert eng.handle(*sent[agent], 2.0).reason is None
    assert eng.version == 1
    return eng, sent


def test_a_round_held_by_a_daily_cap_says_who_holds_it_and_until_when(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="aggregator.engine")
    eng, _ = _held_engine()
    hold = eng.hold(3.0)
    assert hold is not None
    assert (hold.reason, hold.held_by, hold.since) == ("daily_cap", ("lora",), 2.0)
    assert hold.held_until == pytest.approx(1.0 + 86_400 / 10)
    starts = [r for r in caplog.records if "held" in r.getMessage() and "ended" not in r.message]
    assert len(starts) == 1 and starts[0].levelno == logging.INFO
    back = RoundEngine.restore(eng.config, eng.export(), profiles=resolve_profile)
    assert back.hold(3.0) == hold  # the hold is checkpointed with the pacing


def test_agents_that_keep_re_sending_while_held_stay_live_and_are_not_refused() -> None:
    eng, sent = _held_engine()
    for k in range(1, 80):  # every 10 s, as an agent re-sends on silence
        now = 2.0 + 10.0 * k
        for agent in ("wifi", "lora"):
            eff = eng.handle(*sent[agent], now)
            assert eff.reason is None and not eff.outbound
        eng.tick(now)
    assert eng.version == 1 and eng.hold(800.0) is not None
    assert [(a.agent, a.live, a.state, a.rejected) for a in eng.agents.values()] == [
        ("wifi", True, "online", 0),
        ("lora", True, "online", 0),
    ]
    assert eng.rejected["duplicate"] == 0
    assert eng.refusals.refused_agents.listing() == []


def test_a_hold_is_bounded_by_max_hold_s_then_the_version_closes_without_the_held_agent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="aggregator.engine")
    eng, sent = _held_engine()
    for agent in ("wifi", "lora"):
        eng.handle(*sent[agent], 2.0 + MAX_HOLD_S - 1.0)  # alive
    assert eng.tick(2.0 + MAX_HOLD_S - 1.0).committed is None
    eff = eng.tick(2.0 + MAX_HOLD_S)
    assert eff.committed is not None and eff.journal
    assert eff.committed.participants == ("lora", "wifi") and eng.version == 2
    assert eng.hold(2.0 + MAX_HOLD_S) is None
    assert any("hold ended" in r.getMessage() for r in caplog.records)
    lora_down = eng.agents["lora"].down
    eng.charge_downlink(eff.outbound, 2.0 + MAX_HOLD_S)
    assert eng.agents["lora"].down == lora_down  # its link is busy: it catches up later
    # the next round does not wait for the released link
    now = 3.0 + MAX_HOLD_S
    for agent in ("wifi", "lora"):
        eng.handle(*_update(agent, 2), now)
    assert eng.version == 3 and eng.hold(now) is None
