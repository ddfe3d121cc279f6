"""An agent reads the job's settings (``cat/<job>/job``) and, when its own do not fit, says
so in one ERROR line naming both values and gives up before it sends an update (issue 12,
"defaults that meet")."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
from agent_harness import JOB, Clock, D, listen
from agent_harness import make_agent as harness_agent

from edge_agent.agent.loop import Agent
from edge_agent.errors import WireFormatError
from edge_agent.protocol import jobinfo, messages, topics
from edge_agent.transports import Message


def info(**fields: object) -> jobinfo.JobInfo:
    base: dict[str, object] = {
        "job": JOB,
        "d": D,
        "model": "logreg",
        "feedback": "ef21",
        "family": "ef21",
        "compressors": ("dense", "topk"),
    }
    base.update(fields)
    return jobinfo.JobInfo(**base)  # type: ignore[arg-type]


def conflict(i: jobinfo.JobInfo, **own: object) -> str | None:
    base: dict[str, object] = {
        "job": JOB,
        "d": D,
        "model": "logreg",
        "semantics": "ef21",
        "compressor": "topk",
    }
    base.update(own)
    return jobinfo.conflict(i, **base)  # type: ignore[arg-type]


def test_conflicts_name_both_values_and_the_fix() -> None:
    assert conflict(info()) is None
    line = conflict(info(), semantics="plain")
    assert line is not None and "runs ef21 (AGG_FEEDBACK" in line and "this agent plain" in line
    assert "--feedback ef21" in line
    line = conflict(info(feedback="none", family="mean"), semantics="ef21")
    assert line is not None and "runs none" in line and "--feedback none" in line
    assert conflict(info(feedback="none", family="mean"), semantics="dir") is None
    assert conflict(info(feedback="any", family=None), semantics="plain") is None
    line = conflict(info(), d=D + 1)
    assert line is not None and f"d={D} (AGG_D)" in line and f"d={D + 1}" in line
    line = conflict(info(), model="linreg")
    assert line is not None and "'logreg'" in line and "'linreg'" in line
    line = conflict(info(), compressor="randk")
    assert line is not None and "randk" in line and "dense, topk" in line
    assert conflict(info(job="other"), d=1) is None  # not our job: not ours to judge


FIT = jobinfo.Fit(JOB, "me", D, "logreg", "ef21", "topk")


def test_judge_gives_a_verdict_on_the_job_topic_and_on_addressed_json_only() -> None:
    ok = jobinfo.judge(topics.job_info(JOB), info().dump(), FIT)
    assert ok == jobinfo.Verdict(None, None)
    bad = jobinfo.judge(topics.to_agent(JOB, "me"), info(d=D + 1).dump(), FIT)
    assert bad is not None and bad.conflict is not None and f"d={D + 1} (AGG_D)" in bad.conflict
    assert bad.give_up == f"agent me does not fit the job: {bad.conflict}"
    control = messages.dump(messages.Control(cmd="pause"))
    assert jobinfo.judge(topics.to_agent(JOB, "me"), control, FIT) is None
    assert jobinfo.judge(topics.to_agent(JOB, "other"), info().dump(), FIT) is None
    assert jobinfo.judge(topics.control(JOB), info().dump(), FIT) is None


def test_jobinfo_imports_nothing_of_the_agent() -> None:
    """The agent acts on a Verdict; jobinfo knows no Agent (not even for type checking)."""
    tree = ast.parse(Path(jobinfo.__file__).read_text(encoding="utf-8"))
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    ]
    assert not [m for m in imported if m.startswith("edge_agent.agent")], imported


def test_parse_tells_job_info_from_control_and_refuses_a_bad_one() -> None:
    assert jobinfo.parse(info().dump()) == info()
    assert jobinfo.parse(b'{"type":"control","cmd":"stop"}') is None
    with pytest.raises(WireFormatError, match="job info"):
        jobinfo.parse(b'{"type":"job","job":"job1"}')
    with pytest.raises(WireFormatError, match="not JSON"):
        jobinfo.parse(b"\xff")


def make_agent(url: str, feedback: str) -> Agent:
    return harness_agent(url, Clock(), feedback=feedback)


def test_a_conflicting_agent_reads_the_retained_settings_and_gives_up_before_any_update(
    memory_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    agg = listen(memory_url)
    agg.publish(topics.job_info(JOB), info().dump(), retain=True)
    agent = make_agent(memory_url, "none")
    caplog.set_level(logging.ERROR, logger="edge_agent")
    try:
        agent.start()
        agent.run(poll_s=0.01)  # returns: the settings do not fit
        assert agent.gave_up is not None and "this agent plain" in agent.gave_up
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "runs ef21" in errors[0].getMessage()
        sent = []
        while (m := agg.recv(timeout_s=0)) is not None:
            sent.append(topics.parse(m.topic).kind)
        assert "update" not in sent
    finally:
        agent.close()
        agg.close()


def test_a_fitting_agent_reads_the_settings_and_goes_on(memory_url: str) -> None:
    agent = make_agent(memory_url, "ef21")
    agent.handle(Message(topics.job_info(JOB), info().dump()))
    agent.handle(Message(topics.to_agent(JOB, "me"), info().dump()))  # in answer to a hello
    assert agent.gave_up is None and agent.counters.dropped.get("unexpected_topic", 0) == 0
    agent.handle(Message(topics.to_agent(JOB, "me"), info(d=D + 1).dump()))
    assert agent.gave_up is not None and f"d={D + 1} (AGG_D)" in agent.gave_up


def test_a_later_refusal_does_not_clear_the_give_up_and_an_earlier_one_does_not_hide_it(
    memory_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="edge_agent")
    agent = make_agent(memory_url, "none")  # max_refusals=3: one refusal does not end it
    agent.handle(Message(topics.job_info(JOB), info().dump()))
    agent.handle(refused("wrong_semantics"))
    assert agent.gave_up is not None and "does not fit the job" in agent.gave_up
    other = make_agent(memory_url, "none")
    other.answers.max_refusals = 1  # the refusal alone ends it first
    other.handle(refused("wrong_semantics"))
    assert other.gave_up is not None and "refused agent me" in other.gave_up
    other.handle(Message(topics.to_agent(JOB, "me"), info().dump()))
    assert other.gave_up is not None and "does not fit the job" in other.gave_up
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and all("runs ef21" in e for e in errors)


def refused(reason: str) -> Message:
    ctl = messages.Control(cmd="refused", agent="me", reason=reason, detail="job runs ef21")
    return Message(topics.control(JOB), messages.dump(ctl))


def test_a_job_with_a_batch_size_names_it_and_the_flag() -> None:
    job = info(batch_size=0.1)
    assert conflict(job, batch_size=0.1) is None
    line = conflict(job)
    assert line is not None and "batch size 0.1" in line and "--batch-size 0.1" in line
    assert conflict(info(), batch_size=0.1) is None  # a job without one takes any
