"""Minibatch SGD on the agent: the step schedule, the gradient's variance, its CAT gains.

docs/algorithm.md, "Stochastic gradients (minibatch SGD)".

* :func:`scheduled_step`: ``min(gamma, 2 / (l2 (t + t0)))`` at model version ``t``, the
  engine's step for a stochastic job (aggregator.engine.stepsize uses it). An agent uses
  it to keep its error-feedback residual in model units (:class:`StepRatio`).
* :func:`batch_variance`: an estimate, per coordinate, of the variance of the minibatch
  gradient around the gradient of the whole shard, from the minibatch itself.
* :func:`noisy_gain` / :func:`variance_scale`: the expected decrease of ``f`` that a
  compressed stochastic vector guarantees once its noise is counted (the variance term of
  the SGD analysis), for topk, signtopk and randk.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from edge_agent.data import Dataset

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
GradFn = Callable[[Dataset], FloatArray]

#: groups the minibatch is cut into for :func:`batch_variance` (fewer when it has fewer rows)
VARIANCE_GROUPS = 8


def scheduled_step(gamma: float, version: int, l2: float | None, t0: float = 0.0) -> float:
    """``gamma`` decayed for stochastic gradients: ``min(gamma, 2 / (l2 (version + t0)))``.

    ``l2`` is the objective's strong-convexity constant lambda; None: no schedule, ``gamma``
    itself. Before the decay can bite (``version + t0 <= 0``) the step is ``gamma``.
    """
    if l2 is None:
        return gamma
    if not l2 > 0:
        raise ValueError(f"scheduled: the strong-convexity constant must be > 0, got {l2}")
    horizon = version + t0
    return gamma if horizon <= 0 else min(gamma, 2.0 / (l2 * horizon))


class StepRatio:
    """The factor that keeps a classic error-feedback residual in *model* units.

    The residual ``e`` of the update sent at version ``s`` was meant to move the model by
    ``gamma_s e``. Sent at version ``t`` in gradient units it moves it by ``gamma_t e``:
    under a decaying schedule an old residual is applied at a fraction of its weight.
    Multiplying it by ``gamma_s / gamma_t`` before it is added back is the error feedback
    ``e' = e + gamma_t g - C(e + gamma_t g)`` of the model-unit analysis, divided by
    ``gamma_t``. ``gamma`` is the agent's own ``1/L_i`` (the job's ``1/L`` on iid shards; it
    only decides where the decay starts); the ratio is only the agent's business (the
    aggregator applies classic-EF updates like plain ones), so an estimate is safe."""

    def __init__(self, gamma: float, l2: float, t0: float = 0.0) -> None:
        self.gamma, self.l2, self.t0 = gamma, l2, t0
        self._last: int | None = None

    def factor(self, version: int) -> float:
        """``gamma_last / gamma_version`` (1 on the first call), and remember ``version``."""
        now = scheduled_step(self.gamma, version, self.l2, self.t0)
        last = (
            now if self._last is None else scheduled_step(self.gamma, self._last, self.l2, self.t0)
        )
        self._last = version
        return last / now

    def reset(self) -> None:
        self._last = None


def batch_variance(grad: GradFn, batch: Dataset, n_rows: int, mean: FloatArray) -> FloatArray:
    """Per coordinate, the variance of the minibatch gradient ``mean`` (over ``batch``, drawn
    without replacement from a shard of ``n_rows``) around the shard's full gradient.

    The batch's B rows are cut into ``k = min(VARIANCE_GROUPS, B)`` consecutive groups of
    near-equal size (the rows are already a random draw); ``grad`` gives each group's mean
    gradient ``g_1..g_k``. Their spread estimates the per-row variance ``S_j^2``:
    ``S_j^2 ~ sum_g b_g (g_gj - mean_j)^2 / (k - 1)``, unbiased for groups of one row and
    for equal groups. The variance of a mean of B rows drawn without replacement is
    ``(1 - B/n) S_j^2 / B``. A batch of one row, or the whole shard, has no estimate: zeros.
    Cost: ``k`` gradient passes over ``B/k`` rows each (about one more pass over the batch)
    and ``k`` vectors of ``d``."""
    rows = batch.n_rows
    k = min(VARIANCE_GROUPS, rows)
    if k < 2 or rows >= n_rows:
        return np.zeros_like(mean)
    bounds = np.linspace(0, rows, k + 1).round().astype(np.int64)
    spread = np.zeros_like(mean)
    for lo, hi in itertools.pairwise(bounds):  # k groups, not d entries
        dev = grad(batch.take(np.arange(lo, hi))) - mean
        spread += (hi - lo) * dev * dev
    per_row = spread / (k - 1)
    return np.asarray((1.0 - rows / n_rows) * per_row / rows, dtype=np.float64)


def noisy_gain(
    compressor: str, sorted_mags: FloatArray, sorted_var: FloatArray, t: IntArray
) -> FloatArray:
    """``2L`` times the expected decrease of the update of the top ``t`` entries of a noisy
    vector ``v`` (``sorted_mags``: ``|v|`` in decreasing order, ``sorted_var``: the noise
    variance of the same entries), the compressor's values and scale as sent.

    With ``v_j = m_j + n_j`` (``m_j`` the noiseless value, ``E n_j = 0``, ``E n_j^2 =
    s_j``) the decrease is ``<m, u> - |u|^2 / 2`` (times ``1/L``). ``m_j v_j`` is estimated
    without bias by ``v_j^2 - s_j``: topk (``u = v`` on the set) gives
    ``sum (v_j^2 - 2 s_j)``, the deterministic ``A2(T)`` less twice the noise it carries;
    signtopk (``u = A1/T sign(v)``) gives ``A1^2/T - 2 (A1/T) sum s_j / |v_j|``. Both fall
    to the deterministic gains at zero variance."""
    if compressor == "topk":
        return np.asarray(np.cumsum(sorted_mags * sorted_mags - 2.0 * sorted_var)[t - 1])
    a1 = np.cumsum(sorted_mags)[t - 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        shrink = np.where(sorted_mags > 0, sorted_var / sorted_mags, 0.0)
    return np.asarray(a1 * a1 / t - 2.0 * (a1 / t) * np.cumsum(shrink)[t - 1])


def variance_scale(norm2: float, variance: float, second_moment: float) -> float:
    """randk's scale ``rho`` with the noise counted: the expected decrease
    ``rho |m|^2 - rho^2 E|u|^2 / 2`` is largest at ``rho = |m|^2 / E|u|^2``; ``|m|^2`` is
    estimated by ``|v|^2 - tr Cov`` (``norm2 - variance``, at least 0), ``E|u|^2`` by
    ``V(T)`` of the noisy vector (``second_moment``)."""
    if not second_moment > 0:
        return 0.0
    return max(norm2 - variance, 0.0) / second_moment
