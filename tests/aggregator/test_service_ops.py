"""What an operator relies on (issue: costs silently zero, two aggregators, a quiet service):
the profiles directory is checked at start, a hello naming a profile the aggregator lacks
is refused ``unknown_profile`` (counted, told to the agent, never priced), one aggregator
per data directory, INFO lines for rounds and checkpoints, uvicorn's loggers in our format.
In process, over memory:// (the real processes are in tests/integration/test_operator_guards.py)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from aggregator.service.datalock import LOCK_FILE, DataDirInUse, DataDirLock
from aggregator.service.logs import CHECKPOINT_LOG_EVERY, configure_service
from aggregator.service.profiles import check_profiles_dir
from aggregator.service.settings import Settings, SettingsError
from aggregator.web.app import create_app
from edge_agent.cli.logs import JsonFormatter
from edge_agent.links.catalog import PROFILES_DIR_ENV, default_profiles_dir
from edge_agent.numerics.compressors import compress
from edge_agent.protocol import messages, topics, wire
from edge_agent.transports import Transport, open_transport

JOB = "opsjob"
D = 16
SHIPPED = "paper_packet_model"


def _settings(memory_url: str, data_dir: Path) -> Settings:
    """A plain-family job on ``memory_url`` (validated alone: no AGG_* of this process)."""
    return Settings.model_validate(
        {"job": JOB, "d": D, "step_size": 0.5, "transports": [memory_url], "tick_s": 0.02}
        | {"data_dir": data_dir, "downlink_pacing": False, "feedback": "any"}
    )


class _Agent:
    """One agent's client on the memory broker: hello, update, the control it hears."""

    def __init__(self, transport: Transport, agent: str) -> None:
        self.t, self.agent = transport, agent

    def hello(self, profile: str) -> None:
        msg = messages.Hello(
            job=JOB, agent=self.agent, d=D, rows=10, smoothness=2.0, model="logreg",
            compressor="topk", profile=profile,
        )  # fmt: skip
        self.t.publish(topics.hello(JOB, self.agent), messages.dump(msg))

    def update(self, seed: int) -> None:
        g = np.random.default_rng(seed).normal(size=D)
        blob = wire.encode(compress(g, "topk", 4), job=JOB, agent=self.agent, round=0, seq=0)
        self.t.publish(topics.update(JOB, self.agent), blob)

    def refusal(self) -> messages.Control:
        for _ in range(100):  # bounded: each recv waits at most 0.1 s
            got = self.t.recv(timeout_s=0.1)
            if got is None or got.topic != topics.control(JOB):
                continue
            ctl = messages.parse(messages.Control, got.payload)
            if ctl.cmd == "refused" and ctl.agent == self.agent:
                return ctl
        raise AssertionError(f"no refusal for {self.agent}")


@pytest.fixture
def served(memory_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, _Agent]]:
    with TestClient(create_app(_settings(memory_url, tmp_path / "data"))) as client:
        t = open_transport(memory_url, role="agent", client_id="ops-agent")
        t.connect()
        t.subscribe(topics.control(JOB))
        try:
            yield client, _Agent(t, "a")
        finally:
            t.close()


def _wait_rejected(client: TestClient, reason: str, n: int) -> dict[str, int]:
    for _ in range(200):  # bounded: 200 polls
        rejected: dict[str, int] = client.get("/status").json()["updates_rejected"]
        if rejected.get(reason, 0) >= n:
            return rejected
        client.get("/healthz")  # yields to the ingest thread
    raise AssertionError(f"{reason} never counted {n} times")


# ---------------------------------------------------------------- the profiles directory


def test_a_missing_profiles_directory_names_the_variable_the_path_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROFILES_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(SettingsError) as err:
        check_profiles_dir()
    text = str(err.value)
    assert f"{PROFILES_DIR_ENV}={tmp_path / 'nope'}: no such directory" in text
    assert "unset it to use the shipped ones" in text


def test_a_profiles_directory_without_a_profile_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "README").write_text("no profiles here")
    monkeypatch.setenv(PROFILES_DIR_ENV, str(tmp_path))
    with pytest.raises(SettingsError, match="holds no cost profile"):
        check_profiles_dir()


def test_the_shipped_profiles_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROFILES_DIR_ENV, raising=False)
    assert (check_profiles_dir() / f"{SHIPPED}.json").is_file()


def test_the_env_example_leaves_the_image_s_profiles_directory_alone() -> None:
    """The example must not override the Dockerfile's CAT_EDGE_PROFILES_DIR with a path the
    image lacks (compose reads the example as its env file)."""
    root = Path(__file__).resolve().parents[2]
    dockerfile = (root / "deploy" / "Dockerfile").read_text()
    image_dir = dockerfile.split(f"{PROFILES_DIR_ENV}=", 1)[1].split()[0]
    assert f"COPY cost_profiles {image_dir}" in dockerfile
    example = (root / "deploy" / "aggregator.env.example").read_text().splitlines()
    set_here = [line for line in example if line.startswith(f"{PROFILES_DIR_ENV}=")]
    assert set_here in ([], [f"{PROFILES_DIR_ENV}={image_dir}"])


# ---------------------------------------------------------------- unknown_profile


