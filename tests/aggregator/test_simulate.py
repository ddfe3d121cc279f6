"""`aggregator simulate` on a tiny problem, through the real CLI entry (main(argv))."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.engine.rounds import RoundEngine
from aggregator.sim import cli
from aggregator.sim.experiment import METRICS
from aggregator.sim.methods import parse_method
from aggregator.sim.report import TIMING_FIELDS
from edge_agent.agent.loop import Agent

TINY = ["--rows", "300", "--features", "400", "--seed", "3", "--max-rounds", "400"]
FIELDS = {"method", "target", "rounds", "bits", "packets", "airtime_s", "energy_j"}


def run_cli(tmp_path: Path, name: str, *extra: str) -> list[dict[str, Any]]:
    out = tmp_path / f"{name}.json"
    code = cli.main([*TINY, "--no-progress", "--json", str(out), *extra])
    assert code == 0
    records: list[dict[str, Any]] = json.loads(out.read_text())
    return records


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_cli(tmp_path_factory.mktemp("sim"), "single", "--methods", "dense,cat-topk")


def test_json_has_one_record_per_method_and_target(single: list[dict[str, Any]]) -> None:
    assert [(r["method"], r["target"]) for r in single] == [
        (m, t) for m in ("dense", "cat-topk") for t in (0.1, 0.01, 0.001)
    ]
    for rec in single:
        assert rec.keys() >= FIELDS
        assert rec["agents"] == 1 and rec["profile"] == "paper_payload_bits"
        if rec["rounds"] is None:
            assert all(rec[m] is None for m in METRICS)
        else:
            assert isinstance(rec["rounds"], int) and rec["bits"] > 0 and rec["packets"] > 0


def test_cat_reaches_the_first_target_with_fewer_bits_than_dense(
    single: list[dict[str, Any]],
) -> None:
    first = {r["method"]: r for r in single if r["target"] == 0.1}
    assert first["dense"]["bits"] is not None and first["cat-topk"]["bits"] is not None
    assert first["cat-topk"]["bits"] < first["dense"]["bits"]


def test_runs_the_real_agent_and_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The engine's version is the number of rounds run; under the exact relay agents
    hold its x bit for bit."""
    engines: list[RoundEngine] = []
    agents: list[Agent] = []
    real_engine_init = RoundEngine.__init__
    real_agent_init = Agent.__init__

    def spy_engine(self: RoundEngine, *args: Any, **kwargs: Any) -> None:
        real_engine_init(self, *args, **kwargs)
        engines.append(self)

    def spy_agent(self: Agent, *args: Any, **kwargs: Any) -> None:
        real_agent_init(self, *args, **kwargs)
        agents.append(self)

    monkeypatch.setattr(RoundEngine, "__init__", spy_engine)
    monkeypatch.setattr(Agent, "__init__", spy_agent)
    records = run_cli(
        tmp_path, "fleet", "--agents", "3", "--methods", "cat-topk+ef21", "--max-rounds", "60",
        "--downlink", "exact",
    )  # fmt: skip
    assert len(engines) == 1 and len(agents) == 3
    engine = engines[0]
    rounds_run = records[0]["rounds_run"]
    assert rounds_run > 0 and engine.version == rounds_run
    assert engine.family == "ef21" and engine.accepted == 3 * rounds_run
    for agent in agents:
        assert agent.version == engine.version and agent.x is not None
        assert np.array_equal(agent.x, engine.x)  # bit for bit
        assert agent.ledger.updates == rounds_run + 1  # the last update is never applied


def test_a_missed_target_is_null_and_the_run_stops_at_max_rounds(tmp_path: Path) -> None:
    records = run_cli(tmp_path, "miss", "--methods", "topk:1", "--max-rounds", "5")
    assert len(records) == 3
    for rec in records:
        assert rec["rounds"] is None and rec["rounds_run"] == 5
        assert all(rec[m] is None for m in METRICS)
        assert rec["stop_reason"] == "max_rounds=5"
        assert rec["final_suboptimality"] > 0.1


def test_deterministic_under_a_fixed_seed(tmp_path: Path) -> None:
    args = ("--agents", "2", "--methods", "cat-signtopk,cat-randk", "--max-rounds", "80")
    a = run_cli(tmp_path, "a", *args)
    b = run_cli(tmp_path, "b", *args)

    def strip(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in recs]

    assert strip(a) == strip(b)
    assert json.dumps(strip(a), sort_keys=True) == json.dumps(strip(b), sort_keys=True)


def test_method_grammar() -> None:
    m = parse_method("hybrid-topk:200+ef21")
    assert (m.compressor, m.policy, m.feedback) == ("topk", "hybrid:200", "ef21")
    assert parse_method("topk:64").policy == "fixed:64"
    assert parse_method("dense").compressor == "dense"
    with pytest.raises(ValueError, match="compressor"):
        parse_method("cat-gzip")
    with pytest.raises(ValueError, match="feedback"):
        parse_method("cat-topk+ef3")


def test_bad_input_exits_with_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--methods", "cat-gzip", "--no-progress"]) == 2
    assert "cat-gzip" in capsys.readouterr().err


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_cli(
        tmp_path_factory.mktemp("sim"),
        "both",
        "--agents", "3",
        "--profiles", "lorawan_eu868_dr5_sf7,ble5_2m_dle_notify,nbiot_udp_psm_rai",
        "--methods", "dense,cat-signtopk+ef21",
        "--downlink", "exact,cat",
        "--targets", "0.1",
    )  # fmt: skip


