"""When the job reaches its target loss, from the recent rate of loss decrease (``/status``
``eta``; docs/http-api.md says the method).

Versions left. Over the last :data:`WINDOW` decreases (``WINDOW + 1`` versions with a
loss), the decreases ``D_i = loss_{i-1} - loss_i`` of a linearly converging run fall
geometrically, ``D_i ~ D * rho^i``:
a least-squares line through ``(i, log D_i)`` gives ``rho``. The decrease still to come
after ``n`` more versions is ``D_last * rho * (1 - rho^n) / (1 - rho)``; the smallest ``n``
for which it covers ``loss - target`` is the versions left. Early in a run the decreases may
still grow (EF21's states ``h_i`` start at zero and fill over the first versions): while the
fit gives ``rho >= 1`` no rate of decay is measurable yet (``early``), and two counts
bracket what is to come:

* low: the decreases stay at the mean of the last two (``rho`` reported as 1). A linearly
  converging run's decreases fall later, so this count is low.
* high, only when the least the loss can be is known (``floor``: the optimum, or a bound
  below it): the loss above the floor keeps falling by the fraction per version of the last
  two. While the decreases still grow that fraction grows too, so this count is high.

With both, ``versions_left`` is their geometric mean (rounded, and never below the low
count) and ``versions_left_high`` the high count; without a floor it is the low count and
the ETA says it is a lower bound (``lower_bound``).

Seconds per version. The times between versions may grow too (CAT's T grows as the states
fill, and with it the slowest radio's airtime and silence): a least-squares line through
the window's times per version (less the one from version 0, which holds the start's
hellos) gives their trend, and each version to come takes the line's value at it, never
less than the last one; a falling line is not extrapolated (each version to come takes its
value at the last version, or the last time if that is more). With constant times this
is their mean. The ETA is the sum over the versions left. While the decreases still grow
(``early``) that trend is the high pace and the last version's time held is the low one:
with a floor the ETA takes the geometric mean of the two over the midpoint count,
``eta_low_s`` is the low count at the low pace and ``eta_high_s`` the high count at the
high pace. On the simulator's runs of the mixed LoRaWAN fleet at version 5 (docs/results.md,
"The ETA at version 5") this came within 2x of the time taken in 37 of 41 runs; the low
count at the trend's pace did in 23 of 39.

The window starts at the last of its first versions whose loss is exactly the first one's:
a version that moved nothing (the engine's local training opens with an empty one) carries
no rate. Unknown (None) when there is no target, fewer than :data:`MIN_POINTS` losses, a
later decrease in the window that is not positive, or the fitted decreases sum to less
than what is left (a plateau above the target). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

#: versions the fit looks back at
WINDOW: Final = 10
#: losses needed (three losses: two decreases, the fewest a line through them needs)
MIN_POINTS: Final = 3
#: an estimate of more versions than this is no estimate (it would only say "never")
MAX_VERSIONS_AHEAD: Final = 10_000_000

__all__ = ["MIN_POINTS", "WINDOW", "Eta", "estimate"]


@dataclass(frozen=True, slots=True)
class Eta:
    """``eta_s``: seconds after the last version's close (``at``, engine time) until the
    target is reached; ``versions_left``; ``rho``: the fitted ratio of successive
    decreases (1.0 while they still grow); ``seconds_per_version``: the mean over the
    versions left of the trend fitted on the window of ``window`` versions;
    ``early``: the decreases still grow (the module doc); ``eta_low_s`` / ``eta_high_s``:
    the ETA of the low and the high count (equal to ``eta_s`` when not early;
    ``eta_high_s`` None when early without a floor: no upper count)."""

    target_loss: float
    eta_s: float
    at: float
    versions_left: int
    rho: float
    seconds_per_version: float
    window: int
    early: bool = False
    eta_low_s: float | None = None
    eta_high_s: float | None = None
    versions_left_high: int | None = None

    @property
    def lower_bound(self) -> bool:
        """Early without a floor: ``eta_s`` is the low count's, and the target most likely later."""
        return self.early and self.eta_high_s is None


def estimate(
    points: Sequence[tuple[int, float, float | None]],
    target: float | None,
    floor: float | None = None,
) -> Eta | None:
    """The ETA from ``points``: (version, closed_at seconds, loss or None), in version
    order, with ``floor`` the least the loss can be (None: unknown); None when unknown (see
    the module doc)."""
    if target is None or not math.isfinite(target):
        return None
    rows = [(v, t, loss) for v, t, loss in points if loss is not None and math.isfinite(loss)]
    rows = rows[-(WINDOW + 1) :]
    while len(rows) > 1 and rows[1][2] == rows[0][2]:
        rows = rows[1:]  # versions that left the loss as it was (local training's empty first)
    if not rows:
        return None
    _, at, loss = rows[-1]
    if loss <= target:
        return Eta(target, 0.0, at, 0, 0.0, 0.0, len(rows), eta_low_s=0.0, eta_high_s=0.0)
    if len(rows) < MIN_POINTS:
        return None
    v = np.array([r[0] for r in rows], dtype=np.float64)
    t = np.array([r[1] for r in rows], dtype=np.float64)
    y = np.array([r[2] for r in rows], dtype=np.float64)
    dec = (y[:-1] - y[1:]) / np.maximum(v[1:] - v[:-1], 1.0)  # per version
    if not (dec > 0).all():
        return None
    n, rho = _versions_left(v, dec, loss - target)
    if n is None or n > MAX_VERSIONS_AHEAD:
        # the fitted decreases never cover what is left (a plateau), or only after more
        # versions than any job runs (a tiny first decrease): no estimate, and no array of n
        return None
    if rho < 1.0:
        steps = _steps_ahead(v, t, n)
        if not steps >= 0.0:
            return None
        return Eta(target, steps, at, n, rho, steps / n, len(rows), eta_low_s=steps,
                   eta_high_s=steps, versions_left_high=n)  # fmt: skip
    return _early(v, t, y, n, target, floor)


