"""The agent's uplink: every message a device sends goes out here.

:class:`Uplink` owns the radio's duty-cycle state. Each message is published on the
transport, priced on the profile into the agent's ledger, and owes the silence the profile's
duty cycle asks for after it (``airtime / uplink_duty_share``). Under ``duty_cycle="wait"``
nothing goes out before that silence is served. Control messages sent during it wait in an
outbox (the newest per topic), which the agent's loop flushes one at a time when the radio
is free.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from edge_agent.agent.ledger import CostLedger
from edge_agent.agent.sealer import Outgoing, Sealer
from edge_agent.links.cost import MessageCost
from edge_agent.links.profiles import CostProfile
from edge_agent.transports import Transport

log = logging.getLogger("edge_agent")

DutyCycle = Literal["wait", "ignore"]

#: an owed silence at least this long is worth an INFO line
_SILENCE_WORTH_A_LINE_S = 5.0


class Uplink:
    """What the device sends, what it cost, and when its radio may send again."""

    def __init__(
        self,
        transport: Transport,
        profile: CostProfile,
        ledger: CostLedger,
        sealer: Sealer,
        *,
        duty_cycle: DutyCycle,
        clock: Callable[[], float],
    ) -> None:
        self.transport = transport
        self.profile = profile
        self.ledger = ledger
        self.sealer = sealer
        self.duty_cycle = duty_cycle
        self.clock = clock
        #: clock time from which the radio may send again (its owed silence served)
        self.free_at = 0.0
        self._outbox: list[tuple[str, Outgoing]] = []

    def quiet(self) -> bool:
        """True while the radio owes silence and this agent waits for it to be served."""
        return self.duty_cycle == "wait" and self.clock() < self.free_at

    def owed_s(self) -> float:
        """Seconds of silence still owed (0 when the radio is free)."""
        return max(0.0, self.free_at - self.clock())

    @property
    def waiting(self) -> bool:
        """True when a control message waits in the outbox for the radio."""
        return bool(self._outbox)

    def publish(self, topic: str, payload: bytes, *, update: bool) -> MessageCost:
        """Send one message, account it (as an update or not), and owe the silence after it."""
        self.transport.publish(topic, payload)
        cost = self.profile.message_cost(len(payload))
        self.ledger.add(cost, update=update)
        now = self.clock()
        self.free_at = max(self.free_at, now) + cost.airtime_s + cost.silence_s
        owed = self.free_at - now
        if self.duty_cycle == "wait" and owed >= _SILENCE_WORTH_A_LINE_S:
            duty, bands = self.profile.duty_cycle or 1.0, self.profile.duty_cycle_bands
            log.info("radio silent for %.1f s (duty cycle %.3g %%%s)", owed, 100 * duty,
                     f" in each of {bands} sub-bands" if bands > 1 else "")  # fmt: skip
        return cost

    def send_control(self, topic: str, msg: Outgoing) -> None:
        """Control traffic costs radio time too: into the ledger (not as an update), and
        while the radio is quiet it waits in the outbox (the newest per topic). It is sealed
        when it goes out, so its counter is above every one sent before."""
        if self.quiet():
            self._outbox = [(t, m) for t, m in self._outbox if t != topic]
            self._outbox.append((topic, msg))
            return
        self.publish(topic, self.sealer.seal(msg), update=False)

    def flush_one(self) -> None:
        """Send the oldest waiting control message (one: each owes its own silence)."""
        topic, msg = self._outbox.pop(0)
        self.publish(topic, self.sealer.seal(msg), update=False)

    def goodbye(self, topic: str, msg: Outgoing) -> None:
        """The last message: on the air and in the ledger, but no silence is owed after it."""
        payload = self.sealer.seal(msg)
        self.transport.publish(topic, payload)
        self.ledger.add(self.profile.message_cost(len(payload)), update=False)
