"""The JSON line ``edge-agent run`` ends with: what the agent did and spent, both ways."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_agent.agent.loop import Agent

__all__ = ["run_summary"]


def run_summary(agent_id: str, agent: Agent) -> dict[str, Any]:
    """The JSON line ``edge-agent run`` ends with: progress, and the ledger both ways.

    ``up``/``down``/``total`` are :class:`edge_agent.links.cost.Cost` dicts (what the agent sent,
    received, and their sum, priced on its own profile); ``updates``, ``bytes_on_air``,
    ``bytes_on_air_down``, ``silence_s`` as in ``CostLedger.summary``; ``size_bytes`` is the
    uplink's bytes, kept for older readers; ``gradient_rows`` the rows whose gradient it
    evaluated and ``gradient_passes`` the same in passes over its shard.
    """
    return {
        "agent": agent_id,
        "finished": agent.finished,
        "rounds": agent.rounds,
        "version": agent.version,
        **agent.ledger.summary(),
        "size_bytes": agent.ledger.size_bytes,
        "dropped": agent.counters.dropped,
        # rows whose gradient it evaluated, and as passes over its shard (minibatches read less)
        "gradient_rows": agent.gradient_rows,
        "gradient_passes": agent.gradient_rows / max(1, agent.data.n_rows),
        "timings_s": agent.timings_s,
        "peak_rss_mb": _peak_rss_mb(),
    }


def _peak_rss_mb() -> float | None:
    """Peak resident memory of this process (VmHWM; ru_maxrss would include a forking parent's)."""
    with contextlib.suppress(OSError):  # not Linux: no figure rather than a wrong one
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return None
