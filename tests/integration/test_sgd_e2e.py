"""Minibatch SGD end to end: a real aggregator (uvicorn) with ``AGG_BATCH_SIZE=0.1`` and
three real ``edge-agent run --batch-size 0.1`` processes train to a loss target, over the
real Mosquitto broker and over ZeroMQ; a fourth agent started without ``--batch-size``
(full gradients) is refused ``wrong_batch_size`` by the aggregator and exits 2, and the
job does not notice it.

The agents use their defaults for a minibatch job: classic error feedback (``ef``) and the
variance-aware CAT gain (docs/algorithm.md, "Minibatch SGD").
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import (
    AGENT_IDS,
    AggregatorProcess,
    Fleet,
    aggregator_settings,
    assert_models_identical,
    make_problem,
    running,
    server_url,
    versions,
    wait_finished,
    wait_until,
)

pytestmark = pytest.mark.integration

REL_SUBOPT = 5e-2
MAX_ROUNDS = 1500  # a safety cap; SGD at 10 % reaches the target in a few hundred here
BATCH = "0.1"


@pytest.mark.parametrize("transport", ["mqtt", "zmq"])
def test_a_minibatch_fleet_trains_and_a_full_gradient_agent_is_refused(
    transport: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    problem = make_problem(tmp_path / "data")
    target = problem.target_loss(REL_SUBOPT)
    url = server_url(transport, request)
    agg = AggregatorProcess(
        tmp_path,
        aggregator_settings(
            problem,
            job="sgd",
            server=url,
            data_dir=tmp_path / "agg",
            target_loss=repr(target),
            max_rounds=MAX_ROUNDS,
            feedback="ef",
            batch_size=BATCH,
        ),
    )
    fleet = Fleet(tmp_path)
    with running(agg, fleet):
        agg.start()
        gd = fleet.start_agent(
            server=url, job="sgd", index=0, shard=problem.shards[0],
            features=problem.features, feedback="ef", resend_s=5,
            agent_id="agent-gd", profile="ble5_2m_dle_notify",
        )  # fmt: skip
        wait_until(lambda: gd.proc.poll() is not None, 30, "the full-gradient agent to exit",
                   diagnose=gd.diagnose)  # fmt: skip
        assert gd.proc.returncode == 2, gd.diagnose()
        assert "--batch-size 0.1" in gd.err_path.read_text(), gd.diagnose()
        status = agg.status()
        assert status["agents"] == 0 and status["round"] == 0
        [refused] = status["refused_agents"]
        assert (refused["agent"], refused["reason"]) == ("agent-gd", "wrong_batch_size")
        fleet.agents.remove(gd)  # it is done; the checks below are of the fleet that trains

        for i, shard in enumerate(problem.shards):
            fleet.start_agent(
                server=url, job="sgd", index=i, shard=shard, features=problem.features,
                feedback="ef", resend_s=5, extra=["--batch-size", BATCH],
            )  # fmt: skip
        status = wait_finished(agg, fleet, timeout_s=120)
        fleet.wait(timeout_s=15)

        n = status["round"]
        assert "target_loss" in status["finish_reason"], status["finish_reason"]
        assert 0 < n < MAX_ROUNDS and status["loss"] <= target
        assert status["agents"] == 3
        rows = agg.history()
        assert versions(rows) == list(range(1, n + 1))
        agents = {a["agent"]: a for a in agg.get("/agents")}
        assert sorted(agents) == list(AGENT_IDS)
        assert all(agents[a]["semantics"] == "ef" for a in AGENT_IDS)
        totals, dense = status["totals"], status["dense_equivalent"]
        assert dense["bytes"] > 10 * totals["bytes"], (totals, dense)
        assert_models_identical(agg, fleet)
        for a in fleet.agents:
            assert a.proc.returncode == 0, a.diagnose()
            assert a.summary()["finished"] is True, a.summary()
