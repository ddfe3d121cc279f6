"""The simulator's energy accounting: radio energy as before, compute energy beside it."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from aggregator.engine.downlink.broadcast import downlink_interval_s, shared_limit
from aggregator.sim.cli import main
from aggregator.sim.experiment import run_method
from aggregator.sim.local import local_table, run_local
from aggregator.sim.methods import parse_method
from aggregator.sim.problem import Fleet, Problem, build_fleet, build_problem, nonzeros
from aggregator.sim.report import records, summary_table
from edge_agent.links.profiles import ComputePart
from edge_agent.numerics.local import LocalConfig

#: a profile without a compute part (and with an energy cost)
PLAIN = "ltem_udp_psm"
PART = ComputePart(per_gradient_j=1e-3, per_row_j=2e-6, per_nonzero_j=3e-7)


@pytest.fixture(scope="module")
def problem() -> Problem:
    return build_problem(data_path=None, rows=240, features=300, seed=3, model_kind="logreg",
                         l2=1e-2, split="iid", optimum_tol=1e-12)  # fmt: skip


def _with_compute(fleet: Fleet, agents: set[int]) -> Fleet:
    """``fleet`` with PART on the profiles of ``agents`` (renamed, so the engine's lookup
    by name finds each)."""
    profiles = tuple(
        replace(p, name=f"{p.name}_c", compute=PART) if i in agents else p
        for i, p in enumerate(fleet.profiles)
    )
    return replace(fleet, profiles=profiles)


def _expected_j(fleet: Fleet, agents: set[int], evals: int) -> float:
    return sum(
        PART.energy_j(evals, evals * s.n_rows, evals * nonzeros(s))
        for i, s in enumerate(fleet.shards)
        if i in agents
    )


def test_engine_path_adds_compute_energy_and_keeps_energy_j_radio(problem: Problem) -> None:
    method = parse_method("cat-signtopk+ef21")
    plain = build_fleet(problem, 3, [PLAIN])
    fleet = _with_compute(plain, {0, 2})
    kw = {"targets": (1e-1,), "max_rounds": 200}
    base = records(run_method(problem, plain, method, **kw), (1e-1,))[0]  # type: ignore[arg-type]
    result = run_method(problem, fleet, method, **kw)  # type: ignore[arg-type]
    rec = records(result, (1e-1,))[0]
    k = rec["rounds"]
    assert k is not None and k > 1 and k == base["rounds"]
    # the radio's fields mean what they meant: the same run without compute parts
    for key in ("energy_j", "down_energy_j", "total_energy_j", "total_bytes"):
        assert rec[key] == pytest.approx(base[key], rel=1e-12), key
    assert base["compute_energy_j"] == 0.0 and base["compute_not_modelled"] == [PLAIN]
    assert rec["compute_energy_j"] == pytest.approx(_expected_j(fleet, {0, 2}, k), rel=1e-12)
    assert rec["device_energy_j"] == pytest.approx(rec["total_energy_j"] + rec["compute_energy_j"])
    assert rec["compute_not_modelled"] == [PLAIN]  # agent 1 keeps the plain one
    table = summary_table([result], (1e-1,))
    assert "compute_J" in table and "device_J" in table
    assert "compute energy not modelled (0) for: " + PLAIN in table


def test_minibatch_compute_counts_the_rows_evaluated(problem: Problem) -> None:
    fleet = _with_compute(build_fleet(problem, 2, ["paper_payload_bits"]), {0, 1})
    result = run_method(problem, fleet, parse_method("dense"), targets=(1e-9,), max_rounds=6,
                        batch_size=0.25)  # fmt: skip
    k = result.rounds_run
    rows = result.trace.grad_rows[k]
    assert 0 < rows < k * sum(s.n_rows for s in fleet.shards)  # minibatches
    per_row = [nonzeros(s) / s.n_rows for s in fleet.shards]
    shares = [rows / 2, rows / 2]  # equal shards, equal batches
    expected = sum(PART.energy_j(k, r, r * z) for r, z in zip(shares, per_row, strict=True))
    assert result.trace.compute_energy_j[k] == pytest.approx(expected, rel=1e-9)


def test_local_path_prices_every_local_gradient(problem: Problem) -> None:
    fleet = _with_compute(build_fleet(problem, 3, [PLAIN]), {1})
    cfg = LocalConfig(local_steps=4)
    result = run_local(problem, fleet, parse_method("cat-signtopk"), cfg, targets=(1e-1,),
                       max_rounds=200)  # fmt: skip
    k = result.reached[1e-1]
    tr = result.trace
    assert tr.grad_evals[k] == 4 * k
    assert tr.compute_energy_j[k] == pytest.approx(_expected_j(fleet, {1}, 4 * k), rel=1e-12)
    assert tr.compute_energy_j[0] == 0.0
    table = local_table([result], (1e-1,))
    assert "compute J" in table and "not modelled (0) for: " + PLAIN in table


def test_local_minibatch_steps_price_the_rows_they_read(problem: Problem) -> None:
    """With ``batch_size`` 1/4, each local step evaluates a gradient on a quarter of the
    shard: per step one evaluation, and rows and nonzeros for a quarter pass."""
    fleet = _with_compute(build_fleet(problem, 3, [PLAIN]), {1})
    cfg = LocalConfig(local_steps=4, batch_size=0.25)
    result = run_local(problem, fleet, parse_method("cat-signtopk"), cfg, targets=(1e-1,),
                       max_rounds=200)  # fmt: skip
    k = result.reached[1e-1]
    tr = result.trace
    assert tr.grad_evals[k] == 4 * k and tr.passes[k] == k
    s = fleet.shards[1]
    assert tr.compute_energy_j[k] == pytest.approx(
        PART.energy_j(4 * k, k * s.n_rows, k * nonzeros(s)), rel=1e-12
    )


def test_local_path_time_waits_for_downlink_pacing(problem: Problem) -> None:
    """A network that allows 10 downlinks a day: every broadcast after the first waits
    for the links, as the engine path's pacing does."""
    fleet = build_fleet(problem, 2, ["lorawan_eu868_dr5_sf7"])
    method, cfg = parse_method("cat-signtopk"), LocalConfig(local_steps=2)
    paced = run_local(problem, fleet, method, cfg, targets=(1e-1,), max_rounds=100)
    free = run_local(problem, fleet, method, cfg, targets=(1e-1,), max_rounds=100,
                     downlink_pacing=False)  # fmt: skip
    k = paced.reached[1e-1]
    assert k == free.reached[1e-1] and k >= 3
    assert paced.trace.energy_j == free.trace.energy_j  # pacing moves time, not cost
    day_share = downlink_interval_s(fleet.profiles[0], 0)
    assert day_share == pytest.approx(86_400 / 10)
    assert paced.trace.time_s[k] >= (k - 1) * day_share
    assert free.trace.time_s[k] < (k - 1) * day_share / 10


