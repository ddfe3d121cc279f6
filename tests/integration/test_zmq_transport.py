"""ZeroMQ transport over real TCP sockets on 127.0.0.1 (no broker)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from helpers import free_port_pair

from edge_agent.errors import TransportError
from edge_agent.transports import Message, Transport, open_transport, topics
from edge_agent.transports.zmq import generate_curve_keypair

pytestmark = pytest.mark.integration

JOB = "job1"


@pytest.fixture
def url() -> str:
    return f"zmq+tcp://127.0.0.1:{free_port_pair()}"


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    before = {t.ident for t in threading.enumerate()}
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        leaked = [
            t.name
            for t in threading.enumerate()
            if t.ident not in before and t.name.startswith("zmq-transport")
        ]
        if not leaked:
            return
        time.sleep(0.05)
    pytest.fail(f"threads left running after close(): {leaked}")


def _aggregator(url: str, **options: object) -> Transport:
    t = open_transport(url, role="aggregator", client_id="agg", **options)
    t.connect()
    for pattern in topics.agent_inbound(JOB):
        t.subscribe(pattern)
    return t


def _agent(url: str, name: str = "a1", **options: object) -> Transport:
    t = open_transport(url, role="agent", client_id=name, **options)
    t.connect()
    for pattern in topics.agent_subscriptions(JOB):
        t.subscribe(pattern)
    return t


def _broadcast_until_heard(
    sender: Callable[[], None], receiver: Transport, timeout_s: float = 5.0
) -> Message | None:
    """PUB/SUB drops what is sent before the subscription reaches the publisher (slow
    joiner), so keep sending until something arrives."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sender()
        if (m := receiver.recv(0.05)) is not None:
            return m
    return None


def test_round_trip_both_directions(url: str) -> None:
    with _aggregator(url) as agg, _agent(url) as agent:
        agent.publish(topics.update(JOB, "a1"), b"\x00update")
        assert agg.recv(5.0) == Message("cat/job1/update/a1", b"\x00update")
        heard = _broadcast_until_heard(lambda: agg.publish(topics.delta(JOB), b"d"), agent)
        assert heard == Message("cat/job1/delta", b"d")
        assert agent.connected and agg.connected


def test_filtering_is_exact_beyond_the_zmq_prefix(url: str) -> None:
    with _aggregator(url) as agg, _agent(url) as agent:
        raw = open_transport(url, role="agent", client_id="raw")
        with raw:
            raw.subscribe(topics.model(JOB))
            heard = _broadcast_until_heard(lambda: agg.publish(topics.model(JOB), b"m"), raw)
            assert heard == Message("cat/job1/model", b"m")
            while raw.recv(0.2) is not None:
                pass
            agg.publish("cat/job1/modelx", b"prefix-only")  # same zmq prefix, different topic
            agg.publish(topics.delta(JOB), b"not subscribed")
            agg.publish(topics.model(JOB), b"m2")
            assert raw.recv(2.0) == Message("cat/job1/model", b"m2")
            assert raw.recv(0.2) is None
        agent.publish("cat/job1/update/a1/extra", b"too deep")  # no aggregator pattern matches
        agent.publish("cat/other/update/a1", b"other job")
        agent.publish(topics.hello(JOB, "a1"), b"hi")
        assert agg.recv(2.0) == Message("cat/job1/hello/a1", b"hi")
        assert agg.recv(0.2) is None


def test_publish_with_no_peer_never_blocks_and_counts_drops(url: str) -> None:
    agent = _agent(url, sndhwm=1, send_timeout_s=0.2, linger_ms=100)
    with agent:
        started = time.monotonic()
        for i in range(200):
            agent.publish(topics.update(JOB, "a1"), i.to_bytes(4, "big"))
        assert time.monotonic() - started < 1.0
        deadline = time.monotonic() + 3.0
        while agent.stats.dropped == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent.stats.dropped > 0
        assert not agent.connected


