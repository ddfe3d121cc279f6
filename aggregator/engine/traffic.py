"""Who receives what the aggregator publishes, and what each agent's link carried.

The engine (:class:`aggregator.engine.rounds.RoundEngine`) drives one :class:`Traffic` per job:

* **Answers to one agent** (:meth:`Traffic.answer`): what an agent misses after a request,
  a rejoining hello, a stale or an already-applied update goes on its own topic
  ``cat/<job>/to/<agent>`` (:func:`aggregator.engine.outbound.addressed`), never on the job-wide
  ``model``/``delta`` topics, so the rest of the fleet neither receives nor pays for it.
  The merged catch-up steps (a few update sizes) go every time; a full model snapshot
  (8*d bytes) goes at most once per agent per :data:`SNAPSHOT_ANSWER_INTERVAL_S` seconds
  of engine time. A request inside the interval is answered with nothing (counted in
  :attr:`Traffic.withheld`): the agent asks again (it re-says hello with back-off while it
  has no model, and requests again on its next version gap). The rate limit is kept in
  memory only, like :mod:`aggregator.engine.refusals`.
* **Downlink charging** (:func:`charge_downlink`): a job-wide message costs every live
  agent, one addressed to an agent costs that agent only.
* **Uplink, every message** (:meth:`Traffic.sent`): each message a known agent sent is
  priced on its profile's uplink into :attr:`AgentInfo.sent`, next to the accepted
  updates' ``spend``.
* **Published, by kind** (:attr:`Traffic.published`): messages and bytes of everything
  published, counted once per message (not per transport), by
  :data:`aggregator.engine.outbound.PUBLISHED_KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, Protocol

from aggregator.engine.accounting import Pricer
from aggregator.engine.broadcast import downlink_interval_s
from aggregator.engine.outbound import PUBLISHED_KINDS, Outbound, addressed
from aggregator.engine.types import AgentInfo
from edge_agent.links.cost import Cost
from edge_agent.protocol import topics

if TYPE_CHECKING:
    from aggregator.engine.rounds import RoundEngine

#: at most one full-model snapshot answer per agent per this many seconds of engine time
SNAPSHOT_ANSWER_INTERVAL_S: Final = 2.0
#: agents remembered for the rate limit (bounded: agent ids come from topics)
MAX_TRACKED: Final = 4096
_PRICE_CACHE_MAX: Final = 4096


class Published(Protocol):
    """What a publisher hands over (an :class:`Outbound`, or the simulator's stand-in)."""

    @property
    def topic(self) -> str: ...

    @property
    def payload(self) -> bytes: ...

    @property
    def retain(self) -> bool: ...


def as_outbound(o: Published) -> Outbound:
    """``o`` itself when it is an :class:`Outbound`, else one with its topic, payload and the
    addressee its topic names (``cat/<job>/to/<agent>``)."""
    if isinstance(o, Outbound):
        return o
    try:
        parsed = topics.parse(o.topic)
    except ValueError:
        parsed = None
    target = parsed.agent if parsed is not None and parsed.kind == topics.TO_AGENT else None
    return Outbound(o.topic, o.payload, o.retain, target=target)


class Traffic:
    """Addressing, rate limit and counters of one job. Pure: callers pass ``now``."""

    def __init__(
        self, job: str, pricer: Pricer, interval_s: float = SNAPSHOT_ANSWER_INTERVAL_S
    ) -> None:
        self.job = job
        self.interval_s = interval_s
        self._pricer = pricer
        self._snapshot_at: dict[str, float] = {}
        self._up_cache: dict[tuple[str, int], Cost] = {}
        #: snapshot answers the rate limit withheld
        self.withheld = 0
        #: kind -> [messages, bytes] published (since this process started)
        self.published: dict[str, list[int]] = {k: [0, 0] for k in PUBLISHED_KINDS}

    def answer(
        self,
        agent: str,
        steps: Outbound | None,
        snapshot: Callable[[], Outbound],
        now: float,
        extra: Sequence[Outbound] = (),
    ) -> tuple[Outbound, ...]:
        """What ``agent`` misses, addressed to it: ``steps`` (the merged catch-up, None when
        not held) else a snapshot unless one went to it within the interval; then
        ``extra`` (control messages it must see), addressed to it too."""
        out: list[Outbound] = []
        if steps is not None:
            out.append(addressed(steps, self.job, agent))
        elif self._snapshot_allowed(agent, now):
            out.append(addressed(snapshot(), self.job, agent))
        else:
            self.withheld += 1
        return (*out, *self.to(agent, extra))

    def to(self, agent: str, outbound: Sequence[Outbound]) -> list[Outbound]:
        """``outbound`` addressed to ``agent`` alone."""
        return [addressed(o, self.job, agent) for o in outbound]

    def _snapshot_allowed(self, agent: str, now: float) -> bool:
        last = self._snapshot_at.get(agent)
        if last is not None and 0.0 <= now - last < self.interval_s:
            return False
        if len(self._snapshot_at) >= MAX_TRACKED:  # forget the agents answered long ago
            old = [a for a, t in self._snapshot_at.items() if now - t >= self.interval_s]
            for a in old or list(self._snapshot_at):
                del self._snapshot_at[a]
        self._snapshot_at[agent] = now
        return True

    def sent(self, info: AgentInfo | None, size: int) -> None:
        """``info``'s agent sent a message of ``size`` bytes (None: not known, not counted)."""
        if info is None:
            return
        key = (info.hello.profile, size)
        cost = self._up_cache.get(key)
        if cost is None:
            if len(self._up_cache) >= _PRICE_CACHE_MAX:
                self._up_cache.clear()
            profile = self._pricer.profile(info.hello.profile)
            cost = Cost(1, size) if profile is None else profile.message_cost(size).cost
            self._up_cache[key] = cost
        info.sent = info.sent + cost

    def count(self, outbound: Sequence[Published]) -> None:
        """Count what is published, by kind."""
        for o in map(as_outbound, outbound):
            row = self.published.setdefault(o.kind, [0, 0])
            row[0] += 1
            row[1] += len(o.payload)


def charge_downlink(eng: RoundEngine, outbound: Sequence[Published], now: float | None) -> None:
    """Account what agents receive (:meth:`RoundEngine.charge_downlink`): a job-wide message
    reaches every live agent, one addressed to an agent reaches that agent only; priced on
    each one's downlink profile. With ``downlink_pacing`` the next version waits until every
    live agent's downlink is free again (:func:`aggregator.engine.broadcast.downlink_interval_s`)."""
    pace = now is not None and eng.config.downlink_pacing
    for o in map(as_outbound, outbound):
        size = len(o.payload)
        if o.target is not None:
            one = eng.agents.get(o.target)
            receivers = [] if one is None else [one]
        else:
            receivers = [a for a in eng.agents.values() if a.live]
        for info in receivers:
            cost = eng._pricer.down_cost(info.hello.profile, size)
            info.down = info.down + cost
            eng.totals_down = eng.totals_down + cost
            if pace:
                assert now is not None
                _pace(eng, info, size, now)


def _pace(eng: RoundEngine, info: AgentInfo, size: int, now: float) -> None:
    """The agent's downlink is busy for one more message: its link is free again after the
    message's interval; the next version waits for every live link."""
    profile = eng._pricer.profile(info.hello.profile)
    if profile is not None:
        free = eng._down_free_at.get(info.agent, 0.0)
        free = max(now, free) + downlink_interval_s(profile, size)
        eng._down_free_at[info.agent] = free
        eng.next_version_at = max(eng.next_version_at, free)
