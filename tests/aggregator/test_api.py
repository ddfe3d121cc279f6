"""The HTTP API against a real app (lifespan, ingest thread) over a memory:// transport."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from aggregator.engine.accounting import dense_down_size
from aggregator.service.ingest import AggregatorService
from aggregator.service.settings import Settings
from aggregator.web.app import create_app
from edge_agent.agent.replica import Replica
from edge_agent.numerics.compressors import compress
from edge_agent.protocol import messages, topics, wire
from edge_agent.protocol.downlink import decode_downlink
from edge_agent.transports import Transport, open_transport

JOB = "apijob"
D = 32
TOKEN = "test-token-0123456789abcdef"


def make_settings(memory_url: str, data_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "job": JOB,
        "d": D,
        "step_size": 0.5,
        "transports": [memory_url],
        "data_dir": data_dir,
        "api_token": TOKEN,
        "tick_s": 0.02,
        "downlink_pacing": False,  # real time: LoRaWAN's daily downlink cap is tested apart
        "feedback": "any",  # plain agents: the first hello fixes the family
    }
    values.update(overrides)
    return Settings(**values)


class FakeAgents:
    """Two agents sharing one memory:// client: hello, send updates, wait for deltas."""

    def __init__(self, transport: Transport) -> None:
        self.t = transport
        self.sizes: list[int] = []

    def hello(self, agent: str) -> None:
        msg = messages.Hello(
            job=JOB, agent=agent, d=D, rows=10, smoothness=2.0, model="logreg",
            compressor="topk", profile="paper_packet_model",
        )  # fmt: skip
        self.t.publish(topics.hello(JOB, agent), messages.dump(msg))

    def update(self, agent: str, seed: int, *, round: int = 0, seq: int = 0) -> None:
        g = np.random.default_rng(seed).normal(size=D)
        blob = wire.encode(compress(g, "topk", 4), job=JOB, agent=agent, round=round, seq=seq)
        self.sizes.append(len(blob))
        self.t.publish(topics.update(JOB, agent), blob)

    def wait_for(self, topic: str) -> bytes:
        for _ in range(100):  # bounded: each recv waits at most 0.1 s
            msg = self.t.recv(timeout_s=0.1)
            if msg is not None and msg.topic == topic:
                return msg.payload
        raise AssertionError(f"nothing on {topic}")


@pytest.fixture
def running(memory_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, FakeAgents]]:
    app = create_app(make_settings(memory_url, tmp_path / "data"))
    with TestClient(app) as client:
        t = open_transport(memory_url, role="agent", client_id="fake-agents")
        t.connect()
        t.subscribe(topics.delta(JOB))
        agents = FakeAgents(t)
        try:
            yield client, agents
        finally:
            t.close()


def one_round(agents: FakeAgents) -> bytes:
    agents.hello("a")
    agents.hello("b")
    agents.update("a", 1)
    agents.update("b", 2)
    return agents.wait_for(topics.delta(JOB))


def service_of(client: TestClient) -> AggregatorService:
    svc = client.app.state.service  # type: ignore[attr-defined]
    assert isinstance(svc, AggregatorService)
    return svc


def test_status_reports_round_and_totals(running: tuple[TestClient, FakeAgents]) -> None:
    client, agents = running
    one_round(agents)
    body = client.get("/status").json()
    assert body["job"] == JOB and body["state"] == "running"
    assert body["model_version"] == 1 and body["agents"] == 2 and body["live_agents"] == 2
    assert body["totals"]["bytes"] == sum(agents.sizes)
    assert body["totals"]["packets"] >= 2
    assert body["dense_equivalent"]["bytes"] > body["totals"]["bytes"]


COST_KEYS = ("bytes", "bits", "packets", "airtime_s", "energy_j")


