"""The aggregation state of one job and the model step it takes: pure numpy, no I/O.

The aggregator keeps this state for the model it serves; an agent can keep the same state
and replay the aggregator's step on its own copy of the model, bit for bit, because every
float operation here is fixed (order, dtype: float64 throughout). The caller computes the
step coefficient; see docs/algorithm.md for the step rules.

* :class:`MeanAccumulator` (``plain`` and ``ef`` semantics): the round's weighted sum
  ``acc = sum_j w_j u_j`` of the updates u_j that entered it, and the step
  ``x <- x - coef * acc`` with ``coef = gamma / K`` (K: the number of updates summed).
* :class:`EF21Mirror` (``ef21`` semantics): each agent's state ``h_i``, the sum of every
  compressed change c_i it sent, and ``sum_h = sum_i h_i``; the step is
  ``x <- x - coef * sum_h`` with ``coef = gamma * scale / n`` (n agents).

Both steps change ``x`` in place and only when every new entry is finite; they return the
indices that changed (:class:`StepResult`), which is what a model delta carries.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from edge_agent.numerics.compressors import Update

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_NO_INDICES: IntArray = np.zeros(0, dtype=np.int64)


class StepResult(NamedTuple):
    """What a step did. ``finite`` False: the new model would hold nan or inf, so ``x`` was
    left unchanged (and ``changed`` is empty)."""

    changed: IntArray  # ascending indices whose value changed
    finite: bool


_REFUSED = StepResult(_NO_INDICES, False)


def sorted_unique(parts: list[IntArray]) -> IntArray:
    """The distinct values of ``parts`` (each sorted and distinct), ascending."""
    if not parts:
        return _NO_INDICES
    if len(parts) == 1:
        return parts[0]
    idx = np.concatenate(parts)
    if idx.size == 0:  # every part empty (updates with T = 0)
        return idx
    idx.sort()
    keep = np.empty(idx.size, dtype=bool)
    keep[0] = True
    np.not_equal(idx[1:], idx[:-1], out=keep[1:])
    return idx[keep]


def _assign(x: FloatArray, new: FloatArray) -> StepResult:
    """``x[:] = new`` when ``new`` is finite everywhere; report which entries changed."""
    if not np.isfinite(new).all():
        return _REFUSED
    changed = np.flatnonzero(new != x)
    x[...] = new
    return StepResult(changed, True)


class MeanAccumulator:
    """One round's weighted sum of updates, ``acc = sum_j w_j u_j`` (float64, length d).

    Sparse updates are not added one by one: they wait in arrival order and one
    ``np.add.at`` adds them all (the same floats as one ``update.add_to(acc, w)`` per
    update, in that order, for a fraction of the numpy calls). The accumulator also keeps
    which indices the round touched, so a step and the reset after it cost O(touched)
    instead of several passes over d; after a dense update (or a restore) it does not
    know, and works on all d entries — with the same floats either way, since
    ``x - c*0 == x`` exactly.
    """

    __slots__ = ("_pending", "_touched", "_union", "acc", "d")

    def __init__(self, d: int) -> None:
        if d < 1:
            raise ValueError(f"MeanAccumulator: d must be >= 1, got {d}")
        self.d = d
        self.acc: FloatArray = np.zeros(d)
        #: indices the round's updates touched (None: unknown or all)
        self._touched: list[IntArray] | None = []
        #: sparse updates not yet added to acc, with their weights, in arrival order
        self._pending: list[tuple[Update, float]] = []
        #: the union of _touched, once a step computed it (reused by reset)
        self._union: IntArray | None = None

    @property
    def pending(self) -> int:
        """Sparse updates waiting to be added to ``acc``."""
        return len(self._pending)

    def add(self, update: Update, weight: float = 1.0) -> None:
        """``acc += weight * u`` (exactly ``update.add_to(acc, weight)``, maybe deferred)."""
        self._union = None  # a step's union no longer covers what acc holds
        if self._touched is not None and update.indices is not None and update.scale is None:
            self._pending.append((update, weight))
            self._touched.append(update.indices)
            return
        self.flush()
        update.add_to(self.acc, weight)
        if self._touched is not None:
            if update.indices is None:
                self._touched = None
            else:
                self._touched.append(update.indices)

    def flush(self) -> None:
        """Add the pending sparse updates to ``acc``, in arrival order."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if len(pending) == 1:
            update, weight = pending[0]
            update.add_to(self.acc, weight)
            return
        updates = [u for u, _ in pending]
        idx = np.concatenate([u.indices for u in updates if u.indices is not None])
        # float16/32 -> float64 is exact, so promoting first changes no value
        vals = np.concatenate([u.values for u in updates]).astype(np.float64, copy=False)
        if any(w != 1.0 for _, w in pending):
            vals = vals * np.repeat([w for _, w in pending], [u.t for u in updates])
        np.add.at(self.acc, idx, vals)

    def step(self, x: FloatArray, coef: float) -> StepResult:
        """``x <- x - coef * acc`` in place (on the touched entries only, when known),
        unless a new entry would be nan or inf: then ``x`` is left as it was."""
        self.flush()
        if self._touched is None:
            return _assign(x, x - coef * self.acc)
        idx = self._union = sorted_unique(self._touched)
        vals = x[idx] - coef * self.acc[idx]
        if not np.isfinite(vals).all():
            return _REFUSED
        changed = idx[vals != x[idx]]
        x[idx] = vals
        return StepResult(changed, True)

    def reset(self) -> None:
        """Empty the accumulator for the next round (``acc`` all zero again)."""
        self._pending = []
        if self._touched is None:
            self.acc = np.zeros(self.d)
        elif self._union is not None:
            self.acc[self._union] = 0.0
        else:
            for part in self._touched:
                self.acc[part] = 0.0
        self._touched = []
        self._union = None

    def export(self) -> FloatArray:
        """A copy of ``acc`` with every pending update added (what a checkpoint stores)."""
        self.flush()
        return self.acc.copy()

    @classmethod
    def restore(cls, acc: FloatArray) -> MeanAccumulator:
        """An accumulator holding ``acc`` (from :meth:`export`); which entries it touched
        is not saved, so its first step works on all of them. Raises ValueError for a
        non-vector or non-finite ``acc``."""
        if acc.ndim != 1:
            raise ValueError(f"accumulator must be a vector, got shape {acc.shape}")
        if not np.isfinite(acc).all():
            raise ValueError("accumulator contains nan or inf")
        out = cls(acc.size)
        out.load(acc)
        return out

    def load(self, acc: FloatArray) -> None:
        """Hold a copy of ``acc`` (length d) as the round's sum, with nothing pending;
        which entries it touched is unknown, so the next step works on all of them."""
        if acc.shape != (self.d,):
            raise ValueError(f"accumulator must have shape ({self.d},), got {acc.shape}")
        self.acc = acc.astype(np.float64, copy=True)
        self._pending = []
        self._touched = None
        self._union = None


