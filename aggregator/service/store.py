"""Durable state: a journal, atomic checkpoints and the round history (SQLite, WAL mode).

Files in ``data_dir``:

``history.sqlite``
    tables ``rounds`` (one row per committed model version), ``agents`` (the registry, as
    JSON), ``rejections`` (counters by reason) and ``journal`` (every state-changing input
    the engine accepted since the previous checkpoint, in the order it was applied).
``checkpoint.npz`` / ``checkpoint.prev.npz``
    the engine state (:class:`~aggregator.engine.rounds.EngineSnapshot`) plus ``journal_hwm``, the
    id of the last journal row it includes. Written atomically: a temporary file in the same
    directory, fsync, rename the current one to ``.prev``, rename the new one in, fsync the
    directory. Every member is covered by a SHA-256 digest stored with it. The open round's
    accumulator is stored as its nonzeros (``acc_index``, ``acc_value``; files with a dense
    ``acc`` member are read too) and the de-duplication keys as int32 when they fit.

Recovery rule (the checkpoint plus the journal are authoritative):

1. load ``checkpoint.npz``; if it is missing or fails validation, load
   ``checkpoint.prev.npz`` (a corrupt file is reported, never loaded);
2. replay the journal rows after its ``journal_hwm`` (the engine is deterministic, so this
   rebuilds exactly the state that was live, including rounds that closed after the
   checkpoint was written — never applying one twice, never losing one). Besides inbound
   messages, ticks and controls, the journal holds each downlink charge of what the
   service published (it moves the agents' downlink accounts and the pacing that decides
   when the next version closes);
3. history rows beyond the recovered version are deleted; rows for rounds recovered by the
   replay are (re)written.

The journal is written *before* the checkpoint and before anything is published, in the
same transaction as the history rows of the versions those inputs committed (so no crash
can leave a version in a checkpoint without its history row), and it is trimmed only up
to the *previous* checkpoint's mark, so falling back to ``.prev`` still
finds every row it needs. Temporary files left by a crash are ignored and removed.

Bounded disk: a checkpoint captures the state, so the rows before it are only kept for
the fallback. When no version commits (a paused job, a flood of hellos or status
changes) the journal would grow with every input; :meth:`Store.journal_due` tells the
service to write a checkpoint once ``journal_max_entries`` rows or ``journal_max_bytes``
payload bytes were appended since the last one, which trims the journal to what the
fallback needs. So the journal never holds more than two windows (each at most the limit
plus one ingest batch), and the SQLite write-ahead log is truncated to
``WAL_SIZE_LIMIT`` after each of its checkpoints (docs/operating.md, Bounded disk).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import sqlite3
import tempfile
import threading
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple

import numpy as np

from aggregator.engine.accounting import AgentRound, ProfileLookup, RoundRecord, Spend
from aggregator.engine.rounds import (
    AgentInfo,
    Effects,
    EngineConfig,
    EngineSnapshot,
    Evaluator,
    RoundEngine,
)
from edge_agent.errors import CatEdgeError

log = logging.getLogger("aggregator.service.store")

CHECKPOINT: Final = "checkpoint.npz"
CHECKPOINT_PREV: Final = "checkpoint.prev.npz"
HISTORY_DB: Final = "history.sqlite"
_TMP_PREFIX: Final = ".checkpoint-"
_ARRAYS: Final = ("x", "acc", "h", "sum_h", "seen")
#: what a file holds instead of a dense ``acc``: the open round's accumulator is sparse
_STORED_ARRAYS: Final = ("x", "acc_index", "acc_value", "h", "sum_h", "seen")
#: journal rows appended since the last checkpoint that make the service write one
JOURNAL_MAX_ENTRIES: Final = 4096
#: journal payload bytes (topic + payload + a row's fixed overhead) that do the same
JOURNAL_MAX_BYTES: Final = 32 * 2**20
#: bytes one journal row costs besides its topic and payload (id, kind, now; an estimate)
_ROW_OVERHEAD: Final = 32
#: the size SQLite truncates the write-ahead log file to after a WAL checkpoint
WAL_SIZE_LIMIT: Final = 8 * 2**20

JournalKind = Literal["msg", "tick", "control", "charge"]


class CheckpointError(CatEdgeError):
    """The durable state cannot be loaded: no valid checkpoint although state exists, or a
    corrupt history database. One line naming the file and what to do."""


class JournalEntry(NamedTuple):
    """One state-changing input: an inbound message (``topic``/``payload``), a tick, an
    operator control (``topic`` holds the command), or the downlink charge of what the
    service published (``payload``: :meth:`~aggregator.engine.rounds.RoundEngine.charge_downlink`'s
    journal form). ``now``: the time it was applied at."""

    kind: JournalKind
    now: float
    topic: str = ""
    payload: bytes = b""


@dataclass(frozen=True)
class LoadedCheckpoint:
    snapshot: EngineSnapshot
    journal_hwm: int
    source: str  # file name it came from


_SCHEMA = """
CREATE TABLE IF NOT EXISTS rounds (
    version INTEGER PRIMARY KEY,
    base_version INTEGER NOT NULL,
    opened_at REAL NOT NULL,
    closed_at REAL NOT NULL,
    reason TEXT NOT NULL,
    gamma REAL NOT NULL,
    participants TEXT NOT NULL,
    agents TEXT NOT NULL,
    updates INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    bits REAL NOT NULL,
    packets INTEGER NOT NULL,
    airtime_s REAL NOT NULL,
    energy_j REAL NOT NULL,
    dense_equivalent_bytes INTEGER NOT NULL,
    spend TEXT NOT NULL,
    loss REAL,
    accuracy REAL
);
CREATE TABLE IF NOT EXISTS agents (
    agent TEXT PRIMARY KEY,
    info TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rejections (
    reason TEXT PRIMARY KEY,
    count INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS journal (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    now REAL NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL
);
"""


def _digest(arrays: dict[str, np.ndarray[Any, Any]], meta: bytes) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        h.update(name.encode())
        h.update(str(arr.dtype).encode())
        h.update(repr(arr.shape).encode())
        h.update(arr.reshape(-1).view(np.uint8).data)  # the bytes of arr.tobytes(), no copy
    h.update(meta)
    return h.hexdigest()


def encode_checkpoint(snap: EngineSnapshot, journal_hwm: int) -> bytes:
    """Serialise a snapshot to ``.npz`` bytes (no pickle)."""
    meta = json.dumps(
        {"engine": snap.meta, "h_agents": list(snap.h_agents), "journal_hwm": journal_hwm},
        sort_keys=True,
    ).encode()
    acc_index = np.flatnonzero(snap.acc)
    seen = snap.seen
    if seen.size and int(seen.min()) >= 0 and int(seen.max()) < 2**31:
        seen = seen.astype(np.int32)  # the reader widens it back to int64
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "x": snap.x,
        "acc_index": acc_index,
        "acc_value": snap.acc[acc_index],
        "h": snap.h,
        "sum_h": snap.sum_h,
        "seen": seen,
    }
    digest = _digest(arrays, meta).encode()
    buf = io.BytesIO()
    members: dict[str, Any] = {
        "meta": np.frombuffer(meta, dtype=np.uint8),
        "digest": np.frombuffer(digest, dtype=np.uint8),
        **arrays,
    }
    np.savez(buf, **members)
    return buf.getvalue()


def decode_checkpoint(blob: bytes) -> tuple[EngineSnapshot, int]:
    """Parse and validate checkpoint bytes; raises ValueError naming what is wrong, and
    nothing else: corrupt bytes make zipfile, np.load and json raise many kinds
    (NotImplementedError "zip file version", RuntimeError "encrypted", tokenize errors in
    the .npy header, MemoryError for an absurd shape, ...), all turned into ValueError."""
    try:
        return _decode_checkpoint(blob)
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(f"unreadable: {type(exc).__name__}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def _decode_checkpoint(blob: bytes) -> tuple[EngineSnapshot, int]:
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            names = _ARRAYS if "acc" in z.files else _STORED_ARRAYS  # older files: dense acc
            missing = {"meta", "digest", *names} - set(z.files)
            if missing:
                raise ValueError(f"missing members {sorted(missing)}")
            arrays = {name: np.array(z[name]) for name in names}
            meta = z["meta"].tobytes()
            digest = z["digest"].tobytes().decode("ascii")
    except (OSError, zipfile.BadZipFile, EOFError, KeyError, UnicodeDecodeError) as exc:
        raise ValueError(f"unreadable: {type(exc).__name__}: {exc}") from None
    if _digest(arrays, meta) != digest:
        raise ValueError("digest mismatch (the file is corrupt)")
    info = json.loads(meta)
    acc = arrays["acc"] if "acc" in arrays else _dense_acc(arrays)
    snap = EngineSnapshot(
        x=arrays["x"].astype(np.float64),
        acc=acc.astype(np.float64),
        h_agents=tuple(info["h_agents"]),
        h=arrays["h"].astype(np.float64),
        sum_h=arrays["sum_h"].astype(np.float64),
        seen=arrays["seen"].astype(np.int64).reshape(-1, 3),
        meta=info["engine"],
    )
    return snap, int(info["journal_hwm"])


def _dense_acc(arrays: dict[str, np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """The open round's accumulator from its stored nonzeros (validated)."""
    x, index, value = arrays["x"], arrays["acc_index"], arrays["acc_value"]
    if index.ndim != 1 or value.shape != index.shape or x.ndim != 1:
        raise ValueError("acc_index / acc_value have inconsistent shapes")
    if index.size and (
        not np.issubdtype(index.dtype, np.integer)
        or int(index[0]) < 0
        or int(index[-1]) >= x.size
        or not bool((index[1:] > index[:-1]).all())
    ):
        raise ValueError("acc_index is not a sorted set of indices into x")
    acc = np.zeros(x.size, dtype=np.float64)
    acc[index] = value
    return acc


def _open_history(path: Path) -> sqlite3.Connection:
    """The history database, checked; CheckpointError (one line, with the fix) if corrupt."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: durable across a process crash (SIGKILL); a power cut may lose
        # the last transactions, never corrupt the database.
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")  # the -wal file is bounded
        problems = [str(r[0]) for r in db.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise sqlite3.DatabaseError("; ".join(problems[:3]))
        db.executescript(_SCHEMA)
    except sqlite3.DatabaseError as exc:
        db.close()
        raise CheckpointError(
            f"{path} is corrupt ({_one_line(exc)}). Stop the service, move it aside with its "
            f"-wal and -shm files (mv {path.name} {path.name}.corrupt) and start again: the "
            "state is recovered from the checkpoint and the history restarts from its round "
            "(docs/operating.md, Checkpoints, restart and recovery)."
        ) from None
    return db


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Store:
    """The aggregator's disk state in ``data_dir``. Thread-safe (one internal lock).

    ``journal_max_entries`` / ``journal_max_bytes``: the journal appended since the last
    checkpoint that makes :meth:`journal_due` true (see the module doc, Bounded disk).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        journal_max_entries: int = JOURNAL_MAX_ENTRIES,
        journal_max_bytes: int = JOURNAL_MAX_BYTES,
    ) -> None:
        if journal_max_entries < 1 or journal_max_bytes < 1:
            raise ValueError(
                f"journal_max_entries={journal_max_entries} and journal_max_bytes="
                f"{journal_max_bytes} must be >= 1 (they bound the journal between checkpoints)"
            )
        self.journal_max_entries = journal_max_entries
        self.journal_max_bytes = journal_max_bytes
        self._pending_entries = 0  # journal rows appended since the last checkpoint
        self._pending_bytes = 0
        self.dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = _open_history(self.dir / HISTORY_DB)
        self._prev_hwm = 0
        for stale in self.dir.glob(f"{_TMP_PREFIX}*"):
            log.warning("removing %s left by an interrupted checkpoint write", stale.name)
            stale.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------ journal

    def append_journal(self, entries: Sequence[JournalEntry]) -> int:
        """Append ``entries`` in one transaction; return the id of the last journal row."""
        return self.commit(entries)

    def commit(
        self,
        entries: Sequence[JournalEntry],
        records: Iterable[RoundRecord] = (),
        *,
        agents: Iterable[AgentInfo] = (),
        rejected: dict[str, int] | None = None,
    ) -> int:
        """Append journal ``entries`` and the history rows of the versions they committed
        (with the agent registry and the rejection counters, when given) in one transaction;
        return the id of the last journal row.

        One transaction, so the history can never miss a version whose inputs are in the
        journal: a crash before the next checkpoint replays those inputs and rewrites the
        same rows (idempotent per version); a crash after it finds them written.
        """
        rows = [_round_row(r) for r in records]
        agent_rows = [(a.agent, json.dumps(a.to_dict())) for a in agents]
        history = bool(rows or agent_rows or rejected)
        with self._lock:
            if entries or history:
                self._db.execute("BEGIN")
                try:
                    if entries:
                        self._db.executemany(
                            "INSERT INTO journal (kind, now, topic, payload) VALUES (?, ?, ?, ?)",
                            [(e.kind, e.now, e.topic, e.payload) for e in entries],
                        )
                    if history:
                        self._write_history(rows, agent_rows, rejected)
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
                self._pending_entries += len(entries)
                self._pending_bytes += _journal_bytes(entries)
            return self._last_journal_id()

    def journal_due(self, more: Sequence[JournalEntry] = ()) -> bool:
        """Whether the journal since the last checkpoint, plus ``more`` (the entries about
        to be appended), reaches ``journal_max_entries`` rows or ``journal_max_bytes``:
        then write a checkpoint, which trims it (see the module doc, Bounded disk)."""
        with self._lock:
            rows = self._pending_entries + len(more)
            size = self._pending_bytes + _journal_bytes(more)
        return rows >= self.journal_max_entries or size >= self.journal_max_bytes

    def journal_size(self) -> tuple[int, int]:
        """(rows, topic + payload bytes) held in the journal table now."""
        with self._lock:
            row = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(topic) + LENGTH(payload)), 0) FROM journal"
            ).fetchone()
        return int(row[0]), int(row[1])

    def _last_journal_id(self) -> int:
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'journal'").fetchone()
        return int(row[0]) if row else 0

    def last_journal_id(self) -> int:
        with self._lock:
            return self._last_journal_id()

    def journal_after(self, hwm: int) -> list[JournalEntry]:
        """Journal rows with id > ``hwm``, in order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT kind, now, topic, payload FROM journal WHERE id > ? ORDER BY id", (hwm,)
            ).fetchall()
        return [JournalEntry(k, float(n), str(t), bytes(p)) for k, n, t, p in rows]

    # ------------------------------------------------------------------ checkpoints

    def write_checkpoint(self, snap: EngineSnapshot, journal_hwm: int) -> None:
        """Atomically replace the checkpoint; the old one becomes ``checkpoint.prev.npz``.

        Afterwards the journal is trimmed up to the mark of the checkpoint that is now the
        previous one (what a fallback to ``.prev`` would still need is kept).
        """
        blob = encode_checkpoint(snap, journal_hwm)
        fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=".npz", dir=self.dir)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
                fh.flush()
                os.fsync(fh.fileno())
            current = self.dir / CHECKPOINT
            if current.exists():
                os.replace(current, self.dir / CHECKPOINT_PREV)
            os.replace(tmp, current)
            _fsync_dir(self.dir)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        with self._lock:
            self._db.execute("DELETE FROM journal WHERE id <= ?", (self._prev_hwm,))
            self._pending_entries = self._pending_bytes = 0
        self._prev_hwm = journal_hwm

    def load_checkpoint(self) -> LoadedCheckpoint | None:
        """The newest valid checkpoint, or None if there is none at all.

        A file that fails validation is logged as an error and skipped (renamed to
        ``*.corrupt`` so it is kept for inspection); if checkpoint files exist and none is
        valid, CheckpointError is raised rather than starting from scratch.
        """
        problems: list[str] = []
        for name in (CHECKPOINT, CHECKPOINT_PREV):
            path = self.dir / name
            if not path.exists():
                continue
            try:
                snap, hwm = decode_checkpoint(path.read_bytes())
            except (OSError, ValueError) as exc:
                kept = path.with_name(path.name + ".corrupt")
                problems.append(f"{path}: {_one_line(exc)} (kept as {kept.name})")
                log.error("checkpoint %s is invalid (%s); kept as %s", path, exc, kept.name)
                try:
                    os.replace(path, kept)
                except OSError as err:  # e.g. a read-only directory: report, never loop
                    problems.append(f"cannot rename it: {err.strerror}")
                continue
            self._prev_hwm = hwm
            return LoadedCheckpoint(snap, hwm, name)
        if problems:
            raise CheckpointError(
                "no valid checkpoint: "
                + "; ".join(problems)
                + f". Refusing to start from scratch over existing state; move {self.dir} "
                "aside (or set AGG_DATA_DIR to an empty directory) to start a new job."
            )
        return None

    # ------------------------------------------------------------------ history

    def record_rounds(
        self,
        records: Iterable[RoundRecord],
        *,
        agents: Iterable[AgentInfo] = (),
        rejected: dict[str, int] | None = None,
    ) -> None:
        """Write history rows (idempotent per version), the registry and the counters."""
        self.commit((), records, agents=agents, rejected=rejected)

    def _write_history(
        self,
        rows: list[tuple[Any, ...]],
        agent_rows: list[tuple[str, str]],
        rejected: dict[str, int] | None,
    ) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO rounds VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        self._db.executemany(
            "INSERT OR REPLACE INTO agents (agent, info) VALUES (?, ?)", agent_rows
        )
        if rejected:
            self._db.executemany(
                "INSERT OR REPLACE INTO rejections (reason, count) VALUES (?, ?)",
                list(rejected.items()),
            )

    def delete_history_after(self, version: int) -> int:
        """Delete rows for versions > ``version``; return how many were deleted."""
        with self._lock:
            cur = self._db.execute("DELETE FROM rounds WHERE version > ?", (version,))
            return int(cur.rowcount)

    def history(self, since: int = 0, limit: int = 1000) -> list[RoundRecord]:
        """Rounds with version > ``since``, oldest first, at most ``limit``."""
        with self._lock:
            rows = self._db.execute(
                "SELECT version, base_version, opened_at, closed_at, reason, gamma, "
                "participants, agents, spend, loss, accuracy FROM rounds WHERE version > ? "
                "ORDER BY version LIMIT ?",
                (since, limit),
            ).fetchall()
        return [
            RoundRecord(
                version=int(v),
                base_version=int(b),
                opened_at=float(o),
                closed_at=float(c),
                reason=str(reason),
                gamma=float(g),
                participants=tuple(json.loads(p)),
                agents={str(k): AgentRound.from_dict(v) for k, v in json.loads(a).items()},
                spend=Spend.from_dict(json.loads(s)),
                loss=loss,
                accuracy=acc,
            )
            for v, b, o, c, reason, g, p, a, s, loss, acc in rows
        ]

    def max_version(self) -> int | None:
        with self._lock:
            row = self._db.execute("SELECT MAX(version) FROM rounds").fetchone()
        return None if row is None or row[0] is None else int(row[0])


def _journal_bytes(entries: Sequence[JournalEntry]) -> int:
    return sum(len(e.topic) + len(e.payload) + _ROW_OVERHEAD for e in entries)


def _round_row(r: RoundRecord) -> tuple[Any, ...]:
    s = r.spend.actual
    return (
        r.version,
        r.base_version,
        r.opened_at,
        r.closed_at,
        r.reason,
        r.gamma,
        json.dumps(list(r.participants)),
        json.dumps({k: v.to_dict() for k, v in r.agents.items()}, sort_keys=True),
        s.messages,
        s.bytes,
        s.bits,
        s.packets,
        s.airtime_s,
        s.energy_j,
        r.spend.dense.bytes,
        json.dumps(r.spend.to_dict(), sort_keys=True),
        r.loss,
        r.accuracy,
    )


# ---------------------------------------------------------------------- recovery


@dataclass(frozen=True)
class Recovery:
    """The result of :func:`recover`: the live engine, where it came from, and the journal
    mark it includes (pass it to the next :meth:`Store.write_checkpoint`)."""

    engine: RoundEngine
    source: str  # "checkpoint.npz", "checkpoint.prev.npz" or "empty"
    replayed: int  # journal entries applied on top of the checkpoint
    records: tuple[RoundRecord, ...]  # rounds the replay (re)committed
    journal_hwm: int


def apply_entry(engine: RoundEngine, entry: JournalEntry) -> Any:
    """Apply one journal entry to ``engine`` exactly as it was applied live."""
    if entry.kind == "msg":
        return engine.handle(entry.topic, entry.payload, entry.now)
    if entry.kind == "tick":
        return engine.tick(entry.now)
    if entry.kind == "charge":
        try:
            engine.replay_charge(entry.payload, entry.now)
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"journal: malformed downlink charge ({exc})") from None
        return Effects()
    if entry.topic not in ("pause", "resume", "stop"):
        raise CheckpointError(f"journal: unknown control command {entry.topic!r}")
    return engine.control(entry.topic, entry.now)  # type: ignore[arg-type]


def recover(
    store: Store,
    config: EngineConfig,
    *,
    evaluator: Evaluator | None = None,
    profiles: ProfileLookup | None = None,
) -> Recovery:
    """Rebuild the engine: newest valid checkpoint + journal replay (see the module doc).

    Also reconciles the history table with the recovered version and writes a fresh
    checkpoint, so the next start does not replay the same rows again.
    """
    loaded = store.load_checkpoint()
    if loaded is None:
        if store.max_version() is not None:
            raise CheckpointError(
                f"{store.dir} has round history but no checkpoint file; refusing to restart "
                "the model from scratch. Move the directory aside to start a new job."
            )
        engine = RoundEngine(config, evaluator=evaluator, profiles=profiles)
        source, hwm = "empty", 0
    else:
        try:
            engine = RoundEngine.restore(
                config, loaded.snapshot, evaluator=evaluator, profiles=profiles
            )
        except Exception as exc:  # the digest matched: the file is intact but does not fit
            raise CheckpointError(
                f"{store.dir / loaded.source}: {_one_line(exc)}. Fix the settings it names, "
                "or move the data directory aside to start a new job."
            ) from None
        source, hwm = loaded.source, loaded.journal_hwm
    entries = store.journal_after(hwm)
    records: list[RoundRecord] = []
    for entry in entries:
        effects = apply_entry(engine, entry)
        if effects.committed is not None:
            records.append(effects.committed)
    if engine.last_record is not None and all(
        r.version != engine.last_record.version for r in records
    ):
        records.insert(0, engine.last_record)
    dropped = store.delete_history_after(engine.version)
    if dropped:
        log.warning(
            "deleted %d history rows beyond the recovered version %d", dropped, engine.version
        )
    store.record_rounds(records, agents=engine.agents.values(), rejected=engine.rejected)
    last = store.last_journal_id()
    if entries or loaded is None or loaded.source != CHECKPOINT:
        store.write_checkpoint(engine.export(), last)
    if source != "empty":
        log.info(
            "recovered job %s at version %d from %s (+%d journal entries)",
            config.job,
            engine.version,
            source,
            len(entries),
        )
    return Recovery(engine, source, len(entries), tuple(records), last)
