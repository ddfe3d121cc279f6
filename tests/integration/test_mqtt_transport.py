"""MQTT transport against a real Mosquitto (fixture ``mosquitto`` in tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aggregator.localnet import MissingProgram, MosquittoBroker, find_program, free_port
from edge_agent.errors import TransportConfigError, TransportError
from edge_agent.protocol import topics
from edge_agent.transports import Message, Transport, open_transport

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
JOB = "job1"


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    before = {t.ident for t in threading.enumerate()}
    yield
    leaked = [
        t.name
        for t in threading.enumerate()
        if t.ident not in before and t.name.startswith("paho-mqtt-client")
    ]
    assert leaked == [], f"paho network threads left running after close(): {leaked}"


def _open(url: str, role: str, client_id: str, **options: object) -> Transport:
    return open_transport(url, role=role, client_id=client_id, timeout_s=5, **options)  # type: ignore[arg-type]


def _recv_all(t: Transport, n: int, timeout_s: float) -> list[Message]:
    deadline = time.monotonic() + timeout_s
    out: list[Message] = []
    while len(out) < n and (left := deadline - time.monotonic()) > 0:
        if (m := t.recv(left)) is not None:
            out.append(m)
    return out


def test_publish_subscribe_round_trip(mosquitto: MosquittoBroker) -> None:
    with (
        _open(mosquitto.url, "aggregator", "agg") as agg,
        _open(mosquitto.url, "agent", "a1") as agent,
    ):
        for pattern in topics.agent_inbound(JOB):
            agg.subscribe(pattern)
        agent.subscribe(topics.delta(JOB))
        agent.publish(topics.update(JOB, "a1"), b"\x00\x01update")
        assert agg.recv(5.0) == Message("cat/job1/update/a1", b"\x00\x01update")
        agg.publish(topics.delta(JOB), b"delta")
        assert agent.recv(5.0) == Message("cat/job1/delta", b"delta")
        assert agg.connected and agent.connected


def test_retained_model_reaches_late_subscriber(mosquitto: MosquittoBroker) -> None:
    with _open(mosquitto.url, "aggregator", "agg") as agg:
        agg.publish(topics.model(JOB), b"snapshot-v3", retain=True)
    with _open(mosquitto.url, "agent", "late", clean_session=True) as agent:
        agent.subscribe(topics.model(JOB))
        assert agent.recv(5.0) == Message("cat/job1/model", b"snapshot-v3")


_KILLED_CLIENT = textwrap.dedent(
    """
    import sys, time
    from edge_agent.protocol import topics
    from edge_agent.transports import open_transport
    t = open_transport(sys.argv[1], role="agent", client_id="doomed", timeout_s=5)
    t.set_will(topics.status("job1", "doomed"), b'{"state": "offline"}')
    t.connect()
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_last_will_is_published_when_a_client_dies(mosquitto: MosquittoBroker) -> None:
    with _open(mosquitto.url, "aggregator", "agg") as agg:
        agg.subscribe("cat/job1/status/+")
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        proc = subprocess.Popen(
            [sys.executable, "-c", _KILLED_CLIENT, mosquitto.url],
            stdout=subprocess.PIPE,
            env=env,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == b"ready"
            assert agg.recv(0.2) is None  # no will while it is alive
            proc.kill()  # no DISCONNECT packet: the broker must send the will
        finally:
            proc.kill()
            proc.wait(5)
            if proc.stdout is not None:
                proc.stdout.close()
        assert agg.recv(5.0) == Message("cat/job1/status/doomed", b'{"state": "offline"}')


def test_clean_close_does_not_publish_the_will(mosquitto: MosquittoBroker) -> None:
    with _open(mosquitto.url, "aggregator", "agg") as agg:
        agg.subscribe("cat/job1/status/+")
        agent = _open(mosquitto.url, "agent", "polite")
        agent.set_will(topics.status(JOB, "polite"), b'{"state": "offline"}')
        with agent:
            pass
        assert agg.recv(0.5) is None


@pytest.mark.slow
def test_broker_restart_loses_no_qos1_message(mosquitto: MosquittoBroker) -> None:
    """An agent publishes every 20 ms while the broker goes down for ~1.5 s and comes back on
    the same port; the aggregator (persistent session) ends up with every message."""
    n = 150
    topic = topics.update(JOB, "a1")
    with (
        _open(mosquitto.url, "aggregator", "agg-restart") as agg,
        _open(mosquitto.url, "agent", "a1-restart") as agent,
    ):
        agg.subscribe("cat/job1/update/+")
        for i in range(n):
            if i == 40:
                mosquitto.stop()
            if i == 115:
                mosquitto.start()
            agent.publish(topic, i.to_bytes(4, "big"))  # must not raise while offline
            time.sleep(0.02)
        got = _recv_all(agg, n, timeout_s=25.0)
        seen = {int.from_bytes(m.payload, "big") for m in got}
        missing = sorted(set(range(n)) - seen)
        while missing and (m := agg.recv(2.0)) is not None:  # at-least-once: duplicates ok
            seen.add(int.from_bytes(m.payload, "big"))
            missing = sorted(set(range(n)) - seen)
        assert missing == [], f"lost {len(missing)} messages; broker log:\n{mosquitto.log_tail()}"
        assert agent.stats.reconnects >= 1 and agg.stats.reconnects >= 1
        assert agent.connected


def test_persistent_session_queues_messages_while_subscriber_is_away(
    mosquitto: MosquittoBroker,
) -> None:
    with _open(mosquitto.url, "aggregator", "agg-persist") as agg:
        agg.subscribe("cat/job1/update/+")
    with _open(mosquitto.url, "agent", "a1") as agent:
        agent.publish(topics.update(JOB, "a1"), b"while-away")
    with _open(mosquitto.url, "aggregator", "agg-persist") as agg:
        assert agg.recv(5.0) == Message("cat/job1/update/a1", b"while-away")


def test_publish_before_connect_is_sent_after_connect(mosquitto: MosquittoBroker) -> None:
    with _open(mosquitto.url, "aggregator", "agg") as agg:
        agg.subscribe("cat/job1/hello/+")
        agent = _open(mosquitto.url, "agent", "early")
        agent.publish(topics.hello(JOB, "early"), b"hi")
        with agent:
            assert agg.recv(5.0) == Message("cat/job1/hello/early", b"hi")


def test_wrong_port_fails_fast_naming_the_url() -> None:
    url = f"mqtt://127.0.0.1:{free_port()}"
    transport = open_transport(url, role="agent", client_id="a1", timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(TransportError, match="cannot connect") as info:
        transport.connect()
    assert time.monotonic() - started < 5.0
    assert url in str(info.value)
    transport.close()


@pytest.fixture
def auth_broker(tmp_path: Path) -> MosquittoBroker:
    workdir = tmp_path / "auth"
    workdir.mkdir()
    passwd = workdir / "passwd"
    try:
        mosquitto_passwd = find_program("mosquitto_passwd")
        broker = MosquittoBroker(workdir, password_file=passwd, options={"log_type": "all"})
    except MissingProgram as exc:
        pytest.skip(f"{exc} (to test authentication)")
    subprocess.run([mosquitto_passwd, "-b", "-c", str(passwd), "edge", "s3cret"], check=True)
    passwd.chmod(0o600)
    return broker


def test_username_and_password_file_authenticate(
    auth_broker: MosquittoBroker, tmp_path: Path
) -> None:
    auth_broker.start()
    try:
        secret = tmp_path / "mqtt-password"
        secret.write_text("s3cret\n")
        with _open(auth_broker.url, "agent", "a1", username="edge", password_file=str(secret)) as t:
            t.subscribe(topics.model(JOB))
            t.publish(topics.model(JOB), b"ok")
            assert t.recv(5.0) == Message("cat/job1/model", b"ok")
    finally:
        auth_broker.stop()


def test_wrong_password_is_refused_with_a_fix(auth_broker: MosquittoBroker) -> None:
    auth_broker.start()
    try:
        url = f"mqtt://edge:wrong@127.0.0.1:{auth_broker.port}"
        transport = _open(url, "agent", "a1")
        with pytest.raises(TransportConfigError, match=r"refused.*username.*password") as info:
            transport.connect()
        assert "wrong" not in str(info.value)  # the password is redacted
        assert info.value.options == ("username", "password")  # for the CLIs to name
        transport.close()
    finally:
        auth_broker.stop()