def test_agent_reconnects_after_aggregator_is_rebound(url: str) -> None:
    with _agent(url) as agent:
        with _aggregator(url) as agg:
            agent.publish(topics.hello(JOB, "a1"), b"first")
            assert agg.recv(5.0) == Message("cat/job1/hello/a1", b"first")
        assert _wait(lambda: not agent.connected, 5.0)
        agent.publish(topics.hello(JOB, "a1"), b"while-down")  # queued in the PUSH pipe
        with _aggregator(url) as agg:
            assert agg.recv(5.0) == Message("cat/job1/hello/a1", b"while-down")
            heard = _broadcast_until_heard(lambda: agg.publish(topics.control(JOB), b"c"), agent)
            assert heard == Message("cat/job1/control", b"c")
            assert _wait(lambda: agent.stats.reconnects >= 1, 5.0)


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_second_aggregator_on_same_port_fails_naming_the_port(url: str) -> None:
    with _aggregator(url):
        second = open_transport(url, role="aggregator", client_id="agg2", timeout_s=2)
        with pytest.raises(TransportError, match=r"cannot bind .*another aggregator"):
            second.connect()
        second.close()


def test_malformed_inbound_message_is_counted_and_dropped(url: str) -> None:
    with _aggregator(url) as agg:
        ctx = zmq.Context()
        try:
            push = ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 1000)
            push.connect(url.replace("zmq+tcp", "tcp"))
            push.send_multipart([b"cat/job1/hello/a1", b"x", b"extra frame"])
            push.send_multipart([b"\xff\xfe", b"bad topic"])
            push.send_multipart([b"cat/job1/hello/a1", b"good"])
            assert agg.recv(5.0) == Message("cat/job1/hello/a1", b"good")
            assert agg.stats.dropped == 2
            push.close()
        finally:
            ctx.term()


@pytest.fixture
def curve_keys(tmp_path: Path) -> tuple[Path, Path]:
    if not zmq.has("curve"):
        pytest.skip("libzmq without CURVE")
    return generate_curve_keypair(tmp_path, "server")


def test_curve_client_with_the_server_key_is_heard(url: str, curve_keys: tuple[Path, Path]) -> None:
    public, secret = curve_keys
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
    server_key = public.read_text().strip()
    with (
        _aggregator(url, curve_server_secret_file=str(secret)) as agg,
        _agent(url, curve_server_public_key=server_key) as agent,
    ):
        agent.publish(topics.update(JOB, "a1"), b"encrypted")
        assert agg.recv(5.0) == Message("cat/job1/update/a1", b"encrypted")
        heard = _broadcast_until_heard(lambda: agg.publish(topics.model(JOB), b"m"), agent)
        assert heard == Message("cat/job1/model", b"m")


def test_curve_client_with_a_wrong_key_is_not_heard(
    url: str, curve_keys: tuple[Path, Path], tmp_path: Path
) -> None:
    _, secret = curve_keys
    wrong_public, _ = generate_curve_keypair(tmp_path, "impostor")
    with (
        _aggregator(url, curve_server_secret_file=str(secret)) as agg,
        _agent(url, curve_server_public_key_file=str(wrong_public), linger_ms=100) as agent,
    ):
        agent.publish(topics.update(JOB, "a1"), b"should not arrive")
        assert agg.recv(1.0) is None
        assert not agent.connected


def test_plaintext_client_is_not_heard_by_curve_aggregator(
    url: str, curve_keys: tuple[Path, Path]
) -> None:
    _, secret = curve_keys
    with (
        _aggregator(url, curve_server_secret_file=str(secret)) as agg,
        _agent(url, linger_ms=100) as agent,
    ):
        agent.publish(topics.update(JOB, "a1"), b"plaintext")
        assert agg.recv(1.0) is None


def test_bad_curve_key_file_is_rejected_before_connect(url: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.secret"
    bad.write_text("too-short\n")
    with pytest.raises(TransportError, match="40-character z85"):
        open_transport(url, role="aggregator", client_id="agg", curve_server_secret_file=str(bad))
