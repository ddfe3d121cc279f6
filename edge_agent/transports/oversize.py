"""Finding the message an MQTT broker refuses for its size, so a client stops re-sending it.

A broker that limits packet size (Mosquitto ``max_packet_size``; the shipped config allows
4 MiB) answers an MQTT v3.1.1 client's oversized PUBLISH by closing the connection, with no
reason a v3.1.1 client can read. paho then reconnects and re-sends every unacknowledged
QoS 1 message, the same one first, and is disconnected again: forever, and every message
queued behind it waits too.

The rule: when the connection is lost :data:`STRIKES` times in a row while the same message
is the largest one not yet acknowledged (never acknowledged in between), that message is
the one the broker refuses. The caller then drops it from paho's queue, counts it and logs
one ERROR (:func:`explain`). A link that drops three times in a row while one large message
is outstanding would lose that message too; a broker that refuses a size does so at once,
so the loop this stops costs about three reconnect intervals (1 s each at first).

``max_packet_bytes`` (the transport option, when the broker's limit is known) refuses such
a message before it is ever sent. Sizes are whole PUBLISH packets (:func:`packet_size`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: consecutive connection losses with the same largest unacknowledged message
STRIKES: Final = 3


def packet_size(topic: str, payload_len: int) -> int:
    """Bytes of a QoS 1 PUBLISH packet: fixed header, topic, packet id, payload."""
    remaining = 2 + len(topic.encode()) + 2 + payload_len
    length_bytes = 1
    while remaining >= 128**length_bytes and length_bytes < 4:
        length_bytes += 1
    return 1 + length_bytes + remaining


@dataclass(frozen=True)
class Suspect:
    """The message the broker keeps disconnecting on: paho's ``mid``, its size, its topic."""

    mid: int
    size: int
    topic: str


class OversizeDetector:
    """Tracks unacknowledged publishes (not thread-safe: the transport holds its lock)."""

    def __init__(self, strikes: int = STRIKES) -> None:
        self.strikes = strikes
        self._unacked: dict[int, tuple[int, str]] = {}  # mid -> (packet bytes, topic)
        self._early: set[int] = set()  # acknowledged before sent() could record them
        self._suspect: int | None = None
        self._count = 0
        #: the largest packet the broker acknowledged (its limit is at least this)
        self.largest_acked = 0

    def sent(self, mid: int, size: int, topic: str) -> None:
        """paho took a publish as ``mid`` (its PUBACK may have come first: paho calls
        on_publish on its own thread, possibly before publish() returned)."""
        if mid in self._early:
            self._early.discard(mid)
            self.largest_acked = max(self.largest_acked, size)
        else:
            self._unacked[mid] = (size, topic)

    def acked(self, mid: int) -> None:
        done = self._unacked.pop(mid, None)
        if done is None:
            self._early.add(mid)
        else:
            self.largest_acked = max(self.largest_acked, done[0])
        if mid == self._suspect:
            self._suspect, self._count = None, 0

    def lost(self) -> Suspect | None:
        """A connection was lost: the message to drop, once it is known (then forgotten)."""
        if not self._unacked:
            self._suspect, self._count = None, 0
            return None
        mid = max(self._unacked, key=lambda m: self._unacked[m][0])
        self._count = self._count + 1 if mid == self._suspect else 1
        self._suspect = mid
        if self._count < self.strikes:
            return None
        size, topic = self._unacked.pop(mid)
        self._suspect, self._count = None, 0
        return Suspect(mid, size, topic)


def explain(url: str, suspect: Suspect, largest_acked: int) -> str:
    """The ERROR line: what was dropped, the limit it broke, and the fix."""
    bound = f"between {largest_acked} and {suspect.size - 1}" if largest_acked else "below"
    if not largest_acked:
        bound += f" {suspect.size}"
    return (
        f"{url}: the broker closed the connection {STRIKES} times in a row on a "
        f"{suspect.size}-byte message on {suspect.topic!r}: it is above the broker's packet "
        f"size limit (Mosquitto max_packet_size; its limit here is {bound} bytes; the shipped "
        "config allows 4194304). The message is dropped (counted in stats.dropped) so the "
        "others get through; raise max_packet_size on the broker, or send smaller messages "
        "(a smaller d or T), and set the transport option max_packet_bytes to the broker's "
        "limit to refuse such a message before sending it"
    )
