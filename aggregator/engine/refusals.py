"""What the engine refused, and telling an agent that its hello or update was.

:class:`Refusals` is the only owner of the rejection counters (one per reason of
:data:`~aggregator.engine.admission.REJECT_REASONS`, ``/status`` ``rejected``; it exports
and restores them itself, the checkpoint's ``rejected``): every refused message is counted
there (:meth:`Refusals.refuse`), logged once per reason, and answered when it concerns
the sender.

The refusal: control ``refused``, rate-limited.

A rejection that concerns the sender's own settings or state (:data:`REFUSED_REASONS`) is
answered on the job's control topic with ``{"cmd": "refused", "agent": id, "reason": ...,
"detail": ...}`` (:class:`edge_agent.protocol.messages.Control`), at most once per (agent, reason)
per :data:`REFUSAL_INTERVAL_S` seconds of engine time: every agent of the job receives
control messages, and on a LPWAN downlink each one costs all of them. The rate limit is
kept in memory only (a restarted aggregator may tell an agent once more). A refusal that
concerns the agent's settings (:data:`edge_agent.protocol.messages.REFUSAL_FATAL`) also carries the
job's settings addressed to the agent (:func:`job_info`), so that it gives up at once.

The job's settings (:class:`edge_agent.protocol.jobinfo.JobInfo`: job, d, model, feedback, family,
compressors) are published retained on ``cat/<job>/job`` (:func:`job_info`, part of
:meth:`aggregator.engine.rounds.RoundEngine.state_controls`: on start and in answer to a hello).

:class:`RefusedAgents` remembers the last :data:`MAX_REFUSED_AGENTS` distinct agents
refused for one of :data:`RECORDED_REASONS` (``/status`` ``refused_agents``): a refused
hello registers nothing, so without it a misconfigured agent would be invisible. An agent
leaves the record once a hello of its is accepted. In memory only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

from aggregator.engine.admission import REJECT_REASONS
from aggregator.engine.downlink.outbound import Outbound, addressed, control_message
from aggregator.engine.types import EngineConfig
from edge_agent.numerics.compressors import COMPRESSOR_IDS
from edge_agent.protocol import jobinfo, messages, topics

#: Rejections the sender is told about: its job settings (d, model, compressor, update
#: semantics), an index out of range, or an update before an accepted hello
#: (``unknown_agent``, e.g. after a refused hello: the agent then says hello again), or a
#: cost profile the aggregator cannot price (``unknown_profile``: it keeps saying hello).
#: ``ef21_reset`` has its own answer, control ``reset`` (the agent counts it as refused).
REFUSED_REASONS: Final[frozenset[str]] = messages.REFUSAL_FATAL | {
    "unknown_agent",
    "out_of_bounds",
    "unknown_profile",
}
#: at most one ``refused`` per (agent, reason) per this many seconds of engine time
REFUSAL_INTERVAL_S: Final = 30.0
#: (agent, reason) pairs remembered for the rate limit (bounded: agent ids come from topics)
MAX_TRACKED: Final = 4096
_DETAIL_CHARS: Final = 300
#: refusals that put the agent on the ``refused_agents`` record (not routine ones such as
#: ``duplicate`` or ``stale``)
RECORDED_REASONS: Final[frozenset[str]] = REFUSED_REASONS | {"too_many_agents"}
#: distinct agents the record keeps (the most recently refused)
MAX_REFUSED_AGENTS: Final = 100

log = logging.getLogger("aggregator.engine.rounds")


def job_info(config: EngineConfig) -> Outbound | None:
    """The job's settings as a retained JSON message on ``cat/<job>/job``; None when the
    job's feedback is ``any`` (the library default, today's behaviour: the family is not
    known until the first hello, and engines built without it announce nothing)."""
    if config.feedback == "any":
        return None
    local_steps, comm_prob = config.local_schedule
    info = jobinfo.JobInfo(
        job=config.job,
        d=config.d,
        model=config.model,
        feedback=config.feedback,
        family=jobinfo.family_of(config.feedback),
        compressors=tuple(COMPRESSOR_IDS),
        batch_size=config.batch_size,
        local_steps=local_steps,
        comm_prob=comm_prob,
    )
    return Outbound(topics.job_info(config.job), info.dump(), retain=True)


@dataclass
class RefusedAgent:
    """One refused agent: its last reason (a settings refusal is not replaced by ``unknown_agent``), how many refusals, the last one's time (the
    engine's clock: Unix seconds in the service)."""

    agent: str
    reason: str
    count: int
    last: float


