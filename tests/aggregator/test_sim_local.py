"""``aggregator simulate --local-steps``: the local-training path and its refusals."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from aggregator.sim.cli import main
from aggregator.sim.experiment import JOB
from edge_agent.numerics.local import round_steps


def test_local_steps_run_reports_rounds_gradients_and_bytes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--rows", "400", "--features", "300", "--agents", "4", "--split", "label",
            "--methods", "cat-signtopk", "--local-steps", "3", "--targets", "1e-1",
            "--max-rounds", "400", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("cat-signtopk H=3"))
    fields = line.split()
    assert "label" in fields and "not" not in fields
    rounds, grads = int(fields[fields.index("label") + 2]), int(fields[fields.index("label") + 3])
    assert grads == 3 * rounds


def test_local_steps_write_the_json_records(tmp_path: Path) -> None:
    out = tmp_path / "local.json"
    argv = ["--rows", "400", "--features", "300", "--agents", "4", "--methods", "cat-signtopk",
            "--local-steps", "3", "--targets", "1e-1", "--max-rounds", "400", "--no-progress",
            "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    [rec] = json.loads(out.read_text())
    assert rec["target"] == 0.1 and rec["rounds"] > 0
    assert rec["total_bytes"] == rec["up_bytes"] + rec["down_bytes"] > 0
    assert rec["grad_evals_per_agent"] == 3 * rec["rounds"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--methods", "cat-signtopk+ef21"], "drop +ef"),
        (["--methods", "cat-signtopk", "--local-method", "scaffnew"], "scaffnew"),
        (["--methods", "cat-signtopk", "--batch-size", "0.1"], "multiple of 10"),
        (["--methods", "cat-signtopk", "--batch-size", "16"], "fraction"),
        (
            ["--methods", "cat-signtopk", "--batch-size", "0.5", "--comm-prob", "0.5"],
            "--comm-prob with",
        ),
        (["--methods", "cat-signtopk", "--downlink", "exact"], "--downlink"),
        (["--methods", "cat-signtopk", "--cadence"], "--cadence"),
    ],
)
def test_refusals(extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--rows", "200", "--features", "100", "--agents", "2", "--local-steps", "2",
            "--max-rounds", "5", "--no-progress", *extra]  # fmt: skip
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_minibatch_local_steps_count_whole_passes(tmp_path: Path) -> None:
    """``--batch-size 0.25 --local-steps 8``: eight minibatch steps a round, two passes;
    the real engine's path agrees with the in-process one (the same batches: the agents'
    seeds, stream 1) to within a round or two, every copy exact."""
    common = ["--rows", "400", "--features", "300", "--agents", "4", "--methods",
              "cat-signtopk", "--local-steps", "8", "--batch-size", "0.25", "--targets", "1e-1",
              "--max-rounds", "400", "--no-progress"]  # fmt: skip
    ref = tmp_path / "inproc.json"
    assert main([*common, "--json", str(ref)]) == 0
    [rec] = json.loads(ref.read_text())
    assert rec["rounds"] is not None and rec["rounds"] > 0
    assert rec["grad_evals_per_agent"] == 8 * rec["rounds"]
    assert rec["grad_passes"] == 2 * rec["rounds"]
    assert "b=0.25" in rec["method"]
    out = tmp_path / "engine.json"
    assert main([*common, "--local-engine", "--json", str(out)]) == 0
    [eng] = [r for r in json.loads(out.read_text()) if r["target"] == 0.1]
    assert eng["models_equal"] is True and eng["rounds"] is not None
    assert abs(eng["rounds"] - 1 - rec["rounds"]) <= 2
    assert eng["grad_passes"] == 2 * (eng["rounds"] - 1)


def test_preset_refuses_local_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--preset", "paper", "--local-steps", "5"]) == 2
    assert "--preset" in capsys.readouterr().err


def test_local_engine_runs_the_real_engine_with_exact_copies(tmp_path: Path) -> None:
    """``--local-engine``: the service's path (RoundEngine and real agents over memory://);
    its record says every copy equals the model, and it reaches the target like the
    in-process aggregator, one empty first round and the LOCAL operations' bytes apart."""
    out = tmp_path / "engine.json"
    common = ["--rows", "400", "--features", "300", "--agents", "4", "--methods",
              "cat-signtopk", "--local-steps", "3", "--targets", "1e-1", "--max-rounds", "400",
              "--no-progress"]  # fmt: skip
    assert main([*common, "--local-engine", "--json", str(out)]) == 0
    [eng] = [r for r in json.loads(out.read_text()) if r["target"] == 0.1]
    assert eng["models_equal"] is True and eng["rounds"] is not None
    ref = tmp_path / "inproc.json"
    assert main([*common, "--json", str(ref)]) == 0
    [inproc] = json.loads(ref.read_text())
    assert abs(eng["rounds"] - 1 - inproc["rounds"]) <= 2


