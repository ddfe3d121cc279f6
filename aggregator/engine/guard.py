"""Update magnitude bounds: no single update may blow the model up or make it non-finite.

The engine asks :class:`UpdateGuard` about every admitted update before it changes
anything (:meth:`aggregator.engine.rounds.RoundEngine.handle`). Two refusals:

``too_large``
    a mean-family update (``plain``, ``ef``, ``dir``) whose L2 norm exceeds
    ``Limits.update_norm_factor`` times the reference norm, once
    ``Limits.update_norm_warmup`` were accepted. The reference is the median over agents of
    each agent's last accepted norm: every agent weighs once, however many updates it
    sends. (It was the median of the last 256 accepted norms: with two agents one hostile
    filled half that window, pulled the reference with its own norms, and after it had
    poisoned the model the honest agent's updates were refused ``too_large`` 97 times in a
    row and the job stalled.) With three agents or more one hostile cannot move the
    reference outside the honest agents' norms; with two, the reference lies between the
    two and the honest agent's update is never refused for the hostile's sake. EF21
    changes are not compared: they shrink as the method converges, so a rejoining agent's
    first change is legitimately far above the median. A norm that overflows float64 is
    always too large.
``would_diverge``
    the open round's step, taken with this update at the current step size, would hold
    nan, inf or a magnitude of 1e300 or more (e.g. one finite top-k value of 1e308); for
    an EF21 change, the same for the agent's state and sum_h. The test is exact; a cheap upper
    bound (``max|x| + gamma * (bound of the accumulated values + max|u|)`` far below
    float64's limit) answers it for every ordinary update without touching d entries.

Decisions depend only on state a checkpoint restores (the model, the round's
accumulator, the EF21 sums, and the agents' last norms, which the checkpoint stores), so a
journal replay refuses exactly what was refused live: the bounds kept here are upper
bounds, and whenever the cheap bound does not answer, the exact test does.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from aggregator.engine.admission import Limits, Reject
from edge_agent.numerics.aggregation import EF21Mirror, MeanAccumulator
from edge_agent.numerics.compressors import Update

FloatArray = npt.NDArray[np.float64]

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

    __slots__ = ("_count", "_latest", "_median", "_sorted", "ef21_bound", "limits",
                 "round_bound", "x_bound")  # fmt: skip

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._latest: dict[str, float] = {}  # agent -> its last accepted norm
        self._sorted: list[float] = []  # the values of _latest, sorted
        self._count = 0  # mean-family updates accepted (the warm-up)
        self._median: float | None = None  # of _sorted, cached until it changes
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

    @property
    def reference(self) -> float | None:
        """The median over agents of their last accepted norms (None: none yet)."""
        s, n = self._sorted, len(self._sorted)
        if self._median is None and n:
            self._median = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
        return self._median

    def _check_norm(self, agent: str, norm: float) -> None:
        if self._count < self.limits.update_norm_warmup:
            return
        ref = self.reference
        if ref is not None and ref > 0 and norm > self.limits.update_norm_factor * ref:
            raise Reject(
                "too_large",
                f"{agent}: norm {norm:.3g} > {self.limits.update_norm_factor:g} x the median "
                f"{ref:.3g} of {len(self._sorted)} agents' last accepted norms",
            )

    # ------------------------------------------------------------------ bookkeeping

    def accepted(self, agent: str, norm: float, top: float, *, ef21: bool, weight: float) -> None:
        """An update of ``agent`` passed :meth:`check` and entered the state (``weight``:
        in the step)."""
        if ef21:
            self.ef21_bound += top  # h_i and sum_h each moved by at most top
            return
        self._set(agent, norm)
        self._count += 1
        self.round_bound += weight * top

    def _set(self, agent: str, norm: float) -> None:
        old = self._latest.get(agent)
        if old is not None:
            del self._sorted[bisect_left(self._sorted, old)]
        insort(self._sorted, norm)
        self._latest[agent] = norm
        self._median = None

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

    def export(self) -> dict[str, Any]:
        """The agents' last norms and the warm-up count (JSON-able; a checkpoint stores it)."""
        return {"latest": dict(self._latest), "count": self._count}

    def restore(self, saved: Mapping[str, Any] | Sequence[float] | None) -> None:
        """Load :meth:`export`'s state (None: a checkpoint written before the guard; a list:
        the norm window of a checkpoint from before the per-agent reference, one entry each)."""
        self._latest, self._sorted, self._median = {}, [], None
        if isinstance(saved, Mapping):
            latest = {str(a): float(n) for a, n in saved["latest"].items()}
            count = int(saved["count"])
        else:
            latest = {f"#{i}": float(n) for i, n in enumerate(saved or ())}
            count = len(latest)
        for agent, norm in latest.items():
            self._set(agent, norm)
        self._count = count
