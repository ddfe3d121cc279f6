"""Profiles from measurements: the affine fit and the ``measured``/``affine`` constructors
that ``edge-agent calibrate`` writes with."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from edge_agent.links.cost import Metric
from edge_agent.links.profiles import CostProfile, parse_profile

__all__ = ["affine_profile", "fit_affine", "measured_profile"]


def fit_affine(
    sizes_bytes: Sequence[int] | NDArray[Any], values: Sequence[float] | NDArray[Any]
) -> tuple[float, float]:
    """Least-squares ``(a, b)`` with ``a, b >= 0`` so that ``values ≈ a + b * sizes_bytes``.

    Units: ``a`` in the values' unit, ``b`` in that unit per byte. The constraint keeps
    the fit a valid (nonnegative, nondecreasing) cost: when the unconstrained fit has a
    negative coefficient, the best fit on the boundary is returned. Needs at least two
    distinct sizes.
    """
    x = np.asarray(sizes_bytes, dtype=np.float64).reshape(-1)
    y = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"sizes and values differ in length: {x.size} vs {y.size}")
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("fit_affine needs at least two distinct sizes")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("fit_affine needs finite sizes and values")
    design = np.column_stack([np.ones_like(x), x])
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    if a >= 0 and b >= 0:
        return float(a), float(b)
    # Constrained optimum lies on a boundary: a = 0 (line through the origin) or b = 0.
    xx = float(x @ x)
    candidates = [(0.0, max(float(x @ y) / xx, 0.0)), (max(float(y.mean()), 0.0), 0.0)]
    residual = [float(np.sum((ca + cb * x - y) ** 2)) for ca, cb in candidates]
    return candidates[int(np.argmin(residual))]


def _build(fields: dict[str, Any], source: str) -> CostProfile:
    return parse_profile({k: v for k, v in fields.items() if v is not None}, source)


def measured_profile(
    name: str,
    points: Iterable[Mapping[str, float]],
    objective: Metric,
    *,
    description: str = "",
    sources: Sequence[str] = (),
    estimated: Sequence[str] = (),
    duty_cycle: float | None = None,
    notes: str | None = None,
    message_overhead_bytes: int = 0,
    max_payload_bytes: int | None = None,
    per_packet_overhead_bytes: int = 0,
) -> CostProfile:
    """A validated ``measured`` profile from points ``{"size_bytes": n, "<metric>": value}``.

    ``size_bytes`` are link bytes (application bytes + ``message_overhead_bytes``);
    a calibration that measures whole messages through the real stack has the framing
    inside its values and keeps ``message_overhead_bytes`` at 0. Raises ProfileError.
    """
    return _build(
        {
            "kind": "measured",
            "name": name,
            "description": description or f"measured cost profile {name}",
            "objective": objective,
            "sources": list(sources),
            "estimated": list(estimated),
            "duty_cycle": duty_cycle,
            "notes": notes,
            "message_overhead_bytes": message_overhead_bytes,
            "max_payload_bytes": max_payload_bytes,
            "per_packet_overhead_bytes": per_packet_overhead_bytes,
            "points": [dict(p) for p in points],
        },
        f"<measured profile {name}>",
    )


def affine_profile(
    name: str,
    coefficients: Mapping[str, tuple[float, float]],
    objective: Metric,
    *,
    description: str = "",
    sources: Sequence[str] = (),
    estimated: Sequence[str] = (),
    duty_cycle: float | None = None,
    notes: str | None = None,
    message_overhead_bytes: int = 0,
    max_payload_bytes: int | None = None,
    per_packet_overhead_bytes: int = 0,
) -> CostProfile:
    """A validated ``affine`` profile from ``{metric: (a, b)}`` (e.g. from fit_affine).

    Raises ProfileError.
    """
    return _build(
        {
            "kind": "affine",
            "name": name,
            "description": description or f"affine cost profile {name}",
            "objective": objective,
            "sources": list(sources),
            "estimated": list(estimated),
            "duty_cycle": duty_cycle,
            "notes": notes,
            "message_overhead_bytes": message_overhead_bytes,
            "max_payload_bytes": max_payload_bytes,
            "per_packet_overhead_bytes": per_packet_overhead_bytes,
            "coefficients": {m: {"a": a, "b": b} for m, (a, b) in coefficients.items()},
        },
        f"<affine profile {name}>",
    )
