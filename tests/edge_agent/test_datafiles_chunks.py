"""LIBSVM files read piece by piece give the same dataset as one piece."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.data import datafiles
from edge_agent.data.datagen import make_rcv1_like
from edge_agent.data.dataset import Dataset
from edge_agent.data.sparse import CSRMatrix
from edge_agent.errors import DataError


@pytest.mark.parametrize("zero_based", [False, True])
def test_chunked_read_equals_a_whole_file_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zero_based: bool
) -> None:
    path = tmp_path / "shard.svm"
    datafiles.write_libsvm(
        make_rcv1_like(100, 5000, rng=np.random.default_rng(3)), path, zero_based=zero_based
    )
    monkeypatch.setattr(datafiles, "CHUNK_BYTES", 1 << 30)
    whole = datafiles.read_libsvm(path)  # one piece
    monkeypatch.setattr(datafiles, "CHUNK_BYTES", 997)  # pieces end mid-line, mid-number
    pieces = datafiles.read_libsvm(path)
    _assert_same(whole, pieces)


def _assert_same(whole: Dataset, pieces: Dataset) -> None:
    wx, px = whole.X, pieces.X
    assert isinstance(wx, CSRMatrix) and isinstance(px, CSRMatrix)
    pairs: list[tuple[np.ndarray, np.ndarray]] = [
        (wx.data, px.data),
        (np.asarray(wx.indices), np.asarray(px.indices)),
        (wx.indptr, px.indptr),
        (whole.y, pieces.y),
    ]
    for a, b in pairs:
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert whole.X.shape == pieces.X.shape


def test_a_messy_file_read_in_pieces_equals_one_piece_and_keeps_no_spare_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # comments full of colons and qid tokens make the colon count a loose bound on the
    # entries; indices out of order inside rows; blank lines
    lines = []
    for i in range(300):
        pairs = " ".join(f"{(7 * i + 5 * j) % 97 + 1}:{j + 0.5}" for j in range(i % 6))
        lines.append(f"{i % 2} qid:{i} {pairs} # a:b:c:d:e:f:g:h:{i}")
        if i % 9 == 0:
            lines.append("")
    path = tmp_path / "messy.svm"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(datafiles, "CHUNK_BYTES", 1 << 30)
    whole = datafiles.read_libsvm(path, n_features=100)
    monkeypatch.setattr(datafiles, "CHUNK_BYTES", 500)
    pieces = datafiles.read_libsvm(path, n_features=100)
    _assert_same(whole, pieces)
    assert isinstance(pieces.X, CSRMatrix)
    for arr in (pieces.X.data, pieces.X.indices, pieces.y):
        # at most 8/7 of the array: the colons' bound was 10 times the entries here
        base = arr if arr.base is None else arr.base
        assert 7 * base.size <= 8 * arr.size, (base.size, arr.size)


def test_chunked_read_names_the_line_of_a_bad_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bad.svm"
    lines = [f"1 {i + 1}:0.5 {i + 2}:0.25" for i in range(400)]
    lines[321] = "1 7:zero"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(datafiles, "CHUNK_BYTES", 500)
    with pytest.raises(DataError, match=r"line 322: cannot read the feature value 'zero'"):
        datafiles.read_libsvm(path)