def test_local_engine_runs_the_coin_with_the_announced_counts(tmp_path: Path) -> None:
    """``--comm-prob`` through the real engine: each LOCAL operation announces the next
    round's drawn count and every member takes exactly that many steps, so the gradient
    evaluations to round k are the first k - 1 draws of the job's stream; every copy exact."""
    out = tmp_path / "coin.json"
    argv = ["--rows", "400", "--features", "300", "--agents", "3", "--methods", "cat-signtopk",
            "--comm-prob", "0.3", "--local-engine", "--targets", "1e-1", "--max-rounds", "300",
            "--no-progress", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    [rec] = json.loads(out.read_text())
    k = rec["rounds"]
    assert k is not None and rec["models_equal"] is True
    seed = zlib.crc32(JOB.encode())
    draws = [round_steps(0.3, seed, j) for j in range(k - 1)]
    assert len(set(draws)) > 1  # drawn, not a fixed H
    assert rec["grad_passes"] == pytest.approx(sum(draws))


def test_local_engine_runs_at_cadence(tmp_path: Path) -> None:
    """``--local-engine --cadence``: the real engine's cadence rule applies to local jobs
    (aggregator.engine.cadence; tests/aggregator/test_cadence.py checks the excuses); the
    run reaches the target within the law, every copy exact."""
    out = tmp_path / "cadence.json"
    argv = ["--rows", "400", "--features", "300", "--agents", "4", "--profiles",
            "lorawan_eu868_dr0_sf12,ble5_2m_dle_notify", "--multicast",
            "lorawan_eu868_dr0_sf12_mcast_c_dr3", "--methods", "cat-signtopk", "--local-steps",
            "3", "--local-engine", "--cadence", "--round-deadline", "3000", "--targets", "1e-1",
            "--max-rounds", "400", "--no-progress", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    [rec] = json.loads(out.read_text())
    assert rec["rounds"] is not None and rec["models_equal"] is True
    assert rec["audit_worst_margin"] >= 0


def test_a_local_change_that_arrives_after_its_version_closed_is_refused_stale(
    tmp_path: Path,
) -> None:
    """At cadence a member's change may still be on air when its version closes without it:
    the engine refuses it ``stale`` (it was computed from that version's anchor), the run
    counts it and goes on (before: RuntimeError), and its agent answers a later version."""
    out = tmp_path / "stale.json"
    argv = ["--rows", "2000", "--features", "2000", "--agents", "40", "--profiles",
            "lorawan_eu868_dr5_sf7,lorawan_eu868_dr0_sf12,ble5_2m_dle_notify,nbiot_udp_psm_rai",
            "--multicast", "lorawan_eu868_dr0_sf12_mcast_c_dr3", "--methods", "cat-signtopk",
            "--local-steps", "3", "--local-engine", "--cadence", "--round-deadline", "1000",
            "--targets", "1e-1", "--max-rounds", "300", "--no-progress", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    [rec] = json.loads(out.read_text())
    assert rec["stale_updates"] > 0
    assert rec["rounds"] is not None and rec["models_equal"] is True
