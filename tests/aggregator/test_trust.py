"""Issue 20, engine side: what one unauthenticated client could do to a job, and what it
can do now. Each test is one finding of the red-team run (the figures are in
docs/operating.md, "What it survives"); the real-process counterparts are in
tests/integration/test_trust_e2e.py."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from aggregator.engine.admission import Limits
from aggregator.engine.guard import UpdateGuard
from aggregator.engine.robust_round import parse_aggregation
from aggregator.engine.rounds import Effects, EngineConfig, RoundEngine
from aggregator.service.store import JournalEntry, apply_entry
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.compressors import Update, compress
from edge_agent.protocol import messages, topics, wire

pytestmark = [pytest.mark.security]

JOB = "trust"
D = 8
RNG = np.random.default_rng(20)


def hello(agent: str, **kw: Any) -> tuple[str, bytes]:
    fields: dict[str, Any] = {"job": JOB, "agent": agent, "d": D, "rows": 10,
                              "smoothness": 2.0, "model": "logreg", "compressor": "dense"}  # fmt: skip
    fields.update(kw)
    return topics.hello(JOB, agent), messages.dump(messages.Hello(**fields))


def update(
    agent: str, values: Any, *, round: int, seq: int = 0, sem: str = "plain"
) -> tuple[str, bytes]:
    u = Update("dense", D, None, np.asarray(values, dtype=np.float64), semantics=sem)  # type: ignore[arg-type]
    return topics.update(JOB, agent), wire.encode(u, job=JOB, agent=agent, round=round, seq=seq)


class Journal:
    """The engine driven as the service drives it, keeping what the service journals."""

    def __init__(self, eng: RoundEngine) -> None:
        self.eng = eng
        self.entries: list[JournalEntry] = []

    def msg(self, topic: str, payload: bytes, now: float) -> Effects:
        eff = self.eng.handle(topic, payload, now)
        if eff.journal:
            self.entries.append(JournalEntry("msg", now, topic, payload))
        return eff

    def tick(self, now: float) -> Effects:
        eff = self.eng.tick(now)
        if eff.journal:
            self.entries.append(JournalEntry("tick", now))
        return eff

    def replayed(self) -> RoundEngine:
        fresh = RoundEngine(self.eng.config)
        for entry in self.entries:
            apply_entry(fresh, entry)
        return fresh


# ------------------------------------------------- 1. locked out for good: unproven ids


def test_invented_ids_expire_after_the_ttl_and_a_real_agent_joins_exactly_on_replay() -> None:
    cfg = EngineConfig(job=JOB, d=D, step_size=0.1, max_agents=5, unproven_ttl_s=300.0,
                       liveness_timeout_s=60.0, feedback="none")  # fmt: skip
    j = Journal(RoundEngine(cfg))
    j.msg(*hello("real-0"), 0.0)
    assert j.msg(*update("real-0", np.ones(D), round=0), 1.0).reason is None  # proven
    for i in range(4):
        assert j.msg(*hello(f"fake-{i}"), 2.0).reason is None
    assert j.msg(*hello("newcomer"), 3.0).reason == "too_many_agents"
    for now in (100.0, 200.0, 302.0):  # re-hellos keep them live, not registered
        for i in range(4):
            j.msg(*hello(f"fake-{i}"), now)
        j.tick(now)
    assert len(j.eng.agents) == 5
    assert j.msg(*hello("newcomer"), 302.5).reason == "too_many_agents"
    j.tick(302.5)  # 300 s after the fakes' first hello
    assert sorted(j.eng.agents) == ["real-0"]
    assert j.msg(*hello("newcomer"), 303.0).reason is None
    assert j.msg(*update("newcomer", np.ones(D), round=j.eng.version), 304.0).reason is None
    # a proven agent is never forgotten, however long it is silent
    j.tick(10_000.0)
    assert sorted(j.eng.agents) == ["newcomer", "real-0"]
    # the crash replay of the journal forgets exactly the same ids at the same point
    again = j.replayed()
    assert again.export().meta["agents"] == j.eng.export().meta["agents"]
    assert np.array_equal(again.export().seen, j.eng.export().seen)
    assert again.x.tobytes() == j.eng.x.tobytes()


def test_forgetting_an_earlier_id_keeps_the_later_agents_dedupe_keys() -> None:
    cfg = EngineConfig(job=JOB, d=D, step_size=0.1, unproven_ttl_s=10.0, feedback="none",
                       mode="async")  # fmt: skip
    eng = RoundEngine(cfg)
    eng.handle(*hello("fake"), 0.0)
    eng.handle(*hello("real"), 0.0)
    sent = update("real", np.ones(D), round=0, seq=7)
    assert eng.handle(*sent, 1.0).reason is None
    eng.tick(11.0)
    assert list(eng.agents) == ["real"] and eng.registry.index("real") == 0
    assert eng.export().seen.tolist() == [[0, 0, 7]]
    assert eng.handle(*sent, 12.0).reason == "duplicate"  # still recognised
    back = RoundEngine.restore(cfg, eng.export())
    assert back.handle(*sent, 13.0).reason == "duplicate"


# ------------------------------------------------- 2. the EF21 step and invented hellos


def _ef21_run(fakes: int) -> np.ndarray[Any, Any]:
    cfg = EngineConfig(job=JOB, d=D, step_size=0.5, feedback="ef21", max_agents=1000)
    eng = RoundEngine(cfg)
    for a in ("a", "b"):
        eng.handle(*hello(a, semantics="ef21"), 0.0)
    for i in range(fakes):  # hellos only: no state, never awaited by the quorum for long
        assert eng.handle(*hello(f"fake-{i}", semantics="ef21"), 0.0).reason is None
    rng = np.random.default_rng(1)
    for v in range(3):
        for a in ("a", "b"):
            eng.handle(*update(a, rng.standard_normal(D), round=v, sem="ef21"), 1.0 + v)
        eng.tick(1e6 + v)  # the deadline: the fakes never report
    assert eng.version >= 3
    return eng.x.copy()


def test_the_ef21_step_is_unchanged_by_200_invented_hellos() -> None:
    assert _ef21_run(200).tobytes() == _ef21_run(0).tobytes()


# ------------------------------------------------- 3. requests from ids without a hello


def test_a_request_from_an_id_without_a_hello_is_refused_and_answered_with_nothing() -> None:
    eng = RoundEngine(EngineConfig(job=JOB, d=D, step_size=0.1))
    body = messages.dump(messages.Request())
    for i in range(100):
        eff = eng.handle(topics.request(JOB, f"fake-{i}"), body, 1.0)
        assert eff.reason == "unknown_agent" and not eff.outbound
    assert eng.rejected["unknown_agent"] == 100
    eng.handle(*hello("real"), 2.0)
    eff = eng.handle(topics.request(JOB, "real"), body, 3.0)
    assert eff.reason is None and [o.topic for o in eff.outbound] == [topics.to_agent(JOB, "real")]
    # the per-agent bound: a second snapshot inside the interval is withheld
    assert not eng.handle(topics.request(JOB, "real"), body, 3.5).outbound
    assert eng.traffic.withheld == 1


# ------------------------------------------------- 4. one agent, many votes (async)


@pytest.mark.parametrize("aggregation", ["mean", "clipped_mean"])
def test_one_agent_cannot_make_versions_alone_in_async_mode(aggregation: str) -> None:
    cfg = EngineConfig(job=JOB, d=D, step_size=0.1, mode="async", async_apply_every=3,
                       max_staleness=4, feedback="none",
                       aggregation=parse_aggregation(aggregation))  # fmt: skip
    eng = RoundEngine(cfg)
    for a in ("evil", "b", "c"):
        eng.handle(*hello(a), 0.0)
    reasons = [eng.handle(*update("evil", np.ones(D), round=0, seq=s), 1.0).reason
               for s in range(12)]  # fmt: skip
    assert reasons == [None] + ["one_per_version"] * 11
    assert eng.version == 0 and eng.rejected["one_per_version"] == 11
    for a in ("b", "c"):
        assert eng.handle(*update(a, np.ones(D), round=0), 2.0).reason is None
    assert eng.version == 1
    assert eng.last_record is not None and eng.last_record.participants == ("b", "c", "evil")
    # an older version it did not answer is one_per_version too once it answered a newer one
    assert eng.handle(*update("evil", np.ones(D), round=1, seq=0), 3.0).reason is None
    assert eng.handle(*update("evil", np.ones(D), round=0, seq=99), 3.0).reason == "one_per_version"


def test_async_ef21_takes_a_second_change_as_state_only() -> None:
    cfg = EngineConfig(job=JOB, d=D, step_size=0.1, mode="async", async_apply_every=2,
                       feedback="ef21")  # fmt: skip
    eng = RoundEngine(cfg)
    for a in ("evil", "b"):
        eng.handle(*hello(a, semantics="ef21"), 0.0)
    for s in range(5):  # applied to its h_i (the agent added it to its own), not counted
        assert (
            eng.handle(*update("evil", np.ones(D), round=0, seq=s, sem="ef21"), 1.0).reason is None
        )
    assert eng.version == 0 and eng.round_state.count == 1
    eng.handle(*update("b", np.ones(D), round=0, sem="ef21"), 2.0)
    assert eng.version == 1


# ------------------------------------------------- 5. a status may mark only its sender


def test_a_status_naming_another_agent_is_refused_and_counted() -> None:
    eng = RoundEngine(EngineConfig(job=JOB, d=D, step_size=0.1))
    for a in ("victim", "evil"):
        eng.handle(*hello(a), 0.0)
    body = messages.dump(messages.Status(state="offline", agent="victim"))
    assert eng.handle(topics.status(JOB, "evil"), body, 1.0).reason == "agent_mismatch"
    assert eng.agents["victim"].live and eng.agents["victim"].state == "online"
    assert eng.rejected["agent_mismatch"] == 1
    own = messages.dump(messages.Status(state="offline"))
    assert eng.handle(topics.status(JOB, "evil"), own, 2.0).reason is None
    assert not eng.agents["evil"].live


# ------------------------------------------------- 6. robust aggregation at small N


def _robust(kind: str, agents: int) -> RoundEngine:
    cfg = EngineConfig(job=JOB, d=D, step_size=0.5, feedback="none", round_deadline_s=10.0,
                       aggregation=parse_aggregation(kind))  # fmt: skip
    eng = RoundEngine(cfg)
    for i in range(agents):
        eng.handle(*hello(f"a{i}"), 0.0)
    return eng


def _rounds(eng: RoundEngine, n: int, agents: int) -> None:
    """``n`` rounds: the honest agents send the gradient of |x - 1|^2 / 2, a0 a constant
    push of norm 283 (100 per entry), within the norm guard's bound."""
    for k in range(n):
        v = eng.version
        for i in range(agents):
            g = np.full(D, -100.0) if i == 0 else eng.x - 1.0
            eng.handle(*update(f"a{i}", g, round=v), 100.0 * k + 1.0)
        eng.tick(100.0 * k + 50.0)  # past the deadline


