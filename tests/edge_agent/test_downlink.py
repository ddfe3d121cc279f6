"""Steps and state snapshots: encode -> decode -> replay gives the aggregator's exact bits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.agent.replica import Replica
from edge_agent.errors import WireFormatError
from edge_agent.numerics.aggregation import EF21Mirror, MeanAccumulator
from edge_agent.numerics.compressors import compress
from edge_agent.numerics.local import LocalCoefs
from edge_agent.protocol import downlink, wire
from edge_agent.protocol.downlink import (
    Add,
    Local,
    StateSnapshot,
    Steps,
    add_op,
    decode_downlink,
    encode_state,
    encode_steps,
    step_op,
    sub_op,
    zero_op,
)

JOB = "job-1"


def _blob(rng: np.random.Generator, d: int, compressor: str, agent: str, dtype: str) -> bytes:
    g = rng.standard_normal(d) * rng.lognormal(0, 2, d)
    t = d if compressor == "dense" else int(rng.integers(1, d + 1))
    u = compress(g, compressor, t, rng=rng, value_dtype=dtype)  # type: ignore[arg-type]
    return wire.encode(u, job=JOB, agent=agent, round=3, seq=1)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rounds=st.integers(1, 4),
    per_round=st.integers(1, 6),
    weighted=st.booleans(),
)
def test_mean_steps_replay_bit_identically(
    seed: int, rounds: int, per_round: int, weighted: bool
) -> None:
    rng = np.random.default_rng(seed)
    d = int(rng.integers(1, 300))
    x = rng.standard_normal(d)
    replica = Replica(d, "mean")
    assert replica.apply(wire.Snapshot(JOB, 0, x.copy())) is None
    ops: list[bytes] = []
    for _ in range(rounds):
        acc = MeanAccumulator(d)
        for j in range(per_round):
            comp = str(rng.choice(["topk", "signtopk", "randk", "dense"]))
            dtype = str(rng.choice(["float16", "float32", "float64"]))
            blob = _blob(rng, d, comp, f"a{j}", dtype)
            _, u = wire.decode(blob)
            w = float(1.0 / (1 + rng.integers(0, 4))) if weighted else 1.0
            acc.add(u, w)
            ops.append(add_op(blob, wire.body_offset(blob), u.t, w))
        coef = float(rng.uniform(0.01, 2.0)) / per_round
        assert acc.step(x, coef).finite
        ops.append(step_op(coef))
    msg = encode_steps(ops, job=JOB, d=d, base_version=0, version=rounds, family="mean")
    got = decode_downlink(msg)
    assert isinstance(got, Steps) and got.version == rounds
    assert replica.apply(got) is None
    assert replica.version == rounds
    assert replica.x is not None and np.array_equal(replica.x, x)
    assert replica.x.tobytes() == x.tobytes()  # the same bits, signed zeros included


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rounds=st.integers(1, 4))
def test_ef21_steps_with_resets_replay_bit_identically(seed: int, rounds: int) -> None:
    rng = np.random.default_rng(seed)
    d = int(rng.integers(1, 200))
    x = rng.standard_normal(d)
    mirror = EF21Mirror(d)
    # some history before the replica joins: it gets x and the aggregate in a state snapshot
    for j in range(3):
        _, u = wire.decode(_blob(rng, d, "topk", f"a{j}", "float32"))
        mirror.apply(f"a{j}", u)
    assert mirror.sum_h is not None
    state = decode_downlink(encode_state(x, job=JOB, version=0, aggregate=mirror.sum_h))
    assert isinstance(state, StateSnapshot)
    replica = Replica(d, "ef21")
    assert replica.apply(state) is None
    ops: list[bytes] = []
    for _ in range(rounds):
        for j in range(3):
            if rng.random() < 0.2 and f"a{j}" in mirror.h:  # an agent's state dropped
                h = mirror.h[f"a{j}"]
                nz = np.flatnonzero(h)
                mirror.reset_agent(f"a{j}")
                ops.append(sub_op(nz, h[nz], d) if mirror.h else zero_op())
                continue
            blob = _blob(rng, d, str(rng.choice(["topk", "signtopk"])), f"a{j}", "float32")
            _, u = wire.decode(blob)
            mirror.apply(f"a{j}", u)
            ops.append(add_op(blob, wire.body_offset(blob), u.t))
        coef = float(rng.uniform(0.01, 1.0))
        assert mirror.step(x, coef).finite
        ops.append(step_op(coef))
    msg = encode_steps(ops, job=JOB, d=d, base_version=0, version=rounds, family="ef21")
    assert replica.apply(decode_downlink(msg)) is None
    assert replica.x is not None and replica.x.tobytes() == x.tobytes()
    assert replica.aggregate is not None and replica.aggregate.tobytes() == mirror.sum_h.tobytes()


def test_relay_is_no_larger_than_the_updates_it_carries() -> None:
    rng = np.random.default_rng(0)
    d = 47_236
    blobs = [_blob(rng, d, "signtopk", f"agent-{j:03d}", "float32") for j in range(10)]
    ops = [add_op(b, wire.body_offset(b), wire.decode(b)[1].t) for b in blobs]
    msg = encode_steps([*ops, step_op(0.1)], job=JOB, d=d, base_version=7, version=8, family="mean")
    assert len(msg) <= sum(map(len, blobs))  # the header fits in what the entries save


def test_state_snapshot_of_zeros_is_tiny_and_dense_one_is_not_bigger() -> None:
    d = 47_236
    assert len(encode_state(np.zeros(d), job=JOB, version=0)) < 20
    x = np.random.default_rng(1).standard_normal(d)
    blob = encode_state(x, job=JOB, version=3)
    assert len(blob) <= len(wire.encode_snapshot(x, job=JOB, version=3)) + 1
    got = decode_downlink(blob)
    assert isinstance(got, StateSnapshot) and np.array_equal(got.x, x) and got.aggregate is None


def test_replica_refuses_a_gap_and_changes_nothing() -> None:
    replica = Replica(4, "mean")
    assert replica.apply(wire.Snapshot(JOB, 5, np.ones(4))) is None
    steps = Steps(JOB, 6, 7, 4, "mean", (downlink.Step(1.0),))
    assert replica.apply(steps) == "version_gap"
    assert replica.version == 5
    ef21 = Replica(4, "ef21")
    ef21.apply(wire.Snapshot(JOB, 0, np.ones(4)))  # no aggregate in a plain snapshot
    assert ef21.apply(Steps(JOB, 0, 1, 4, "ef21", (downlink.Step(1.0),))) == "no_aggregate"


@pytest.mark.parametrize("cut", [1, 5, 9, 20])
def test_truncated_steps_raise_wire_format_error(cut: int) -> None:
    rng = np.random.default_rng(2)
    blob = _blob(rng, 50, "topk", "a", "float32")
    msg = encode_steps(
        [add_op(blob, wire.body_offset(blob), wire.decode(blob)[1].t), step_op(0.5)],
        job=JOB,
        d=50,
        base_version=0,
        version=1,
        family="mean",
    )
    with pytest.raises(WireFormatError):
        decode_downlink(msg[:-cut])


def test_steps_must_end_as_many_versions_as_they_claim() -> None:
    msg = encode_steps([step_op(0.5)], job=JOB, d=3, base_version=0, version=2, family="mean")
    with pytest.raises(WireFormatError, match="versions end"):
        decode_downlink(msg)


def test_a_non_finite_coefficient_is_refused() -> None:
    msg = encode_steps(
        [step_op(float("inf"))], job=JOB, d=3, base_version=0, version=1, family="mean"
    )
    with pytest.raises(WireFormatError, match="not finite"):
        decode_downlink(msg)


def test_add_op_decodes_to_the_same_update() -> None:
    rng = np.random.default_rng(3)
    blob = _blob(rng, 100, "signtopk", "a", "float16")
    _, u = wire.decode(blob)
    msg = encode_steps(
        [add_op(blob, wire.body_offset(blob), u.t, 0.25), step_op(1.0)],
        job=JOB,
        d=100,
        base_version=0,
        version=1,
        family="mean",
    )
    got = decode_downlink(msg)
    assert isinstance(got, Steps)
    op = got.ops[0]
    assert isinstance(op, Add) and op.weight == 0.25
    assert np.array_equal(op.update.dense_values(), u.dense_values())


@pytest.mark.parametrize("ahead", [None, 1, 7, 1 << 16])
def test_a_local_operation_carries_the_next_rounds_steps(ahead: int | None) -> None:
    """LOCAL (code 7) for a fixed schedule, LOCAL_NEXT (code 8) with the next round's drawn
    count: each decodes to the coefficients it was encoded from."""
    u = compress(np.arange(1.0, 11.0), "signtopk", 3, rng=np.random.default_rng(0))
    coefs = LocalCoefs(5, 0.25, 0.75, 0.2, 0.2, ahead)
    op = downlink.local_op(u, coefs, job=JOB, absent=("a1",), joined=("a0", "a2"))
    assert op[0] == (downlink.OP_LOCAL if ahead is None else downlink.OP_LOCAL_NEXT)
    got = decode_downlink(encode_steps([op], job=JOB, d=10, base_version=3, version=4,
                                       family="local"))  # fmt: skip
    assert isinstance(got, Steps)
    [local] = got.ops
    assert isinstance(local, Local) and local.coefs == coefs
    assert local.coefs.ahead == (5 if ahead is None else ahead)
    assert local.absent == {downlink.member_tag("a1")}


def test_a_local_next_count_of_zero_is_refused() -> None:
    u = compress(np.ones(4), "signtopk", 2, rng=np.random.default_rng(0))
    op = bytearray(downlink.local_op(u, LocalCoefs(2, 0.5, 1.0, 0.1, 0.1, 3), job=JOB))
    assert op[:3] == bytes([downlink.OP_LOCAL_NEXT, 2, 3])
    op[2] = 0  # the next round's count
    msg = encode_steps([bytes(op)], job=JOB, d=4, base_version=0, version=1, family="local")
    with pytest.raises(WireFormatError, match="out of range"):
        decode_downlink(msg)
