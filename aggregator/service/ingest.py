"""The aggregator service: transports <-> RoundEngine <-> Store, on one ingest thread.

Threads:

* each transport's own network thread puts inbound messages straight into a shared queue
  (:meth:`~edge_agent.transports.Transport.deliver_to`);
* one *ingest* thread is the only writer of engine state. Per batch (everything queued, up
  to ``MAX_BATCH`` messages) it, in this order:

  1. applies each message / operator command to the engine (under the read lock) and
     ticks it (deadlines, liveness);
  2. appends every state-changing input to the journal and the history rows of the
     versions committed (one SQLite transaction);
  3. if a new model version was committed: writes the checkpoint (every
     ``checkpoint_every`` versions; default 1, i.e. every version; a control command
     always checkpoints; and whenever the journal since the last checkpoint reaches the
     store's bound, so it stays bounded while no version commits);
  4. only then publishes the outbound messages to *every* transport (a run of deltas, one
     per version the batch committed, goes out as one merged delta: agents only ever
     hold published versions).

  What is published is charged to the agents' downlinks (and, with pacing, decides when
  the next version may close) under the lock in step 1, and that charge is journalled in
  step 2 with the batch's inputs (:meth:`RoundEngine.charge_downlink`): the replay
  re-applies it, so the state rebuilt after a crash is the live one, pacing included.

  So a version is durable before any agent can see it, and after a crash the journal
  replays exactly what was applied (:func:`aggregator.service.store.recover`).

The HTTP API reads through :meth:`AggregatorService.read` (a lock held only to copy what it
needs) and sends control commands through the ingest queue, so the journal order is the
order in which the engine saw its inputs.
"""

from __future__ import annotations

import io
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np

from aggregator.engine.accounting import DenseDownlink, Pricer, RoundRecord
from aggregator.engine.downlink.outbound import Outbound, merge_deltas
from aggregator.engine.rounds import Decoded, Effects, RoundEngine
from aggregator.service.datalock import DataDirLock
from aggregator.service.evaluation import Evaluation, LossFloor
from aggregator.service.logs import ProgressLog
from aggregator.service.settings import Settings
from aggregator.service.store import JournalEntry, Store, recover
from edge_agent.errors import CatEdgeError
from edge_agent.links.catalog import resolve_profile
from edge_agent.links.profiles import CostProfile
from edge_agent.protocol import topics, wire_many
from edge_agent.protocol.signing import CountingSigner
from edge_agent.transports import Message, Transport, open_transport

log = logging.getLogger("aggregator.service.ingest")

ControlCmd = Literal["pause", "resume", "stop"]
T = TypeVar("T")

#: Most inbound messages applied before their journal rows are written and outbound sent.
MAX_BATCH = 512


@dataclass(frozen=True)
class _Command:
    cmd: ControlCmd
    future: Future[Effects]


class _Stop:
    """Sentinel put on the ingest queue to end the ingest loop."""


_STOP = _Stop()


@dataclass
class _Applied:
    """What one batch did to the engine: to journal, persist, publish and answer."""

    entries: list[JournalEntry] = field(default_factory=list)
    outbound: list[Outbound] = field(default_factory=list)
    records: list[RoundRecord] = field(default_factory=list)
    done: list[tuple[Future[Effects], Effects]] = field(default_factory=list)
    changed: bool = False  # some input changed the state: checkpoint now

    def add(self, eff: Effects) -> None:
        """Collect what one input (or the tick) produced, in input order."""
        self.outbound.extend(eff.outbound)
        self.changed = self.changed or eff.changed
        if eff.committed is not None:
            self.records.append(eff.committed)


#: Updates up to this size are decoded together (sparse updates: the common case) ...
BATCH_DECODE_MAX_BYTES = 256 * 1024
#: ... up to this many payload bytes per batch: all their decoded arrays are alive at once
#: (before the engine has checked job, agent or duplicates), so this bounds that memory.
BATCH_DECODE_BUDGET_BYTES = 8 * 2**20


def _decode_updates(batch: list[Message | _Command]) -> list[Decoded | None]:
    """Decode the batch's small updates in one :func:`~edge_agent.protocol.wire_many.decode_many` call
    (it shares numpy calls between messages); None where the engine decodes itself, one at
    a time (not an update topic, not bytes, large, or beyond the batch's byte budget)."""
    out: list[Decoded | None] = [None] * len(batch)
    at: list[int] = []
    budget = BATCH_DECODE_BUDGET_BYTES
    for i, item in enumerate(batch):
        if (
            isinstance(item, Message)
            and "/update/" in item.topic
            and isinstance(item.payload, bytes)
            and len(item.payload) <= min(BATCH_DECODE_MAX_BYTES, budget)
        ):
            at.append(i)
            budget -= len(item.payload)
    if len(at) > 1:
        results = wire_many.decode_many([batch[i].payload for i in at])  # type: ignore[union-attr]
        for i, result in zip(at, results, strict=True):
            out[i] = result
    return out


