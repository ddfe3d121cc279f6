"""Linear models the agents train: losses, gradients and smoothness constants.

Every model is an l2-regularised empirical risk over the local rows,

    f(x) = (1/N) sum_i loss_i(a_i, x) + (l2 / 2) * |x|^2,

evaluated on a :class:`~edge_agent.data.Dataset` with a dense or CSR design
matrix. Registry :data:`MODELS`:

* ``logreg``: binary logistic regression, labels in ``{-1, +1}`` (``0`` read
  as ``-1``); ``loss_i = log(1 + exp(-y_i a_i^T x))``. ``d = n_features``.
* ``lsq``: least squares, ``loss_i = (a_i^T x - y_i)^2 / 2``. ``d = n_features``.
* ``softmax``: multinomial logistic regression, labels ``0 .. K-1`` (for
  ``K = 2``, ``{-1, +1}`` is read as ``{0, 1}``); parameters are a
  ``(n_features, K)`` matrix flattened row-major, ``d = n_features * K``.

Everything is vectorised numpy with no Python loop over rows or features,
numerically stable for large margins (no overflow warnings), and does no I/O.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from edge_agent.data import Dataset
from edge_agent.data.sparse import (
    ColumnPass,
    FloatArray,
    IndexArray,
    Matrix,
    matmat,
    matvec,
    rmatmat,
    rmatvec,
    row_norms_sq,
    sum_sq_norm,
)
from edge_agent.errors import DataError, lookup

__all__ = [
    "MODELS",
    "SAFETY_FACTOR",
    "CurvaturePass",
    "LeastSquares",
    "LogisticRegression",
    "Model",
    "SoftmaxRegression",
    "make_model",
    "power_iteration",
]

SAFETY_FACTOR = 1.01
"""Multiplier applied to the power-iteration estimate of sigma_max(A)^2.

