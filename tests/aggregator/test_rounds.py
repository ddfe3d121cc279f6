"""RoundEngine driven directly with encoded messages: one behaviour per test."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.engine.downlink.outbound import Outbound
from aggregator.engine.rounds import EngineConfig, RoundEngine
from edge_agent.agent.replica import Replica
from edge_agent.numerics.compressors import Update, compress
from edge_agent.protocol import messages, topics, wire
from edge_agent.protocol.downlink import StateSnapshot, Steps, decode_downlink

JOB = "job1"
D = 16
GAMMA = 0.5


def make_engine(**overrides: Any) -> RoundEngine:
    cfg: dict[str, Any] = {"job": JOB, "d": D, "step_size": GAMMA, "round_deadline_s": 10.0}
    cfg.update(overrides)
    return RoundEngine(EngineConfig(**cfg))


def hello(agent: str, **fields: Any) -> tuple[str, bytes]:
    base: dict[str, Any] = {
        "job": JOB,
        "agent": agent,
        "d": D,
        "rows": 10,
        "smoothness": 2.0,
        "model": "logreg",
        "compressor": "topk",
    }
    base.update(fields)
    return topics.hello(JOB, agent), messages.dump(messages.Hello(**base))


def dense_update(values: list[float] | np.ndarray, semantics: str = "plain") -> Update:
    vals = np.asarray(values, dtype=np.float32)
    return Update("dense", vals.size, None, vals, semantics=semantics)  # type: ignore[arg-type]


def topk_update(g: np.ndarray, t: int, semantics: str = "plain") -> Update:
    u = compress(g, "topk", t)
    return Update(u.compressor, u.d, u.indices, u.values, semantics=semantics)  # type: ignore[arg-type]


def upd(
    agent: str, u: Update, *, round: int = 0, seq: int = 0, job: str = JOB
) -> tuple[str, bytes]:
    return topics.update(JOB, agent), wire.encode(u, job=job, agent=agent, round=round, seq=seq)


def join(engine: RoundEngine, *agents: str, now: float = 0.0, **fields: Any) -> None:
    for a in agents:
        eff = engine.handle(*hello(a, **fields), now)
        assert eff.reason is None


def find(out: tuple[Outbound, ...], topic: str) -> Outbound:
    matches = [o for o in out if o.topic == topic]
    assert len(matches) == 1, [o.topic for o in out]
    return matches[0]


RNG = np.random.default_rng(7)
G_A = RNG.normal(size=D)
G_B = RNG.normal(size=D)


# ---------------------------------------------------------------- sync rounds


def test_round_closes_when_all_live_agents_reported_with_mean_step() -> None:
    eng = make_engine()
    join(eng, "a", "b")
    ua, ub = topk_update(G_A, 5), topk_update(G_B, 7)
    x0 = eng.x.copy()
    assert eng.handle(*upd("a", ua), 1.0).committed is None
    eff = eng.handle(*upd("b", ub), 2.0)
    assert eff.committed is not None
    expected = x0 - GAMMA * (ua.to_dense() + ub.to_dense()) / 2
    np.testing.assert_allclose(eng.x, expected, rtol=0, atol=1e-15)
    assert eng.version == 1
    assert eff.committed.participants == ("a", "b")
    assert eff.committed.reason == "all_reported"


def test_round_stays_open_until_every_live_agent_reported() -> None:
    eng = make_engine()
    join(eng, "a", "b")
    eff = eng.handle(*upd("a", topk_update(G_A, 5)), 1.0)
    assert eff.committed is None
    assert eng.version == 0


def test_deadline_closes_round_when_quorum_met() -> None:
    eng = make_engine(quorum_fraction=0.5, round_deadline_s=10.0)
    join(eng, "a", "b", "c")  # quorum = ceil(0.5 * 3) = 2
    eng.handle(*upd("a", topk_update(G_A, 3)), 1.0)
    eng.handle(*upd("b", topk_update(G_B, 3)), 2.0)
    assert eng.tick(9.0).committed is None
    eff = eng.tick(10.0)
    assert eff.committed is not None
    assert eff.committed.reason == "deadline"
    assert eff.committed.participants == ("a", "b")


def test_deadline_without_quorum_keeps_round_open() -> None:
    eng = make_engine(quorum_fraction=1.0, round_deadline_s=10.0, liveness_timeout_s=1000.0)
    join(eng, "a", "b", "c")
    eng.handle(*upd("a", topk_update(G_A, 3)), 1.0)
    assert eng.tick(100.0).committed is None
    assert eng.version == 0


def test_round_zero_waits_for_min_agents() -> None:
    eng = make_engine(min_agents=2)
    join(eng, "a")
    eff = eng.handle(*upd("a", topk_update(G_A, 3)), 1.0)
    assert eff.committed is None
    assert eng.state == "waiting"


def test_dead_agent_is_not_waited_for() -> None:
    eng = make_engine(liveness_timeout_s=5.0)
    join(eng, "a", now=0.0)
    join(eng, "b", now=4.0)
    eng.handle(*upd("b", topk_update(G_B, 3)), 4.0)
    eff = eng.tick(6.0)  # a silent for 6 s > 5 s: dead; b is the only live agent
    assert eng.agents["a"].live is False
    assert eff.committed is not None


def test_offline_status_marks_agent_dead() -> None:
    eng = make_engine()
    join(eng, "a")
    payload = messages.dump(messages.Status(state="offline", agent="a"))
    eng.handle(topics.status(JOB, "a"), payload, 1.0)
    assert eng.agents["a"].live is False


def test_duplicate_update_is_dropped_and_counted() -> None:
    eng = make_engine()
    join(eng, "a", "b")
    msg = upd("a", topk_update(G_A, 5), seq=3)
    assert eng.handle(*msg, 1.0).reason is None
    assert eng.handle(*msg, 1.5).reason == "duplicate"
    assert eng.rejected["duplicate"] == 1
    assert eng.accepted == 1


def test_second_plain_update_for_same_round_is_a_duplicate() -> None:
    eng = make_engine()
    join(eng, "a", "b")
    eng.handle(*upd("a", topk_update(G_A, 5), seq=0), 1.0)
    assert eng.handle(*upd("a", topk_update(G_B, 5), seq=1), 1.0).reason == "duplicate"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        pytest.param(upd("a", dense_update(np.ones(D + 1))), "wrong_d", id="wrong_d"),
        pytest.param(upd("zed", topk_update(G_A, 3)), "unknown_agent", id="unknown_agent"),
        pytest.param((topics.update(JOB, "a"), b"\x00garbage"), "malformed", id="garbage"),
        pytest.param(
            upd("a", topk_update(G_A, 3), job="other"), "wrong_job", id="wrong_job_in_header"
        ),
        pytest.param(
            (topics.update("other", "a"), upd("a", topk_update(G_A, 3))[1]),
            "wrong_job",
            id="wrong_job_topic",
        ),
        pytest.param(
            (topics.update(JOB, "b"), upd("a", topk_update(G_A, 3))[1]),
            "agent_mismatch",
            id="spoof",
        ),
        pytest.param(upd("a", dense_update(np.ones(D))), "wrong_compressor", id="wrong_compressor"),
        pytest.param(upd("a", topk_update(G_A, 3), round=5), "future_version", id="future"),
        pytest.param(("cat/job1/nonsense", b"{}"), "unexpected_topic", id="bad_topic"),
        pytest.param((topics.hello(JOB, "c"), b"{not json"), "malformed", id="bad_hello"),
        pytest.param(hello("c", d=D + 1), "wrong_d", id="hello_wrong_d"),
        pytest.param(hello("c", model="lsq"), "wrong_model", id="hello_wrong_model"),
        pytest.param(hello("c", semantics="ef21"), "wrong_semantics", id="hello_mixed_semantics"),
    ],
)
def test_bad_message_is_counted_and_leaves_model_unchanged(
    message: tuple[str, bytes], reason: str
) -> None:
    eng = make_engine()
    join(eng, "a")
    x0, agents0 = eng.x.copy(), set(eng.agents)
    eff = eng.handle(*message, 1.0)
    assert eff.reason == reason
    assert eng.rejected[reason] == 1
    assert eng.accepted == 0
    assert np.array_equal(eng.x, x0) and eng.version == 0
    assert set(eng.agents) == agents0


def test_stale_plain_update_is_rejected_in_sync_mode() -> None:
    eng = make_engine()
    join(eng, "a")
    eng.handle(*upd("a", topk_update(G_A, 3), seq=0), 1.0)
    assert eng.version == 1
    assert eng.handle(*upd("a", topk_update(G_B, 3), round=0, seq=1), 2.0).reason == "stale"


@pytest.mark.parametrize("mode", ["exact", "delta"])
def test_broadcast_applied_to_old_model_reproduces_new_model_bit_for_bit(mode: str) -> None:
    eng = make_engine(downlink=mode)
    join(eng, "a", "b")
    old = eng.x.copy()
    eng.handle(*upd("a", topk_update(G_A, 5)), 1.0)
    eff = eng.handle(*upd("b", topk_update(G_B, 9)), 1.0)
    msg = decode_downlink(find(eff.outbound, topics.delta(JOB)).payload)
    assert isinstance(msg, wire.Delta if mode == "delta" else Steps)
    assert (msg.base_version, msg.version) == (0, 1)
    replica = Replica(D, "mean")
    assert replica.apply(wire.Snapshot(JOB, 0, old)) is None
    assert replica.apply(msg) is None
    assert replica.x is not None and replica.x.tobytes() == eng.x.tobytes()


def test_new_version_broadcasts_a_retained_snapshot() -> None:
    eng = make_engine(snapshot_every=1)
    join(eng, "a")
    eff = eng.handle(*upd("a", topk_update(G_A, 5)), 1.0)
    snap_msg = find(eff.outbound, topics.model(JOB))
    snap = decode_downlink(snap_msg.payload)
    assert snap_msg.retain
    assert isinstance(snap, StateSnapshot) and snap.version == 1
    assert snap.x.tobytes() == eng.x.tobytes()


def test_request_is_answered_with_snapshot() -> None:
    eng = make_engine()
    join(eng, "a")
    eff = eng.handle(topics.request(JOB, "a"), messages.dump(messages.Request(have=None)), 1.0)
    # addressed to a alone (cat/<job>/to/a), not retained: the job-wide model stays for all
    answer = find(eff.outbound, topics.to_agent(JOB, "a"))
    assert answer.target == "a" and answer.kind == "agent_snapshot" and not answer.retain


def test_automatic_step_size_is_inverse_of_row_weighted_smoothness() -> None:
    eng = make_engine(step_size=None)
    join(eng, "a", rows=10, smoothness=1.0)
    join(eng, "b", rows=30, smoothness=3.0)
    assert eng.gamma() == pytest.approx(1.0 / ((10 * 1.0 + 30 * 3.0) / 40))


def test_max_rounds_stops_job_and_rejects_later_updates() -> None:
    eng = make_engine(max_rounds=1)
    join(eng, "a")
    eff = eng.handle(*upd("a", topk_update(G_A, 3)), 1.0)
    ctl = messages.parse(messages.Control, find(eff.outbound, topics.control(JOB)).payload)
    assert ctl.cmd == "stop"
    assert eng.state == "finished"
    assert eng.handle(*upd("a", topk_update(G_A, 3), round=1, seq=1), 2.0).reason == "finished"


def test_target_loss_stops_job() -> None:
    eng = RoundEngine(
        EngineConfig(job=JOB, d=D, step_size=GAMMA, target_loss=1.0),
        evaluator=lambda x: (float(np.dot(x, x)), None),
    )
    join(eng, "a", compressor="dense")
    eng.handle(*upd("a", dense_update(np.full(D, 0.25))), 1.0)  # |x|^2 = 16 * 0.125^2
    assert eng.state == "finished"
    assert eng.loss == pytest.approx(D * 0.125**2)


def test_paused_engine_rejects_plain_updates() -> None:
    eng = make_engine()
    join(eng, "a")
    eng.control("pause", 1.0)
    assert eng.handle(*upd("a", topk_update(G_A, 3)), 2.0).reason == "paused"


def test_resume_after_pause_accepts_updates_again() -> None:
    eng = make_engine()
    join(eng, "a")
    eng.control("pause", 1.0)
    eng.control("resume", 2.0)
    assert eng.handle(*upd("a", topk_update(G_A, 3)), 3.0).committed is not None


def test_fresh_hello_resets_deduplication() -> None:
    eng = make_engine()
    join(eng, "a", "b")
    msg = upd("a", topk_update(G_A, 3), seq=0)
    eng.handle(*msg, 1.0)
    join(eng, "a", fresh=True)  # the agent restarted: its seq starts at 0 again
    eff = eng.handle(*upd("a", topk_update(G_A, 3), seq=0), 2.0)
    assert eff.reason == "duplicate"  # still the same round: one plain update per agent
    eng.handle(*upd("b", topk_update(G_B, 3)), 2.0)
    assert eng.version == 1
    assert eng.handle(*upd("a", topk_update(G_A, 3), round=1, seq=0), 3.0).reason is None


def test_spend_prices_bytes_with_agent_profile() -> None:
    from edge_agent.links.catalog import resolve_profile

    profile = resolve_profile("paper_packet_model")
    eng = RoundEngine(EngineConfig(job=JOB, d=D, step_size=GAMMA), profiles=resolve_profile)
    join(eng, "a", "b", profile="paper_packet_model")
    topic, blob = upd("a", topk_update(G_A, 3))
    eng.handle(topic, blob, 1.0)
    cost = profile.message_cost(len(blob))
    assert eng.totals.actual.bytes == len(blob)
    assert eng.totals.actual.packets == cost.packets
    assert eng.totals.actual.bits == pytest.approx(cost.bits)
    assert eng.totals.dense.bytes > len(blob)


def test_unknown_profile_counts_bytes_only() -> None:
    def missing(name: str) -> None:
        raise KeyError(name)

    eng = RoundEngine(EngineConfig(job=JOB, d=D, step_size=GAMMA), profiles=missing)
    join(eng, "a", "b", profile="nope")
    _, blob = upd("a", topk_update(G_A, 3))
    eng.handle(topics.update(JOB, "a"), blob, 1.0)
    assert eng.totals.actual.bytes == len(blob) and eng.totals.actual.packets == 0


# ---------------------------------------------------------------- EF21


def ef21_engine(**overrides: Any) -> RoundEngine:
    eng = make_engine(**overrides)
    join(eng, "a", "b", semantics="ef21", compressor="dense")
    return eng


# Small integers are exact in float32 and float64: sums below are exact, no tolerance.
C1 = np.arange(D, dtype=np.float64)
C2 = np.ones(D)
C3 = -2.0 * np.ones(D)


def test_ef21_step_uses_mean_state_over_registered_agents() -> None:
    eng = ef21_engine()
    eng.handle(*upd("a", dense_update(C1, "ef21")), 1.0)
    eng.handle(*upd("b", dense_update(C2, "ef21")), 1.0)
    assert eng.version == 1
    assert np.array_equal(eng.x, 0.0 - GAMMA * (C1 + C2) / 2)


def test_ef21_late_update_applies_to_state_once() -> None:
    eng = ef21_engine(quorum_fraction=0.5, round_deadline_s=5.0)
    eng.handle(*upd("a", dense_update(C1, "ef21")), 1.0)
    assert eng.tick(5.0).committed is not None  # closed without b
    late = upd("b", dense_update(C2, "ef21"), round=0, seq=0)
    assert eng.handle(*late, 6.0).reason is None  # late but applied: it is state
    assert eng.handle(*late, 6.5).reason == "duplicate"
    assert np.array_equal(eng.h["b"], C2)
    assert eng.sum_h is not None and np.array_equal(eng.sum_h, C1 + C2)
    assert eng.open_round["participants"] == []  # a late change is not a participant


def test_ef21_duplicate_is_not_applied_twice() -> None:
    eng = ef21_engine()
    msg = upd("a", dense_update(C1, "ef21"), seq=4)
    eng.handle(*msg, 1.0)
    eng.handle(*msg, 1.0)
    assert np.array_equal(eng.h["a"], C1)
    assert eng.sum_h is not None and np.array_equal(eng.sum_h, C1)


def test_ef21_fresh_rejoin_resets_agent_state() -> None:
    eng = ef21_engine()
    eng.handle(*upd("a", dense_update(C1, "ef21")), 1.0)
    eng.handle(*upd("b", dense_update(C2, "ef21")), 1.0)
    join(eng, "a", semantics="ef21", compressor="dense", fresh=True)
    assert "a" not in eng.h
    assert eng.sum_h is not None and np.array_equal(eng.sum_h, C2)
    eng.handle(*upd("a", dense_update(C3, "ef21"), round=1, seq=0), 2.0)
    assert np.array_equal(eng.h["a"], C3)
    assert np.array_equal(eng.sum_h, C2 + C3)


def test_ef21_non_fresh_hello_keeps_agent_state() -> None:
    eng = ef21_engine()
    eng.handle(*upd("a", dense_update(C1, "ef21")), 1.0)
    join(eng, "a", semantics="ef21", compressor="dense", fresh=False)
    assert np.array_equal(eng.h["a"], C1)


def test_ef21_update_while_paused_updates_state_only() -> None:
    eng = ef21_engine()
    eng.control("pause", 0.5)
    assert eng.handle(*upd("a", dense_update(C1, "ef21")), 1.0).reason is None
    assert np.array_equal(eng.h["a"], C1)
    assert eng.version == 0


def _controls(eff: Any) -> list[messages.Control]:
    return [
        messages.parse(messages.Control, o.payload)
        for o in eff.outbound
        if o.topic in (topics.control(JOB), topics.to_agent(JOB, "a"))
    ]


def test_ef21_update_older_than_the_dedupe_window_resets_that_agent() -> None:
    """Beyond the window the engine cannot tell a re-send from a new change: it drops its
    h_a, asks a to reset, refuses a's changes until a fresh hello, then carries on."""
    eng = ef21_engine(dedupe_window=2, max_staleness=1)
    for r in range(4):  # versions 0..3 -> 4; both agents report every round
        eng.handle(*upd("a", dense_update(C1, "ef21"), round=r, seq=r), 1.0)
        eng.handle(*upd("b", dense_update(C2, "ef21"), round=r, seq=r), 1.0)
    assert eng.version == 4
    # a change a computed at version 1 arrives now (queued by a broker for a long time)
    eff = eng.handle(*upd("a", dense_update(C3, "ef21"), round=1, seq=9), 2.0)
    assert eff.reason == "ef21_reset" and eff.journal
    assert [(c.cmd, c.agent) for c in _controls(eff)] == [("reset", "a")]
    assert "a" not in eng.h and eng.sum_h is not None
    assert np.array_equal(eng.sum_h, 4 * C2)  # only b's state is left
    # until a rejoins fresh, its changes are refused (and the reset repeated), even current ones
    eff = eng.handle(*upd("a", dense_update(C1, "ef21"), round=4, seq=10), 2.0)
    assert eff.reason == "ef21_reset" and [c.cmd for c in _controls(eff)] == ["reset"]
    assert "a" not in eng.h
    # a non-fresh hello is answered with the reset too; the state survives a checkpoint
    eff = eng.handle(*hello("a", semantics="ef21", compressor="dense", fresh=False), 2.5)
    assert "reset" in [c.cmd for c in _controls(eff)]
    eng = RoundEngine.restore(eng.config, eng.export())
    assert eng.agents["a"].needs_reset
    # the fresh hello clears it; a's next change is its whole state again
    join(eng, "a", semantics="ef21", compressor="dense", fresh=True)
    assert not eng.agents["a"].needs_reset
    assert eng.handle(*upd("a", dense_update(C3, "ef21"), round=4, seq=11), 3.0).reason is None
    assert np.array_equal(eng.h["a"], C3)
    assert np.array_equal(eng.sum_h, 4 * C2 + C3)
    assert eng.rejected["ef21_reset"] == 2


