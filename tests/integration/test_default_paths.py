"""The default-path matrix: what a new user runs by hand, as real processes, trains.

The README's by-hand path and nothing else: the aggregator with ``AGG_JOB``, ``AGG_D``,
``AGG_TRANSPORTS`` and ``AGG_DATA_DIR`` (``AGG_DOWNLINK`` only where the downlink mode is
the one under test), ``uvicorn aggregator.app:app``; agents with ``edge-agent run --profile
--server --job --agent-id --data --features``; data from ``edge-agent data generate`` at the
README's d = 47,236. Every other setting keeps its default: EF21 feedback, the automatic
downlink (exact relay or compressed change per version), downlink pacing, the agent's duty cycle from its profile (``--duty-cycle wait``),
``--resend-s 10``. A run passes when ``/status`` (over HTTP) reaches
:data:`VERSIONS` versions and every agent exits 0 on SIGINT having trained without
looping on requests.

The matrix: {ZeroMQ, Mosquitto} x {auto, exact, cat, delta} with one agent, and {ZeroMQ,
Mosquitto} x auto with three agents on different profiles. The three profiles are ones
that train at real speed (Wi-Fi ESP32, BLE 5 2M, Wi-Fi Raspberry Pi 4): LoRaWAN EU868's
1 % duty cycle and ten downlinks a day, or NB-IoT's 85-byte downlink packets under the
default pacing, space versions minutes (seconds, for NB-IoT, at this d) apart, so ten
versions do not fit in a test. A new setting's default belongs here (docs/operating.md,
"The default-path matrix").

LoRaWAN joins the matrix as a private network's three unicast members, {ZeroMQ, Mosquitto}
x auto, each ``--profile`` a file: a time-scaled copy of ``lorawan_eu868_dr5_sf7_private``
(duty cycles kept) that the aggregator finds in its ``CAT_EDGE_PROFILES_DIR``. There the
default pacing sends every downlink through the network's one gateway, and the run checks
the gateway's duty cycle on what the agents' own ledgers received (with
``AGG_DOWNLINK_PACING=false`` it fails: 4 % on a 2 % gateway).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import AggregatorProcess, scaled_profile, server_url, wait_until

from aggregator.localnet import service_env, tail
from edge_agent.links.catalog import PROFILES_DIR_ENV, save_profile

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: the README's d (the RCV1 feature count)
D = 47_236
#: versions every run must reach
VERSIONS = 10
#: profiles that train at real speed under their own duty cycle and the default pacing
PROFILES = ("wifi_esp32_mqtt_tcp", "ble5_2m_dle_notify", "wifi_rpi4_mqtt_tls13")
#: messages an agent may send besides its updates (hello, requests, re-sends, goodbye)
CONTROL_ALLOWANCE = 12
TRAIN_TIMEOUT_S = 60.0


def edge_agent(*args: str) -> list[str]:
    """The ``edge-agent`` command line, run by this interpreter."""
    return [sys.executable, "-m", "edge_agent.cli", *args]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three RCV1-like shards at d = 47,236, written by ``edge-agent data generate``."""
    out = tmp_path_factory.mktemp("shards")
    cmd = edge_agent("data", "generate", "--rows", "150", "--shards", "3")
    cmd += ["--features", str(D), "--out", str(out)]
    subprocess.run(cmd, env=service_env({}), check=True, capture_output=True, timeout=60)
    files = sorted(out.glob("shard-*"))
    assert len(files) == 3, files
    return files


@dataclass
class Agent:
    """One ``edge-agent run`` process and its output files."""

    agent_id: str
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    def summary(self) -> dict[str, Any]:
        lines = self.out.read_text().strip().splitlines()
        assert lines, f"{self.agent_id} printed no summary\n{tail(self.err, 15)}"
        return dict(json.loads(lines[-1]))


@dataclass
class Run:
    aggregator: AggregatorProcess
    agents: list[Agent]

    def diagnose(self) -> str:
        return "\n".join(
            [self.aggregator.diagnose()]
            + [f"{a.agent_id} stderr:\n{tail(a.err, 15)}" for a in self.agents]
        )


@pytest.fixture
def run_job(request: pytest.FixtureRequest, tmp_path: Path, shards: list[Path]) -> Iterator[Any]:
    """``run_job(transport, mode, n)``: start the aggregator and ``n`` agents by hand."""
    runs: list[Run] = []

    def start(
        transport: str, mode: str, n: int, profiles: Sequence[str] = PROFILES,
        env: dict[str, str] | None = None,
    ) -> Run:  # fmt: skip
        url = server_url(transport, request)
        job = f"line-3-{transport}-{mode}-{n}"
        settings = {
            "AGG_JOB": job,
            "AGG_D": str(D),
            "AGG_TRANSPORTS": url,
            "AGG_DATA_DIR": str(tmp_path / "agg"),
            **(env or {}),
        }
        if mode != "auto":  # the default is auto: set only the mode under test
            settings["AGG_DOWNLINK"] = mode
        agg = AggregatorProcess(tmp_path / "svc", settings)
        run = Run(agg, [])
        runs.append(run)
        agg.start()
        for i in range(n):
            agent_id = f"pi-{i:02d}"
            out, err = tmp_path / f"{agent_id}.out", tmp_path / f"{agent_id}.err"
            cmd = edge_agent("run", "--profile", profiles[i], "--server", url, "--job", job)
            cmd += ["--agent-id", agent_id, "--data", str(shards[i]), "--features", str(D)]
            with out.open("wb") as o, err.open("wb") as e:
                proc = subprocess.Popen(cmd, env=service_env(env or {}), stdout=o, stderr=e)
            run.agents.append(Agent(agent_id, proc, out, err))
        return run

    try:
        yield start
    finally:
        for run in runs:
            for a in run.agents:
                if a.proc.poll() is None:
                    a.proc.kill()
                    a.proc.wait(timeout=10)
            run.aggregator.close()


