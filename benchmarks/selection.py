"""CAT selection: time of ``selection.select`` vs one ``np.argpartition`` of |g| (same run),
correctness against the sort-based ``select_exhaustive``, and the hybrid heuristic's saving.

    python benchmarks/selection.py [--quick] [--big]

(``--quick``: d in {10^3, 10^5, 10^6}, one gradient, 5 repeats: what ``make bench-check`` runs.)

One JSON line per (d, profile, gradient, compressor), d in {10^3 .. 10^6} (10^7 with --big):

* ``t``: T* from ``select``; ``t_exhaustive`` and ``exact`` (must be true) from
  ``select_exhaustive`` (skipped above d = 10^6); ``widenings``: threshold lowerings;
* ``select_s`` (median of repeats), ``argpartition_s`` (one ``np.argpartition(|g|, d - T*)``
  on a precomputed |g|, the cost of finding the top-T* entries for a *known* T*),
  ``ratio_to_argpartition``: the median of select / argpartition over pairs of samples
  taken alternately (so a change of load moves both alike); ``exhaustive_s`` and
  ``speedup_vs_exhaustive``;
* ``target_ok``: at d = 10^6 with T* <= d/100, select must cost <= 3 argpartitions.

Gradients: ``gauss_x_pareto`` (standard normal times (1 + Pareto(1.5)), heavy tails) and
``gauss`` (light tails). Profiles: inline ones (payload bits, an affine link, a packet link,
and ``big_fixed``: a per-message fixed cost sized so that T* is about d/100) and, when present,
the shipped ``cost_profiles/`` lorawan_eu868_dr5_sf7, paper_packet_model, wifi_esp32_mqtt_tcp.

Then one line per d for the hybrid heuristic: selection time per round of
``HybridPolicy(every=200)`` over 400 rounds vs the ``cat`` policy every round.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from _common import emit, environment, median_ratio, median_seconds, parser

from edge_agent.numerics.selection import (
    HybridPolicy,
    Policy,
    SupportsObjectiveCost,
    make_price,
    select,
    select_exhaustive,
)
from edge_agent.protocol.wire import encoded_size

BENCH = "selection"
ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("lorawan_eu868_dr5_sf7", "paper_packet_model", "wifi_esp32_mqtt_tcp")
EXHAUSTIVE_MAX_D = 10**6
JOB, AGENT = "bench", "pi-01"
FloatArray = npt.NDArray[np.float64]


# ---------------------------------------------------------------- inline cost profiles


@dataclass(frozen=True)
class PayloadBits:
    """The paper's payload model: 8 bits per application byte, nothing else."""

    name: str = "inline_payload_bits"

    def objective_cost(self, size_bytes: npt.NDArray[np.int64]) -> FloatArray:
        return 8.0 * np.asarray(size_bytes, dtype=np.float64)


@dataclass(frozen=True)
class Affine:
    """cost = a + b * bytes (e.g. ZeroMQ over TCP, fitted)."""

    a: float
    b: float
    name: str = "inline_affine"

    def objective_cost(self, size_bytes: npt.NDArray[np.int64]) -> FloatArray:
        return self.a + self.b * np.asarray(size_bytes, dtype=np.float64)


