"""The ETA to the target loss on /status: the fit on synthetic histories, and over HTTP from a
real uvicorn server whose job descends a real objective."""

from __future__ import annotations

import io
import itertools
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn

from aggregator.localnet import HOST, free_port
from aggregator.service.settings import load_settings
from aggregator.web.app import create_app
from aggregator.web.eta import estimate
from edge_agent.data.datafiles import write_libsvm
from edge_agent.data.datagen import make_rcv1_like
from edge_agent.numerics.compressors import compress
from edge_agent.numerics.models import make_model
from edge_agent.numerics.optimum import solve_optimum
from edge_agent.protocol import messages, topics, wire
from edge_agent.transports import open_transport


def geometric(
    n: int, *, floor: float, c: float, rho: float, dt: float
) -> list[tuple[int, float, float | None]]:
    """Versions 0..n-1 closing every ``dt`` s with loss ``floor + c * rho**v``."""
    return [(v, 100.0 + dt * v, floor + c * rho**v) for v in range(n)]


def test_a_geometric_history_gives_the_versions_it_takes() -> None:
    hist = geometric(12, floor=0.5, c=1.0, rho=0.8, dt=30.0)
    target = 0.5 + 0.8**20  # reached at version 20: 9 versions after the last (11)
    eta = estimate(hist, target)
    assert eta is not None
    assert eta.rho == pytest.approx(0.8, rel=1e-9)
    assert eta.seconds_per_version == pytest.approx(30.0)
    assert eta.versions_left == 9
    assert eta.eta_s == pytest.approx(9 * 30.0)
    assert eta.at == hist[-1][1]
    assert not eta.lower_bound  # a measured rate of decay: an estimate, not a bound


def test_unknown_when_no_target_too_few_points_a_rise_or_a_plateau() -> None:
    hist = geometric(12, floor=0.5, c=1.0, rho=0.8, dt=30.0)
    assert estimate(hist, None) is None
    assert estimate(hist[:2], 0.51) is None
    assert estimate([*hist[:-1], (11, 430.0, 2.0)], 0.51) is None  # the loss went up
    assert estimate(hist, 0.49) is None  # below the floor the decreases converge to
    assert estimate([(v, t, None) for v, t, _ in hist], 0.51) is None  # no loss evaluated


def test_growing_times_per_version_follow_their_trend() -> None:
    """Version 0 -> 1 holds the start (500 s); then each version takes 10 s more than the
    last: the versions to come continue the line, not the window's mean."""
    closes = [0.0, 500.0]
    for v in range(2, 12):
        closes.append(closes[-1] + 10.0 * v)
    hist = [(v, closes[v], 0.5 + 0.8**v) for v in range(12)]
    eta = estimate(hist, 0.5 + 0.8**15)  # 4 versions after the last (11): 120 .. 150 s
    assert eta is not None and eta.versions_left == 4
    assert eta.eta_s == pytest.approx(120.0 + 130.0 + 140.0 + 150.0)


def test_falling_times_per_version_are_not_extrapolated() -> None:
    """Times per version of 300, 250, ... 50 s (version 0 -> 1 the start): the line falls,
    so the versions to come take its value at the last version (50 s), not less, and not
    its value at version 0 either."""
    closes = [0.0, 1000.0]
    for per in (300.0, 250.0, 200.0, 150.0, 100.0, 50.0):
        closes.append(closes[-1] + per)
    hist = [(v, closes[v], 0.5 + 0.8**v) for v in range(len(closes))]
    eta = estimate(hist, 0.5 + 0.8**10)  # 3 versions after the last (7)
    assert eta is not None and eta.versions_left == 3
    assert eta.eta_s == pytest.approx(3 * 50.0)


def test_growing_decreases_are_held_at_the_last_two() -> None:
    hist = [(v, 10.0 * v, 10.0 - 0.1 * v * v) for v in range(6)]  # decreases 0.1, 0.3, ...
    eta = estimate(hist, 10.0 - 2.5 - 9 * 0.8)  # 9 x the last two's mean (0.8) left
    assert eta is not None and eta.rho == 1.0 and eta.versions_left == 9
    assert eta.eta_s == pytest.approx(90.0) and eta.eta_low_s == pytest.approx(90.0)
    assert eta.early and eta.eta_high_s is None and eta.versions_left_high is None
    assert eta.lower_bound  # no floor: the count holds the decreases up, the target later