def test_plain_update_older_than_the_dedupe_window_is_only_stale() -> None:
    eng = make_engine(dedupe_window=2, max_staleness=1)
    join(eng, "a")
    for r in range(4):
        eng.handle(*upd("a", topk_update(G_A, 3), round=r, seq=r), 1.0)
    eff = eng.handle(*upd("a", topk_update(G_A, 3), round=0, seq=9), 2.0)
    assert eff.reason == "stale" and not _controls(eff)
    assert not eng.agents["a"].needs_reset


# ---------------------------------------------------------------- async


def test_async_applies_every_k_updates_weighted_by_staleness() -> None:
    eng = make_engine(mode="async", async_apply_every=2, max_staleness=3)
    join(eng, "a", "b", "c", compressor="dense")
    u1, u2 = dense_update(C1), dense_update(C2)
    eng.handle(*upd("a", u1, round=0, seq=0), 1.0)
    eng.handle(*upd("b", u2, round=0, seq=0), 1.0)
    assert eng.version == 1
    x1 = eng.x.copy()
    u3, u4 = dense_update(C3), dense_update(C1)
    eng.handle(*upd("a", u3, round=1, seq=1), 2.0)  # staleness 0, weight 1
    eng.handle(*upd("c", u4, round=0, seq=0), 2.0)  # staleness 1, weight 1/2
    assert eng.version == 2
    np.testing.assert_allclose(eng.x, x1 - GAMMA * (C3 + 0.5 * C1) / 2, rtol=0, atol=1e-12)


