"""CSRMatrix operations agree with the same operations on dense arrays."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.data import sparse
from edge_agent.data.sparse import CSRMatrix
from edge_agent.errors import DataError

FloatArray = npt.NDArray[np.float64]


@st.composite
def sparse_dense(draw: st.DrawFn) -> FloatArray:
    """A small dense matrix with many zeros, so empty rows and columns are common."""
    n = draw(st.integers(0, 7))
    m = draw(st.integers(1, 7))
    seed = draw(st.integers(0, 2**32 - 1))
    density = draw(st.sampled_from([0.0, 0.2, 0.5, 1.0]))
    rng = np.random.default_rng(seed)
    values = rng.uniform(-10, 10, size=(n, m))
    return np.where(rng.random((n, m)) < density, values, 0.0)


def _vec(seed: int, *shape: int) -> FloatArray:
    return np.random.default_rng(seed).standard_normal(shape)


@settings(max_examples=60, deadline=None)
@given(sparse_dense())
def test_dense_round_trip_is_exact(a: FloatArray) -> None:
    m = CSRMatrix.from_dense(a)
    assert m.shape == a.shape
    assert m.nnz == np.count_nonzero(a)
    np.testing.assert_array_equal(m.to_dense(), a)


@settings(max_examples=60, deadline=None)
@given(sparse_dense(), st.integers(0, 1000))
def test_matvec_equals_dense(a: FloatArray, seed: int) -> None:
    x = _vec(seed, a.shape[1])
    np.testing.assert_allclose(CSRMatrix.from_dense(a).matvec(x), a @ x, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(sparse_dense(), st.integers(0, 1000))
def test_rmatvec_equals_dense(a: FloatArray, seed: int) -> None:
    y = _vec(seed, a.shape[0])
    np.testing.assert_allclose(CSRMatrix.from_dense(a).rmatvec(y), a.T @ y, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(sparse_dense(), st.integers(1, 4), st.integers(0, 1000))
def test_matmat_equals_dense(a: FloatArray, k: int, seed: int) -> None:
    x = _vec(seed, a.shape[1], k)
    np.testing.assert_allclose(CSRMatrix.from_dense(a).matmat(x), a @ x, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(sparse_dense(), st.integers(1, 4), st.integers(0, 1000))
def test_rmatmat_equals_dense(a: FloatArray, k: int, seed: int) -> None:
    y = _vec(seed, a.shape[0], k)
    np.testing.assert_allclose(CSRMatrix.from_dense(a).rmatmat(y), a.T @ y, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(sparse_dense())
def test_row_norms_sq_equal_dense(a: FloatArray) -> None:
    np.testing.assert_allclose(CSRMatrix.from_dense(a).row_norms_sq(), (a * a).sum(axis=1))


@settings(max_examples=60, deadline=None)
@given(sparse_dense(), st.integers(0, 1000))
def test_scale_rows_equals_dense(a: FloatArray, seed: int) -> None:
    s = _vec(seed, a.shape[0])
    np.testing.assert_allclose(CSRMatrix.from_dense(a).scale_rows(s).to_dense(), s[:, None] * a)


@settings(max_examples=60, deadline=None)
@given(sparse_dense(), st.integers(0, 1000))
def test_take_rows_equals_dense(a: FloatArray, seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(0, 10)) if a.shape[0] else 0
    idx = rng.integers(0, max(a.shape[0], 1), size=size)
    taken = CSRMatrix.from_dense(a).take_rows(idx)
    np.testing.assert_array_equal(taken.to_dense(), a[np.asarray(idx, dtype=np.int64)])


def test_empty_rows_give_zero_in_every_product() -> None:
    a = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [0.0, 3.0, 0.0]])
    m = CSRMatrix.from_dense(a)
    x = np.array([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(m.matvec(x), [0.0, 7.0, 0.0, 6.0])
    np.testing.assert_array_equal(
        m.matmat(np.stack([x, -x], axis=1)), [[0, 0], [7, -7], [0, 0], [6, -6]]
    )
    np.testing.assert_array_equal(m.row_norms_sq(), [0.0, 5.0, 0.0, 9.0])


def test_trailing_empty_rows_and_columns_keep_their_shape() -> None:
    m = CSRMatrix(np.array([1.0]), np.array([0]), np.array([0, 1, 1, 1]), (3, 5))
    assert m.matvec(np.ones(5)).shape == (3,)
    assert m.rmatvec(np.ones(3)).shape == (5,)
    np.testing.assert_array_equal(m.col_nnz(), [1, 0, 0, 0, 0])


def test_duplicate_entries_are_summed_consistently() -> None:
    m = CSRMatrix.from_coo([0, 0, 1], [2, 2, 0], [1.0, 2.0, 5.0], (2, 3))
    dense = m.to_dense()
    np.testing.assert_array_equal(dense, [[0, 0, 3.0], [5.0, 0, 0]])
    x = np.array([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(m.matvec(x), dense @ x)


def test_from_coo_sorts_any_order() -> None:
    m = CSRMatrix.from_coo([1, 0, 1], [0, 1, 2], [1.0, 2.0, 3.0], (2, 3))
    np.testing.assert_array_equal(m.indptr, [0, 1, 3])
    np.testing.assert_array_equal(m.to_dense(), [[0, 2.0, 0], [1.0, 0, 3.0]])


def test_arrays_are_read_only() -> None:
    m = CSRMatrix.from_dense(np.eye(3))
    with pytest.raises(ValueError):
        m.data[0] = 5.0


@pytest.mark.parametrize(
    ("data", "indices", "indptr", "shape"),
    [
        ([1.0], [3], [0, 1], (1, 3)),  # column out of range
        ([1.0], [0], [0, 1, 1], (1, 3)),  # indptr length does not match rows
        ([1.0, 2.0], [0], [0, 2], (1, 3)),  # data/indices length mismatch
        ([1.0, 2.0], [0, 1], [0, 2, 1], (2, 3)),  # indptr decreases / wrong end
    ],
)
def test_invalid_layout_raises_data_error(
    data: list[float], indices: list[int], indptr: list[int], shape: tuple[int, int]
) -> None:
    with pytest.raises(DataError, match="CSRMatrix"):
        CSRMatrix(np.array(data), np.array(indices), np.array(indptr), shape)


def test_matvec_rejects_wrong_length() -> None:
    with pytest.raises(DataError, match="shape"):
        CSRMatrix.from_dense(np.eye(3)).matvec(np.ones(2))


@pytest.mark.parametrize("as_csr", [False, True])
def test_dispatch_helpers_match_dense(as_csr: bool) -> None:
    rng = np.random.default_rng(3)
    a = np.where(rng.random((6, 4)) < 0.5, rng.standard_normal((6, 4)), 0.0)
    m: sparse.Matrix = CSRMatrix.from_dense(a) if as_csr else a
    x, y = rng.standard_normal(4), rng.standard_normal(6)
    xk, yk = rng.standard_normal((4, 3)), rng.standard_normal((6, 3))
    np.testing.assert_allclose(sparse.matvec(m, x), a @ x)
    np.testing.assert_allclose(sparse.rmatvec(m, y), a.T @ y)
    np.testing.assert_allclose(sparse.matmat(m, xk), a @ xk)
    np.testing.assert_allclose(sparse.rmatmat(m, yk), a.T @ yk)
    np.testing.assert_allclose(sparse.row_norms_sq(m), (a * a).sum(axis=1))
    np.testing.assert_array_equal(sparse.to_dense(sparse.take_rows(m, [4, 0])), a[[4, 0]])
    assert sparse.n_rows(m) == 6
