"""What the agent says while it waits (issue 12, finding 8) and its log format (finding 6):
a duty-cycle silence, a paused job, a re-send; ``--log-format text|json``."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import numpy as np
import pytest

from edge_agent.agent.loop import Agent, AgentConfig
from edge_agent.cli import commands as cli
from edge_agent.cli.logs import JsonFormatter, configure
from edge_agent.data import Dataset, make_rcv1_like
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.models import make_model
from edge_agent.protocol import messages, topics
from edge_agent.transports import Transport, open_transport

JOB = "logs"
D = 50
NOW = 1000.0


@pytest.fixture
def aggregator(memory_url: str) -> Iterator[Transport]:
    t = open_transport(memory_url, role="aggregator", client_id="peer")
    t.connect()
    for pattern in topics.agent_inbound(JOB):
        t.subscribe(pattern)
    yield t
    t.close()


def _agent(url: str, duty_cycle: str) -> Agent:
    shard: Dataset = make_rcv1_like(40, D, rng=np.random.default_rng(0), nnz_per_row=5)
    config = AgentConfig(job=JOB, agent_id="a1", duty_cycle=duty_cycle)  # type: ignore[arg-type]
    return Agent(
        config,
        model=make_model("logreg", n_features=D),
        data=shard,
        profile=resolve_profile("lorawan_eu868_dr5_sf7"),  # EU868: 1 % duty cycle
        transport=open_transport(url, role="agent", client_id="a1"),
        clock=lambda: NOW,
    )


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "edge_agent"]


def _deliver(agent: Agent) -> None:
    while (m := agent.transport.recv(timeout_s=0)) is not None:
        agent.handle(m)


def test_a_long_duty_cycle_silence_is_logged_when_it_starts(
    memory_url: str, aggregator: Transport, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edge_agent")
    agent = _agent(memory_url, "wait")
    agent.start()  # the hello goes out; the snapshot request waits for the silence to end
    owed = agent.uplink.free_at - NOW
    assert owed >= 5.0  # a LoRaWAN hello at SF7 owes tens of seconds at 1 % in each sub-band
    line = f"radio silent for {owed:.1f} s (duty cycle 1 % in each of 2 sub-bands)"
    assert _lines(caplog).count(line) == 1
    agent.close()


def test_an_agent_that_ignores_the_duty_cycle_logs_no_silence(
    memory_url: str, aggregator: Transport, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edge_agent")
    agent = _agent(memory_url, "ignore")
    agent.start()
    assert not [m for m in _lines(caplog) if m.startswith("radio silent")]
    agent.close()


def test_pause_and_resume_are_logged_once_per_change(
    memory_url: str, aggregator: Transport, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edge_agent")
    agent = _agent(memory_url, "ignore")
    agent.start()
    for cmd in ("pause", "pause", "resume", "resume"):  # a repeat changes nothing
        ctl = messages.Control(cmd=cmd)
        aggregator.publish(topics.control(JOB), messages.dump(ctl))
        _deliver(agent)
    said = [m for m in _lines(caplog) if m.startswith("job ")]
    assert said == ["job paused: waiting for resume", "job resumed"]
    agent.close()


def test_json_lines_carry_time_level_logger_and_message() -> None:
    stream = io.StringIO()
    handler = configure("json", "INFO", logger="cat_edge_test_json", stream=stream)
    try:
        logging.getLogger("cat_edge_test_json.child").info("radio silent for %.1f s", 36.94)
        logging.getLogger("cat_edge_test_json.child").debug("below the level")
    finally:
        logging.getLogger("cat_edge_test_json").removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert set(obj) == {"time", "level", "logger", "message"}
    assert obj["level"] == "INFO" and obj["logger"] == "cat_edge_test_json.child"
    assert obj["message"] == "radio silent for 36.9 s" and obj["time"].endswith("Z")


def test_configure_replaces_only_its_own_handler() -> None:
    name = "cat_edge_test_replace"
    other = logging.NullHandler()
    logging.getLogger(name).addHandler(other)
    first = configure("text", logger=name, stream=io.StringIO())
    second = configure("json", logger=name, stream=io.StringIO())
    handlers = logging.getLogger(name).handlers
    try:
        assert other in handlers and second in handlers and first not in handlers
        assert isinstance(second.formatter, JsonFormatter)
    finally:
        for h in list(handlers):
            logging.getLogger(name).removeHandler(h)


@pytest.mark.parametrize(
    "argv",
    [
        ["--log-format", "json", "run", "--profile", "no_such_profile", "--data", "x.svm"],
        ["run", "--log-format", "json", "--profile", "no_such_profile", "--data", "x.svm"],
    ],
)
def test_edge_agent_log_format_flag_sets_json_lines(argv: list[str]) -> None:
    root = logging.getLogger()
    level = root.level
    try:
        assert cli.main(argv) == cli.EXIT_CONFIG  # the unknown profile: logging is set first
        ours = [h for h in root.handlers if type(h).__name__ == "_OurHandler"]
        assert len(ours) == 1 and isinstance(ours[0].formatter, JsonFormatter)
    finally:
        for h in [h for h in root.handlers if type(h).__name__ == "_OurHandler"]:
            root.removeHandler(h)
        root.setLevel(level)
