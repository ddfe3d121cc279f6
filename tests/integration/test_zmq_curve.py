"""CurveZMQ client authentication and the inbound size cap, on real sockets on 127.0.0.1.

The aggregator admits only the keys in its agents directory, binds each connection to the
agent id of its key file, and refuses frames above its message cap before reading them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from aggregator.localnet import free_port_pair
from aggregator.service.ingest import AggregatorService
from aggregator.service.settings import SettingsError, load_settings
from edge_agent.agent.loop import Agent, AgentConfig
from edge_agent.data.datagen import make_rcv1_like, split_shards
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.models import make_model
from edge_agent.protocol import topics
from edge_agent.transports import Message, Transport, open_transport
from edge_agent.transports.zmq_auth import write_keypair

pytestmark = [pytest.mark.integration, pytest.mark.security]

JOB = "job1"
MiB = 2**20


@pytest.fixture(autouse=True)
def _needs_curve() -> None:
    if not zmq.has("curve"):
        pytest.skip("libzmq without CURVE")


@pytest.fixture
def url() -> str:
    return f"zmq+tcp://127.0.0.1:{free_port_pair()}"


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    """server.key/.secret, a1 and a2 pairs in keys/, and a1.key, a2.key in agents/."""
    folder = tmp_path / "keys"
    write_keypair(folder, "server")
    agents = tmp_path / "agents"
    agents.mkdir()
    for agent in ("a1", "a2"):
        public, _ = write_keypair(folder, agent)
        (agents / public.name).write_bytes(public.read_bytes())
    return folder


def _aggregator(url: str, keys: Path, **options: object) -> Transport:
    t = open_transport(
        url,
        role="aggregator",
        client_id="agg",
        curve_server_secret_file=str(keys / "server.secret"),
        curve_agents_dir=str(keys.parent / "agents"),
        **options,
    )
    t.connect()
    for pattern in topics.agent_inbound(JOB):
        t.subscribe(pattern)
    return t


def _agent(url: str, keys: Path, key_name: str, **options: object) -> Transport:
    t = open_transport(
        url,
        role="agent",
        client_id=f"c-{key_name}",
        curve_server_public_key_file=str(keys / "server.key"),
        curve_client_secret_file=str(keys / f"{key_name}.secret"),
        linger_ms=200,
        **options,
    )
    t.connect()
    for pattern in topics.agent_subscriptions(JOB):
        t.subscribe(pattern)
    return t


def _until(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def _heard(receiver: Transport, send: Callable[[], None], timeout_s: float = 5.0) -> Message | None:
    """Send until something arrives (PUB/SUB slow joiner; PUSH before the handshake)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        send()
        if (m := receiver.recv(0.05)) is not None:
            return m
    return None


# --------------------------------------------------------------------------- transport


def test_allowed_key_is_heard_both_ways(url: str, keys: Path) -> None:
    with _aggregator(url, keys) as agg, _agent(url, keys, "a1") as agent:
        got = _heard(agg, lambda: agent.publish(topics.status(JOB, "a1"), b"up"))
        assert got == Message(topics.status(JOB, "a1"), b"up")
        down = _heard(agent, lambda: agg.publish(topics.control(JOB), b"c"))
        assert down == Message(topics.control(JOB), b"c")
        assert agg.refused == {"unauthenticated": 0, "agent_mismatch": 0, "peer_disconnected": 0}  # type: ignore[attr-defined]  # fmt: skip


def test_a_key_bound_to_one_agent_cannot_send_as_another(url: str, keys: Path) -> None:
    with _aggregator(url, keys) as agg, _agent(url, keys, "a1") as agent:
        # wait for the handshake so that the forged message is really sent and judged
        assert _heard(agg, lambda: agent.publish(topics.status(JOB, "a1"), b"hi")) is not None
        while agg.recv(0.2) is not None:
            pass
        dropped = agg.stats.dropped
        for kind in (topics.hello, topics.update, topics.status, topics.request):
            agent.publish(kind(JOB, "a2"), b"forged")
        agent.publish(topics.model(JOB), b"not an agent topic")
        agent.publish(topics.update(JOB, "a1"), b"genuine")
        got = agg.recv(5.0)
        assert got == Message(topics.update(JOB, "a1"), b"genuine")  # in order: forgeries gone
        assert agg.recv(0.3) is None
        assert agg.refused["agent_mismatch"] == 5  # type: ignore[attr-defined]
        assert agg.stats.dropped == dropped + 5


