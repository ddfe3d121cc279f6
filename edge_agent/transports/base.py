"""The transport contract: publish/subscribe of ``(topic, payload bytes)`` messages.

A transport is synchronous and thread-safe: any thread may publish, subscribe or recv;
inbound messages wait in an unbounded FIFO until :meth:`Transport.recv` takes them (the
consumer is expected to keep up; a slow consumer costs memory, never a lost message).
Topics follow MQTT rules on every transport (see :mod:`edge_agent.protocol.topics`).
"""

from __future__ import annotations

import logging
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Literal, Self

from edge_agent.transports.url import redact

Role = Literal["agent", "aggregator"]
ROLES: Final = ("agent", "aggregator")

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Message:
    """One message: an MQTT-style topic name and an opaque payload."""

    topic: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class TransportStats:
    """Counters since the transport was created (a snapshot; they never go down).

    ``published``: publish() calls accepted; ``received``: messages put in the inbox;
    ``reconnects``: successful connections after the first; ``dropped``: messages given up
    on (malformed inbound, outbound with no peer for too long, unacknowledged at close).
    """

    published: int = 0
    received: int = 0
    reconnects: int = 0
    dropped: int = 0


class _Closed:
    """Inbox sentinel that wakes receivers blocked in recv() when the transport closes."""


_CLOSED: Final = _Closed()


class Transport(ABC):
    """Base class: owns the inbox, the counters and the context-manager protocol.

    Subclasses implement connect/close/publish/subscribe/set_will/connected and call
    :meth:`_deliver` (inbound), :meth:`_count` and :meth:`_drop` from any thread.
    """

    def __init__(self, url: str, *, role: Role, client_id: str) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if not client_id:
            raise ValueError("client_id must be a non-empty string (stable across restarts)")
        self.url: str = redact(url)
        self.role: Role = role
        self.client_id: str = client_id
        self._inbox: queue.SimpleQueue[Message | _Closed] = queue.SimpleQueue()
        self._sink: Callable[[Message], None] | None = None
        self._stats_lock = threading.Lock()
        self._counters = {"published": 0, "received": 0, "reconnects": 0, "dropped": 0}
        self._logged_reasons: set[str] = set()

    # -- the contract --------------------------------------------------------------------

    @abstractmethod
    def connect(self) -> None:
        """Connect (idempotent). Waits a bounded time (option ``timeout_s``) and raises
        TransportError naming the URL and the likely fix on failure."""

    @abstractmethod
    def close(self) -> None:
        """Disconnect and release threads and sockets (idempotent). Pending outbound
        messages get a bounded time to flush; what is left is counted as dropped."""

    @abstractmethod
    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Send ``payload`` to ``topic``; never blocks for long, never raises because the
        peer is away (the message is queued or, after a bounded time, dropped and counted).
        Raises TransportError after close()."""

    @abstractmethod
    def subscribe(self, pattern: str) -> None:
        """Receive messages matching MQTT filter ``pattern`` (``+``, ``#``); kept across
        reconnects."""

    @abstractmethod
    def set_will(self, topic: str, payload: bytes) -> None:
        """Last Will published by the broker if this client vanishes without close().
        Call before connect(). Not supported by every transport (see the subclass)."""

    @property
    @abstractmethod
    def connected(self) -> bool:
        """True while the transport believes it can reach its peer/broker."""

    # -- shared behaviour ----------------------------------------------------------------

    def recv(self, timeout_s: float | None = None) -> Message | None:
        """Next inbound message, or None after ``timeout_s`` seconds (None: wait until a
        message arrives or the transport is closed)."""
        try:
            item = self._inbox.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if isinstance(item, _Closed):
            self._inbox.put(item)  # wake the next blocked receiver too
            return None
        return item

    def deliver_to(self, sink: Callable[[Message], None]) -> None:
        """Hand every inbound message to ``sink`` (e.g. the ``put`` of a consumer's own
        queue), on the thread that received it, instead of queueing it for :meth:`recv`.

        For a consumer that merges several transports into one queue: it saves a receiver
        thread and a hand-off per message. Call before :meth:`connect`; messages already
        queued are handed over first, in order. Afterwards :meth:`recv` only returns None.
        """
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if not isinstance(item, _Closed):
                sink(item)
        self._sink = sink

    @property
    def stats(self) -> TransportStats:
        with self._stats_lock:
            return TransportStats(**self._counters)

    def __enter__(self) -> Self:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.url!r}, role={self.role!r}, client_id={self.client_id!r})"
        )

    # -- helpers for subclasses ----------------------------------------------------------

    def _deliver(self, message: Message) -> None:
        sink = self._sink
        if sink is None:
            self._inbox.put(message)
        else:
            sink(message)
        with self._stats_lock:
            self._counters["received"] += 1

    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self._counters[name] += n

    def _drop(self, reason: str, detail: str = "", n: int = 1) -> None:
        """Count ``n`` dropped messages; log each distinct ``reason`` once (warning)."""
        with self._stats_lock:
            self._counters["dropped"] += n
            first = reason not in self._logged_reasons
            self._logged_reasons.add(reason)
        if first:
            log.warning(
                "%s: dropped message(s): %s%s (logged once per reason; see stats.dropped)",
                self.url,
                reason,
                f" ({detail})" if detail else "",
            )

    def _wake_receivers(self) -> None:
        self._inbox.put(_CLOSED)
