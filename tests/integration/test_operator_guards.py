"""The operator's guards with real processes: ``uvicorn aggregator.app:app`` and
``aggregator serve`` as subprocesses, a real Mosquitto (aggregator/localnet.py).

* a profiles directory that does not exist: exit 2, one line naming the variable and path;
* a second aggregator on one AGG_DATA_DIR: exit 2 naming the holder; after SIGKILL of the
  first (no shutdown hook), the second starts;
* /healthz: 503 ``degraded`` while the broker it serves is stopped, 200 once it is back;
* a hello naming a profile the aggregator lacks: refused ``unknown_profile``, counted on
  /status and /metrics, its agent told, nothing priced;
* AGG_LOG_FORMAT=json: every line either process prints is one JSON object, uvicorn's
  start, access and shutdown lines included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import wait_until

from aggregator.localnet import (
    MosquittoBroker,
    ServiceProcess,
    free_port,
    free_port_pair,
    service_env,
)
from edge_agent.links.catalog import PROFILES_DIR_ENV
from edge_agent.protocol import messages, topics
from edge_agent.transports import open_transport

pytestmark = pytest.mark.integration

JOB = "ops"
D = 8
UVICORN = [sys.executable, "-m", "uvicorn", "aggregator.app:app", "--host", "127.0.0.1"]
SERVE = [sys.executable, "-m", "aggregator.cli", "serve"]


def _settings(tmp_path: Path, transport: str, **more: str) -> dict[str, str]:
    return {
        "AGG_JOB": JOB,
        "AGG_D": str(D),
        "AGG_DATA_DIR": str(tmp_path / "data"),
        "AGG_TRANSPORTS": transport,
        **more,
    }


def _zmq() -> str:
    return f"zmq+tcp://127.0.0.1:{free_port_pair()}"


def _run(cmd: list[str], env: Mapping[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a start-up that must fail, to its exit."""
    return subprocess.run(
        cmd, env=service_env(env), cwd=cwd, capture_output=True, text=True, timeout=60
    )


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status), json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


# ---------------------------------------------------------------- profiles directory


