"""Transport-level drops are counted and visible in /metrics (issue 13, finding 6): a
ZeroMQ message with the wrong number of frames or a topic that is not UTF-8, and an MQTT
message whose topic is not UTF-8, are dropped before the engine, counted by reason in the
transport's ``refused`` and in ``cat_updates_rejected_total{reason}``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
import zmq
from fastapi.testclient import TestClient

from aggregator.localnet import free_port_pair
from aggregator.service.settings import load_settings
from aggregator.web.app import create_app
from edge_agent.protocol import topics
from edge_agent.transports import open_transport

JOB = "drops"


def _metric(text: str, reason: str) -> float:
    line = f'cat_updates_rejected_total{{reason="{reason}"}}'
    return float(next(r for r in text.splitlines() if r.startswith(line)).split()[-1])


def _until(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.integration
@pytest.mark.security
def test_zmq_wrong_frame_counts_and_non_utf8_topics_are_counted_in_metrics(
    tmp_path: Path,
) -> None:
    port = free_port_pair()
    settings = load_settings(
        job=JOB, d=8, transports=[f"zmq+tcp://127.0.0.1:{port}"], data_dir=tmp_path / "d"
    )
    with TestClient(create_app(settings)) as client:
        before = client.get("/metrics").text
        assert _metric(before, "wrong_frame_count") == 0  # shown from zero
        assert _metric(before, "topic_not_utf8") == 0
        ctx: zmq.Context[Any] = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.linger = 1000
        try:
            push.connect(f"tcp://127.0.0.1:{port}")
            topic = topics.status(JOB, "a1").encode()
            push.send_multipart([topic])  # one frame
            push.send_multipart([topic, b"{}", b"extra"])  # three frames
            push.send_multipart([b"cat/drops/status/\xff\xfe", b"{}"])  # not UTF-8
        finally:
            push.close()
            ctx.term()

        def counted() -> bool:
            text = client.get("/metrics").text
            return _metric(text, "wrong_frame_count") == 2 and _metric(text, "topic_not_utf8") == 1

        _until(counted, "the three drops in /metrics")


@pytest.mark.security
def test_mqtt_non_utf8_topic_is_dropped_and_counted() -> None:
    t = open_transport("mqtt://127.0.0.1:1", role="aggregator", client_id="agg")  # never connects
    msg = paho.MQTTMessage(topic=b"cat/drops/status/\xff")
    msg.payload = b"{}"
    t._on_message(t._client, None, msg)  # type: ignore[attr-defined]
    assert t.refused == {"topic_not_utf8": 1}  # type: ignore[attr-defined]
    assert t.stats.dropped == 1 and t.recv(0.05) is None
    t.close()
