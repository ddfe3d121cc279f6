"""In-process broker with MQTT semantics, for the simulator and tests (``memory://<name>``).

Semantics kept from MQTT: wildcard filters (shared matcher :func:`topics.matches`),
retained messages (the last retained payload per topic is delivered on subscribe; an empty
retained payload clears it), one copy per subscriber even with overlapping filters, a
publisher receives its own messages if subscribed, a single global order per broker (every
subscriber sees messages in the order the broker accepted them), and a Last Will that
:meth:`MemoryTransport.kill` publishes (simulating a device that dies). Not kept: QoS and
persistent sessions (delivery is in-process and cannot fail).

Brokers are process-global by name, so ``open_transport("memory://sim", ...)`` in the
aggregator and in every simulated agent reach the same broker.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from edge_agent.errors import TransportError
from edge_agent.protocol import topics
from edge_agent.transports.base import Message, Role, Transport
from edge_agent.transports.url import OptionReader, parse_url


class MemoryBroker:
    """A thread-safe in-memory broker. Use :func:`get_broker` to share one by name."""

    def __init__(self, name: str = "default") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._subs: dict[MemoryTransport, set[str]] = {}
        self._retained: dict[str, bytes] = {}
        # topic -> subscribers whose filters match; cleared whenever subscriptions change,
        # so publishing thousands of messages to a few topics costs one dict lookup each.
        self._routes: dict[str, tuple[MemoryTransport, ...]] = {}

    def attach(self, client: MemoryTransport) -> None:
        with self._lock:
            self._subs.setdefault(client, set())
            self._routes.clear()

    def detach(self, client: MemoryTransport) -> None:
        with self._lock:
            self._subs.pop(client, None)
            self._routes.clear()

    def subscribe(self, client: MemoryTransport, pattern: str) -> None:
        """Add ``pattern`` for ``client`` and deliver matching retained messages to it."""
        topics.validate_pattern(pattern)
        with self._lock:
            if client not in self._subs:
                raise TransportError(f"memory://{self.name}: {client.client_id} is not attached")
            self._subs[client].add(pattern)
            self._routes.clear()
            for topic, payload in self._retained.items():
                if topics.matches(pattern, topic):
                    client.arrive(Message(topic, payload))

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> int:
        """Deliver to every matching subscriber; return how many received it."""
        message = Message(topic, payload)
        with self._lock:
            if retain:
                if payload:
                    self._retained[topic] = payload
                else:
                    self._retained.pop(topic, None)
            targets = self._routes.get(topic)
            if targets is None:
                targets = tuple(
                    client
                    for client, patterns in self._subs.items()
                    if any(topics.matches(p, topic) for p in patterns)
                )
                self._routes[topic] = targets
            # Delivering under the lock gives every subscriber the same global order.
            for client in targets:
                client.arrive(message)
            return len(targets)

    def retained(self) -> Mapping[str, bytes]:
        """A copy of the retained messages (topic -> payload)."""
        with self._lock:
            return dict(self._retained)


_brokers: dict[str, MemoryBroker] = {}
_brokers_lock = threading.Lock()


def get_broker(name: str = "default") -> MemoryBroker:
    """The process-global broker called ``name`` (created on first use)."""
    with _brokers_lock:
        broker = _brokers.get(name)
        if broker is None:
            broker = _brokers[name] = MemoryBroker(name)
        return broker


def drop_broker(name: str) -> None:
    """Forget broker ``name`` (its retained messages go with it); for test isolation.
    Transports still attached keep working on the old broker object."""
    with _brokers_lock:
        _brokers.pop(name, None)


class MemoryTransport(Transport):
    """Client of a :class:`MemoryBroker`; URL ``memory://<broker name>``.

    Options: none. Messages published before connect() are held and sent on connect (like
    MQTT QoS 1 queueing); publishing after close() raises TransportError.
    """

    def __init__(self, url: str, *, role: Role, client_id: str, **options: object) -> None:
        super().__init__(url, role=role, client_id=client_id)
        parsed = parse_url(url)
        if parsed.scheme != "memory":
            raise TransportError(f"{self.url}: MemoryTransport needs a memory:// URL")
        OptionReader(url, {**parsed.options, **options}).finish()
        self.broker = get_broker(parsed.host)
        self._lock = threading.Lock()
        self._connected = False
        self._closed = False
        self._will: Message | None = None
        self._patterns: list[str] = []
        self._held: list[tuple[Message, bool]] = []

    # Identity-based hashing: the broker keys subscriptions by transport object.
    __hash__ = object.__hash__

    def arrive(self, message: Message) -> None:
        """The in-process broker hands ``message`` to this client (counted as received, then
        to the sink or the inbox, as the other transports' receive threads do)."""
        self._deliver(message)

    @property
    def connected(self) -> bool:
        return self._connected

    def connect(self) -> None:
        with self._lock:
            if self._closed:
                raise TransportError(f"{self.url}: transport is closed; open a new one")
            if self._connected:
                return
            self.broker.attach(self)
            self._connected = True
            patterns, self._patterns = self._patterns, []
            held, self._held = self._held, []
        for pattern in patterns:
            self.subscribe(pattern)
        for message, retain in held:
            self.broker.publish(message.topic, message.payload, retain=retain)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        topics.validate_topic(topic)
        if not self._connected:
            with self._lock:
                if self._closed:
                    raise TransportError(f"{self.url}: publish after close(); open a new one")
                if not self._connected:
                    self._held.append((Message(topic, bytes(payload)), retain))
                    self._count("published")
                    return
        self.broker.publish(topic, bytes(payload), retain=retain)
        self._count("published")

    def subscribe(self, pattern: str) -> None:
        topics.validate_pattern(pattern)
        with self._lock:
            if self._closed:
                raise TransportError(f"{self.url}: subscribe after close(); open a new one")
            if not self._connected:
                self._patterns.append(pattern)
                return
        self.broker.subscribe(self, pattern)

    def set_will(self, topic: str, payload: bytes) -> None:
        topics.validate_topic(topic)
        with self._lock:
            if self._connected:
                raise TransportError(f"{self.url}: set_will() must be called before connect()")
            self._will = Message(topic, bytes(payload))

    def close(self) -> None:
        """Normal disconnect: the Last Will is *not* published."""
        self._shutdown(publish_will=False)

    def kill(self) -> None:
        """Abnormal disconnect (simulates a dead device): publish the Last Will, then close."""
        self._shutdown(publish_will=True)

    def _shutdown(self, *, publish_will: bool) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            was_connected, self._connected = self._connected, False
            if self._held:
                self._drop("closed before connect", n=len(self._held))
                self._held.clear()
        if was_connected:
            self.broker.detach(self)
            if publish_will and self._will is not None:
                self.broker.publish(self._will.topic, self._will.payload)
        self._wake_receivers()
