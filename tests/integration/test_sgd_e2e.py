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
    AggregatorProcess,
    Fleet,
    aggregator_settings,
    check_refused_alone,
    check_trained_fleet,
    make_problem,
    running,
    server_url,
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
        check_refused_alone(agg, "agent-gd", "wrong_batch_size")
        fleet.agents.remove(gd)  # it is done; the checks below are of the fleet that trains

        for i, shard in enumerate(problem.shards):
            fleet.start_agent(
                server=url, job="sgd", index=i, shard=shard, features=problem.features,
                feedback="ef", resend_s=5, extra=["--batch-size", BATCH],
            )  # fmt: skip
        status = wait_finished(agg, fleet, timeout_s=120)
        fleet.wait(timeout_s=15)

        check_trained_fleet(agg, fleet, status, max_rounds=MAX_ROUNDS, target=target,
                            semantics="ef")  # fmt: skip
