"""One hostile or broken agent must not end or wreck a job (issue 13, finding 1).

The engine is driven with real encoded messages, as a transport delivers them: a top-k
update holding a finite 1e308, a hello claiming ``rows=10**18, smoothness=1e-300``, an
in-bounds liar against the ``median`` step rule, an update far above the job's norms, a
round whose step overflows after it was admitted, and a job an older version finished as
"diverged". Each leaves the model finite and the job running.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from aggregator.engine.admission import Limits
from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.service.settings import SettingsError, load_settings
from aggregator.web.app import create_app
from edge_agent.numerics.compressors import Update
from edge_agent.protocol import messages, topics, wire

pytestmark = [pytest.mark.security, pytest.mark.reliability]

JOB = "hostile"
D = 16


def engine(**overrides: Any) -> RoundEngine:
    cfg: dict[str, Any] = {"job": JOB, "d": D, "round_deadline_s": 10.0}
    cfg.update(overrides)
    return RoundEngine(EngineConfig(**cfg))


def hello(agent: str, **fields: Any) -> tuple[str, bytes]:
    base: dict[str, Any] = {
        "job": JOB,
        "agent": agent,
        "d": D,
        "rows": 10,
        "smoothness": 2.0,
        "model": "logreg",
        "compressor": "topk",
    }
    base.update(fields)
    return topics.hello(JOB, agent), messages.dump(messages.Hello(**base))


def topk(index: list[int], values: list[float], semantics: str = "plain") -> Update:
    return Update(
        "topk",
        D,
        np.asarray(index, dtype=np.int64),
        np.asarray(values, dtype=np.float64),
        semantics=semantics,  # type: ignore[arg-type]
    )


def upd(agent: str, u: Update, *, round: int = 0, seq: int = 0) -> tuple[str, bytes]:
    blob = wire.encode(u, job=JOB, agent=agent, round=round, seq=seq, value_dtype="float64")
    return topics.update(JOB, agent), blob


def join(eng: RoundEngine, *agents: str, **fields: Any) -> None:
    for a in agents:
        assert eng.handle(*hello(a, **fields), 0.0).reason is None


def honest_round(eng: RoundEngine, agents: tuple[str, ...], now: float, seq: int = 0) -> None:
    """Every agent sends a small update for the current version (the round closes)."""
    version = eng.version
    for i, a in enumerate(agents):
        u = topk([i % D, (i + 1) % D], [0.1 * (i + 1), -0.05])
        assert eng.handle(*upd(a, u, round=version, seq=seq), now).reason is None
    assert eng.version == version + 1


def test_a_1e308_top_k_update_is_refused_and_the_job_keeps_running() -> None:
    eng = engine()
    join(eng, "a", "b")
    before = eng.x.copy()
    eff = eng.handle(*upd("a", topk([3], [1e308])), 1.0)
    assert eff.reason == "would_diverge"
    assert eng.rejected["would_diverge"] == 1
    assert np.array_equal(eng.x, before) and np.isfinite(eng.x).all()
    assert eng.state == "running" and eng.version == 0
    # the same agent's honest re-try and the other agent close the round as usual
    honest_round(eng, ("a", "b"), 2.0, seq=1)
    assert np.isfinite(eng.x).all() and eng.state == "running"


def test_a_hello_claiming_absurd_rows_and_smoothness_is_refused() -> None:
    eng = engine()
    join(eng, "a", "b")
    gamma = eng.gamma()
    eff = eng.handle(*hello("liar", rows=10**18, smoothness=1e-300), 1.0)
    assert eff.reason == "out_of_bounds"
    assert "liar" not in eng.agents and eng.gamma() == gamma == 0.5
    honest_round(eng, ("a", "b"), 2.0)
    assert float(np.abs(eng.x).max()) < 1.0 and eng.state == "running"


@pytest.mark.parametrize(
    "fields",
    [
        {"rows": 10**9 + 1},
        {"smoothness": 1e-7},
        {"smoothness": 1e13},
        {"next_seq": 2**63},
        {"version": 2**63},
        {"profile": "p" * 257},
    ],
)
def test_every_claimed_number_and_text_is_bounded(fields: dict[str, Any]) -> None:
    eng = engine()
    assert eng.handle(*hello("x", **fields), 0.0).reason == "out_of_bounds"
    assert eng.rejected["out_of_bounds"] == 1 and not eng.agents


def test_the_median_rule_is_not_moved_by_one_in_bounds_liar() -> None:
    liar = {"rows": 10**9, "smoothness": 1e-6}  # inside the default bounds
    robust = engine(step_rule="median")
    join(robust, "a", "b", "c")
    assert robust.handle(*hello("liar", **liar), 0.0).reason is None
    assert robust.gamma() == 0.5  # 1 / L, L = the honest agents' 2.0
    trusting = engine()  # the default rule trusts every claim
    join(trusting, "a", "b", "c")
    trusting.handle(*hello("liar", **liar), 0.0)
    assert trusting.gamma() > 1e5


def test_the_mean_rule_is_todays_row_weighted_mean() -> None:
    eng = engine()
    eng.handle(*hello("a", rows=30, smoothness=1.5), 0.0)
    eng.handle(*hello("b", rows=10, smoothness=4.0), 0.0)
    assert eng.gamma() == 1.0 / ((30 * 1.5 + 10 * 4.0) / 40)


def test_an_update_far_above_the_jobs_norms_is_refused_after_the_warm_up() -> None:
    eng = engine(limits=Limits(update_norm_warmup=4, update_norm_factor=100.0))
    join(eng, "a", "b")
    for r in range(2):  # 4 accepted updates of norm ~0.1
        honest_round(eng, ("a", "b"), 1.0 + r)
    before = eng.x.copy()
    eff = eng.handle(*upd("a", topk([1], [1e3]), round=eng.version), 5.0)
    assert eff.reason == "too_large" and np.array_equal(eng.x, before)
    # within the factor: accepted
    assert eng.handle(*upd("a", topk([1], [5.0]), round=eng.version, seq=1), 5.0).reason is None


def test_the_norm_window_survives_a_checkpoint() -> None:
    eng = engine(limits=Limits(update_norm_warmup=2, update_norm_factor=10.0))
    join(eng, "a", "b")
    honest_round(eng, ("a", "b"), 1.0)
    again = RoundEngine.restore(eng.config, eng.export())
    eff = again.handle(*upd("a", topk([1], [100.0]), round=again.version), 2.0)
    assert eff.reason == "too_large"


def test_a_refused_ef21_change_asks_its_sender_to_rejoin_fresh() -> None:
    eng = engine()
    join(eng, "a", "b", semantics="ef21")
    eff = eng.handle(*upd("a", topk([2], [1e308], "ef21")), 1.0)
    assert eff.reason == "would_diverge" and eng.agents["a"].needs_reset
    controls = [messages.parse(messages.Control, o.payload) for o in eff.outbound]
    assert [(c.cmd, c.agent) for c in controls] == [("reset", "a")]
    assert np.isfinite(eng.x).all() and eng.state == "running"


def test_a_round_whose_step_overflows_after_admission_is_dropped_not_finished() -> None:
    # gamma = 1 when the update is admitted; a later (in-bounds) hello makes it 5e8
    eng = engine(limits=Limits(min_smoothness=1e-12), quorum_fraction=0.0)
    join(eng, "a", "c", rows=1, smoothness=1.0)
    assert eng.handle(*upd("a", topk([0], [9e299])), 1.0).reason is None
    join(eng, "b", rows=10**9, smoothness=1e-12)
    before = eng.x.copy()
    with np.errstate(over="ignore"):  # the step overflows (that is the point)
        eff = eng.tick(20.0)  # deadline passed, quorum 1: the round closes
    assert eff.committed is None and eff.changed
    assert eng.rejected["would_diverge"] == 1
    assert np.array_equal(eng.x, before) and eng.state == "running" and eng.version == 0
    # the dropped update's key was forgotten: it may be sent again (and is judged anew)
    assert eng.handle(*upd("a", topk([0], [9e299])), 21.0).reason == "would_diverge"
    assert eng.handle(*upd("a", topk([0], [0.5]), seq=1), 21.0).reason is None


def test_a_job_finished_as_diverged_by_an_older_version_can_be_resumed() -> None:
    eng = engine()
    join(eng, "a", "b")
    honest_round(eng, ("a", "b"), 1.0)
    eng.lifecycle.finish("diverged: the step produced nan or inf (step size too large?)", 1)
    snap = eng.export()
    again = RoundEngine.restore(eng.config, snap)
    assert again.handle(*upd("a", topk([0], [0.1]), round=1), 2.0).reason == "finished"
    eff = again.control("resume", 3.0)
    assert eff.changed and again.state == "running" and again.finish_reason == ""
    controls = [messages.parse(messages.Control, o.payload) for o in eff.outbound]
    assert controls[0].cmd == "resume"
    honest_round(again, ("a", "b"), 4.0)
    assert again.version == 2


def test_a_job_stopped_by_the_operator_stays_stopped() -> None:
    eng = engine()
    join(eng, "a")
    eng.control("stop", 1.0)
    assert not eng.control("resume", 2.0).changed and eng.state == "finished"


def test_the_bounds_and_the_step_rule_are_settings() -> None:
    s = load_settings(d=D, step_rule="median", max_rows=5, update_norm_factor=50.0)
    cfg = s.engine_config()
    assert cfg.step_rule == "median" and cfg.limits.max_rows == 5
    assert cfg.limits.update_norm_factor == 50.0
    with pytest.raises(SettingsError, match="AGG_MIN_SMOOTHNESS"):
        load_settings(d=D, min_smoothness=10.0, max_smoothness=1.0)
    with pytest.raises(SettingsError, match="AGG_STEP_RULE"):
        load_settings(d=D, step_rule="trimmed")


@pytest.mark.parametrize("since", [2**63, 10**30, -1])
def test_history_since_beyond_int64_is_a_validation_error(
    since: int, memory_url: str, tmp_path: Path
) -> None:
    settings = load_settings(d=D, transports=[memory_url], data_dir=tmp_path / "data")
    with TestClient(create_app(settings)) as client:
        assert client.get("/history", params={"since": 2**63 - 1}).status_code == 200
        assert client.get("/history", params={"since": since}).status_code == 422