def test_records_carry_the_downlink_and_the_total(both_ways: list[dict[str, Any]]) -> None:
    assert [(r["method"], r["downlink"]) for r in both_ways] == [
        (m, dl) for m in ("dense", "cat-signtopk+ef21") for dl in ("exact", "cat")
    ]
    for rec in both_ways:
        assert rec["models_equal"] is True
        assert rec["rounds"] is not None
        assert rec["down_bytes"] > 0 and rec["down_airtime_s"] > 0 and rec["down_energy_j"] > 0
        assert rec["total_bytes"] == rec["bytes"] + rec["down_bytes"]
        for m in METRICS:
            assert rec[f"total_{m}"] == pytest.approx(rec[m] + rec[f"down_{m}"])


def test_dense_downlink_is_one_float32_model_change_per_agent_per_round(
    both_ways: list[dict[str, Any]],
) -> None:
    dense = next(r for r in both_ways if r["method"] == "dense" and r["downlink"] == "exact")
    d = dense["d"]
    per_round = dense["down_bytes"] / (dense["agents"] * max(1, dense["rounds"]))
    assert 4 * d <= per_round <= 4 * d + 64  # the float32 values plus a header (and x0 = 0)


def test_the_compressed_downlink_receives_less_than_the_exact_one(
    both_ways: list[dict[str, Any]],
) -> None:
    ef21 = {r["downlink"]: r for r in both_ways if r["method"] == "cat-signtopk+ef21"}
    assert ef21["cat"]["down_bytes"] < ef21["exact"]["down_bytes"]
    dense = next(r for r in both_ways if r["method"] == "dense")
    assert ef21["cat"]["total_bytes"] * 5 < dense["total_bytes"]


def test_the_table_shows_both_directions_and_the_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (rec,) = run_cli(tmp_path, "table", "--methods", "dense", "--targets", "0.1",
                     "--profile", "lorawan_eu868_dr5_sf7")  # fmt: skip
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    head = next(ln for ln in lines if ln[:2] == ["method", "downlink"])
    row = dict(zip(head, next(ln for ln in lines if ln[0] == "dense"), strict=True))
    assert {"up_bytes", "down_bytes", "total_bytes", "sim_time_s"} <= set(head)
    assert int(row["up_bytes"]) == rec["bytes"] and int(row["down_bytes"]) == rec["down_bytes"]
    assert int(row["total_bytes"]) == rec["bytes"] + rec["down_bytes"]
    assert float(row["sim_time_s"]) == pytest.approx(rec["sim_time_s"], rel=1e-3)
    assert rec["sim_time_s"] > 0


def test_minibatch_runs_report_gradient_passes_and_reach_the_target(tmp_path: Path) -> None:
    records = run_cli(
        tmp_path,
        "sgd",
        "--agents",
        "5",
        "--batch-size",
        "0.1",
        "--methods",
        "dense,cat-signtopk+ef",
        "--targets",
        "1e-1",
    )
    assert {r["method"] for r in records} == {"dense", "cat-signtopk+ef"}
    for r in records:
        assert r["batch_size"] == 0.1 and r["rounds"] is not None
        # 10 % of every shard per round: a tenth of a pass per round
        assert r["grad_passes"] == pytest.approx(r["rounds"] / 10, rel=0.05)


def test_full_gradient_records_carry_no_gradient_fields(single: list[dict[str, Any]]) -> None:
    assert all("grad_passes" not in r and "batch_size" not in r for r in single)


def test_periodic_snapshots_are_off_by_default_for_sgd_and_cost_downlink_bytes(
    tmp_path: Path,
) -> None:
    sgd = ["--agents", "3", "--batch-size", "0.2", "--methods", "cat-signtopk+ef",
           "--downlink", "cat", "--targets", "1e-1"]  # fmt: skip
    default = run_cli(tmp_path, "default", *sgd)
    off = run_cli(tmp_path, "off", *sgd, "--snapshot-every", "0")
    every = run_cli(tmp_path, "every", *sgd, "--snapshot-every", "2")
    assert default[0]["down_bytes"] == off[0]["down_bytes"]
    # a snapshot every 2nd version: at least the float32 model to each agent each time
    rounds, d = off[0]["rounds"], off[0]["d"]
    assert rounds is not None and rounds >= 4
    assert every[0]["down_bytes"] - off[0]["down_bytes"] >= (rounds // 2 - 1) * 3 * 4 * d // 2


def test_a_negative_snapshot_cadence_exits_with_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*TINY, "--no-progress", "--snapshot-every", "-1"]) == 2
    assert "--snapshot-every" in capsys.readouterr().err


def test_ef_model_grammar_keeps_the_residual_in_model_units() -> None:
    plain, model_units = parse_method("cat-signtopk+ef"), parse_method("cat-signtopk+ef:model")
    assert (plain.feedback, plain.ef_model_units) == ("ef", False)
    assert (model_units.feedback, model_units.ef_model_units) == ("ef", True)
    assert parse_method("cat-signtopk:nominal+ef").policy == "cat:nominal"
    with pytest.raises(ValueError, match="cat:nominal"):
        parse_method("cat-signtopk:loud+ef")