class RefusedAgents:
    """The last ``cap`` distinct refused agents (bounded: agent ids come from topics)."""

    def __init__(self, cap: int = MAX_REFUSED_AGENTS) -> None:
        self.cap = cap
        self._by_agent: dict[str, RefusedAgent] = {}  # least recently refused first

    def record(self, agent: str, reason: str, now: float) -> None:
        rec = self._by_agent.pop(agent, None) or RefusedAgent(agent, reason, 0, now)
        # a settings refusal names the fix; what the refused agent sends next (a request
        # before any accepted hello: unknown_agent) must not hide it
        if not (rec.reason in messages.REFUSAL_FATAL and reason == "unknown_agent"):
            rec.reason = reason
        rec.count, rec.last = rec.count + 1, now
        self._by_agent[agent] = rec
        while len(self._by_agent) > self.cap:
            del self._by_agent[next(iter(self._by_agent))]

    def forget(self, agent: str) -> None:
        """``agent`` was accepted: it is no longer a refused one."""
        self._by_agent.pop(agent, None)

    def listing(self) -> list[dict[str, Any]]:
        """``[{agent, reason, count, last}]``, the most recently refused first."""
        return [asdict(r) for r in reversed(self._by_agent.values())]


class Refusals:
    """The rejection counters, the rate limiter and the message. Pure: the caller passes
    ``now`` (seconds)."""

    def __init__(
        self,
        job: str,
        interval_s: float = REFUSAL_INTERVAL_S,
        *,
        announce: Outbound | None = None,
    ) -> None:
        self.job = job
        self.interval_s = interval_s
        #: the job's settings (:func:`job_info`), addressed along with a fatal refusal
        self.announce = announce
        self.refused_agents = RefusedAgents()
        self._told_at: dict[tuple[str, str], float] = {}
        #: refused messages by reason (every reason of REJECT_REASONS, zeros included)
        self.counts: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        self._logged: set[str] = set()  # reasons logged already

    def refuse(
        self, reason: str, detail: str, agent: str | None, now: float | None, version: int
    ) -> tuple[Outbound, ...]:
        """Count a refused message (logged once per reason); with ``agent`` and ``now`` (a
        hello or update of ``agent``), what to tell it (:meth:`answer`), else nothing."""
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("rejected a message: %s%s (logged once per reason)", reason,
                        f" ({detail})" if detail else "")  # fmt: skip
        if agent is None or now is None:
            return ()
        return self.answer(agent, reason, detail, now, version)

    def export(self) -> dict[str, int]:
        """The checkpoint's ``rejected``: the counters."""
        return dict(self.counts)

    def restore(self, counts: Mapping[str, int]) -> None:
        """Load :meth:`export` (reasons added since count from zero)."""
        self.counts = {**dict.fromkeys(REJECT_REASONS, 0), **counts}

    def answer(
        self, agent: str, reason: str, detail: str, now: float, version: int
    ) -> tuple[Outbound, ...]:
        """Record the refusal; what to tell ``agent``: control ``refused`` (:meth:`tell`,
        rate-limited) and, with a reason about its settings, the job's settings addressed
        to it alone, every time (an agent that reads them gives up; the hellos that ask are
        spaced by the agent's own back-off). Within the rate limit the refusal goes with
        those settings too, addressed to the agent alone (the fleet pays nothing for it): an
        agent whose first answer was lost (its ZeroMQ subscription not yet up when it went
        out) still hears why before it reads the settings and gives up."""
        if reason in RECORDED_REASONS:
            self.refused_agents.record(agent, reason, now)
        told = self.tell(agent, reason, detail, now, version)
        if self.announce is None or reason not in messages.REFUSAL_FATAL:
            return () if told is None else (told,)
        if told is None:
            told = addressed(self._refusal(agent, reason, detail, version), self.job, agent)
        return (told, addressed(self.announce, self.job, agent))

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
        return self._refusal(agent, reason, detail, version)

    def _refusal(self, agent: str, reason: str, detail: str, version: int) -> Outbound:
        """Control ``refused`` for ``agent`` on the job's control topic."""
        ctl = messages.Control(
            cmd="refused",
            agent=agent,
            reason=reason,
            detail=detail[:_DETAIL_CHARS],
            version=version,
        )
        return control_message(self.job, ctl)
