"""Restart: what a restarted aggregator sends its fleet, and what keeping the broadcasts
costs the checkpoint, each against its baseline in the same run.

    python benchmarks/restart.py [--quick] [--agents 10] [--versions 20]

A real :class:`aggregator.engine.rounds.RoundEngine` and ``--agents`` real agents
(:class:`aggregator.sim.harness.FleetHarness`) train l2-logistic regression on an RCV1-like
set (d = 47,236, 10,000 rows; ``--quick``: 2,000 rows, d = 20,000) with sign-top-T updates
and EF21, on the mixed fleet's profiles (LoRaWAN SF7, SF12 answered in RX2, BLE 5, NB-IoT),
for ``--versions`` versions; then, per downlink mode (``auto``, the service's default, and
``exact``), one JSON line:

* ``restart_bytes``: :meth:`RoundEngine.restart_message`, the version's own steps (what the
  service publishes when it starts from this checkpoint); ``snapshot_bytes``: the state
  snapshot it published before (the baseline); ``ratio`` = snapshot / restart.
* ``sf12_rx2_frames_*``: what each costs an SF12 member answered in RX2 (115 B a frame),
  and ``ttn_days_*`` at The Things Network's 10 downlinks a day.
* ``checkpoint_bytes_with`` / ``_without``: the encoded checkpoint with the broadcasts it
  now keeps and without them (the baseline); ``encode_ratio``: the time to encode it with
  them over without (best of ``--repeats``, interleaved).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
from _common import emit, environment, parser

from aggregator.engine.downlink.broadcast import DownlinkMode
from aggregator.engine.rounds import RoundEngine
from aggregator.engine.types import EngineConfig, EngineSnapshot
from aggregator.service.store import encode_checkpoint
from aggregator.sim.harness import FleetHarness
from edge_agent.agent.loop import AgentConfig
from edge_agent.data.datagen import make_rcv1_like, split_shards
from edge_agent.links.catalog import load_profile
from edge_agent.numerics.models import make_model
from edge_agent.protocol import topics

PROFILES = (
    "lorawan_eu868_dr5_sf7",
    "lorawan_eu868_dr0_sf12_rx2",
    "ble5_2m_dle_notify",
    "nbiot_udp_psm_rai",
)
SF12 = "lorawan_eu868_dr0_sf12_rx2"


def trained(mode: DownlinkMode, rows: int, d: int, agents: int, versions: int) -> RoundEngine:
    """An engine ``versions`` versions into an EF21 job of ``agents`` agents."""
    ds = make_rcv1_like(rows, d, rng=np.random.default_rng(0))
    shards = split_shards(ds, agents, rng=np.random.default_rng(1))
    model = make_model("logreg", n_features=d, l2=1e-3)
    eng = RoundEngine(EngineConfig(job="rs", d=d, model="logreg", min_agents=agents,
                                   feedback="ef21", downlink=mode, max_rounds=10_000))  # fmt: skip
    with FleetHarness(eng) as fleet:
        for i, shard in enumerate(shards):
            cfg = AgentConfig(job="rs", agent_id=f"a{i}", compressor="signtopk", feedback="ef21",
                              resend_s=None, duty_cycle="ignore", seed=i)  # fmt: skip
            fleet.add_agent(cfg, model=model, data=shard,
                            profile=load_profile(PROFILES[i % len(PROFILES)]))  # fmt: skip
        fleet.start()
        fleet.pump()
        for _ in range(versions):
            fleet.deliver()
            fleet.step()
            fleet.pump(tick=False)
            fleet.clock.now += 1e7  # every link is free again: no pacing holds a version
            fleet.pump()
    return eng


def without_history(snap: EngineSnapshot) -> EngineSnapshot:
    """The same checkpoint without the broadcasts it keeps (the baseline)."""
    down = {k: v for k, v in snap.meta["downlink"].items() if k != "history"}
    return replace(snap, meta={**snap.meta, "downlink": down})


def encode_s(snap: EngineSnapshot) -> float:
    start = time.perf_counter()
    encode_checkpoint(snap, 0)
    return time.perf_counter() - start


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--agents", type=int, default=10)
    p.add_argument("--versions", type=int, default=20)
    p.add_argument("--repeats", type=int, default=None, help="encodings per checkpoint")
    args = p.parse_args()
    rows, d = (2_000, 20_000) if args.quick else (10_000, 47_236)
    repeats = args.repeats or (3 if args.quick else 9)
    emit("restart", {"case": "environment", **environment()})
    sf12 = load_profile(SF12)
    cap = sf12.max_downlinks_per_day or 10
    modes: tuple[DownlinkMode, ...] = ("auto", "exact")
    for mode in modes:
        eng = trained(mode, rows, d, args.agents, args.versions)
        again, snapshot = eng.restart_message(), eng.snapshot_message()
        frames = [sf12.receive_cost(len(m.payload), job_wide=True).packets
                  for m in (again, snapshot)]  # fmt: skip
        snap = eng.export()
        bare = without_history(snap)
        with_s, without_s = [], []
        for _ in range(repeats):  # interleaved, so both see the same machine
            with_s.append(encode_s(snap))
            without_s.append(encode_s(bare))
        emit(
            "restart",
            {
                "case": "restart",
                "downlink": mode,
                "d": d,
                "agents": args.agents,
                "version": eng.version,
                "restart_kind": "steps" if again.topic == topics.delta("rs") else "snapshot",
                "restart_bytes": len(again.payload),
                "snapshot_bytes": len(snapshot.payload),
                "ratio": len(snapshot.payload) / len(again.payload),
                "sf12_rx2_frames_restart": frames[0],
                "sf12_rx2_frames_snapshot": frames[1],
                "ttn_days_restart": frames[0] / cap,
                "ttn_days_snapshot": frames[1] / cap,
                "history_versions": len(snap.meta["downlink"]["history"]),
                "checkpoint_bytes_with": len(encode_checkpoint(snap, 0)),
                "checkpoint_bytes_without": len(encode_checkpoint(bare, 0)),
                "encode_ratio": min(with_s) / min(without_s),
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