Power iteration approaches the top eigenvalue of A^T A from below; once its
relative change is under 1e-6 the estimate is within a fraction of a percent
in practice, and the 1 % margin turns it into an upper bound."""


def power_iteration(
    a: Matrix,
    *,
    iters: int = 50,
    rng: np.random.Generator,
    rtol: float = 1e-6,
) -> float:
    """Estimate ``sigma_max(a)^2`` (top eigenvalue of ``a^T a``) from below.

    Starts from a standard normal vector drawn from ``rng`` and iterates
    ``v <- a^T a v / |a^T a v|`` until the estimate ``|a^T a v|`` (``v`` unit,
    a lower bound on the top eigenvalue that increases towards it) changes by
    less than ``rtol`` relative, or ``iters`` steps. Returns 0 for a zero matrix.

    A start with almost nothing along the top eigenvector settles near a lower eigenvalue
    first, and the relative-change test can stop there (seen: 7 % below sigma_max^2 where
    the top two singular values were 4.43 and 4.26). So the answer is checked: the same
    iteration on the complement of ``v`` (a second start built from the first, no further
    draws from ``rng``) holds the top eigenvalue if ``v`` missed it; when it finds more, the
    iteration goes on from there. A converged estimate is returned unchanged.
    """
    if iters < 1:
        raise DataError(f"power_iteration: iters must be >= 1, got {iters}")
    start: FloatArray = np.asarray(rng.standard_normal(size=(int(a.shape[1]),)), dtype=np.float64)
    estimate, v = _power_steps(a, start, iters, rtol, None)
    if estimate == 0.0 or v.size < 2:
        return estimate
    other, u = _power_steps(a, start[::-1].copy(), iters, rtol, v)
    if other > estimate * (1.0 + rtol):
        estimate = max(other, _power_steps(a, u, iters, rtol, None)[0])
    return estimate


def _power_steps(
    a: Matrix, v: FloatArray, iters: int, rtol: float, away: FloatArray | None
) -> tuple[float, FloatArray]:
    """Power iteration from ``v`` (kept orthogonal to the unit vector ``away`` if given): the
    largest estimate seen and the last iterate (0 and ``v`` for a zero start or matrix)."""
    if away is not None:
        v -= (away @ v) * away
    norm = float(np.linalg.norm(v))
    if norm == 0.0:
        return 0.0, v
    v = v / norm
    estimate = 0.0
    for _ in range(iters):
        w = rmatvec(a, matvec(a, v))
        if away is not None:
            w -= (away @ w) * away
        new = float(np.linalg.norm(w))
        if new == 0.0:
            return estimate, v
        v = w / new
        done = abs(new - estimate) <= rtol * new
        estimate = max(estimate, new)
        if done:
            break
    return estimate, v


@dataclass(frozen=True, kw_only=True)
class Model(ABC):
    """An l2-regularised linear model over ``n_features`` inputs.

    Parameters ``x`` are float64 vectors of length :attr:`d`. ``loss`` is
    the mean loss over the rows plus ``l2/2 |x|^2`` (dimensionless);
    ``grad`` its gradient. :class:`DataError` is raised when ``x`` or the
    data do not fit the model, or the data have no rows.
    """

    n_features: int
    n_classes: int = 2
    l2: float = 1e-3

    kind: ClassVar[str]
    curvature: ClassVar[float]
    """Upper bound on the second derivative of the per-row loss in its score(s)."""

    def __post_init__(self) -> None:
        if self.n_features < 1:
            raise DataError(f"model {self.kind}: n_features must be >= 1, got {self.n_features}")
        if not (np.isfinite(self.l2) and self.l2 >= 0.0):
            raise DataError(f"model {self.kind}: l2 must be finite and >= 0, got {self.l2}")
        self._check_classes()

    def _check_classes(self) -> None:
        if self.n_classes != 2:
            raise DataError(
                f"model {self.kind} is binary: n_classes must be 2, got {self.n_classes}; "
                "use 'softmax' for more classes"
            )

    # ---------------------------------------------------------------- shape
    @property
    def d(self) -> int:
        """Number of parameters."""
        return self.n_features

    def initial_point(self) -> FloatArray:
        """The all-zeros starting point, shape ``(d,)``."""
        return np.zeros(self.d, dtype=np.float64)

    # ------------------------------------------------------------- objective
    def loss(self, x: npt.ArrayLike, data: Dataset) -> float:
        """Return ``f(x)``: mean loss over the rows of ``data`` plus ``l2/2 |x|^2``."""
        xv = self._check(x, data)
        value, _ = self._data_loss_grad(xv, data, with_grad=False)
        return value + 0.5 * self.l2 * float(np.einsum("i,i->", xv, xv))

    def grad(self, x: npt.ArrayLike, data: Dataset) -> FloatArray:
        """Return the gradient of :meth:`loss`, shape ``(d,)``."""
        return self.loss_grad(x, data)[1]

    def loss_grad(self, x: npt.ArrayLike, data: Dataset) -> tuple[float, FloatArray]:
        """Return ``(loss, grad)`` in one pass over the data (the scores are shared)."""
        xv = self._check(x, data)
        value, g = self._data_loss_grad(xv, data, with_grad=True)
        assert g is not None
        return value + 0.5 * self.l2 * float(np.einsum("i,i->", xv, xv)), g + self.l2 * xv

    def smoothness(self, data: Dataset, *, iters: int = 50, rng: np.random.Generator) -> float:
        """Upper bound ``L`` on the Lipschitz constant of :meth:`grad` over these rows.

        ``L = curvature * SAFETY_FACTOR * sigma_max(A)^2 / N + l2``, where the
        Hessian of the data term is ``A^T D A / N`` with ``D <= curvature``:
        1/4 for logreg (sigmoid derivative), 1 for lsq, 1/2 for softmax (top
        eigenvalue of ``diag(p) - p p^T``, Kronecker with ``a a^T``).
        ``sigma_max(A)^2`` is taken as ``min(SAFETY_FACTOR * p, |A|_F^2)``
        where ``p`` is the :func:`power_iteration` estimate after at most
        ``iters`` steps (see :data:`SAFETY_FACTOR`; raise ``iters`` when the
        two top singular values of the data are very close).
        """
        n = self._rows(data)
        top = power_iteration(data.X, iters=iters, rng=rng)
        # |A|_F^2 = trace(A^T A) >= sigma_max^2 always, so the cap keeps the bound valid.
        frobenius_sq = float(np.sum(row_norms_sq(data.X)))
        return self.curvature * min(SAFETY_FACTOR * top, frobenius_sq) / n + self.l2

    # ------------------------------------------------- directional curvature
    def directional_curvature(
        self, data: Dataset, indices: npt.ArrayLike | None, values: npt.ArrayLike
    ) -> float:
        """Upper bound ``B(q) >= q^T Hess f(x) q`` valid at every ``x``, on these rows.

        ``q`` is sparse: ``values`` at the distinct parameter ``indices`` (``None``: dense,
        ``values`` has all ``d`` entries). ``B(q) = curvature * |A Q|_F^2 / N + l2 |q|^2``
        with ``Q`` the ``(n_features, classes)`` matrix of ``q`` (one column for the binary
        models); the data-term Hessian is ``A^T D(x) A / N`` with ``D(x) <= curvature``
        (1/4 logreg, 1 lsq where it is an equality, 1/2 softmax: docs/curvature.md).
        Dimension: objective per squared parameter unit; ``B(q) <= L |q|^2``.
        Only the columns ``q`` touches are read (a cached column index of a CSR shard).
        """
        n = self._rows(data)
        if indices is None:
            qv = np.asarray(values, dtype=np.float64)
            if qv.shape != (self.d,):
                raise DataError(
                    f"model {self.kind}: a dense direction needs shape ({self.d},), got {qv.shape}"
                )
            aq = self._direction_product(data.X, qv).reshape(-1)
            sq = float(np.einsum("i,i->", aq, aq))
            return self.curvature * sq / n + self.l2 * float(np.einsum("i,i->", qv, qv))
        idx, qv = self._sparse_direction(indices, values)
        cols, slots, n_slots = self._direction_layout(idx)
        sq = sum_sq_norm(data.X, cols, qv, slots=slots, n_slots=n_slots)
        return self.curvature * sq / n + self.l2 * float(np.einsum("i,i->", qv, qv))

    def prefix_curvature(
        self, data: Dataset, indices: npt.ArrayLike, values: npt.ArrayLike
    ) -> FloatArray:
        """:meth:`directional_curvature` of every prefix: ``out[T-1] = B(q_T)`` where
        ``q_T`` holds the first ``T`` listed entries (``T = 1 .. len(indices)``).

        One incremental pass over the listed columns in list order
        (:class:`CurvaturePass`), about the cost of one gradient when the columns hold
        most of the shard's non-zeros, less otherwise.
        """
        return CurvaturePass(self, data).extend(indices, values)

    def _direction_product(self, a: Matrix, q: FloatArray) -> FloatArray:
        """``A Q`` for a dense direction (the scores' change along ``q``)."""
        return matvec(a, q)

    def _direction_layout(self, idx: IndexArray) -> tuple[IndexArray, IndexArray | None, int]:
        """Design-matrix column, score slot and slot count of parameter indices."""
        return idx, None, 1

    def _sparse_direction(
        self, indices: npt.ArrayLike, values: npt.ArrayLike
    ) -> tuple[IndexArray, FloatArray]:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        qv = np.asarray(values, dtype=np.float64).reshape(-1)
        if idx.shape != qv.shape:
            raise DataError(
                f"model {self.kind}: direction has {idx.size} indices but {qv.size} values"
            )
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.d):
            raise DataError(f"model {self.kind}: direction indices must lie in [0, {self.d})")
        if idx.size and int(np.bincount(idx, minlength=self.d).max()) > 1:
            raise DataError(f"model {self.kind}: direction indices must be distinct")
        if not np.isfinite(qv).all():
            raise DataError(f"model {self.kind}: direction values must be finite")
        return idx, qv

    def accuracy(self, x: npt.ArrayLike, data: Dataset) -> float:
        """Fraction of rows whose label :meth:`predict` gets right, in ``[0, 1]``."""
        truth = self._targets(data)
        return float(np.mean(self.predict(x, data) == truth))

    @abstractmethod
    def predict(self, x: npt.ArrayLike, data: Dataset) -> FloatArray:
        """Predicted label of every row (same encoding as the model's labels)."""

    # ------------------------------------------------------------ internals
    @abstractmethod
    def _targets(self, data: Dataset) -> FloatArray:
        """The labels of ``data`` in the model's encoding (validated)."""

    @abstractmethod
    def _data_loss_grad(
        self, x: FloatArray, data: Dataset, *, with_grad: bool
    ) -> tuple[float, FloatArray | None]:
        """Mean data loss and (if asked) its gradient, without the l2 term."""

    def _rows(self, data: Dataset) -> int:
        if data.n_rows == 0:
            raise DataError(f"model {self.kind}: the dataset has no rows")
        if data.n_features != self.n_features:
            raise DataError(
                f"model {self.kind}: data has {data.n_features} features, "
                f"the model expects n_features={self.n_features}"
            )
        return data.n_rows

    def _check(self, x: npt.ArrayLike, data: Dataset) -> FloatArray:
        self._rows(data)
        xv = np.asarray(x, dtype=np.float64)
        if xv.shape != (self.d,):
            raise DataError(f"model {self.kind}: x must have shape ({self.d},), got {xv.shape}")
        return xv