def test_async_rejects_updates_older_than_max_staleness() -> None:
    eng = make_engine(mode="async", async_apply_every=1, max_staleness=1)
    join(eng, "a", compressor="dense")
    for v in range(3):
        eng.handle(*upd("a", dense_update(C2), round=v, seq=v), float(v))
    assert eng.version == 3
    assert eng.handle(*upd("a", dense_update(C2), round=1, seq=9), 5.0).reason == "stale"


# ---------------------------------------------------------------- export / restore


def test_export_restore_round_trip_continues_identically() -> None:
    a = ef21_engine()
    a.handle(*upd("a", dense_update(C1, "ef21")), 1.0)
    b = RoundEngine.restore(a.config, a.export())
    for eng in (a, b):
        eng.handle(*upd("b", dense_update(C2, "ef21")), 2.0)
    assert a.version == b.version == 1
    assert a.x.tobytes() == b.x.tobytes()
    assert b.handle(*upd("a", dense_update(C1, "ef21")), 3.0).reason == "duplicate"


def test_restore_rejects_state_of_another_job() -> None:
    eng = make_engine()
    with pytest.raises(ValueError, match="job"):
        RoundEngine.restore(EngineConfig(job="other", d=D), eng.export())


# ---------------------------------------------------------------- robustness


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
        st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
    ),
    kind=st.sampled_from(["update", "hello", "status", "request"]),
)
def test_random_and_mutated_bytes_never_raise_nor_move_the_model(data: Any, kind: str) -> None:
    eng = make_engine()
    join(eng, "a", "b")
    _, valid = upd("a", topk_update(G_A, 5))
    if isinstance(data, bytes):
        payload = data
    else:
        muts = [data] if isinstance(data, tuple) else data
        buf = bytearray(valid)
        for pos, val in muts:
            buf[pos % len(buf)] = val
        payload = bytes(buf)
    x0 = eng.x.copy()
    topic = f"cat/{JOB}/{kind}/a"
    eff = eng.handle(topic, payload, 1.0)
    assert np.array_equal(eng.x, x0) and eng.version == 0  # b has not reported: no step
    assert eff.committed is None
    assert math.isfinite(float(eng.x.sum()))


