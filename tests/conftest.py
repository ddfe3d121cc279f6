"""Fixtures shared by all tests: a real Mosquitto broker and an isolated memory broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from aggregator.localnet import MissingProgram, MosquittoBroker
from edge_agent.transports import drop_broker


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """A running Mosquitto on a free 127.0.0.1 port; ``.url``, ``.port``, ``.stop()``,
    ``.start()`` (restarts on the same port, persistent sessions kept)."""
    try:
        broker = MosquittoBroker(tmp_path / "mosquitto", options={"log_type": "all"})
    except MissingProgram as exc:
        pytest.skip(str(exc))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def memory_url() -> Iterator[str]:
    """``memory://<unique name>``: a fresh in-process broker, forgotten after the test."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    try:
        yield f"memory://{name}"
    finally:
        drop_broker(name)
