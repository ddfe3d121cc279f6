"""The ``wrong_d`` advice leads to a run that loads, for a shard with fewer features and for
one with more (where ``--features`` alone would only move the error to the data file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edge_agent.cli.commands import main
from edge_agent.data import load_dataset
from edge_agent.errors import DataError
from edge_agent.protocol.jobinfo import wrong_d_fix

JOB_D = 40


def _generate(out: Path, features: int) -> Path:
    argv = ["data", "generate", "--rows", "30", "--features", str(features), "--out", str(out)]
    assert main(argv) == 0
    return out / "shard-000.svm"


def test_features_flag_alone_fails_for_a_wider_shard(tmp_path: Path) -> None:
    wide = _generate(tmp_path / "wide", JOB_D * 2)
    with pytest.raises(DataError, match="does not fit"):
        load_dataset(wide, n_features=JOB_D)


def test_the_advised_regeneration_loads_with_the_jobs_d(tmp_path: Path) -> None:
    command = re.search(r"edge-agent data generate --features (\d+)", wrong_d_fix(JOB_D))
    assert command is not None and int(command.group(1)) == JOB_D
    shard = _generate(tmp_path / "regenerated", int(command.group(1)))
    assert load_dataset(shard, n_features=JOB_D).n_features == JOB_D


def test_the_advised_features_flag_pads_a_narrower_shard(tmp_path: Path) -> None:
    narrow = _generate(tmp_path / "narrow", JOB_D // 2)
    assert f"--features {JOB_D} pads" in wrong_d_fix(JOB_D)
    assert load_dataset(narrow, n_features=JOB_D).n_features == JOB_D