def test_async_ef21_step_is_scaled_by_fresh_fraction() -> None:
    eng = make_engine(mode="async", async_apply_every=1)
    join(eng, "a", "b", semantics="ef21", compressor="dense")
    eng.handle(*upd("a", dense_update(C1, "ef21")), 1.0)
    assert eng.version == 1
    # only a holds a state (b said hello only): the mean of one state, fully fresh
    x1 = 0.0 - GAMMA * C1
    assert np.array_equal(eng.x, x1)
    eng.handle(*upd("b", dense_update(C2, "ef21"), round=1), 2.0)
    assert eng.version == 2
    # one of two states refreshed: gamma * (1/2) * sum_h / 2
    assert np.array_equal(eng.x, x1 - (GAMMA * 0.5 / 2) * (C1 + C2))


def test_versions_between_snapshots_send_only_the_delta() -> None:
    eng = make_engine(snapshot_every=3)
    join(eng, "a")
    kinds = []
    for _ in range(3):
        eff = eng.handle(*upd("a", topk_update(G_A, 5), round=eng.version, seq=eng.version), 1.0)
        kinds.append(sorted(o.topic for o in eff.outbound))
    assert kinds[0] == kinds[1] == [topics.delta(JOB)]
    assert kinds[2] == sorted([topics.delta(JOB), topics.model(JOB)])


