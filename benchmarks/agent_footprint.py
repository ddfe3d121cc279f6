"""Agent footprint: peak RSS of a real `edge-agent run` process and its time per round.

The agent trains on a 2,000-row RCV1-like shard (d = 47,236) against a test peer playing
the aggregator over ZeroMQ on 127.0.0.1. Baselines measured in the same run: the peak RSS
of a bare `python -c "import numpy"` process, and the agent's own gradient time (the target
is selection + compression + encoding <= gradient time, peak RSS <= 60 MB; the goal is 50).

    python benchmarks/agent_footprint.py [--rounds 200] [--rows 2000]

Prints the baseline, one line of the VmHWM after each start-up import step (`"stage":
"imports"`), then one JSON line per policy/profile case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from aggregator.localnet import free_port_pair
from edge_agent.data import make_rcv1_like, write_libsvm
from edge_agent.protocol import topics, wire
from edge_agent.transports import open_transport

JOB = "bench"


def bare_numpy_rss_mb() -> float:
    code = (
        "import numpy, pathlib\n"
        "print(next(int(l.split()[1]) / 1024 for l in pathlib.Path('/proc/self/status').read_text().splitlines() if l.startswith('VmHWM:')))"
    )
    return float(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
    )


#: What a fresh process imports, step by step, before `edge-agent run` reads its data: the
#: CLI, the ZeroMQ transport, the agent loop (with the wire format, the numerics, the
#: messages and the job settings), then its first profile parse.
IMPORT_STEPS: tuple[tuple[str, str], ...] = (
    ("numpy", "import numpy"),
    ("cli", "import edge_agent.cli.commands"),
    ("zmq_transport", "import edge_agent.transports.zmq"),
    ("agent_loop", "import edge_agent.agent.loop, edge_agent.data"),
    ("profile_parsed", "edge_agent.links.profiles.resolve_profile('lorawan_eu868_dr5_sf7')"),
)


def import_steps_mb() -> dict[str, float]:
    """VmHWM (MB) of one fresh interpreter after each of IMPORT_STEPS, in order."""
    code = "import json, pathlib\nout = {}\n"
    for name, stmt in IMPORT_STEPS:
        code += (
            f"{stmt}\nout[{name!r}] = round(next(int(l.split()[1]) / 1024 for l in "
            "pathlib.Path('/proc/self/status').read_text().splitlines() "
            "if l.startswith('VmHWM:')), 1)\n"
        )
    code += "print(json.dumps(out))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    steps: dict[str, float] = json.loads(out.stdout)
    return steps


def peer_loop(url: str, d: int, rounds: int, stop: threading.Event) -> None:
    t = open_transport(url, role="aggregator", client_id="peer")
    t.connect()
    for p in topics.agent_inbound(JOB):
        t.subscribe(p)
    x = np.zeros(d)
    version = 0
    t.publish(topics.model(JOB), wire.encode_snapshot(x, job=JOB, version=0))
    lipschitz = 0.3
    try:
        while not stop.is_set():
            m = t.recv(timeout_s=0.1)
            if m is None:
                continue
            kind = topics.parse(m.topic).kind
            if kind == "request":
                t.publish(topics.model(JOB), wire.encode_snapshot(x, job=JOB, version=version))
            elif kind == "update":
                header, u = wire.decode(m.payload)
                if header.round != version:
                    continue
                new = x.copy()
                u.add_to(new, -1.0 / lipschitz)
                idx = np.flatnonzero(new != x)
                t.publish(
                    topics.delta(JOB),
                    wire.encode_delta(
                        idx, new[idx], job=JOB, base_version=version, version=version + 1, d=d
                    ),
                )
                x, version = new, version + 1
    finally:
        t.close()


def run_case(
    shard: Path, d: int, rounds: int, profile: str, policy: str, compressor: str
) -> dict[str, object]:
    url = f"zmq+tcp://127.0.0.1:{free_port_pair()}"
    stop = threading.Event()
    th = threading.Thread(target=peer_loop, args=(url, d, rounds, stop), daemon=True)
    th.start()
    cmd = [
        sys.executable,
        "-m",
        "edge_agent.cli",
        "--log-level",
        "WARNING",
        "run",
        "--server",
        url,
        "--job",
        JOB,
        "--agent-id",
        "bench-01",
        "--profile",
        profile,
        "--data",
        str(shard),
        "--features",
        str(d),
        "--duty-cycle",
        "ignore",
        "--max-rounds",
        str(rounds),
        "--policy",
        policy,
        "--compressor",
        compressor,
        "--quiet",
    ]
    t0 = time.perf_counter()
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    wall = time.perf_counter() - t0
    stop.set()
    th.join(timeout=10)
    if out.returncode != 0:
        raise SystemExit(f"agent failed ({out.returncode}): {out.stderr[-2000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    tim = summary["timings_s"]
    n = max(1, int(summary["updates"]))
    per_round_ms = {k: 1e3 * v / n for k, v in tim.items()}
    overhead = tim["select"] + tim["compress"] + tim["encode"]
    return {
        "benchmark": "agent_footprint",
        "profile": profile,
        "policy": policy,
        "compressor": compressor,
        "rounds": summary["updates"],
        "peak_rss_mb": round(summary["peak_rss_mb"], 1),
        "per_round_ms": {k: round(v, 3) for k, v in per_round_ms.items()},
        "select_compress_encode_over_grad": round(overhead / max(tim["grad"], 1e-12), 3),
        "wall_s": round(wall, 2),
        "bytes_sent": summary["size_bytes"],
        "target_rss_ok": summary["peak_rss_mb"] <= 60.0,
        "target_time_ok": overhead <= tim["grad"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--features", type=int, default=47236)
    ap.add_argument("--quick", action="store_true", help="30 rounds, one case")
    args = ap.parse_args()
    rounds = 30 if args.quick else args.rounds
    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "shard.svm"
        write_libsvm(make_rcv1_like(args.rows, args.features, rng=np.random.default_rng(0)), shard)
        baseline = bare_numpy_rss_mb()
        print(
            json.dumps(
                {
                    "benchmark": "agent_footprint",
                    "baseline": "python -c 'import numpy'",
                    "peak_rss_mb": round(baseline, 1),
                }
            )
        )
        print(
            json.dumps(
                {
                    "benchmark": "agent_footprint",
                    "stage": "imports",
                    "peak_rss_mb_after": import_steps_mb(),
                }
            )
        )
        cases = [("lorawan_eu868_dr5_sf7", "cat", "topk")]
        if not args.quick:
            cases += [
                ("nbiot_udp_psm_rai", "cat", "signtopk"),
                ("wifi_rpi4_mqtt_tls13", "cat", "topk"),
                ("lorawan_eu868_dr5_sf7", "hybrid:50", "topk"),
                ("lorawan_eu868_dr5_sf7", "cat", "randk"),
            ]
        for profile, policy, compressor in cases:
            row = run_case(shard, args.features, rounds, profile, policy, compressor)
            row["rss_over_bare_numpy"] = round(float(row["peak_rss_mb"]) / baseline, 2)  # type: ignore[arg-type]
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