@pytest.mark.parametrize("command", ["uvicorn", "serve"])
def test_a_missing_profiles_directory_exits_2_naming_variable_and_path(
    tmp_path: Path, command: str
) -> None:
    missing = tmp_path / "opt" / "cost_profiles"
    env = _settings(tmp_path, _zmq(), **{PROFILES_DIR_ENV: str(missing)})
    cmd = [*UVICORN, "--port", str(free_port())] if command == "uvicorn" else SERVE
    proc = _run(cmd, env, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"cannot start: {PROFILES_DIR_ENV}={missing}: no such directory; set " in lines[0]
    assert not (tmp_path / "data").exists()  # refused before anything is written


# ---------------------------------------------------------------- one aggregator per directory


def test_a_second_aggregator_exits_2_naming_the_holder_until_the_first_dies(
    tmp_path: Path,
) -> None:
    first = ServiceProcess(tmp_path / "first", _settings(tmp_path, _zmq()))
    second = ServiceProcess(tmp_path / "second", _settings(tmp_path, _zmq()))
    try:
        first.start()
        assert first.proc is not None
        proc = _run([*UVICORN, "--port", str(free_port())], second.settings, tmp_path)
        assert proc.returncode == 2, proc.stderr
        line = proc.stderr.splitlines()[-1]
        assert f"AGG_DATA_DIR={tmp_path / 'data'} is in use by another aggregator" in line
        assert f"(pid {first.proc.pid} on host " in line and " since 20" in line
        first.kill()  # SIGKILL: no shutdown hook; the kernel drops the lock
        second.start()
        status, body = _get(second.base_url + "/healthz")
        assert (status, body["status"]) == (200, "ok")
    finally:
        first.close()
        second.close()


# ---------------------------------------------------------------- /healthz


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    with MosquittoBroker(tmp_path / "mosquitto") as running:
        yield running


def test_healthz_is_503_while_the_broker_is_down_and_200_once_it_is_back(
    tmp_path: Path, broker: MosquittoBroker
) -> None:
    with ServiceProcess(tmp_path / "agg", _settings(tmp_path, broker.url)) as service:
        health = service.base_url + "/healthz"
        assert _get(health)[0] == 200
        broker.stop()
        wait_until(lambda: _get(health)[0] == 503, 20, "/healthz 503 after the broker stopped")
        body = _get(health)[1]
        assert body["status"] == "degraded" and broker.url in body["detail"]
        assert body["transports"] == [{"url": broker.url, "connected": False}]
        broker.start()  # the same port; the transport reconnects with back-off 1..30 s
        wait_until(lambda: _get(health)[0] == 200, 45, "/healthz 200 after the broker is back")
        assert _get(health)[1]["transports"] == [{"url": broker.url, "connected": True}]


# ---------------------------------------------------------------- unknown_profile


def test_a_hello_naming_an_unknown_profile_is_counted_and_never_priced(
    tmp_path: Path, broker: MosquittoBroker
) -> None:
    with ServiceProcess(tmp_path / "agg", _settings(tmp_path, broker.url)) as service:
        agent = open_transport(broker.url, role="agent", client_id="ops-a", timeout_s=5)
        agent.connect()
        agent.subscribe(topics.control(JOB))
        try:
            hello = messages.Hello(
                job=JOB, agent="a", d=D, rows=10, smoothness=2.0, model="logreg",
                compressor="topk", semantics="ef21", profile="site_link_v2",
            )  # fmt: skip
            agent.publish(topics.hello(JOB, "a"), messages.dump(hello))
            told = None
            deadline = time.monotonic() + 15
            while told is None and time.monotonic() < deadline:
                got = agent.recv(timeout_s=0.5)
                if got is not None and got.topic == topics.control(JOB):
                    ctl = messages.parse(messages.Control, got.payload)
                    told = ctl if ctl.cmd == "refused" and ctl.agent == "a" else None
            assert told is not None and told.reason == "unknown_profile", told
            assert "site_link_v2.json" in told.detail
        finally:
            agent.close()
        status = json.loads(urllib.request.urlopen(service.base_url + "/status").read())
        assert status["updates_rejected"] == {"unknown_profile": 1}
        assert status["agents"] == 0 and status["totals"]["updates"] == 0
        assert status["refused_agents"][0]["reason"] == "unknown_profile"
        metrics = urllib.request.urlopen(service.base_url + "/metrics").read().decode()
        assert any(
            'reason="unknown_profile"' in line and line.endswith(" 1.0")
            for line in metrics.splitlines()
        ), metrics
    log = service.log_path.read_text()
    assert "rejected a message: unknown_profile (a: cost profile 'site_link_v2'" in log


# ---------------------------------------------------------------- one log format


def _json_lines(text: str) -> list[dict[str, Any]]:
    records = []
    for line in text.splitlines():
        record = json.loads(line)  # every line: a JSON object
        assert set(record) >= {"time", "level", "logger", "message"}, line
        records.append(record)
    return records


@pytest.mark.parametrize("command", ["uvicorn", "serve"])
def test_every_line_is_json_under_agg_log_format_json(tmp_path: Path, command: str) -> None:
    port = free_port()
    env = _settings(tmp_path, _zmq(), AGG_LOG_FORMAT="json", AGG_LOG_LEVEL="INFO")
    if command == "uvicorn":
        cmd = [*UVICORN, "--port", str(port), "--log-level", "info"]
    else:
        cmd = [*SERVE, "--port", str(port)]
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            cmd, env=service_env(env), cwd=tmp_path, stdout=stdout, stderr=stderr
        )
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, err.read_text()
            try:
                return _get(base + "/healthz")[0] == 200
            except OSError:
                return False

        wait_until(up, 30, "the service answers /healthz")
        _get(base + "/status")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    records = _json_lines(out.read_text()) + _json_lines(err.read_text())
    said = {(r["logger"], r["message"].split(" ")[0]) for r in records}
    assert ("uvicorn.error", "Started") in said, records  # "Started server process [pid]"
    assert ("uvicorn.error", "Uvicorn") in said, records  # "Uvicorn running on ..."
    access = [r["message"] for r in records if r["logger"] == "uvicorn.access"]
    assert any('"GET /status HTTP/1.1" 200' in m for m in access), records
    assert any(r["logger"] == "aggregator.service.ingest" for r in records), records
