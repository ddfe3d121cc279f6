"""Optional robust aggregation (AGG_AGGREGATION, issue 13): the rules, their wiring into the
engine's step, the downlink they force, and a restart in the middle of a robust round."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.engine.robust_round import Aggregation, RobustAccumulator, parse_aggregation
from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.service.settings import SettingsError, load_settings
from edge_agent.numerics import robust
from edge_agent.numerics.compressors import Update
from edge_agent.protocol import messages, topics, wire

pytestmark = [pytest.mark.security]

JOB = "robust"
D = 6
AGENTS = ("a0", "a1", "a2", "a3", "a4")
GAMMA = 0.5


def engine(kind: str, **overrides: Any) -> RoundEngine:
    cfg: dict[str, Any] = {"job": JOB, "d": D, "step_size": GAMMA, "round_deadline_s": 1e9}
    cfg.update(overrides)
    eng = RoundEngine(EngineConfig(aggregation=parse_aggregation(kind), **cfg))
    for a in AGENTS:
        hello = messages.Hello(
            job=JOB, agent=a, d=D, rows=10, smoothness=1.0, model="logreg", compressor="dense"
        )
        assert eng.handle(topics.hello(JOB, a), messages.dump(hello), 0.0).reason is None
    return eng


def rows(rng: np.random.Generator, hostile: float = 1.0) -> np.ndarray[Any, np.dtype[np.float64]]:
    out = 0.1 + 0.01 * rng.standard_normal((len(AGENTS), D))
    out[0] *= hostile  # agent a0 sends a scaled gradient
    return out


def send(eng: RoundEngine, agent: str, row: np.ndarray[Any, np.dtype[np.float64]]) -> None:
    blob = wire.encode(
        Update("dense", D, None, row), job=JOB, agent=agent, round=eng.version, seq=0
    )
    assert eng.handle(topics.update(JOB, agent), blob, 1.0).reason is None


# ---------------------------------------------------------------- the rules


def test_clipped_sum_bounds_one_scaled_row_and_leaves_ordinary_rounds_alone() -> None:
    r = rows(np.random.default_rng(0))
    assert np.allclose(robust.clipped_sum(r, 2.0), r.sum(axis=0))  # all within 2x median
    big = rows(np.random.default_rng(0), hostile=1e4)
    clipped = robust.clipped_sum(big, 2.0)
    norms = np.linalg.norm(big, axis=1)
    bound = 2.0 * np.median(norms)
    # a0 contributes exactly bound in its own direction
    expected = big[1:].sum(axis=0) + big[0] * (bound / norms[0])
    assert np.allclose(clipped, expected)
    assert np.linalg.norm(clipped) < 2 * np.linalg.norm(r.sum(axis=0)) + bound


def test_trimmed_sum_drops_the_extremes_per_coordinate() -> None:
    r = np.array([[1.0, -100.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0], [1000.0, 5.0]])
    # trim 0.2 of 5: one value per side and coordinate
    assert robust.trim_count(5, 0.2) == 1
    assert np.array_equal(robust.trimmed_sum(r, 0.2), 5 * np.array([3.0, 3.0]))
    assert np.array_equal(robust.trimmed_sum(r, 0.0), r.sum(axis=0))
    assert robust.trim_count(2, 0.49) == 0  # never trims everything away
    with pytest.raises(ValueError, match="trim"):
        robust.trimmed_sum(r, 0.5)
    with pytest.raises(ValueError, match="c must be"):
        robust.clipped_sum(r, 0.0)


# ---------------------------------------------------------------- the engine's step


@pytest.mark.parametrize("kind", ["clipped_mean", "trimmed_mean:0.2"])  # 0.2 of 5: one per side
def test_a_robust_round_steps_with_the_robust_aggregate(kind: str) -> None:
    r = rows(np.random.default_rng(1), hostile=500.0)
    eng, mean = engine(kind), engine("mean")
    for e in (eng, mean):
        for a, row in zip(AGENTS, r, strict=True):
            send(e, a, row)
        assert e.version == 1
    total = robust.clipped_sum(r, 2.0) if kind == "clipped_mean" else robust.trimmed_sum(r, 0.2)
    assert np.array_equal(eng.x, np.zeros(D) - (GAMMA / len(AGENTS)) * total)
    honest = GAMMA * r[1:].mean(axis=0)
    # the robust step stays near the honest one; the mean is dragged ~100x away
    assert np.linalg.norm(eng.x + honest) < 0.5 * np.linalg.norm(honest)
    assert np.linalg.norm(mean.x + honest) > 50 * np.linalg.norm(honest)


def test_mean_is_unchanged_and_robust_exact_jobs_broadcast_deltas_replicas_follow() -> None:
    assert type(engine("mean").round_state.accumulator).__name__ == "MeanAccumulator"
    eng = engine("trimmed_mean:0.2")
    replica = np.zeros(D)
    out: list[Any] = []
    for a, row in zip(AGENTS, rows(np.random.default_rng(2), hostile=50.0), strict=True):
        out.extend(
            eng.handle(
                topics.update(JOB, a),
                wire.encode(Update("dense", D, None, row), job=JOB, agent=a, round=0, seq=0),
                1.0,
            ).outbound
        )
    deltas = [o for o in out if o.topic == topics.delta(JOB)]
    assert len(deltas) == 1
    model = wire.decode_model(deltas[0].payload)
    assert isinstance(model, wire.Delta)  # not replicated steps: a replica cannot replay them
    model.apply(replica)
    assert np.array_equal(replica, eng.x) and np.any(replica != 0)


def test_a_restart_mid_round_steps_that_round_with_the_mean_then_robust_again() -> None:
    rng = np.random.default_rng(3)
    r = rows(rng, hostile=200.0)
    eng = engine("clipped_mean")
    for a, row in zip(AGENTS[:3], r[:3], strict=True):
        send(eng, a, row)
    snap = eng.export()
    back = RoundEngine.restore(eng.config, snap)
    assert isinstance(back.round_state.accumulator, RobustAccumulator)
    for a, row in zip(AGENTS[3:], r[3:], strict=True):
        send(back, a, row)
    assert back.version == 1
    # that one round: the plain mean of all five (the rows before the restart are unknown)
    assert np.allclose(back.x, -GAMMA * r.mean(axis=0))
    # the next round is robust again
    before = back.x.copy()
    r2 = rows(rng, hostile=200.0)
    for a, row in zip(AGENTS, r2, strict=True):
        send(back, a, row)
    assert np.array_equal(back.x, before - (GAMMA / 5) * robust.clipped_sum(r2, 2.0))


def test_the_setting_parses_and_refuses_with_the_accepted_forms() -> None:
    assert parse_aggregation("mean") == Aggregation()
    assert parse_aggregation("clipped_mean:3") == Aggregation("clipped_mean", clip=3.0)
    assert parse_aggregation("trimmed_mean") == Aggregation("trimmed_mean", trim=0.1)
    for bad in ("median", "mean:2", "clipped_mean:-1", "trimmed_mean:0.5", "clipped_mean:x"):
        with pytest.raises(ValueError, match="expected mean, clipped_mean"):
            parse_aggregation(bad)
    assert load_settings(d=4, aggregation="trimmed_mean:0.2").engine_config().aggregation == (
        Aggregation("trimmed_mean", trim=0.2)
    )
    with pytest.raises(SettingsError, match="AGG_AGGREGATION"):
        load_settings(d=4, aggregation="bogus")


# ---------------------------------------------------------------- the simulator


def test_simulate_with_a_hostile_agent_clipped_mean_holds_where_the_mean_does_not(
    tmp_path: Path,
) -> None:
    from aggregator.sim import cli

    def final(*extra: str) -> float:
        out = tmp_path / "r.json"
        argv = ["--rows", "300", "--features", "400", "--seed", "3", "--agents", "5"]
        argv += ["--methods", "dense", "--max-rounds", "30", "--targets", "1e-1"]
        argv += ["--downlink", "exact"]  # the relay a robust rule turns into a delta
        assert cli.main([*argv, "--no-progress", "--json", str(out), *extra]) == 0
        (rec,) = json.loads(out.read_text())
        assert rec["models_equal"]  # replicas bit-identical (delta downlink for robust)
        value: float = rec["final_suboptimality"]
        return value

    honest = final()
    assert final("--aggregation", "clipped_mean") == honest  # nothing clipped when honest
    wrecked = final("--hostile", "20")
    held = final("--aggregation", "clipped_mean", "--hostile", "20")
    assert held < 2 * honest + 0.05 and wrecked > 10 * held
    assert cli.main(["--aggregation", "median", "--no-progress"]) == 2