def test_with_a_floor_growing_decreases_give_a_range_and_its_geometric_midpoint() -> None:
    """Losses 1.0, 0.95, 0.89, 0.82 above a floor of 0 (decreases 0.05, 0.06, 0.07: still
    growing). To 0.1: held decreases (0.065) give 12 versions; the loss's mean ratio over
    the last two versions (0.929) held gives 29; the ETA is their geometric mean, 19."""
    hist = [(v, 60.0 * v, y) for v, y in enumerate([1.0, 0.95, 0.89, 0.82])]
    eta = estimate(hist, 0.1, floor=0.0)
    assert eta is not None and eta.early and not eta.lower_bound
    ratio = (0.82 / 0.95) ** 0.5
    high = math.ceil(math.log(0.1 / 0.82) / math.log(ratio))
    assert high == 29 and eta.versions_left_high == high
    low = math.ceil(0.72 / 0.065)
    assert eta.versions_left == round(math.sqrt(low * high)) == 19
    assert eta.eta_low_s == pytest.approx(60.0 * low)
    assert eta.eta_s == pytest.approx(60.0 * 19) and eta.eta_high_s == pytest.approx(60.0 * high)
    # a floor nearer the loss leaves more to fall by the same fraction: a longer high count
    nearer = estimate(hist, 0.5, floor=0.4)
    assert nearer is not None and nearer.versions_left_high is not None
    assert nearer.versions_left_high > math.ceil(math.log(0.5 / 0.82) / math.log(ratio))
    # a target at or below the floor cannot be reached at any ratio: the low count alone
    below = estimate(hist, 0.1, floor=0.2)
    assert below is not None and below.lower_bound and below.versions_left == low


def test_early_with_a_floor_the_pace_is_the_midpoint_of_held_and_trend() -> None:
    """The same losses, now with 10 s more per version each version (10, 20, 30 s): the
    19 versions to come take 30 s each held, the line's 40 .. 220 s continued; the ETA is
    the geometric mean of the two sums, the range the low count held and the high one
    continued."""
    closes = [0.0, 10.0, 30.0, 60.0]
    hist = [(v, closes[v], y) for v, y in enumerate([1.0, 0.95, 0.89, 0.82])]
    eta = estimate(hist, 0.1, floor=0.0)
    assert eta is not None and eta.early and eta.versions_left == 19
    held, trend = 19 * 30.0, sum(30.0 + 10.0 * k for k in range(1, 20))
    assert eta.eta_s == pytest.approx(math.sqrt(held * trend))
    assert eta.eta_low_s == pytest.approx(12 * 30.0)
    assert eta.eta_high_s == pytest.approx(sum(30.0 + 10.0 * k for k in range(1, 30)))
    # without a floor: the low count at the trend's pace, a lower bound
    bound = estimate(hist, 0.1)
    assert bound is not None and bound.lower_bound
    assert bound.eta_s == pytest.approx(sum(30.0 + 10.0 * k for k in range(1, 13)))


def test_a_measured_decay_ignores_the_floor() -> None:
    hist = geometric(12, floor=0.5, c=1.0, rho=0.8, dt=30.0)
    target = 0.5 + 0.8**20
    with_floor = estimate(hist, target, floor=0.0)
    assert with_floor == estimate(hist, target)
    assert with_floor is not None and not with_floor.early
    assert with_floor.eta_low_s == with_floor.eta_high_s == with_floor.eta_s


def test_versions_that_left_the_loss_as_it_was_start_the_window_later() -> None:
    """Local training through the engine opens with an empty version (the loss unchanged):
    the fit starts after it instead of giving up on a decrease of 0; a later one still
    makes the ETA unknown."""
    opened: list[tuple[int, float, float | None]] = [(0, 0.0, 1.5)]
    opened += [(v, 100.0 + 30.0 * (v - 1), 0.5 + 0.8 ** (v - 1)) for v in range(1, 9)]
    target = 0.5 + 0.8**12  # reached at version 13: 5 after the last (8)
    assert estimate(opened[2:], target) is not None
    eta = estimate(opened, target)
    assert eta is not None and eta.rho == pytest.approx(0.8)
    assert eta.versions_left == 5 and eta.seconds_per_version == pytest.approx(30.0)
    stalled = [*opened[:4], (opened[4][0], opened[4][1], opened[3][2]), *opened[5:]]
    assert estimate(stalled, target) is None