def test_ef21_jobs_default_to_half_the_plain_step() -> None:
    plain = make_engine(step_size=None)
    join(plain, "a")
    ef21 = make_engine(step_size=None)
    join(ef21, "a", semantics="ef21")
    assert plain.gamma() > 0
    assert ef21.gamma() == 0.5 * plain.gamma()
    configured = make_engine(step_size=0.3)
    join(configured, "a", semantics="ef21")
    assert configured.gamma() == 0.3


def test_a_stale_update_is_answered_with_the_model() -> None:
    """An agent left behind by a deadline close gets the snapshot instead of silence."""
    eng = make_engine(round_deadline_s=1.0, quorum_fraction=0.5)
    join(eng, "a", "b")
    eng.handle(*upd("a", topk_update(G_A, 5)), 0.5)
    eng.tick(2.0)  # deadline with quorum: version 1 without b
    assert eng.version == 1
    eff = eng.handle(*upd("b", topk_update(G_A, 5)), 2.5)
    assert eff.reason == "stale"
    # b holds version 0: it gets the steps 0 -> 1 it missed, not the model
    (msg,) = eff.outbound
    got = decode_downlink(msg.payload)
    assert isinstance(got, Steps) and (got.base_version, got.version) == (0, 1)


def test_batched_accumulation_equals_one_add_per_update_bit_for_bit() -> None:
    """Async rounds of K=6 overlapping sparse updates with staleness weights and mixed value
    dtypes: accumulating them with one np.add.at per round must give exactly the floats of
    ``acc[idx] += w * values`` per update (the reference engine is forced onto that path)."""
    kw: dict[str, Any] = {"mode": "async", "async_apply_every": 6, "max_staleness": 3,
                          "dedupe_window": 8, "step_size": 0.37}  # fmt: skip
    batched, ref = make_engine(**kw), make_engine(**kw)
    for eng in (batched, ref):
        join(eng, *"abcdef")
    rng = np.random.default_rng(11)
    dtypes = ["float16", "float32", "float64"]
    most_pending = 0
    last = dict.fromkeys("abcdef", -1)
    for k in range(60):
        agent = "abcdef"[k % 6]  # one update per agent and version (async takes no more)
        rnd = max(last[agent] + 1, batched.version - int(rng.integers(0, 3)))
        last[agent] = rnd
        u = topk_update(rng.standard_normal(D) * 3, int(rng.integers(3, 12)))
        blob = wire.encode(u, job=JOB, agent=agent, round=rnd, seq=k,
                           value_dtype=dtypes[k % 3])  # type: ignore[arg-type]  # fmt: skip
        acc = ref.round_state.accumulator
        acc.load(acc.export())  # touched entries unknown: one dense add per update
        for eng in (batched, ref):
            assert eng.handle(topics.update(JOB, agent), blob, float(k)).reason is None
        assert batched.x.tobytes() == ref.x.tobytes()
        most_pending = max(most_pending, batched.round_state.accumulator.pending)
        if k % 7 == 6:  # a checkpoint mid-round sees the same accumulator (and flushes it)
            assert batched.export().acc.tobytes() == ref.export().acc.tobytes()
    assert batched.version == ref.version == 10
    assert most_pending >= 4  # the batched path was taken