class CurvaturePass:
    """``B(q_T)`` (:meth:`Model.directional_curvature`) for a direction built entry by entry.

    :meth:`extend` appends entries (indices distinct over the whole pass) and returns the
    bound after each of them; the running ``A Q`` is kept (:class:`~edge_agent.data.sparse.ColumnPass`),
    so a caller can look at the first entries and extend only when it needs more.
    """

    def __init__(self, model: Model, data: Dataset) -> None:
        self.model = model
        self.data = data
        self.n = model._rows(data)
        _, _, n_slots = model._direction_layout(np.zeros(0, dtype=np.int64))
        self._pass = ColumnPass(data.X, n_slots=n_slots)
        self._qq = 0.0
        self._used = np.zeros(model.d, dtype=bool)

    def extend(self, indices: npt.ArrayLike, values: npt.ArrayLike) -> FloatArray:
        """Append the entries in order; return ``B(q_T)`` after each of them."""
        model = self.model
        idx, qv = model._sparse_direction(indices, values)
        if idx.size and bool(self._used[idx].any()):
            raise DataError(f"model {model.kind}: direction indices must be distinct")
        self._used[idx] = True
        cols, slots, _ = model._direction_layout(idx)
        sq = self._pass.extend(cols, qv, slots=slots)
        qq = self._qq + np.cumsum(qv * qv)
        if qq.size:
            self._qq = float(qq[-1])
        return np.asarray(model.curvature * sq / self.n + model.l2 * qq, dtype=np.float64)