def test_a_hello_naming_an_unknown_profile_is_refused_counted_and_told(
    served: tuple[TestClient, _Agent],
) -> None:
    client, agent = served
    agent.hello("no_such_link")
    ctl = agent.refusal()
    assert ctl.reason == "unknown_profile"
    assert "'no_such_link'" in ctl.detail and "no_such_link.json" in ctl.detail
    _wait_rejected(client, "unknown_profile", 1)
    agent.update(1)  # never registered: its update is refused, never priced
    _wait_rejected(client, "unknown_agent", 1)
    status = client.get("/status").json()
    assert status["agents"] == 0 and status["totals"]["updates"] == 0
    assert [r["reason"] for r in status["refused_agents"]] == ["unknown_agent"]
    assert 'reason="unknown_profile"' in client.get("/metrics").text


def test_a_hello_naming_a_path_is_refused(served: tuple[TestClient, _Agent]) -> None:
    client, agent = served
    agent.hello("/etc/cat-edge/x.json")
    assert agent.refusal().reason == "unknown_profile"
    assert client.get("/status").json()["agents"] == 0


def test_a_profile_added_to_the_directory_is_found_without_a_restart(
    memory_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    shutil.copy(default_profiles_dir() / f"{SHIPPED}.json", profiles)
    monkeypatch.setenv(PROFILES_DIR_ENV, str(profiles))
    own = json.loads((profiles / f"{SHIPPED}.json").read_text()) | {"name": "site_link"}
    with TestClient(create_app(_settings(memory_url, tmp_path / "data"))) as client:
        t = open_transport(memory_url, role="agent", client_id="ops-agent")
        t.connect()
        t.subscribe(topics.control(JOB))
        agent = _Agent(t, "a")
        try:
            agent.hello("site_link")
            assert agent.refusal().reason == "unknown_profile"
            (profiles / "site_link.json").write_text(json.dumps(own))
            agent.hello("site_link")  # the agent keeps saying hello; now it is known
            for _ in range(200):
                if client.get("/status").json()["agents"] == 1:
                    break
            assert client.get("/agents/a").json()["profile"] == "site_link"
        finally:
            t.close()


# ---------------------------------------------------------------- the data directory lock


def test_a_second_lock_on_one_directory_names_the_holder(tmp_path: Path) -> None:
    first = DataDirLock.acquire(tmp_path / "data")
    try:
        holder = json.loads((tmp_path / "data" / LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid() and holder["host"] and holder["started"]
        with pytest.raises(DataDirInUse) as err:
            DataDirLock.acquire(tmp_path / "data")
        assert f"pid {os.getpid()} on host {holder['host']} since {holder['started']}" in str(
            err.value
        )
        assert "AGG_DATA_DIR=" in str(err.value)
    finally:
        first.release()
    DataDirLock.acquire(tmp_path / "data").release()  # released: free again


def test_a_running_service_holds_its_data_directory(
    served: tuple[TestClient, _Agent], tmp_path: Path
) -> None:
    with pytest.raises(DataDirInUse):
        DataDirLock.acquire(tmp_path / "data")


# ---------------------------------------------------------------- progress lines


def test_a_round_closed_and_its_checkpoint_are_info_lines(
    served: tuple[TestClient, _Agent], caplog: pytest.LogCaptureFixture
) -> None:
    client, agent = served
    with caplog.at_level(logging.INFO, logger="aggregator.service.ingest"):
        agent.hello(SHIPPED)
        agent.update(1)
        for _ in range(200):
            if client.get("/status").json()["model_version"] == 1:
                break
        client.app.state.service.stop()  # type: ignore[attr-defined]  # flushes the batch
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    closed = [s for s in said if s.startswith("round closed: version 1 from 0 (")]
    assert len(closed) == 1 and "1 participants (a)" in closed[0], said
    assert "loss n/a (no AGG_EVAL_DATA)" in closed[0]
    checkpoint = (
        f"checkpoint written at version 1 (one every 1 versions; this line every "
        f"{CHECKPOINT_LOG_EVERY})"
    )
    assert checkpoint in said, said


# ---------------------------------------------------------------- uvicorn's loggers


@pytest.fixture
def logging_state() -> Iterator[None]:
    """Put back what :func:`configure_service` changes process-wide."""
    root, access = logging.getLogger(), logging.getLogger("uvicorn.access")
    saved = (root.handlers[:], root.level, access.handlers[:], access.propagate)
    try:
        yield
    finally:
        root.handlers, access.handlers, access.propagate = saved[0], saved[2], saved[3]
        root.setLevel(saved[1])
        logging.captureWarnings(False)
        threading.excepthook = threading.__excepthook__


@pytest.mark.usefixtures("logging_state")
def test_uvicorn_default_handlers_give_way_to_the_service_format() -> None:
    import uvicorn.logging

    default = logging.StreamHandler()
    default.setFormatter(uvicorn.logging.DefaultFormatter("%(levelprefix)s %(message)s"))
    access = logging.getLogger("uvicorn.access")
    access.handlers, access.propagate = [default], False
    configure_service("json", "INFO")
    assert access.handlers == [] and access.propagate
    root = logging.getLogger()
    assert len([h for h in root.handlers if isinstance(h.formatter, JsonFormatter)]) == 1


@pytest.mark.usefixtures("logging_state")
def test_a_log_config_of_yours_is_kept() -> None:
    mine = logging.StreamHandler()
    mine.setFormatter(logging.Formatter("%(message)s"))
    access = logging.getLogger("uvicorn.access")
    access.handlers, access.propagate = [mine], False
    configure_service("text", "INFO")
    assert access.handlers == [mine] and not access.propagate