def test_sparse_step_equals_the_dense_step_bit_for_bit() -> None:
    """The step over touched entries only must give exactly the dense formula's floats."""
    sparse, dense = make_engine(step_size=0.37), make_engine(step_size=0.37)
    for eng in (sparse, dense):
        join(eng, "a", "b")
    rng = np.random.default_rng(9)
    for r in range(5):
        acc = dense.round_state.accumulator
        acc.load(acc.export())  # touched entries unknown: x - c * acc over all of d
        for agent in ("a", "b"):
            u = topk_update(rng.standard_normal(D), 7)
            for eng in (sparse, dense):
                eng.handle(*upd(agent, u, round=r, seq=r), float(r))
    assert sparse.version == dense.version == 5
    assert sparse.x.tobytes() == dense.x.tobytes()


# ---------------------------------------------------------------- de-duplication keys


def _keys(eng: RoundEngine) -> set[tuple[str, int, int]]:
    names = list(eng.agents)
    return {(names[a], r, s) for a, r, s in eng.export().seen.tolist()}


def test_checkpoint_keys_are_exactly_the_window_after_pruning_and_a_fresh_rejoin() -> None:
    # async, K=1: every accepted update is a version; window of 3 versions
    eng = make_engine(mode="async", async_apply_every=1, max_staleness=3, dedupe_window=3)
    join(eng, "a", "b")
    for seq in range(6):
        for agent, g in (("a", G_A), ("b", G_B)):
            r = eng.version
            assert eng.handle(*upd(agent, topk_update(g, 3), round=r, seq=seq), 1.0).reason is None
    floor = eng.version - 3
    keys = _keys(eng)
    assert keys and all(r >= floor for _, r, _ in keys)  # older rounds were pruned
    assert {a for a, _, _ in keys} == {"a", "b"}
    # what is kept still de-duplicates: re-send b's newest update
    last = max((r, s) for a, r, s in keys if a == "b")
    eff = eng.handle(*upd("b", topk_update(G_B, 3), round=last[0], seq=last[1]), 1.0)
    assert eff.reason == "duplicate"
    # a fresh rejoin forgets a's keys only, also in the checkpoint
    join(eng, "a", fresh=True)
    assert {a for a, _, _ in _keys(eng)} == {"b"}
    # restore: the same keys, the same answers
    restored = RoundEngine.restore(eng.config, eng.export())
    assert _keys(restored) == _keys(eng)
    eff = restored.handle(*upd("b", topk_update(G_B, 3), round=last[0], seq=last[1]), 1.0)
    assert eff.reason == "duplicate"


