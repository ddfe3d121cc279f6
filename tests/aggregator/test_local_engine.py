"""Local training in the real engine and agents (LoCoDL, feedback ``local``), in process.

Every party replays the aggregator's LOCAL operations: the anchor, its ``v`` and each
member's control variate (the aggregator's mirror) hold the same bits on both sides; a
checkpoint taken mid-run continues exactly as the live engine; a member that rejoins fresh
keeps the anchors exact; an agent that is not a member once the job started is refused.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from helpers import close_without_publishing, lockstep_rounds

from aggregator.engine.admission import Reject, check_hello
from aggregator.engine.rounds import RoundEngine
from aggregator.engine.types import EngineConfig
from aggregator.sim.harness import FleetHarness
from edge_agent.agent.loop import Agent, AgentConfig
from edge_agent.data import Dataset
from edge_agent.data.datagen import make_rcv1_like, split_shards
from edge_agent.links.catalog import load_profile
from edge_agent.numerics.local import LocalConfig, round_steps
from edge_agent.numerics.models import Model, make_model
from edge_agent.protocol import jobinfo, messages

D = 1500
N = 4


def _problem() -> tuple[Dataset, list[Dataset], Model]:
    ds = make_rcv1_like(1600, D, rng=np.random.default_rng(0))
    shards = split_shards(ds, N, rng=np.random.default_rng(1))
    return ds, shards, make_model("logreg", n_features=D, l2=1e-3)


def _config(h: int = 5, batch: float | None = None, prob: float | None = None) -> EngineConfig:
    local = LocalConfig(local_steps=h, batch_size=batch, comm_prob=prob)
    return EngineConfig(job="lt", d=D, model="logreg", min_agents=N, feedback="local",
                        local=local, max_rounds=500, batch_size=batch)  # fmt: skip


def _fleet(
    eng: RoundEngine, h: int = 5, batch: float | None = None, prob: float | None = None
) -> FleetHarness:
    _, shards, model = _problem()
    fleet = FleetHarness(eng)
    prof = load_profile("paper_payload_bits")
    for i, shard in enumerate(shards):
        cfg = AgentConfig(job="lt", agent_id=f"a{i}", compressor="signtopk", resend_s=None,
                          local_steps=None if prob is not None else h, comm_prob=prob,
                          duty_cycle="ignore", batch_size=batch, seed=i)  # fmt: skip
        fleet.add_agent(cfg, model=model, data=shard, profile=prof)
    fleet.start()
    fleet.pump(strict=True)
    return fleet


_rounds = lockstep_rounds


def _exact(fleet: FleetHarness, eng: RoundEngine) -> None:
    hub = eng.model.local_hub
    assert hub is not None
    for agent in fleet.agents:
        assert agent.version == eng.version
        assert agent.x is not None and agent.replica.aggregate is not None
        assert np.array_equal(agent.x, eng.model.x)
        assert np.array_equal(agent.replica.aggregate, hub.v)
        assert agent.local is not None
        assert np.array_equal(agent.local.u, hub.u[agent.config.agent_id])
    # sum_i u_i + n v + 2 n c e = 0: the fixed point is the mean objective's optimum
    assert hub.gamma is not None
    c = hub.coefs(hub.gamma).c
    scale = max(1.0, float(np.abs(hub.v).max()) * hub.n)
    assert float(np.abs(hub.invariant(c)).max()) < 1e-9 * scale


def test_local_training_converges_with_exact_copies_and_compressed_messages() -> None:
    ds, _, model = _problem()
    eng = RoundEngine(_config())
    with _fleet(eng) as fleet:
        start = model.loss(eng.model.x, ds)
        _rounds(fleet, 40)
        _exact(fleet, eng)
        assert eng.version == 40
        loss = model.loss(eng.model.x, ds)
        assert loss < start - 0.05
        logs = [a.last_log for a in fleet.agents]
        assert all(log is not None and 0 < log.t < D for log in logs)  # CAT-compressed up
        t_down = eng.model.t_down
        assert t_down is not None and 0 < t_down < D  # and down
        # five local gradients per round and member after the first (empty) round
        assert all(a.local is not None and a.local.gradients == 5 * 39 for a in fleet.agents)


def test_minibatch_local_steps_make_whole_passes_with_exact_copies() -> None:
    """``--batch-size 0.25 --local-steps 8``: every round is two passes of 4 minibatches
    over each shard (random reshuffling); the copies stay exact and the loss falls."""
    ds, shards, model = _problem()
    eng = RoundEngine(_config(h=8, batch=0.25))
    assert eng.model.local_hub is not None
    with _fleet(eng, h=8, batch=0.25) as fleet:
        start = model.loss(eng.model.x, ds)
        _rounds(fleet, 30)
        _exact(fleet, eng)
        assert model.loss(eng.model.x, ds) < start - 0.05
        for agent, shard in zip(fleet.agents, shards, strict=True):
            local = agent.local
            assert local is not None and local.batches is not None
            assert local.gradients == 8 * 29  # the first round carries no change
            assert local.rows == 2 * 29 * shard.n_rows  # two whole passes a round
            assert agent.gradient_rows == local.rows


def test_a_checkpoint_continues_exactly_as_the_live_engine() -> None:
    live = RoundEngine(_config())
    with _fleet(live) as fleet:
        _rounds(fleet, 12)
        snap = live.export()
        restored = RoundEngine.restore(_config(), snap)
        assert np.array_equal(restored.model.x, live.model.x)
        # the same next updates go to both engines: the same next version, bit for bit
        fleet.step()
        pending = list(fleet.waiting())
        for msg in pending:
            live.handle(msg.topic, msg.payload, fleet.clock.now)
            restored.handle(msg.topic, msg.payload, fleet.clock.now)
        assert live.version == restored.version == 13
        assert np.array_equal(live.model.x, restored.model.x)
        a, b = live.model.local_hub, restored.model.local_hub
        assert a is not None and b is not None
        assert np.array_equal(a.v, b.v) and np.array_equal(a.e, b.e)
        assert all(np.array_equal(a.u[m], b.u[m]) for m in a.u)


def test_a_restart_between_checkpoint_and_publish_keeps_every_members_state_exact() -> None:
    """Regression (the SIGKILL test's ``zmq-local-auto`` case, about once in 20 CI runs):
    the aggregator checkpointed version 13 and died before publishing its steps. The
    restarted one publishes its retained snapshot of 13 to members still at 12; a member
    that loaded it would start again from the anchor and the run would leave the one
    without a crash. The members ask for the steps instead, which the checkpoint kept."""
    ref = RoundEngine(_config())
    live = RoundEngine(_config())
    with _fleet(ref) as calm, _fleet(live) as fleet:
        _rounds(calm, 17)
        _rounds(fleet, 12)
        close_without_publishing(fleet)  # version 13 closes; its broadcast is never sent
        assert live.version == 13
        fleet.engine = restored = RoundEngine.restore(_config(), live.export())
        fleet.publish(restored.snapshot_message(), restored.resync_message())
        fleet.deliver()
        for agent in fleet.agents:  # still at 12, asking for the steps 12 -> 13
            assert agent.version == 12 and agent.counters.dropped == {"snapshot_ahead": 1}
        fleet.clock.now += 1.0
        fleet.pump(strict=False)  # their requests (and resync's duplicates) are answered
        fleet.deliver()
        assert all(a.version == 13 and a.counters.snapshots == 1 for a in fleet.agents)
        fleet.clock.now += 1.0
        _rounds(fleet, 4)
        _exact(fleet, restored)
        assert restored.version == ref.version == 17
        assert np.array_equal(restored.model.x, ref.model.x)  # the run without a crash
        for a, b in zip(fleet.agents, calm.agents, strict=True):
            assert a.local is not None and b.local is not None
            assert np.array_equal(a.local.u, b.local.u)


def test_a_drawn_schedule_announces_each_rounds_steps_and_keeps_every_copy_exact() -> None:
    """``AGG_COMM_PROB``: each LOCAL operation announces the next round's drawn count (the
    job's stream, :func:`round_steps`), every member takes exactly that many local steps
    and the anchor as many drift steps, so every copy stays exact and the loss falls."""
    ds, _, model = _problem()
    eng = RoundEngine(_config(prob=0.25))
    with _fleet(eng, prob=0.25) as fleet:
        start = model.loss(eng.model.x, ds)
        _rounds(fleet, 30)
        _exact(fleet, eng)
        assert model.loss(eng.model.x, ds) < start - 0.05
        draws = [round_steps(0.25, zlib.crc32(b"lt"), j) for j in range(29)]
        assert len(set(draws)) > 2 and max(draws) > 4  # drawn, mean 4: not a fixed H
        # the first round carries no change; round r takes the count version r announced
        assert all(a.local is not None and a.local.gradients == sum(draws) for a in fleet.agents)
        hub = eng.model.local_hub
        assert hub is not None and hub.draws == 30
        assert hub.announced == round_steps(0.25, zlib.crc32(b"lt"), 29)


def test_a_checkpoint_continues_a_drawn_schedule_exactly() -> None:
    """The draws made and the count announced are checkpointed: a restored engine announces
    the same next count and closes the same next version, bit for bit."""
    live = RoundEngine(_config(prob=0.25))
    with _fleet(live, prob=0.25) as fleet:
        _rounds(fleet, 9)
        restored = RoundEngine.restore(_config(prob=0.25), live.export())
        a, b = live.model.local_hub, restored.model.local_hub
        assert a is not None and b is not None
        assert (a.draws, a.announced) == (b.draws, b.announced) == (9, a.announced)
        fleet.step()
        for msg in list(fleet.waiting()):
            live.handle(msg.topic, msg.payload, fleet.clock.now)
            restored.handle(msg.topic, msg.payload, fleet.clock.now)
        assert live.version == restored.version == 10
        assert np.array_equal(live.model.x, restored.model.x)
        assert np.array_equal(a.v, b.v) and np.array_equal(a.e, b.e)
        assert (a.draws, a.announced) == (b.draws, b.announced)


def test_a_member_that_rejoins_fresh_keeps_every_copy_exact() -> None:
    eng = RoundEngine(_config())
    with _fleet(eng) as fleet:
        _rounds(fleet, 8)
        agent = fleet.agents[1]
        agent._reset_state()  # as after a restart: fresh hello, u_i = 0
        fleet.pump(strict=True)
        _rounds(fleet, 6)
        _exact(fleet, eng)
        assert agent.counters.resets == 1


def _late(fleet: FleetHarness, agent_id: str) -> Agent:
    _, shards, model = _problem()
    cfg = AgentConfig(job="lt", agent_id=agent_id, compressor="signtopk", resend_s=None,
                      local_steps=5, duty_cycle="ignore")  # fmt: skip
    agent = fleet.add_agent(
        cfg, model=model, data=shards[0], profile=load_profile("paper_payload_bits")
    )
    agent.start()
    fleet.pump(strict=True)
    return agent


def test_a_newcomer_joins_and_the_sum_of_control_variates_stays_zero() -> None:
    eng = RoundEngine(_config(h=5))
    with _fleet(eng) as fleet:
        _rounds(fleet, 6)
        late = _late(fleet, "late")
        _rounds(fleet, 8)
        _exact(fleet, eng)
        hub = eng.model.local_hub
        assert hub is not None and sorted(hub.u) == ["a0", "a1", "a2", "a3", "late"]
        assert late.local is not None and late.local.member


def test_a_silent_member_leaves_and_rejoins() -> None:
    cfg = _config()
    cfg = EngineConfig(**{**cfg.__dict__, "participation_window": 3, "round_deadline_s": 1.5,
                          "quorum_min_agents": 1})  # fmt: skip
    eng = RoundEngine(cfg)
    with _fleet(eng) as fleet:
        _rounds(fleet, 4)
        quiet = fleet.agents.pop()  # it hears nothing and sends nothing for a while
        _rounds(fleet, 6)
        hub = eng.model.local_hub
        assert hub is not None and quiet.config.agent_id not in hub.u
        fleet.agents.insert(0, quiet)  # first: a sync round does not wait for it
        # it catches up (told it left), starts again and joins; its first update answers
        # an old version (stale: it gets the model), so the pump is not strict
        _rounds(fleet, 6, strict=False)
        _exact(fleet, eng)
        assert quiet.config.agent_id in hub.u


def test_job_settings_name_the_local_steps() -> None:
    fit = jobinfo.conflict(
        jobinfo.JobInfo(
            job="lt",
            d=D,
            model="logreg",
            feedback="local",
            family="local",
            compressors=("signtopk",),
            local_steps=5,
        ),
        job="lt",
        d=D,
        model="logreg",
        semantics="local",
        compressor="signtopk",
        local_steps=3,
    )
    assert fit is not None and "--local-steps 5" in fit


@pytest.mark.parametrize(
    ("job", "agent", "fix"),
    [
        ((None, 0.2), (5, None), "--comm-prob 0.2"),
        ((None, 0.2), (None, 0.25), "--comm-prob 0.2"),
        ((5, None), (None, 0.2), "--local-steps 5"),
        ((None, 0.2), (None, None), "--comm-prob 0.2"),
    ],
)
def test_a_hello_with_another_schedule_is_refused_naming_the_jobs(
    job: tuple[int | None, float | None], agent: tuple[int | None, float | None], fix: str
) -> None:
    """A drawn schedule and a fixed one do not mix: the agent's hello is refused
    ``wrong_local_steps`` (fatal for the agent) with the flag the job needs."""
    hello = messages.Hello(job="lt", agent="a0", d=D, rows=10, smoothness=1.0,
                           model="logreg", compressor="signtopk", semantics="local",
                           local_steps=agent[0], comm_prob=agent[1])  # fmt: skip
    with pytest.raises(Reject) as err:
        check_hello(messages.dump(hello), agent="a0", job="lt", d=D, model="logreg",
                    family="local", alone=False, feedback="local",
                    local_steps=job[0], comm_prob=job[1])  # fmt: skip
    assert err.value.reason == "wrong_local_steps" and fix in err.value.detail
    assert "wrong_local_steps" in messages.REFUSAL_FATAL


@pytest.mark.parametrize("bad", [{"feedback": "local"}, {"local": LocalConfig(local_steps=5)}])
def test_feedback_local_and_its_configuration_go_together(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="go together"):
        EngineConfig(job="lt", d=D, model="logreg", **bad)  # type: ignore[arg-type]
