"""Update magnitude bounds: no single update may blow the model up or make it non-finite.

The engine asks :class:`UpdateGuard` about every admitted update before it changes
anything (:meth:`aggregator.engine.rounds.RoundEngine.handle`). Two refusals:

``too_large``
    a mean-family update (``plain``, ``ef``, ``dir``) whose L2 norm exceeds
    ``Limits.update_norm_factor`` times the median norm of the last :data:`NORM_WINDOW`
    accepted ones, once ``Limits.update_norm_warmup`` were accepted. EF21 changes are not
    compared: they shrink as the method converges, so a rejoining agent's first change is
    legitimately far above the median. A norm that overflows float64 is always too large.
``would_diverge``
    the open round's step, taken with this update at the current step size, would hold
    nan, inf or a magnitude of 1e300 or more (e.g. one finite top-k value of 1e308); for
    an EF21 change, the same for the agent's state and sum_h. The test is exact; a cheap upper
    bound (``max|x| + gamma * (bound of the accumulated values + max|u|)`` far below
    float64's limit) answers it for every ordinary update without touching d entries.

Decisions depend only on state a checkpoint restores (the model, the round's
accumulator, the EF21 sums, and the norm window, which the checkpoint stores), so a
journal replay refuses exactly what was refused live: the bounds kept here are upper
bounds, and whenever the cheap bound does not answer, the exact test does.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from aggregator.engine.admission import Limits, Reject
from edge_agent.numerics.aggregation import EF21Mirror, MeanAccumulator
from edge_agent.numerics.compressors import Update

FloatArray = npt.NDArray[np.float64]

#: accepted norms the relative bound looks back on
NORM_WINDOW: Final = 256
#: no update may take the model or a state beyond this magnitude: float64 ends at 1.8e308,
#: and a model this large is wrecked anyway (the next step could overflow)
_SAFE: Final = 1e300


def _max_abs(a: FloatArray) -> float:
    return float(np.abs(a).max()) if a.size else 0.0


def _safe(a: FloatArray) -> bool:
    """Every entry finite and below :data:`_SAFE` in magnitude."""
    return bool((np.abs(a) < _SAFE).all())  # False for nan and inf too


def _step_finite(
    update: Update,
    agent: str,
    gamma: float,
    weight: float,
    x: FloatArray,
    acc: MeanAccumulator,
    mirror: EF21Mirror,
) -> bool:
    """The exact test. Every coefficient a step takes is <= gamma (``gamma / K`` for the
    mean, ``gamma * scale / n`` for EF21), and ``x - c*a`` lies between ``x`` and
    ``x - gamma*a``, so gamma is the worst case."""
    with np.errstate(over="ignore", invalid="ignore"):
        if update.semantics == "ef21":
            h = mirror.h.get(agent)
            if h is not None:
                mine = h.copy()
                update.add_to(mine)
                if not _safe(mine):
                    return False
            total = np.zeros(x.size) if mirror.sum_h is None else mirror.sum_h.copy()
            update.add_to(total)
        else:
            acc.flush()  # adds the pending updates in arrival order: the same floats later
            total = acc.acc.copy()
            update.add_to(total, weight)
        return _safe(total) and _safe(x - gamma * total)


class UpdateGuard:
    """The bounds above for one job (mutable; the engine owns one)."""

    __slots__ = ("_median", "_norms", "ef21_bound", "limits", "round_bound", "x_bound")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._norms: deque[float] = deque(maxlen=NORM_WINDOW)
        self._median: float | None = None  # of _norms, cached until the next append
        self.x_bound = 0.0  # >= max |x|
        self.round_bound = 0.0  # >= max |acc| of the open mean round
        self.ef21_bound = 0.0  # >= max |sum_h| and every max |h_i| (EF21)

    # ------------------------------------------------------------------ checks

    def check(
        self,
        update: Update,
        *,
        agent: str,
        gamma: float,
        weight: float,
        x: FloatArray,
        acc: MeanAccumulator,
        mirror: EF21Mirror,
    ) -> tuple[float, float]:
        """``(norm, max |value|)`` of an update that may enter the step; else Reject."""
        vals = update.dense_values()
        top = _max_abs(vals)
        norm = top * math.sqrt(float(np.square(vals / top).sum())) if top > 0 else 0.0
        ef21 = update.semantics == "ef21"
        if not math.isfinite(norm):
            raise Reject("too_large", f"{agent}: the update's norm overflows float64")
        if not ef21:
            self._check_norm(agent, norm)
        grown = (self.ef21_bound if ef21 else self.round_bound) + weight * top
        if grown < _SAFE and self.x_bound + gamma * grown < _SAFE:
            return norm, top
        if not _step_finite(update, agent, gamma, weight, x, acc, mirror):
            raise Reject(
                "would_diverge",
                f"{agent}: with this update (max |value| {top:.3g}) the step at "
                f"gamma={gamma:.3g} would make the model non-finite",
            )
        return norm, top

    def _check_norm(self, agent: str, norm: float) -> None:
        if len(self._norms) < self.limits.update_norm_warmup:
            return
        if self._median is None:
            self._median = statistics.median(self._norms)
        cap = self.limits.update_norm_factor * self._median
        if self._median > 0 and norm > cap:
            raise Reject(
                "too_large",
                f"{agent}: norm {norm:.3g} > {self.limits.update_norm_factor:g} x the median "
                f"{self._median:.3g} of the last {len(self._norms)} accepted updates",
            )

    # ------------------------------------------------------------------ bookkeeping

    def accepted(self, norm: float, top: float, *, ef21: bool, weight: float) -> None:
        """An update passed :meth:`check` and entered the state (``weight``: in the step)."""
        if ef21:
            self.ef21_bound += top  # h_i and sum_h each moved by at most top
            return
        self._norms.append(norm)
        self._median = None
        self.round_bound += weight * top

    def state_dropped(self, h: FloatArray) -> None:
        """An EF21 state h_i was subtracted from sum_h."""
        self.ef21_bound += _max_abs(h)

    def stepped(self, x: FloatArray, changed: npt.NDArray[np.int64]) -> None:
        """A step changed ``x`` at ``changed``; the next round starts empty."""
        if changed.size:
            self.x_bound = max(self.x_bound, _max_abs(x[changed]))
        self.round_bound = 0.0

    def round_dropped(self) -> None:
        self.round_bound = 0.0

    def sync(self, x: FloatArray, acc: FloatArray, mirror: EF21Mirror) -> None:
        """Exact bounds for a restored state."""
        self.x_bound = _max_abs(x)
        self.round_bound = _max_abs(acc)
        states = [_max_abs(h) for h in mirror.h.values()]
        if mirror.sum_h is not None:
            states.append(_max_abs(mirror.sum_h))
        self.ef21_bound = max(states, default=0.0)

    # ------------------------------------------------------------------ persistence

    def export(self) -> list[float]:
        """The norm window (JSON-able; a checkpoint stores it)."""
        return list(self._norms)

    def restore(self, norms: Sequence[float] | None) -> None:
        """Load :meth:`export`'s window (None: a checkpoint written before the guard)."""
        self._norms = deque((float(n) for n in norms or ()), maxlen=NORM_WINDOW)
        self._median = None
