"""LIBSVM files read piece by piece give the same dataset as one piece."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.data import datafiles
from edge_agent.data.datagen import make_rcv1_like
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
    whole = datafiles.read_libsvm(path)  # (the file is far below CHUNK_BYTES)
    assert path.stat().st_size < datafiles.CHUNK_BYTES
    monkeypatch.setattr(datafiles, "CHUNK_BYTES", 997)  # pieces end mid-line, mid-number
    pieces = datafiles.read_libsvm(path)
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