def assert_sum(total: dict[str, Any], up: dict[str, Any], down: dict[str, Any]) -> None:
    """total == up + down, field by field (the uplink counts messages as ``updates``)."""
    assert total["messages"] == up["updates"] + down["messages"]
    for k in COST_KEYS:
        assert total[k] == pytest.approx(up[k] + down[k]), k


def test_status_counts_both_directions(running: tuple[TestClient, FakeAgents]) -> None:
    client, agents = running
    delta = one_round(agents)
    body = client.get("/status").json()
    down = body["downlink"]
    assert down["messages"] >= 2 and down["bytes"] >= 2 * len(delta)  # the delta, to a and b
    assert down["packets"] >= 2 and down["bits"] > 0  # priced on paper_packet_model
    assert_sum(body["total"], body["totals"], down)
    # the baseline: version 1 as a dense float32 change to each of the two live agents
    dense_down = body["dense_equivalent_downlink"]
    assert dense_down["messages"] == 2
    assert dense_down["bytes"] == 2 * dense_down_size(JOB, D, 1) > 2 * 4 * D
    assert_sum(body["dense_equivalent_total"], body["dense_equivalent"], dense_down)


def test_agents_count_both_directions(running: tuple[TestClient, FakeAgents]) -> None:
    client, agents = running
    one_round(agents)
    listed = client.get("/agents").json()
    status = client.get("/status").json()
    for a in listed:
        assert a["downlink"]["bytes"] > 0
        assert_sum(a["total"], a["totals"], a["downlink"])
        assert a["dense_equivalent_downlink"]["bytes"] == dense_down_size(JOB, D, 1)
        assert_sum(
            a["dense_equivalent_total"], a["dense_equivalent"], a["dense_equivalent_downlink"]
        )
    for k in ("messages", *COST_KEYS):  # both agents were live for everything published
        assert sum(a["downlink"][k] for a in listed) == pytest.approx(status["downlink"][k])


def test_agents_lists_every_agent(running: tuple[TestClient, FakeAgents]) -> None:
    client, agents = running
    one_round(agents)
    listed = client.get("/agents").json()
    assert sorted(a["agent"] for a in listed) == ["a", "b"]
    assert client.get("/agents/a").json()["updates_accepted"] == 1


def test_unknown_agent_is_404(running: tuple[TestClient, FakeAgents]) -> None:
    client, _ = running
    assert client.get("/agents/nobody").status_code == 404


def test_history_since(running: tuple[TestClient, FakeAgents]) -> None:
    client, agents = running
    one_round(agents)
    rounds = client.get("/history", params={"since": 0}).json()["rounds"]
    assert [r["version"] for r in rounds] == [1]
    assert rounds[0]["participants"] == ["a", "b"]
    assert client.get("/history", params={"since": 1}).json()["rounds"] == []


def test_model_npy_equals_engine_model(running: tuple[TestClient, FakeAgents]) -> None:
    client, agents = running
    one_round(agents)
    resp = client.get("/model")
    x = np.load(io.BytesIO(resp.content), allow_pickle=False)
    version, expected = service_of(client).read(lambda e: (e.version, e.x.copy()))
    assert resp.headers["content-type"] == "application/octet-stream"
    assert resp.headers["x-model-version"] == str(version) == "1"
    assert x.tobytes() == expected.tobytes()


def test_delta_broadcast_matches_served_model(running: tuple[TestClient, FakeAgents]) -> None:
    client, agents = running
    steps = decode_downlink(one_round(agents))
    replica = Replica(D, "mean")
    assert replica.apply(wire.Snapshot("x", 0, np.zeros(D))) is None
    assert replica.apply(steps) is None
    served = np.load(io.BytesIO(client.get("/model").content))
    assert replica.x is not None and replica.x.tobytes() == served.tobytes()