def test_clipped_mean_with_two_agents_refuses_to_close_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="aggregator.engine")
    eng = _robust("clipped_mean", 2)
    _rounds(eng, 3, 2)
    assert eng.version == 0 and np.all(eng.x == 0.0)
    wait = eng.open_round["robust_wait"]
    assert wait == ("clipped_mean needs 3 contributions from distinct agents (tolerating f "
                    "hostile needs a median of 2f+1 norms, f = 1); the round has 2")  # fmt: skip
    lines = [r.getMessage() for r in caplog.records if "the round waits" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"the round waits: {wait[:-1]}")


@pytest.mark.parametrize(("agents", "rounds"), [(3, 5), (4, 12)])
def test_clipped_mean_with_one_hostile_among_three_or_more_stays_bounded(
    agents: int, rounds: int
) -> None:
    """Clipped to twice an honest median norm, the hostile push cannot move x far (the plain
    mean: 100 / agents per entry and round). Once the honest norms shrink below a thousandth
    of the hostile's, the guard refuses it ``too_large``: four agents still close rounds
    with three rows; three would wait (two rows cannot outvote one hostile)."""
    eng = _robust("clipped_mean", agents)
    _rounds(eng, rounds, agents)
    assert eng.version == rounds and eng.open_round["robust_wait"] is None
    assert float(np.abs(eng.x - 1.0).max()) < 0.1