def test_a_reached_target_is_zero_seconds_away() -> None:
    hist = geometric(5, floor=0.5, c=1.0, rho=0.5, dt=10.0)
    eta = estimate(hist, 0.9)
    assert eta is not None and eta.eta_s == 0.0 and eta.versions_left == 0


def test_the_window_is_the_last_versions_only() -> None:
    """An early slow phase does not count once ten faster versions follow it."""
    slow = [(v, 10.0 * v, 10.0 - 0.01 * v) for v in range(30)]
    fast = [(30 + v, 300.0 + 10.0 * v, 5.0 + 4.0 * 0.5**v) for v in range(11)]
    eta = estimate(slow + fast, 5.0 + 4.0 * 0.5**14)
    assert eta is not None and eta.rho == pytest.approx(0.5) and eta.versions_left == 4


# --------------------------------------------------------------------------- over HTTP

JOB, D, ROWS = "etajob", 200, 300


@contextmanager
def _serving(memory_url: str, tmp_path: Path, **extra: Any) -> Iterator[tuple[httpx.Client, Any]]:
    """The app under uvicorn on a free port with an evaluation file of ROWS rows, two agents'
    hellos sent: the HTTP client and the agents' transport."""
    eval_file = tmp_path / "eval.svm"
    write_libsvm(_data(), eval_file)
    settings = load_settings(
        job=JOB, d=D, step_size=4.0, transports=[memory_url], data_dir=tmp_path / "data",
        tick_s=0.02, downlink_pacing=False, feedback="any", eval_data=eval_file, **extra,
    )  # fmt: skip
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host=HOST, port=port, log_level="warning")
    )
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    t = open_transport(memory_url, role="agent", client_id="eta-agents")
    try:
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started
        t.connect()
        for a in ("a", "b"):
            hello = messages.Hello(job=JOB, agent=a, d=D, rows=ROWS, smoothness=1.0,
                                   model="logreg", compressor="dense",
                                   profile="paper_payload_bits")  # fmt: skip
            t.publish(topics.hello(JOB, a), messages.dump(hello))
        with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=10.0) as http:
            yield http, t
    finally:
        t.close()
        server.should_exit = True
        serving.join(timeout=10)


def _data() -> Any:
    return make_rcv1_like(ROWS, D, rng=np.random.default_rng(0), nnz_per_row=10.0)


def _descend(http: httpx.Client, t: Any, scales: list[float]) -> list[float]:
    """One version per entry of ``scales``: both agents send that multiple of the exact
    gradient of the evaluation loss at the served model; the losses of /history."""
    data, model = _data(), make_model("logreg", n_features=D)
    for v, scale in enumerate(scales):
        x = np.load(io.BytesIO(http.get("/model").content), allow_pickle=False)
        g = scale * model.grad(x, data)
        for a in ("a", "b"):
            blob = wire.encode(compress(g, "dense", D), job=JOB, agent=a, round=v, seq=v)
            t.publish(topics.update(JOB, a), blob)
        end = time.monotonic() + 20
        while http.get("/status").json()["model_version"] <= v:
            assert time.monotonic() < end, f"version {v + 1} did not close"
            time.sleep(0.02)
    return [r["loss"] for r in http.get("/history").json()["rounds"]]


