"""Members at their own cadence (aggregator.engine.cadence): a sync EF21 round does not wait
for a member whose duty cycle keeps its radio silent, the member's h_i keeps counting, its
late changes are accepted, and a member ``cadence_max_lag`` versions behind is awaited
again. Plain jobs keep waiting."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from aggregator.engine.rounds import EngineConfig, RoundEngine
from edge_agent.links.catalog import resolve_profile
from edge_agent.links.profiles import CostProfile
from edge_agent.numerics.compressors import Semantics, compress
from edge_agent.numerics.local import LocalConfig
from edge_agent.protocol import messages, topics, wire

JOB = "cad"
D = 64
SLOW = "lorawan_eu868_dr0_sf12"  # 1 % duty cycle: minutes of silence per message
FAST = "ble5_2m_dle_notify"  # no duty cycle
AGENTS = {"slow": SLOW, "f1": FAST, "f2": FAST}


def _profiles(name: str) -> CostProfile:
    return resolve_profile(name)


def engine(**overrides: Any) -> RoundEngine:
    cfg: dict[str, Any] = {
        "job": JOB, "d": D, "step_size": 0.05, "round_deadline_s": 1.0, "quorum_fraction": 1.0,
        "min_agents": 3, "liveness_timeout_s": 1e9, "feedback": "ef21", "cadence": True,
        "cadence_max_lag": 4,
    }  # fmt: skip
    cfg.update(overrides)
    return RoundEngine(EngineConfig(**cfg), profiles=_profiles)


def hello(agent: str, semantics: Semantics = "ef21") -> tuple[str, bytes]:
    h = messages.Hello(job=JOB, agent=agent, d=D, rows=10, smoothness=2.0, model="logreg",
                       compressor="topk", profile=AGENTS[agent], semantics=semantics)  # fmt: skip
    return topics.hello(JOB, agent), messages.dump(h)


def update(agent: str, round: int, seq: int, semantics: Semantics = "ef21") -> tuple[str, bytes]:
    g = np.random.default_rng(seq * 7 + len(agent)).normal(size=D)
    u = replace(compress(g, "signtopk" if semantics == "local" else "topk", 4), semantics=semantics)
    blob = wire.encode(u, job=JOB, agent=agent, round=round, seq=seq)
    return topics.update(JOB, agent), blob


def _start(eng: RoundEngine, semantics: Semantics = "ef21") -> float:
    for a in AGENTS:
        assert eng.handle(*hello(a, semantics), 0.0).reason is None
    return eng.cadence.up_free_at("slow")


def test_the_round_does_not_wait_for_a_silent_member_and_its_state_keeps_counting() -> None:
    eng = engine()
    silent_until = _start(eng)
    assert silent_until > 10.0, "an SF12 hello owes seconds of silence at 1 %"
    assert eng.cadence.up_free_at("f1") == 0.0, "no duty cycle, no silence"
    # version 0: the slow member is silent after its hello, the fast ones close the round
    for a in ("f1", "f2"):
        eff = eng.handle(*update(a, 0, 0), 1.0)
    assert eff.committed is not None and eff.committed.reason == "all_reported"
    assert eff.committed.participants == ("f1", "f2")
    # once its radio is free before the round's deadline the slow member is awaited again
    t = silent_until + 1.0
    for a in ("f1", "f2"):
        assert eng.handle(*update(a, 1, 1), t).committed is None
    assert eng.counted(t).awaited == {"slow", "f1", "f2"}
    eff = eng.handle(*update("slow", 1, 0), t + 0.5)
    assert eff.committed is not None and set(eff.committed.participants) == set(AGENTS)
    free = eng.cadence.up_free_at("slow")
    assert free > t + 0.5
    h_slow = eng.h["slow"].copy()
    # now the fast members run versions alone; the slow member's h_i stays in the sum
    for k in range(2, 5):
        for a in ("f1", "f2"):
            eff = eng.handle(*update(a, k, k), t + k)
        assert eff.committed is not None, k
        assert eff.committed.participants == ("f1", "f2")
    assert eng.version == 5
    np.testing.assert_array_equal(eng.h["slow"], h_slow)
    total = eng.h["slow"] + eng.h["f1"] + eng.h["f2"]
    assert eng.sum_h is not None
    np.testing.assert_allclose(eng.sum_h, total, rtol=1e-12, atol=1e-12)
    # its change computed at version 2 (it was free then, say) is accepted 3 versions late
    eff = eng.handle(*update("slow", 2, 1), t + 5.0)
    assert eff.reason is None and eff.committed is None
    assert not np.array_equal(eng.h["slow"], h_slow)
    assert eng.agents["slow"].accepted == 2


def test_a_member_lagging_max_lag_versions_is_awaited_even_while_silent() -> None:
    eng = engine(cadence_max_lag=3)
    silent_until = _start(eng)
    t = silent_until + 1.0
    for a in AGENTS:
        eng.handle(*update(a, 0, 0), t)
    assert eng.version == 1
    assert eng.cadence.up_free_at("slow") > t + 100.0
    for k in range(1, 3):  # lags 1 and 2 < 3: excused
        for a in ("f1", "f2"):
            eff = eng.handle(*update(a, k, k), t + k)
        assert eff.committed is not None, k
    # lag 3: the round waits for the slow member, silent or not
    for a in ("f1", "f2"):
        assert eng.handle(*update(a, 3, 3), t + 3).committed is None
    assert "slow" in eng.counted(t + 3).awaited
    assert eng.tick(t + 50.0).committed is None
    eff = eng.handle(*update("slow", 3, 1), eng.cadence.up_free_at("slow") + 0.1)
    assert eff.committed is not None and set(eff.committed.participants) == set(AGENTS)


@pytest.mark.parametrize("setting", ["plain", "off"])
def test_plain_jobs_and_cadence_off_keep_waiting(setting: str) -> None:
    semantics: Semantics = "plain" if setting == "plain" else "ef21"
    eng = engine(cadence=setting == "plain", feedback="none" if semantics == "plain" else "ef21")
    _start(eng, semantics)
    for a in ("f1", "f2"):
        assert eng.handle(*update(a, 0, 0, semantics), 1.0).committed is None
    assert eng.counted(1.0).awaited == set(AGENTS)


def test_the_silence_survives_a_checkpoint() -> None:
    eng = engine()
    free = _start(eng)
    again = RoundEngine.restore(eng.config, eng.export(), profiles=_profiles)
    assert again.cadence.up_free_at("slow") == free
    assert again.counted(1.0).awaited == eng.counted(1.0).awaited == {"f1", "f2"}


def test_a_local_training_round_does_not_wait_for_a_silent_member_who_stays_a_member() -> None:
    """Local training at cadence: the fast members close the versions while the slow one
    is silent; it is listed absent (its change counts 0), it does not leave the membership
    however many versions that takes (up to the lag bound), and it is awaited again at it."""
    eng = engine(feedback="local", local=LocalConfig(local_steps=2), cadence_max_lag=6,
                 participation_window=2)  # fmt: skip
    for a in AGENTS:
        h = messages.Hello(job=JOB, agent=a, d=D, rows=10, smoothness=2.0, model="logreg",
                           compressor="signtopk", profile=AGENTS[a], semantics="local",
                           local_steps=2)  # fmt: skip
        assert eng.handle(topics.hello(JOB, a), messages.dump(h), 0.0).reason is None
    for a in ("f1", "f2"):  # version 0: the slow member is silent after its hello
        eff = eng.handle(*update(a, 0, 0, "local"), 1.0)
    assert eff.committed is not None and eff.committed.participants == ("f1", "f2")
    t = eng.cadence.up_free_at("slow") + 1.0
    for a in ("f1", "f2", "slow"):  # version 1: free again, awaited; it joins
        eff = eng.handle(*update(a, 1, 1, "local"), t)
    hub = eng.model.local_hub
    assert eff.committed is not None and set(eff.committed.participants) == set(AGENTS)
    assert eng.version == 2 and hub is not None and sorted(hub.u) == sorted(AGENTS)
    assert eng.cadence.up_free_at("slow") > t + 100.0
    for k in range(2, 7):  # lags 1..5 < 6: the slow member is excused, absent, kept
        for a in ("f1", "f2"):
            eff = eng.handle(*update(a, k, k, "local"), t + k)
        assert eff.committed is not None and eff.committed.participants == ("f1", "f2"), k
        assert "slow" in hub.u and hub.absences["slow"] == k - 1
    # lag 6: awaited again, silent or not
    for a in ("f1", "f2"):
        assert eng.handle(*update(a, 7, 7, "local"), t + 7).committed is None
    assert "slow" in eng.counted(t + 7).awaited
    eff = eng.handle(*update("slow", 7, 2, "local"), eng.cadence.up_free_at("slow") + 0.1)
    assert eff.committed is not None and set(eff.committed.participants) == set(AGENTS)
    assert hub.absences.get("slow", 0) == 0
