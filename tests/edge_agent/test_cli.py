"""The edge-agent command line: profiles, data, calibrate, the run summary (the run itself is
covered in integration)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from aggregator.localnet import free_port
from edge_agent.agent.loop import Agent, AgentConfig
from edge_agent.cli.commands import main
from edge_agent.cli.summary import run_summary
from edge_agent.data import load_dataset
from edge_agent.links.catalog import list_profiles, load_profile, resolve_profile
from edge_agent.numerics.models import make_model
from edge_agent.protocol import topics, wire
from edge_agent.transports import open_transport


def test_profiles_lists_every_shipped_profile_with_its_choice(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["profiles", "--d", "5000", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["profile"] for r in rows} == {p.name for p in list_profiles()}
    for r in rows:
        assert 1 <= r["t"] <= 5000
        assert r["size_bytes"] < r["dense_size_bytes"]


def test_profiles_give_the_silence_each_sub_band_allows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "lorawan_eu868_dr0_sf12", "sigfox_rc1", "--d", "1000", "--json"]) == 0
    rows = {r["profile"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    lora, sigfox = rows["lorawan_eu868_dr0_sf12"], rows["sigfox_rc1"]
    assert lora["duty_cycle_bands"] == 2 and sigfox["duty_cycle_bands"] == 1
    # TTN's fair-use cap (30 s a day) is below the two sub-bands' 2 %: it sets the silence
    assert lora["silence_s"] == pytest.approx(lora["airtime_s"] * (86_400 / 30 - 1))
    assert sigfox["silence_s"] == pytest.approx(sigfox["airtime_s"] * 99)


def test_profiles_table_names_the_columns(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "lorawan_eu868_dr0_sf12", "--d", "1000"]) == 0
    out = capsys.readouterr().out
    assert "lorawan_eu868_dr0_sf12" in out and "T*" in out and "airtime_s" in out


def test_profiles_show_the_dense_downlink_and_the_daily_cap(
    capsys: pytest.CaptureFixture[str],
) -> None:
    names = ["lorawan_eu868_dr0_sf12", "sigfox_rc1", "ble5_2m_dle_notify"]
    assert main(["profiles", *names, "--d", "1000", "--json"]) == 0
    rows = {r["profile"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    shipped = {p.name: p for p in list_profiles()}
    for name in names:
        profile, row = shipped[name], rows[name]
        dense = profile.downlink_cost(row["dense_size_bytes"])
        assert row["downlink_dense_cost"] == getattr(dense.cost, profile.objective) > 0
        assert row["downlink_dense_packets"] == dense.packets
    assert [rows[n]["max_downlinks_per_day"] for n in names] == [10, 4, None]
    assert main(["profiles", *names, "--d", "1000"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "down dense" in table[1] and "down/day" in table[1]
    assert table[3].split()[-1] == "10" and table[5].split()[-1] == "-"


def test_data_generate_writes_shards_that_partition_the_rows(tmp_path: Path) -> None:
    assert (
        main(
            [
                "data",
                "generate",
                "--rows",
                "300",
                "--features",
                "500",
                "--shards",
                "3",
                "--out",
                str(tmp_path),
                "--full",
            ]
        )
        == 0
    )
    shards = [load_dataset(tmp_path / f"shard-{i:03d}.svm", n_features=500) for i in range(3)]
    full = load_dataset(tmp_path / "full.svm", n_features=500)
    assert sum(s.n_rows for s in shards) == full.n_rows == 300


def test_data_split_of_a_real_libsvm_file(tmp_path: Path) -> None:
    src = Path(__file__).resolve().parents[1] / "data" / "breast_cancer.svm"
    assert (
        main(
            [
                "data",
                "split",
                str(src),
                "--shards",
                "4",
                "--how",
                "label",
                "--out",
                str(tmp_path),
                "--format",
                "npz",
            ]
        )
        == 0
    )
    rows = [load_dataset(tmp_path / f"shard-{i:03d}.npz").n_rows for i in range(4)]
    assert sum(rows) == 569


@pytest.mark.integration  # real ZeroMQ sockets on 127.0.0.1
def test_calibrate_measures_a_loopback_link_and_writes_a_valid_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    sizes = [16, 256, 4096, 65536]
    repeats = 3
    server = threading.Thread(
        target=main,
        args=(
            [
                "calibrate",
                "serve",
                "--bind",
                f"tcp://127.0.0.1:{port}",
                "--max-requests",
                str(1 + len(sizes) * repeats),
            ],
        ),
        daemon=True,
    )
    server.start()
    out = tmp_path / "loopback.json"
    code = main(
        [
            "calibrate",
            "measure",
            "--peer",
            f"tcp://127.0.0.1:{port}",
            "--name",
            "loopback",
            "--out",
            str(out),
            "--sizes",
            ",".join(map(str, sizes)),
            "--repeats",
            str(repeats),
            "--power-w",
            "0.5",
        ]
    )
    server.join(timeout=30)
    assert code == 0 and not server.is_alive()
    profile = load_profile(out)
    assert profile.kind == "measured" and profile.objective == "energy_j"
    costs = profile.objective_cost(np.array(sizes, dtype=np.int64))
    assert np.all(np.diff(costs) >= 0) and costs[0] > 0
    assert "affine fit" in capsys.readouterr().out


@pytest.mark.integration  # real ZeroMQ sockets on 127.0.0.1
def test_calibrate_without_a_peer_fails_with_a_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "calibrate",
            "measure",
            "--peer",
            f"tcp://127.0.0.1:{free_port()}",
            "--name",
            "x",
            "--out",
            str(tmp_path / "x.json"),
            "--sizes",
            "16",
            "--repeats",
            "1",
            "--timeout-s",
            "0.3",
        ]
    )
    assert code == 1
    assert "calibrate serve" in capsys.readouterr().err


def test_unknown_policy_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = Path(__file__).resolve().parents[1] / "data" / "breast_cancer.svm"
    code = main(
        [
            "run",
            "--profile",
            "ble5_2m_dle_notify",
            "--data",
            str(src),
            "--policy",
            "greedy",
            "--server",
            "memory://cli-test",
        ]
    )
    assert code == 2  # a configuration error: a restart cannot fix it
    assert "unknown policy 'greedy'" in capsys.readouterr().err


def test_run_summary_carries_uplink_downlink_and_total(memory_url: str) -> None:
    data = load_dataset(Path(__file__).resolve().parents[1] / "data" / "breast_cancer.svm")
    model = make_model("logreg", n_features=data.n_features)
    server = open_transport(memory_url, role="aggregator", client_id="server")
    server.connect()
    agent = Agent(
        AgentConfig(job="j", agent_id="a1", duty_cycle="ignore"),
        model=model,
        data=data,
        profile=resolve_profile("lorawan_eu868_dr5_sf7"),
        transport=open_transport(memory_url, role="agent", client_id="a1"),
    )
    try:
        agent.start()  # the hello: uplink
        snap = wire.encode_snapshot(np.zeros(model.d), job="j", version=0)
        server.publish(topics.model("j"), snap, retain=True)
        for _ in range(50):  # bounded: the snapshot is the downlink
            m = agent.transport.recv(timeout_s=0.05)
            if m is not None:
                agent.handle(m)
            if agent.ledger.down.messages:
                break
        summary = json.loads(json.dumps(run_summary("a1", agent)))  # JSON-able as printed
    finally:
        agent.close("offline")
        server.close()
    up, down, total = summary["up"], summary["down"], summary["total"]
    assert up["messages"] >= 1 and down["messages"] == 1 and down["bytes"] == len(snap)
    assert down["airtime_s"] > 0 and down["energy_j"] > 0  # priced on the LoRaWAN downlink
    for k in ("messages", "bytes", "bits", "packets", "airtime_s", "energy_j"):
        assert total[k] == pytest.approx(up[k] + down[k]), k
    assert summary["size_bytes"] == up["bytes"] and summary["agent"] == "a1"
    assert {"updates", "bytes_on_air", "bytes_on_air_down", "silence_s"} <= summary.keys()
