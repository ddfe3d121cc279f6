"""When the job reaches its target loss, from the recent rate of loss decrease (``/status``
``eta``; docs/http-api.md says the method).

Versions left. Over the last :data:`WINDOW` versions with a loss, the decreases ``D_i =
loss_{i-1} - loss_i`` of a linearly converging run fall geometrically, ``D_i ~ D * rho^i``:
a least-squares line through ``(i, log D_i)`` gives ``rho``. The decrease still to come
after ``n`` more versions is ``D_last * rho * (1 - rho^n) / (1 - rho)``; the smallest ``n``
for which it covers ``loss - target`` is the versions left. Early in a run the decreases may
still grow (EF21's states ``h_i`` start at zero and fill over the first versions): while the
fit gives ``rho >= 1`` the decreases are taken to stay at the mean of the last two
(``rho`` reported as 1), since no rate of decay is measurable yet; a linear run's decreases
fall later, so this count is low, not high, and the ETA says so (``lower_bound``).

Seconds per version. The times between versions may grow too (CAT's T grows as the states
fill, and with it the slowest radio's airtime and silence): a least-squares line through
the window's times per version (less the one from version 0, which holds the start's
hellos) gives their trend, and each version to come takes the line's value at it, never
less than the last one (the trend is not extrapolated downwards). With constant times this
is their mean. The ETA is the sum over the versions left.

Unknown (None) when there is no target, fewer than :data:`MIN_POINTS` losses, a decrease
in the window that is not positive, or the fitted decreases sum to less than what is left
(a plateau above the target). Pure.
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
    ``lower_bound``: the decreases still grow, so ``versions_left`` holds them at their
    recent level and the target will most likely be reached later than ``eta_s``."""

    target_loss: float
    eta_s: float
    at: float
    versions_left: int
    rho: float
    seconds_per_version: float
    window: int
    lower_bound: bool = False


def estimate(points: Sequence[tuple[int, float, float | None]], target: float | None) -> Eta | None:
    """The ETA from ``points``: (version, closed_at seconds, loss or None), in version
    order; None when unknown (see the module doc)."""
    if target is None or not math.isfinite(target):
        return None
    rows = [(v, t, loss) for v, t, loss in points if loss is not None and math.isfinite(loss)]
    rows = rows[-(WINDOW + 1) :]
    if not rows:
        return None
    _, at, loss = rows[-1]
    if loss <= target:
        return Eta(target, 0.0, at, 0, 0.0, 0.0, len(rows))
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
    steps = _steps_ahead(v, t, n)
    if not steps >= 0.0:
        return None
    return Eta(target, steps, at, n, rho, steps / n, len(rows), lower_bound=rho >= 1.0)


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
    trend = intercept + max(0.0, float(slope)) * ahead
    return float(np.maximum(trend, per[-1]).sum())