def _pm1_labels(y: FloatArray, kind: str) -> FloatArray:
    """Labels as ``-1.0 / +1.0``; accepts ``{-1, 0, +1}`` (``0`` -> ``-1``)."""
    if not np.all((y == 1.0) | (y == -1.0) | (y == 0.0)):
        bad = y[~((y == 1.0) | (y == -1.0) | (y == 0.0))][0]
        raise DataError(
            f"model {kind}: labels must be -1/+1 (or 0/1), found {bad}; "
            "use 'softmax' for multiclass data"
        )
    return np.where(y > 0, 1.0, -1.0)


@dataclass(frozen=True, kw_only=True)
class LogisticRegression(Model):
    """Binary logistic regression; labels ``{-1, +1}`` (``0`` is read as ``-1``)."""

    kind: ClassVar[str] = "logreg"
    curvature: ClassVar[float] = 0.25

    def _targets(self, data: Dataset) -> FloatArray:
        return _pm1_labels(data.y, self.kind)

    def _data_loss_grad(
        self, x: FloatArray, data: Dataset, *, with_grad: bool
    ) -> tuple[float, FloatArray | None]:
        y = self._targets(data)
        margins = y * matvec(data.X, x)
        value = float(np.mean(np.logaddexp(0.0, -margins)))
        if not with_grad:
            return value, None
        # d/dm log(1 + e^-m) = -sigmoid(-m) = -exp(-log(1 + e^m)): no overflow for any m.
        coef = -y * np.exp(-np.logaddexp(0.0, margins))
        return value, rmatvec(data.X, coef) / data.n_rows

    def predict(self, x: npt.ArrayLike, data: Dataset) -> FloatArray:
        """``+1.0`` where ``a^T x >= 0``, else ``-1.0``."""
        xv = self._check(x, data)
        return np.where(matvec(data.X, xv) >= 0.0, 1.0, -1.0)

    def probability(self, x: npt.ArrayLike, data: Dataset) -> FloatArray:
        """``P(y = +1 | a)`` for every row, in ``[0, 1]``."""
        xv = self._check(x, data)
        return np.exp(-np.logaddexp(0.0, -matvec(data.X, xv)))


@dataclass(frozen=True, kw_only=True)
class LeastSquares(Model):
    """Least squares ``|Ax - y|^2 / (2N) + l2/2 |x|^2`` on real-valued targets."""

    kind: ClassVar[str] = "lsq"
    curvature: ClassVar[float] = 1.0

    def _targets(self, data: Dataset) -> FloatArray:
        return data.y

    def _data_loss_grad(
        self, x: FloatArray, data: Dataset, *, with_grad: bool
    ) -> tuple[float, FloatArray | None]:
        residual = matvec(data.X, x) - data.y
        value = 0.5 * float(residual @ residual) / data.n_rows
        if not with_grad:
            return value, None
        return value, rmatvec(data.X, residual) / data.n_rows

    def predict(self, x: npt.ArrayLike, data: Dataset) -> FloatArray:
        """The fitted values ``A x``."""
        xv = self._check(x, data)
        return matvec(data.X, xv)

    def accuracy(self, x: npt.ArrayLike, data: Dataset) -> float:
        """For ``{-1, 0, +1}`` labels: fraction of rows where ``sign(a^T x)`` matches
        (``0`` read as ``-1``, prediction ``>= 0`` as ``+1``).

        For other targets (regression) a fraction is meaningless; returns the
        coefficient of determination R^2 instead (1 is perfect, may be negative).
        """
        xv = self._check(x, data)
        y = data.y
        fitted = matvec(data.X, xv)
        if np.all((y == 1.0) | (y == -1.0) | (y == 0.0)):
            return float(np.mean(np.where(fitted >= 0.0, 1.0, -1.0) == np.where(y > 0, 1.0, -1.0)))
        total = float(np.sum((y - y.mean()) ** 2))
        resid = float(np.sum((y - fitted) ** 2))
        return 1.0 - resid / total if total > 0 else (1.0 if resid == 0 else 0.0)


