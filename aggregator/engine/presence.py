"""What a status message changes in the engine's view of an agent (state and liveness).

A status that changes nothing is not journalled (an agent, or a hostile client,
re-announcing the state it already has must not grow the disk). "Nothing" must then be
exact, or the journal replay would rebuild a different state: a repeated ``online``
refreshes ``last_seen`` only once at least ``REFRESH_FRACTION`` of the liveness timeout
has passed since the value the engine holds, and only that refresh is journalled. An
agent kept alive by status messages alone is therefore seen at most that fraction of the
timeout earlier than it last spoke (agents normally keep alive with hellos and updates).
"""

from __future__ import annotations

from typing import Final

from aggregator.engine.types import AgentInfo

#: a repeated ``online`` status refreshes ``last_seen`` once per this part of the timeout
REFRESH_FRACTION: Final = 0.1


def apply_status(info: AgentInfo, state: str, now: float, liveness_timeout_s: float) -> bool:
    """Apply an agent's announced ``state`` at ``now`` (seconds) to ``info``; return
    whether anything changed (then the message must be journalled, else nothing did)."""
    live = state == "online"
    refresh = live and now - info.last_seen >= REFRESH_FRACTION * liveness_timeout_s
    if state == info.state and live == info.live and not refresh:
        return False
    info.state, info.live = state, live
    if live:
        info.last_seen = max(info.last_seen, now)
    return True
