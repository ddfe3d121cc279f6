"""A standby aggregator (``AGG_STANDBY=true``) on the active one's data directory takes
over when the active one is SIGKILLed under load.

Two uvicorn aggregators share one ``AGG_DATA_DIR`` (the same transports, their own HTTP
ports). The second finds the lock held, logs one INFO line naming the holder's pid, and
answers ``/healthz`` with 503 ``standby`` while it waits. Three agents train; at version
``KILL_AT`` the active one is SIGKILLed; the standby takes the lock, recovers from the
checkpoint and the journal, opens the transports (for ZeroMQ it binds the ports only
now, the dead one's ports) and the agents carry on to the end. Checked: ``/history``
holds versions 1..N exactly once with one update per agent each, the accepted count is
3 N, the loss after every version equals a run without a take-over (nothing lost or
applied twice), and every agent holds the final model. The take-over time (SIGKILL to
the first version the standby closed) is printed as JSON.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_helpers import (
    AGENT_IDS,
    AggregatorProcess,
    Fleet,
    aggregator_settings,
    assert_models_identical,
    make_problem,
    reference_run,
    server_url,
    versions,
    wait_finished,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.scaling]

ROUNDS = 80  # AGG_MAX_ROUNDS: the job's end
KILL_AT = 25  # SIGKILL the active aggregator once /status shows this version
JOB = "standby"


def _closed_version(agg: AggregatorProcess) -> int:
    """The standby's model version, or -1 while it has not taken over (503)."""
    try:
        r = agg.http.get("/status", timeout=1.0)
    except httpx.HTTPError:
        return -1
    return int(r.json()["model_version"]) if r.status_code == 200 else -1


@pytest.mark.parametrize(
    ("transport", "downlink"), [("mqtt", "auto"), ("zmq", "auto"), ("zmq", "exact")]
)
def test_a_standby_takes_over_from_a_killed_aggregator_and_no_version_is_lost_or_repeated(
    transport: str, downlink: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The default downlink (auto), and the exact relay: with it the agents' copies are the
    model at every version, so the run after the take-over must equal an uninterrupted one
    bit for bit. Under auto the agents compute at their (compressed) copies and the take-over
    resyncs them, so the trajectory may differ: every version once, every update applied
    once, and the fleet ends holding the trained model."""
    problem = make_problem(tmp_path / "data")
    url = server_url(transport, request)
    settings = aggregator_settings(
        problem,
        job=JOB,
        server=url,
        data_dir=tmp_path / "agg",
        max_rounds=ROUNDS,
        checkpoint_every=5,
        feedback="none",
        downlink=downlink,
    )
    active = AggregatorProcess(tmp_path / "active", settings)
    standby = AggregatorProcess(
        tmp_path / "standby", {**settings, "AGG_STANDBY": "true", "AGG_LOG_LEVEL": "INFO"}
    )
    standby.health_path = "/openapi.json"  # it serves HTTP, but /healthz is 503 until it leads
    fleet = Fleet(tmp_path)
    try:
        active.start()
        standby.start()
        assert active.proc is not None
        health = standby.http.get("/healthz")
        assert health.status_code == 503 and health.json()["status"] == "standby", health.text
        assert f"pid {active.proc.pid} on host" in health.json()["detail"]
        lines = [ln for ln in standby.log_path.read_text().splitlines() if "standby:" in ln]
        assert len(lines) == 1 and f"pid {active.proc.pid}" in lines[0], lines
        assert standby.http.get("/status").status_code == 503  # nothing served from it yet

        fleet.start_all(problem, server=url, job=JOB, feedback="none", resend_s=2)
        wait_until(
            lambda: active.status()["round"] >= KILL_AT,
            30,
            f"version {KILL_AT}",
            poll_s=0.01,
            diagnose=lambda: active.diagnose() + "\n" + fleet.diagnose(),
        )
        last_seen = active.status()["model_version"]
        killed = time.monotonic()
        active.kill()
        wait_until(
            lambda: _closed_version(standby) > last_seen,
            30,
            f"the standby to close a version past {last_seen}",
            poll_s=0.01,
            diagnose=lambda: standby.diagnose() + "\n" + fleet.diagnose(),
        )
        takeover_s = time.monotonic() - killed
        print(json.dumps({"transport": transport, "takeover_s": round(takeover_s, 3)}))
        assert standby.http.get("/healthz").status_code == 200

        status = wait_finished(standby, fleet, timeout_s=60)
        fleet.wait(timeout_s=15)
        assert status["round"] == ROUNDS
        rows = standby.history()
        assert versions(rows) == list(range(1, ROUNDS + 1))
        for row in rows:
            assert {a: row["agents"][a]["updates"] for a in AGENT_IDS} == dict.fromkeys(
                AGENT_IDS, 1
            ), row
        assert status["updates_accepted"] == 3 * ROUNDS
        x = assert_models_identical(standby, fleet)
        if downlink == "exact":
            ref_losses, ref_x = reference_run(problem, job=JOB, feedback="none", rounds=ROUNDS)
            np.testing.assert_allclose([r["loss"] for r in rows], ref_losses, rtol=1e-9, atol=0)
            np.testing.assert_allclose(x, ref_x, rtol=1e-9, atol=1e-12)
        for a in fleet.agents:
            assert a.proc.returncode == 0, a.diagnose()
    finally:
        fleet.close()
        standby.close()
        active.close()
