"""An agent's copy of the aggregator's model, kept bit-identical by replaying its steps.

:class:`Replica` holds the model ``x`` at ``version`` and, for EF21 jobs replicated
exactly, the aggregate ``h`` (the mean of the agents' EF21 states) the aggregator steps
with. It applies every downlink message kind (:mod:`edge_agent.protocol.downlink`,
:mod:`edge_agent.protocol.wire`):

- a snapshot or state snapshot replaces the copy (an older one is ignored);
- a delta sets ``x[indices] = values``;
- steps replay the aggregator's own float operations with the aggregator's own code
  (:class:`edge_agent.numerics.aggregation.MeanAccumulator`, ``Update.add_to``), in its order, so
  the result is the same bits; a compressed-downlink move adds the broadcast change.

A message that does not start at this replica's version is refused with a reason
(``version_gap``: ask for what is missing), and a message is applied all or nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from edge_agent.numerics.aggregation import MeanAccumulator
from edge_agent.numerics.local import LocalCoefs, anchor_drift, anchor_receive
from edge_agent.protocol.downlink import (
    Add,
    Family,
    Local,
    Move,
    Op,
    StateSnapshot,
    Step,
    Steps,
    Sub,
    Zero,
)
from edge_agent.protocol.wire import Delta, Snapshot

FloatArray = npt.NDArray[np.float64]

ModelMessage: TypeAlias = Snapshot | Delta | Steps | StateSnapshot
#: why a message was not applied (None: it was)
Refusal: TypeAlias = Literal[
    "wrong_d", "old", "no_model", "version_gap", "no_aggregate", "wrong_family", "not_finite"
]

__all__ = ["Exchange", "ModelMessage", "Refusal", "Replica"]

_ALREADY: Final = "old"


@dataclass(frozen=True)
class Exchange:
    """Local training: one communication a replica replayed, for the member's own state:
    the anchor ``y_h`` before the broadcast, the broadcast ``dt``, its coefficients and
    the version it made."""

    version: int
    y_h: FloatArray
    dt: FloatArray
    coefs: LocalCoefs
    #: the tags of the members whose change did not enter, of the agents that joined and
    #: of the members that left (edge_agent.protocol.downlink)
    absent: frozenset[bytes]
    joined: frozenset[bytes]
    left: frozenset[bytes]


class Replica:
    """The model copy of one agent; ``family`` is the job's update family (``mean`` for
    plain and classic-EF updates, ``ef21``)."""

    def __init__(self, d: int, family: Family) -> None:
        if d < 1:
            raise ValueError(f"Replica: d must be >= 1, got {d}")
        self.d = d
        self.family: Family = family
        self.x: FloatArray | None = None
        self.version: int | None = None
        #: EF21 aggregate h (local training: the anchor's v); None: unknown (a plain
        #: snapshot carries none)
        self.aggregate: FloatArray | None = None
        #: local training: the communications replayed since the owner last took them
        self.exchanges: list[Exchange] = []

    def apply(self, msg: ModelMessage) -> Refusal | None:
        """Apply one downlink message; None when applied, else why not (nothing changed)."""
        if isinstance(msg, Snapshot | StateSnapshot):
            return self._load(msg)
        if msg.d != self.d:
            return "wrong_d"
        if self.x is None or self.version is None:
            return "no_model"
        if msg.version <= self.version:
            return _ALREADY
        if msg.base_version != self.version:
            return "version_gap"
        if isinstance(msg, Delta):
            msg.apply(self.x)
            self.version = msg.version
            return None
        return self._replay(msg)

    def _load(self, snap: Snapshot | StateSnapshot) -> Refusal | None:
        if snap.x.size != self.d:
            return "wrong_d"
        if self.version is not None and snap.version < self.version:
            return _ALREADY
        self.x = snap.x.copy()
        self.version = snap.version
        agg = snap.aggregate if isinstance(snap, StateSnapshot) else None
        self.aggregate = None if agg is None else agg.copy()
        return None

    def _replay(self, steps: Steps) -> Refusal | None:
        assert self.x is not None
        if steps.family != self.family:
            return "wrong_family"
        moves_only = all(isinstance(op, Move) for op in steps.ops)
        if self.family != "mean" and self.aggregate is None and not moves_only:
            return "no_aggregate"
        x = self.x.copy()  # all or nothing
        agg = None if self.aggregate is None else self.aggregate.copy()
        acc = MeanAccumulator(self.d) if self.family == "mean" else None
        exchanges: list[Exchange] = []
        version = steps.base_version
        for op in steps.ops:
            if isinstance(op, Local):
                assert agg is not None
                version += 1
                exchanges.append(_local(x, agg, op, version))
                if not (np.isfinite(x).all() and np.isfinite(agg).all()):
                    return "not_finite"
            elif isinstance(op, Step):
                stepped = _step(x, op.coef, acc, agg)
                if stepped is None:
                    return "not_finite"
                x = stepped
            else:
                _apply(op, x, acc, agg)
        self.x = x
        self.aggregate = agg
        self.version = steps.version
        self.exchanges.extend(exchanges)
        return None


def _local(x: FloatArray, v: FloatArray, op: Local, version: int) -> Exchange:
    """One LOCAL operation on the anchor ``x`` and its ``v``, in place (exactly the
    aggregator's :meth:`edge_agent.numerics.local.LocalHub.close`)."""
    anchor_drift(x, v, op.coefs.gamma, op.coefs.steps)
    y_h = x.copy()
    dt = op.update.to_dense()
    anchor_receive(x, v, dt, op.coefs)
    return Exchange(version, y_h, dt, op.coefs, op.absent, op.joined, op.left)


def _apply(op: Op, x: FloatArray, acc: MeanAccumulator | None, agg: FloatArray | None) -> None:
    """One operation other than STEP, in place (mean jobs add to ``acc``, EF21 to ``agg``)."""
    if isinstance(op, Move):
        op.update.add_to(x)
    elif isinstance(op, Add):
        if acc is not None:
            acc.add(op.update, op.weight)
        else:
            assert agg is not None
            op.update.add_to(agg, op.weight)
    elif isinstance(op, Sub):
        assert agg is not None
        agg[op.indices] -= op.values
    elif isinstance(op, Zero):
        assert agg is not None
        agg[:] = 0.0


def _step(
    x: FloatArray, coef: float, acc: MeanAccumulator | None, agg: FloatArray | None
) -> FloatArray | None:
    """The aggregator's step with coefficient ``coef``; None if it is not finite."""
    if acc is not None:
        if not acc.step(x, coef).finite:
            return None
        acc.reset()
        return x
    assert agg is not None
    new = x - coef * agg  # exactly the aggregator's expression: x - coef * sum_h
    return new if np.isfinite(new).all() else None
