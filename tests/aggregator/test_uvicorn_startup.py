"""``uvicorn aggregator.app:app`` as the README and systemd run it (issue 12, finding 6):
start-up errors are ONE log line naming what to fix with exit 2 (1 when the broker may come
back), nothing is written before the settings are valid, and the service's INFO lines come
in the format of AGG_LOG_FORMAT (text: time level logger; json: one object per line)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aggregator.localnet import ServiceProcess, free_port, free_port_pair, service_env
from aggregator.service.store import CHECKPOINT

TEXT_LINE = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) [\w.]+: "


def _uvicorn(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run uvicorn until it exits (start-up fails) and return its output."""
    cmd = [sys.executable, "-m", "uvicorn", "aggregator.app:app", "--port", str(free_port())]
    full = service_env({"AGG_DATA_DIR": str(tmp_path / "data"), **env})
    return subprocess.run(
        cmd, env=full, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )


def _one_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert " ERROR aggregator.web.startup: cannot start: " in lines[0]
    return lines[0]


def test_a_missing_required_setting_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = _uvicorn(tmp_path)
    assert proc.returncode == 2
    assert "AGG_D: is required" in _one_error(proc)
    assert not (tmp_path / "data").exists()


def test_an_unknown_transport_scheme_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    proc = _uvicorn(tmp_path, AGG_D="3", AGG_TRANSPORTS="http://x:1")
    assert proc.returncode == 2
    line = _one_error(proc)
    assert "AGG_TRANSPORTS" in line and "'http'" in line and "zmq+tcp" in line
    assert not (tmp_path / "data").exists()


def test_a_bad_log_format_names_its_variable(tmp_path: Path) -> None:
    proc = _uvicorn(tmp_path, AGG_D="3", AGG_LOG_FORMAT="xml")
    assert proc.returncode == 2
    assert "AGG_LOG_FORMAT='xml'" in _one_error(proc)
    assert not (tmp_path / "data").exists()


def test_a_data_directory_that_cannot_be_made_names_its_variable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    data = tmp_path / "file" / "data"
    proc = _uvicorn(tmp_path, AGG_D="3", AGG_DATA_DIR=str(data))
    assert proc.returncode == 2
    line = _one_error(proc)
    assert str(tmp_path / "file") in line and f"AGG_DATA_DIR={data}" in line


def test_a_broker_that_is_down_is_one_line_and_exit_1_so_systemd_retries(
    tmp_path: Path,
) -> None:
    url = f"mqtt://127.0.0.1:{free_port()}?timeout_s=1"  # nobody listens there
    proc = _uvicorn(tmp_path, AGG_D="3", AGG_TRANSPORTS=url)
    assert proc.returncode == 1
    assert "cannot connect to MQTT broker" in _one_error(proc)


def test_a_corrupt_checkpoint_ends_in_one_line_naming_the_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / CHECKPOINT).write_bytes(os.urandom(300))
    proc = _uvicorn(tmp_path, AGG_D="3", AGG_TRANSPORTS=f"zmq+tcp://127.0.0.1:{free_port_pair()}")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.splitlines()[-1]  # the store logs first which file it kept aside
    assert " ERROR aggregator.web.startup: cannot start: no valid checkpoint: " in last
    assert str(data / CHECKPOINT) in last and "AGG_DATA_DIR" in last


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_service_logs_its_info_lines_under_uvicorn(tmp_path: Path, fmt: str) -> None:
    settings = {
        "AGG_D": "3",
        "AGG_DATA_DIR": str(tmp_path / "data"),
        "AGG_TRANSPORTS": f"zmq+tcp://127.0.0.1:{free_port_pair()}",
        "AGG_LOG_FORMAT": fmt,
    }
    service = ServiceProcess(tmp_path, settings)
    lines: list[str] = []
    try:
        for _ in range(2):  # a start, and a restart that recovers the job
            service.start()
            service.stop()
            lines += service.log_path.read_text().splitlines()
    finally:
        service.close()
    if fmt == "json":
        records = [json.loads(line) for line in lines]
        assert all(set(r) == {"time", "level", "logger", "message"} for r in records)
        said = [f"{r['level']} {r['logger']}: {r['message']}" for r in records]
    else:
        assert all(re.match(TEXT_LINE, line) for line in lines), lines
        said = [line.split(" ", 2)[2] for line in lines]  # without the date and time
    serving = "INFO aggregator.service.ingest: aggregator for job cat serving zmq+tcp://127.0.0.1:"
    assert len([s for s in said if s.startswith(serving)]) == 2, said
    assert any(s.startswith("INFO aggregator.service.store: recovered job cat") for s in said), said
