"""The examples of docs/data-formats.md load as the page says."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from edge_agent.data import load_dataset
from edge_agent.errors import DataError

DOC = Path(__file__).resolve().parents[2] / "docs" / "data-formats.md"


def _example(section: str) -> str:
    """The first ```text block after the heading ``section``."""
    text = DOC.read_text(encoding="utf-8")
    after = text[text.index(f"## {section}\n") :]
    found = re.search(r"```text\n(.*?)```", after, re.S)
    assert found is not None, f"no example under {section}"
    return found.group(1)


def test_the_csv_example_has_a_header_a_label_column_and_01_labels(tmp_path: Path) -> None:
    path = tmp_path / "example.csv"
    path.write_text(_example("CSV"))
    ds = load_dataset(path)
    assert (ds.n_rows, ds.n_features) == (2, 3)
    assert ds.y.tolist() == [1.0, -1.0]  # {0, 1} read as {-1, +1}
    assert np.allclose(np.asarray(ds.X)[0], [0.5, 0.0, 2.25])


def test_a_csv_is_not_padded_by_features(tmp_path: Path) -> None:
    path = tmp_path / "example.csv"
    path.write_text(_example("CSV"))
    with pytest.raises(DataError, match="has 3 features"):
        load_dataset(path, n_features=10)


def test_the_libsvm_example_is_one_based_and_padded_by_features(tmp_path: Path) -> None:
    path = tmp_path / "example.svm"
    path.write_text(_example("LIBSVM / SVMlight"))
    ds = load_dataset(path, n_features=1000)
    assert (ds.n_rows, ds.n_features) == (2, 1000)
    assert ds.y.tolist() == [1.0, -1.0]