def test_metrics_exposes_metric_names(running: tuple[TestClient, FakeAgents]) -> None:
    client, agents = running
    one_round(agents)
    text = client.get("/metrics").text
    for name in (
        "cat_rounds_total 1.0",
        "cat_updates_accepted_total 2.0",
        'cat_updates_rejected_total{reason="malformed"}',
        "cat_update_bytes_total",
        "cat_packets_total",
        "cat_airtime_seconds_total",
        "cat_energy_joules_total",
        "cat_dense_equivalent_bytes_total",
        "cat_downlink_messages_total",
        "cat_downlink_bytes_total",
        "cat_downlink_packets_total",
        "cat_downlink_airtime_seconds_total",
        "cat_downlink_energy_joules_total",
        "cat_round_latency_seconds_bucket",
        "cat_update_entries_bucket",
        "cat_model_version 1.0",
        "cat_up 1.0",
    ):
        assert name in text, name
    down = client.get("/status").json()["downlink"]
    assert f"cat_downlink_bytes_total {float(down['bytes'])}" in text
    assert f"cat_downlink_messages_total {float(down['messages'])}" in text


def test_metrics_registry_is_private_per_app(memory_url: str, tmp_path: Path) -> None:
    first, second = create_app(), create_app()
    assert first.state.metrics.registry is not second.state.metrics.registry


def test_healthz_ok(running: tuple[TestClient, FakeAgents]) -> None:
    client, _ = running
    body = client.get("/healthz").json()
    assert (body["status"], body["detail"]) == ("ok", "")
    assert [t["connected"] for t in body["transports"]] == [True]


def test_control_without_token_is_401(running: tuple[TestClient, FakeAgents]) -> None:
    client, _ = running
    resp = client.post("/control/pause")
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"] == "Bearer"


def test_control_with_wrong_token_is_401(running: tuple[TestClient, FakeAgents]) -> None:
    client, _ = running
    resp = client.post("/control/stop", headers={"Authorization": "Bearer wrong-token-wrong-token"})
    assert resp.status_code == 401


def test_control_with_token_pauses_and_tells_agents(running: tuple[TestClient, FakeAgents]) -> None:
    client, agents = running
    agents.t.subscribe(topics.control(JOB))
    resp = client.post("/control/pause", headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status_code == 200
    assert resp.json()["state"] == "paused" and resp.json()["applied"] is True
    ctl = messages.parse(messages.Control, agents.wait_for(topics.control(JOB)))
    assert ctl.cmd == "pause"


def test_control_without_configured_token_is_503(memory_url: str, tmp_path: Path) -> None:
    app = create_app(make_settings(memory_url, tmp_path / "data", api_token=None))
    with TestClient(app) as client:
        resp = client.post("/control/stop", headers={"Authorization": "Bearer anything-at-all-123"})
    assert resp.status_code == 503


def test_index_serves_a_page(running: tuple[TestClient, FakeAgents]) -> None:
    client, _ = running
    resp = client.get("/")
    assert resp.status_code == 200 and "/status" in resp.text


@pytest.mark.parametrize("checkpoint_every", [1, 100])
def test_restart_keeps_model_and_history(
    memory_url: str, tmp_path: Path, checkpoint_every: int
) -> None:
    settings = make_settings(memory_url, tmp_path / "data", checkpoint_every=checkpoint_every)
    with TestClient(create_app(settings)):
        t = open_transport(memory_url, role="agent", client_id="fake-agents")
        t.connect()
        t.subscribe(topics.delta(JOB))
        one_round(FakeAgents(t))
        t.close()
    with TestClient(create_app(settings)) as client:
        body = client.get("/status").json()
        assert body["model_version"] == 1  # from the checkpoint, or replayed from the journal
        assert body["recovered_from"] == "checkpoint.npz"
        assert [r["version"] for r in client.get("/history").json()["rounds"]] == [1]
        # the downlink itself is checkpointed; its dense baseline is not, so it is unknown
        assert body["downlink"]["bytes"] > 0
        assert body["dense_equivalent_downlink"] is None
        assert body["dense_equivalent_total"] is None
