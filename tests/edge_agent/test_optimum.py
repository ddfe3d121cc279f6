"""The reference optimum: L-BFGS reaches f* to rounding precision."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.data import Dataset, make_rcv1_like, read_libsvm
from edge_agent.errors import DataError
from edge_agent.numerics.models import make_model
from edge_agent.numerics.optimum import lbfgs, loss_floor, solve_optimum

BREAST_CANCER = Path(__file__).resolve().parent.parent / "data" / "breast_cancer.svm"
FloatArray = npt.NDArray[np.float64]


@pytest.fixture(scope="module")
def breast_cancer() -> Dataset:
    """Breast cancer with standardised features (raw ones span five orders of magnitude)."""
    ds = read_libsvm(BREAST_CANCER)
    a = ds.X.to_dense() if not isinstance(ds.X, np.ndarray) else ds.X
    return Dataset((a - a.mean(axis=0)) / a.std(axis=0), ds.y)


@pytest.fixture(scope="module")
def rcv1_small() -> Dataset:
    return make_rcv1_like(1000, 3000, rng=np.random.default_rng(5))


@pytest.mark.parametrize("kind", ["logreg", "lsq", "softmax"])
def test_gradient_vanishes_at_the_breast_cancer_optimum(breast_cancer: Dataset, kind: str) -> None:
    model = make_model(kind, n_features=30, l2=1e-3)
    x, f = solve_optimum(model, breast_cancer)
    assert np.linalg.norm(model.grad(x, breast_cancer)) < 1e-8
    assert f == model.loss(x, breast_cancer)


@pytest.mark.parametrize("l2", [1e-3, 1e-4])
def test_gradient_vanishes_at_the_rcv1_like_optimum(rcv1_small: Dataset, l2: float) -> None:
    model = make_model("logreg", n_features=rcv1_small.n_features, l2=l2)
    x, _ = solve_optimum(model, rcv1_small)
    assert np.linalg.norm(model.grad(x, rcv1_small)) < 1e-8


def test_optimum_beats_5000_gradient_descent_steps(breast_cancer: Dataset) -> None:
    model = make_model("logreg", n_features=30, l2=1e-3)
    step = 1.0 / model.smoothness(breast_cancer, rng=np.random.default_rng(0))
    x = model.initial_point()
    for _ in range(5000):
        x = x - step * model.grad(x, breast_cancer)
    _, f_star = solve_optimum(model, breast_cancer)
    assert f_star <= model.loss(x, breast_cancer)


def test_optimum_does_not_depend_on_the_start(rcv1_small: Dataset) -> None:
    model = make_model("logreg", n_features=rcv1_small.n_features, l2=1e-4)
    _, f_zero = solve_optimum(model, rcv1_small)
    start = np.random.default_rng(1).standard_normal(model.d)
    _, f_random = solve_optimum(model, rcv1_small, x0=start)
    assert f_random == pytest.approx(f_zero, rel=1e-13, abs=0.0)


def test_lbfgs_solves_a_quadratic_exactly() -> None:
    rng = np.random.default_rng(2)
    m = rng.standard_normal((20, 20))
    h = m @ m.T + 0.1 * np.eye(20)
    b = rng.standard_normal(20)

    def fun(x: FloatArray) -> tuple[float, FloatArray]:
        return 0.5 * float(x @ h @ x) - float(b @ x), h @ x - b

    result = lbfgs(fun, np.zeros(20), tol=1e-12)
    assert result.converged
    np.testing.assert_allclose(result.x, np.linalg.solve(h, b), rtol=1e-8, atol=1e-10)


def test_lbfgs_reports_when_max_iter_stops_it() -> None:
    def fun(x: FloatArray) -> tuple[float, FloatArray]:
        scales = np.array([1.0, 1e4])
        return 0.5 * float(scales @ (x * x)), scales * x

    result = lbfgs(fun, np.ones(2), max_iter=1)
    assert result.iterations == 1
    assert not result.converged


def test_wrong_start_shape_is_refused(breast_cancer: Dataset) -> None:
    model = make_model("logreg", n_features=30)
    with pytest.raises(DataError, match="x0"):
        solve_optimum(model, breast_cancer, x0=np.zeros(3))


@pytest.mark.parametrize("kind", ["logreg", "lsq", "softmax"])
def test_the_loss_floor_is_a_proven_bound_at_the_optimum(breast_cancer: Dataset, kind: str) -> None:
    """Solved to its tolerance, the floor is under f* and within rounding of it."""
    model = make_model(kind, n_features=30, n_classes=2, l2=1e-3)
    _, f_star = solve_optimum(model, breast_cancer)
    floor = loss_floor(model, breast_cancer)
    assert floor.certified and floor.converged
    assert floor.value <= f_star <= floor.value + 1e-9


def _after(budget: int) -> Callable[[], bool]:
    """A stop that lets ``budget`` iterations run."""
    calls = iter(range(budget + 1))
    return lambda: next(calls) >= budget


def test_a_floor_stopped_early_is_still_below_the_optimum(rcv1_small: Dataset) -> None:
    """The strong-convexity bound holds wherever the solver stops: after 0, 1 or 3
    iterations it is below f* (loose), and it tightens as the solver goes on."""
    model = make_model("logreg", n_features=3000, l2=1e-3)
    _, f_star = solve_optimum(model, rcv1_small)
    values = []
    for budget in (0, 1, 3):
        floor = loss_floor(model, rcv1_small, stop=_after(budget))
        assert floor.iterations == budget and not floor.converged
        assert 0.0 <= floor.value <= f_star
        values.append(floor.value)
    assert values[0] <= values[1] <= values[2] < f_star
    assert loss_floor(model, rcv1_small).value == pytest.approx(f_star, abs=1e-9)


def test_without_l2_the_floor_is_the_solvers_value(breast_cancer: Dataset) -> None:
    model = make_model("lsq", n_features=30, l2=0.0)
    floor = loss_floor(model, breast_cancer, max_iter=200)
    assert not floor.certified and floor.value == pytest.approx(floor.f)
