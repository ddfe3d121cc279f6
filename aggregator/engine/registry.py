"""The agents of one job: their records (:class:`~aggregator.engine.types.AgentInfo`), the
hellos, status messages and requests that change them, their presence and liveness, and
which of them a sync round counts.

:class:`AgentRegistry` is the only writer of an agent's record: every change goes through
one of its methods, and it exports and restores the records itself (the checkpoint's
``agents`` list, in registration order; an agent's position there is its index in the
de-duplication keys).

**Messages.** A hello, a status message and a request change the sender's record only:
the registry checks them against it (:meth:`AgentRegistry.check_hello` changes nothing;
:meth:`AgentRegistry.on_status` and :meth:`AgentRegistry.on_request` validate fully, then
apply), the engine opens the MAC envelope before and answers after.

**Presence.** A status that changes nothing is not journalled (an agent, or a hostile
client, re-announcing the state it already has must not grow the disk). "Nothing" must
then be exact, or the journal replay would rebuild a different state: a repeated
``online`` refreshes ``last_seen`` only once at least :data:`REFRESH_FRACTION` of the
liveness timeout has passed since the value the registry holds, and only that refresh is
journalled. An agent kept alive by status messages alone is therefore seen at most that
fraction of the timeout earlier than it last spoke (agents normally keep alive with
hellos and updates).

**Participation.** Registering costs an agent one hello; taking part costs it updates.
Counting every live registered agent let anyone who can send hellos (20,000 invented ids
over ZeroMQ) raise the quorum beyond what the real agents can reach, and no round closed
again. So, with ``K = EngineConfig.participation_window`` (model versions), at model
version ``v``:

* an agent **takes part** when it is live and had an update accepted for one of the
  last ``K`` rounds (its last accepted update's round ``> v - K``; the open round is
  round ``v``). The deadline quorum is a fraction of these agents (at least
  ``quorum_min_agents``);
* a **newcomer** is a live agent with no accepted update yet that joined fewer than ``K``
  versions ago (at version ``> v - K``). The round waits for newcomers before it closes
  as ``all_reported`` (a new agent's first update is not left out of the round it
  joined in), and they join the quorum's base, but at most as many as take part: the
  quorum is ``max(quorum_min_agents, ceil(quorum_fraction * n))`` with
  ``n = taking_part + min(newcomers, taking_part)``.

What it costs: hellos from agents that never send an update can at most double the
quorum's base (with ``quorum_fraction <= 0.5`` the agents that take part always reach
it) and make rounds wait for their deadline, for ``K`` versions; an agent whose updates
stop being accepted (silent, refused, or late beyond ``K`` versions) stops counting after
``K`` versions and counts again from its next accepted update. Dead agents (liveness
timeout) never count. The number of registered agents is capped (``max_agents``,
:func:`aggregator.engine.admission.check_capacity`).

**Unproven ids expire.** A hello costs nothing to invent, so the cap alone let
``max_agents`` invented ids lock every real newcomer out for good. An agent that never had
an update accepted is *unproven*; ``unproven_ttl_s`` (``AGG_UNPROVEN_TTL_S``) after its
first hello its record is forgotten and its slot is free (:meth:`AgentRegistry.forget_unproven`,
called from the engine's tick, whose ``now`` the journal keeps: a crash replay forgets
exactly the same ids at the same point). Re-sending hellos does not extend the term; an
honest agent forgotten before its first update is told ``unknown_agent`` at its update and
says hello again. Agents with an accepted update are never forgotten.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from aggregator.engine import admission
from aggregator.engine.accounting import Spend
from aggregator.engine.admission import Reject, check_capacity, check_counter
from aggregator.engine.types import AgentInfo, EngineConfig
from edge_agent.links.cost import Cost
from edge_agent.protocol import messages
from edge_agent.protocol.downlink import Family

log = logging.getLogger("aggregator.engine")

#: a repeated ``online`` status refreshes ``last_seen`` once per this part of the timeout
REFRESH_FRACTION: Final = 0.1


@dataclass(frozen=True, slots=True)
class Participation:
    """The agents a sync round counts at one model version (ids)."""

    #: live agents with an accepted update for one of the last K versions (the quorum base)
    taking_part: frozenset[str]
    #: the round closes as ``all_reported`` once all of these contributed (taking part or new)
    awaited: frozenset[str]

    @property
    def quorum_base(self) -> int:
        """``n`` of the quorum: those taking part and at most as many newcomers."""
        taking = len(self.taking_part)
        return taking + min(len(self.awaited) - taking, taking)


def takes_part(info: AgentInfo, version: int, window: int) -> bool:
    """Whether ``info`` is live with an accepted update for one of the last ``window``
    rounds (the open round being round ``version``)."""
    return info.live and info.last_round is not None and version - info.last_round < window


def is_newcomer(info: AgentInfo, version: int, window: int) -> bool:
    """Whether ``info`` is live, has no accepted update yet and joined fewer than
    ``window`` versions ago."""
    return info.live and info.last_round is None and version - info.joined_version < window


def participation(
    agents: Iterable[AgentInfo], version: int, window: int, excused: frozenset[str] = frozenset()
) -> Participation:
    """Who takes part and who is awaited at ``version`` (see the module doc); the
    ``excused`` agents (their duty cycle keeps them silent: aggregator.engine.cadence)
    neither."""
    taking: set[str] = set()
    new: set[str] = set()
    for info in agents:
        if info.agent in excused:
            continue
        if takes_part(info, version, window):
            taking.add(info.agent)
        elif is_newcomer(info, version, window):
            new.add(info.agent)
    return Participation(frozenset(taking), frozenset(taking | new))


class AgentRegistry:
    """The records of a job's agents. ``records`` is a read-only view: callers change a
    record only through the methods here."""

    def __init__(
        self,
        *,
        liveness_timeout_s: float,
        max_agents: int,
        window: int,
        unproven_ttl_s: float | None = None,
    ) -> None:
        self.liveness_timeout_s = liveness_timeout_s
        self.max_agents = max_agents
        self.window = window
        #: an agent without an accepted update is forgotten this long after its first hello
        self.unproven_ttl_s = unproven_ttl_s
        self._agents: dict[str, AgentInfo] = {}
        self._index: dict[str, int] = {}  # position in the registration order

    # ------------------------------------------------------------------ reading

    @property
    def records(self) -> Mapping[str, AgentInfo]:
        """Every agent's record by id, in registration order (do not mutate)."""
        return self._agents

    def get(self, agent: str) -> AgentInfo | None:
        return self._agents.get(agent)

    def index(self, agent: str) -> int:
        """The agent's position in the registration order (its de-duplication index)."""
        return self._index[agent]

    def __len__(self) -> int:
        return len(self._agents)

    def __iter__(self) -> Iterator[AgentInfo]:
        return iter(self._agents.values())

    def only(self, agent: str) -> bool:
        """Whether no agent but ``agent`` is registered."""
        return all(a == agent for a in self._agents)

    def hellos(self) -> Iterator[messages.Hello]:
        """Every agent's last accepted hello, in registration order."""
        return (a.hello for a in self._agents.values())

    def live(self) -> list[AgentInfo]:
        return [a for a in self._agents.values() if a.live]

    @property
    def live_count(self) -> int:
        return sum(1 for a in self._agents.values() if a.live)

    def counted(
        self, version: int, *, excused: frozenset[str] = frozenset(), window: int | None = None
    ) -> Participation:
        """Who the open sync round of ``version`` counts (see the module doc), but the
        ``excused`` agents, over ``window`` versions (None: the registry's K)."""
        k = self.window if window is None else window
        return participation(self._agents.values(), version, k, excused)

    @staticmethod
    def quorum(base: int, min_agents: int, fraction: float) -> int:
        """Contributions a sync round needs at its deadline (see the module doc)."""
        return max(min_agents, math.ceil(fraction * base))

    def check_hello(
        self, agent: str, text: bytes, *, signed: bool, config: EngineConfig,
        family: Family | None,
    ) -> messages.Hello:  # fmt: skip
        """The hello ``text`` of ``agent`` if the job takes it (raises Reject): it fits the
        job (:func:`~aggregator.engine.admission.check_hello`), it claims nothing its last
        hello did not, and when ``signed`` its counter increases. Changes nothing."""
        cfg = config
        local_steps, comm_prob = cfg.local_schedule
        hello = admission.check_hello(text, agent=agent, job=cfg.job, d=cfg.d, model=cfg.model,
                                      family=family, alone=self.only(agent),
                                      fixed_step=cfg.step_size is not None, limits=cfg.limits,
                                      feedback=cfg.feedback,
                                      batch_size=cfg.batch_size,
                                      local_steps=local_steps, comm_prob=comm_prob)  # fmt: skip
        known = self._agents.get(agent)
        admission.check_claims(hello, None if known is None else known.hello)
        self.check_signed(agent, hello.ctr, signed=signed, kind="hello")
        return hello

    # ------------------------------------------------------------------ changes

    def welcome(
        self, agent: str, hello: messages.Hello, now: float, version: int, *, signed: bool,
        seq_floor: int,
    ) -> None:  # fmt: skip
        """Apply a hello :meth:`check_hello` accepted: a fresh one of a known agent ends
        its wait for a reset (the caller dropped its state); it joins or renews its hello
        (:meth:`join`); a ``signed`` one keeps its counters and raises its seq floor to at
        least ``seq_floor`` (:meth:`signed_hello`)."""
        if hello.fresh and agent in self._agents:
            self.set_needs_reset(agent, False)
        self.join(agent, hello, now, version)
        if signed:  # replays of its earlier updates stay refused (docs/wire-format.md 11.1)
            self.signed_hello(agent, hello, seq_floor)

    def on_status(self, agent: str, text: bytes, now: float, *, signed: bool) -> bool:
        """Apply the status message ``text`` of ``agent`` (raises Reject first if it is
        refused); return whether it must be journalled: it changed the record, or it was
        ``signed`` (its counter is kept). A repeat changes nothing (see the module doc)."""
        status = admission.check_status(text, agent=agent)
        off = status.state == "offline"
        will = self.check_signed(agent, status.ctr, signed=signed, kind="status", offline=off)
        changed = self.status(agent, status.state, now)
        self.signed(agent, status.ctr if signed else None, will=will)
        return changed or signed

    def on_request(self, agent: str, text: bytes, now: float, *, signed: bool) -> messages.Request:
        """Apply the request ``text`` of ``agent`` (it is seen; raises Reject first, also
        ``unknown_agent`` before its hello: no answer per invented id) and return it."""
        req = admission.check_request(text)
        if agent not in self._agents:
            raise Reject("unknown_agent", f"{agent} sent a request before its hello")
        self.check_signed(agent, req.ctr, signed=signed, kind="request")
        self.seen(agent, now)
        self.signed(agent, req.ctr if signed else None)
        return req

    def join(self, agent: str, hello: messages.Hello, now: float, version: int) -> bool:
        """Register ``agent`` (a hello; raises ``too_many_agents`` beyond the cap) or renew
        its hello; it is live and online. Returns whether the agent is new."""
        info = self._agents.get(agent)
        new = info is None
        if info is None:
            check_capacity(agent, len(self._agents), self.max_agents)
            info = AgentInfo(agent, hello, first_seen=now, last_seen=now, joined_version=version)
            self._agents[agent] = info
            self._index[agent] = len(self._index)
            log.info("agent %s joined (profile %s)", agent, hello.profile or "none")
        else:
            info.hello = hello
        self.seen(agent, now)
        return new

    # ------------------------------------------------------------------ signed messages

    def check_signed(
        self, agent: str, ctr: int | None, *, signed: bool, kind: str, offline: bool = False
    ) -> bool:
        """Raise unless a ``signed`` message of ``agent`` with counter ``ctr`` may be
        accepted (``bad_mac`` without a counter, ``replayed`` when it does not increase);
        return whether it is the agent's Last Will: an ``offline`` status carrying the
        counter its last authenticated hello announced, accepted once although lower
        (docs/wire-format.md section 11.1). Changes nothing."""
        info = self._agents.get(agent)
        armed = None if info is None else info.will_ctr
        if signed and offline and armed is not None and ctr == armed:
            return True
        last = None if info is None else info.ctr
        check_counter(ctr, last, signed=signed, what=f"{agent} {kind}")
        return False

    def signed(self, agent: str, ctr: int | None, *, will: bool = False) -> None:
        """Record an accepted signed message of ``agent``: its counter (or, for its Last
        Will, that the will is spent). None (unsigned) or an unknown agent: nothing."""
        info = self._agents.get(agent)
        if info is None or ctr is None:
            return
        if will:
            info.will_spent, info.will_ctr = ctr, None
        else:
            info.ctr = ctr if info.ctr is None else max(info.ctr, ctr)

    def signed_hello(self, agent: str, hello: messages.Hello, seq_floor: int) -> None:
        """An authenticated hello of ``agent`` was accepted: its counter, its Last Will's
        counter (unless that one was spent already) and the seq floor of its updates, which
        only moves up: ``max(floor, hello.next_seq, seq_floor)``."""
        self.signed(agent, hello.ctr)
        info = self._agents[agent]
        spent = info.will_spent
        if hello.will_ctr is not None and (spent is None or hello.will_ctr > spent):
            info.will_ctr = hello.will_ctr
        info.seq_floor = max(info.seq_floor, hello.next_seq, seq_floor)

    def seen(self, agent: str, now: float) -> None:
        """``agent`` spoke at ``now``: it is live and online (unknown agents: nothing)."""
        info = self._agents.get(agent)
        if info is not None:
            info.last_seen = max(info.last_seen, now)
            info.live, info.state = True, "online"

    def refresh(self, agent: str, now: float) -> bool:
        """``agent`` is still transmitting (a re-send): it is live and online, its
        ``last_seen`` refreshed as a repeated ``online`` status refreshes it; return
        whether anything changed (see the module doc)."""
        return self.status(agent, "online", now)

    def status(self, agent: str, state: str, now: float) -> bool:
        """Apply an agent's announced ``state`` at ``now``; return whether anything changed
        (then the message must be journalled, else nothing did; see the module doc).
        Raises ``unknown_agent`` for an agent without a hello."""
        info = self._agents.get(agent)
        if info is None:
            raise Reject("unknown_agent", agent)
        live = state == "online"
        refresh = live and now - info.last_seen >= REFRESH_FRACTION * self.liveness_timeout_s
        if state == info.state and live == info.live and not refresh:
            return False
        info.state, info.live = state, live
        if live:
            info.last_seen = max(info.last_seen, now)
        return True

    def expire(self, now: float, keep: frozenset[str] = frozenset()) -> list[str]:
        """Mark the agents silent for longer than the liveness timeout ``lost`` (but not
        those in ``keep``); return their ids."""
        lost: list[str] = []
        for info in self._agents.values():
            if info.live and now - info.last_seen > self.liveness_timeout_s:
                if info.agent in keep:
                    continue
                info.live, info.state = False, "lost"
                lost.append(info.agent)
                log.info("agent %s lost (silent for %.0f s)", info.agent, now - info.last_seen)
        return lost

    def forget_unproven(self, now: float, renumber: Callable[[list[int]], None]) -> bool:
        """Forget the agents that had no update accepted within ``unproven_ttl_s`` of their
        first hello (see the module doc); return whether any was. ``renumber`` is then told
        each old registration index's new one (-1: forgotten), for the de-duplication keys."""
        ttl = self.unproven_ttl_s
        gone = [] if ttl is None else [a.agent for a in self._agents.values()
                                       if a.accepted == 0 and now - a.first_seen > ttl]  # fmt: skip
        if not gone:
            return False
        for agent in gone:
            del self._agents[agent]
        log.info("forgot %d agent(s) without an accepted update %.0f s after their hello "
                 "(AGG_UNPROVEN_TTL_S): %s", len(gone), ttl, ", ".join(gone[:5]))  # fmt: skip
        old = self._index
        self._index = {a: i for i, a in enumerate(self._agents)}
        renumber([self._index.get(a, -1) for a in old])
        return True

    def accepted(self, agent: str, round: int, t: int, spend: Spend, now: float) -> None:
        """An update of ``agent`` for ``round`` (``t`` values) was accepted at ``now``."""
        info = self._agents[agent]
        self.seen(agent, now)
        info.accepted += 1
        info.last_round, info.last_t = round, t
        info.spend.add(spend)

    def rejected(self, agent: str | None) -> None:
        """A message of ``agent`` was refused (an unknown agent: nothing)."""
        info = None if agent is None else self._agents.get(agent)
        if info is not None:
            info.rejected += 1

    def set_needs_reset(self, agent: str, needs: bool) -> None:
        """EF21: whether ``agent``'s updates wait for a fresh hello (its state was dropped)."""
        self._agents[agent].needs_reset = needs

    def add_sent(self, agent: str | None, cost: Cost) -> None:
        """``agent`` sent a message costing ``cost`` on its uplink (unknown: nothing)."""
        info = None if agent is None else self._agents.get(agent)
        if info is not None:
            info.sent = info.sent + cost

    def add_down(self, agent: str, cost: Cost) -> None:
        """``agent`` received a message costing ``cost`` on its downlink."""
        info = self._agents[agent]
        info.down = info.down + cost

    # ------------------------------------------------------------------ persistence

    def export(self) -> list[dict[str, Any]]:
        """The records in registration order (the checkpoint's ``agents``)."""
        return [info.to_dict() for info in self._agents.values()]

    def restore(self, rows: Iterable[dict[str, Any]]) -> None:
        """Load the records :meth:`export` wrote."""
        infos = [AgentInfo.from_dict(a) for a in rows]
        self._agents = {a.agent: a for a in infos}
        self._index = {a.agent: i for i, a in enumerate(infos)}
