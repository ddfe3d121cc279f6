"""The law, checked after a simulated run: every ledger against every limit the cost model
knows, summed over the run (``elapsed_s`` of simulated time).

Limits, each as a margin ``1 - used / allowed`` (>= 0: kept; negative: broken):

- each device's uplink duty cycle: its airtime sent against ``duty_cycle * elapsed_s`` in each
  of its ``duty_cycle_bands`` sub-bands (its frames alternate between them, so the total
  against ``uplink_duty_share * elapsed_s``);
- each unicast downlink's sender duty cycle: the airtime it received unicast against
  ``sender_duty_cycle * elapsed_s`` (the sender's share for that device);
- one gateway's duty cycle for every unicast member of a network: a network's members (the
  first two parts of their profiles' names, e.g. ``lorawan_eu868``, as ``--multicast``
  matches them) are taken to share one gateway, whose RX1 answers go out on the sub-bands
  of the members' uplinks, so their unicast airtime together counts against
  ``sender_duty_cycle * duty_cycle_bands * elapsed_s`` (the fewest sub-bands of any
  member), and whose RX2 answers (a ``sender_band``) against ``sender_duty_cycle *
  elapsed_s`` of that one sub-band, apart (the engine paces the gateway the same way,
  :func:`aggregator.engine.downlink.broadcast.gateway_limit`, except for what goes to a
  group member alone, which no version waits for); more gateways would allow more;
- each shared downlink group's sender duty cycle: the group's airtime (once per message)
  against the group's ``sender_duty_cycle * elapsed_s``;
- each device's fair-use cap on its uplink airtime (``uplink_airtime_per_day_s``, The
  Things Network's 30 s a day): its airtime sent against the cap times the days;
- each unicast daily cap: the downlink packets it received unicast against
  ``max_messages_per_day * elapsed_s / 86400``, and a group's cap on its frames likewise.

``allowed`` is the rate times the elapsed time plus one of the limit's windows (an hour
for a duty cycle, as ETSI EN 300 220 counts it; a day for a daily cap): a run of ``n``
windows may use ``n + 1`` windows' allowance when it starts at a window's beginning and
ends at another's end. Totals over the run, not every sliding window: a margin near 0
says a window may still break it.

Each limit also gives its **floor** (:attr:`Margin.floor_s`): the shortest run in which what
was used stays within it, ``used / rate - window`` (``rate``: the allowance per second).
The largest floor of a run is the time the law alone imposes on what its members sent and
received, however well the rounds were scheduled: a run whose time is close to its floor
waits for the law, not for the engine (docs/results.md, "Unicast on The Things Network:
what the law allows").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aggregator.engine.downlink.broadcast import gateway_share
from edge_agent.agent.loop import Agent
from edge_agent.links.profiles import CostProfile

DAY_S = 86_400.0
HOUR_S = 3_600.0


@dataclass(frozen=True)
class Margin:
    """One limit: what it is (``limit``, ``who``), what was used and allowed; ``rate_per_s``:
    the allowance per second of the run, ``window_s``: the one window's allowance added to
    it (``allowed = rate_per_s * (elapsed_s + window_s)``)."""

    limit: str
    who: str
    used: float
    allowed: float
    rate_per_s: float = 0.0
    window_s: float = 0.0

    @property
    def margin(self) -> float:
        return 1.0 - self.used / self.allowed if self.allowed > 0 else -float(self.used > 0)

    @property
    def floor_s(self) -> float:
        """The shortest run in which ``used`` keeps this limit (0.0: it never binds; inf: a
        limit that allows nothing was used)."""
        if self.used <= 0.0:
            return 0.0
        if self.rate_per_s <= 0.0:
            return float("inf")
        return max(0.0, self.used / self.rate_per_s - self.window_s)

    def to_dict(self) -> dict[str, float | str]:
        """The JSON record of ``aggregator simulate --json`` (its ``law`` list)."""
        return {"limit": self.limit, "who": self.who, "used": self.used,
                "allowed": self.allowed, "margin": self.margin, "floor_s": self.floor_s}  # fmt: skip


def audit(
    agents: Sequence[Agent],
    groups: dict[str, dict[str, float]],
    group_of: dict[str, str | None],
    elapsed_s: float,
) -> list[Margin]:
    """Every limit's :class:`Margin` after ``elapsed_s`` simulated seconds. ``groups``: the
    engine's group accounts; ``group_of``: each agent's group (None: unicast)."""
    out: list[Margin] = []

    def duty(limit: str, who: str, used: float, share: float) -> None:
        out.append(Margin(limit, who, used, share * (elapsed_s + HOUR_S), share, HOUR_S))

    def daily(limit: str, who: str, used: float, per_day: float) -> None:
        out.append(Margin(limit, who, used, per_day * (elapsed_s + DAY_S) / DAY_S,
                          per_day / DAY_S, DAY_S))  # fmt: skip

    shared_seen: set[str] = set()
    gateways = _Gateways()
    for a in agents:
        p, me = a.profile, a.config.agent_id
        if p.duty_cycle is not None:  # the law, apart from any fair-use cap below
            share = min(1.0, p.duty_cycle * p.duty_cycle_bands)
            duty("uplink duty cycle", me, a.ledger.up.airtime_s, share)
        cap_s = p.uplink_airtime_per_day_s
        if cap_s is not None:  # a network's fair-use cap (TTN: 30 s a day)
            daily("uplink fair-use cap", me, a.ledger.up.airtime_s, cap_s)
        group = group_of.get(me)
        acct = groups.get(group) if group is not None else None
        frames = 0.0 if acct is None else acct["frames"]
        shared = p.shared_downlink
        group_air = 0.0 if acct is None or shared is None else acct["airtime_s"]
        down = p.downlink
        if down is not None and down.sender_duty_cycle is not None:
            unicast_air = a.ledger.down.airtime_s - group_air
            duty("downlink sender duty cycle", me, unicast_air, down.sender_duty_cycle)
            gateways.add(p, unicast_air)
        if p.max_downlinks_per_day is not None:
            daily("unicast daily cap", me, a.ledger.down.packets - frames, p.max_downlinks_per_day)
        if acct is None or shared is None or group in shared_seen:
            continue
        assert group is not None
        shared_seen.add(group)
        if shared.sender_duty_cycle is not None:
            duty("group sender duty cycle", group, acct["airtime_s"], shared.sender_duty_cycle)
        if shared.max_messages_per_day is not None:
            daily("group daily cap", group, acct["frames"], shared.max_messages_per_day)
    for name, used, share in gateways.shared():
        duty("gateway duty cycle", name, used, share)
    return out


class _Gateways:
    """Each gateway's unicast airtime over the run, the least share any of its members'
    profiles allows it, and how many members it answers."""

    def __init__(self) -> None:
        self._air: dict[str, float] = {}
        self._share: dict[str, float] = {}
        self._members: dict[str, int] = {}

    def add(self, profile: CostProfile, unicast_air_s: float) -> None:
        gateway = gateway_share(profile)
        if gateway is None:
            return
        name, share = gateway
        self._air[name] = self._air.get(name, 0.0) + unicast_air_s
        self._share[name] = min(self._share.get(name, 1.0), share)
        self._members[name] = self._members.get(name, 0) + 1

    def shared(self) -> list[tuple[str, float, float]]:
        """(gateway, airtime, share) of each gateway answering more than one member (one
        member: its own sender duty cycle says as much)."""
        return [(n, self._air[n], self._share[n]) for n, m in self._members.items() if m > 1]


def worst(margins: Sequence[Margin]) -> Margin | None:
    """The smallest margin (None: no limit applies)."""
    return min(margins, key=lambda m: m.margin, default=None)


def binding(margins: Sequence[Margin]) -> Margin | None:
    """The limit with the largest floor: the one that alone makes the run longest (None:
    no limit applies)."""
    return max(margins, key=lambda m: m.floor_s, default=None)


__all__ = ["Margin", "audit", "binding", "worst"]