def test_dedupe_log_stays_bounded_without_checkpoints() -> None:
    eng = make_engine(mode="async", async_apply_every=1, max_staleness=2, dedupe_window=2)
    join(eng, "a")
    for seq in range(20_000):
        eff = eng.handle(*upd("a", topk_update(G_A, 2), round=eng.version, seq=seq), 1.0)
        assert eff.reason is None
    assert eng.intake.seen_keys.logged <= 3 * 4096  # compacted as it grows, not 20,000 rows
    assert len(eng.export().seen) <= 3  # window of 2 versions + the current one


def test_round_record_prices_each_agents_updates_on_its_own_profile() -> None:
    from edge_agent.links.catalog import resolve_profile

    eng = RoundEngine(EngineConfig(job=JOB, d=D, step_size=GAMMA), profiles=resolve_profile)
    join(eng, "a", profile="lorawan_eu868_dr5_sf7")
    join(eng, "b", profile="nbiot_udp_psm_rai")
    eng.handle(*upd("a", topk_update(G_A, 5)), 1.0)
    # mid-round, a checkpoint keeps the per-agent cost (floats stay floats)
    eng = RoundEngine.restore(eng.config, eng.export(), profiles=resolve_profile)
    rec = eng.handle(*upd("b", topk_update(G_B, 9)), 1.0).committed
    assert rec is not None
    a, b = rec.agents["a"].cost, rec.agents["b"].cost
    assert a.packets >= 1 and b.packets >= 1
    assert a.airtime_s > 0 and b.energy_j > 0
    assert isinstance(a.airtime_s, float) and isinstance(a.packets, int)
    assert a.packets + b.packets == rec.spend.actual.packets
    assert a.airtime_s + b.airtime_s == pytest.approx(rec.spend.actual.airtime_s, rel=1e-12)
    assert a.energy_j + b.energy_j == pytest.approx(rec.spend.actual.energy_j, rel=1e-12)
    back = type(rec).from_dict(rec.to_dict())
    assert back.agents == rec.agents


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_round_of_empty_updates_closes_without_changing_x(mode: str) -> None:
    """T = 0 is a valid update (nothing worth its cost); a round made only of those must
    close cleanly (it used to raise inside the step, and the next tick killed ingest)."""
    eng = make_engine(mode=mode, async_apply_every=2, max_staleness=2, dedupe_window=4)
    join(eng, "a", "b")
    empty = Update("topk", D, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
    deltas = []
    for agent in ("a", "b"):
        eff = eng.handle(*upd(agent, empty), 1.0)
        assert eff.reason is None
        deltas += [o for o in eff.outbound if o.topic == topics.delta(JOB)]
    (delta,) = deltas
    decoded = wire.decode_model(delta.payload)
    assert isinstance(decoded, wire.Delta) and decoded.indices.size == 0
    assert eng.version == 1 and not eng.x.any()
    assert eng.rejected["internal_error"] == 0
    eng.tick(100.0)  # deadlines, liveness: must not raise


def test_downlink_pacing_spaces_versions_by_every_live_agents_caps() -> None:
    """A LoRaWAN agent may receive 10 downlinks a day: with pacing on, the next version
    cannot close before its link has recovered from the last broadcast (a day / 10 per
    downlink packet), even when everyone has reported; a link without caps adds nothing."""
    from aggregator.engine.downlink.broadcast import downlink_interval_s
    from edge_agent.links.catalog import resolve_profile

    eng = RoundEngine(  # live throughout: a holder that is lost no longer holds (issue 20)
        EngineConfig(job=JOB, d=D, step_size=GAMMA, downlink_pacing=True, liveness_timeout_s=1e5),
        profiles=resolve_profile,
    )
    join(eng, "a", profile="lorawan_eu868_dr5_sf7")
    eff = eng.handle(*upd("a", topk_update(G_A, 5)), 1.0)
    assert eng.version == 1
    eng.charge_downlink(eff.outbound, now=1.0)
    size = sum(len(o.payload) for o in eff.outbound)
    lora = resolve_profile("lorawan_eu868_dr5_sf7")
    assert eng.next_version_at >= 1.0 + 86_400 / 10 - 1e-6
    assert eng.next_version_at >= 1.0 + downlink_interval_s(lora, size) - 1e-6
    eng.handle(*upd("a", topk_update(G_A, 5), round=1), 2.0)
    assert eng.version == 1  # reported, but its link is still spent
    eng.tick(eng.next_version_at - 1.0)
    assert eng.version == 1
    eng.tick(eng.next_version_at)
    assert eng.version == 2
    assert downlink_interval_s(resolve_profile("ble5_2m_dle_notify"), 1000) < 0.1


def test_updates_that_arrive_before_the_job_starts_enter_its_first_round() -> None:
    """Agents that joined first may report before the last of ``min_agents`` says hello:
    the start keeps what the open round collected (their re-sends are duplicates, so a
    round that dropped them would never close)."""
    eng = make_engine(min_agents=3)
    join(eng, "a", "b")
    for agent, g in (("a", G_A), ("b", G_B)):
        assert eng.handle(*upd(agent, topk_update(g, 4)), 1.0).reason is None
    assert eng.lifecycle.state == "waiting"
    join(eng, "c", now=2.0)
    assert eng.state == "running" and eng.open_round["participants"] == ["a", "b"]
    eng.handle(*upd("c", topk_update(G_A + G_B, 4)), 3.0)
    assert eng.version == 1 and eng.last_record is not None
    assert eng.last_record.participants == ("a", "b", "c")


def test_the_stochastic_schedule_decays_the_step_as_2_over_lambda_t() -> None:
    from aggregator.engine.stepsize import scheduled

    assert scheduled(0.5, 10, None) == 0.5
    assert scheduled(0.5, 0, 0.01) == 0.5  # nothing to decay before the first version
    assert scheduled(0.5, 1000, 0.01) == pytest.approx(2 / (0.01 * 1000))
    assert scheduled(0.5, 1000, 0.01, t0=1000) == pytest.approx(2 / (0.01 * 2000))
    assert scheduled(0.5, 10, 0.01) == 0.5  # min with the constant step
