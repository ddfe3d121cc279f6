"""Telling an agent that its hello or update was refused: control ``refused``, rate-limited.

A rejection that concerns the sender's own settings or state (:data:`REFUSED_REASONS`) is
answered on the job's control topic with ``{"cmd": "refused", "agent": id, "reason": ...,
"detail": ...}`` (:class:`edge_agent.messages.Control`), at most once per (agent, reason)
per :data:`REFUSAL_INTERVAL_S` seconds of engine time: every agent of the job receives
control messages, and on a LPWAN downlink each one costs all of them. The rate limit is
kept in memory only (a restarted aggregator may tell an agent once more).
"""

from __future__ import annotations

from typing import Final

from aggregator.outbound import Outbound, control_message
from edge_agent import messages

#: Rejections the sender is told about: its job settings (d, model, compressor, update
#: semantics), an index out of range, or an update before an accepted hello
#: (``unknown_agent``, e.g. after a refused hello: the agent then says hello again).
#: ``ef21_reset`` has its own answer, control ``reset`` (the agent counts it as refused).
REFUSED_REASONS: Final[frozenset[str]] = messages.REFUSAL_FATAL | {
    "unknown_agent",
    "out_of_bounds",
}
#: at most one ``refused`` per (agent, reason) per this many seconds of engine time
REFUSAL_INTERVAL_S: Final = 30.0
#: (agent, reason) pairs remembered for the rate limit (bounded: agent ids come from topics)
MAX_TRACKED: Final = 4096
_DETAIL_CHARS: Final = 300


class Refusals:
    """The rate limiter and the message. Pure: the caller passes ``now`` (seconds)."""

    def __init__(self, job: str, interval_s: float = REFUSAL_INTERVAL_S) -> None:
        self.job = job
        self.interval_s = interval_s
        self._told_at: dict[tuple[str, str], float] = {}

    def tell(
        self, agent: str, reason: str, detail: str, now: float, version: int
    ) -> Outbound | None:
        """The control message for ``agent``, or None: the reason does not concern it, or
        it was told the same within the interval."""
        if reason not in REFUSED_REASONS:
            return None
        key = (agent, reason)
        last = self._told_at.get(key)
        if last is not None and 0.0 <= now - last < self.interval_s:
            return None
        if len(self._told_at) >= MAX_TRACKED:  # forget the pairs told long ago (or all)
            old = [k for k, t in self._told_at.items() if now - t >= self.interval_s]
            for k in old or list(self._told_at):
                del self._told_at[k]
        self._told_at[key] = now
        ctl = messages.Control(
            cmd="refused",
            agent=agent,
            reason=reason,
            detail=detail[:_DETAIL_CHARS],
            version=version,
        )
        return control_message(self.job, ctl)