def _profile_lookup(name: str) -> CostProfile | None:
    try:
        return resolve_profile(name)
    except CatEdgeError:
        return None


class AggregatorService:
    """Runs one job. ``start()`` recovers state, connects, and starts the threads.

    ``observer(record)`` is called on the ingest thread after each committed version is
    persisted and published (the metrics hook). ``clock`` gives seconds that survive
    restarts (wall time): deadlines and liveness are measured with it.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        observer: Callable[[RoundRecord], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._observer = observer
        self._clock = clock
        self._lock = threading.Lock()
        self._inbox: queue.SimpleQueue[Message | _Command | _Stop] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._transports: list[Transport] = []
        self._engine: RoundEngine | None = None
        self._store: Store | None = None
        self._data_lock: DataDirLock | None = None  # one aggregator per AGG_DATA_DIR
        #: signs every outbound message (AGG_SIGNING_KEY_FILE); None: nothing is signed
        self._signer: CountingSigner | None = None
        self._fatal: BaseException | None = None
        self._publish_failures = 0
        self._stop_requested = False
        self._uncheckpointed = 0  # committed versions not yet in a checkpoint file
        self._progress = ProgressLog(log)  # round closed / checkpoint written lines
        self.recovered_from = ""
        #: the least the evaluation loss can be, for /status's ETA (AGG_LOSS_FLOOR)
        self.loss_floor = LossFloor("none", None)
        #: the dense float32 downlink baseline, charged per committed version (None:
        #: unknown, the service resumed a job past version 0); read it under ``read``
        self.dense_down: DenseDownlink | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self, data_lock: DataDirLock | None = None) -> None:
        """Recover, connect every transport, re-broadcast the model, start the threads.
        ``data_lock``: the data directory's lock already taken (a standby's take-over);
        else it is acquired here (DataDirInUse if another aggregator holds it)."""
        s = self.settings
        cfg = s.engine_config()
        self._data_lock = data_lock if data_lock is not None else DataDirLock.acquire(s.data_dir)
        try:
            self._store = Store(s.data_dir)
            evaluation = Evaluation.load(s)
            recovery = recover(
                self._store,
                cfg,
                evaluator=None if evaluation is None else evaluation.evaluate,
                profiles=_profile_lookup,
            )
        except BaseException:
            self._data_lock.release()
            raise
        self._engine = recovery.engine
        self.recovered_from = recovery.source
        try:
            self._signer = s.downlink_signer()
        except BaseException:
            self._store.close()
            self._data_lock.release()
            raise
        if self._engine.version == 0:
            self.dense_down = DenseDownlink(Pricer(_profile_lookup))
        try:
            for url in s.transports:
                t = open_transport(
                    url,
                    role="aggregator",
                    client_id=s.transport_client_id,
                    **s.transport_options(url),
                )
                self._transports.append(t)
                t.deliver_to(self._inbox.put)
                t.connect()
                for pattern in topics.agent_inbound(s.job):
                    t.subscribe(pattern)
        except BaseException:
            self._close_transports()
            self._store.close()
            self._data_lock.release()
            raise
        # The current version's steps (or, when they are not held, the retained snapshot)
        # tell (re)connecting agents where we are; the resync command asks agents that
        # already answered this version to re-send that update (an open round is not
        # journalled as a whole; duplicates are dropped here).
        hello = self._sealed(
            [
                self._engine.restart_message(),
                self._engine.resync_message(),
                *self._engine.state_controls(),
            ]
        )
        with self._lock:
            charge = self._charge(self._engine, hello)
        self._store.commit(charge)  # persisted before it is published, like every input
        self._publish(hello)
        self._threads.append(threading.Thread(target=self._ingest, name="ingest", daemon=True))
        for th in self._threads:
            th.start()
        self.loss_floor = LossFloor(s.loss_floor, evaluation, target_loss=s.target_loss)
        self.loss_floor.start()
        log.info(
            "aggregator for job %s serving %s at version %d (%s)",
            s.job,
            ", ".join(t.url for t in self._transports),
            self._engine.version,
            recovery.source,
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the threads, close the transports and the store (idempotent)."""
        if self._stop_requested:
            return
        self._stop_requested = True
        self.loss_floor.stop()
        # The ingest thread finishes what is queued before _STOP (persist, then publish)
        # while the transports are still open (what arrives after _STOP is not applied).
        self._inbox.put(_STOP)
        for th in self._threads:
            th.join(timeout_s)
        self._close_transports()
        self._threads.clear()
        if self._store is not None:
            self._store.close()
        if self._data_lock is not None:
            self._data_lock.release()

    def _close_transports(self) -> None:
        for t in self._transports:
            try:
                t.close()
            except Exception:
                log.exception("closing %s", t.url)

    @property
    def healthy(self) -> bool:
        return (
            self._engine is not None
            and self._fatal is None
            and not self._stop_requested
            and all(th.is_alive() for th in self._threads)
        )

    @property
    def fatal_error(self) -> str | None:
        return None if self._fatal is None else f"{type(self._fatal).__name__}: {self._fatal}"

    def transports(self) -> list[tuple[str, bool]]:
        """(redacted URL, connected) per transport."""
        return [(t.url, t.connected) for t in self._transports]

    # ------------------------------------------------------------------ API side

    def read(self, fn: Callable[[RoundEngine], T]) -> T:
        """Run ``fn(engine)`` under the engine lock; ``fn`` must copy what it keeps."""
        with self._lock:
            if self._engine is None:
                raise RuntimeError("the aggregator service is not started")
            return fn(self._engine)

    def now(self) -> float:
        """The service's clock (the time the engine is driven with)."""
        return self._clock()

    def model_npy(self) -> tuple[int, bytes]:
        """(version, the model x as .npy bytes)."""
        version, x = self.read(lambda e: (e.version, e.x.copy()))
        buf = io.BytesIO()
        np.save(buf, x, allow_pickle=False)
        return version, buf.getvalue()

    def history(self, since: int = 0, limit: int = 1000) -> list[RoundRecord]:
        if self._store is None:
            raise RuntimeError("the aggregator service is not started")
        return self._store.history(since, limit)

    def control(self, cmd: ControlCmd, timeout_s: float = 10.0) -> Effects:
        """Apply an operator command on the ingest thread; wait until it is persisted."""
        if not self.healthy:
            raise RuntimeError(self.fatal_error or "the aggregator service is not running")
        fut: Future[Effects] = Future()
        self._inbox.put(_Command(cmd, fut))
        return fut.result(timeout=timeout_s)

    # ------------------------------------------------------------------ threads

    def _ingest(self) -> None:
        tick_s = self.settings.tick_s
        try:
            stop = False
            while not stop:
                batch: list[Message | _Command] = []
                try:
                    item = self._inbox.get(timeout=tick_s)
                except queue.Empty:
                    item = None
                while item is not None:
                    if isinstance(item, _Stop):
                        stop = True
                        break
                    batch.append(item)
                    if len(batch) >= MAX_BATCH:
                        break
                    try:
                        item = self._inbox.get_nowait()
                    except queue.Empty:
                        item = None
                self._process(batch)
        except BaseException as exc:  # persistence failed: never publish what is not durable
            self._fatal = exc
            log.exception("ingest stopped: the aggregator can no longer persist its state")

    def _process(self, batch: list[Message | _Command]) -> None:
        assert self._engine is not None and self._store is not None
        eng = self._engine
        decoded = _decode_updates(batch)  # outside the lock: readers need not wait for it
        with self._lock:
            applied = self._apply(eng, batch, decoded)
            self._charge_dense_down(eng, applied.records)
            applied.outbound = self._sealed(merge_deltas(applied.outbound))
            applied.entries.extend(self._charge(eng, applied.outbound))
            self._uncheckpointed += len(applied.records)
            checkpoint = (
                applied.changed
                or self._uncheckpointed >= self.settings.checkpoint_every
                or self._store.journal_due(applied.entries)  # bounded disk: trims the journal
            )
            snap = eng.export() if checkpoint else None
            agents = [a.copy() for a in eng.agents.values()] if applied.records else []
            rejected = dict(eng.rejected) if applied.records else None
        # inputs and the history rows they produced: one transaction, then the checkpoint
        hwm = self._store.commit(applied.entries, applied.records, agents=agents, rejected=rejected)
        for rec in applied.records:
            self._progress.round_closed(rec)
        if snap is not None:
            self._store.write_checkpoint(snap, hwm)
            self._uncheckpointed = 0
            if applied.records:
                self._progress.checkpoint_written(
                    applied.records[-1].version, self.settings.checkpoint_every
                )
        self._deliver(applied)

    def _apply(
        self, eng: RoundEngine, batch: list[Message | _Command], decoded: list[Decoded | None]
    ) -> _Applied:
        """Step 1 (under the lock): each message / command of the batch, then a tick."""
        applied = _Applied()
        for i, item in enumerate(batch):
            now = self._clock()
            if isinstance(item, _Command):
                eff = eng.control(item.cmd, now)
                if eff.changed:
                    applied.entries.append(JournalEntry("control", now, item.cmd))
                applied.done.append((item.future, eff))
            else:
                eff = eng.handle(item.topic, item.payload, now, decoded=decoded[i])
                if eff.journal:
                    applied.entries.append(JournalEntry("msg", now, item.topic, item.payload))
            applied.add(eff)
        now = self._clock()
        eff = eng.tick(now)
        if eff.journal:
            applied.entries.append(JournalEntry("tick", now))
        applied.add(eff)
        return applied

    def _sealed(self, outbound: list[Outbound]) -> list[Outbound]:
        """``outbound`` signed (AGG_SIGNING_KEY_FILE) before it is charged: the charge, the
        published counts and pacing see the bytes the agents receive."""
        if self._signer is None:
            return outbound
        return [o.sealed(self._signer) for o in outbound]

    def _charge(self, eng: RoundEngine, outbound: list[Outbound]) -> list[JournalEntry]:
        """Charge what is about to be published to the agents' downlinks (under the lock):
        the journal entry that replays it (none when nothing is published)."""
        if not outbound:
            return []
        now = self._clock()
        return [JournalEntry("charge", now, "", eng.charge_downlink(outbound, now))]

    def _deliver(self, applied: _Applied) -> None:
        """Step 4 (once durable): publish, answer the commands, tell the round observer."""
        self._publish(applied.outbound)
        for fut, result in applied.done:
            fut.set_result(result)
        if self._observer is not None:
            for rec in applied.records:
                try:
                    self._observer(rec)
                except Exception:
                    log.exception("round observer failed")

    def _charge_dense_down(self, eng: RoundEngine, records: list[RoundRecord]) -> None:
        """The downlink baseline: each committed version, dense, to every live agent."""
        if self.dense_down is None:
            return
        for rec in records:
            live = [(a.agent, a.hello.profile) for a in eng.agents.values() if a.live]
            self.dense_down.charge(eng.config.job, eng.config.d, rec.version, live)

    def _publish(self, outbound: list[Outbound]) -> None:
        """Publish on every transport (charged already: :meth:`_charge`)."""
        for out in outbound:
            for t in self._transports:
                try:
                    t.publish(out.topic, out.payload, retain=out.retain)
                except CatEdgeError as exc:
                    self._publish_failures += 1
                    if self._publish_failures == 1 or self._publish_failures % 1000 == 0:
                        log.warning(
                            "publish to %s on %s failed (%d failures so far): %s",
                            out.topic,
                            t.url,
                            self._publish_failures,
                            exc,
                        )

    # ------------------------------------------------------------------ metrics

    def metrics_snapshot(self) -> dict[str, Any]:
        """Counters and gauges for /metrics (a copy)."""

        def grab(e: RoundEngine) -> dict[str, Any]:
            return {
                "rounds": e.rounds,
                "version": e.version,
                "accepted": e.accepted,
                "rejected": dict(e.rejected),
                "totals": e.totals.to_dict(),
                "totals_down": e.totals_down.to_dict(),
                "published": {k: tuple(v) for k, v in e.traffic.published.items()},
                "snapshots_withheld": e.traffic.withheld,
                "agents": len(e.agents),
                "live_agents": e.live_agents,
                "loss": e.loss,
                "accuracy": e.accuracy,
                "state": e.state,
            }

        out = self.read(grab)
        for reason, n in self.transport_refused().items():
            out["rejected"][reason] = out["rejected"].get(reason, 0) + n
        out["healthy"] = self.healthy
        return out

    def transport_refused(self) -> dict[str, int]:
        """What the transports dropped before the engine saw it, by reason, summed over
        transports: ZeroMQ client authentication (unauthenticated handshakes,
        agent_mismatch), malformed frames, peer_disconnected (a frame above
        max_message_bytes shows as one), MQTT topics that are not UTF-8."""
        out: dict[str, int] = {}
        for t in self._transports:
            refused: dict[str, int] = getattr(t, "refused", {})
            for reason, n in refused.items():
                out[reason] = out.get(reason, 0) + n
        return out