@dataclass(frozen=True, kw_only=True)
class SoftmaxRegression(Model):
    """Multinomial logistic regression over ``n_classes`` classes, labels ``0 .. K-1``."""

    kind: ClassVar[str] = "softmax"
    curvature: ClassVar[float] = 0.5

    def _check_classes(self) -> None:
        if self.n_classes < 2:
            raise DataError(f"model softmax: n_classes must be >= 2, got {self.n_classes}")

    @property
    def d(self) -> int:
        """``n_features * n_classes`` (a row-major ``(n_features, n_classes)`` matrix)."""
        return self.n_features * self.n_classes

    def _targets(self, data: Dataset) -> FloatArray:
        y = data.y
        k = self.n_classes
        if k == 2 and np.all((y == 1.0) | (y == -1.0)):
            return np.where(y > 0, 1.0, 0.0)
        ok = (y == np.round(y)) & (y >= 0) & (y < k)
        if not np.all(ok):
            raise DataError(
                f"model softmax: labels must be integers in [0, {k}), found {y[~ok][0]}; "
                "remap the labels or raise n_classes"
            )
        return y

    def _scores(self, x: FloatArray, data: Dataset) -> FloatArray:
        return matmat(data.X, x.reshape(self.n_features, self.n_classes))

    def _direction_product(self, a: Matrix, q: FloatArray) -> FloatArray:
        return matmat(a, q.reshape(self.n_features, self.n_classes))

    def _direction_layout(self, idx: IndexArray) -> tuple[IndexArray, IndexArray | None, int]:
        # parameter i is W[i // K, i % K]: feature column i // K moves the score of class i % K
        k = self.n_classes
        return idx // k, idx % k, k

    def _data_loss_grad(
        self, x: FloatArray, data: Dataset, *, with_grad: bool
    ) -> tuple[float, FloatArray | None]:
        cls = self._targets(data).astype(np.int64)
        scores = self._scores(x, data)
        top = scores.max(axis=1, keepdims=True)
        shifted = scores - top
        log_norm = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        log_p = shifted - log_norm
        rows = np.arange(data.n_rows)
        value = -float(np.mean(log_p[rows, cls]))
        if not with_grad:
            return value, None
        resid = np.exp(log_p)
        resid[rows, cls] -= 1.0
        return value, (rmatmat(data.X, resid) / data.n_rows).reshape(-1)

    def predict(self, x: npt.ArrayLike, data: Dataset) -> FloatArray:
        """The most probable class of every row, as ``0.0 .. K-1``."""
        xv = self._check(x, data)
        return np.asarray(np.argmax(self._scores(xv, data), axis=1), dtype=np.float64)

    def probabilities(self, x: npt.ArrayLike, data: Dataset) -> FloatArray:
        """Class probabilities, shape ``(n_rows, n_classes)``, rows summing to 1."""
        xv = self._check(x, data)
        scores = self._scores(xv, data)
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        return np.asarray(e / e.sum(axis=1, keepdims=True), dtype=np.float64)


MODELS: dict[str, type[Model]] = {
    "logreg": LogisticRegression,
    "lsq": LeastSquares,
    "softmax": SoftmaxRegression,
}
"""Model name -> class; :func:`make_model` builds one by name."""


def make_model(kind: str, *, n_features: int, n_classes: int = 2, l2: float = 1e-3) -> Model:
    """Build the model registered as ``kind`` (see :data:`MODELS`).

    Raises :class:`~edge_agent.errors.UnknownNameError` listing the valid
    names, or :class:`DataError` for invalid sizes.
    """
    cls = lookup(MODELS, kind, "model")
    return cls(n_features=n_features, n_classes=n_classes, l2=l2)
