"""The aggregator is SIGKILLed mid-run and restarted on the same data dir and ports.

What a restart guarantees (docs/http-api.md, "Durability"): every state-changing input is
journaled, and every committed version is in the journal (and, every
``AGG_CHECKPOINT_EVERY`` versions, a checkpoint) *before* anything about it is published.
So every version an agent (or ``/history``, written after the checkpoint) ever saw survives
the crash; a version the engine had committed in memory but not yet persisted may be lost
and is then recomputed from the same inputs. What was only in flight (queued in the dead
process, in the transport) is lost and comes back through the agents' re-sends.

Checked here, with the agents left running throughout (re-send after 2 s of silence):

* ``/status.recovered_from`` names the checkpoint and the version is at least the last one
  ``/history`` showed before the kill;
* ``/history`` holds versions 1..N exactly once, and every round has all three agents, one
  update each (a re-sent update applied twice would show as two, or shift the model);
* the loss after every version equals that of a crash-free reference run (the same agents
  and engine in-process over ``memory://``), so no update was lost or applied twice;
* ``/model`` equals every agent's copy bit for bit, and every agent exits 0, finished.

The checkpoint is written every 5 versions, so recovery replays committed rounds from the
journal, not only the open one. ZeroMQ (no broker that could hide a lost message) for both
semantics, and MQTT for plain.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from e2e_helpers import (
    AGENT_IDS,
    AggregatorProcess,
    Fleet,
    aggregator_settings,
    assert_models_identical,
    make_problem,
    reference_run,
    running,
    server_url,
    versions,
    wait_finished,
    wait_until,
)

from aggregator.engine.downlink.broadcast import DownlinkMode
from aggregator.engine.rounds import EngineConfig, RoundEngine
from edge_agent.agent.loop import FeedbackName
from edge_agent.numerics.compressors import compress
from edge_agent.protocol import messages, topics, wire
from edge_agent.protocol.downlink import StateSnapshot, Steps, decode_downlink

pytestmark = pytest.mark.integration

ROUNDS = 120  # AGG_MAX_ROUNDS: the job's end
KILL_AT = 30  # SIGKILL once /status shows this version


@pytest.mark.parametrize(
    ("transport", "feedback", "downlink"),
    [
        ("zmq", "none", "auto"),
        ("zmq", "ef21", "auto"),
        ("mqtt", "none", "auto"),
        ("zmq", "none", "exact"),
        ("zmq", "ef21", "exact"),
        ("zmq", "local", "auto"),
    ],
)
def test_aggregator_recovers_from_sigkill_and_the_agents_carry_on(
    transport: str,
    feedback: FeedbackName | Literal["local"],
    downlink: DownlinkMode,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    """The default downlink (auto), the exact relay and local training
    (``AGG_LOCAL_STEPS=5``): the checkpoint keeps the broadcast state (the broadcast model,
    the open version's operations, the newest steps), the restart re-broadcasts its version
    as steps, so every run must equal one without a crash bit for bit."""
    local = feedback == "local"
    agent_feedback: FeedbackName = "none" if feedback == "local" else feedback
    job_settings = {"local_steps": 5} if local else {"feedback": feedback}
    started = time.monotonic()
    problem = make_problem(tmp_path / "data")
    url = server_url(transport, request)
    agg = AggregatorProcess(
        tmp_path,
        aggregator_settings(
            problem,
            job="crash",
            server=url,
            data_dir=tmp_path / "agg",
            max_rounds=ROUNDS,
            checkpoint_every=5,
            downlink=downlink,
            **job_settings,  # AGG_FEEDBACK (the job runs its agents' family) or local steps
        ),
    )
    fleet = Fleet(tmp_path)
    with running(agg, fleet):
        agg.start()
        extra = ["--local-steps", "5", "--compressor", "signtopk"] if local else []
        fleet.start_all(problem, server=url, job="crash", feedback=agent_feedback, resend_s=2,
                        extra=extra)  # fmt: skip
        wait_until(
            lambda: agg.status()["round"] >= KILL_AT,
            30,
            f"version {KILL_AT}",
            poll_s=0.01,
            diagnose=lambda: agg.diagnose() + "\n" + fleet.diagnose(),
        )
        durable = versions(agg.history())[-1]  # history rows are written after the checkpoint
        agg.kill()
        agg.start()  # same data dir, same transport and HTTP ports

        status = agg.status()
        assert status["recovered_from"] in ("checkpoint.npz", "checkpoint.prev.npz")
        assert status["model_version"] >= durable >= KILL_AT - 1
        restarted = status["model_version"]
        assert status["agents"] == 3 and status["state"] == "running"

        status = wait_finished(agg, fleet, timeout_s=40)
        fleet.wait(timeout_s=15)
        assert status["finish_reason"] == f"reached max_rounds={ROUNDS}"
        assert status["round"] == ROUNDS

        # --- history: 1..N once each, all three agents with one update each in every round
        rows = agg.history()
        assert versions(rows) == list(range(1, ROUNDS + 1))
        for row in rows:
            assert row["base_version"] == row["version"] - 1
            assert row["participants"] == list(AGENT_IDS), row
            assert {a: row["agents"][a]["updates"] for a in AGENT_IDS} == dict.fromkeys(
                AGENT_IDS, 1
            ), row
        assert status["updates_accepted"] == 3 * ROUNDS
        metrics = agg.metrics()
        assert metrics["cat_rounds_total"] == ROUNDS
        assert metrics["cat_updates_accepted_total"] == 3 * ROUNDS
        # re-sent updates are expected and must have been dropped, never applied
        assert metrics['cat_updates_rejected_total{reason="duplicate"}'] >= 0
        assert metrics['cat_updates_rejected_total{reason="internal_error"}'] == 0
        # the restarted aggregator re-broadcast its version as that version's steps, which
        # the checkpoint (and the journal after it) kept: no agent received the whole model
        # but in the periodic retained snapshots (every 50th version over MQTT; none over
        # ZeroMQ, which retains nothing, nor with local training) and, in an EF21 job under
        # auto, the last version's resync (a state snapshot, as in the run without a crash),
        # neither job-wide nor addressed
        retained = transport == "mqtt" and not local
        periodic = sum(v % 50 == 0 for v in range(restarted + 1, ROUNDS + 1)) if retained else 0
        periodic += feedback == "ef21" and downlink == "auto"
        published = {k: v for k, v in metrics.items() if k.startswith("cat_published_messages")}
        assert published['cat_published_messages_total{kind="snapshot"}'] == periodic, published
        assert published.get('cat_published_messages_total{kind="agent_snapshot"}', 0) == 0

        # --- every agent holds the final model, bit for bit, and finished cleanly
        x = assert_models_identical(agg, fleet)
        # --- the same trajectory as without a crash
        ref_losses, ref_x = reference_run(problem, job="crash", feedback=agent_feedback,
                                          rounds=ROUNDS, local_steps=5 if local else None,
                                          downlink=downlink)  # fmt: skip
        np.testing.assert_allclose([r["loss"] for r in rows], ref_losses, rtol=1e-9, atol=0)
        np.testing.assert_allclose(x, ref_x, rtol=1e-9, atol=1e-12)
        for a in fleet.agents:
            assert a.proc.returncode == 0, a.diagnose()
            summary = a.summary()
            assert summary["finished"] is True and summary["version"] == ROUNDS, summary
    assert time.monotonic() - started < 60, "the crash test took longer than 60 s"


def test_a_resent_update_for_a_version_the_agent_missed_gets_the_model_back() -> None:
    """Regression (found by the test above over ZeroMQ, about every other run): the engine
    recovered a version that was persisted but not yet published, and ZeroMQ dropped the
    start-up snapshot before the agents re-subscribed. The agents, still at the previous
    version, re-sent their (already applied) updates, which were dropped as duplicates
    without an answer: a livelock. Such a duplicate now brings back the model: the steps
    the checkpoint kept, or the snapshot from a checkpoint without them."""
    job, d = "crash", 8
    cfg = EngineConfig(job=job, d=d, step_size=0.5, min_agents=2)
    live = RoundEngine(cfg)
    g = np.linspace(-1.0, 1.0, d)
    sent: dict[str, bytes] = {}
    for agent in ("a", "b"):
        hello = messages.Hello(
            job=job, agent=agent, d=d, rows=1, smoothness=1.0, model="logreg", compressor="topk"
        )
        assert live.handle(topics.hello(job, agent), messages.dump(hello), 0.0).reason is None
        sent[agent] = wire.encode(compress(g, "topk", 3), job=job, agent=agent, round=0, seq=0)
    for agent, blob in sent.items():
        eff = live.handle(topics.update(job, agent), blob, 1.0)
    assert eff.committed is not None and eff.committed.version == 1
    # the crash: version 1 is persisted (a checkpoint here), its delta was never published
    saved = live.export()
    engine = RoundEngine.restore(cfg, saved)

    eff = engine.handle(topics.update(job, "a"), sent["a"], 2.0)  # a's re-send, round 0

    assert eff.reason == "duplicate" and eff.committed is None
    # the answer goes to a alone (cat/<job>/to/a), not to the whole job: the steps 0 -> 1,
    # which the checkpoint kept
    answers = [o for o in eff.outbound if o.topic == topics.to_agent(job, "a")]
    assert len(answers) == 1 and all(o.target == "a" for o in eff.outbound)
    steps = decode_downlink(answers[0].payload)
    assert isinstance(steps, Steps) and (steps.base_version, steps.version) == (0, 1)
    assert engine.version == 1 and engine.rejected["duplicate"] == 1  # nothing applied
    # from a checkpoint without those steps (one written before they were kept): the snapshot
    saved.meta["downlink"].pop("history")
    engine = RoundEngine.restore(cfg, saved)
    eff = engine.handle(topics.update(job, "a"), sent["a"], 2.0)
    snap = decode_downlink(eff.outbound[0].payload)
    assert isinstance(snap, StateSnapshot) and snap.version == 1
    assert snap.x.tobytes() == engine.x.tobytes()
