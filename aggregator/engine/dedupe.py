"""The de-duplication keys of a job: which (agent, round, seq) updates were applied.

Transports deliver at least once (MQTT QoS 1, a ZeroMQ re-send after a reconnect), so the
engine must recognise an update it has already applied. An agent numbers its updates by
the model version it computed them at (``round``) and a per-round counter (``seq``); the
engine keeps every key for ``dedupe_window`` versions and rejects anything older as stale,
because beyond the window it could no longer tell.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

#: rows a log may hold before :meth:`SeenKeys.prune` compacts it (and at least twice the
#: rows kept by the last compaction)
_COMPACT_ROWS = 4096
#: a prune that advances the floor by at most this many rounds pops them one by one
_PRUNE_STEPWISE = 64


class SeenKeys:
    """De-duplication keys: (agent, round, seq) of every applied update in the window.

    A set per (agent, round) answers "seen before?"; a flat int64 log of
    ``(agent index, round, seq)`` rows (agent index: the caller's stable number for the
    agent, the engine uses its position in the agent registry) lets a checkpoint copy every
    key with one numpy call instead of walking the sets. Rounds older than the window floor
    are dropped from the sets at once and from the log lazily (at :meth:`rows`, or when it
    has doubled), so both stay bounded.
    """

    __slots__ = ("_floor", "_log", "_log_floor", "_logged_rows", "sets")

    def __init__(self) -> None:
        self.sets: dict[str, dict[int, set[int]]] = {}
        self._log: array[int] = array("q")
        self._logged_rows = 0  # rows right after the last compaction
        self._floor = 0  # rounds below this are gone from the sets
        self._log_floor = 0  # ... and from the log

    def contains(self, agent: str, round: int, seq: int) -> bool:
        rounds = self.sets.get(agent)
        return rounds is not None and seq in rounds.get(round, ())

    def highest(self, agent: str) -> int | None:
        """The largest seq of ``agent`` among the keys held (None: none)."""
        rounds = self.sets.get(agent, {})
        return max((max(seqs) for seqs in rounds.values() if seqs), default=None)

    def add(self, agent: str, index: int, round: int, seq: int) -> None:
        """Remember one key; ``index`` is the number :meth:`rows` reports for ``agent``."""
        self.sets.setdefault(agent, {}).setdefault(round, set()).add(seq)
        self._log.extend((index, round, seq))

    def forget(self, agent: str, index: int) -> None:
        """Drop every key of one agent (a fresh rejoin)."""
        if self.sets.pop(agent, None) is not None:
            rows = self._rows()
            self._set_log(rows[rows[:, 0] != index])

    def renumber(self, new_index: Sequence[int]) -> None:
        """The registry forgot agents: the agent of index ``i`` is now ``new_index[i]``
        (-1: forgotten, its keys dropped)."""
        rows = self._rows()
        if not len(rows):
            return
        mapped = np.asarray(new_index, dtype=np.int64)[rows[:, 0]]
        kept = rows[mapped >= 0].copy()
        kept[:, 0] = mapped[mapped >= 0]
        self._set_log(kept)

    def prune(self, floor: int) -> None:
        """Forget rounds below ``floor`` (which only grows, one version at a time)."""
        if floor <= self._floor:
            return
        if floor - self._floor <= _PRUNE_STEPWISE:
            gone = range(self._floor, floor)
            for rounds in self.sets.values():
                for r in gone:
                    rounds.pop(r, None)
        else:
            for rounds in self.sets.values():
                for r in [r for r in rounds if r < floor]:
                    del rounds[r]
        self._floor = floor
        if len(self._log) // 3 > 2 * max(self._logged_rows, _COMPACT_ROWS):  # rows doubled
            self.rows()

    @property
    def logged(self) -> int:
        """Rows in the log (kept ones, and pruned ones not yet compacted away)."""
        return len(self._log) // 3

    def rows(self) -> npt.NDArray[np.int64]:
        """Every key as a (k, 3) int64 array of (agent index, round, seq) (a copy); this is
        what a checkpoint stores. Compacts the log."""
        rows = self._rows()
        if self._log_floor < self._floor:
            rows = rows[rows[:, 1] >= self._floor]
            self._set_log(rows)
            self._log_floor = self._floor
        return rows.copy()

    @classmethod
    def restore(cls, rows: npt.NDArray[np.int64], agents: Sequence[str]) -> SeenKeys:
        """The keys :meth:`rows` returned; ``agents[i]`` is the agent with index ``i``.

        Raises ValueError when ``rows`` is not (k, 3) or names an index outside ``agents``.
        """
        if rows.ndim != 2 or rows.shape[1] != 3:
            raise ValueError(f"de-duplication rows must have shape (k, 3), got {rows.shape}")
        seen = cls()
        for ai, r, s in rows.tolist():
            if not 0 <= ai < len(agents):
                raise ValueError(
                    f"de-duplication row names agent index {ai}, but {len(agents)} agents "
                    "are registered (the checkpoint is inconsistent)"
                )
            seen.add(agents[ai], ai, r, s)
        return seen

    def _rows(self) -> npt.NDArray[np.int64]:
        return np.frombuffer(self._log, dtype=np.int64).reshape(-1, 3)

    def _set_log(self, rows: npt.NDArray[np.int64]) -> None:
        self._log = array("q", np.ascontiguousarray(rows, dtype=np.int64).tobytes())
        self._logged_rows = len(rows)
