"""The local-network helper the demo, the tests and the benchmarks share (aggregator.localnet).

Pure parts (ports, config rendering, the missing-program error, the service environment) run
everywhere; the ones that start a real Mosquitto or a real uvicorn are marked integration.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from aggregator.localnet import (
    HOST,
    MissingProgram,
    MosquittoBroker,
    ServiceProcess,
    StartupError,
    find_program,
    free_port,
    free_port_pair,
    free_ports,
    render_config,
    service_env,
    wait_for_port,
)


def _mosquitto_or_skip() -> None:
    try:
        find_program("mosquitto")
    except MissingProgram as exc:
        pytest.skip(str(exc))


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


# --------------------------------------------------------------------------- pure


def test_free_ports_are_distinct_and_free_on_loopback() -> None:
    ports = free_ports(8)
    assert len(set(ports)) == 8
    assert all(_bindable(p) for p in ports)
    assert _bindable(free_port())


def test_free_ports_rejects_a_count_below_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        free_ports(0)


def test_free_port_pair_gives_two_consecutive_free_ports() -> None:
    port = free_port_pair()
    with socket.socket() as a, socket.socket() as b:
        a.bind((HOST, port))
        b.bind((HOST, port + 1))  # raises if p + 1 was not free


def test_no_port_is_handed_out_twice_nor_a_pair_s_second_port() -> None:
    """A service's HTTP port chosen after its ZeroMQ pair must not be the pair's p + 1 (the
    OS often offers a just-released neighbour again): CI once failed on exactly that."""
    port = free_port_pair()
    later = free_ports(64) + [free_port() for _ in range(64)]
    assert port not in later and port + 1 not in later
    assert len(set(later)) == len(later)
    assert free_port_pair() not in (port - 1, port, port + 1)


def test_wait_for_port_is_bounded_and_sees_a_listener() -> None:
    with socket.socket() as server:
        server.bind((HOST, 0))
        server.listen()
        assert wait_for_port(server.getsockname()[1], 2.0)
    assert not wait_for_port(free_port(), 0.2)
    assert not wait_for_port(free_port(), 30.0, alive=lambda: False)  # gives up at once


def test_a_missing_mosquitto_is_a_clear_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(MissingProgram, match=r"no-such-mosquitto not found.*install") as info:
        MosquittoBroker(tmp_path, executable="no-such-mosquitto")
    assert isinstance(info.value, FileNotFoundError)  # what benchmarks and scripts catch
    assert info.value.program == "no-such-mosquitto"
    assert not (tmp_path / "mosquitto.conf").exists()


def test_render_config_moves_every_listener_to_loopback_and_sets_paths() -> None:
    shipped = (
        "# a comment: listener 9999\n"
        "password_file /etc/passwd-of-prod\n"
        "listener 8883\n"
        "cafile /etc/ca.crt\n"
        "listener 1883 0.0.0.0\n"
    )
    out = render_config(
        shipped,
        ports={8883: 40001, 1883: 40002},
        paths={"password_file": Path("run/p"), "cafile": Path("run/ca")},
    ).splitlines()
    assert out[:5] == [
        "# a comment: listener 9999",
        "password_file run/p",
        f"listener 40001 {HOST}",
        "cafile run/ca",
        f"listener 40002 {HOST}",
    ]
    assert out[5].startswith("user ") and len(out) == 6


def test_render_config_sets_values_such_as_a_bridge_address() -> None:
    shipped = "listener 1883\nconnection central\naddress central.example.org:8883\n"
    out = render_config(
        shipped, ports={1883: 40000}, paths={}, values={"address": f"{HOST}:40001"}
    ).splitlines()
    assert out[1:3] == ["connection central", f"address {HOST}:40001"]


def test_render_config_refuses_a_value_it_cannot_find() -> None:
    with pytest.raises(ValueError, match=r"'remote_password': 0"):
        render_config("listener 1883\n", ports={1883: 1}, paths={}, values={"remote_password": "x"})


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("listener 1883\nlistener 7777\n", "listener 7777 has no local port"),
        ("listener 1883\n", r"expected each of these options once.*'cafile': 0"),
        ("listener 1883\ncafile a\ncafile b\n", r"'cafile': 2"),
        ("listener 1883\ncafile a\nuser mosquitto\n", "remove the 'user' line"),
    ],
)
def test_render_config_refuses_a_config_other_than_the_one_meant(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        render_config(text, ports={1883: 40000}, paths={"cafile": Path("/x")}, source="shipped")


def test_service_env_drops_the_developers_agg_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGG_MAX_ROUNDS", "7")
    monkeypatch.setenv("CAT_EDGE_UNRELATED", "kept")
    env = service_env({"AGG_JOB": "j"})
    assert "AGG_MAX_ROUNDS" not in env and env["AGG_JOB"] == "j"
    assert env["CAT_EDGE_UNRELATED"] == "kept" and env["PYTHONUNBUFFERED"] == "1"


def test_the_service_never_imports_the_helper() -> None:
    code = (
        "import sys, aggregator.web.app, aggregator.cli, aggregator.service.ingest\n"
        "print('aggregator.localnet' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- real servers


@pytest.mark.integration
def test_broker_accepts_a_real_paho_client_and_cleans_up() -> None:
    _mosquitto_or_skip()
    got: list[bytes] = []
    subscribed, arrived = threading.Event(), threading.Event()

    def on_message(client: paho.Client, userdata: object, msg: paho.MQTTMessage) -> None:
        got.append(bytes(msg.payload))
        arrived.set()

    with MosquittoBroker() as broker:
        assert broker.url == f"mqtt://{HOST}:{broker.port}"
        assert f"listener {broker.port} {HOST}" in broker.config_path.read_text()
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id="localnet-test")
        client.on_message = on_message
        client.on_connect = lambda c, *_: c.subscribe("localnet/t", qos=1)
        client.on_subscribe = lambda *_: subscribed.set()
        client.connect(HOST, broker.port, keepalive=10)
        client.loop_start()
        try:
            assert subscribed.wait(5.0), "no SUBACK from the broker"
            client.publish("localnet/t", b"hello", qos=1).wait_for_publish(5.0)
            assert arrived.wait(5.0), f"own message not delivered:\n{broker.log_tail()}"
        finally:
            client.disconnect()
            client.loop_stop()
        workdir = broker.workdir
    assert got and got[0] == b"hello"
    assert not workdir.exists()  # a temporary work directory is removed on exit
    assert not wait_for_port(broker.port, 0.2)


@pytest.mark.integration
def test_broker_restarts_on_the_same_port(tmp_path: Path) -> None:
    _mosquitto_or_skip()
    broker = MosquittoBroker(tmp_path, options={"log_type": "all"})
    try:
        broker.start()
        port = broker.port
        broker.stop()
        assert not broker.running and not wait_for_port(port, 0.2)
        broker.start()
        assert broker.running and broker.port == port and wait_for_port(port, 1.0)
    finally:
        broker.close()
    assert tmp_path.exists()  # a caller's directory is kept, with the log in it
    assert (tmp_path / "mosquitto.log").stat().st_size > 0


@pytest.mark.integration
def test_a_broker_that_cannot_start_says_why(tmp_path: Path) -> None:
    _mosquitto_or_skip()
    broker = MosquittoBroker(tmp_path, options={"no_such_option": "1"})
    with pytest.raises(StartupError, match=r"(?s)exited with \d+.*no_such_option"):
        broker.start(timeout_s=10.0)
    assert not broker.running


@pytest.mark.integration
def test_service_process_serves_health_and_stops(tmp_path: Path) -> None:
    settings = {
        "AGG_JOB": "localnet",
        "AGG_D": "8",
        "AGG_TRANSPORTS": "memory://localnet-test",
        "AGG_DATA_DIR": str(tmp_path / "data"),
    }
    with ServiceProcess(tmp_path, settings) as service:
        assert service.alive() and service.base_url == f"http://{HOST}:{service.port}"
        with urllib.request.urlopen(service.base_url + "/healthz", timeout=5) as r:
            assert r.status == 200
        with urllib.request.urlopen(service.base_url + "/status", timeout=5) as r:
            assert b'"job":"localnet"' in r.read().replace(b" ", b"")
        proc = service.proc
    assert proc is not None and proc.poll() is not None  # stopped on exit
    assert not wait_for_port(service.port, 0.2)
    assert (tmp_path / "aggregator-1.log").exists()


@pytest.mark.integration
def test_a_service_that_cannot_start_quotes_its_log(tmp_path: Path) -> None:
    service = ServiceProcess(tmp_path, {"AGG_D": "-1", "AGG_DATA_DIR": str(tmp_path / "d")})
    with pytest.raises(
        StartupError, match=r"(?s)aggregator exited with \d+ during start-up.*AGG_D"
    ):
        service.start(timeout_s=30.0)
    assert not service.alive()
