"""Who is lagging and who is refused (issue 12, finding 8): /status ``waiting_for``, the
per-agent /metrics series with a bounded label set, and the dashboard showing both."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import uvicorn
from fastapi.testclient import TestClient

from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.localnet import HOST, free_port
from aggregator.service.settings import Settings, SettingsError, load_settings
from aggregator.web.agent_metrics import OTHER, AgentSample, fold, max_agents_from
from aggregator.web.app import create_app
from aggregator.web.schemas import WaitingOut, waiting_for
from edge_agent.numerics.compressors import Update, compress
from edge_agent.protocol import messages, topics, wire
from edge_agent.transports import Transport, open_transport

JOB = "lagjob"
D = 16


def make_settings(memory_url: str, data_dir: Path) -> Settings:
    return load_settings(
        job=JOB, d=D, step_size=0.5, transports=[memory_url], data_dir=data_dir, tick_s=0.02,
        downlink_pacing=False, feedback="any",
    )  # fmt: skip


class FakeAgents:
    """Agents sharing one memory:// client: hello and send updates."""

    def __init__(self, transport: Transport) -> None:
        self.t = transport

    def hello(self, agent: str) -> None:
        self.t.publish(*_hello(JOB, agent))

    def update(self, agent: str, seed: int, *, seq: int = 0) -> None:
        g = np.random.default_rng(seed).normal(size=D)
        blob = wire.encode(compress(g, "topk", 4), job=JOB, agent=agent, round=0, seq=seq)
        self.t.publish(topics.update(JOB, agent), blob)


def _hello(job: str, agent: str, d: int = D) -> tuple[str, bytes]:
    hello = messages.Hello(
        job=job, agent=agent, d=d, rows=10, smoothness=2.0, model="logreg", compressor="topk",
        profile="paper_packet_model",
    )  # fmt: skip
    return topics.hello(job, agent), messages.dump(hello)


CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)


