"""AggregatorService's batch path (``_process``, what the ingest thread runs per batch):
batch decoding, journal + history in one transaction, then the checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.engine.downlink.outbound import merge_deltas
from aggregator.engine.rounds import RoundEngine
from aggregator.service.ingest import AggregatorService
from aggregator.service.settings import Settings, load_settings
from aggregator.service.store import Store, recover
from edge_agent.agent.replica import Replica
from edge_agent.numerics.compressors import Update, compress
from edge_agent.protocol import messages, topics, wire
from edge_agent.protocol.downlink import StateSnapshot, decode_downlink
from edge_agent.transports import Message

JOB = "svc"


def batch_service(data_dir: Path, **overrides: Any) -> tuple[AggregatorService, Store, Settings]:
    """A service in async mode whose ``_process`` the test calls itself, as the ingest
    thread does (started once to recover and connect, then its thread stopped)."""
    fields: dict[str, Any] = {
        "job": JOB, "mode": "async", "max_staleness": 4, "dedupe_window": 64,
        "step_size": 0.1, "transports": [f"memory://{data_dir.name}"], "data_dir": data_dir,
        "feedback": "any",
    }  # fmt: skip
    fields.update(overrides)
    settings = load_settings(**fields)
    svc = AggregatorService(settings, clock=lambda: 5.0)
    svc.start()
    svc.stop()
    svc._store = store = Store(data_dir)
    return svc, store, settings


def hello(agent: str, d: int, compressor: str = "topk") -> Message:
    msg = messages.Hello(
        job=JOB, agent=agent, d=d, rows=10, smoothness=2.0, model="logreg", compressor=compressor
    )
    return Message(topics.hello(JOB, agent), messages.dump(msg))


# ---------------------------------------------------------------- batch decoding


def _mixed_batch(rng: np.random.Generator, d: int) -> list[Message]:
    """Valid updates with mixed T, and hostile ones among them."""
    out: list[Message] = []
    for seq in range(30):
        agent = f"a{seq}"  # one update per agent: async takes one per agent and version
        t = int(rng.integers(1, 40)) if seq % 2 else 12  # repeated T, and singletons
        blob = wire.encode(compress(rng.standard_normal(d), "topk", t), job=JOB, agent=agent,
                           round=0, seq=seq)  # fmt: skip
        if seq % 7 == 3:  # a flipped bit in the index block
            b = bytearray(blob)
            b[len(b) - 4 * t - 2] ^= 0x10
            blob = bytes(b)
        if seq % 11 == 5:  # truncated
            blob = blob[:-3]
        out.append(Message(topics.update(JOB, agent), blob))
    out.append(Message(topics.update(JOB, "a1"), out[0].payload))  # wrong agent's topic
    out.append(Message(topics.update(JOB, "a0"), out[0].payload))  # a duplicate
    out.append(Message(topics.update(JOB, "a2"), b"\xca\x7e\x01"))  # garbage
    out.append(Message(f"cat/{JOB}/nonsense/a0", out[2].payload))  # not an agent topic
    return out


def test_batch_path_matches_the_engine_fed_one_message_at_a_time(tmp_path: Path) -> None:
    d = 300
    svc, store, settings = batch_service(tmp_path / "batch", d=d, async_apply_every=4,
                                         min_agents=3)  # fmt: skip
    ref = RoundEngine(settings.engine_config())
    hellos = [hello(f"a{i}", d) for i in range(30)]
    batch = _mixed_batch(np.random.default_rng(3), d)
    svc._process([*hellos])  # fresh lists: _process takes list[Message | _Command]
    svc._process([*batch])
    for m in [*hellos, *batch]:
        ref.handle(m.topic, m.payload, 5.0)
    got = svc.read(lambda e: (e.version, e.accepted, dict(e.rejected), e.x.tobytes()))
    assert got == (ref.version, ref.accepted, dict(ref.rejected), ref.x.tobytes())
    assert ref.rejected["malformed"] >= 4 and ref.rejected["duplicate"] == 1
    assert ref.rejected["agent_mismatch"] == 1 and ref.rejected["unexpected_topic"] == 1
    assert ref.version >= 4
    assert [r.version for r in store.history()] == list(range(1, ref.version + 1))
    store.close()


# ---------------------------------------------------------------- crash around a checkpoint


class _Crash(BaseException):
    """Stands for the process dying at this point (nothing after it runs)."""


def _crash_run(data_dir: Path, *, crash_at: int | None = None, after_write: bool = False) -> Any:
    """Three batches of 8 dense updates (async K=2: 4 versions each); optionally "die"
    just before (or just after) the n-th checkpoint write; recover; return the history."""
    d = 8
    svc, store, settings = batch_service(data_dir, d=d, async_apply_every=2, min_agents=2)
    writes = 0
    real_write = store.write_checkpoint

    def write_checkpoint(snap: Any, journal_hwm: int) -> None:
        nonlocal writes
        writes += 1
        if writes == crash_at and not after_write:
            raise _Crash
        real_write(snap, journal_hwm)
        if writes == crash_at:
            raise _Crash

    store.write_checkpoint = write_checkpoint  # type: ignore[method-assign]
    svc._process([hello("a", d, "dense"), hello("b", d, "dense")])
    try:
        for batch in range(3):
            msgs = []
            for seq in range(4):
                version = svc.read(lambda e: e.version) + seq
                for agent, value in (("a", 1.0), ("b", -0.5)):
                    u = Update("dense", d, None, np.full(d, value + batch + seq, np.float32))
                    blob = wire.encode(u, job=JOB, agent=agent, round=version, seq=batch * 4 + seq)
                    msgs.append(Message(topics.update(JOB, agent), blob))
            svc._process([*msgs])
    except _Crash:
        pass
    store.close()
    fresh = Store(data_dir)
    try:
        engine = recover(fresh, settings.engine_config()).engine
        assert engine.version == (12 if crash_at is None else 4 * crash_at)
        assert fresh.max_version() == engine.version
        return [(r.version, r.participants, r.spend.actual.bytes) for r in fresh.history()]
    finally:
        fresh.close()


@pytest.mark.parametrize("after_write", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("crash_at", [2, 3])
def test_history_has_every_version_when_the_process_dies_around_a_checkpoint(
    tmp_path: Path, crash_at: int, after_write: bool
) -> None:
    """A batch commits 4 versions; the process dies just before or just after writing its
    checkpoint. The journal and those versions' history rows were written in one
    transaction before it, so recovery (checkpoint + replay) ends with exactly the history
    of a clean run: no version missing (a crash right after the checkpoint used to lose
    the rows of all but the last version of the batch), none doubled."""
    clean = _crash_run(tmp_path / "clean")
    assert [v for v, _, _ in clean] == list(range(1, 13))
    crashed = _crash_run(tmp_path / "crashed", crash_at=crash_at, after_write=after_write)
    assert crashed == clean[: 4 * crash_at]


# ---------------------------------------------------------------- merged deltas


def _apply_all(x: np.ndarray, version: int, outbound: list[Any]) -> tuple[np.ndarray, int, int]:
    """Apply every delta/snapshot as an agent does; return (x, version, deltas applied)."""
    replica = Replica(x.size, "mean")
    assert replica.apply(wire.Snapshot(JOB, version, x.copy())) is None
    applied = 0
    for o in outbound:
        if o.topic not in (topics.delta(JOB), topics.model(JOB)):
            continue
        m = decode_downlink(o.payload)
        if not isinstance(m, wire.Snapshot | StateSnapshot):
            assert m.base_version == replica.version  # a chain: no agent would see a gap
            applied += 1
        assert replica.apply(m) is None
    assert replica.x is not None and replica.version is not None
    return replica.x, replica.version, applied


@pytest.mark.parametrize("downlink", ["delta", "exact"])
def test_a_batch_of_versions_is_broadcast_as_one_message_with_the_same_bits(downlink: str) -> None:
    d = 64
    eng = RoundEngine(load_settings(job=JOB, d=d, mode="async", async_apply_every=2, feedback="any",
                                    max_staleness=64, dedupe_window=64, min_agents=2,
                                    step_size=0.3, snapshot_every=7,
                                    downlink=downlink).engine_config())  # fmt: skip
    rng = np.random.default_rng(5)
    outbound: list[Any] = []
    for m in (hello("a", d), hello("b", d)):
        outbound.extend(eng.handle(m.topic, m.payload, 0.0).outbound)
    x0, v0, _ = _apply_all(np.zeros(d), 0, outbound)
    batch: list[Any] = []
    for seq in range(40):
        agent = "ab"[seq % 2]
        u = compress(rng.standard_normal(d), "topk", int(rng.integers(1, 12)))
        blob = wire.encode(u, job=JOB, agent=agent, round=eng.version, seq=seq)
        batch.extend(eng.handle(topics.update(JOB, agent), blob, 1.0).outbound)
        if seq == 17:  # something else in the middle of the batch: a rejoin (snapshot)
            late = hello("c", d)
            batch.extend(eng.handle(late.topic, late.payload, 1.0).outbound)
    merged = merge_deltas(batch)
    x1, v1, n1 = _apply_all(x0, v0, batch)
    x2, v2, n2 = _apply_all(x0, v0, merged)
    assert v1 == v2 == eng.version == 20
    assert x1.tobytes() == x2.tobytes() == eng.x.tobytes()
    # runs are broken only by the snapshots (every 7) and the hello (and, for exact, where
    # a version goes as a delta because that is smaller than its steps)
    assert n1 == 20 and (n2 < 6 if downlink == "delta" else n2 < 12)
    kinds = [o.topic.rsplit("/", 1)[-1] for o in merged]
    assert kinds.count("delta") == n2 and kinds[-1] in ("delta", "model")
    # other messages keep their order
    assert [o.payload for o in merged if o.delta is None and o.steps is None] == [
        o.payload for o in batch if o.delta is None and o.steps is None
    ]


def test_only_small_updates_within_the_byte_budget_are_decoded_as_a_batch() -> None:
    """Batch decoding keeps every decoded array of the batch alive at once: it takes small
    updates up to a byte budget and leaves the rest to the engine, one at a time."""
    from aggregator.service import ingest as service

    d = 100_000
    rng = np.random.default_rng(1)
    small = wire.encode(compress(rng.standard_normal(d), "topk", 50), job=JOB, agent="a",
                        round=0, seq=0)  # fmt: skip
    dense = wire.encode(compress(rng.standard_normal(d), "dense", d), job=JOB, agent="a",
                        round=0, seq=1)  # fmt: skip
    assert len(small) < 1000 and len(dense) > service.BATCH_DECODE_MAX_BYTES
    topic = topics.update(JOB, "a")
    n_small = service.BATCH_DECODE_BUDGET_BYTES // len(small) + 10
    batch: list[Any] = [Message(topic, dense), *[Message(topic, small)] * n_small]
    batch.append(Message(topics.hello(JOB, "a"), small))  # not an update topic
    out = service._decode_updates(batch)
    assert out[0] is None and out[-1] is None  # the large one, the hello
    decoded = [r for r in out[1:-1] if r is not None]
    assert n_small - 11 <= len(decoded) < n_small  # the budget, not more
    header, update = decoded[0]  # type: ignore[misc]
    assert header.seq == 0 and update.t == 50
