"""The job's settings are configured (``AGG_FEEDBACK``), announced on ``cat/<job>/job`` and
named in refusals; refused agents are remembered for /status and the dashboard (issue 12:
"defaults that meet", "the dashboard shows refused agents")."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvicorn
from fastapi.testclient import TestClient

from aggregator.engine.refusals import MAX_REFUSED_AGENTS, RefusedAgents
from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.service.settings import SettingsError, load_settings
from aggregator.web.app import create_app
from edge_agent.numerics.compressors import compress
from edge_agent.protocol import jobinfo, messages, topics, wire
from edge_agent.transports import open_transport

JOB = "job1"
D = 16
HOST = "127.0.0.1"


def engine(feedback: str = "ef21") -> RoundEngine:
    return RoundEngine(EngineConfig(job=JOB, d=D, step_size=0.5, feedback=feedback))  # type: ignore[arg-type]


def hello(agent: str, semantics: str = "plain", **fields: Any) -> tuple[str, bytes]:
    base: dict[str, Any] = {
        "job": JOB,
        "agent": agent,
        "d": D,
        "rows": 10,
        "smoothness": 2.0,
        "model": "logreg",
        "compressor": "topk",
        "semantics": semantics,
    }
    base.update(fields)
    return topics.hello(JOB, agent), messages.dump(messages.Hello(**base))


def refused_controls(outbound: tuple[Any, ...]) -> list[messages.Control]:
    ctls = [
        messages.parse(messages.Control, o.payload)
        for o in outbound
        if o.topic == topics.control(JOB)
    ]
    return [c for c in ctls if c.cmd == "refused"]


# ---------------------------------------------------------------- admission


def test_a_configured_family_refuses_the_other_from_the_first_hello_on() -> None:
    eng = engine("ef21")
    eff = eng.handle(*hello("bad", "plain"), 1.0)  # the first hello: it fixes nothing
    assert eff.reason == "wrong_semantics" and eng.agents == {} and eng.family is None
    assert eng.handle(*hello("good", "ef21"), 2.0).reason is None
    assert eng.family == "ef21" and list(eng.agents) == ["good"]


@pytest.mark.parametrize("feedback", ["none", "ef", "dir"])
def test_the_mean_settings_take_every_mean_semantics_and_refuse_ef21(feedback: str) -> None:
    eng = engine(feedback)
    assert eng.handle(*hello("e", "ef21"), 1.0).reason == "wrong_semantics"
    assert eng.handle(*hello("p", "plain"), 2.0).reason is None
    assert eng.handle(*hello("q", "ef"), 3.0).reason is None


def test_any_keeps_the_first_hello_rule() -> None:
    eng = engine("any")
    assert eng.handle(*hello("p", "plain"), 1.0).reason is None
    assert eng.handle(*hello("e", "ef21"), 2.0).reason == "wrong_semantics"
    assert EngineConfig(job=JOB, d=D).feedback == "any"  # the library default: today's rule


def test_the_refusal_names_the_jobs_value_and_the_fix_and_carries_the_settings() -> None:
    eng = engine("ef21")
    eff = eng.handle(*hello("bad", "plain"), 1.0)
    (ctl,) = refused_controls(eff.outbound)
    assert ctl.agent == "bad" and ctl.reason == "wrong_semantics"
    assert "job runs ef21 (AGG_FEEDBACK); run the agent with --feedback ef21" in ctl.detail
    addressed = [o for o in eff.outbound if o.topic == topics.to_agent(JOB, "bad")]
    assert len(addressed) == 1 and not addressed[0].retain
    info = jobinfo.parse(addressed[0].payload)
    assert info is not None and (info.feedback, info.family, info.d) == ("ef21", "ef21", D)
    assert eff.outbound[0].topic == topics.control(JOB)  # the WARNING first, then the settings
    # within the rate limit nothing goes to the whole job: the refusal and the settings go
    # to the agent alone (its first answer may have been lost), the WARNING first
    again = eng.handle(*hello("bad", "plain"), 2.0)
    assert refused_controls(again.outbound) == []
    assert [o.topic for o in again.outbound] == [topics.to_agent(JOB, "bad")] * 2
    ctl = messages.parse(messages.Control, again.outbound[0].payload)
    assert (ctl.cmd, ctl.agent, ctl.reason) == ("refused", "bad", "wrong_semantics")
    assert jobinfo.parse(again.outbound[1].payload) is not None


def test_wrong_d_and_model_name_the_setting_and_the_fix() -> None:
    eng = engine("ef21")
    (ctl,) = refused_controls(eng.handle(*hello("a", "ef21", d=D + 1), 1.0).outbound)
    assert f"job has d={D} (AGG_D); the agent's data must have {D} features" in ctl.detail
    assert f"--features {D} pads" in ctl.detail and "regenerate it" in ctl.detail
    (ctl,) = refused_controls(eng.handle(*hello("b", "ef21", model="linreg"), 1.0).outbound)
    assert "AGG_MODEL" in ctl.detail and "--model logreg" in ctl.detail


# ---------------------------------------------------------------- the announcement


def test_the_job_is_announced_retained_on_its_topic_and_to_a_misfit_only() -> None:
    eng = engine("ef21")
    (ann,) = [o for o in eng.state_controls() if o.topic == topics.job_info(JOB)]
    assert ann.retain
    body = json.loads(ann.payload)
    assert body == {
        "type": "job",
        "job": JOB,
        "d": D,
        "model": "logreg",
        "feedback": "ef21",
        "family": "ef21",
        "compressors": ["dense", "topk", "signtopk", "randk"],
    }
    eff = eng.handle(*hello("good", "ef21"), 1.0)
    answers = [
        jobinfo.parse(o.payload) for o in eff.outbound if o.topic == topics.to_agent(JOB, "good")
    ]
    # a hello that fits is not answered with the settings (checked already; a capped
    # downlink would pay for them); a misfit's refusal carries them
    assert not any(a is not None and a.job == JOB for a in answers)
    eff = eng.handle(*hello("bad", "ef21", model="linreg"), 1.0)
    answers = [
        jobinfo.parse(o.payload) for o in eff.outbound if o.topic == topics.to_agent(JOB, "bad")
    ]
    assert any(a is not None and a.job == JOB for a in answers)


def test_versions_and_request_answers_do_not_repeat_the_settings() -> None:
    eng = engine("ef21")
    eng.handle(*hello("a", "ef21"), 1.0)
    u = compress(np.arange(D, dtype=np.float64), "topk", 3)
    u = type(u)(u.compressor, u.d, u.indices, u.values, semantics="ef21")
    eff = eng.handle(
        topics.update(JOB, "a"), wire.encode(u, job=JOB, agent="a", round=0, seq=0), 2.0
    )
    assert eff.reason is None and eff.committed is not None  # a version closed
    req = messages.dump(messages.Request(have=None))
    eff2 = eng.handle(topics.request(JOB, "a"), req, 3.0)
    for o in (*eff.outbound, *eff2.outbound):
        assert o.topic != topics.job_info(JOB) and b'"type":"job"' not in o.payload


def test_an_any_job_announces_nothing() -> None:
    assert engine("any").state_controls() == []


def test_agg_feedback_defaults_to_ef21_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(d=D).engine_config().feedback == "ef21"
    monkeypatch.setenv("AGG_FEEDBACK", "none")
    assert load_settings(d=D).engine_config().feedback == "none"
    monkeypatch.setenv("AGG_FEEDBACK", "plain")
    with pytest.raises(SettingsError, match="AGG_FEEDBACK"):
        load_settings(d=D)
    with pytest.raises(ValueError, match="feedback must be"):
        EngineConfig(job=JOB, d=D, feedback="plain")  # type: ignore[arg-type]


# ---------------------------------------------------------------- refused agents


def test_refused_agents_are_counted_bounded_and_most_recent_first() -> None:
    rec = RefusedAgents()
    for i in range(MAX_REFUSED_AGENTS + 20):
        rec.record(f"a{i}", "wrong_d", float(i))
    rec.record("a30", "wrong_model", 500.0)
    listing = rec.listing()
    assert len(listing) == MAX_REFUSED_AGENTS
    assert listing[0] == {"agent": "a30", "reason": "wrong_model", "count": 2, "last": 500.0}
    assert "a0" not in {r["agent"] for r in listing}  # the oldest were forgotten


def test_the_engine_records_a_refused_hello_and_forgets_it_once_accepted() -> None:
    eng = engine("ef21")
    eng.handle(*hello("bad", "plain"), 1.0)
    eng.handle(*hello("bad", "plain"), 2.0)
    eng.handle(*hello("x", "ef21"), 2.5)
    assert eng.refusals.refused_agents.listing() == [
        {"agent": "bad", "reason": "wrong_semantics", "count": 2, "last": 2.0}
    ]
    assert eng.handle(*hello("bad", "ef21"), 3.0).reason is None  # it was fixed
    assert eng.refusals.refused_agents.listing() == []


def test_status_lists_refused_agents(memory_url: str, tmp_path: Path) -> None:
    settings = load_settings(job=JOB, d=D, transports=[memory_url], data_dir=tmp_path, tick_s=0.02)
    with TestClient(create_app(settings)) as client:
        t = open_transport(memory_url, role="agent", client_id="fake")
        t.connect()
        try:
            t.publish(*hello("agent-bad", "plain"))
            _until(lambda: bool(client.get("/status").json()["refused_agents"]), "the refusal")
        finally:
            t.close()
        (rec,) = client.get("/status").json()["refused_agents"]
    assert rec["agent"] == "agent-bad" and rec["reason"] == "wrong_semantics"
    assert rec["count"] == 1 and abs(rec["last"] - time.time()) < 60


def test_dashboard_shows_refused_agents(memory_url: str, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium not found on PATH; install it (apt-get install chromium)")
    settings = load_settings(
        job=JOB, d=D, transports=[memory_url], data_dir=tmp_path / "d", tick_s=0.02
    )
    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=port, log_level="warning"))
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    t = open_transport(memory_url, role="agent", client_id="fake")
    try:
        _until(lambda: server.started, "uvicorn")
        t.connect()
        t.publish(*hello("agent-bad", "plain"))
        service = app.state.service
        _until(lambda: bool(service.read(lambda e: e.refusals.refused_agents.listing())), "refusal")
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000",
               "--dump-dom", f"http://{HOST}:{port}/"]  # fmt: skip
        dom = subprocess.run(cmd, capture_output=True, timeout=60, check=True).stdout.decode()
    finally:
        t.close()
        server.should_exit = True
        serving.join(timeout=10)
    line = re.search(r'<p id="refused-agents"[^>]*>([^<]*)</p>', dom)
    assert line is not None and "hidden" not in line.group(0), dom
    assert line.group(1).startswith("Refused: agent-bad (wrong_semantics"), line.group(1)


# ---------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
    return port


def _until(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
