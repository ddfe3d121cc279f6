"""What a restarted aggregator sends the fleet: its version's steps, not the whole model.

The checkpoint keeps the newest broadcasts (aggregator/engine/downlink/history.py), so a
restarted engine re-broadcasts its current version as that version's own steps. Before,
every restart sent every member a state snapshot: at d = 47,236 about 189 kB each, which on
a LoRaWAN member answered in RX2 (115 B a frame, 10 downlinks a day on The Things Network)
is months of its downlink.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import close_without_publishing, lockstep_rounds

from aggregator.engine.downlink.broadcast import DownlinkMode
from aggregator.engine.downlink.history import StepsHistory
from aggregator.engine.downlink.outbound import StepsParts
from aggregator.engine.rounds import RoundEngine
from aggregator.engine.types import EngineConfig
from aggregator.sim.harness import FleetHarness
from edge_agent.agent.loop import AgentConfig
from edge_agent.data.datagen import make_rcv1_like, split_shards
from edge_agent.links.catalog import load_profile
from edge_agent.numerics.models import make_model
from edge_agent.protocol import topics
from edge_agent.protocol.downlink import Steps, decode_downlink

D = 1500
N = 4


def _config(downlink: DownlinkMode) -> EngineConfig:
    return EngineConfig(job="rs", d=D, model="logreg", min_agents=N, feedback="ef21",
                        downlink=downlink, max_rounds=500)  # fmt: skip


def _fleet(eng: RoundEngine) -> FleetHarness:
    ds = make_rcv1_like(1600, D, rng=np.random.default_rng(0))
    shards = split_shards(ds, N, rng=np.random.default_rng(1))
    model = make_model("logreg", n_features=D, l2=1e-3)
    fleet = FleetHarness(eng)
    prof = load_profile("paper_payload_bits")
    for i, shard in enumerate(shards):
        cfg = AgentConfig(job="rs", agent_id=f"a{i}", compressor="signtopk", feedback="ef21",
                          resend_s=None, duty_cycle="ignore", seed=i)  # fmt: skip
        fleet.add_agent(cfg, model=model, data=shard, profile=prof)
    fleet.start()
    fleet.pump(strict=True)
    return fleet


_rounds = lockstep_rounds


@pytest.mark.parametrize("downlink", ["auto", "exact", "cat"])
def test_a_restart_before_the_publish_re_broadcasts_the_steps_and_the_run_stays_exact(
    downlink: DownlinkMode,
) -> None:
    """Version 13 is checkpointed and its broadcast never sent. The restarted engine sends
    the steps 12 -> 13 (a small fraction of a snapshot), every member applies them, and
    the run goes on bit for bit as one without a crash."""
    ref, live = RoundEngine(_config(downlink)), RoundEngine(_config(downlink))
    with _fleet(ref) as calm, _fleet(live) as fleet:
        _rounds(calm, 17)
        _rounds(fleet, 12)
        close_without_publishing(fleet)  # version 13 closes; its broadcast is never sent
        assert live.version == 13
        fleet.engine = restored = RoundEngine.restore(_config(downlink), live.export())
        again = restored.restart_message()
        steps = decode_downlink(again.payload)
        assert again.topic == topics.delta("rs") and not again.retain
        assert isinstance(steps, Steps) and (steps.base_version, steps.version) == (12, 13)
        snapshot = restored.snapshot_message()
        assert len(again.payload) * 10 < len(snapshot.payload), (len(again.payload), downlink)
        before = [a.ledger.down.bytes for a in fleet.agents]
        fleet.publish(again, restored.resync_message())
        fleet.deliver()
        for agent, had in zip(fleet.agents, before, strict=True):
            assert agent.version == 13 and agent.counters.snapshots == 1  # the first only
            assert agent.ledger.down.bytes - had < len(snapshot.payload) / 10
        fleet.clock.now += 1.0
        _rounds(fleet, 4)
        assert restored.version == ref.version == 17
        assert np.array_equal(restored.model.x, ref.model.x)  # the run without a crash
        for a, b in zip(fleet.agents, calm.agents, strict=True):
            assert a.x is not None and b.x is not None and np.array_equal(a.x, b.x)
            assert a.counters.snapshots == 1 and not a.counters.dropped


def test_a_restart_after_the_publish_costs_the_members_one_versions_steps() -> None:
    """Killed after the publish: the members hold the version already and drop the steps
    as old (nothing is applied twice); each receives them once, not the model."""
    live = RoundEngine(_config("auto"))
    with _fleet(live) as fleet:
        _rounds(fleet, 9)
        fleet.engine = restored = RoundEngine.restore(_config("auto"), live.export())
        again = restored.restart_message()
        assert isinstance(decode_downlink(again.payload), Steps)
        held = [a.x.copy() for a in fleet.agents if a.x is not None]
        fleet.publish(again)
        fleet.deliver()
        for agent, x in zip(fleet.agents, held, strict=True):
            assert agent.version == 9 and agent.x is not None and np.array_equal(agent.x, x)
        _rounds(fleet, 3)
        assert restored.version == 12
        assert all(a.version == 12 for a in fleet.agents)


def test_a_fresh_job_or_a_delta_job_starts_with_the_snapshot() -> None:
    """Nothing held to replay: the start-up broadcast is the retained state snapshot."""
    fresh = RoundEngine(_config("auto"))
    assert fresh.restart_message().topic == topics.model("rs")
    delta = RoundEngine(_config("delta"))
    with _fleet(delta) as fleet:
        _rounds(fleet, 3)
        restored = RoundEngine.restore(_config("delta"), delta.export())
        assert restored.restart_message().topic == topics.model("rs")


def _steps(base: int, size: int) -> StepsParts:
    return StepsParts("rs", D, base, base + 1, "ef21", (bytes(size),))


def test_the_checkpoint_keeps_the_newest_steps_within_its_budget() -> None:
    hist = StepsHistory("rs", D, window=8)
    for v in range(8):
        hist.append(_steps(v, 1000))
    rows = hist.export(budget_bytes=3500)
    assert [r[0] for r in rows] == [5, 6, 7]  # the newest three fit, oldest first
    assert [r[0] for r in hist.export(budget_bytes=10)] == [7]  # the newest always
    back = StepsHistory("rs", D, window=8)
    back.restore(rows)
    assert len(back) == 3 and back.catch_up(5, 8) is not None and back.catch_up(4, 8) is None
    latest = back.latest(8)
    assert latest is not None and latest.steps == _steps(7, 1000)
    assert back.latest(7) is None


def test_a_checkpoint_whose_history_does_not_chain_is_refused() -> None:
    hist = StepsHistory("rs", D)
    rows = [[0, 1, "ef21", []], [2, 3, "ef21", []]]  # 1 -> 2 is missing
    with pytest.raises(ValueError, match="does not chain"):
        hist.restore(rows)
    with pytest.raises(ValueError, match="unknown family"):
        hist.restore([[0, 1, "nope", []]])
