"""Local training end to end: a real aggregator (uvicorn) with ``AGG_LOCAL_STEPS=5`` and
three real ``edge-agent run --local-steps 5 --compressor signtopk`` processes (their
default duty cycle; Wi-Fi, BLE 5 and Wi-Fi profiles) train to a loss target at d = 47,236,
over the real Mosquitto broker and over ZeroMQ; every agent's anchor equals the
aggregator's bit for bit at the end. A fourth agent with another H gives up (exit 2) naming
the job's, refused ``wrong_local_steps``.

The same with minibatches (``AGG_LOCAL_STEPS=10 AGG_BATCH_SIZE=0.1``, agents
``--local-steps 10 --batch-size 0.1``: one pass of ten minibatches a round), over both
transports; there the fourth agent runs full gradients and is refused ``wrong_batch_size``. And with a
drawn schedule (``AGG_COMM_PROB=0.2``, agents ``--comm-prob 0.2``): every agent takes the
count each broadcast announced; there the fourth agent runs ``--local-steps 5``.
"""

from __future__ import annotations

import zlib
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

from edge_agent.numerics.local import round_steps

pytestmark = pytest.mark.integration

REL_SUBOPT = 5e-2
MAX_ROUNDS = 400
#: agent-0 on Wi-Fi instead of LoRaWAN SF7: the agents keep their default duty cycle
#: (``--duty-cycle wait``) and the run stays in real time (a LoRaWAN member's silence at
#: 1 % is tens of minutes a round; tests/integration/test_duty_cycle.py scales it)
WIFI = "wifi_rpi4_mqtt_tls13"
#: (the job's settings, the agents' flags and profiles, an agent the job refuses: its flags,
#: the reason and what its error names). Every fleet runs Wi-Fi, BLE 5 and Wi-Fi: an NB-IoT
#: member in real time (about 3 s on air a message) made each run a minute; the three-agent
#: e2e tests run NB-IoT (tests/integration/test_e2e.py)
FULL = ({"local_steps": 5}, ["--local-steps", "5", "--compressor", "signtopk"],
        (WIFI, None, WIFI),
        (["--local-steps", "3", "--compressor", "signtopk"], "wrong_local_steps",
         "--local-steps 5"))  # fmt: skip
BATCH = ({"local_steps": 10, "batch_size": 0.1},
         ["--local-steps", "10", "--batch-size", "0.1", "--compressor", "signtopk"],
         (WIFI, None, WIFI),
         (["--local-steps", "10", "--compressor", "signtopk"], "wrong_batch_size",
          "--batch-size 0.1"))  # fmt: skip
#: a drawn schedule (``AGG_COMM_PROB``): each broadcast announces the next round's count
COIN = ({"comm_prob": 0.2}, ["--comm-prob", "0.2", "--compressor", "signtopk"],
        (WIFI, None, WIFI),
        (["--local-steps", "5", "--compressor", "signtopk"], "wrong_local_steps",
         "--comm-prob 0.2"))  # fmt: skip
Case = tuple[dict[str, object], list[str], tuple[str | None, ...], tuple[list[str], str, str]]


@pytest.mark.parametrize(
    ("transport", "case"),
    [
        ("mqtt", FULL),
        ("zmq", FULL),
        ("mqtt", BATCH),
        ("zmq", BATCH),
        ("mqtt", COIN),
        ("zmq", COIN),
    ],
    ids=["mqtt", "zmq", "mqtt-minibatch", "zmq-minibatch", "mqtt-coin", "zmq-coin"],
)
def test_a_local_training_fleet_trains_with_exact_anchors(
    transport: str, case: Case, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    settings, flags, profiles, (wrong_flags, reason, hint) = case
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
            **settings,
        ),
    )
    fleet = Fleet(tmp_path)
    with running(agg, fleet):
        agg.start()
        wrong = fleet.start_agent(
            server=url, job="loc", index=0, shard=problem.shards[0], features=problem.features,
            feedback="none", resend_s=5, agent_id="agent-misfit", extra=wrong_flags,
        )  # fmt: skip
        wait_until(lambda: wrong.proc.poll() is not None, 60, "the misfit agent to exit",
                   diagnose=wrong.diagnose)  # fmt: skip
        assert wrong.proc.returncode == 2, wrong.diagnose()
        assert hint in wrong.err_path.read_text(), wrong.diagnose()
        check_refused_alone(agg, "agent-misfit", reason)
        fleet.agents.remove(wrong)

        for i, shard in enumerate(problem.shards):
            fleet.start_agent(server=url, job="loc", index=i, shard=shard,
                              features=problem.features, feedback="none", resend_s=5,
                              extra=flags, duty_cycle="wait",
                              profile=profiles[i])  # fmt: skip
        status = wait_finished(agg, fleet, timeout_s=180)
        fleet.wait(timeout_s=15)

        check_trained_fleet(agg, fleet, status, max_rounds=MAX_ROUNDS, target=target,
                            semantics="local")  # fmt: skip
        if "batch_size" in settings:  # one whole pass of ten minibatches a round
            for a in fleet.agents:
                passes, rounds = a.summary()["gradient_passes"], a.summary()["rounds"]
                assert 0 < passes <= rounds and passes == int(passes), a.summary()
        if "comm_prob" in settings:  # round r takes the count version r announced
            draws = [round_steps(0.2, zlib.crc32(b"loc"), j) for j in range(MAX_ROUNDS)]
            for a in fleet.agents:
                passes, rounds = a.summary()["gradient_passes"], a.summary()["rounds"]
                assert passes == sum(draws[: rounds - 1]), a.summary()
