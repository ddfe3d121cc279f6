"""Error feedback memories: what they keep and that they keep it exactly."""

from __future__ import annotations

import numpy as np

import edge_agent as ea
from edge_agent.numerics.feedback import EF21State, NoFeedback, ResidualMemory


def test_residual_memory_keeps_what_compression_dropped() -> None:
    g = np.array([3.0, -1.0, 0.5, 2.0])
    mem = ResidualMemory(4)
    v = mem.prepare(g)
    u = ea.compress(v, "topk", 2)
    mem.commit(v, u)
    assert np.array_equal(mem.state, v - u.to_dense())
    v2 = mem.prepare(g)
    assert np.array_equal(v2, g + (v - u.to_dense()))


def test_residual_memory_sends_everything_eventually() -> None:
    """Sum of what was sent + residual equals the sum of the inputs (nothing is lost)."""
    rng = np.random.default_rng(3)
    mem = ResidualMemory(100)
    sent = np.zeros(100)
    total = np.zeros(100)
    for _ in range(50):
        g = rng.standard_normal(100)
        total += g
        v = mem.prepare(g)
        u = ea.compress(v, "topk", 5, value_dtype="float64")
        mem.commit(v, u)
        sent += u.to_dense()
    assert np.allclose(sent + mem.state, total)


def test_ef21_state_tracks_the_gradient_and_messages_shrink() -> None:
    rng = np.random.default_rng(4)
    g = rng.standard_normal(200)
    ef = EF21State(200)
    sizes = []
    for _ in range(200):
        v = ef.prepare(g)
        u = ea.compress(v, "topk", 20, value_dtype="float64")
        sizes.append(float(np.linalg.norm(u.to_dense())))
        ef.commit(v, u)
    assert np.allclose(ef.state, g, atol=1e-9)
    assert sizes[-1] < 1e-6 * sizes[0]


def test_ef21_mirror_is_bit_identical_through_the_wire() -> None:
    """The aggregator's mirror h_i built from decoded updates equals the agent's state."""
    rng = np.random.default_rng(5)
    ef = EF21State(64)
    mirror = np.zeros(64)
    for r in range(30):
        g = rng.standard_normal(64)
        v = ef.prepare(g)
        u = ea.compress(v, "signtopk", 8)
        ef.commit(v, u)
        _, decoded = ea.decode(ea.encode(u, job="j", agent="a", round=r, seq=r))
        decoded.add_to(mirror)
    assert np.array_equal(mirror, ef.state)


def test_no_feedback_passes_the_gradient_through() -> None:
    g = np.arange(5.0)
    fb = NoFeedback(5)
    assert fb.prepare(g) is g
