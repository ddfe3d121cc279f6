"""Transports: one small publish/subscribe contract over memory, MQTT and ZeroMQ.

    from edge_agent.protocol import topics
    from edge_agent.transports import open_transport

    with open_transport("mqtt://broker:1883", role="agent", client_id="agent-7") as t:
        t.subscribe(topics.model("job1"))
        t.publish(topics.update("job1", "agent-7"), payload)
        message = t.recv(timeout_s=5.0)

URL schemes (the registry :data:`TRANSPORTS`): ``memory``, ``mqtt``, ``mqtts``, ``zmq+tcp``.
Options come from the URL query string and/or keyword arguments (keywords win); each
transport module documents its options. paho-mqtt and pyzmq are imported only when their
scheme is used.
"""

from __future__ import annotations

from collections.abc import Callable

from edge_agent.errors import lookup
from edge_agent.transports.base import ROLES, Message, Role, Transport, TransportStats
from edge_agent.transports.memory import MemoryBroker, MemoryTransport, drop_broker, get_broker
from edge_agent.transports.url import ParsedUrl, parse_url

TransportFactory = Callable[..., Transport]


def _memory(url: str, **kwargs: object) -> Transport:
    return MemoryTransport(url, **kwargs)  # type: ignore[arg-type]


def _mqtt(url: str, **kwargs: object) -> Transport:
    from edge_agent.transports.mqtt import MqttTransport

    return MqttTransport(url, **kwargs)  # type: ignore[arg-type]


def _zmq(url: str, **kwargs: object) -> Transport:
    from edge_agent.transports.zmq import ZmqTransport

    return ZmqTransport(url, **kwargs)  # type: ignore[arg-type]


#: URL scheme -> factory ``(url, *, role, client_id, **options) -> Transport``.
TRANSPORTS: dict[str, TransportFactory] = {
    "memory": _memory,
    "mqtt": _mqtt,
    "mqtts": _mqtt,
    "zmq+tcp": _zmq,
}


def open_transport(url: str, *, role: Role, client_id: str, **options: object) -> Transport:
    """Create (not connect) the transport for ``url``; use it as a context manager or call
    connect(). ``client_id`` must be stable across restarts (MQTT persistent sessions).

    Raises UnknownNameError listing the valid schemes, TransportError for a malformed URL or
    an unknown/invalid option, ValueError for a bad role.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    scheme = parse_url(url).scheme
    factory = lookup(TRANSPORTS, scheme, "transport scheme")
    return factory(url, role=role, client_id=client_id, **options)


__all__ = [
    "ROLES",
    "TRANSPORTS",
    "MemoryBroker",
    "MemoryTransport",
    "Message",
    "ParsedUrl",
    "Role",
    "Transport",
    "TransportStats",
    "drop_broker",
    "get_broker",
    "open_transport",
    "parse_url",
]