def _until(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def job(
    memory_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[TestClient, FakeAgents]]:
    """Agents a and b said hello; a reported for round 0 (and re-sent it: a refusal)."""
    monkeypatch.setenv("AGG_METRICS_MAX_AGENTS", "1")
    app = create_app(make_settings(memory_url, tmp_path / "data"))
    with TestClient(app) as client:
        t = open_transport(memory_url, role="agent", client_id="fake-agents")
        t.connect()
        agents = FakeAgents(t)
        try:
            agents.hello("a")
            _until(lambda: client.get("/status").json()["agents"] == 1, "a's hello")
            agents.hello("b")
            agents.update("a", 1)
            agents.update("a", 2, seq=1)  # a second update for the same round: refused
            _until(
                lambda: client.get("/agents/a").json()["messages_rejected"] == 1,
                "a's refused update",
            )
            yield client, agents
        finally:
            t.close()


def test_status_lists_the_live_agents_the_open_round_waits_for(
    job: tuple[TestClient, FakeAgents],
) -> None:
    client, _ = job
    status = client.get("/status").json()
    assert status["state"] == "running" and status["round"] == 0
    assert status["open_round_participants"] == ["a"]
    [waiting] = status["waiting_for"]
    b = client.get("/agents/b").json()
    assert waiting["agent"] == "b"
    assert waiting["since"] >= b["first_seen"] and waiting["since"] <= time.time()


def test_metrics_label_at_most_the_cap_and_fold_the_rest_into_other(
    job: tuple[TestClient, FakeAgents],
) -> None:
    client, _ = job
    text = client.get("/metrics").text
    a, b = client.get("/agents/a").json(), client.get("/agents/b").json()
    assert f'cat_agent_bytes_sent_total{{agent="a"}} {float(a["sent"]["bytes"])}' in text
    assert f'cat_agent_bytes_sent_total{{agent="{OTHER}"}} {float(b["sent"]["bytes"])}' in text
    assert 'agent="b"' not in text  # AGG_METRICS_MAX_AGENTS=1: a joined first, b is folded
    assert 'cat_agent_messages_rejected_total{agent="a"} 1.0' in text
    seen = re.search(r'cat_agent_last_seen_seconds\{agent="a"\} (\S+)', text)
    assert seen is not None and float(seen.group(1)) == a["last_seen"]
    assert 'cat_agent_airtime_seconds_total{agent="a",direction="up"}' in text
    received = re.findall(r'cat_agent_bytes_received_total\{agent="(\w+)"\}', text)
    assert received == ["a", OTHER]


def _sample(agent: str, first: float, sent: int) -> AgentSample:
    return AgentSample(agent, first, first + 1, sent, 2 * sent, 0.5, 0.25, 1)


def test_fold_keeps_the_first_to_join_and_sums_the_rest() -> None:
    samples = [_sample(f"n{i}", first=float(10 - i), sent=i) for i in range(5)]
    rows = fold(samples, 2)
    assert [r.agent for r in rows] == ["n4", "n3", OTHER]  # n4 joined first (t=6)
    other = rows[-1]
    assert (other.bytes_sent, other.bytes_received, other.rejected) == (0 + 1 + 2, 6, 3)
    assert other.last_seen == 11.0 and other.airtime_up_s == 1.5
    assert fold(samples, 5) == sorted(samples, key=lambda s: s.first_seen)
    assert [r.agent for r in fold(samples, 0)] == [OTHER]


def test_the_cap_comes_from_its_variable_and_a_bad_one_names_it() -> None:
    assert max_agents_from({}) == 100
    assert max_agents_from({"AGG_METRICS_MAX_AGENTS": "7"}) == 7
    with pytest.raises(SettingsError, match="AGG_METRICS_MAX_AGENTS='-1'"):
        max_agents_from({"AGG_METRICS_MAX_AGENTS": "-1"})


def test_waiting_for_is_empty_unless_running_and_starts_when_the_agent_joined() -> None:
    eng = RoundEngine(EngineConfig(job="flip", d=4, step_size=0.5, round_deadline_s=100.0))
    assert waiting_for(eng) == []  # waiting for hellos: no round is open
    for now, agent in [(10.0, "a"), (20.0, "b"), (30.0, "c")]:
        eng.handle(*_hello("flip", agent, d=4), now)
    update = Update("topk", 4, np.array([0]), np.array([1.0], dtype=np.float32))
    blob = wire.encode(update, job="flip", agent="b", round=0, seq=0)
    assert eng.handle(topics.update("flip", "b"), blob, 31.0).reason is None
    opened = eng.open_round["opened_at"]
    assert opened == 10.0
    assert waiting_for(eng) == [
        WaitingOut(agent="a", since=10.0),
        WaitingOut(agent="c", since=30.0),
    ]
    eng.control("pause", 40.0)
    assert waiting_for(eng) == []


# --------------------------------------------------------------------------- the dashboard


@pytest.mark.integration  # uvicorn on a real port and headless Chromium
def test_dashboard_shows_who_the_round_waits_for_and_who_was_refused(
    memory_url: str, tmp_path: Path
) -> None:
    if CHROMIUM is None:
        pytest.skip("chromium not found on PATH; install it (apt-get install chromium)")
    port = free_port()
    app = create_app(make_settings(memory_url, tmp_path / "data"))
    server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=port, log_level="warning"))
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    t = open_transport(memory_url, role="agent", client_id="fake-agents")
    try:
        _until(lambda: server.started, "uvicorn")
        t.connect()
        t.subscribe(topics.delta(JOB))
        agents = FakeAgents(t)
        agents.hello("a")
        agents.hello("b")
        agents.update("a", 1)
        agents.update("a", 2, seq=1)  # refused: a already reported for round 0
        _until(lambda: client_rejected(app) == 1, "refusal")
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000",
               "--dump-dom", f"http://{HOST}:{port}/"]  # fmt: skip
        dom = subprocess.run(cmd, capture_output=True, timeout=60, check=True).stdout.decode()
    finally:
        t.close()
        server.should_exit = True
        serving.join(timeout=10)
    waiting = re.search(r'<p id="waiting" class="waiting"( hidden="")?[^>]*>([^<]*)</p>', dom)
    assert waiting is not None and waiting.group(1) is None, dom
    assert waiting.group(2).startswith("Round 0 waits for b"), waiting.group(2)
    row_a = re.search(r'<tr class="refused">.*?</tr>', dom, re.S)
    assert row_a is not None and "a</th>" in row_a.group(0), dom
    assert '<span class="refused-tag"' in row_a.group(0) and ">1 refused</span>" in row_a.group(0)
    assert "1 refused" in dom and "waited for" in dom


def client_rejected(app: object) -> int:
    """Refusals counted against agent a so far (0 before its hello is through)."""
    service = app.state.service  # type: ignore[attr-defined]
    return int(service.read(lambda e: e.agents["a"].rejected if "a" in e.agents else 0))
