"""High-precision reference optimum ``f*`` for relative suboptimality, and a certified
floor under it.

The simulator and the benchmarks report ``(f(x_k) - f*) / (f(x_0) - f*)``;
that needs ``f*`` far more accurately than the methods under test reach, so
it is computed once, offline, by L-BFGS (pure numpy: two-loop recursion,
memory 20 by default, backtracking line search that accepts either the
Armijo condition or Hager-Zhang's approximate Wolfe conditions, the latter
keeping progress possible when differences of ``f`` fall below rounding).

The aggregator service solves the same problem on its evaluation data for the least the
evaluation loss can be (:func:`loss_floor`, ``AGG_LOSS_FLOOR=auto``): ``/status``'s ETA
needs it while the loss decreases still grow.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from edge_agent.data import Dataset
from edge_agent.data.sparse import FloatArray
from edge_agent.errors import DataError
from edge_agent.numerics.models import Model

__all__ = ["Floor", "LBFGSResult", "lbfgs", "loss_floor", "solve_optimum"]

_ARMIJO = 1e-4  # sufficient decrease constant c1
_HZ_DELTA = 0.1  # approximate Wolfe: phi'(a) <= (2 delta - 1) phi'(0)
_HZ_SIGMA = 0.9  # approximate Wolfe: phi'(a) >= sigma phi'(0)
_HZ_EPS = 1e-14  # approximate Wolfe: allowed relative rise of f (rounding level)
_MAX_TRIALS = 60  # line-search trials before giving up on a direction
_ROUNDING = 1e-12  # relative rounding allowed in an evaluation of f (a mean over the rows)


@dataclass(frozen=True)
class LBFGSResult:
    """Outcome of :func:`lbfgs`.

    ``x`` the final point, ``f`` its objective value, ``grad_norm`` the
    Euclidean norm of the gradient there, ``iterations`` the accepted steps,
    ``evaluations`` the objective/gradient evaluations, ``converged`` whether
    the gradient tolerance was met (False: ``max_iter`` reached, or no
    further progress is possible in float64).
    """

    x: FloatArray
    f: float
    grad_norm: float
    iterations: int
    evaluations: int
    converged: bool


def _two_loop(g: FloatArray, pairs: deque[tuple[FloatArray, FloatArray, float]]) -> FloatArray:
    """Return ``-H g`` for the L-BFGS inverse-Hessian approximation ``H`` held in ``pairs``."""
    q = g.copy()
    alphas: list[float] = []
    for s, y, rho in reversed(pairs):
        a = rho * float(s @ q)
        alphas.append(a)
        q -= a * y
    if pairs:
        s, y, _ = pairs[-1]
        q *= float(s @ y) / float(y @ y)
    else:
        q /= max(float(np.linalg.norm(g)), 1.0)
    for (s, y, rho), a in zip(pairs, reversed(alphas), strict=True):
        b = rho * float(y @ q)
        q += (a - b) * s
    return -q


def lbfgs(
    fun: Callable[[FloatArray], tuple[float, FloatArray]],
    x0: npt.ArrayLike,
    *,
    tol: float = 1e-12,
    max_iter: int = 2000,
    memory: int = 20,
    stop: Callable[[], bool] | None = None,
) -> LBFGSResult:
    """Minimise a smooth function with L-BFGS.

    ``fun(x)`` returns ``(f(x), grad f(x))``. Stops when
    ``|grad f(x)|_2 <= tol * max(1, |grad f(x0)|_2)``, after ``max_iter``
    iterations, when no step along the steepest-descent direction makes
    progress in float64, or when ``stop()`` (asked before each iteration) is true.
    Curvature pairs with ``s^T y <= 0`` are skipped.
    """
    if tol <= 0 or max_iter < 0 or memory < 1:
        raise DataError(
            f"lbfgs: need tol > 0, max_iter >= 0, memory >= 1; got {tol}, {max_iter}, {memory}"
        )
    x = np.array(x0, dtype=np.float64, copy=True)
    f, g = fun(x)
    evaluations = 1
    gnorm = float(np.linalg.norm(g))
    target = tol * max(1.0, gnorm)
    pairs: deque[tuple[FloatArray, FloatArray, float]] = deque(maxlen=memory)
    iterations = 0
    while gnorm > target and iterations < max_iter:
        if stop is not None and stop():
            break
        p = _two_loop(g, pairs)
        slope = float(g @ p)
        if not slope < 0.0:  # not a descent direction: restart from steepest descent
            pairs.clear()
            p = _two_loop(g, pairs)
            slope = float(g @ p)
        alpha = 1.0
        accepted = False
        for _ in range(_MAX_TRIALS):
            x_new = x + alpha * p
            f_new, g_new = fun(x_new)
            evaluations += 1
            slope_new = float(g_new @ p)
            armijo = f_new <= f + _ARMIJO * alpha * slope
            approx_wolfe = (
                f_new <= f + _HZ_EPS * abs(f)
                and _HZ_SIGMA * slope <= slope_new <= (2 * _HZ_DELTA - 1) * slope
            )
            if np.isfinite(f_new) and (armijo or approx_wolfe):
                accepted = True
                break
            # Safeguarded quadratic interpolation of phi on [0, alpha].
            denom = 2.0 * (f_new - f - slope * alpha)
            trial = (
                -slope * alpha * alpha / denom if np.isfinite(denom) and denom > 0 else 0.5 * alpha
            )
            alpha = min(max(trial, 0.1 * alpha), 0.5 * alpha)
        if not accepted:
            if pairs:  # the quasi-Newton model is stale: retry along -g
                pairs.clear()
                continue
            break  # no progress possible along -g: converged to float64 precision
        s = x_new - x
        y = g_new - g
        sy = float(s @ y)
        if sy > 1e-16 * float(np.linalg.norm(s)) * float(np.linalg.norm(y)):
            pairs.append((s, y, 1.0 / sy))
        x, f, g = x_new, f_new, g_new
        gnorm = float(np.linalg.norm(g))
        iterations += 1
    return LBFGSResult(
        x=x,
        f=float(f),
        grad_norm=gnorm,
        iterations=iterations,
        evaluations=evaluations,
        converged=gnorm <= target,
    )


def solve_optimum(
    model: Model,
    data: Dataset,
    *,
    x0: npt.ArrayLike | None = None,
    tol: float = 1e-12,
    max_iter: int = 2000,
) -> tuple[FloatArray, float]:
    """Return ``(x*, f*)``: the minimiser of ``model.loss`` on ``data`` and its value.

    Runs :func:`lbfgs` (memory 20) from ``x0`` (default zeros) until the
    gradient norm is below ``tol * max(1, |grad f(x0)|)``. For the
    strongly convex models (``l2 > 0``) the returned ``f*`` is then within
    ``|grad|^2 / (2 l2)`` of the true minimum, i.e. at rounding level.
    """
    start = model.initial_point() if x0 is None else np.asarray(x0, dtype=np.float64)
    if start.shape != (model.d,):
        raise DataError(f"solve_optimum: x0 must have shape ({model.d},), got {start.shape}")

    def fun(x: FloatArray) -> tuple[float, FloatArray]:
        return model.loss_grad(x, data)

    result = lbfgs(fun, start, tol=tol, max_iter=max_iter, memory=20)
    return result.x, result.f


@dataclass(frozen=True)
class Floor:
    """Outcome of :func:`loss_floor`. ``value``: the floor; ``certified``: it is a proven
    lower bound on the minimum (``l2 > 0``), else it is the solver's best value;
    ``f``, ``grad_norm``, ``iterations``, ``converged``: the solver's."""

    value: float
    certified: bool
    f: float
    grad_norm: float
    iterations: int
    converged: bool


def loss_floor(
    model: Model,
    data: Dataset,
    *,
    tol: float = 1e-10,
    max_iter: int = 5000,
    stop: Callable[[], bool] | None = None,
) -> Floor:
    """The least ``model.loss`` can be on ``data``: L-BFGS from the model's initial point,
    then, for ``l2 > 0``, the strong-convexity bound ``f* >= f(x) - |grad f(x)|^2 /
    (2 l2)`` at the point it stopped (a lower bound however early it stopped; less the
    rounding of ``f``'s evaluation, ``1e-12 |f|``), never below
    0 (every loss here is non-negative). With ``l2 = 0`` there is no such bound: the value
    is the solver's ``f``, at or above the minimum."""

    def fun(x: FloatArray) -> tuple[float, FloatArray]:
        return model.loss_grad(x, data)

    r = lbfgs(fun, model.initial_point(), tol=tol, max_iter=max_iter, stop=stop)
    certified = model.l2 > 0.0
    value = r.f - r.grad_norm**2 / (2.0 * model.l2) - _ROUNDING * abs(r.f) if certified else r.f
    return Floor(value=max(0.0, value), certified=certified, f=r.f, grad_norm=r.grad_norm,
                 iterations=r.iterations, converged=r.converged)  # fmt: skip
