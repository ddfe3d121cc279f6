"""Outbound messages: lazy delta encoding, and merging a batch's chained deltas."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.engine.downlink.outbound import DeltaParts, Outbound, control_message, merge_deltas
from edge_agent.protocol import messages, topics, wire

JOB, D = "job1", 10


def _delta(base: int, idx: list[int], vals: list[float], topic: str | None = None) -> Outbound:
    parts = DeltaParts(JOB, D, base, base + 1, np.array(idx, np.int64), np.array(vals))
    return Outbound(topic or topics.delta(JOB), delta=parts)


def _apply(x: np.ndarray, out: Outbound) -> None:
    delta = wire.decode_model(out.payload)
    assert isinstance(delta, wire.Delta)
    x[delta.indices] = delta.values


def test_an_outbound_has_exactly_one_of_payload_and_delta() -> None:
    with pytest.raises(ValueError, match="Outbound has"):
        Outbound("t")
    with pytest.raises(ValueError, match="Outbound has"):
        Outbound("t", b"x", delta=_delta(0, [1], [1.0]).delta)


def test_a_delta_is_encoded_on_first_use_only() -> None:
    out = _delta(3, [1, 4], [0.5, -2.0])
    assert "3->4" in repr(out)
    assert out._payload is None  # nothing encoded yet
    first = out.payload
    assert out.payload is first  # cached
    decoded = wire.decode_model(first)
    assert isinstance(decoded, wire.Delta)
    assert (decoded.base_version, decoded.version) == (3, 4)
    assert decoded.indices.tolist() == [1, 4] and decoded.values.tolist() == [0.5, -2.0]


def test_merging_a_chain_gives_the_bits_of_applying_it_in_order() -> None:
    rng = np.random.default_rng(5)
    chain = []
    for v in range(6):
        idx = np.sort(rng.choice(D, size=int(rng.integers(0, 5)), replace=False))
        chain.append(_delta(v, idx.tolist(), rng.standard_normal(idx.size).tolist()))
    merged = merge_deltas(chain)
    assert len(merged) == 1
    assert merged[0].delta is not None
    assert (merged[0].delta.base_version, merged[0].delta.version) == (0, 6)
    one, each = np.zeros(D), np.zeros(D)
    _apply(one, merged[0])
    for out in chain:
        _apply(each, out)
    assert one.tobytes() == each.tobytes()


def test_other_messages_and_broken_chains_keep_their_place() -> None:
    ctl = control_message(JOB, messages.Control(cmd="stop", version=2))
    a, b = _delta(0, [1], [1.0]), _delta(1, [2], [2.0])
    gap = _delta(5, [3], [3.0])  # does not continue b
    merged = merge_deltas([a, b, ctl, gap])
    assert [o.topic for o in merged] == [topics.delta(JOB), topics.control(JOB), topics.delta(JOB)]
    assert merged[2] is gap
    assert merge_deltas([a, gap]) == [a, gap]
    assert merge_deltas([]) == []


def test_control_message_goes_to_the_control_topic() -> None:
    out = control_message(JOB, messages.Control(cmd="reset", agent="a", version=7))
    assert out.topic == topics.control(JOB) and not out.retain
    ctl = messages.parse(messages.Control, out.payload)
    assert (ctl.cmd, ctl.agent, ctl.version) == ("reset", "a", 7)
