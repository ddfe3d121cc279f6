"""When a simulated member's update reaches the engine and when it holds the next version:
the duty cycle restricts transmitting, not receiving.

A duty-cycled radio owes ``airtime * (1/share - 1)`` seconds of silence after it sends
(aggregator.engine.cadence). That silence is its transmitter's, so whether a member can
receive while it owes it depends on how its downlink reaches it:

- a member of a class B or class C multicast group (its profile has a shared downlink,
  docs/multicast.md) listens in its ping slots or continuously, whatever its transmitter
  owes: its reception runs during its silence, and the round's time is governed by the
  later of the two (``max``), not their sum;
- a radio without a duty cycle owes no silence: nothing to overlap;
- a class A member (a LoRaWAN unicast downlink) receives only in the RX1/RX2 windows after
  one of its own uplinks, so a downlink waits until its radio may send again: its
  reception starts when its silence is over (the uplink that opens the window is not
  priced here).

Both the lockstep rounds and the event-by-event cadence (aggregator.sim.experiment) use
these rules. The audit (aggregator.sim.audit) checks the result: overlapping a reception
with a silence moves no transmission earlier than the radio's own silence allows.
"""

from __future__ import annotations

from collections.abc import Sequence

from edge_agent.links.profiles import CostProfile

__all__ = ["cap_spacing_s", "receives_while_silent", "reception_ends", "uplink_arrivals"]


def cap_spacing_s(profile: CostProfile) -> float:
    """The time between two downlinks its network allows a member on its own unicast link
    (86,400 s over the daily cap; 0.0 without a cap): the last frame of what was addressed
    to it arrives that long before the engine counts its link free again (the engine paces
    a link by the cap's share of a day per frame, aggregator.engine.downlink.broadcast)."""
    down = profile.downlink
    if down is None or down.max_messages_per_day is None:
        return 0.0
    return 86_400.0 / down.max_messages_per_day


def receives_while_silent(profile: CostProfile) -> bool:
    """Whether a member on ``profile`` may receive while its transmitter owes silence (a
    class B/C group member, or a radio without a duty cycle; see the module doc)."""
    return profile.shared_downlink is not None or profile.uplink_duty_share is None


def uplink_arrivals(free_after: Sequence[float], silence_added: Sequence[float]) -> list[float]:
    """When each member's update reached the engine: the end of its airtime, which is when
    its radio is free again (``free_after``, after the send) less the silence the send
    added (``silence_added``). A member that owed silence from its last send sent when it
    was over (the agent's ``max(quiet_until, now)``)."""
    return [f - s for f, s in zip(free_after, silence_added, strict=True)]


def reception_ends(
    published_at: float,
    busy_s: Sequence[float],
    free_at: Sequence[float],
    overlaps: Sequence[bool],
) -> list[float]:
    """When each member holds what was published at ``published_at``: its reception takes
    ``busy_s`` (airtime received plus the senders' silence), starting at once when it
    ``overlaps`` (:func:`receives_while_silent`) and else when its radio is free
    (``free_at``: a class A downlink needs an uplink). A member that received nothing holds
    it at ``published_at``."""
    out: list[float] = []
    for busy, free, overlap in zip(busy_s, free_at, overlaps, strict=True):
        if busy <= 0.0:
            out.append(published_at)
            continue
        start = published_at if overlap else max(published_at, free)
        out.append(start + busy)
    return out