class EF21Mirror:
    """The aggregator's copy of every agent's EF21 state ``h_i`` and of ``sum_h``.

    Every change c_i an agent sends is added to its ``h_i`` and to ``sum_h`` exactly once,
    whenever it arrives (late ones included: it is state, not a gradient). ``sum_h`` is
    None until the first change arrives.
    """

    __slots__ = ("d", "h", "sum_h")

    def __init__(self, d: int) -> None:
        if d < 1:
            raise ValueError(f"EF21Mirror: d must be >= 1, got {d}")
        self.d = d
        self.h: dict[str, FloatArray] = {}
        self.sum_h: FloatArray | None = None

    def apply(self, agent: str, update: Update) -> None:
        """``h_agent += c`` and ``sum_h += c`` for the change ``c`` the update carries."""
        h = self.h.get(agent)
        if h is None:
            h = self.h[agent] = np.zeros(self.d)
        if self.sum_h is None:
            self.sum_h = np.zeros(self.d)
        update.add_to(h)
        update.add_to(self.sum_h)

    def reset_agent(self, agent: str) -> None:
        """Drop one agent's state (it rejoins fresh, from h_i = 0)."""
        h = self.h.pop(agent, None)
        if h is not None and self.sum_h is not None:
            self.sum_h -= h
            if not self.h:
                self.sum_h[:] = 0.0  # exact zero, no rounding residue

    def step(self, x: FloatArray, coef: float) -> StepResult:
        """``x <- x - coef * sum_h`` in place, unless an entry would be nan or inf.

        Raises ValueError before any change has arrived (there is nothing to step with).
        """
        if self.sum_h is None:
            raise ValueError("EF21 step before any agent sent a change (sum_h is unset)")
        return _assign(x, x - coef * self.sum_h)

    def export(self) -> tuple[tuple[str, ...], FloatArray, FloatArray]:
        """``(agents, h, sum_h)``: ``h[i]`` is ``agents[i]``'s state (shape (n, d)), and
        ``sum_h`` has shape (0,) while unset. Copies."""
        agents = tuple(self.h)
        h = np.stack([self.h[a] for a in agents]) if agents else np.zeros((0, self.d))
        sum_h = np.zeros(0) if self.sum_h is None else self.sum_h.copy()
        return agents, h, sum_h

    @classmethod
    def restore(
        cls, d: int, agents: tuple[str, ...], h: FloatArray, sum_h: FloatArray
    ) -> EF21Mirror:
        """The inverse of :meth:`export`. Raises ValueError for shapes that do not fit ``d``
        and ``agents``, or for nan/inf."""
        if h.shape != (len(agents), d) or sum_h.shape not in ((d,), (0,)):
            raise ValueError(
                f"EF21 state has shapes h={h.shape}, sum_h={sum_h.shape}; expected "
                f"({len(agents)}, {d}) and ({d},) or (0,)"
            )
        if not (np.isfinite(h).all() and np.isfinite(sum_h).all()):
            raise ValueError("EF21 state contains nan or inf")
        out = cls(d)
        out.h = {a: h[i].astype(np.float64, copy=True) for i, a in enumerate(agents)}
        out.sum_h = sum_h.astype(np.float64, copy=True) if sum_h.size else None
        return out
