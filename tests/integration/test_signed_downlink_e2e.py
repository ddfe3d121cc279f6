"""Signed downlinks with real processes: a forged retained job message and a forged stop
do not stop agents that hold the aggregator's public key; they train to the end.

MQTT: a real Mosquitto that anyone may write to (the "account allowed to write
``cat/<job>/job``" case) and a forger client. ZeroMQ: no third party can publish on the
aggregator's PUB socket (agents connect to it alone), so the forger sits where ZeroMQ lets
one: in the middle, a relay the agents connect to, which forwards everything and injects
its own messages. In both the forgery is real: an agent without the key, started after the
job, reads the forged retained settings (MQTT) and exits 2.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import zmq
from e2e_helpers import (
    AggregatorProcess,
    Fleet,
    aggregator_settings,
    make_problem,
    running,
    wait_finished,
    wait_until,
)

from aggregator.localnet import HOST, free_port_pair
from edge_agent.protocol import jobinfo, messages, topics
from edge_agent.protocol.signing import Signer, write_keypair
from edge_agent.transports import open_transport

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = "signed"
ROUNDS = 25
STOP = messages.dump(messages.Control(cmd="stop", version=1))
OTHER_KEY = Signer(bytes(range(3, 35)))


class Relay:
    """A man in the middle for ``zmq+tcp://``: binds the port pair the agents use, forwards
    both ways to the aggregator's, and publishes whatever :meth:`inject` is given."""

    def __init__(self, upstream_port: int) -> None:
        self.port = free_port_pair()
        self._ctx = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.bind(f"tcp://{HOST}:{self.port}")
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.bind(f"tcp://{HOST}:{self.port + 1}")
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.connect(f"tcp://{HOST}:{upstream_port}")
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(f"tcp://{HOST}:{upstream_port + 1}")
        self._injected: list[list[bytes]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def inject(self, topic: str, payload: bytes) -> None:
        with self._lock:
            self._injected.append([topic.encode(), payload])

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        poller.register(self._sub, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(20))
            if self._pull in ready:
                self._push.send_multipart(self._pull.recv_multipart())
            if self._sub in ready:
                self._pub.send_multipart(self._sub.recv_multipart())
            with self._lock:
                injected, self._injected = self._injected, []
            for frames in injected:
                self._pub.send_multipart(frames)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in (self._pull, self._pub, self._push, self._sub):
            sock.close(linger=0)
        self._ctx.term()


def _forged_job(features: int) -> bytes:
    return jobinfo.JobInfo(
        job=JOB, d=features + 1, model="logreg", feedback="none", family="mean",
        compressors=("dense", "topk", "signtopk", "randk"),
    ).dump()  # fmt: skip


@pytest.mark.parametrize("transport", ["mqtt", "zmq"])
def test_forged_job_and_stop_do_not_stop_signed_agents(
    transport: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    problem = make_problem(tmp_path / "data", rows=600, features=200, agents=3)
    public, secret = write_keypair(tmp_path / "keys")
    relay: Relay | None = None
    if transport == "mqtt":
        agg_url = agent_url = str(request.getfixturevalue("mosquitto").url)
    else:
        upstream = free_port_pair()
        agg_url = f"zmq+tcp://{HOST}:{upstream}"
        relay = Relay(upstream)
        agent_url = f"zmq+tcp://{HOST}:{relay.port}"
    settings = aggregator_settings(
        problem, job=JOB, server=agg_url, data_dir=tmp_path / "agg", max_rounds=ROUNDS,
        min_agents=2, signing_key_file=secret, feedback="none",
    )  # fmt: skip
    agg = AggregatorProcess(tmp_path, settings)
    fleet = Fleet(tmp_path)
    forger: Any = None
    forged_job = _forged_job(problem.features)

    def forge(topic: str, payload: bytes, *, retain: bool = False) -> None:
        if relay is not None:
            relay.inject(topic, payload)
        else:
            forger.publish(topic, payload, retain=retain)

    try:
        with running(agg, fleet):
            agg.start()
            if relay is None:
                forger = open_transport(agent_url, role="agent", client_id="forger")
                forger.connect()
            forge(topics.job_info(JOB), forged_job, retain=True)  # replaces the retained one
            key = ["--aggregator-key", str(public)]
            for i in range(2):
                fleet.start_agent(
                    server=agent_url, job=JOB, index=i, shard=problem.shards[i],
                    features=problem.features, feedback="none", resend_s=2, extra=key,
                )  # fmt: skip
            wait_until(
                lambda: agg.status()["round"] >= 3,
                60,
                "three versions",
                diagnose=lambda: agg.diagnose() + fleet.diagnose(),
            )
            control = topics.control(JOB)
            for agent_id in ("agent-0", "agent-1"):
                to = topics.to_agent(JOB, agent_id)
                forge(to, forged_job)
                forge(to, STOP)
            forge(control, STOP)
            forge(control, OTHER_KEY.seal(control, STOP, 2**62))
            forge(topics.job_info(JOB), forged_job, retain=True)
            status = wait_finished(agg, fleet, timeout_s=120)
            fleet.wait(timeout_s=30)
            assert status["round"] == ROUNDS
            for a in fleet.agents:
                summary = a.summary()
                assert a.proc.returncode == 0, a.diagnose()
                assert summary["finished"] and summary["version"] == ROUNDS, summary
                dropped = summary["dropped"]
                assert dropped.get("unsigned", 0) >= 3 and dropped.get("bad_signature") == 1, (
                    summary
                )
            if relay is None:
                # the forgery bites an agent without the key: the retained settings end it
                lone = fleet.start_agent(
                    server=agent_url, job=JOB, index=2, shard=problem.shards[2],
                    features=problem.features, feedback="none", resend_s=2,
                )  # fmt: skip
                assert lone.proc.wait(timeout=60) == 2, lone.diagnose()
    finally:
        if forger is not None:
            forger.close()
        if relay is not None:
            relay.close()