def test_trimmed_mean_needs_enough_rows_to_trim_one_per_side() -> None:
    assert parse_aggregation("trimmed_mean").min_contributions == 10
    assert parse_aggregation("trimmed_mean:0.2").min_contributions == 5
    assert parse_aggregation("trimmed_mean:0.4").min_contributions == 3
    assert parse_aggregation("trimmed_mean:0").min_contributions == 1  # the plain mean
    assert parse_aggregation("mean").min_contributions == 1
    eng = _robust("trimmed_mean:0.2", 4)
    _rounds(eng, 1, 4)
    assert eng.version == 0 and "trimmed_mean needs 5" in eng.open_round["robust_wait"]


def test_the_norm_reference_weighs_each_agent_once() -> None:
    """One agent sending many tiny updates pulled the median of the last 256 accepted norms
    down until every honest update was refused ``too_large``; now it is one agent of two."""
    guard = UpdateGuard(Limits(update_norm_factor=10.0, update_norm_warmup=4))
    for _ in range(40):
        guard.accepted("evil", 1e-9, 1e-9, ef21=False, weight=1.0)
    guard.accepted("good", 1.0, 1.0, ef21=False, weight=1.0)
    assert guard.reference == pytest.approx(0.5)
    honest = Update("dense", D, None, np.full(D, 1.0 / np.sqrt(D)))
    acc = _robust("mean", 1).round_state.accumulator
    kw: dict[str, Any] = {"agent": "good", "gamma": 0.1, "weight": 1.0, "x": np.zeros(D),
                          "acc": acc, "mirror": _robust("mean", 1).model.mirror}  # fmt: skip
    assert guard.check(honest, **kw)[0] == pytest.approx(1.0)
    back = UpdateGuard(guard.limits)
    back.restore(guard.export())
    assert back.reference == guard.reference
    old = UpdateGuard(guard.limits)
    old.restore([1.0, 2.0, 3.0])  # a checkpoint's norm window from before
    assert old.reference == 2.0


