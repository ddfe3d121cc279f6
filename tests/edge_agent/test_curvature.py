"""Directional curvature: the bound holds, the incremental pass and T* are exact, steps descend.

Every reference here is a brute-force dense numpy evaluation: the exact Hessian of each
model at x, and A q_T recomputed from scratch for every prefix T.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.data import Dataset, make_rcv1_like
from edge_agent.data.sparse import CSRMatrix, prefix_sq_norms, sum_sq_norm
from edge_agent.errors import DataError
from edge_agent.links.catalog import load_profile
from edge_agent.numerics import curvature as cv
from edge_agent.numerics.compressors import compress
from edge_agent.numerics.models import CurvaturePass, Model, make_model
from edge_agent.numerics.selection import Price, make_price

FloatArray = npt.NDArray[np.float64]
MODEL_KINDS = ["logreg", "lsq", "softmax"]
PROFILES = Path(__file__).resolve().parents[2] / "cost_profiles"


@dataclass(frozen=True)
class Link:
    """cost = per message + per packet * ceil(bytes / mtu) + per byte * bytes."""

    per_message: float
    per_packet: float
    per_byte: float
    mtu: int = 10**9

    def objective_cost(self, size_bytes: npt.NDArray[np.int64]) -> FloatArray:
        size = np.asarray(size_bytes, dtype=np.float64)
        return self.per_message + self.per_packet * np.ceil(size / self.mtu) + self.per_byte * size


LINKS = [
    Link(0.0, 0.0, 8.0),  # payload bits
    Link(0.0, 1.0, 0.0, 60),  # packet-stepped: only the packet count matters
    Link(0.0, 1.155, 0.03277, 51),  # LoRa-like: per packet + per byte
    Link(300.0, 0.0, 1.0),  # affine with a fixed cost
    Link(5000.0, 0.0, 0.01),  # a large fixed cost: T* near d
]


# ------------------------------------------------------------------------ problems
def make_problem(
    kind: str, seed: int, *, n: int = 30, features: int = 40, classes: int = 3, sparse: bool = True
) -> tuple[Model, Dataset]:
    """A small random problem with many zeros (empty rows and columns are common)."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((n, features)) * (rng.random((n, features)) < 0.3)
    if kind == "logreg":
        y = rng.choice(np.array([-1.0, 1.0]), size=n)
    elif kind == "softmax":
        y = rng.integers(0, classes, size=n).astype(np.float64)
    else:
        y = rng.standard_normal(n)
    k = classes if kind == "softmax" else 2
    model = make_model(kind, n_features=features, n_classes=k, l2=float(rng.uniform(1e-3, 0.1)))
    x = CSRMatrix.from_dense(dense) if sparse else dense
    return model, Dataset(x, y)


def dense_x(data: Dataset) -> FloatArray:
    return data.X.to_dense() if isinstance(data.X, CSRMatrix) else np.asarray(data.X)


def hessian(model: Model, data: Dataset, x: FloatArray) -> FloatArray:
    """The exact Hessian of ``model.loss`` at ``x``, dense, from the textbook formulas."""
    a = dense_x(data)
    n = a.shape[0]
    if model.kind == "lsq":
        h = a.T @ a / n
    elif model.kind == "logreg":
        s = 1.0 / (1.0 + np.exp(-(a @ x)))
        h = (a.T * (s * (1.0 - s))) @ a / n
    else:
        k = model.n_classes
        z = a @ x.reshape(-1, k)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        h = np.zeros((model.d, model.d))
        for i in range(n):  # parameter (feature f, class c) sits at f * k + c
            h += np.kron(np.outer(a[i], a[i]), np.diag(p[i]) - np.outer(p[i], p[i]))
        h /= n
    return np.asarray(h + model.l2 * np.eye(model.d))


