"""Bounded disk: the journal is compacted while no version commits, status messages that
change nothing are not journalled, and the replay still rebuilds the live state exactly."""

from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.engine.registry import REFRESH_FRACTION
from aggregator.engine.rounds import Effects, RoundEngine
from aggregator.service.ingest import AggregatorService, _Command
from aggregator.service.settings import Settings, load_settings
from aggregator.service.store import CHECKPOINT, CHECKPOINT_PREV, Store, recover
from edge_agent.protocol import messages, topics
from edge_agent.transports import Message

JOB = "bound"
D = 16
TIMEOUT_S = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def paused_service(
    data_dir: Path, **store_limits: int
) -> tuple[AggregatorService, Store, Settings, Clock]:
    """A service whose ``_process`` the test calls itself (as the ingest thread does), with
    the store's journal limits given, one agent registered and the job paused."""
    settings = load_settings(
        job=JOB, d=D, step_size=0.1, min_agents=1, liveness_timeout_s=TIMEOUT_S,
        transports=[f"memory://{data_dir.name}"], data_dir=data_dir, feedback="any",
    )  # fmt: skip
    clock = Clock()
    svc = AggregatorService(settings, clock=clock)
    svc.start()
    svc.stop()
    svc._store = store = Store(data_dir, **store_limits)
    hello = messages.Hello(
        job=JOB, agent="a", d=D, rows=10, smoothness=2.0, model="logreg", compressor="dense"
    )
    svc._process([Message(topics.hello(JOB, "a"), messages.dump(hello))])
    fut: Future[Effects] = Future()
    svc._process([_Command("pause", fut)])
    assert fut.result(timeout=1).changed and svc.read(lambda e: e.state) == "paused"
    return svc, store, settings, clock


def status(state: str) -> Message:
    return Message(topics.status(JOB, "a"), messages.dump(messages.Status(state=state)))  # type: ignore[arg-type]


def _state(snap: Any) -> tuple[str, list[bytes]]:
    """An export as comparable bytes, without the downlink accounting (the service charges
    it when it publishes, which is not an input the journal replays) and without each
    agent's ``sent`` account (it counts every message, also those not journalled: a
    repeated status, requests, refusals)."""
    meta = json.loads(json.dumps(snap.meta))
    meta.pop("totals_down")
    for agent in meta["agents"]:
        agent.pop("down")
        agent.pop("sent")
    arrays = [np.asarray(a).tobytes() for a in (snap.x, snap.acc, snap.h, snap.sum_h, snap.seen)]
    return json.dumps(meta, sort_keys=True), [*arrays, repr(snap.h_agents).encode()]


def assert_replay_exact(svc: AggregatorService, store: Store, settings: Settings) -> RoundEngine:
    """Recover from the disk state (checkpoint + journal) and compare with the live engine."""
    live = svc.read(lambda e: e.export())
    store.close()
    fresh = Store(settings.data_dir)
    try:
        engine = recover(fresh, settings.engine_config()).engine
    finally:
        fresh.close()
    assert _state(engine.export()) == _state(live)
    return engine


def test_a_repeated_status_is_not_journalled_and_the_replay_is_exact(tmp_path: Path) -> None:
    svc, store, settings, clock = paused_service(tmp_path / "data")
    rows_before = store.journal_size()[0]
    for _ in range(500):  # the same state, at the same time: changes nothing
        svc._process([status("online")])
    assert store.journal_size()[0] == rows_before
    # 50 s in steps of 1/8 s against a 10 s timeout: the agent stays live only because its
    # repeated "online" refreshes last_seen, once per REFRESH_FRACTION of the timeout
    for _ in range(400):
        clock.now += 0.125  # exact in binary: the refreshes fall on exact multiples
        svc._process([status("online")])
    refreshes = store.journal_size()[0] - rows_before
    assert refreshes == round(50 / (REFRESH_FRACTION * TIMEOUT_S))
    assert svc.read(lambda e: e.agents["a"].live)
    svc._process([status("offline")])  # a change is journalled
    svc._process([status("offline")])  # its repeat is not
    assert store.journal_size()[0] == rows_before + refreshes + 1
    engine = assert_replay_exact(svc, store, settings)
    assert engine.agents["a"].state == "offline" and engine.state == "paused"


def test_the_journal_is_compacted_by_rows_while_no_version_commits(tmp_path: Path) -> None:
    """Every status changes the state (online <-> offline), so every one is journalled;
    the job is paused, so no version commits: the journal stays within two windows."""
    limit, batch = 50, 7
    svc, store, settings, clock = paused_service(tmp_path / "data", journal_max_entries=limit)
    largest = 0
    for i in range(300):
        clock.now += 0.01
        svc._process([status("offline" if (i + k) % 2 else "online") for k in range(batch)])
        largest = max(largest, store.journal_size()[0])
    assert largest <= 2 * (limit + batch)
    assert (tmp_path / "data" / CHECKPOINT_PREV).exists()
    assert svc.read(lambda e: (e.state, e.version)) == ("paused", 0)
    assert_replay_exact(svc, store, settings)


def test_the_journal_is_compacted_by_bytes(tmp_path: Path) -> None:
    limit = 4000
    svc, store, settings, clock = paused_service(
        tmp_path / "data", journal_max_entries=10**9, journal_max_bytes=limit
    )
    one = len(status("offline").topic) + len(status("offline").payload) + 32
    largest = 0
    for i in range(1000):
        clock.now += 0.01
        svc._process([status("offline" if i % 2 else "online")])
        largest = max(largest, store.journal_size()[1])
    assert largest <= 2 * limit + one
    assert_replay_exact(svc, store, settings)


def test_falling_back_to_the_previous_checkpoint_after_compaction_replays_exactly(
    tmp_path: Path,
) -> None:
    """Compaction trims only up to the previous checkpoint's mark: a corrupt newest
    checkpoint falls back to ``.prev`` and still finds every journal row it needs."""
    svc, store, settings, clock = paused_service(tmp_path / "data", journal_max_entries=20)
    for i in range(130):
        clock.now += 0.01
        svc._process([status("offline" if i % 2 else "online")])
    newest = tmp_path / "data" / CHECKPOINT
    newest.write_bytes(newest.read_bytes()[:100])  # truncated: fails validation
    engine = assert_replay_exact(svc, store, settings)
    assert (tmp_path / "data" / f"{CHECKPOINT}.corrupt").exists()  # .prev was the one used
    assert engine.agents["a"].state == "offline"  # the last of 130 alternating statuses


def test_store_limits_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="journal_max_entries=0"):
        Store(tmp_path, journal_max_entries=0)