# ------------------------------------------------- the hold (AGG_MAX_HOLD_S)

LORA = "lorawan_eu868_dr5_sf7"  # 10 downlinks a day: 8640 s per downlink
WIFI = "wifi_esp32_mqtt_tcp"


def _held(max_hold_s: float = 900.0) -> Journal:
    cfg = EngineConfig(job=JOB, d=D, step_size=0.1, downlink_pacing=True, feedback="none",
                       max_hold_s=max_hold_s, liveness_timeout_s=60.0)  # fmt: skip
    j = Journal(RoundEngine(cfg, profiles=resolve_profile))
    for agent, profile in (("wifi", WIFI), ("lora", LORA)):
        j.msg(*hello(agent, profile=profile, compressor="topk"), 0.0)
    for agent in ("wifi", "lora"):
        eff = j.msg(*_topk(agent, 0), 1.0)
    j.eng.charge_downlink(eff.outbound, 1.0)  # the LoRaWAN link is busy until 8641
    assert j.msg(*_topk("wifi", 1), 2.0).reason is None
    assert j.msg(*_topk("lora", 1), 2.0).reason is None
    assert j.eng.version == 1 and j.eng.hold(2.0) is not None
    return j


def _topk(agent: str, round: int) -> tuple[str, bytes]:
    u = compress(RNG.standard_normal(D), "topk", 4)
    return topics.update(JOB, agent), wire.encode(u, job=JOB, agent=agent, round=round, seq=round)


def test_a_hold_ends_when_its_holder_goes_offline_or_silent() -> None:
    j = _held()
    j.msg(topics.status(JOB, "lora"), messages.dump(messages.Status(state="offline")), 10.0)
    eff = j.tick(10.0)
    assert eff.committed is not None and j.eng.version == 2  # not 900 s, not 8640 s

    j = _held()
    j.msg(*_topk("wifi", 1), 50.0)  # wifi stays live; lora falls silent
    assert j.tick(61.0).committed is None  # lora spoke at 2.0: live until 62
    eff = j.tick(63.0)
    assert not j.eng.agents["lora"].live and eff.committed is not None


def test_a_hold_is_bounded_by_max_hold_s_across_a_restart() -> None:
    j = _held()
    for now in (300.0, 600.0):
        for agent in ("wifi", "lora"):  # both stay live (re-sends)
            j.msg(*_topk(agent, 1), now)
        j.tick(now)
    back = RoundEngine.restore(j.eng.config, j.eng.export(), profiles=resolve_profile)
    for agent in ("wifi", "lora"):
        back.handle(*_topk(agent, 1), 880.0)
    assert back.tick(880.0).committed is None and back.hold(880.0) is not None
    eff = back.tick(902.0)  # the hold started at 2.0: 900 s, the restart does not renew it
    assert eff.committed is not None and back.version == 2
