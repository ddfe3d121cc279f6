"""The steps a job broadcast lately, kept for catch-ups and for a restart.

An agent that missed versions gets the merged steps since its own version while every one
of them is held, instead of a state snapshot of the whole model (189 kB at d = 47,236,
months of a LoRaWAN member's daily downlink cap). :class:`StepsHistory` holds the newest
``window`` broadcasts that chain one to the next. A resync clears it, since the steps
before a resync do not chain to it.

The checkpoint keeps the newest of them, up to :data:`EXPORT_BYTES` of operations. A
restarted aggregator can then answer catch-ups with steps, and re-broadcast its current
version as that version's steps (:meth:`StepsHistory.latest`) rather than as a snapshot.
"""

from __future__ import annotations

import base64
from collections import deque
from typing import Any, Final

from aggregator.engine.downlink.outbound import Outbound, StepsParts
from edge_agent.protocol import downlink, topics

#: at most this many bytes of operations go into a checkpoint (the newest steps first;
#: the newest one always). A mean or EF21 job's exact relay holds every accepted update
#: of a version, so a window of 64 can reach megabytes at 100 agents; the compressed
#: downlink's steps are a few kB each
EXPORT_BYTES: Final = 2 * 1024 * 1024

FAMILIES: Final[tuple[str, ...]] = ("mean", "ef21", "local")


class StepsHistory:
    """The newest broadcasts of one job that chain one to the next (pure)."""

    def __init__(self, job: str, d: int, window: int = 64) -> None:
        self.job = job
        self.d = d
        self._steps: deque[StepsParts] = deque(maxlen=max(1, window))

    def __len__(self) -> int:
        return len(self._steps)

    def append(self, steps: StepsParts) -> None:
        self._steps.append(steps)

    def clear(self) -> None:
        """A resync (or an unknown open version): what was held no longer chains on."""
        self._steps.clear()

    def catch_up(self, have: int | None, version: int) -> Outbound | None:
        """The merged steps from ``have`` to ``version`` if every one is held, else None."""
        if have is None or have >= version:
            return None
        chain = [s for s in self._steps if s.base_version >= have]
        if not chain or chain[0].base_version != have or chain[-1].version != version:
            return None
        merged = StepsParts(self.job, self.d, have, version, chain[-1].family,
                            tuple(op for s in chain for op in s.ops))  # fmt: skip
        return Outbound(topics.delta(self.job), steps=merged)

    def latest(self, version: int) -> Outbound | None:
        """The broadcast that ended at ``version`` (None: not held): what a restarted
        aggregator sends the fleet. A member one version behind applies it, the others
        drop it as old, and nobody receives the whole model."""
        if not self._steps or self._steps[-1].version != version:
            return None
        return Outbound(topics.delta(self.job), steps=self._steps[-1])

    # ------------------------------------------------------------- persistence

    def export(self, budget_bytes: int = EXPORT_BYTES) -> list[list[Any]]:
        """JSON-able: ``[base, version, family, [base64 op, ...]]`` for the newest steps
        whose operations fit in ``budget_bytes`` (the newest one always), oldest first."""
        kept: list[StepsParts] = []
        used = 0
        for steps in reversed(self._steps):
            used += sum(len(op) for op in steps.ops)
            if kept and used > budget_bytes:
                break
            kept.append(steps)
        return [
            [s.base_version, s.version, s.family, [_b64(op) for op in s.ops]]
            for s in reversed(kept)
        ]

    def restore(self, rows: list[Any]) -> None:
        """The inverse of :meth:`export` (ValueError for rows that do not chain). A row of
        three items is a local-training one of an older checkpoint (``local_history``)."""
        self._steps.clear()
        for row in rows:
            if len(row) == 3:
                row = [row[0], row[1], "local", row[2]]
            base, version, family, ops = row
            if family not in FAMILIES:
                raise ValueError(f"checkpoint: a broadcast of unknown family {family!r}")
            fam: downlink.Family = family
            steps = StepsParts(self.job, self.d, int(base), int(version), fam,
                               tuple(base64.b64decode(op) for op in ops))  # fmt: skip
            if self._steps and self._steps[-1].version != steps.base_version:
                raise ValueError("checkpoint: the broadcast history does not chain")
            self._steps.append(steps)


def _b64(op: bytes) -> str:
    return base64.b64encode(op).decode("ascii")
