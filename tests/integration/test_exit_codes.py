"""Exit statuses of ``edge-agent run`` and the aggregator, as real processes.

The project's rule (docs/operating.md, "Exit status"): 0 done, 1 a runtime failure worth a
restart, 2 a configuration error (systemd: RestartPreventExitStatus=2), 130 after SIGINT,
143 after SIGTERM. Wrong MQTT credentials, an untrusted CA and TLS against a plain listener
are configuration errors: the message names the flag (agent) or the variable (aggregator),
never the transport's internal option name.

A real Mosquitto with a password file and a TLS listener whose certificate comes from
``deploy/tls/make-test-ca.sh``; the client trusts a second, unrelated CA.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from aggregator.localnet import (
    MissingProgram,
    MosquittoBroker,
    find_program,
    free_port,
    free_port_pair,
)
from edge_agent.data import make_rcv1_like, write_libsvm

pytestmark = pytest.mark.integration

MAKE_TEST_CA = Path(__file__).resolve().parents[2] / "deploy" / "tls" / "make-test-ca.sh"
D = 50
TIMEOUT_S = 60.0
#: a plain and a TLS listener sharing one password file (ports and paths are rewritten)
BROKER_CONF = """\
per_listener_settings false
allow_anonymous false
password_file passwd
persistence false
listener 1883 127.0.0.1
listener 8883 127.0.0.1
cafile ca.crt
certfile server.crt
keyfile server.key
"""


@dataclass(frozen=True)
class Broker:
    plain_url: str
    tls_url: str
    good_ca: Path
    other_ca: Path
    shard: Path
    workdir: Path


def _make_ca(out: Path) -> None:
    subprocess.run(
        ["bash", str(MAKE_TEST_CA), str(out)], check=True, capture_output=True, timeout=60
    )


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found (make-test-ca.sh needs it)")
    base = tmp_path_factory.mktemp("exit-codes")
    try:
        mosquitto_passwd = find_program("mosquitto_passwd")
    except MissingProgram as exc:
        pytest.skip(f"{exc} (to test refused credentials)")
    passwd = base / "passwd"
    subprocess.run([mosquitto_passwd, "-b", "-c", str(passwd), "pi-01", "s3cret"], check=True)
    passwd.chmod(0o600)
    _make_ca(base / "tls")
    _make_ca(base / "other")
    conf = base / "mosquitto.conf"
    conf.write_text(BROKER_CONF)
    ds = make_rcv1_like(40, D, rng=np.random.default_rng(0), nnz_per_row=5)
    shard = base / "shard.svm"
    write_libsvm(ds, shard)
    tls = base / "tls"
    paths = {"password_file": passwd, "cafile": tls / "ca.crt", "certfile": tls / "server.crt",
             "keyfile": tls / "server.key"}  # fmt: skip
    with MosquittoBroker(base / "broker", config_file=conf, paths=paths) as server:
        yield Broker(
            plain_url=server.url,
            tls_url=f"mqtts://127.0.0.1:{server.ports[8883]}",
            good_ca=base / "tls" / "ca.crt",
            other_ca=base / "other" / "ca.crt",
            shard=shard,
            workdir=base,
        )


def _secret(broker: Broker, text: str) -> Path:
    path = broker.workdir / f"password-{text}"
    path.write_text(text + "\n")
    return path


def _agent(broker: Broker, server: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "edge_agent", "run", "--server", server,
            "--profile", "lorawan_eu868_dr5_sf7", "--data", str(broker.shard),
            "--username", "pi-01", *extra]  # fmt: skip


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_agent_wrong_password_exits_2_naming_the_flag(broker: Broker) -> None:
    wrong = _secret(broker, "wrong")
    result = _run(_agent(broker, broker.plain_url, "--password-file", str(wrong)))
    assert result.returncode == 2, result.stderr
    assert "--password-file" in result.stderr and "--username" in result.stderr
    assert "password_file" not in result.stderr


def test_agent_untrusted_ca_exits_2_naming_the_flag(broker: Broker) -> None:
    good = _secret(broker, "s3cret")
    result = _run(
        _agent(
            broker, broker.tls_url, "--password-file", str(good), "--ca-file", str(broker.other_ca)
        )
    )
    assert result.returncode == 2, result.stderr
    assert "not trusted" in result.stderr and "--ca-file" in result.stderr
    assert "ca_file" not in result.stderr


def test_agent_tls_against_plain_listener_exits_2_naming_server(broker: Broker) -> None:
    good = _secret(broker, "s3cret")
    plain_as_tls = broker.plain_url.replace("mqtt://", "mqtts://")
    result = _run(
        _agent(broker, plain_as_tls, "--password-file", str(good), "--ca-file", str(broker.good_ca))
    )
    assert result.returncode == 2, result.stderr
    assert "plain MQTT listener" in result.stderr and "--server" in result.stderr


def _serve_env(broker: Broker, transport: str, **extra: str) -> dict[str, str]:
    return {
        "AGG_DATA_DIR": str(broker.workdir / f"data-{len(os.listdir(broker.workdir))}"),
        "AGG_TRANSPORTS": transport,
        "AGG_D": str(D),
        "AGG_PORT": str(free_port()),
        "AGG_HOST": "127.0.0.1",
        **extra,
    }


def test_serve_wrong_password_exits_2_naming_the_variable(broker: Broker) -> None:
    env = _serve_env(
        broker,
        broker.plain_url,
        AGG_MQTT_USERNAME="pi-01",
        AGG_MQTT_PASSWORD_FILE=str(_secret(broker, "wrong")),
    )
    result = _run([sys.executable, "-m", "aggregator", "serve"], env)
    assert result.returncode == 2, result.stderr
    assert "AGG_MQTT_PASSWORD_FILE" in result.stderr and "AGG_MQTT_USERNAME" in result.stderr
    assert "password_file" not in result.stderr


def test_uvicorn_untrusted_ca_exits_2_naming_the_variable(broker: Broker) -> None:
    env = _serve_env(
        broker,
        broker.tls_url,
        AGG_MQTT_USERNAME="pi-01",
        AGG_MQTT_PASSWORD_FILE=str(_secret(broker, "s3cret")),
        AGG_MQTT_CA_FILE=str(broker.other_ca),
    )
    cmd = [sys.executable, "-m", "uvicorn", "aggregator.app:app", "--port", env["AGG_PORT"]]
    result = _run(cmd, env)
    assert result.returncode == 2, result.stderr
    assert "AGG_MQTT_CA_FILE" in result.stderr and "not trusted" in result.stderr
    assert "ca_file" not in result.stderr


def _wait_for_line(proc: subprocess.Popen[str], needle: str) -> str:
    """Read stderr until ``needle`` (bounded); the lines read so far."""
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return "".join(seen)
    proc.kill()
    pytest.fail(f"no {needle!r} within {TIMEOUT_S} s:\n{''.join(seen)}")


def _stopped_with(cmd: list[str], ready: str, signum: int, env: dict[str, str]) -> int:
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}
    )
    try:
        _wait_for_line(proc, ready)
        time.sleep(1.0)  # past the line: the signal handlers are installed
        proc.send_signal(signum)
        try:
            proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # still running: ask for every thread's stack (SIGUSR1), so a hang says where
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2.0)
            proc.kill()
            _, err = proc.communicate(timeout=10)
            pytest.fail(f"no exit within {TIMEOUT_S} s of signal {signum}; stacks:\n{err}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_agent_exit_status_after_a_signal(broker: Broker, signum: int, status: int) -> None:
    cmd = _agent(broker, broker.plain_url, "--password-file", str(_secret(broker, "s3cret")))
    env = {"PYTHONUNBUFFERED": "1"}
    assert _stopped_with(cmd, "agent pi-01: job", signum, env) == status


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_serve_exit_status_after_a_signal(broker: Broker, signum: int, status: int) -> None:
    env = _serve_env(broker, f"zmq+tcp://127.0.0.1:{free_port_pair()}")
    cmd = [sys.executable, "-m", "aggregator", "serve"]
    assert _stopped_with(cmd, "Uvicorn running", signum, env) == status


def test_serve_on_a_port_in_use_exits_1(broker: Broker) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = _serve_env(broker, f"zmq+tcp://127.0.0.1:{free_port_pair()}")
        env["AGG_PORT"] = str(taken.getsockname()[1])
        result = _run([sys.executable, "-m", "aggregator", "serve"], env)
    assert result.returncode == 1, result.stderr
    assert "uvicorn could not serve on 127.0.0.1:" in result.stderr
