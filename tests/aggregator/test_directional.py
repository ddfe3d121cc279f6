"""Directional curvature end to end: an agent with ``curvature="directional"`` sends a ``dir``
update, the real engine steps it with exactly 1/L, and the objective never rises.

The references are independent: the direction ``q`` and its curvature bound are recomputed
here from the decoded update and a dense numpy evaluation of ``c |A Q|^2 / N + l2 |q|^2``,
and the objective before/after from ``model.loss``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.sim.experiment import run_method
from aggregator.sim.harness import FleetHarness
from aggregator.sim.methods import parse_method
from aggregator.sim.problem import build_fleet, build_problem
from edge_agent.agent.loop import AgentConfig
from edge_agent.data import Dataset
from edge_agent.data.sparse import CSRMatrix
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.compressors import SEMANTICS, Update, compress
from edge_agent.numerics.models import Model, make_model
from edge_agent.protocol import messages, topics, wire
from edge_agent.protocol.wire_many import decode_many

FloatArray = npt.NDArray[np.float64]
JOB = "dirjob"


# ------------------------------------------------------------------ a random small problem
def _problem(kind: str, seed: int) -> tuple[Model, Dataset]:
    rng = np.random.default_rng(seed)
    n, features, classes = int(rng.integers(5, 40)), int(rng.integers(3, 30)), 3
    dense = rng.standard_normal((n, features)) * (rng.random((n, features)) < 0.4)
    if kind == "logreg":
        y = rng.choice(np.array([-1.0, 1.0]), size=n)
    elif kind == "softmax":
        y = rng.integers(0, classes, size=n).astype(np.float64)
    else:
        y = rng.standard_normal(n)
    model = make_model(
        kind,
        n_features=features,
        n_classes=classes if kind == "softmax" else 2,
        l2=float(rng.uniform(1e-4, 0.1)),
    )
    return model, Dataset(CSRMatrix.from_dense(dense), y)


def _bound(model: Model, data: Dataset, q: FloatArray) -> float:
    """``curvature |A Q|_F^2 / N + l2 |q|^2`` from a dense ``q`` (the model's bound)."""
    assert isinstance(data.X, CSRMatrix)
    a = data.X.to_dense()
    k = model.n_classes if model.kind == "softmax" else 1
    aq = a @ q.reshape(-1, k)
    return float(model.curvature * np.sum(aq * aq) / a.shape[0] + model.l2 * q @ q)


def _direction(update: Update, g: FloatArray) -> FloatArray:
    """The direction the update moves along: g on its entries (signs for signtopk)."""
    q = np.zeros(update.d)
    idx = np.arange(update.d) if update.indices is None else update.indices
    q[idx] = np.where(g[idx] < 0, -1.0, 1.0) if update.compressor == "signtopk" else g[idx]
    return q


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["logreg", "lsq", "softmax"]),
    compressor=st.sampled_from(["dense", "topk", "signtopk"]),
    dtype=st.sampled_from(["float32", "float64"]),
    profile=st.sampled_from(["paper_payload_bits", "paper_packet_model"]),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([0.0, 0.3, 3.0]),
)
def test_a_directional_agent_sends_dir_and_the_engine_step_decreases_f(
    kind: str, compressor: str, dtype: str, profile: str, seed: int, scale: float
) -> None:
    model, data = _problem(kind, seed)
    x0 = np.random.default_rng(seed + 1).standard_normal(model.d) * scale
    engine = RoundEngine(EngineConfig(job=JOB, d=model.d, model=kind, ef21_step_factor=0.3), x0=x0)
    with FleetHarness(engine, name="dir") as fleet:
        agent = fleet.add_agent(
            AgentConfig(
                job=JOB,
                agent_id="a0",
                compressor=compressor,
                curvature="directional",
                value_dtype=dtype,  # type: ignore[arg-type]
                resend_s=None,
                duty_cycle="ignore",
            ),
            model=model,
            data=data,
            profile=resolve_profile(profile),
        )
        fleet.start()
        fleet.pump(strict=True)
        fleet.deliver()
        assert agent.x is not None and np.array_equal(agent.x, x0)
        (log,) = fleet.step()
        assert log is not None and log.select_s >= 0.0 and log.encode_s >= 0.0
        (msg,) = list(fleet.waiting())
        header, update = wire.decode(msg.payload)
        assert header.semantics == "dir" and update.compressor == compressor
        # 1/L (to rounding of the row-weighted mean), the EF21 factor unused
        assert engine.gamma() == pytest.approx(1.0 / agent.smoothness, rel=1e-15)
        fleet.handle(msg, strict=True)
        assert engine.version == 1
        x1 = engine.x.copy()

    f0, g = model.loss_grad(x0, data)
    f1 = model.loss(x1, data)
    q = _direction(update, g)
    gq, bq = float(g @ q), _bound(model, data, q)
    guaranteed = 0.0 if bq == 0.0 else gq * gq / (2.0 * bq)
    rounding = 1e-12 * max(1.0, abs(f0))
    assert f1 <= f0 + rounding  # along the chosen direction the objective never rises
    # and by at least the bound's decrease (wire rounding: float32 costs ~1e-7 relative)
    slack = 1e-4 if dtype == "float32" else 1e-9
    assert f0 - f1 >= guaranteed * (1.0 - slack) - rounding
    if bq > 0.0:  # the engine moved x by t q, t = <g, q> / B(q)
        np.testing.assert_allclose(x0 - x1, (gq / bq) * q, rtol=slack * 10, atol=1e-12)