def bound_dense(model: Model, data: Dataset, q: FloatArray) -> float:
    """``curvature * |A Q|_F^2 / n + l2 |q|^2`` from a dense q."""
    a = dense_x(data)
    k = model.n_classes if model.kind == "softmax" else 1
    aq = a @ q.reshape(-1, k)
    return float(model.curvature * np.sum(aq * aq) / a.shape[0] + model.l2 * q @ q)


def brute_force_select(
    model: Model,
    data: Dataset,
    g: FloatArray,
    compressor: str,
    price: Price,
) -> tuple[int, float, FloatArray]:
    """Every prefix from scratch: T*, its ratio, and all ratios (T = 1..d)."""
    order = np.argsort(-np.abs(g), kind="stable")
    ratios = np.zeros(g.size)
    for t in range(1, g.size + 1):
        q = np.zeros(g.size)
        top = order[:t]
        q[top] = g[top] if compressor == "topk" else np.where(g[top] < 0, -1.0, 1.0)
        b = bound_dense(model, data, q)
        gq = float(g @ q)
        ratios[t - 1] = 0.0 if b == 0 else gq * gq / (2 * b)
    ratios = ratios / price(np.arange(1, g.size + 1, dtype=np.int64))
    k = int(np.argmax(ratios))
    return k + 1, float(ratios[k]), ratios


def random_point(model: Model, seed: int, scale: float) -> FloatArray:
    return np.random.default_rng(seed).standard_normal(model.d) * scale


# ---------------------------------------------------------------- sparse primitives
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 12),
    m=st.integers(1, 12),
    slots=st.integers(1, 3),
    as_csr=st.booleans(),
)
def test_prefix_sq_norms_match_dense_recomputation(
    seed: int, n: int, m: int, slots: int, as_csr: bool
) -> None:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, m)) * (rng.random((n, m)) < 0.5)
    k = int(rng.integers(1, m + 1))
    cols = rng.permutation(m)[:k]
    coefs = rng.standard_normal(k)
    slot = rng.integers(0, slots, size=k)
    mat = CSRMatrix.from_dense(a) if as_csr else a
    got = prefix_sq_norms(mat, cols, coefs, slots=slot, n_slots=slots)
    want = []
    for t in range(1, k + 1):
        q = np.zeros((m, slots))
        q[cols[:t], slot[:t]] = coefs[:t]
        want.append(float(np.sum((a @ q) ** 2)))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert sum_sq_norm(mat, cols, coefs, slots=slot, n_slots=slots) == pytest.approx(
        want[-1], rel=1e-12, abs=1e-12
    )


def test_column_index_is_built_once_and_matches_the_matrix() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((9, 7)) * (rng.random((9, 7)) < 0.4)
    m = CSRMatrix.from_dense(a)
    cols = m.columns()
    assert m.columns() is cols
    rows, vals, owner = cols.gather(np.array([4, 1, 4], dtype=np.int64))
    for pos, col in enumerate([4, 1, 4]):
        got = np.zeros(9)
        got[rows[owner == pos]] = vals[owner == pos]
        np.testing.assert_array_equal(got, a[:, col])


def test_wide_keys_sort_stably() -> None:
    from edge_agent.data.sparse import stable_order

    rng = np.random.default_rng(5)
    for bound in (10, 1 << 16, (1 << 16) + 7, 1 << 33):
        keys = rng.integers(0, bound, size=5000)
        np.testing.assert_array_equal(stable_order(keys, bound), np.argsort(keys, kind="stable"))


