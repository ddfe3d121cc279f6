"""The aggregator's MQTT client id is protected on every listener of the shipped broker
(issue 13, finding 6): a client that connects with the aggregator's client id, on the
loopback or on the TLS listener, must not knock the aggregator off the broker.

The broker runs ``deploy/mosquitto/mosquitto.conf`` and the shipped ACL, with only ports and
file paths rewritten (as in ``test_deploy_broker.py``); users come from
``deploy/mosquitto/add-agent.sh``. A knocked-off aggregator shows as a reconnect in its
transport's stats and as "already connected" in the broker log.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aggregator.localnet import HOST, MissingProgram, MosquittoBroker, find_program, tail
from edge_agent.transports import Transport, open_transport

pytestmark = [pytest.mark.integration, pytest.mark.security]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SHIPPED_CONF = DEPLOY / "mosquitto" / "mosquitto.conf"
SHIPPED_ACL = DEPLOY / "mosquitto" / "acl"
ADD_AGENT = DEPLOY / "mosquitto" / "add-agent.sh"
MAKE_TEST_CA = DEPLOY / "tls" / "make-test-ca.sh"
TLS_PORT, LOOPBACK_PORT = 8883, 1883
#: how long the aggregator's connection is watched after the impostor connected (s)
WATCH_S = 2.0


@dataclass(frozen=True)
class Broker:
    tls_port: int
    plain_port: int
    tls_dir: Path
    secrets: Path
    log_path: Path


def _check(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, f"{cmd[0]} failed: {result.stderr}"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    try:
        find_program("mosquitto_passwd")
        find_program("mosquitto")
    except MissingProgram as exc:
        pytest.skip(f"{exc}; the test needs mosquitto and openssl")
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found; install mosquitto and openssl")
    base = tmp_path_factory.mktemp("clientid-broker")
    tls_dir, secrets, passwd = base / "tls", base / "secrets", base / "passwd"
    secrets.mkdir()
    _check(["bash", str(MAKE_TEST_CA), str(tls_dir)])
    _check(["bash", str(ADD_AGENT), "-f", str(passwd), "--aggregator",
            "-o", str(secrets / "aggregator")])  # fmt: skip
    _check(["bash", str(ADD_AGENT), "-f", str(passwd), "-o", str(secrets / "pi-01"), "pi-01"])
    persistence = base / "persistence"
    persistence.mkdir()
    server = MosquittoBroker(
        base,
        config_file=SHIPPED_CONF,
        paths={
            "password_file": passwd,
            "acl_file": SHIPPED_ACL,
            "cafile": tls_dir / "ca.crt",
            "certfile": tls_dir / "server.crt",
            "keyfile": tls_dir / "server.key",
            "persistence_location": Path(f"{persistence}/"),
        },
    )
    with server:
        yield Broker(
            server.ports[TLS_PORT], server.ports[LOOPBACK_PORT], tls_dir, secrets, server.log_path
        )


def _aggregator(broker: Broker, client_id: str) -> Transport:
    """The aggregator as deployed by systemd: mqtt:// on the loopback listener."""
    return open_transport(
        f"mqtt://{HOST}:{broker.plain_port}", role="aggregator", client_id=client_id,
        username="aggregator", password_file=str(broker.secrets / "aggregator"),
        timeout_s=5.0, close_timeout_s=1.0,
    )  # fmt: skip


def _impostor(broker: Broker, url: str, client_id: str, **options: object) -> Transport:
    """Agent pi-01 (valid credentials) connecting with someone else's client id."""
    return open_transport(
        url, role="agent", client_id=client_id, username="pi-01",
        password_file=str(broker.secrets / "pi-01"), timeout_s=5.0, close_timeout_s=1.0,
        clean_session=True, **options,
    )  # fmt: skip


def _assert_not_knocked_off(broker: Broker, url: str, **options: object) -> None:
    job = f"t{uuid.uuid4().hex[:8]}"
    client_id = f"aggregator-{job}"
    with _aggregator(broker, client_id) as agg:
        agg.subscribe(f"cat/{job}/hello/+")
        impostor = _impostor(broker, url, client_id, **options)
        impostor.connect()  # valid credentials: it does connect (under its own user name)
        deadline = time.monotonic() + WATCH_S
        while time.monotonic() < deadline:
            assert agg.connected and agg.stats.reconnects == 0, (
                f"the aggregator lost its connection to a client using its id on {url}\n"
                + tail(broker.log_path, 20)
            )
            time.sleep(0.05)
        impostor.close()
    assert f"Client {client_id} already connected" not in broker.log_path.read_text(
        encoding="utf-8", errors="replace"
    ), tail(broker.log_path, 20)


def test_the_loopback_listener_keeps_the_aggregator_connected(broker: Broker) -> None:
    _assert_not_knocked_off(broker, f"mqtt://{HOST}:{broker.plain_port}")


def test_the_tls_listener_keeps_the_aggregator_connected(broker: Broker) -> None:
    _assert_not_knocked_off(
        broker, f"mqtts://{HOST}:{broker.tls_port}", ca_file=str(broker.tls_dir / "ca.crt")
    )