@dataclass(frozen=True)
class Packets:
    """A packet link: per-message cost plus a cost per packet of ``mtu`` bytes."""

    mtu: int
    per_message: float
    per_packet: float
    name: str = "inline_packets"

    def objective_cost(self, size_bytes: npt.NDArray[np.int64]) -> FloatArray:
        packets = -(-np.asarray(size_bytes, dtype=np.int64) // self.mtu)
        return self.per_message + self.per_packet * packets.astype(np.float64)


def big_fixed(g: FloatArray, compressor: str, t_target: int) -> Affine:
    """An affine cost whose fixed part puts T* near ``t_target`` for this gradient.

    The ratio gain(T) / (F + size(T)) has its maximum where gain'(T) (F + size(T)) =
    gain(T) size'(T); solve for F at T = t_target (gain concave, so the ratio is unimodal).
    """
    mags = -np.sort(-np.abs(g))
    d = g.size
    t = t_target
    size_t = float(encoded_size(compressor, d=d, t=t, job=JOB, agent=AGENT, round=0, seq=0))
    slope = (
        float(encoded_size(compressor, d=d, t=2 * t, job=JOB, agent=AGENT, round=0, seq=0)) - size_t
    ) / t
    if compressor == "topk":
        gain, dgain = float(np.dot(mags[:t], mags[:t])), float(mags[t - 1] ** 2)
    else:
        a1 = float(mags[:t].sum())
        gain, dgain = a1 * a1 / t, (2 * a1 * mags[t - 1] * t - a1 * a1) / (t * t)
    fixed = max(0.0, gain * slope / max(dgain, 1e-300) - size_t)
    return Affine(a=fixed, b=1.0, name="inline_big_fixed")


def shipped_profiles() -> list[tuple[str, SupportsObjectiveCost]]:
    try:
        from edge_agent.links.catalog import load_profile
    except ImportError:
        return []
    out: list[tuple[str, SupportsObjectiveCost]] = []
    for name in SHIPPED:
        path = ROOT / "cost_profiles" / f"{name}.json"
        if path.exists():
            out.append((name, load_profile(path)))
    return out


# ---------------------------------------------------------------- gradients


def gradient(kind: str, d: int, rng: np.random.Generator) -> FloatArray:
    g = rng.standard_normal(d)
    if kind == "gauss_x_pareto":
        g *= 1.0 + rng.pareto(1.5, d)
    return g


# ---------------------------------------------------------------- cases


def one_case(
    d: int,
    g: FloatArray,
    grad: str,
    compressor: str,
    pname: str,
    profile: SupportsObjectiveCost,
    repeats: int,
) -> dict[str, Any]:
    price = make_price(profile, compressor, d=d, job=JOB, agent=AGENT)
    sel = select(g, compressor, price)
    absg = np.abs(g)
    kth = d - max(1, sel.t)
    ratio, t_select, t_part = median_ratio(
        lambda: select(g, compressor, price), lambda: np.argpartition(absg, kth), repeats=repeats
    )
    rec: dict[str, Any] = {
        "case": "select",
        "d": d,
        "profile": pname,
        "gradient": grad,
        "compressor": compressor,
        "t": sel.t,
        "t_over_d": sel.t / d,
        "widenings": sel.widenings,
        "select_s": t_select,
        "argpartition_s": t_part,
        "ratio_to_argpartition": ratio,
    }
    if d <= EXHAUSTIVE_MAX_D:
        ex = select_exhaustive(g, compressor, price)
        t_ex = median_seconds(
            lambda: select_exhaustive(g, compressor, price), repeats=max(1, repeats // 3)
        )
        rec.update(
            {
                "t_exhaustive": ex.t,
                "exact": ex.t == sel.t and math.isclose(ex.ratio, sel.ratio, rel_tol=1e-9),
                "exhaustive_s": t_ex,
                "speedup_vs_exhaustive": t_ex / t_select,
            }
        )
    if d == 10**6 and sel.t <= d // 100:
        rec["target_ok"] = t_select <= 3.0 * t_part
    return rec


def blas_probe(g: FloatArray, samples: int = 15) -> dict[str, Any]:
    """select() computes ||g||^2 with np.dot, which goes to BLAS (possibly multithreaded).

    Time it the way select meets it -- after other work, with the BLAS threads idle -- next
    to np.einsum (numpy's own loop, single thread), so a slow select can be attributed.
    """

    def cold(fn: Any) -> float:
        out = []
        for _ in range(samples):
            np.abs(g)
            time.sleep(0.002)
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
        return float(np.median(out))

    dot = cold(lambda: np.dot(g, g))
    ein = cold(lambda: np.einsum("i,i->", g, g))
    env = {
        k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    }
    return {
        "case": "blas_probe",
        "d": g.size,
        "np_dot_s": dot,
        "einsum_s": ein,
        "dot_vs_einsum": dot / ein,
        "env": env,
    }


def hybrid_case(
    d: int, rounds: int, rng: np.random.Generator, profile: SupportsObjectiveCost, pname: str
) -> dict[str, Any]:
    bank = [gradient("gauss_x_pareto", d, rng) for _ in range(8)]
    price = make_price(profile, "topk", d=d, job=JOB, agent=AGENT)

    def run(policy: Policy) -> tuple[float, list[int]]:
        ts = []
        start = time.perf_counter()
        for r in range(rounds):
            ts.append(policy.choose(bank[r % len(bank)], "topk", price, r).t)
        return (time.perf_counter() - start) / rounds, ts

    cat_s, cat_t = run(Policy("cat"))
    hyb_s, hyb_t = run(HybridPolicy("hybrid", every=200))
    return {
        "case": "hybrid",
        "d": d,
        "profile": pname,
        "rounds": rounds,
        "every": 200,
        "cat_per_round_s": cat_s,
        "hybrid_per_round_s": hyb_s,
        "speedup": cat_s / hyb_s,
        "solves": math.ceil(rounds / 200),
        "rounds_with_same_t": sum(a == b for a, b in zip(cat_t, hyb_t, strict=True)),
    }


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--big", action="store_true", help="also d = 10^7 (no exhaustive check)")
    args = p.parse_args()
    emit(BENCH, {"case": "environment", **environment()})
    rng = np.random.default_rng(2003_06377)
    dims = [10**3, 10**4, 10**5, 10**6] + ([10**7] if args.big else [])
    if args.quick:
        dims = [10**3, 10**5, 10**6]
    repeats = 5 if args.quick else 7
    inline: list[tuple[str, SupportsObjectiveCost]] = [
        ("inline_payload_bits", PayloadBits()),
        ("inline_affine_zmq", Affine(a=2000.0, b=1.0)),
        ("inline_packets_250B", Packets(mtu=250, per_message=2.0, per_packet=1.0)),
    ]
    profiles = inline + shipped_profiles()
    failures: list[dict[str, Any]] = []
    for d in dims:
        for grad in ("gauss_x_pareto", "gauss") if not args.quick else ("gauss_x_pareto",):
            g = gradient(grad, d, rng)
            if grad == "gauss_x_pareto":
                emit(BENCH, blas_probe(g))
            for compressor in ("topk", "signtopk"):
                cases = [
                    *profiles,
                    ("inline_big_fixed", big_fixed(g, compressor, max(1, d // 100))),
                ]
                for pname, prof in cases:
                    rec = one_case(d, g, grad, compressor, pname, prof, repeats)
                    emit(BENCH, rec)
                    if rec.get("exact") is False or rec.get("target_ok") is False:
                        failures.append(rec)
    for d in [10**5, 10**6] if not args.quick else [10**4]:
        rounds = 400 if not args.quick else 40
        for pname, prof in [
            ("inline_packets_250B", Packets(mtu=250, per_message=2.0, per_packet=1.0))
        ]:
            emit(BENCH, hybrid_case(d, rounds, rng, prof, pname))
    emit(
        BENCH,
        {
            "case": "summary",
            "failures": len(failures),
            "failed": [(f["d"], f["profile"], f["gradient"], f["compressor"]) for f in failures],
        },
    )


if __name__ == "__main__":
    main()