# ------------------------------------------------------------------------ the bound
@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(MODEL_KINDS),
    seed=st.integers(0, 2**32 - 1),
    scale=st.sampled_from([0.0, 0.3, 3.0, 30.0]),
    density=st.sampled_from([0.05, 0.3, 1.0]),
)
def test_bound_dominates_the_hessian_at_every_point(
    kind: str, seed: int, scale: float, density: float
) -> None:
    model, data = make_problem(kind, seed, n=12, features=8)
    rng = np.random.default_rng(seed + 1)
    x = random_point(model, seed + 2, scale)
    idx = np.flatnonzero(rng.random(model.d) < density)
    if idx.size == 0:
        idx = np.array([0])
    q = np.zeros(model.d)
    q[idx] = rng.standard_normal(idx.size)
    true = float(q @ hessian(model, data, x) @ q)
    bound = model.directional_curvature(data, idx, q[idx])
    assert bound == pytest.approx(bound_dense(model, data, q), rel=1e-12)
    assert bound >= true * (1 - 1e-12)
    if kind == "lsq":  # exact: the Hessian does not depend on x
        assert bound == pytest.approx(true, rel=1e-10)
    # the dense entry point gives the same number
    assert model.directional_curvature(data, None, q) == pytest.approx(bound, rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(MODEL_KINDS), seed=st.integers(0, 2**32 - 1))
def test_directional_smoothness_never_exceeds_global(kind: str, seed: int) -> None:
    model, data = make_problem(kind, seed, n=20, features=15)
    rng = np.random.default_rng(seed)
    a = dense_x(data)
    exact_l = model.curvature * float(np.linalg.norm(a, 2) ** 2) / a.shape[0] + model.l2
    # the power-iteration estimate needs enough steps to bound it when the top two
    # singular values are close (50 steps can miss by more than its 1 % margin)
    big_l = model.smoothness(data, iters=2000, rng=np.random.default_rng(0))
    assert exact_l <= big_l * (1 + 1e-12)
    for density in (0.02, 0.2, 1.0):
        idx = np.flatnonzero(rng.random(model.d) < density)
        if idx.size == 0:
            continue
        vals = rng.standard_normal(idx.size)
        l_q = model.directional_curvature(data, idx, vals) / float(vals @ vals)
        assert model.l2 * (1 - 1e-12) <= l_q <= exact_l * (1 + 1e-12)


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("sparse", [True, False])
def test_prefix_curvature_matches_brute_force(kind: str, sparse: bool) -> None:
    model, data = make_problem(kind, 11, n=25, features=30, sparse=sparse)
    rng = np.random.default_rng(1)
    order = rng.permutation(model.d)[: model.d - 3]
    vals = rng.standard_normal(order.size)
    got = model.prefix_curvature(data, order, vals)
    for t in range(1, order.size + 1):
        q = np.zeros(model.d)
        q[order[:t]] = vals[:t]
        assert got[t - 1] == pytest.approx(bound_dense(model, data, q), rel=1e-11, abs=1e-14)


def test_direction_errors_name_the_problem() -> None:
    model, data = make_problem("logreg", 0)
    with pytest.raises(DataError, match="distinct"):
        model.directional_curvature(data, [1, 1], [1.0, 2.0])
    with pytest.raises(DataError, match=r"lie in \[0, 40\)"):
        model.prefix_curvature(data, [40], [1.0])
    with pytest.raises(DataError, match="2 indices but 1 values"):
        model.prefix_curvature(data, [0, 1], [1.0])
    with pytest.raises(DataError, match="dense direction"):
        model.directional_curvature(data, None, np.ones(3))


# ------------------------------------------------------------ exact selection of T*
def _assert_same_argmax(
    got: cv.DirectionalSelection, t_ref: int, r_ref: float, ratios: FloatArray
) -> None:
    assert got.ratio == pytest.approx(r_ref, rel=1e-9)
    assert ratios[got.t - 1] == pytest.approx(r_ref, rel=1e-9)
    # the same T unless another T ties within rounding (then the smallest such T wins)
    near = np.flatnonzero(ratios >= r_ref * (1 - 1e-9)) + 1
    assert got.t == t_ref or (near.size > 1 and got.t in near)


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(MODEL_KINDS),
    compressor=st.sampled_from(["topk", "signtopk"]),
    link=st.sampled_from(LINKS),
    seed=st.integers(0, 2**32 - 1),
    features=st.sampled_from([5, 40, 150]),
)
def test_select_directional_is_the_brute_force_argmax(
    kind: str, compressor: str, link: Link, seed: int, features: int
) -> None:
    model, data = make_problem(kind, seed, n=20, features=features, classes=2)
    g = model.grad(random_point(model, seed, 0.5), data)
    price = make_price(link, compressor, d=model.d, job="j", agent="a")
    got = cv.select_directional(g, compressor, price, model, data)
    t_ref, r_ref, ratios = brute_force_select(model, data, g, compressor, price)
    _assert_same_argmax(got, t_ref, r_ref, ratios)
    order = np.argsort(-np.abs(g), kind="stable")
    np.testing.assert_array_equal(got.indices, np.sort(order[: got.t]))