def test_an_unknown_key_is_neither_heard_nor_served(url: str, keys: Path) -> None:
    write_keypair(keys, "stranger")  # a valid pair, just not in agents/
    with (
        _aggregator(url, keys) as agg,
        _agent(url, keys, "stranger", timeout_s=1) as intruder,
        _agent(url, keys, "a1") as agent,
    ):
        assert _heard(agg, lambda: agent.publish(topics.status(JOB, "a1"), b"ok")) is not None
        for _ in range(50):
            intruder.publish(topics.hello(JOB, "stranger"), b"let me in")
            agg.publish(topics.control(JOB), b"broadcast")
            time.sleep(0.01)
        assert _until(lambda: agg.refused["unauthenticated"] >= 2)  # type: ignore[attr-defined]
        heard = [agg.recv(0.2) for _ in range(3)]
        assert all(m is None or m.topic == topics.status(JOB, "a1") for m in heard), heard
        assert intruder.recv(0.2) is None  # the SUB handshake is refused as well
        assert not intruder.connected


def test_a_key_added_to_the_directory_is_admitted_without_restarting_the_aggregator(
    url: str, keys: Path
) -> None:
    public, _ = write_keypair(keys, "a3")
    with _aggregator(url, keys) as agg:
        with _agent(url, keys, "a3", timeout_s=1) as early:
            assert _until(lambda: agg.refused["unauthenticated"] >= 1)  # type: ignore[attr-defined]
            assert not early.connected
        (keys.parent / "agents" / "a3.key").write_bytes(public.read_bytes())
        # libzmq does not retry a refused key: the agent's next start is admitted
        with _agent(url, keys, "a3") as late:
            got = _heard(agg, lambda: late.publish(topics.status(JOB, "a3"), b"in"))
            assert got == Message(topics.status(JOB, "a3"), b"in")


