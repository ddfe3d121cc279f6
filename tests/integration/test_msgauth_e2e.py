"""Signed hellos, status and requests end to end (issue 20, part 1): a real aggregator
(uvicorn) with AGG_REQUIRE_MAC, three real agent processes with ``--mac-key-file``, over
Mosquitto and over ZeroMQ. A stranger without a key sends an unsigned hello for one of
them (another profile, rows, smoothness and compressor) and a forged ``offline`` status:
both are refused ``bad_mac``, the agent's record keeps its own claims, and the job still
trains to its target with every agent.
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
    wait_finished,
    wait_until,
)

from edge_agent.protocol import mac, messages, topics
from edge_agent.transports import open_transport

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.security]

JOB = "signed"
REL_SUBOPT = 1e-2


@pytest.mark.parametrize("transport", ["mqtt", "zmq"])
def test_a_strangers_unsigned_hello_is_refused_and_the_job_trains(
    transport: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    problem = make_problem(tmp_path / "data")
    url = server_url(transport, request)
    keys = tmp_path / "mac-keys"
    for agent_id in AGENT_IDS:
        mac.write_key(keys, agent_id)
    settings = aggregator_settings(
        problem, job=JOB, server=url, data_dir=tmp_path / "agg",
        target_loss=repr(problem.target_loss(REL_SUBOPT)), max_rounds=400,
        mac_keys_dir=keys, require_mac="true",
    )  # fmt: skip
    agg = AggregatorProcess(tmp_path, settings)
    fleet = Fleet(tmp_path)
    victim = AGENT_IDS[0]
    with running(agg, fleet):
        agg.start()
        for i, shard in enumerate(problem.shards):
            fleet.start_agent(
                server=url, job=JOB, index=i, shard=shard, features=problem.features,
                feedback="ef21", resend_s=5,
                extra=["--mac-key-file", str(keys / f"{AGENT_IDS[i]}.mac")],
            )  # fmt: skip
        wait_until(lambda: agg.status()["agents"] == 3, 20, "three signed hellos")
        keep = ("rows", "smoothness", "profile", "compressor", "semantics")
        claims = {k: v for k, v in agg.get(f"/agents/{victim}").items() if k in keep}
        assert len(claims) == len(keep)
        forged = messages.Hello(job=JOB, agent=victim, d=problem.features, rows=1,
                                smoothness=1e-6, model="logreg", compressor="randk",
                                semantics="ef21", profile="lorawan_eu868_dr0_sf12")  # fmt: skip
        offline = messages.Status(state="offline", agent=victim)
        with open_transport(url, role="agent", client_id="stranger", timeout_s=5) as stranger:
            for _ in range(3):  # ZeroMQ may drop the first pushes while connecting
                stranger.publish(topics.hello(JOB, victim), messages.dump(forged))
                stranger.publish(topics.status(JOB, victim), messages.dump(offline))
            wait_until(
                lambda: agg.metrics()['cat_updates_rejected_total{reason="bad_mac"}'] >= 2,
                15, "the forged messages to be refused",
            )  # fmt: skip
        status = wait_finished(agg, fleet, timeout_s=60)
        fleet.wait(timeout_s=15)
        assert "target_loss" in status["finish_reason"], status["finish_reason"]
        info = agg.get(f"/agents/{victim}")
        assert {k: info[k] for k in claims} == claims and info["updates_accepted"] > 0
        metrics = agg.metrics()
        assert metrics['cat_updates_rejected_total{reason="replayed"}'] == 0
        # only the stranger's messages were refused: every genuine one verified
        assert metrics['cat_updates_rejected_total{reason="bad_mac"}'] <= 6
        for a in fleet.agents:
            assert a.proc.returncode == 0, a.diagnose()
        assert_models_identical(agg, fleet)


def test_the_signed_last_will_marks_a_killed_agent_offline_once(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Over a real Mosquitto: an agent with a key is killed (SIGKILL, no goodbye); the
    broker publishes its signed will, whose counter its hello announced, and the aggregator
    takes it (``offline`` at once, not ``lost`` after the liveness timeout)."""
    problem = make_problem(tmp_path / "data")
    url = server_url("mqtt", request)
    keys = tmp_path / "mac-keys"
    mac.write_key(keys, AGENT_IDS[0])
    settings = aggregator_settings(
        problem, job=JOB, server=url, data_dir=tmp_path / "agg", mac_keys_dir=keys,
        require_mac="true", min_agents=1, liveness_timeout_s=600,
    )  # fmt: skip
    agg = AggregatorProcess(tmp_path, settings)
    fleet = Fleet(tmp_path)
    with running(agg, fleet):
        agg.start()
        agent = fleet.start_agent(
            server=url, job=JOB, index=0, shard=problem.shards[0], features=problem.features,
            feedback="ef21", resend_s=5, extra=["--mac-key-file", str(keys / f"{AGENT_IDS[0]}.mac")],
        )  # fmt: skip
        wait_until(lambda: agg.status()["model_version"] >= 3, 20, "three versions")
        assert agg.get(f"/agents/{AGENT_IDS[0]}")["state"] == "online"
        agent.proc.kill()
        agent.proc.wait(timeout=10)
        wait_until(
            lambda: agg.get(f"/agents/{AGENT_IDS[0]}")["state"] == "offline", 15,
            "the will to mark the agent offline",
        )  # fmt: skip
        metrics = agg.metrics()
        for reason in ("bad_mac", "replayed"):
            assert metrics[f'cat_updates_rejected_total{{reason="{reason}"}}'] == 0, reason