@pytest.mark.parametrize(
    "profile", ["paper_payload_bits", "paper_packet_model", "zmq_tcp_affine_example"]
)
@pytest.mark.parametrize("compressor", ["topk", "signtopk"])
def test_select_directional_exact_on_rcv1_like_data(profile: str, compressor: str) -> None:
    data = make_rcv1_like(60, 700, rng=np.random.default_rng(2), nnz_per_row=12)
    model = make_model("logreg", n_features=700, l2=1e-3)
    g = model.grad(np.zeros(700), data)
    prof = load_profile(PROFILES / f"{profile}.json")
    price = make_price(prof, compressor, d=700, job="job", agent="pi-01")
    got = cv.select_directional(g, compressor, price, model, data)
    t_ref, r_ref, ratios = brute_force_select(model, data, g, compressor, price)
    _assert_same_argmax(got, t_ref, r_ref, ratios)


def test_t_bounds_restrict_the_search_exactly() -> None:
    model, data = make_problem("logreg", 4, features=60)
    g = model.grad(np.zeros(model.d), data)
    price = make_price(LINKS[3], "signtopk", d=model.d, job="j", agent="a")
    _, _, ratios = brute_force_select(model, data, g, "signtopk", price)
    got = cv.select_directional(g, "signtopk", price, model, data, t_min=5, t_max=20)
    assert got.t == 5 + int(np.argmax(ratios[4:20]))
    with pytest.raises(ValueError, match="t_min"):
        cv.select_directional(g, "signtopk", price, model, data, t_min=0)
    with pytest.raises(ValueError, match="dense_curvature"):
        cv.select_directional(g, "randk", price, model, data)


def test_top_order_is_the_stable_descending_sort_with_ties() -> None:
    rng = np.random.default_rng(9)
    absg = rng.integers(0, 5, size=500).astype(np.float64)
    for t in (1, 7, 100, 249, 250, 500):
        np.testing.assert_array_equal(cv.top_order(absg, t), np.argsort(-absg, kind="stable")[:t])


# ------------------------------------------------------------------------- the step
@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(MODEL_KINDS),
    compressor=st.sampled_from(["topk", "signtopk", "dense"]),
    link=st.sampled_from(LINKS),
    seed=st.integers(0, 2**32 - 1),
    scale=st.sampled_from([0.0, 0.5, 5.0]),
)
def test_the_directional_step_never_raises_the_objective(
    kind: str, compressor: str, link: Link, seed: int, scale: float
) -> None:
    model, data = make_problem(kind, seed, n=25, features=20)
    x = random_point(model, seed, scale)
    f, g = model.loss_grad(x, data)
    if compressor == "dense":
        gq, qmq = cv.dense_curvature(g, model, data)
        q = g
    else:
        price = make_price(link, compressor, d=model.d, job="j", agent="a")
        sel = cv.select_directional(g, compressor, price, model, data)
        gq, qmq = sel.gq, sel.qmq
        q = np.zeros(model.d)
        top = sel.indices
        q[top] = g[top] if compressor == "topk" else np.where(g[top] < 0, -1.0, 1.0)
        assert sel.step == cv.directional_step(gq, qmq)
    step = cv.directional_step(gq, qmq)
    promised = cv.guaranteed_decrease(gq, qmq)
    assert promised >= 0.0
    f_new = model.loss(x - step * q, data)
    slack = 1e-12 * max(1.0, abs(f))
    assert f_new <= f + slack
    assert f_new <= f - promised + slack


