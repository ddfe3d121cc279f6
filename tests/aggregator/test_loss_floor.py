"""The service's loss floor (AGG_LOSS_FLOOR): parsed from the environment, solved on the
evaluation data in the background, and never a reason for the service to fail."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from aggregator.service.evaluation import Evaluation, LossFloor
from aggregator.service.settings import SettingsError, load_settings
from edge_agent.data.datafiles import write_libsvm
from edge_agent.data.datagen import make_rcv1_like
from edge_agent.numerics.models import make_model
from edge_agent.numerics.optimum import solve_optimum

D, ROWS = 400, 500


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("AGG_"):
            monkeypatch.delenv(key)


@pytest.fixture
def eval_file(tmp_path: Path) -> Path:
    path = tmp_path / "eval.svm"
    write_libsvm(make_rcv1_like(ROWS, D, rng=np.random.default_rng(3), nnz_per_row=12.0), path)
    return path


@pytest.mark.parametrize(
    ("raw", "parsed"), [(None, "auto"), ("auto", "auto"), ("none", "none"), ("0.25", 0.25)]
)
def test_the_setting_is_auto_by_default_and_takes_none_or_a_number(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, parsed: object
) -> None:
    monkeypatch.setenv("AGG_D", "10")
    if raw is not None:
        monkeypatch.setenv("AGG_LOSS_FLOOR", raw)
    assert load_settings().loss_floor == parsed


@pytest.mark.parametrize("raw", ["nan", "inf", "lowest", ""])
def test_a_bad_floor_names_the_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("AGG_D", "10")
    monkeypatch.setenv("AGG_LOSS_FLOOR", raw)
    with pytest.raises(SettingsError, match="AGG_LOSS_FLOOR"):
        load_settings()


def test_auto_solves_the_evaluation_objective_in_the_background(
    eval_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_settings(d=D, eval_data=eval_file, target_loss=0.01)
    evaluation = Evaluation.load(settings)
    assert evaluation is not None
    floor = LossFloor(settings.loss_floor, evaluation, target_loss=settings.target_loss)
    assert floor.read() == (None, "solving")  # nothing before start()
    with caplog.at_level(logging.INFO, logger="aggregator.service"):
        floor.start()
        assert floor.join(30.0)
    _, f_star = solve_optimum(evaluation.model, evaluation.data)
    value, source = floor.read()
    assert source == "solved" and value is not None
    assert f_star - 1e-9 <= value <= f_star
    assert "a proven lower bound" in caplog.text
    # the target is below the least the loss can be: said once, the job is not stopped
    assert "AGG_TARGET_LOSS=0.01 is below the least the evaluation loss can be" in caplog.text


@pytest.mark.parametrize(("setting", "source"), [(0.5, "set"), ("none", "none"), ("auto", "none")])
def test_a_set_floor_or_none_solves_nothing(setting: float | str, source: str) -> None:
    """A number is taken as set, ``none`` is unknown, and ``auto`` without evaluation data
    has nothing to solve."""
    floor = LossFloor(setting, None)  # type: ignore[arg-type]  # the three settings
    floor.start()
    assert floor.join(0.0) and floor.source == source
    assert floor.value == (setting if source == "set" else None)


def test_a_failing_solve_leaves_the_floor_unknown_and_warns(
    eval_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A model that does not fit the data (here one feature more) raises in the solver:
    the floor stays unknown, one WARNING says why, nothing is raised."""
    good = Evaluation.load(load_settings(d=D, eval_data=eval_file))
    assert good is not None
    evaluation = Evaluation(make_model("logreg", n_features=D + 1), good.data, eval_file)
    floor = LossFloor("auto", evaluation)
    with caplog.at_level(logging.WARNING, logger="aggregator.service"):
        floor.start()
        assert floor.join(30.0)
    assert floor.source == "failed" and floor.value is None
    assert "loss floor (AGG_LOSS_FLOOR=auto) not solved" in caplog.text


def test_stop_ends_a_solve_without_a_value(eval_file: Path) -> None:
    evaluation = Evaluation.load(load_settings(d=D, eval_data=eval_file))
    floor = LossFloor("auto", evaluation)
    floor.stop()  # before start: the solver stops at its first iteration
    floor.start()
    assert floor.join(30.0)
    assert floor.source == "none" and floor.value is None