def _disconnected(monitor: zmq.Socket[Any], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if monitor.poll(50) and recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED:
            return True
    return False


def test_a_frame_above_the_cap_disconnects_the_peer_unread(url: str) -> None:
    """64 MiB against a 1 MiB cap: the peer is dropped, nothing is delivered, and the
    aggregator's memory does not take the frame (libzmq checks the announced size)."""
    port = int(url.rsplit(":", 1)[1])
    with open_transport(url, role="aggregator", client_id="agg", max_message_bytes=MiB) as agg:
        for pattern in topics.agent_inbound(JOB):
            agg.subscribe(pattern)
        ctx: zmq.Context[Any] = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.linger = 0
        monitor = push.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            push.connect(f"tcp://127.0.0.1:{port}")
            rss_before = _rss_kib()
            big = np.zeros(64 * MiB, np.uint8).tobytes()
            push.send_multipart([topics.update(JOB, "a1").encode(), big])
            del big
            assert _disconnected(monitor, 10.0), "the peer was not disconnected"
            assert agg.recv(0.5) is None
            # well below 64 MiB: the sender's own copy is freed and the aggregator read none
            assert _rss_kib() - rss_before < 32 * 1024
            # an honest sender of normal messages is still served
            with open_transport(url, role="agent", client_id="ok", linger_ms=200) as ok:
                small = Message(topics.status(JOB, "a2"), b"x" * 1000)
                assert _heard(agg, lambda: ok.publish(small.topic, small.payload)) == small
        finally:
            push.disable_monitor()
            monitor.close(linger=0)
            push.close(linger=0)
            ctx.term()


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    pytest.skip("no /proc/self/status")


def test_an_agent_refuses_a_broadcast_above_its_cap(url: str) -> None:
    with (
        open_transport(url, role="aggregator", client_id="agg") as agg,
        open_transport(url, role="agent", client_id="a", max_message_bytes=MiB) as agent,
    ):
        for pattern in topics.agent_subscriptions(JOB):
            agent.subscribe(pattern)
        assert _heard(agent, lambda: agg.publish(topics.control(JOB), b"small")) is not None
        while agent.recv(0.1) is not None:
            pass
        agg.publish(topics.model(JOB), b"\0" * (2 * MiB))
        agg.publish(topics.control(JOB), b"after")
        # dropped by libzmq before it is read; the connection goes with it (libzmq treats
        # it as a protocol error and does not reconnect a SUB: docs/operating.md)
        assert agent.recv(1.0) is None


# --------------------------------------------------------------------------- without keys


def test_without_keys_zmq_is_unchanged_and_warns_off_loopback(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="edge_agent.transports.zmq"):
        with (
            open_transport(url, role="aggregator", client_id="agg") as agg,
            open_transport(url, role="agent", client_id="a9", linger_ms=200) as agent,
        ):
            for pattern in topics.agent_inbound(JOB):
                agg.subscribe(pattern)
            # any id, no key: the trusted-network behaviour of before
            got = _heard(agg, lambda: agent.publish(topics.hello(JOB, "anyone"), b"h"))
            assert got == Message(topics.hello(JOB, "anyone"), b"h")
        assert not [r for r in caplog.records if "without CURVE" in r.getMessage()]
        wide = f"zmq+tcp://0.0.0.0:{free_port_pair()}"
        with open_transport(wide, role="aggregator", client_id="agg"):
            pass
    warnings = [r for r in caplog.records if "without CURVE" in r.getMessage()]
    assert len(warnings) == 1 and "trusted networks only" in warnings[0].getMessage()


def test_settings_pass_keys_cap_and_hwm_and_the_url_wins(tmp_path: Path) -> None:
    base = {"d": 1000, "data_dir": tmp_path}
    plain = load_settings(**base)
    opts = plain.transport_options("zmq+tcp://127.0.0.1:5555")
    assert opts == {"max_message_bytes": 16 * 1000 + MiB, "sndhwm": 1000, "rcvhwm": 1000}
    keyed = load_settings(
        **base,
        zmq_secret_key_file=tmp_path / "s.secret",
        zmq_agents_dir=tmp_path / "agents",
        zmq_max_message_bytes=4096,
        zmq_rcvhwm=10,
    )
    opts = keyed.transport_options("zmq+tcp://127.0.0.1:5555?rcvhwm=7")
    assert opts == {
        "max_message_bytes": 4096,
        "sndhwm": 1000,
        "curve_server_secret_file": str(tmp_path / "s.secret"),
        "curve_agents_dir": str(tmp_path / "agents"),
    }
    with pytest.raises(SettingsError, match="AGG_ZMQ_AGENTS_DIR needs AGG_ZMQ_SECRET_KEY_FILE"):
        load_settings(**base, zmq_agents_dir=tmp_path)


# --------------------------------------------------------------------------- the service


@pytest.fixture
def service(url: str, keys: Path, tmp_path: Path) -> Iterator[AggregatorService]:
    settings = load_settings(
        job=JOB,
        d=40,
        transports=[url],
        data_dir=tmp_path / "agg",
        min_agents=2,
        max_rounds=4,
        round_deadline_s=2.0,
        downlink_pacing=False,
        zmq_secret_key_file=keys / "server.secret",
        zmq_agents_dir=keys.parent / "agents",
    )
    svc = AggregatorService(settings)
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


def test_listed_agents_train_while_strangers_and_forgers_never_reach_the_engine(
    service: AggregatorService, url: str, keys: Path
) -> None:
    rng = np.random.default_rng(0)
    shards = split_shards(make_rcv1_like(400, 40, rng=rng, nnz_per_row=8.0), 2, rng=rng)
    profile = resolve_profile("ble5_2m_dle_notify")
    write_keypair(keys, "stranger")
    agents: list[Agent] = []
    for i, (agent_id, shard) in enumerate(zip(("a1", "a2"), shards, strict=True)):
        transport = open_transport(
            url,
            role="agent",
            client_id=f"cat-{JOB}-{agent_id}",
            curve_server_public_key_file=str(keys / "server.key"),
            curve_client_secret_file=str(keys / f"{agent_id}.secret"),
            linger_ms=200,
        )
        config = AgentConfig(
            job=JOB, agent_id=agent_id, feedback="ef21", duty_cycle="ignore", resend_s=1.0, seed=i
        )
        model = make_model("logreg", n_features=40, n_classes=2, l2=1e-3)
        agents.append(Agent(config, model=model, data=shard, profile=profile, transport=transport))
    stranger = _agent(url, keys, "stranger", timeout_s=1)
    forger = _agent(url, keys, "a1")  # a1's own key, speaking for "ghost"
    threads = [threading.Thread(target=_run, args=(a,), daemon=True) for a in agents]
    try:
        for th in threads:
            th.start()
        deadline = time.monotonic() + 30
        while service.read(lambda e: e.state) != "finished" and time.monotonic() < deadline:
            for t, who in ((stranger, "stranger"), (forger, "ghost")):
                t.publish(topics.hello(JOB, who), b"{}")
            time.sleep(0.05)
        state, version, known = service.read(lambda e: (e.state, e.version, set(e.agents)))
        assert state == "finished" and version == 4, (state, version)
        assert known == {"a1", "a2"}  # neither the stranger nor the forged id ever got in
        rejected = service.metrics_snapshot()["rejected"]
        assert rejected["agent_mismatch"] >= 1 and rejected["unauthenticated"] >= 1, rejected
        assert rejected.get("malformed", 0) == 0  # the junk hellos never reached the engine
    finally:
        for a in agents:
            a.stop()
        for th in threads:
            th.join(10)
        for a in agents:
            a.close()
        stranger.close()
        forger.close()


def _run(agent: Agent) -> None:
    agent.start()
    agent.run()
