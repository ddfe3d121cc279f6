"""Issue 12, item 10's small points: each behaviour with its own test.

* ``aggregator serve --mqtt-tls-insecure`` is a switch (a bool setting's flag alone = true);
* paho's "Client is not connected" (ERROR on every loop pass while the broker is down) is
  DEBUG, with at most one WARNING a minute that the broker is still unreachable;
* ``mqtts://`` against a plain listener names the TLS mismatch;
* ``edge-agent data split``/``generate`` refuse to overwrite shards without ``--force``;
* the dashboard's first paint shows the job as the server sees it, not "connecting...".
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from paho.mqtt.client import MQTT_LOG_ERR, MQTT_LOG_WARNING

from aggregator import cli as agg_cli
from aggregator.service.settings import Settings
from aggregator.web.app import create_app
from edge_agent.cli import commands as cli
from edge_agent.errors import TransportError
from edge_agent.transports.mqtt import NOT_CONNECTED_EVERY_S, MqttTransport

NOT_CONNECTED = "Client is not connected. Socket: None). Last known Connection State: X"


def _serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="aggregator")
    sub = parser.add_subparsers(dest="command")
    agg_cli._serve_parser(sub)
    return parser.parse_args(["serve", *argv])


def test_serve_bool_settings_are_switches() -> None:
    alone = _serve_args("--mqtt-tls-insecure", "--d", "5")
    assert alone.mqtt_tls_insecure == "true" and alone.d == "5"
    assert _serve_args("--mqtt-tls-insecure", "false").mqtt_tls_insecure == "false"
    assert _serve_args("--d", "5").mqtt_tls_insecure is None  # unset: env / file / default
    parsed: dict[str, Any] = {"d": 5, "mqtt_tls_insecure": alone.mqtt_tls_insecure}
    assert Settings(**parsed).mqtt_tls_insecure is True
    with pytest.raises(SystemExit):
        _serve_args("--mqtt-tls-insecure", "maybe")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_paho_not_connected_is_debug_with_a_warning_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    monkeypatch.setattr(time, "monotonic", clock.monotonic)  # the module reads time.monotonic
    t = MqttTransport("mqtt://127.0.0.1:9", role="agent", client_id="quiet")
    client = t._client
    caplog.set_level(logging.DEBUG, logger="edge_agent.transports.mqtt")
    for _ in range(40):  # paho's loop while the broker is down: one line per pass, 2 s apart
        client._easy_log(MQTT_LOG_ERR, NOT_CONNECTED)
        clock.now += 2.0
    records = [r for r in caplog.records if r.name.startswith("edge_agent.transports.mqtt")]
    assert not [r for r in records if r.levelno >= logging.ERROR]
    warned = [r for r in records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "still unreachable" in warned[0].getMessage()  # 78 s: once
    assert sum("Client is not connected" in r.getMessage() for r in records) == 40  # DEBUG
    caplog.clear()
    client._easy_log(MQTT_LOG_WARNING, "something else from paho")  # other lines keep level
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "something else from paho")
    ]
    assert clock.now - 1000.0 > NOT_CONNECTED_EVERY_S


@pytest.fixture
def resetting_listener() -> Iterator[int]:
    """A TCP port that reads what a client sends and resets the connection, as a plain
    Mosquitto listener does with a TLS ClientHello."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2.0)
                with contextlib.suppress(OSError):
                    conn.recv(4096)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join(timeout=5)
    server.close()


@pytest.mark.integration
def test_mqtts_against_a_plain_listener_names_the_tls_mismatch(resetting_listener: int) -> None:
    url = f"mqtts://127.0.0.1:{resetting_listener}?timeout_s=3"
    t = MqttTransport(url, role="agent", client_id="tls-mismatch")
    with pytest.raises(TransportError) as caught:
        t.connect()
    message = str(caught.value)
    assert "plain MQTT listener, not TLS" in message, message
    assert f"mqtt://127.0.0.1:{resetting_listener}" in message
    assert "localhost:1883" not in message


def test_data_split_refuses_to_overwrite_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "gen"
    assert (
        cli.main(["data", "generate", "--rows", "60", "--features", "40", "--out", str(src)]) == 0
    )
    out = tmp_path / "shards"
    split = ["data", "split", str(src / "shard-000.svm"), "--shards", "3", "--out", str(out)]
    assert cli.main(split) == 0
    before = (out / "shard-001.svm").read_bytes()
    (out / "shard-001.svm").write_text("mine\n")
    capsys.readouterr()
    assert cli.main(split) == 1
    err = capsys.readouterr().err
    assert "shard-000.svm, shard-001.svm, shard-002.svm" in err and "--force" in err
    assert (out / "shard-001.svm").read_text() == "mine\n"  # nothing was written
    assert cli.main([*split, "--force"]) == 0
    assert (out / "shard-001.svm").read_bytes() == before
    again = ["data", "generate", "--rows", "60", "--features", "40", "--out", str(src)]
    assert cli.main(again) == 1  # generate writes the same files: the same rule


def test_dashboard_first_paint_is_the_server_state(memory_url: str, tmp_path: Path) -> None:
    values: dict[str, Any] = {
        "job": "paint",
        "d": 8,
        "transports": [memory_url],
        "data_dir": tmp_path / "data",
        "tick_s": 0.02,
    }
    settings = Settings(**values)
    with TestClient(create_app(settings)) as client:
        page = client.get("/")
    assert page.status_code == 200
    assert "connecting…" not in page.text
    assert 'data-state="waiting">waiting<' in page.text
    assert '<dd id="job">paint</dd>' in page.text
    assert '<dd id="round">0</dd>' in page.text and '<dd id="live">0 / 0</dd>' in page.text