def test_local_path_runs_a_multicast_group_once_for_all(problem: Problem) -> None:
    """With ``--multicast`` the members receive each broadcast on the group's shared
    downlink, paced by the group's own law instead of each unicast link's daily cap."""
    method, cfg = parse_method("cat-signtopk"), LocalConfig(local_steps=2)
    group = "lorawan_eu868_dr0_sf12_mcast_b_dr3"
    uni = build_fleet(problem, 2, ["lorawan_eu868_dr5_sf7"])
    multi = build_fleet(problem, 2, ["lorawan_eu868_dr5_sf7"], multicast=group)
    shared = multi.profiles[0].shared_downlink
    assert shared is not None
    a = run_local(problem, uni, method, cfg, targets=(1e-1,), max_rounds=100)
    b = run_local(problem, multi, method, cfg, targets=(1e-1,), max_rounds=100)
    k = b.reached[1e-1]
    assert k == a.reached[1e-1] and k >= 3
    assert b.trace.down_bytes == a.trace.down_bytes  # the same broadcasts
    assert b.trace.energy_j[k] != a.trace.energy_j[k]  # received on another downlink
    assert b.trace.time_s[k] < a.trace.time_s[k] / 2  # no daily cap of 10 downlinks
    assert b.trace.time_s[k] >= (k - 1) * shared_limit(shared, 0)[0]


def test_engine_path_at_cadence_counts_compute_too(problem: Problem) -> None:
    fleet = _with_compute(build_fleet(problem, 2, ["lorawan_eu868_dr5_sf7"]), {0, 1})
    result = run_method(problem, fleet, parse_method("cat-signtopk+ef21"), targets=(1e-9,),
                        max_rounds=6, cadence=True)  # fmt: skip
    energy = result.trace.compute_energy_j
    assert len(energy) == len(result.trace.subopt) and energy[0] == 0.0
    assert all(b >= a for a, b in itertools.pairwise(energy))
    # every agent has evaluated at least once, and at most once per version it answered
    assert min(_expected_j(fleet, {i}, 1) for i in (0, 1)) <= energy[-1]
    assert energy[-1] <= _expected_j(fleet, {0, 1}, len(energy))


def test_cli_local_path_honours_no_downlink_pacing(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--rows", "240", "--features", "300", "--agents", "2", "--l2", "1e-2",
            "--profile", "lorawan_eu868_dr5_sf7", "--methods", "cat-signtopk",
            "--local-steps", "2", "--targets", "1e-1", "--max-rounds", "100", "--no-progress"]  # fmt: skip
    times = []
    for extra in ([], ["--no-downlink-pacing"]):
        assert main(argv + extra) == 0
        out = capsys.readouterr().out
        line = next(x for x in out.splitlines() if x.startswith("cat-signtopk H=2"))
        times.append(float(line.split()[-1]))
        assert "compute energy not modelled" not in out  # the profile has a compute part
    assert times[0] > 10 * times[1]
