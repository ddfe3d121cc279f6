"""What makes an agent's messages its own: the counter and MAC of its hellos, status
messages and requests, and the seq of its updates (docs/wire-format.md section 11.1).

:class:`Sealer` owns the signing agent's counter: it only ever rises
(:func:`edge_agent.protocol.mac.next_counter` from the wall clock), and every JSON message
takes the next one when it goes out, so its counter is above every one sent before. The
counter the MQTT Last Will carries is taken at connect and announced in each hello: the
aggregator accepts that one offline status once. Without a key nothing is counted and a
message is its JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from edge_agent.protocol import mac, messages

Outgoing = messages.Hello | messages.Status | messages.Request


class Sealer:
    """The seal of one agent's messages (``key`` None: unsigned)."""

    def __init__(
        self, key: bytes | None, job: str, agent: str, wall_clock: Callable[[], float]
    ) -> None:
        self.key = key
        self.job = job
        self.agent = agent
        self.wall_clock = wall_clock
        #: the last counter used (None before the first), and the one the Last Will carries
        self.ctr: int | None = None
        self.will_ctr: int | None = None

    def seal(self, msg: Outgoing) -> bytes:
        """The bytes of a hello, status or request: its JSON, and with a key the next counter
        in it and the MAC after it."""
        if self.key is None:
            return messages.dump(msg)
        text = messages.dump(replace(msg, ctr=self.take()))
        return mac.seal(self.key, msg.type, self.job, self.agent, text)

    def will(self) -> bytes:
        """The Last Will (an offline status), sealed now; its counter is :attr:`will_ctr`."""
        payload = self.seal(messages.Status(state="offline", agent=self.agent))
        self.will_ctr = self.ctr
        return payload

    def take(self) -> int:
        """The next counter (a signing agent's JSON ``ctr`` and its updates' seq)."""
        self.ctr = mac.next_counter(self.ctr, self.wall_clock())
        return self.ctr

    def next_seq(self, seq: int) -> int:
        """The seq of the next update, ``seq`` unsigned, or (with a key) a lower bound of it."""
        if self.key is None:
            return seq
        return mac.next_counter(self.ctr, self.wall_clock())
