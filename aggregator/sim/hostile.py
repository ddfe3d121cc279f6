"""A hostile agent for ``aggregator simulate --hostile S``: one agent's updates, scaled.

The agent computes, compresses and sends its update as usual (its own error feedback
and model replica are untouched); on its way to the engine every value is multiplied by
``S`` (for sign-based updates: the common magnitude). That is the cheapest attack an
authenticated but compromised device can mount, and one the update guard lets through
as long as ``|S|`` stays below ``AGG_UPDATE_NORM_FACTOR`` (docs/operating.md), which is
what ``AGG_AGGREGATION`` is for.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from aggregator.sim.harness import FleetHarness
from edge_agent.protocol import topics, wire


def scaled(blob: bytes, factor: float) -> bytes:
    """The update ``blob`` with its values (or its sign scale) multiplied by ``factor``,
    same header, same value dtype."""
    header, update = wire.decode(blob)
    if update.scale is not None:
        update = replace(update, scale=update.scale * factor)
    else:
        values = np.asarray(update.values, dtype=np.float64) * factor
        update = replace(update, values=values.astype(update.values.dtype))
    dtype = str(np.asarray(update.values).dtype) if update.scale is None else None
    return wire.encode(
        update,
        job=header.job,
        agent=header.agent,
        round=header.round,
        seq=header.seq,
        value_dtype=dtype,  # type: ignore[arg-type]
    )


def make_hostile(harness: FleetHarness, job: str, agent: str, factor: float) -> None:
    """From now on the engine of ``harness`` receives ``agent``'s updates scaled by
    ``factor`` (everything else passes unchanged)."""
    harness.tamper(topics.update(job, agent), lambda blob: scaled(blob, factor))
