"""Issue 20 with real processes: a real ``uvicorn aggregator.app:app`` on 127.0.0.1 and raw
ZeroMQ clients (no CURVE: anyone who reaches the port). Invented ids no longer lock a real
agent out for good (they expire, also across a restart), requests from ids that never said
hello get nothing, and a frame above the ZeroMQ cap is counted in /metrics and /status."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from e2e_helpers import AggregatorProcess, wait_until

from aggregator.localnet import HOST, free_port_pair
from edge_agent.numerics.compressors import Update
from edge_agent.protocol import messages, topics, wire

pytestmark = [pytest.mark.integration, pytest.mark.security, pytest.mark.slow]

JOB = "trust"
D = 16
TTL_S = 8  # AGG_UNPROVEN_TTL_S


def _settings(tmp_path: Path, port: int, **more: object) -> dict[str, str]:
    env = {
        "AGG_JOB": JOB,
        "AGG_D": str(D),
        "AGG_TRANSPORTS": f"zmq+tcp://{HOST}:{port}",
        "AGG_DATA_DIR": str(tmp_path / "agg"),
        "AGG_DOWNLINK_PACING": "false",
        "AGG_FEEDBACK": "none",
        "AGG_STEP_SIZE": "0.1",
    }
    env.update({f"AGG_{k.upper()}": str(v) for k, v in more.items()})
    return env


@contextmanager
def _push(port: int) -> Iterator[zmq.Socket[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.linger = 2000
    sock.connect(f"tcp://{HOST}:{port}")
    try:
        yield sock
    finally:
        sock.close()
        ctx.term()


def _hello(agent: str) -> list[bytes]:
    msg = messages.Hello(job=JOB, agent=agent, d=D, rows=10, smoothness=2.0, model="logreg",
                         compressor="dense", semantics="plain")  # fmt: skip
    return [topics.hello(JOB, agent).encode(), messages.dump(msg)]


def _update(agent: str, round: int) -> list[bytes]:
    u = Update("dense", D, None, np.full(D, 0.01))
    return [topics.update(JOB, agent).encode(),
            wire.encode(u, job=JOB, agent=agent, round=round, seq=0)]  # fmt: skip


def _rejected(agg: AggregatorProcess, reason: str) -> float:
    return agg.metrics().get(f'cat_updates_rejected_total{{reason="{reason}"}}', 0.0)


def test_invented_ids_expire_and_a_real_agent_joins_also_after_a_restart(tmp_path: Path) -> None:
    port = free_port_pair()
    agg = AggregatorProcess(tmp_path, _settings(tmp_path, port, max_agents=20,
                                                unproven_ttl_s=TTL_S, liveness_timeout_s=60))  # fmt: skip
    try:
        agg.start()
        with _push(port) as push:
            for i in range(20):
                push.send_multipart(_hello(f"fake-{i:03d}"))
            wait_until(lambda: agg.status()["agents"] == 20, 10, "20 invented ids")
            push.send_multipart(_hello("real"))
            wait_until(lambda: _rejected(agg, "too_many_agents") >= 1, 10, "the lock-out")
        hello_at = time.monotonic()
        agg.stop()  # a restart inside the term: the ids come back from the checkpoint
        agg.start()
        assert agg.status()["agents"] == 20 or time.monotonic() - hello_at > TTL_S
        with _push(port) as push:
            wait_until(lambda: agg.status()["agents"] == 0, 2 * TTL_S, "the ids to expire")
            assert time.monotonic() - hello_at > TTL_S - 1  # not before their term
            push.send_multipart(_hello("real"))
            wait_until(lambda: agg.status()["agents"] == 1, 10, "the real agent's hello")
            push.send_multipart(_update("real", 0))
            wait_until(lambda: agg.status()["model_version"] >= 1, 10, "its update accepted")
        assert [a["agent"] for a in agg.get("/agents")] == ["real"]
        time.sleep(TTL_S)  # beyond the term: an agent with an accepted update stays
        assert [a["agent"] for a in agg.get("/agents")] == ["real"]
    finally:
        agg.close()


def test_requests_from_ids_without_a_hello_publish_nothing_and_are_counted(
    tmp_path: Path,
) -> None:
    port = free_port_pair()
    agg = AggregatorProcess(tmp_path, _settings(tmp_path, port))
    ctx: zmq.Context[Any] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.linger = 0
    try:
        agg.start()
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://{HOST}:{port + 1}")
        before = agg.metrics()
        request = messages.dump(messages.Request())
        with _push(port) as push:
            for i in range(400):
                push.send_multipart([topics.request(JOB, f"fake-{i:04d}").encode(), request])
            wait_until(lambda: _rejected(agg, "unknown_agent") >= 400, 15, "400 refusals")
        after = agg.metrics()
        key = 'cat_published_bytes_total{kind="snapshot"}'
        assert after.get(key, 0.0) == before.get(key, 0.0)  # no snapshot went out
        heard = 0
        while sub.poll(200):
            heard += len(sub.recv_multipart()[-1])
        assert heard == 0, f"{heard} bytes published to invented ids"
        assert agg.status()["updates_rejected"]["unknown_agent"] == 400
    finally:
        sub.close()
        ctx.term()
        agg.close()


def test_a_frame_above_the_zmq_cap_is_counted_in_metrics_and_status(tmp_path: Path) -> None:
    port = free_port_pair()
    cap = 1 << 20
    agg = AggregatorProcess(tmp_path, _settings(tmp_path, port, zmq_max_message_bytes=cap))
    try:
        agg.start()
        assert _rejected(agg, "peer_disconnected") == 0  # shown from zero
        with _push(port) as push:
            push.send_multipart([topics.update(JOB, "big").encode(), b"\0" * (2 * cap)])
            wait_until(lambda: _rejected(agg, "peer_disconnected") >= 1, 10, "the count")
        assert agg.status()["transport_refused"]["peer_disconnected"] >= 1
        assert agg.status()["updates_rejected"] == {}  # the engine never saw it
    finally:
        agg.close()


def test_one_agent_cannot_make_async_versions_alone_nor_robust_rounds_of_two(
    tmp_path: Path,
) -> None:
    port = free_port_pair()
    agg = AggregatorProcess(tmp_path, _settings(tmp_path, port, mode="async",
                                                async_apply_every=2,
                                                aggregation="clipped_mean"))  # fmt: skip
    try:
        agg.start()
        with _push(port) as push:
            push.send_multipart(_hello("evil"))
            wait_until(lambda: agg.status()["agents"] == 1, 10, "the hello")
            for seq in range(12):
                topic, blob = _update("evil", 0)
                u = wire.decode(blob)[1]
                push.send_multipart([topic, wire.encode(u, job=JOB, agent="evil", round=0,
                                                        seq=seq)])  # fmt: skip
            wait_until(lambda: _rejected(agg, "one_per_version") >= 11, 10, "11 refusals")
            status = agg.status()
            assert status["model_version"] == 0 and status["updates_accepted"] == 1
            # a second agent: two rows cannot outvote one hostile under clipped_mean
            push.send_multipart(_hello("honest"))
            wait_until(lambda: agg.status()["agents"] == 2, 10, "the second hello")
            push.send_multipart(_update("honest", 0))
            wait_until(lambda: agg.status()["updates_accepted"] == 2, 10, "its update")
        status = agg.status()
        assert status["model_version"] == 0
        assert status["robust_wait"] == (
            "clipped_mean needs 3 contributions from distinct agents (tolerating f hostile "
            "needs a median of 2f+1 norms, f = 1); the round has 2"
        )
        assert "the round waits: clipped_mean needs 3" in agg.log_tail(200)
    finally:
        agg.close()