def _early(
    v: npt.NDArray[np.float64],
    t: npt.NDArray[np.float64],
    y: npt.NDArray[np.float64],
    low: int,
    target: float,
    floor: float | None,
) -> Eta | None:
    """The ETA while the decreases still grow: the low count ``low`` and, when the ``floor``
    is known, the high one; the count and the pace each at the geometric mean of their two
    extrapolations (the module doc)."""
    high = _versions_at_held_ratio(v, y, target, floor)
    low_s = _steps_held(v, t, low)
    if high is None:  # the low count at the trend's pace, as a lower bound
        mid, steps, high_s = low, _steps_ahead(v, t, low), None
    else:
        mid = max(low, round(math.sqrt(low * high)))
        steps = math.sqrt(_steps_ahead(v, t, mid) * _steps_held(v, t, mid))
        high_s = _steps_ahead(v, t, high)
    if not (low_s >= 0.0 and steps >= 0.0):
        return None
    return Eta(target, steps, float(t[-1]), mid, 1.0, steps / mid, len(v), early=True,
               eta_low_s=low_s, eta_high_s=high_s, versions_left_high=high)  # fmt: skip


def _steps_held(v: npt.NDArray[np.float64], t: npt.NDArray[np.float64], n: int) -> float:
    """Seconds for the next ``n`` versions, each at the last version's time (the pace held)."""
    return float(n * (t[-1] - t[-2]) / max(v[-1] - v[-2], 1.0))


def _versions_at_held_ratio(
    v: npt.NDArray[np.float64], y: npt.NDArray[np.float64], target: float, floor: float | None
) -> int | None:
    """The versions until the loss ``y[-1]`` reaches ``target`` if the loss above ``floor``
    keeps falling by the mean fraction per version of the last two (None: no floor, a target
    at or below it, or more versions than :data:`MAX_VERSIONS_AHEAD`)."""
    if floor is None or not math.isfinite(floor) or not target > floor or not y[-1] > floor:
        return None
    gaps = y[-3:] - floor
    if not (gaps > 0.0).all():
        return None
    per = np.log(gaps[1:] / gaps[:-1]) / np.maximum(np.diff(v[-3:]), 1.0)
    log_ratio = float(per.mean())  # < 0: every decrease is positive
    n = math.ceil(math.log((target - floor) / (y[-1] - floor)) / log_ratio - 1e-9)
    return max(1, n) if n <= MAX_VERSIONS_AHEAD else None


def _versions_left(
    v: npt.NDArray[np.float64], dec: npt.NDArray[np.float64], left: float
) -> tuple[int | None, float]:
    """The versions until the decreases ``dec`` (at versions ``v[1:]``) cover ``left``, and
    the fitted ratio (1.0: still growing, held at the mean of the last two)."""
    slope, intercept = np.polyfit(v[1:], np.log(dec), 1)
    rho = float(np.exp(slope))
    if rho >= 1.0:
        return max(1, math.ceil(left / float(dec[-2:].mean()) - 1e-9)), 1.0
    last = float(np.exp(intercept + slope * v[-1]))  # the fitted last decrease
    room = 1.0 - left * (1.0 - rho) / (last * rho)
    if room <= 0.0:
        return None, rho
    return max(1, math.ceil(math.log(room) / math.log(rho) - 1e-9)), rho


def _steps_ahead(v: npt.NDArray[np.float64], t: npt.NDArray[np.float64], n: int) -> float:
    """Seconds for the next ``n`` versions after ``v[-1]``: the trend of the window's times
    per version (the one from version 0 left out when others remain), never below the last."""
    per = np.diff(t) / np.maximum(np.diff(v), 1.0)
    at = v[1:]
    if v[0] == 0 and len(per) > 1:
        per, at = per[1:], at[1:]
    if len(per) < 2:
        return float(n * per[-1])
    slope, intercept = np.polyfit(at, per, 1)
    ahead = v[-1] + np.arange(1, n + 1, dtype=np.float64)
    if slope > 0:
        trend = intercept + float(slope) * ahead
    else:  # a falling line is not extrapolated: each version to come takes its value at the last
        trend = np.full(n, intercept + float(slope) * v[-1])
    return float(np.maximum(trend, per[-1]).sum())