# ------------------------------------------------------------------ the wire
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("compressor", ["dense", "topk", "signtopk"])
def test_dir_semantics_round_trips_on_the_wire(compressor: str, dtype: str) -> None:
    g = np.random.default_rng(3).standard_normal(50)
    u = compress(g, compressor, 7, value_dtype=dtype)  # type: ignore[arg-type]
    u = Update(u.compressor, u.d, u.indices, u.values, u.scale, "dir")
    blob = wire.encode(u, job="j", agent="a", round=3, seq=4, value_dtype=dtype)  # type: ignore[arg-type]
    assert SEMANTICS.index("dir") == 3
    assert blob[5] >> 2 == 3  # flags bits 2-3 carry code 3
    for header, got in (wire.decode(blob), decode_many([blob])[0]):  # type: ignore[misc]
        assert header.semantics == "dir" and got.semantics == "dir"
        np.testing.assert_array_equal(got.to_dense(), u.to_dense())


# ------------------------------------------------------------------ admission
def _hello(agent: str, **fields: Any) -> tuple[str, bytes]:
    base: dict[str, Any] = dict(
        job=JOB, agent=agent, d=10, rows=5, smoothness=2.0, model="logreg", compressor="topk"
    )
    base.update(fields)
    return topics.hello(JOB, agent), messages.dump(messages.Hello(**base))


@pytest.mark.parametrize("first,second", [("ef21", "dir"), ("dir", "ef21")])
def test_admission_refuses_mixing_dir_with_ef21(first: str, second: str) -> None:
    engine = RoundEngine(EngineConfig(job=JOB, d=10))
    assert engine.handle(*_hello("a", semantics=first), 0.0).reason is None
    assert engine.handle(*_hello("b", semantics=second), 0.0).reason == "wrong_semantics"
    assert list(engine.agents) == ["a"]


def test_dir_mixes_with_plain_and_steps_exactly_one_over_l() -> None:
    engine = RoundEngine(EngineConfig(job=JOB, d=10, ef21_step_factor=0.25))
    assert engine.handle(*_hello("a", semantics="dir", smoothness=3.0), 0.0).reason is None
    assert engine.handle(*_hello("b", semantics="plain", smoothness=3.0), 0.0).reason is None
    assert engine.family == "mean" and engine.gamma() == 1.0 / 3.0


@pytest.mark.parametrize(
    "config,fields",
    [
        ({"step_size": 0.1}, {}),  # dir is scaled for 1/L: a configured step would break it
        ({}, {"compressor": "randk"}),  # the step scales dense/topk/signtopk updates only
    ],
)
def test_admission_refuses_dir_where_the_step_cannot_hold(
    config: dict[str, Any], fields: dict[str, Any]
) -> None:
    engine = RoundEngine(EngineConfig(job=JOB, d=10, **config))
    effects = engine.handle(*_hello("a", semantics="dir", **fields), 0.0)
    assert effects.reason == "wrong_semantics" and not engine.agents


# ------------------------------------------------------------------ the simulator
def test_agent_config_refuses_directional_where_it_is_undefined() -> None:
    bads: list[dict[str, Any]] = [
        {"compressor": "randk"},
        {"feedback": "ef21"},
        {"policy": "fixed:5"},
        {"curvature": "local"},
    ]
    for bad in bads:
        with pytest.raises(ValueError, match="curvature"):
            AgentConfig(job=JOB, agent_id="a", **{"curvature": "directional", **bad})


@pytest.mark.parametrize(
    "spec,compressor",
    [("dense+dir", "dense"), ("cat-topk+dir", "topk"), ("cat-signtopk+dir", "signtopk")],
)
def test_simulate_dir_methods_parse_and_run_and_never_rise(spec: str, compressor: str) -> None:
    method = parse_method(spec)
    assert (method.compressor, method.policy, method.feedback, method.curvature) == (
        compressor,
        "cat",
        "none",
        "directional",
    )
    problem = build_problem(
        data_path=None,
        rows=150,
        features=400,
        seed=1,
        model_kind="logreg",
        l2=1e-2,
        split="iid",
        optimum_tol=1e-12,
    )
    fleet = build_fleet(problem, 1, ["paper_payload_bits"])
    result = run_method(problem, fleet, method, targets=(1e-1,), max_rounds=300)
    assert result.models_equal and 1e-1 in result.reached
    subopt = np.array(result.trace.subopt)
    assert np.all(np.diff(subopt) <= 1e-9), "one agent: the directional step never rises"


@pytest.mark.parametrize(
    "spec", ["cat-topk+ef21+dir", "cat-topk+ef+dir", "topk:5+dir", "cat-randk+dir"]
)
def test_simulate_refuses_undefined_dir_methods(spec: str) -> None:
    with pytest.raises(ValueError, match="dir"):
        parse_method(spec)
