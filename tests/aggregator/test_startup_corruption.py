"""Start-up never loops on corrupt state (issue 13, finding 4).

Every byte of a small newest checkpoint is flipped (one bit, or all bits) and the
recovery that ``aggregator serve`` runs at start either recovers the exact state (from the
previous checkpoint plus the journal, or from the flipped file when the flip hit a byte
nothing reads) or raises :class:`CheckpointError` with one line naming the file, never
another exception (which under systemd is a restart loop). A corrupt ``history.sqlite`` is
refused the same way, and the documented rebuild (move it aside) starts again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.service.store import (
    CHECKPOINT,
    CHECKPOINT_PREV,
    HISTORY_DB,
    CheckpointError,
    JournalEntry,
    Store,
    recover,
)
from edge_agent.numerics.compressors import Update
from edge_agent.protocol import messages, topics, wire

pytestmark = pytest.mark.reliability

JOB = "flip"
D = 4
CONFIG = EngineConfig(job=JOB, d=D, step_size=0.5, round_deadline_s=10.0)


def _hello(agent: str) -> tuple[str, bytes]:
    hello = messages.Hello(
        job=JOB, agent=agent, d=D, rows=10, smoothness=2.0, model="logreg", compressor="topk"
    )
    return topics.hello(JOB, agent), messages.dump(hello)


def _update(agent: str, version: int, value: float) -> tuple[str, bytes]:
    u = Update("topk", D, np.array([version % D]), np.array([value], dtype=np.float32))
    return topics.update(JOB, agent), wire.encode(u, job=JOB, agent=agent, round=version, seq=0)


def _run(store: Store, rounds: int) -> RoundEngine:
    """A two-agent job: every version is journalled, then checkpointed (as the service);
    ``rounds`` versions."""
    eng = RoundEngine(CONFIG)
    inputs = [_hello("a"), _hello("b")]
    for v in range(rounds):
        inputs += [_update("a", v, 0.25 + v), _update("b", v, -0.5)]
    for now, (topic, payload) in enumerate(inputs):
        eff = eng.handle(topic, payload, float(now))
        assert eff.reason is None
        hwm = store.append_journal([JournalEntry("msg", float(now), topic, payload)])
        if eff.committed is not None:
            store.write_checkpoint(eng.export(), hwm)
    return eng


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RoundEngine]:
    data = tmp_path_factory.mktemp("pristine")
    store = Store(data)
    eng = _run(store, rounds=3)
    store.close()
    assert (data / CHECKPOINT_PREV).exists()
    return data, eng


def _start(data: Path) -> RoundEngine:
    """What the service's start does with ``data`` (the engine, or CheckpointError)."""
    store = Store(data)
    try:
        return recover(store, CONFIG).engine
    finally:
        store.close()


def _recover_or_load(store: Store, *, full: bool) -> RoundEngine:
    """The whole start-up recovery, or (faster) its part that reads the files: load the
    newest valid checkpoint and rebuild the engine from it."""
    if full:
        eng = recover(store, CONFIG).engine
        assert eng.version == 3  # the previous checkpoint + the journal: the live state
        return eng
    loaded = store.load_checkpoint()
    assert loaded is not None
    return RoundEngine.restore(CONFIG, loaded.snapshot)


@pytest.mark.slow  # every byte of a checkpoint, flipped: about 18 s
def test_every_byte_flip_of_the_newest_checkpoint_starts_or_refuses_in_one_line(
    pristine: tuple[Path, RoundEngine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, live = pristine
    blob = (source / CHECKPOINT).read_bytes()
    prev = (source / CHECKPOINT_PREV).read_bytes()
    assert len(blob) >= 2000  # one flip per byte: more than 2,000 cases
    monkeypatch.setattr("os.fsync", lambda fd: None)  # durability is not under test here
    data = tmp_path / "data"
    shutil.copytree(source, data)
    store = Store(data)  # one store: recovery rewrites only the two checkpoint files
    outcomes = {"recovered": 0, "refused": 0}
    cases = 0
    try:
        for pos in range(len(blob)):
            for mask in (0xFF if pos % 2 else 1 << (pos // 2 % 8),):  # all bits, or one
                flipped = bytearray(blob)
                flipped[pos] ^= mask
                (data / CHECKPOINT).write_bytes(bytes(flipped))
                (data / CHECKPOINT_PREV).write_bytes(prev)
                cases += 1
                try:
                    eng = _recover_or_load(store, full=cases % 16 == 0)
                except CheckpointError as exc:
                    text = str(exc)
                    assert "\n" not in text and CHECKPOINT in text, text
                    outcomes["refused"] += 1
                else:
                    assert eng.version in (live.version, live.version - 1), pos
                    if eng.version == live.version:  # else: the previous checkpoint's state
                        assert np.array_equal(eng.x, live.x), pos
                    outcomes["recovered"] += 1
    finally:
        store.close()
    assert cases >= 2000
    # the previous checkpoint is intact, so every flip starts (never refuses)
    assert outcomes == {"recovered": cases, "refused": 0}


def test_with_both_checkpoints_corrupt_it_refuses_in_one_line(
    pristine: tuple[Path, RoundEngine], tmp_path: Path
) -> None:
    data = tmp_path / "both"
    shutil.copytree(pristine[0], data)
    for name in (CHECKPOINT, CHECKPOINT_PREV):
        blob = bytearray((data / name).read_bytes())
        blob[len(blob) // 2 :] = bytes(len(blob) - len(blob) // 2)
        (data / name).write_bytes(bytes(blob))
    with pytest.raises(CheckpointError) as err:
        _start(data)
    text = str(err.value)
    assert "\n" not in text and "no valid checkpoint" in text and "aside" in text


def test_a_corrupt_history_database_is_refused_with_the_fix_and_the_rebuild_works(
    pristine: tuple[Path, RoundEngine], tmp_path: Path
) -> None:
    data = tmp_path / "db"
    shutil.copytree(pristine[0], data)
    db = data / HISTORY_DB
    raw = bytearray(db.read_bytes())
    raw[:100] = bytes(100)  # the SQLite header
    db.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError) as err:
        Store(data)
    text = str(err.value)
    assert "\n" not in text and HISTORY_DB in text and "move it aside" in text
    # the documented rebuild: move it aside, start again from the checkpoint
    db.rename(data / f"{HISTORY_DB}.corrupt")
    eng = _start(data)
    assert eng.version == pristine[1].version and np.array_equal(eng.x, pristine[1].x)