@pytest.mark.integration  # uvicorn on a real port
def test_status_gives_the_eta_of_a_descending_job_over_http(
    memory_url: str, tmp_path: Path
) -> None:
    """Two agents send the exact gradient of the evaluation loss at the model /model serves:
    gradient descent on a strongly convex objective, so the loss falls geometrically and
    /status?target= gives a finite ETA; without a target (AGG_TARGET_LOSS unset) it is null."""
    with _serving(memory_url, tmp_path) as (http, t):
        losses = _descend(http, t, [1.0] * 12)
        status = http.get("/status").json()
        assert status["eta"] is None  # no AGG_TARGET_LOSS
        loss = status["loss"]
        assert loss is not None and loss == pytest.approx(losses[-1])
        assert all(b < a for a, b in itertools.pairwise(losses))
        drop = losses[-2] - losses[-1]
        target = loss - 2.0 * drop  # a few versions away at the recent rate
        eta = http.get("/status", params={"target": target}).json()["eta"]
        assert eta is not None, status
        assert eta["target_loss"] == pytest.approx(target)
        assert 2 <= eta["versions_left"] <= 6
        assert 0.0 < eta["rho"] < 1.0 and eta["window"] == 11
        assert eta["lower_bound"] is False and eta["early"] is False
        assert eta["eta_low_s"] == eta["eta_high_s"] == eta["eta_s"]
        assert eta["eta_s"] == pytest.approx(eta["versions_left"] * eta["seconds_per_version"])
        closed = http.get("/history").json()["rounds"][-1]["closed_at"]
        assert eta["eta_at"] >= closed
        assert http.get("/status", params={"target": loss + 1.0}).json()["eta"]["eta_s"] == 0


def _growing_descent(http: httpx.Client, t: Any) -> dict[str, Any] | None:
    """Six versions whose steps grow (as EF21's do while its states fill), so the loss
    decreases grow: /status's ETA to a target ten such decreases away."""
    losses = _descend(http, t, [0.02 * (v + 1) for v in range(6)])
    decreases = [a - b for a, b in itertools.pairwise(losses)]
    assert all(b > a > 0 for a, b in itertools.pairwise(decreases)), decreases
    target = losses[-1] - 10.0 * decreases[-1]
    eta: dict[str, Any] | None = http.get("/status", params={"target": target}).json()["eta"]
    return eta


def _assert_a_range(eta: dict[str, Any] | None) -> None:
    """An early ETA with both counts: not a lower bound, the midpoint inside the range."""
    assert eta is not None and eta["early"] is True and eta["lower_bound"] is False
    assert eta["rho"] == 1.0 and eta["versions_left_high"] >= eta["versions_left"]
    assert 0.0 <= eta["eta_low_s"] <= eta["eta_s"] <= eta["eta_high_s"]


@pytest.mark.integration  # uvicorn on a real port
def test_with_a_loss_floor_an_early_eta_is_a_range_over_http(
    memory_url: str, tmp_path: Path
) -> None:
    """With AGG_LOSS_FLOOR set the early ETA is a range, and /status says where the floor
    came from."""
    floor = 0.0  # a logistic loss is never negative
    with _serving(memory_url, tmp_path, loss_floor=floor) as (http, t):
        status = http.get("/status").json()
        assert status["loss_floor"] == floor and status["loss_floor_source"] == "set"
        _assert_a_range(_growing_descent(http, t))


@pytest.mark.integration  # uvicorn on a real port
def test_by_default_the_service_solves_its_loss_floor_over_http(
    memory_url: str, tmp_path: Path
) -> None:
    """AGG_LOSS_FLOOR unset (auto): the service solves the least the evaluation loss can be
    on its evaluation data, /status shows it (a proven bound within 1e-9 of f*), and the
    early ETA is a range with no setting at all."""
    with _serving(memory_url, tmp_path) as (http, t):
        deadline = time.monotonic() + 30
        while (status := http.get("/status").json())["loss_floor_source"] == "solving":
            assert time.monotonic() < deadline, "the loss floor was not solved in 30 s"
            time.sleep(0.05)
        _, f_star = solve_optimum(make_model("logreg", n_features=D), _data())
        assert status["loss_floor_source"] == "solved"
        assert f_star - 1e-9 <= status["loss_floor"] <= f_star
        _assert_a_range(_growing_descent(http, t))


@pytest.mark.integration  # uvicorn on a real port
def test_with_the_floor_off_an_early_eta_is_a_lower_bound_over_http(
    memory_url: str, tmp_path: Path
) -> None:
    """AGG_LOSS_FLOOR=none: no floor, so the same descent's early ETA is the low count,
    flagged a lower bound (the case the default now avoids)."""
    with _serving(memory_url, tmp_path, loss_floor="none") as (http, t):
        status = http.get("/status").json()
        assert status["loss_floor"] is None and status["loss_floor_source"] == "none"
        eta = _growing_descent(http, t)
        assert eta is not None and eta["early"] is True and eta["lower_bound"] is True
        assert eta["eta_high_s"] is None and eta["versions_left_high"] is None
