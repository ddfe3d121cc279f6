"""Local training end to end: a real aggregator (uvicorn) with ``AGG_LOCAL_STEPS=5`` and
three real ``edge-agent run --local-steps 5 --compressor signtopk`` processes (their
default duty cycle; Wi-Fi, BLE 5 and NB-IoT profiles) train to a loss target at d = 47,236, over the real Mosquitto broker and over ZeroMQ; every agent's
anchor equals the aggregator's bit for bit at the end. A fourth agent with another H gives
up (exit 2) naming the job's, refused ``wrong_local_steps``.
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
MAX_ROUNDS = 400
LOCAL = ["--local-steps", "5", "--compressor", "signtopk"]
#: agent-0 on Wi-Fi instead of LoRaWAN SF7: the agents keep their default duty cycle
#: (``--duty-cycle wait``) and the run stays in real time (a LoRaWAN member's silence at
#: 1 % is tens of minutes a round; tests/integration/test_duty_cycle.py scales it)
WIFI = "wifi_rpi4_mqtt_tls13"


@pytest.mark.parametrize("transport", ["mqtt", "zmq"])
def test_a_local_training_fleet_trains_with_exact_anchors(
    transport: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    problem = make_problem(tmp_path / "data", features=47_236)
    target = problem.target_loss(REL_SUBOPT)
    url = server_url(transport, request)
    agg = AggregatorProcess(
        tmp_path,
        aggregator_settings(
            problem,
            job="loc",
            server=url,
            data_dir=tmp_path / "agg",
            target_loss=repr(target),
            max_rounds=MAX_ROUNDS,
            local_steps=5,
        ),
    )
    fleet = Fleet(tmp_path)
    with running(agg, fleet):
        agg.start()
        wrong = fleet.start_agent(
            server=url, job="loc", index=0, shard=problem.shards[0], features=problem.features,
            feedback="none", resend_s=5, agent_id="agent-h3",
            extra=["--local-steps", "3", "--compressor", "signtopk"],
        )  # fmt: skip
        wait_until(lambda: wrong.proc.poll() is not None, 60, "the H = 3 agent to exit",
                   diagnose=wrong.diagnose)  # fmt: skip
        assert wrong.proc.returncode == 2, wrong.diagnose()
        assert "--local-steps 5" in wrong.err_path.read_text(), wrong.diagnose()
        check_refused_alone(agg, "agent-h3", "wrong_local_steps")
        fleet.agents.remove(wrong)

        for i, shard in enumerate(problem.shards):
            fleet.start_agent(server=url, job="loc", index=i, shard=shard,
                              features=problem.features, feedback="none", resend_s=5,
                              extra=LOCAL, duty_cycle="wait",
                              profile=WIFI if i == 0 else None)  # fmt: skip
        status = wait_finished(agg, fleet, timeout_s=180)
        fleet.wait(timeout_s=15)

        check_trained_fleet(agg, fleet, status, max_rounds=MAX_ROUNDS, target=target,
                            semantics="local")  # fmt: skip