@pytest.mark.parametrize("compressor", ["dense", "topk", "signtopk"])
def test_scaled_update_moves_by_the_step_under_the_usual_1_over_l(compressor: str) -> None:
    model, data = make_problem("logreg", 21, features=50)
    g = model.grad(np.zeros(model.d), data)
    big_l = model.smoothness(data, rng=np.random.default_rng(0))
    if compressor == "dense":
        gq, qmq = cv.dense_curvature(g, model, data)
        update = compress(g, "dense", model.d, value_dtype="float64")
        q = g
    else:
        price = make_price(LINKS[3], compressor, d=model.d, job="j", agent="a")
        sel = cv.select_directional(g, compressor, price, model, data)
        gq, qmq = sel.gq, sel.qmq
        update = compress(g, compressor, sel.t, value_dtype="float64", order=sel.indices)
        q = np.zeros(model.d)
        q[sel.indices] = g[sel.indices] if compressor == "topk" else np.sign(g[sel.indices])
    step = cv.directional_step(gq, qmq)
    scaled = cv.scale_for_step(update, step, big_l, value_dtype="float64")
    np.testing.assert_allclose(scaled.to_dense() / big_l, step * q, rtol=1e-12, atol=1e-15)
    assert scaled.semantics == update.semantics
    # the wire's float32 rounding changes the step by at most a relative 2^-24
    rounded = cv.scale_for_step(
        compress(g, compressor, update.t, order=update.indices), step, big_l
    )
    np.testing.assert_allclose(rounded.to_dense() / big_l, step * q, rtol=1e-6, atol=1e-12)
    f0 = model.loss(np.zeros(model.d), data)
    assert model.loss(-rounded.to_dense() / big_l, data) < f0


def test_step_helpers_reject_what_has_no_meaning() -> None:
    assert cv.directional_step(0.0, 0.0) == 0.0
    assert cv.guaranteed_decrease(2.0, 4.0) == 0.5
    with pytest.raises(ValueError, match=">= 0"):
        cv.directional_step(1.0, -1.0)
    update = compress(np.ones(4), "randk", 2, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="randk"):
        cv.scale_for_step(update, 1.0, 1.0)
    with pytest.raises(ValueError, match="float64"):
        cv.scale_for_step(compress(np.ones(4), "topk", 2), 1e30, 1e30)


@pytest.mark.parametrize("compressor", ["topk", "signtopk"])
@pytest.mark.parametrize("link", [LINKS[0], LINKS[2], LINKS[3]])
def test_early_stop_of_the_pass_keeps_the_answer_exact(
    compressor: str, link: Link, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = make_rcv1_like(40, 1500, rng=np.random.default_rng(8), nnz_per_row=10)
    model = make_model("logreg", n_features=1500, l2=0.05)
    g = model.grad(np.random.default_rng(1).standard_normal(1500) * 0.3, data)
    price = make_price(link, compressor, d=1500, job="j", agent="a")
    passed: list[int] = []
    extend = CurvaturePass.extend

    def counting(self: CurvaturePass, indices: FloatArray, values: FloatArray) -> FloatArray:
        passed.append(len(indices))
        return extend(self, indices, values)

    monkeypatch.setattr(CurvaturePass, "extend", counting)
    got = cv.select_directional(g, compressor, price, model, data)
    assert sum(passed) < 1500  # the l2 bound ended the pass before the last column
    t_ref, r_ref, ratios = brute_force_select(model, data, g, compressor, price)
    _assert_same_argmax(got, t_ref, r_ref, ratios)
