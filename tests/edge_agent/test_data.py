"""Datasets: readers and writers, the RCV1-like generator and shard splitting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.data import (
    Dataset,
    load_dataset,
    make_rcv1_like,
    read_csv,
    read_libsvm,
    read_npz,
    split_shards,
    write_libsvm,
    write_npz,
)
from edge_agent.data.sparse import CSRMatrix
from edge_agent.errors import DataError, UnknownNameError

BREAST_CANCER = Path(__file__).resolve().parent.parent / "data" / "breast_cancer.svm"
FIRST_ROW = [17.99, 10.38, 122.8, 1001, 0.1184, 0.2776, 0.3001, 0.1471, 0.2419, 0.07871]


def _write(tmp_path: Path, text: str, name: str = "data.svm") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _dense(ds: Dataset) -> np.ndarray:
    return ds.X.to_dense() if isinstance(ds.X, CSRMatrix) else np.asarray(ds.X)


# --------------------------------------------------------------------- LIBSVM
def test_breast_cancer_has_569_rows_and_30_features() -> None:
    ds = read_libsvm(BREAST_CANCER)
    assert (ds.n_rows, ds.n_features) == (569, 30)
    assert isinstance(ds.X, CSRMatrix)


def test_breast_cancer_first_row_values() -> None:
    ds = read_libsvm(BREAST_CANCER)
    np.testing.assert_array_equal(_dense(ds.take([0]))[0, :10], FIRST_ROW)
    assert ds.y[0] == -1.0


def test_breast_cancer_labels_are_plus_minus_one() -> None:
    labels, counts = np.unique(read_libsvm(BREAST_CANCER).y, return_counts=True)
    np.testing.assert_array_equal(labels, [-1.0, 1.0])
    np.testing.assert_array_equal(counts, [212, 357])  # malignant, benign


def test_libsvm_round_trip_is_exact(tmp_path: Path) -> None:
    ds = make_rcv1_like(200, 500, rng=np.random.default_rng(0))
    path = tmp_path / "rcv1.svm"
    write_libsvm(ds, path)
    back = read_libsvm(path, n_features=500)
    assert isinstance(back.X, CSRMatrix) and isinstance(ds.X, CSRMatrix)
    np.testing.assert_array_equal(back.X.indptr, ds.X.indptr)
    np.testing.assert_array_equal(back.X.indices, ds.X.indices)
    np.testing.assert_array_equal(back.X.data, ds.X.data)
    np.testing.assert_array_equal(back.y, ds.y)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 6),
    st.integers(0, 2**32 - 1),
    st.booleans(),
)
def test_libsvm_round_trip_of_dense_data(
    tmp_path_factory: pytest.TempPathFactory, n: int, m: int, seed: int, zero_based: bool
) -> None:
    rng = np.random.default_rng(seed)
    a = np.where(
        rng.random((n, m)) < 0.5, rng.standard_normal((n, m)) * 10.0 ** rng.integers(-5, 5), 0.0
    )
    ds = Dataset(a, rng.integers(0, 4, size=n).astype(np.float64) - 1.0)
    path = tmp_path_factory.mktemp("rt") / "d.svm"
    write_libsvm(ds, path, zero_based=zero_based)
    back = read_libsvm(path, n_features=m, zero_based=zero_based, map_binary=False)
    np.testing.assert_array_equal(_dense(back), a)
    np.testing.assert_array_equal(back.y, ds.y)


def test_comments_blank_lines_and_qid_are_ignored(tmp_path: Path) -> None:
    text = "# header\n\n+1 qid:3 1:0.5 3:2 # trailing comment\n   \n-1 qid:3 2:1.5\n"
    ds = read_libsvm(_write(tmp_path, text))
    np.testing.assert_array_equal(_dense(ds), [[0.5, 0, 2.0], [0, 1.5, 0]])
    np.testing.assert_array_equal(ds.y, [1.0, -1.0])


def test_row_with_only_a_label_is_an_empty_row(tmp_path: Path) -> None:
    ds = read_libsvm(_write(tmp_path, "1 1:1\n-1\n1 2:2"))  # and no final newline
    np.testing.assert_array_equal(_dense(ds), [[1.0, 0], [0, 0], [0, 2.0]])


def test_zero_index_means_zero_based(tmp_path: Path) -> None:
    ds = read_libsvm(_write(tmp_path, "1 0:1 2:3\n"))
    np.testing.assert_array_equal(_dense(ds), [[1.0, 0, 3.0]])


def test_unsorted_indices_are_sorted(tmp_path: Path) -> None:
    ds = read_libsvm(_write(tmp_path, "1 3:3 1:1\n"))
    assert isinstance(ds.X, CSRMatrix)
    np.testing.assert_array_equal(ds.X.indices, [0, 2])
    np.testing.assert_array_equal(ds.X.data, [1.0, 3.0])


def test_zero_one_labels_become_plus_minus_one(tmp_path: Path) -> None:
    ds = read_libsvm(_write(tmp_path, "0 1:1\n1 1:2\n"))
    np.testing.assert_array_equal(ds.y, [-1.0, 1.0])


def test_multiclass_labels_are_kept(tmp_path: Path) -> None:
    ds = read_libsvm(_write(tmp_path, "0 1:1\n1 1:2\n2 1:3\n"))
    np.testing.assert_array_equal(ds.y, [0.0, 1.0, 2.0])


def test_n_features_pads_the_width(tmp_path: Path) -> None:
    assert read_libsvm(_write(tmp_path, "1 2:1\n"), n_features=10).n_features == 10


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("1 1:1\n1 2:abc\n", 2, "abc"),
        ("1 1:1\n\n-1 3 4:1\n", 3, "'3'"),
        ("1 1:1\n1:2 3:4\n", 2, "label"),
        ("# c\nx 1:2\n", 2, "'x'"),
        ("1 1:1\n1 2:\n", 2, "empty"),
        ("1 1.5:1\n", 1, "1.5"),
        ("1 1:1:1\n", 1, "1:1:1"),
        ("1 1:nan\n", 1, "not finite"),
    ],
)
def test_malformed_line_names_file_and_line(
    tmp_path: Path, text: str, line: int, fragment: str
) -> None:
    path = _write(tmp_path, text, "broken.svm")
    with pytest.raises(DataError) as info:
        read_libsvm(path)
    message = str(info.value)
    assert "broken.svm" in message
    assert f"line {line}:" in message
    assert fragment in message


def test_index_zero_in_a_one_based_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="zero_based=True"):
        read_libsvm(_write(tmp_path, "1 0:1\n"), zero_based=False)


def test_index_beyond_n_features_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="n_features >= 5"):
        read_libsvm(_write(tmp_path, "1 5:1\n"), n_features=3)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.svm"):
        read_libsvm(tmp_path / "nope.svm")


# --------------------------------------------------------------------- npz / csv
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_npz_round_trip(tmp_path: Path, sparse: bool) -> None:
    ds = make_rcv1_like(30, 40, rng=np.random.default_rng(1), nnz_per_row=5)
    if not sparse:
        ds = Dataset(_dense(ds), ds.y)
    path = tmp_path / "d.npz"
    write_npz(ds, path)
    back = read_npz(path)
    assert back.is_sparse == sparse
    np.testing.assert_array_equal(_dense(back), _dense(ds))
    np.testing.assert_array_equal(back.y, ds.y)


def test_npz_with_wrong_keys_lists_what_is_needed(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, features=np.zeros((2, 2)))
    with pytest.raises(DataError, match="need 'X' and 'y'"):
        read_npz(path)


def test_csv_with_header(tmp_path: Path) -> None:
    ds = read_csv(_write(tmp_path, "label,a,b\n1,0.5,2\n0,1.5,3\n", "d.csv"))
    np.testing.assert_array_equal(_dense(ds), [[0.5, 2.0], [1.5, 3.0]])
    np.testing.assert_array_equal(ds.y, [1.0, -1.0])


def test_csv_without_header_and_last_label_column(tmp_path: Path) -> None:
    ds = read_csv(_write(tmp_path, "0.5,2,3\n1.5,3,4\n", "d.csv"), label_column=-1)
    np.testing.assert_array_equal(_dense(ds), [[0.5, 2.0], [1.5, 3.0]])
    np.testing.assert_array_equal(ds.y, [3.0, 4.0])


def test_csv_with_ragged_rows_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"d\.csv"):
        read_csv(_write(tmp_path, "1,2,3\n1,2\n", "d.csv"))


@pytest.mark.parametrize("name", ["d.svm", "d.libsvm", "d.txt", "d.svmlight"])
def test_load_dataset_reads_libsvm_extensions(tmp_path: Path, name: str) -> None:
    assert load_dataset(_write(tmp_path, "1 1:1\n", name)).n_rows == 1


def test_load_dataset_reads_npz_and_csv(tmp_path: Path) -> None:
    write_npz(Dataset(np.eye(2), np.array([1.0, -1.0])), tmp_path / "d.npz")
    assert load_dataset(tmp_path / "d.npz").n_features == 2
    assert load_dataset(_write(tmp_path, "1,2,3\n", "d.csv")).n_features == 2


def test_load_dataset_unknown_extension_lists_known_ones(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"\.csv.*\.npz"):
        load_dataset(_write(tmp_path, "1 1:1\n", "d.parquet"))


def test_dataset_rejects_label_count_mismatch() -> None:
    with pytest.raises(DataError, match="one label per row"):
        Dataset(np.zeros((3, 2)), np.zeros(2))


# --------------------------------------------------------------------- RCV1-like
@pytest.fixture(scope="module")
def rcv1() -> Dataset:
    return make_rcv1_like(3000, 20_000, rng=np.random.default_rng(42))


def test_rcv1_like_shape_and_density(rcv1: Dataset) -> None:
    assert (rcv1.n_rows, rcv1.n_features) == (3000, 20_000)
    assert isinstance(rcv1.X, CSRMatrix)
    assert 65 <= rcv1.X.nnz / rcv1.n_rows <= 83
    assert rcv1.X.row_nnz().min() >= 1


def test_rcv1_like_rows_have_unit_norm(rcv1: Dataset) -> None:
    assert isinstance(rcv1.X, CSRMatrix)
    np.testing.assert_allclose(rcv1.X.row_norms_sq(), 1.0, rtol=1e-12)
    assert rcv1.X.data.min() > 0


def test_rcv1_like_rows_have_distinct_features(rcv1: Dataset) -> None:
    assert isinstance(rcv1.X, CSRMatrix)
    keys = rcv1.X.row_ids * rcv1.n_features + rcv1.X.indices
    assert np.unique(keys).size == keys.size


def test_rcv1_like_popularity_is_power_law(rcv1: Dataset) -> None:
    assert isinstance(rcv1.X, CSRMatrix)
    df = np.sort(rcv1.X.col_nnz())[::-1]
    # Zipf: the 10th most popular feature is far more common than the 1000th.
    assert df[9] > 20 * df[999]
    assert np.median(df[:10]) > 50 * max(np.median(df), 1)
    # A long tail: most features are rare.
    assert np.mean(df <= 5) > 0.5


def test_rcv1_like_labels_are_balanced_plus_minus_one(rcv1: Dataset) -> None:
    assert set(np.unique(rcv1.y)) == {-1.0, 1.0}
    assert 0.3 <= np.mean(rcv1.y > 0) <= 0.7


def test_rcv1_like_is_deterministic_for_a_seed() -> None:
    a = make_rcv1_like(100, 1000, rng=np.random.default_rng(7))
    b = make_rcv1_like(100, 1000, rng=np.random.default_rng(7))
    c = make_rcv1_like(100, 1000, rng=np.random.default_rng(8))
    assert isinstance(a.X, CSRMatrix) and isinstance(b.X, CSRMatrix) and isinstance(c.X, CSRMatrix)
    np.testing.assert_array_equal(a.X.indices, b.X.indices)
    np.testing.assert_array_equal(a.X.data, b.X.data)
    np.testing.assert_array_equal(a.y, b.y)
    assert not np.array_equal(a.X.data[:50], c.X.data[:50])


# --------------------------------------------------------------------- shards
def _indexed(n: int) -> Dataset:
    """Row i holds the value i in its only column, so rows can be traced after shuffling."""
    return Dataset(np.arange(n, dtype=np.float64)[:, None], np.arange(n, dtype=np.float64) % 2)


@pytest.mark.parametrize("how", ["iid", "label"])
@pytest.mark.parametrize("n_shards", [1, 3, 10])
def test_shards_partition_the_rows(how: str, n_shards: int) -> None:
    ds = _indexed(103)
    shards = split_shards(ds, n_shards, how=how, rng=np.random.default_rng(0))
    assert len(shards) == n_shards
    rows = np.concatenate([_dense(s)[:, 0] for s in shards])
    np.testing.assert_array_equal(np.sort(rows), np.arange(103))
    sizes = [s.n_rows for s in shards]
    assert max(sizes) - min(sizes) <= 1
    for s in shards:  # labels travel with their rows
        np.testing.assert_array_equal(s.y, _dense(s)[:, 0] % 2)


def test_sparse_shards_partition_the_rows(rcv1: Dataset) -> None:
    shards = split_shards(rcv1, 7, rng=np.random.default_rng(1))
    assert isinstance(rcv1.X, CSRMatrix)
    assert sum(s.X.nnz for s in shards if isinstance(s.X, CSRMatrix)) == rcv1.X.nnz
    assert sum(s.n_rows for s in shards) == rcv1.n_rows


def test_label_shards_are_skewed_but_mixed() -> None:
    y = np.repeat([-1.0, 1.0], 500)
    ds = Dataset(np.zeros((1000, 1)), y)
    pure = split_shards(ds, 2, how="label", rng=np.random.default_rng(0), mix=0.0)
    assert [set(s.y) for s in pure] == [{-1.0}, {1.0}]
    mixed = split_shards(ds, 2, how="label", rng=np.random.default_rng(0), mix=0.1)
    first_share = float(np.mean(mixed[0].y < 0))
    assert 0.9 <= first_share < 1.0


def test_iid_shards_are_not_skewed() -> None:
    ds = Dataset(np.zeros((1000, 1)), np.repeat([-1.0, 1.0], 500))
    for s in split_shards(ds, 4, how="iid", rng=np.random.default_rng(0)):
        assert 0.35 <= np.mean(s.y > 0) <= 0.65


def test_unknown_sharding_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError, match="iid, label"):
        split_shards(_indexed(4), 2, how="round-robin", rng=np.random.default_rng(0))


def test_more_shards_than_rows_is_refused() -> None:
    with pytest.raises(DataError, match="n_shards"):
        split_shards(_indexed(4), 5, rng=np.random.default_rng(0))
