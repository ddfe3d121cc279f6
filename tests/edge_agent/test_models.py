"""Models: gradients, smoothness bounds, labels, predictions and the registry."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.data import Dataset
from edge_agent.data.sparse import CSRMatrix
from edge_agent.errors import DataError, UnknownNameError
from edge_agent.numerics.models import MODELS, SAFETY_FACTOR, Model, make_model, power_iteration

FloatArray = npt.NDArray[np.float64]
N_ROWS, N_FEATURES, N_CLASSES = 40, 6, 3


def _labels(kind: str, rng: np.random.Generator) -> FloatArray:
    if kind == "logreg":
        return rng.choice([-1.0, 1.0], size=N_ROWS)
    if kind == "softmax":
        return rng.integers(0, N_CLASSES, size=N_ROWS).astype(np.float64)
    return rng.standard_normal(N_ROWS)


def _data(kind: str, *, sparse: bool, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    a = np.where(
        rng.random((N_ROWS, N_FEATURES)) < 0.6, rng.standard_normal((N_ROWS, N_FEATURES)), 0.0
    )
    a[3] = 0.0  # an empty row
    return Dataset(CSRMatrix.from_dense(a) if sparse else a, _labels(kind, rng))


def _model(kind: str, l2: float = 1e-2) -> Model:
    return make_model(
        kind, n_features=N_FEATURES, n_classes=N_CLASSES if kind == "softmax" else 2, l2=l2
    )


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_gradient_matches_central_differences(kind: str, sparse: bool) -> None:
    model, data = _model(kind), _data(kind, sparse=sparse)
    x = np.random.default_rng(1).standard_normal(model.d)
    h = 1e-6
    eye = np.eye(model.d)
    numeric = np.array(
        [(model.loss(x + h * e, data) - model.loss(x - h * e, data)) / (2 * h) for e in eye]
    )
    np.testing.assert_allclose(model.grad(x, data), numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_dense_and_csr_agree(kind: str) -> None:
    model = _model(kind)
    dense, csr = _data(kind, sparse=False), _data(kind, sparse=True)
    x = np.random.default_rng(2).standard_normal(model.d)
    f_dense, g_dense = model.loss_grad(x, dense)
    f_csr, g_csr = model.loss_grad(x, csr)
    assert f_csr == pytest.approx(f_dense, rel=1e-13)
    np.testing.assert_allclose(g_csr, g_dense, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_loss_grad_equals_loss_and_grad(kind: str) -> None:
    model, data = _model(kind), _data(kind, sparse=True)
    x = np.random.default_rng(3).standard_normal(model.d)
    f, g = model.loss_grad(x, data)
    assert f == model.loss(x, data)
    np.testing.assert_array_equal(g, model.grad(x, data))


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_loss_includes_l2_term(kind: str) -> None:
    data = _data(kind, sparse=False)
    x = np.random.default_rng(4).standard_normal(_model(kind).d)
    diff = _model(kind, l2=0.5).loss(x, data) - _model(kind, l2=0.0).loss(x, data)
    assert diff == pytest.approx(0.25 * float(x @ x), rel=1e-12)


def test_logreg_loss_at_zero_is_log_two() -> None:
    model, data = _model("logreg"), _data("logreg", sparse=True)
    assert model.loss(np.zeros(model.d), data) == pytest.approx(np.log(2.0), rel=1e-15)


@pytest.mark.parametrize("kind", ["logreg", "softmax"])
def test_huge_margins_do_not_overflow(kind: str) -> None:
    model, data = _model(kind, l2=0.0), _data(kind, sparse=True)
    x = 1e6 * np.random.default_rng(5).standard_normal(model.d)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        f, g = model.loss_grad(x, data)
    assert np.isfinite(f)
    assert np.all(np.isfinite(g))


def test_logreg_zero_one_labels_mean_minus_one_plus_one() -> None:
    model, data = _model("logreg"), _data("logreg", sparse=True)
    zero_one = Dataset(data.X, (data.y + 1.0) / 2.0)
    x = np.random.default_rng(6).standard_normal(model.d)
    assert model.loss(x, zero_one) == model.loss(x, data)
    assert model.accuracy(x, zero_one) == model.accuracy(x, data)


def test_logreg_rejects_multiclass_labels() -> None:
    model, data = _model("logreg"), _data("softmax", sparse=False)
    data = Dataset(data.X, data.y + 1.0)  # labels 1, 2, 3
    with pytest.raises(DataError, match="softmax"):
        model.loss(np.zeros(model.d), data)


def _true_bound(kind: str, data: Dataset, l2: float) -> float:
    a = data.X.to_dense() if isinstance(data.X, CSRMatrix) else data.X
    sigma = float(np.linalg.svd(a, compute_uv=False)[0])
    return MODELS[kind].curvature * sigma**2 / data.n_rows + l2


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_smoothness_is_an_upper_bound_within_five_percent(kind: str, sparse: bool) -> None:
    model, data = _model(kind), _data(kind, sparse=sparse)
    bound = _true_bound(kind, data, model.l2)
    estimate = model.smoothness(data, rng=np.random.default_rng(7))
    assert bound <= estimate <= 1.05 * bound


def test_smoothness_bounds_the_logreg_hessian_at_zero() -> None:
    # At x = 0 every sigmoid derivative is exactly 1/4: the Hessian attains the bound.
    model, data = _model("logreg"), _data("logreg", sparse=False)
    a = np.asarray(data.X)
    hessian = a.T @ a / (4 * data.n_rows) + model.l2 * np.eye(model.d)
    top = float(np.linalg.eigvalsh(hessian)[-1])
    assert model.smoothness(data, rng=np.random.default_rng(8)) >= top


def test_power_iteration_stays_below_and_close_to_sigma_max_squared() -> None:
    a = np.random.default_rng(9).standard_normal((30, 10))
    top = float(np.linalg.svd(a, compute_uv=False)[0]) ** 2
    estimate = power_iteration(a, iters=1000, rng=np.random.default_rng(10), rtol=1e-12)
    assert top * (1 - 1e-8) <= estimate * SAFETY_FACTOR
    assert estimate <= top * (1 + 1e-12)


def test_power_iteration_of_zero_matrix_is_zero() -> None:
    assert power_iteration(np.zeros((3, 4)), rng=np.random.default_rng(0)) == 0.0


def test_softmax_parameter_layout_is_row_major_features_by_classes() -> None:
    model = _model("softmax")
    data = _data("softmax", sparse=False)
    w = np.random.default_rng(11).standard_normal((N_FEATURES, N_CLASSES))
    assert model.d == N_FEATURES * N_CLASSES
    scores = np.asarray(data.X) @ w
    np.testing.assert_array_equal(model.predict(w.reshape(-1), data), np.argmax(scores, axis=1))


def test_softmax_with_two_classes_accepts_plus_minus_one_labels() -> None:
    model = make_model("softmax", n_features=N_FEATURES, n_classes=2)
    data = _data("logreg", sparse=False)
    zero_one = Dataset(data.X, (data.y + 1.0) / 2.0)
    x = np.random.default_rng(12).standard_normal(model.d)
    assert model.loss(x, data) == model.loss(x, zero_one)


def test_softmax_rejects_labels_out_of_range() -> None:
    model, data = _model("softmax"), _data("softmax", sparse=False)
    with pytest.raises(DataError, match="n_classes"):
        model.loss(np.zeros(model.d), Dataset(data.X, data.y + 1.0))


def test_logreg_accuracy_of_the_generating_model_is_one() -> None:
    rng = np.random.default_rng(13)
    a = rng.standard_normal((50, 4))
    w = rng.standard_normal(4)
    data = Dataset(a, np.where(a @ w >= 0, 1.0, -1.0))
    model = make_model("logreg", n_features=4)
    assert model.accuracy(w, data) == 1.0
    assert model.accuracy(-w, data) == 0.0


def test_lsq_accuracy_is_sign_agreement_for_binary_labels() -> None:
    data = Dataset(np.array([[1.0], [2.0], [-1.0], [-3.0]]), np.array([1.0, -1.0, -1.0, -1.0]))
    assert make_model("lsq", n_features=1).accuracy(np.array([1.0]), data) == 0.75


def test_lsq_accuracy_is_r_squared_for_real_targets() -> None:
    rng = np.random.default_rng(14)
    a = rng.standard_normal((20, 3))
    w = rng.standard_normal(3)
    data = Dataset(a, a @ w)
    assert make_model("lsq", n_features=3).accuracy(w, data) == pytest.approx(1.0)


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError, match="logreg, lsq, softmax"):
        make_model("svm", n_features=3)


def test_binary_models_refuse_more_classes() -> None:
    with pytest.raises(DataError, match="softmax"):
        make_model("logreg", n_features=3, n_classes=3)


def test_negative_l2_is_refused() -> None:
    with pytest.raises(DataError, match="l2"):
        make_model("lsq", n_features=3, l2=-1.0)


def test_wrong_parameter_length_is_refused() -> None:
    model, data = _model("logreg"), _data("logreg", sparse=False)
    with pytest.raises(DataError, match="shape"):
        model.loss(np.zeros(model.d + 1), data)


def test_wrong_feature_count_is_refused() -> None:
    model = make_model("logreg", n_features=N_FEATURES + 1)
    with pytest.raises(DataError, match="n_features"):
        model.loss(np.zeros(model.d), _data("logreg", sparse=False))


def test_empty_dataset_is_refused() -> None:
    model = _model("lsq")
    with pytest.raises(DataError, match="no rows"):
        model.loss(np.zeros(model.d), Dataset(np.zeros((0, N_FEATURES)), np.zeros(0)))


def test_smoothness_is_capped_by_the_frobenius_norm() -> None:
    # Rank one: sigma_max^2 = |A|_F^2, so the trace cap removes the 1 % safety margin exactly.
    rng = np.random.default_rng(15)
    a = np.outer(rng.standard_normal(8), rng.standard_normal(3))
    model = make_model("lsq", n_features=3, l2=0.0)
    estimate = model.smoothness(Dataset(a, np.zeros(8)), rng=rng)
    assert estimate == pytest.approx(float(np.sum(a * a)) / 8, rel=1e-12)


def test_power_iteration_does_not_stop_on_a_lower_eigenvalue() -> None:
    """A start with little along the top eigenvector settles near the second eigenvalue,
    and a relative-change test alone stopped there: 7 % below sigma_max^2 (top singular
    values 4.43 and 4.26; found by hypothesis in test_curvature, seed 1102). The check on the
    complement finds the top one; estimates that had converged are returned unchanged."""
    from test_curvature import dense_x, make_problem

    _, data = make_problem("lsq", 1102, n=20, features=15)
    true = float(np.linalg.norm(dense_x(data), 2) ** 2)
    got = power_iteration(data.X, iters=2000, rng=np.random.default_rng(0))
    assert true * (1 - 1e-4) <= got <= true * (1 + 1e-9)  # (it stopped at 0.923 of it)
    worst = 1.0
    for seed in range(300):  # random small matrices, the default 50 steps
        r = np.random.default_rng(seed)
        a = r.standard_normal((int(r.integers(5, 60)), int(r.integers(2, 40))))
        est = power_iteration(a, rng=np.random.default_rng(seed))
        worst = min(worst, est / float(np.linalg.norm(a, 2) ** 2))
    assert worst > 0.96  # the single-start iteration went down to 0.945 on these
