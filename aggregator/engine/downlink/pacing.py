"""Who receives what the aggregator publishes, what each agent's downlink carried, and
when the next version may go out.

The engine (:class:`aggregator.engine.rounds.RoundEngine`) drives one
:class:`DownlinkTraffic` per job, the only owner of this state:

* **Answers to one agent** (:meth:`DownlinkTraffic.answer`): what an agent misses after a request,
  a rejoining hello, a stale or an already-applied update goes on its own topic
  ``cat/<job>/to/<agent>`` (:func:`aggregator.engine.downlink.outbound.addressed`), never on the job-wide
  ``model``/``delta`` topics, so the rest of the fleet neither receives nor pays for it.
  The merged catch-up steps (a few update sizes) go every time; a full model snapshot
  (8*d bytes) goes at most once per agent per :data:`SNAPSHOT_ANSWER_INTERVAL_S` seconds
  of engine time. A request inside the interval is answered with nothing (counted in
  :attr:`DownlinkTraffic.withheld`): the agent asks again (it re-says hello with back-off while it
  has no model, and requests again on its next version gap). The rate limit is kept in
  memory only, like :mod:`aggregator.engine.refusals`.
* **Downlink charging and pacing** (:meth:`DownlinkTraffic.charge`): a job-wide message
  costs every live agent, one addressed to an agent costs that agent only, priced on its
  profile's downlink; a job-wide message to the members of a shared downlink group
  (:meth:`DownlinkTraffic.group_of`) goes once for the group, paced by the group's busy
  time (:func:`~aggregator.engine.downlink.broadcast.shared_limit`), and costs each member
  its share (into the agent's record, through
  :meth:`aggregator.engine.registry.AgentRegistry.add_down`, and :attr:`totals_down`).
  With pacing on, each receiver's link stays busy for the message's
  :func:`~aggregator.engine.downlink.broadcast.downlink_interval_s`, and the gateway of
  its network for the message's airtime over the gateway's duty cycle
  (:func:`~aggregator.engine.downlink.broadcast.gateway_limit`: one gateway sends every
  unicast downlink of a network, one after another); no version closes before
  :attr:`next_version_at`, when every link and every gateway is free again. Accounts, totals and
  pacing (every agent's free-at time included) are checkpointed
  (:meth:`DownlinkTraffic.export`); what changes them is an engine input the service
  journals (:meth:`aggregator.engine.rounds.RoundEngine.charge_downlink`).

  Why an input and not part of the engine's own step: the service publishes one merged
  delta for the versions a batch committed (:func:`~.outbound.merge_deltas`) and the
  start-up snapshot and controls, and the agents' links carry exactly that; charging each
  version's effects inside the step would price messages never sent. So the service
  journals each charge (who, how many bytes, ``now``) with the batch that produced it,
  before it publishes, and the replay re-applies it: the state rebuilt after a crash is
  the live state. A crash after that commit but before the publish leaves the links
  charged for messages that did not go out (pacing errs on the side of waiting).
* **Published, by kind** (:attr:`DownlinkTraffic.published`): messages and bytes of everything
  published, counted once per message (not per transport), by
  :data:`aggregator.engine.downlink.outbound.PUBLISHED_KINDS`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from aggregator.engine.accounting import Pricer
from aggregator.engine.downlink.broadcast import (
    DownlinkLimit,
    downlink_limit,
    gateway_limit,
    shared_limit,
)
from aggregator.engine.downlink.outbound import PUBLISHED_KINDS, Outbound, addressed
from aggregator.engine.registry import AgentRegistry
from aggregator.engine.types import AgentInfo
from edge_agent.links.cost import ZERO, Cost
from edge_agent.protocol import topics

#: at most one full-model snapshot answer per agent per this many seconds of engine time
SNAPSHOT_ANSWER_INTERVAL_S: Final = 2.0
#: how a shared downlink group is named among the agents in the pacing state
GROUP_PREFIX: Final = "@"
#: how a network's gateway is named among the agents in the pacing state
GATEWAY_PREFIX: Final = "#"
#: agents remembered for the rate limit (bounded: agent ids come from topics)
MAX_TRACKED: Final = 4096


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


log = logging.getLogger("aggregator.engine")


@dataclass(frozen=True)
class Hold:
    """A round that could close but waits for downlinks (:meth:`DownlinkTraffic.hold`).

    ``reason``: ``daily_cap`` when a member's network allows no more downlinks today,
    else ``downlink_busy`` (airtime and its sender's duty cycle); ``held_by``: the agents
    whose downlink is not free yet (``@group``: a shared downlink group's, ``#network``:
    the gateway of a network's unicast downlinks); ``held_until``: when the last of them is (engine
    time); ``since``: when the hold started."""

    reason: DownlinkLimit
    held_by: tuple[str, ...]
    held_until: float
    since: float


#: one published message as a charge sees it: its addressee (None: job-wide) and its size
Charge = tuple[str | None, int]


def charges(outbound: Sequence[Published]) -> list[Charge]:
    """What each published message costs whom: (addressee or None, payload bytes)."""
    return [(o.target, len(o.payload)) for o in map(as_outbound, outbound)]


def encode_charges(items: Sequence[Charge]) -> bytes:
    """The journal form of a charge (compact JSON)."""
    return json.dumps(list(items), separators=(",", ":")).encode()


def decode_charges(blob: bytes) -> list[Charge]:
    """The inverse of :func:`encode_charges` (raises ValueError on anything else)."""
    rows = json.loads(blob)
    if not isinstance(rows, list):
        raise ValueError("a downlink charge is a JSON list")
    out: list[Charge] = []
    for row in rows:
        target, size = row
        if not (target is None or isinstance(target, str)) or not isinstance(size, int):
            raise ValueError(f"downlink charge row {row!r}: expected [agent or null, bytes]")
        out.append((target, size))
    return out


class DownlinkTraffic:
    """Addressing, the answers' rate limit, downlink accounts, pacing and counters of one
    job. Pure: callers pass ``now``."""

    def __init__(
        self,
        job: str,
        pricer: Pricer,
        *,
        pacing: bool = False,
        interval_s: float = SNAPSHOT_ANSWER_INTERVAL_S,
    ) -> None:
        self.job = job
        self.interval_s = interval_s
        self.pacing = pacing
        self._pricer = pricer
        self._snapshot_at: dict[str, float] = {}
        #: snapshot answers the rate limit withheld
        self.withheld = 0
        #: kind -> [messages, bytes] published (since this process started)
        self.published: dict[str, list[int]] = {k: [0, 0] for k in PUBLISHED_KINDS}
        self._totals_down = ZERO  # what the agents received, summed over agents
        self._next_version_at = 0.0
        self._free_at: dict[str, float] = {}  # per agent: its downlink is free again
        #: per member of a shared downlink group: its own unicast link is free again (what
        #: is addressed to it alone; job-wide messages reach it on the group, so no version
        #: waits for this link)
        self._own_free_at: dict[str, float] = {}
        self._limit: dict[str, DownlinkLimit] = {}  # per agent: what set its free-at time
        self._held_since: float | None = None  # a closable round waits for downlinks
        #: agents a hold stopped waiting for (max_hold_s): not charged for job-wide
        #: messages, nor waited for, while their downlink is busy; they catch up later
        self._released: set[str] = set()
        #: per group member: the round of its last stale update left unanswered
        #: (:meth:`defer_stale`; in memory only, like the snapshot answers' rate limit)
        self._stale_deferred: dict[str, int] = {}
        #: per shared downlink group: its sender's account (messages, airtime_s, busy_s)
        self._groups: dict[str, dict[str, float]] = {}

    @property
    def totals_down(self) -> Cost:
        """What the agents received, summed over agents."""
        return self._totals_down

    @property
    def next_version_at(self) -> float:
        """Downlink pacing: no version closes before this time (every link is free again)."""
        return self._next_version_at

    def free_at(self, agent: str) -> float:
        """When ``agent``'s downlink is free again (0.0: never charged): the link job-wide
        messages reach it on, or, for a group member, its own unicast link if that is later
        (what was addressed to it alone is over then)."""
        return max(self._free_at.get(agent, 0.0), self._own_free_at.get(agent, 0.0))

    def own_free_at(self, agent: str) -> float:
        """When a group member's own unicast link is free again (0.0: nothing was addressed
        to it, or it is not a member of a group)."""
        return self._own_free_at.get(agent, 0.0)

    def _skipped(self, agent: str, now: float) -> bool:
        """Whether a hold released ``agent`` and its downlink is still busy at ``now``."""
        return agent in self._released and self._free_at.get(agent, 0.0) > now

    @staticmethod
    def _gone(key: str, agents: AgentRegistry | None) -> bool:
        """Whether ``key`` is an agent that is not live (lost, offline, done, forgotten): a
        version does not wait for its downlink (a group's is always waited for)."""
        if agents is None or key.startswith((GROUP_PREFIX, GATEWAY_PREFIX)):
            return False
        info = agents.get(key)
        return info is None or not info.live

    def wait_until(self, now: float, agents: AgentRegistry | None = None) -> float:
        """No version closes before this time: :attr:`next_version_at`, but not waiting
        for the agents a hold released while their downlinks are busy, nor for the agents
        of ``agents`` that are not live."""
        if not self._released and agents is None:
            return self._next_version_at
        waited = (t for a, t in self._free_at.items()
                  if not self._skipped(a, now) and not self._gone(a, agents))  # fmt: skip
        return max(waited, default=0.0)

    def _busy(self, now: float, agents: AgentRegistry | None) -> list[str]:
        """The agents a version waits for at ``now`` (their downlink is not free yet), and a
        gateway only when it is free later than all of them (it then holds the version)."""
        busy = {a: t for a, t in self._free_at.items()
                if t > now and not self._skipped(a, now) and not self._gone(a, agents)}  # fmt: skip
        links = max((t for a, t in busy.items() if not a.startswith(GATEWAY_PREFIX)), default=0.0)
        return sorted(a for a, t in busy.items() if not a.startswith(GATEWAY_PREFIX) or t > links)

    def hold(self, now: float, agents: AgentRegistry | None = None) -> Hold | None:
        """The hold at ``now`` (None: the job is not held); with ``agents``, only live
        agents hold it (a holder that goes silent, offline or done ends the hold)."""
        if self._held_since is None:
            return None
        busy = self._busy(now, agents)
        if not busy:
            return None
        daily = any(self._limit.get(a) == "daily_cap" for a in busy)
        until = max(self._free_at[a] for a in busy)
        return Hold("daily_cap" if daily else "downlink_busy", tuple(busy), until, self._held_since)

    def may_close(
        self, now: float, max_hold_s: float | None, agents: AgentRegistry | None = None
    ) -> tuple[bool, bool]:
        """Whether a round that could close at ``now`` may, and whether this call changed
        the state (a hold started, or ``max_hold_s`` ran out: the journal must keep the
        input). A hold ends with the version that closes it (:meth:`closed`); only the
        live agents of ``agents`` hold it (their liveness is engine state, journalled)."""
        if now >= self.wait_until(now, agents):
            return True, False
        if self._held_since is None:
            self._held_since = now
            hold = self.hold(now, agents)
            if hold is not None:
                log.info("job %s held: %s of %s until %.1f", self.job, hold.reason,
                         ", ".join(hold.held_by), hold.held_until)  # fmt: skip
            if max_hold_s is None or max_hold_s > 0:
                return False, True
        if max_hold_s is not None and now >= self._held_since + max_hold_s:
            busy = self._busy(now, agents)
            self._released.update(busy)
            log.info("job %s: held %.0f s (AGG_MAX_HOLD_S), closing without %s", self.job,
                     now - self._held_since, ", ".join(busy) or "the busy links")  # fmt: skip
            return True, True
        return False, False

    def closed(self, now: float) -> None:
        """A version closed at ``now``: a hold on it ends."""
        if self._held_since is not None:
            log.info("job %s hold ended after %.1f s", self.job, now - self._held_since)
            self._held_since = None

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

    def defer_stale(self, info: AgentInfo, round: int) -> bool:
        """Whether a stale update (for ``round``, a version that closed without it) of
        ``info``'s agent goes unanswered: yes the first time for a member of a shared
        downlink group, which hears the versions since on its group (answering it with the
        merged steps on its own unicast link would take, under a LoRaWAN network's daily
        cap, days for what it is receiving anyway); a re-send of that round means it missed
        them, and is answered as any stale update. Other agents are always answered."""
        if self.group_of(info) is None or self._stale_deferred.get(info.agent) == round:
            return False
        if len(self._stale_deferred) >= MAX_TRACKED and info.agent not in self._stale_deferred:
            self._stale_deferred.clear()  # bounded: the worst case is one answer too many
        self._stale_deferred[info.agent] = round
        return True

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

    def count(self, outbound: Sequence[Published]) -> None:
        """Count what is published, by kind."""
        for o in map(as_outbound, outbound):
            row = self.published.setdefault(o.kind, [0, 0])
            row[0] += 1
            row[1] += len(o.payload)

    def group_of(self, info: AgentInfo) -> str | None:
        """The shared downlink group ``info``'s agent receives job-wide messages on: its
        hello's ``group``, else the one its profile's ``downlink.shared`` names; None
        (unicast) when its profile has no shared downlink."""
        profile = self._pricer.profile(info.hello.profile)
        shared = None if profile is None else profile.shared_downlink
        if shared is None:
            return None
        return info.hello.group or shared.group

    @property
    def groups(self) -> dict[str, dict[str, float]]:
        """Each group's sender account: ``messages``, ``frames``, ``airtime_s`` (once for
        the whole group), ``busy_s`` (the group's downlink taken), and ``free_at``."""
        return {
            g: {**acct, "free_at": self._free_at.get(GROUP_PREFIX + g, 0.0)}
            for g, acct in self._groups.items()
        }

    def charge_published(
        self, outbound: Sequence[Published], now: float | None, agents: AgentRegistry
    ) -> bytes:
        """Count ``outbound`` by kind (:meth:`count`) and charge it at ``now``
        (:meth:`charge`); return the charge's journal form (:func:`encode_charges`).

        The caller passes exactly what it publishes (after merging), and the time it does.
        The charge is an engine *input*: it changes downlink accounts and pacing, which
        decide when the next version closes; the service journals its journal form with
        ``now`` before it publishes, and :meth:`replay` re-applies it (the module doc
        says why)."""
        self.count(outbound)
        items = charges(outbound)
        self.charge(items, now, agents)
        return encode_charges(items)

    def replay(self, blob: bytes, now: float, agents: AgentRegistry) -> None:
        """Re-apply a journalled :meth:`charge_published` (not counted again as published:
        those counters are this process's). Raises ValueError for a malformed blob."""
        self.charge(decode_charges(blob), now, agents)

    def charge(self, items: Sequence[Charge], now: float | None, agents: AgentRegistry) -> None:
        """Account what agents receive: a job-wide message reaches every live agent, one
        addressed to an agent reaches that agent only. A job-wide message goes once per
        shared downlink group (its sender's airtime once, each member its energy) and
        unicast to every other agent; what is addressed to one agent goes on its unicast
        downlink. With pacing (and ``now``) the next version waits until every unicast
        link, the gateway of each network those links belong to (one message after
        another: :func:`~aggregator.engine.downlink.broadcast.gateway_limit`) and every
        group's downlink is free again; a group member's own unicast link
        (what is addressed to it alone) is paced too, but no version waits for it: the
        version reaches that member on the group."""
        pace = now is not None and self.pacing
        for target, size in items:
            if target is not None:
                one = agents.get(target)
                receivers = [] if one is None else [one]
            else:
                receivers = agents.live()
            members: dict[str, list[AgentInfo]] = {}
            for info in receivers:
                group = self.group_of(info)
                if group is not None and target is None:
                    members.setdefault(group, []).append(info)
                    continue
                if target is None and now is not None and self._skipped(info.agent, now):
                    continue  # a hold released it: it catches up when free again
                self._receive(info, size, shared=False, agents=agents)
                if pace:
                    assert now is not None
                    self._pace(info.agent, info.hello.profile, size, now,
                               holds_versions=group is None)  # fmt: skip
            for group, infos in members.items():
                self._send_group(group, infos, size, now if pace else None, agents)

    def _receive(self, info: AgentInfo, size: int, *, shared: bool, agents: AgentRegistry) -> None:
        cost = self._pricer.down_cost(info.hello.profile, size, shared=shared)
        agents.add_down(info.agent, cost)
        self._totals_down = self._totals_down + cost

    def _send_group(
        self,
        group: str,
        infos: Sequence[AgentInfo],
        size: int,
        now: float | None,
        agents: AgentRegistry,
    ) -> None:
        """One job-wide message on ``group``'s shared downlink: every member receives it,
        the sender transmits it once; with ``now`` the group is paced by its own law."""
        key = GROUP_PREFIX + group
        if now is not None and self._skipped(key, now):
            return  # a hold released the group: its members catch up when it is free
        for info in infos:
            self._receive(info, size, shared=True, agents=agents)
        profile = self._pricer.profile(infos[0].hello.profile)
        shared = None if profile is None else profile.shared_downlink
        if shared is None:
            return
        got = shared.delivery_of(size)
        acct = self._groups.setdefault(
            group, {"messages": 0.0, "frames": 0.0, "airtime_s": 0.0, "busy_s": 0.0}
        )
        acct["messages"] += 1.0
        acct["frames"] += got.frames
        acct["airtime_s"] += got.airtime_s
        acct["busy_s"] += got.busy_s
        if now is not None:
            interval, limit = shared_limit(shared, size)
            self._occupy(key, interval, limit, now)

    def _pace(
        self, agent: str, profile_name: str, size: int, now: float, *, holds_versions: bool
    ) -> None:
        """The agent's downlink is busy for one more message: its link is free again after
        the message's interval; the next version waits for every live link that carries
        job-wide messages (``holds_versions``; not a group member's own unicast link)."""
        profile = self._pricer.profile(profile_name)
        if profile is None:
            return
        interval, limit = downlink_limit(profile, size)
        if holds_versions:
            self._occupy(agent, interval, limit, now)
            gateway = gateway_limit(profile, size)
            if gateway is not None:
                self._occupy(GATEWAY_PREFIX + gateway[0], gateway[1], "downlink_busy", now)
        else:
            self._own_free_at[agent] = max(now, self._own_free_at.get(agent, 0.0)) + interval

    def _occupy(self, key: str, interval: float, limit: DownlinkLimit, now: float) -> None:
        """The downlink ``key`` (an agent, or ``@group``) is busy ``interval`` more seconds."""
        before = self._free_at.get(key, 0.0)
        if before <= now:  # its link was free: a release by a hold is over
            self._released.discard(key)
        free = max(now, before) + interval
        self._free_at[key] = free
        self._limit[key] = limit
        self._next_version_at = max(self._next_version_at, free)

    def export(self) -> dict[str, Any]:
        """The checkpoint's ``totals_down``, ``next_version_at`` and ``down_free_at``."""
        return {
            "totals_down": self._totals_down.to_dict(),
            "next_version_at": self._next_version_at,
            "down_free_at": dict(self._free_at),
            "down_own_free_at": dict(self._own_free_at),
            "down_limit": dict(self._limit),
            "held_since": self._held_since,
            "down_released": sorted(self._released),
            "down_groups": {g: dict(a) for g, a in self._groups.items()},
        }

    def restore(self, meta: dict[str, Any]) -> None:
        """Load :meth:`export`'s keys (a checkpoint without them: nothing charged yet)."""
        self._totals_down = Cost.from_dict(meta.get("totals_down"))
        self._next_version_at = float(meta.get("next_version_at", 0.0))
        self._free_at = {str(a): float(t) for a, t in meta.get("down_free_at", {}).items()}
        own = meta.get("down_own_free_at", {})
        self._own_free_at = {str(a): float(t) for a, t in own.items()}
        self._limit = dict(meta.get("down_limit", {}))
        held = meta.get("held_since")
        self._held_since = None if held is None else float(held)
        self._released = {str(a) for a in meta.get("down_released", [])}
        self._groups = {
            str(g): {k: float(v) for k, v in a.items()}
            for g, a in meta.get("down_groups", {}).items()
        }
