"""Local training (edge_agent.numerics.local): fixed point, invariant, refusals."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.numerics.compressors import compress
from edge_agent.numerics.local import LocalConfig, LocalTraining, Schedule, validate


def _quadratics(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """f_i(x) = |x - b_i|^2 / 2 with different b_i: the mean's optimum is mean(b)."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.normal(size=(n, d))


@pytest.mark.parametrize("anchor", [1.0, 2.0])
def test_locodl_reaches_the_mean_optimum_on_heterogeneous_shards(anchor: float) -> None:
    b, _ = _quadratics(4, 30, 0)
    cfg = LocalConfig(local_steps=5, step_factor=0.5, chi=0.25, rho=1.0, anchor=anchor)
    st = LocalTraining(cfg, np.zeros(30), 4, gamma=0.5)
    sched = Schedule(cfg, np.random.default_rng(0))
    up = [lambda k, v: compress(v, "signtopk", 6)] * 4
    down = lambda k, v: compress(v, "signtopk", 6)  # noqa: E731
    for k in range(6000):
        st.local_step(lambda i, x: x - b[i])
        if sched.communicate():
            st.communicate(k, up, down)
    np.testing.assert_allclose(st.model, b.mean(axis=0), atol=1e-5)
    # sum_i u_i + n v + 2 n c e is invariant (0 from the zero start)
    c = cfg.p * cfg.chi / st.gamma
    a = cfg.anchor
    total = st.u.sum(axis=0) + 4 * a * st.v + (1 + a) * 4 * c * st.e
    np.testing.assert_allclose(total, 0.0, atol=1e-9)
    assert st.gradients == 4 * 6000


def test_dense_scaffnew_converges_and_keeps_its_control_variates_summing_to_zero() -> None:
    b, _ = _quadratics(3, 10, 1)
    cfg = LocalConfig(local_steps=4, step_factor=0.5, method="scaffnew")
    st = LocalTraining(cfg, np.zeros(10), 3, gamma=0.5)
    sched = Schedule(cfg, np.random.default_rng(0))
    up = [lambda k, v: compress(v, "dense", 10, value_dtype="float64")] * 3
    for k in range(400):
        st.local_step(lambda i, x: x - b[i])
        if sched.communicate():
            st.communicate(k, up, None)
    np.testing.assert_allclose(st.model, b.mean(axis=0), atol=1e-8)
    np.testing.assert_allclose(st.u.sum(axis=0), 0.0, atol=1e-9)


def test_schedule_every_h_and_with_probability() -> None:
    every = Schedule(LocalConfig(local_steps=3), np.random.default_rng(0))
    assert [every.communicate() for _ in range(6)] == [False, False, True] * 2
    coin = Schedule(LocalConfig(comm_prob=0.2), np.random.default_rng(0))
    hits = sum(coin.communicate() for _ in range(5000))
    assert 800 < hits < 1200


@pytest.mark.parametrize(
    ("cfg", "uplink", "flag"),
    [
        (LocalConfig(method="scaffnew"), "signtopk", "--local-method scaffnew"),
        (LocalConfig(local_steps=0), "signtopk", "--local-steps"),
        (LocalConfig(comm_prob=1.5), "signtopk", "--comm-prob"),
        (LocalConfig(step_factor=2.0), "signtopk", "--local-step-factor"),
        (LocalConfig(chi=0.0), "signtopk", "--local-chi"),
        (LocalConfig(rho=1.5), "signtopk", "--local-rho"),
        (LocalConfig(anchor=0.0), "signtopk", "--local-anchor"),
        (LocalConfig(local_steps=15, batch_size=0.1), "signtopk", "multiple of 10"),
        (LocalConfig(local_steps=20, batch_size=64.0), "signtopk", "fraction"),
        (LocalConfig(comm_prob=0.1, batch_size=0.1), "signtopk", "--comm-prob with"),
    ],
)
def test_refused_configurations_name_the_flag(cfg: LocalConfig, uplink: str, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        validate(cfg, uplink=uplink, downlink="signtopk" if uplink != "dense" else "dense")


def test_the_minibatch_step_is_the_full_gradient_one_times_the_root_of_the_fraction() -> None:
    assert LocalConfig(local_steps=20).factor == pytest.approx(0.1)
    assert LocalConfig(local_steps=20, batch_size=0.1).factor == pytest.approx(0.1 * 0.1**0.5)
    assert LocalConfig(local_steps=20, batch_size=0.1, step_factor=0.05).factor == 0.05
