"""Journal, atomic checkpoints, history and crash recovery (aggregator.service.store)."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.service.store import (
    CHECKPOINT,
    CHECKPOINT_PREV,
    CheckpointError,
    JournalEntry,
    Store,
    decode_checkpoint,
    encode_checkpoint,
    recover,
)
from edge_agent.numerics.compressors import Update
from edge_agent.protocol import messages, topics, wire

JOB = "job1"
D = 8
CONFIG = EngineConfig(job=JOB, d=D, step_size=0.5)


def hello(agent: str, semantics: str = "ef21") -> tuple[str, bytes]:
    msg = messages.Hello(
        job=JOB, agent=agent, d=D, rows=5, smoothness=1.0, model="logreg",
        compressor="dense", semantics=semantics,  # type: ignore[arg-type]
    )  # fmt: skip
    return topics.hello(JOB, agent), messages.dump(msg)


def update(agent: str, value: float, *, round: int, seq: int) -> tuple[str, bytes]:
    u = Update("dense", D, None, np.full(D, value, dtype=np.float32), semantics="ef21")
    return topics.update(JOB, agent), wire.encode(u, job=JOB, agent=agent, round=round, seq=seq)


class Harness:
    """What the service does per input: apply, journal, checkpoint on a new version."""

    def __init__(self, store: Store, engine: RoundEngine) -> None:
        self.store = store
        self.engine = engine

    def feed(self, topic: str, payload: bytes, now: float, *, checkpoint: bool = True) -> Any:
        eff = self.engine.handle(topic, payload, now)
        if eff.journal:
            hwm = self.store.append_journal([JournalEntry("msg", now, topic, payload)])
            if eff.committed is not None and checkpoint:
                self.store.write_checkpoint(self.engine.export(), hwm)
                self.store.record_rounds([eff.committed], agents=self.engine.agents.values())
        return eff


def run_two_rounds(h: Harness) -> None:
    h.feed(*hello("a"), 0.0)
    h.feed(*hello("b"), 0.0)
    h.feed(*update("a", 1.0, round=0, seq=0), 1.0)
    h.feed(*update("b", 2.0, round=0, seq=0), 1.0)
    h.feed(*update("a", 3.0, round=1, seq=1), 2.0)
    h.feed(*update("b", 4.0, round=1, seq=1), 2.0)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "data")


def test_checkpoint_bytes_round_trip() -> None:
    eng = RoundEngine(CONFIG)
    eng.handle(*hello("a"), 0.0)
    eng.handle(*update("a", 1.5, round=0, seq=0), 1.0)
    snap, hwm = decode_checkpoint(encode_checkpoint(eng.export(), 42))
    restored = RoundEngine.restore(CONFIG, snap)
    assert hwm == 42
    assert restored.x.tobytes() == eng.x.tobytes()
    assert restored.version == eng.version == 1
    assert np.array_equal(restored.h["a"], eng.h["a"])
    assert restored.export().meta == eng.export().meta


def test_write_then_load_checkpoint(store: Store) -> None:
    eng = RoundEngine(CONFIG, x0=np.arange(D, dtype=np.float64))
    store.write_checkpoint(eng.export(), 7)
    loaded = store.load_checkpoint()
    assert loaded is not None and loaded.source == CHECKPOINT and loaded.journal_hwm == 7
    assert np.array_equal(loaded.snapshot.x, np.arange(D))


def test_leftover_temp_file_from_a_crash_is_ignored(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = Store(data)
    first.write_checkpoint(RoundEngine(CONFIG, x0=np.ones(D)).export(), 1)
    (data / ".checkpoint-crashed.npz").write_bytes(b"PK\x03\x04 half a zip")
    second = Store(data)
    loaded = second.load_checkpoint()
    assert loaded is not None and np.array_equal(loaded.snapshot.x, np.ones(D))
    assert not list(data.glob(".checkpoint-*"))


def test_corrupt_checkpoint_falls_back_to_previous(store: Store) -> None:
    store.write_checkpoint(RoundEngine(CONFIG, x0=np.ones(D)).export(), 1)
    store.write_checkpoint(RoundEngine(CONFIG, x0=np.full(D, 2.0)).export(), 2)
    path = store.dir / CHECKPOINT
    blob = bytearray(path.read_bytes())
    # a byte of the model's own data (the middle of the file may be a zip header field the
    # reader ignores, as it was once the checkpoint grew)
    with zipfile.ZipFile(io.BytesIO(bytes(blob))) as z:
        member = z.getinfo("x.npy")
    name_len, extra_len = struct.unpack_from("<HH", blob, member.header_offset + 26)
    data_at = member.header_offset + 30 + name_len + extra_len
    blob[data_at + member.compress_size - 1] ^= 0xFF
    path.write_bytes(bytes(blob))
    loaded = Store(store.dir).load_checkpoint()
    assert loaded is not None and loaded.source == CHECKPOINT_PREV
    assert np.array_equal(loaded.snapshot.x, np.ones(D))
    assert (store.dir / (CHECKPOINT + ".corrupt")).exists()


def test_truncated_checkpoint_with_no_previous_refuses_to_start(store: Store) -> None:
    store.write_checkpoint(RoundEngine(CONFIG).export(), 1)
    path = store.dir / CHECKPOINT
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        Store(store.dir).load_checkpoint()


def test_restart_resumes_from_checkpoint(store: Store) -> None:
    h = Harness(store, RoundEngine(CONFIG))
    run_two_rounds(h)
    rec = recover(Store(store.dir), CONFIG)
    assert rec.engine.version == 2
    assert rec.engine.x.tobytes() == h.engine.x.tobytes()
    assert np.array_equal(rec.engine.sum_h, h.engine.sum_h)  # type: ignore[arg-type]


def test_redelivered_update_after_restart_is_not_applied_twice(store: Store) -> None:
    h = Harness(store, RoundEngine(CONFIG))
    run_two_rounds(h)
    eng = recover(Store(store.dir), CONFIG).engine
    eff = eng.handle(*update("b", 4.0, round=1, seq=1), 3.0)
    assert eff.reason == "duplicate"
    assert np.array_equal(eng.h["b"], np.full(D, 2.0 + 4.0))


def test_crash_between_journal_and_checkpoint_replays_the_round(store: Store) -> None:
    h = Harness(store, RoundEngine(CONFIG))
    h.feed(*hello("a"), 0.0)
    h.feed(*hello("b"), 0.0)
    h.feed(*update("a", 1.0, round=0, seq=0), 1.0)
    h.feed(*update("b", 2.0, round=0, seq=0), 1.0, checkpoint=False)  # crash before checkpoint
    assert h.engine.version == 1
    rec = recover(Store(store.dir), CONFIG)
    assert rec.engine.version == 1 and rec.replayed == 4
    assert rec.engine.x.tobytes() == h.engine.x.tobytes()
    assert [r.version for r in Store(store.dir).history()] == [1]


def test_recovery_from_previous_checkpoint_replays_journal_exactly(store: Store) -> None:
    h = Harness(store, RoundEngine(CONFIG))
    run_two_rounds(h)
    path = store.dir / CHECKPOINT
    path.write_bytes(b"garbage")
    rec = recover(Store(store.dir), CONFIG)
    assert rec.source == CHECKPOINT_PREV
    assert rec.engine.version == 2
    assert rec.engine.x.tobytes() == h.engine.x.tobytes()


def test_history_beyond_recovered_version_is_deleted(store: Store) -> None:
    h = Harness(store, RoundEngine(CONFIG))
    run_two_rounds(h)
    stray = h.engine.last_record
    assert stray is not None
    from dataclasses import replace

    store.record_rounds([replace(stray, version=9, base_version=8)])
    recover(Store(store.dir), CONFIG)
    assert [r.version for r in Store(store.dir).history()] == [1, 2]


def test_history_since_returns_later_rounds(store: Store) -> None:
    run_two_rounds(Harness(store, RoundEngine(CONFIG)))
    rows = store.history(since=1)
    assert [r.version for r in rows] == [2]
    assert rows[0].participants == ("a", "b")
    assert rows[0].spend.actual.bytes > 0


def test_history_without_checkpoint_refuses_to_start(store: Store) -> None:
    run_two_rounds(Harness(store, RoundEngine(CONFIG)))
    (store.dir / CHECKPOINT).unlink()
    (store.dir / CHECKPOINT_PREV).unlink()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        recover(Store(store.dir), CONFIG)


def test_checkpoint_of_another_job_is_refused(store: Store) -> None:
    run_two_rounds(Harness(store, RoundEngine(CONFIG)))
    with pytest.raises(CheckpointError, match="job"):
        recover(Store(store.dir), EngineConfig(job="other", d=D))


# ---------------------------------------------------------------- compact checkpoint format


def _mid_round_plain_engine() -> RoundEngine:
    eng = RoundEngine(CONFIG)
    eng.handle(*hello("a", "plain"), 0.0)
    eng.handle(*hello("b", "plain"), 0.0)
    g = np.zeros(D, dtype=np.float32)
    g[[1, 5]] = [0.25, -3.0]
    u = Update("dense", D, None, g)  # the job's compressor (hello); two nonzeros
    eng.handle(topics.update(JOB, "a"), wire.encode(u, job=JOB, agent="a", round=0, seq=0), 1.0)
    assert eng.version == 0 and eng.export().acc.any()  # b has not reported: round open
    return eng


def test_checkpoint_stores_the_open_rounds_accumulator_sparsely_and_restores_it() -> None:
    eng = _mid_round_plain_engine()
    blob = encode_checkpoint(eng.export(), 3)
    with np.load(__import__("io").BytesIO(blob)) as z:
        assert "acc" not in z.files
        assert z["acc_index"].tolist() == [1, 5] and z["seen"].dtype == np.int32
    snap, hwm = decode_checkpoint(blob)
    assert hwm == 3 and snap.acc.tobytes() == eng.export().acc.tobytes()
    assert snap.seen.dtype == np.int64 and snap.seen.tolist() == eng.export().seen.tolist()


def test_checkpoint_written_with_a_dense_accumulator_still_loads() -> None:
    """Files from before the sparse format (member "acc") are read as they were."""
    import io
    import json

    from aggregator.service.store import _digest

    eng = _mid_round_plain_engine()
    snap = eng.export()
    meta = json.dumps(
        {"engine": snap.meta, "h_agents": list(snap.h_agents), "journal_hwm": 4}, sort_keys=True
    ).encode()
    # typed Any: savez's own keyword (allow_pickle: bool) would clash with **arrays
    arrays: dict[str, Any] = {
        "x": snap.x,
        "acc": snap.acc,
        "h": snap.h,
        "sum_h": snap.sum_h,
        "seen": snap.seen,
    }
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(meta, np.uint8),
             digest=np.frombuffer(_digest(arrays, meta).encode(), np.uint8), **arrays)  # fmt: skip
    old, hwm = decode_checkpoint(buf.getvalue())
    assert hwm == 4 and old.acc.tobytes() == snap.acc.tobytes()
    restored = RoundEngine.restore(CONFIG, old)
    assert restored.export().acc.tobytes() == snap.acc.tobytes()


@pytest.mark.parametrize("index", [[5, 1], [1, D], [-1, 2]], ids=["unsorted", "beyond", "negative"])
def test_checkpoint_with_a_bad_accumulator_index_is_refused(index: list[int]) -> None:
    import io
    import json

    from aggregator.service.store import _digest

    snap = _mid_round_plain_engine().export()
    meta = json.dumps({"engine": snap.meta, "h_agents": [], "journal_hwm": 1}).encode()
    arrays: dict[str, Any] = {"x": snap.x, "acc_index": np.array(index, np.int64), "acc_value": np.ones(2),
              "h": snap.h, "sum_h": snap.sum_h, "seen": snap.seen}  # fmt: skip
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(meta, np.uint8),
             digest=np.frombuffer(_digest(arrays, meta).encode(), np.uint8), **arrays)  # fmt: skip
    with pytest.raises(ValueError, match="acc_index"):
        decode_checkpoint(buf.getvalue())
