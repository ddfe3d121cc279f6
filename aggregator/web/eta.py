"""When the job reaches its target loss, from the recent rate of loss decrease (``/status``
``eta``; docs/http-api.md says the method).

Over the last :data:`WINDOW` versions with a loss, the decreases ``D_i = loss_{i-1} -
loss_i`` of a linearly converging run fall geometrically, ``D_i ~ D * rho^i``: a
least-squares line through ``(i, log D_i)`` gives ``rho``. The decrease still to come after
``n`` more versions is ``D_last * rho * (1 - rho^n) / (1 - rho)``; the smallest ``n`` for
which it covers ``loss - target`` is the versions left, and times the mean seconds per
version over the window it is the ETA. Unknown (None) when there is no target, fewer than
:data:`MIN_POINTS` losses, a decrease in the window that is not positive, ``rho >= 1``, or
the fitted decreases sum to less than what is left (a plateau above the target). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

#: versions the fit looks back at
WINDOW: Final = 10
#: losses needed (three losses: two decreases, the fewest a line through them needs)
MIN_POINTS: Final = 3

__all__ = ["MIN_POINTS", "WINDOW", "Eta", "estimate"]


@dataclass(frozen=True, slots=True)
class Eta:
    """``eta_s``: seconds after the last version's close (``at``, engine time) until the
    target is reached; ``versions_left``; ``rho``: the fitted ratio of successive
    decreases; ``seconds_per_version`` over the window of ``window`` versions."""

    target_loss: float
    eta_s: float
    at: float
    versions_left: int
    rho: float
    seconds_per_version: float
    window: int


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
    slope, intercept = np.polyfit(v[1:], np.log(dec), 1)
    rho = float(np.exp(slope))
    per_version = float((t[-1] - t[0]) / max(v[-1] - v[0], 1.0))
    if not 0.0 < rho < 1.0 or not per_version >= 0.0:
        return None
    last = float(np.exp(intercept + slope * v[-1]))  # the fitted last decrease
    left = loss - target
    room = 1.0 - left * (1.0 - rho) / (last * rho)
    if room <= 0.0:
        return None  # the fitted decreases never cover what is left: a plateau
    n = max(1, math.ceil(math.log(room) / math.log(rho) - 1e-9))
    return Eta(target, n * per_version, at, n, rho, per_version, len(rows))