def wait_trained(run: Run, each: int = 0, versions: int = VERSIONS) -> list[dict[str, Any]]:
    """Wait for ``versions`` versions on ``/status`` and, with ``each``, for every agent
    to have that many updates accepted (a late joiner catches up); ``/agents`` then."""

    def trained() -> bool:
        for a in run.agents:
            if a.proc.poll() is not None:
                raise AssertionError(f"{a.agent_id} exited with {a.proc.returncode}")
        if int(run.aggregator.status()["model_version"]) < versions:
            return False
        accepted = [int(a["updates_accepted"]) for a in run.aggregator.get("/agents")]
        return len(accepted) == len(run.agents) and min(accepted) >= each

    wait_until(trained, TRAIN_TIMEOUT_S, f"{versions} versions", diagnose=run.diagnose)
    return list(run.aggregator.get("/agents"))


def stop(run: Run) -> list[dict[str, Any]]:
    """SIGINT every agent; their JSON summaries (each must exit 130: stopped by SIGINT after
    a clean shutdown, the shell convention of docs/operating.md)."""
    for a in run.agents:
        a.proc.send_signal(signal.SIGINT)
    for a in run.agents:
        assert a.proc.wait(timeout=20) == 128 + signal.SIGINT, run.diagnose()
    return [a.summary() for a in run.agents]


def assert_no_request_loop(summary: dict[str, Any]) -> None:
    """Each message beyond the updates is a hello, request, re-send or goodbye: a handful,
    however many model messages the agent could not apply."""
    sent, updates = summary["up"]["messages"], summary["updates"]
    assert updates >= 1, summary
    assert sent - updates <= CONTROL_ALLOWANCE, summary
    assert sum(summary["dropped"].values()) <= CONTROL_ALLOWANCE, summary


@pytest.mark.parametrize("mode", ["auto", "exact", "cat", "delta"])
@pytest.mark.parametrize("transport", ["zmq", "mqtt"])
def test_one_agent_trains_with_the_defaults(run_job: Any, transport: str, mode: str) -> None:
    run = run_job(transport, mode, 1)
    wait_trained(run)
    [summary] = stop(run)
    assert summary["rounds"] >= VERSIONS - 1, summary
    assert_no_request_loop(summary)


@pytest.mark.parametrize("transport", ["zmq", "mqtt"])
def test_three_agents_on_three_profiles_train_with_the_defaults(
    run_job: Any, transport: str
) -> None:
    run = run_job(transport, "auto", 3)
    agents = {a["agent"]: a for a in wait_trained(run, each=3)}
    assert sorted(agents) == ["pi-00", "pi-01", "pi-02"], agents
    assert {a["profile"] for a in agents.values()} == set(PROFILES)
    for a in agents.values():  # each one took part, not only the fastest
        assert a["updates_accepted"] >= 3, a
    for s in stop(run):
        assert_no_request_loop(s)


#: the private network's LoRaWAN copy: every uplink airtime / this, every downlink airtime
#: / LORA_DOWN_SCALE (duty cycles kept): the members' own uplinks take a fraction of what
#: the one gateway needs for the three of them, so the gateway sets the pace
LORA_SCALE = 2000.0
LORA_DOWN_SCALE = 50.0
#: versions the LoRaWAN members must reach (each waits for the gateway, member by member)
LORA_VERSIONS = 5


@pytest.mark.parametrize("transport", ["zmq", "mqtt"])
def test_three_lorawan_members_of_one_private_network_train_with_the_defaults(
    run_job: Any, transport: str, tmp_path: Path
) -> None:
    """Three agents on one private network's LoRaWAN EU868 SF7 profile (``--profile`` a
    file: a copy with every airtime / LORA_SCALE; the aggregator finds it in its
    CAT_EDGE_PROFILES_DIR), everything else the README's by-hand path at d = 47,236. The
    default pacing sends their downlinks through one gateway: what they received, on their
    own ledgers, kept its duty cycle (2 % over two sub-bands) over the run."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    name = "lorawan_eu868_dr5_sf7_private"
    profile = scaled_profile(name, f"{name}_fast", LORA_SCALE, downlink=LORA_DOWN_SCALE)
    path = profiles / f"{profile.name}.json"
    save_profile(profile, path)
    started = time.monotonic()
    run = run_job(transport, "auto", 3, [str(path)] * 3, {PROFILES_DIR_ENV: str(profiles)})
    agents = wait_trained(run, each=LORA_VERSIONS - 2, versions=LORA_VERSIONS)
    summaries = stop(run)
    elapsed_s = time.monotonic() - started
    assert {a["profile"] for a in agents} == {profile.name}
    received = [s["down"] for s in summaries]
    airtime_s = sum(float(r["airtime_s"]) for r in received)
    messages = sum(int(r["messages"]) for r in received)
    assert messages >= 3 * (LORA_VERSIONS - 2) and airtime_s > 0.0, received
    assert profile.duty_cycle is not None
    share = profile.duty_cycle * profile.duty_cycle_bands  # the gateway's, on this plan
    # one gateway, one message after another: at most its share of the run, plus the
    # interval the last few messages owe
    assert airtime_s / share <= elapsed_s + 3 * (airtime_s / messages) / share, (
        f"{airtime_s:.3f} s received in {elapsed_s:.1f} s: "
        f"{airtime_s / elapsed_s:.2%} of the time on a {share:.0%} gateway"
    )
    for s in summaries:
        assert_no_request_loop(s)
