"""`edge-agent run` as a real process against a real Mosquitto broker and real ZeroMQ sockets.

A test peer plays the aggregator: it publishes a snapshot, steps the model on every update
and broadcasts deltas. Bounded waits everywhere; 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from aggregator.localnet import MosquittoBroker, free_port_pair
from edge_agent.data import make_rcv1_like, write_libsvm
from edge_agent.protocol import messages, topics, wire
from edge_agent.transports import Transport, open_transport

pytestmark = pytest.mark.integration

JOB = "itest"
D = 400


class Peer:
    """The aggregator's part of the protocol, enough to drive one agent."""

    def __init__(self, transport: Transport) -> None:
        self.t = transport
        self.x = np.zeros(D)
        self.version = 0
        self.seen: list[tuple[int, int]] = []  # (round, seq) of every distinct update
        self.hellos = 0
        self.statuses: list[str] = []
        self.lock = threading.Lock()
        self.stepping = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self.t.connect()
        for pattern in topics.agent_inbound(JOB):
            self.t.subscribe(pattern)
        self.publish_snapshot()
        self._thread.start()

    def publish_snapshot(self) -> None:
        self.t.publish(
            topics.model(JOB),
            wire.encode_snapshot(self.x, job=JOB, version=self.version),
            retain=True,
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.t.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            m = self.t.recv(timeout_s=0.05)
            if m is None:
                continue
            kind = topics.parse(m.topic).kind
            with self.lock:
                if kind == "hello":
                    self.hellos += 1
                elif kind == "status":
                    self.statuses.append(messages.parse(messages.Status, m.payload).state)
                elif kind == "request":
                    self.publish_snapshot()
                elif kind == "update":
                    header, u = wire.decode(m.payload)
                    key = (header.round, header.seq)
                    if key in self.seen:
                        continue  # QoS 1 / re-sends may deliver twice
                    self.seen.append(key)
                    if self.stepping and header.round == self.version:
                        new = self.x.copy()
                        u.add_to(new, -1.0)
                        idx = np.flatnonzero(new != self.x)
                        blob = wire.encode_delta(
                            idx,
                            new[idx],
                            job=JOB,
                            base_version=self.version,
                            version=self.version + 1,
                            d=D,
                        )
                        self.x, self.version = new, self.version + 1
                        self.t.publish(topics.delta(JOB), blob)
                        self.t.publish(
                            topics.model(JOB),
                            wire.encode_snapshot(self.x, job=JOB, version=self.version),
                            retain=True,
                        )

    def stop_agents(self) -> None:
        self.t.publish(topics.control(JOB), messages.dump(messages.Control(cmd="stop")))


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture
def shard_file(tmp_path: Path) -> Path:
    ds = make_rcv1_like(150, D, rng=np.random.default_rng(1), nnz_per_row=15)
    path = tmp_path / "shard.svm"
    write_libsvm(ds, path)
    return path


def start_agent(server: str, shard: Path, tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        "-m",
        "edge_agent.cli",
        "run",
        "--server",
        server,
        "--job",
        JOB,
        "--agent-id",
        "pi-01",
        "--profile",
        "lorawan_eu868_dr5_sf7",
        "--duty-cycle",
        "ignore",
        "--data",
        str(shard),
        "--features",
        str(D),
        "--resend-s",
        "2",
        "--save-model",
        str(tmp_path / "agent_model.npy"),
        *extra,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(
    proc: subprocess.Popen[str], timeout_s: float = 20
) -> tuple[int, dict[str, object], str]:
    out, err = proc.communicate(timeout=timeout_s)
    summary = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    return proc.returncode, summary, err


@pytest.fixture
def zmq_peer() -> Iterator[tuple[str, Peer]]:
    url = f"zmq+tcp://127.0.0.1:{free_port_pair()}"
    peer = Peer(open_transport(url, role="aggregator", client_id="peer"))
    peer.start()
    yield url, peer
    peer.close()


@pytest.fixture
def mqtt_peer(mosquitto: MosquittoBroker) -> Iterator[tuple[str, Peer]]:
    peer = Peer(open_transport(mosquitto.url, role="aggregator", client_id="peer"))
    peer.start()
    yield mosquitto.url, peer
    peer.close()


@pytest.mark.parametrize("peer_fixture", ["zmq_peer", "mqtt_peer"])
def test_agent_joins_trains_and_stops_on_command(
    peer_fixture: str, request: pytest.FixtureRequest, shard_file: Path, tmp_path: Path
) -> None:
    url, peer = request.getfixturevalue(peer_fixture)
    proc = start_agent(url, shard_file, tmp_path)
    try:
        wait_until(lambda: peer.version >= 15, 60, "15 model versions")
        with peer.lock:
            peer.stepping = False
            last = peer.version
        # the agent answers the last version only once it has applied its delta
        wait_until(
            lambda: any(r == last for r, _ in peer.seen), 30, "the answer to the last version"
        )
        peer.stop_agents()
        code, summary, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err
    assert summary["finished"] is True
    assert peer.hellos >= 1
    # The goodbye was published just before the transport closed: it must not be lost.
    wait_until(lambda: "done" in peer.statuses, 5, "the agent's done status")
    rounds = sorted(r for r, _ in peer.seen)
    assert rounds[: peer.version] == list(range(peer.version))
    final = np.load(tmp_path / "agent_model.npy")
    with peer.lock:
        assert np.array_equal(final, peer.x)  # bit-identical copy
    assert "round" in err and "airtime=" in err  # one log line per round


def test_sigterm_stops_the_agent_cleanly(
    zmq_peer: tuple[str, Peer], shard_file: Path, tmp_path: Path
) -> None:
    url, peer = zmq_peer
    proc = start_agent(url, shard_file, tmp_path)
    try:
        wait_until(lambda: peer.version >= 3, 60, "3 versions")
        proc.send_signal(signal.SIGTERM)
        code, summary, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 143, err  # 128 + SIGTERM: a stop, not "done"
    assert summary["finished"] is False and int(summary["updates"]) >= 3  # type: ignore[call-overload]
    assert "signal SIGTERM: stopping" in err
    wait_until(lambda: "offline" in peer.statuses, 10, "the agent's goodbye status")


def test_max_rounds_ends_the_run_with_a_done_status(
    zmq_peer: tuple[str, Peer], shard_file: Path, tmp_path: Path
) -> None:
    url, peer = zmq_peer
    proc = start_agent(url, shard_file, tmp_path, "--max-rounds", "4")
    try:
        code, summary, err = finish(proc)  # exits on its own once its 4th update is applied
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err
    assert summary["finished"] is True and summary["rounds"] == 4
    wait_until(lambda: "done" in peer.statuses, 5, "the agent's done status")
    assert "offline" not in peer.statuses


def test_agent_survives_a_broker_restart_without_losing_an_update(
    mosquitto: MosquittoBroker, shard_file: Path, tmp_path: Path
) -> None:
    peer = Peer(open_transport(mosquitto.url, role="aggregator", client_id="peer"))
    peer.start()
    proc = start_agent(mosquitto.url, shard_file, tmp_path, "--resend-s", "0")
    try:
        wait_until(lambda: peer.version >= 5, 60, "5 versions before the restart")
        mosquitto.stop()  # agent and peer lose the broker mid-run
        time.sleep(1.5)
        mosquitto.start()
        target = peer.version + 10
        wait_until(lambda: peer.version >= target, 90, "10 more versions after the restart")
        peer.stop_agents()
        code, summary, err = finish(proc, timeout_s=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        peer.close()
    assert code == 0, err
    # Every version the peer published was answered exactly once, in order: nothing lost.
    rounds = [r for r, _ in peer.seen]
    assert sorted(rounds)[: peer.version] == list(range(peer.version))
    assert summary["finished"] is True


def test_bad_arguments_get_a_clear_error(tmp_path: Path, shard_file: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edge_agent.cli",
            "run",
            "--profile",
            "no_such_link",
            "--data",
            str(shard_file),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2  # configuration errors exit 2 (systemd does not restart)
    assert (
        "no_such_link" in proc.stderr and "lorawan_eu868_dr5_sf7" in proc.stderr
    )  # lists valid names
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edge_agent.cli",
            "run",
            "--profile",
            "lorawan_eu868_dr5_sf7",
            "--data",
            str(tmp_path / "missing.svm"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "missing.svm" in proc.stderr
