"""MQTT transport over paho-mqtt 2.x (``mqtt://host[:1883]``, ``mqtts://host[:8883]``).

Protocol choices, and why:

* MQTT v3.1.1 with ``clean_session=False`` and the caller's stable ``client_id``: the broker
  keeps the subscriptions and queues QoS 1 messages for this client while it is away
  (Mosquitto: ``persistence true`` keeps them across a broker restart too). v3.1.1 is what
  every broker and embedded client speaks; v5 would add nothing we use.
* Everything is QoS 1 (at least once): consumers must tolerate duplicates (the aggregator
  dedupes updates by agent and round).
* paho's network thread (``loop_start``) reconnects with exponential backoff 1 s .. 30 s and
  our ``on_connect`` re-subscribes (harmless when the session survived, essential when not).
* The outgoing queue is **unbounded** (``max_queued_messages=0``): while the broker is away,
  publish() keeps every QoS 1 message in paho's memory and resends it after reconnect, so
  nothing is silently lost across a broker restart. The price is memory proportional to
  what is published while offline (the agent publishes one update per round, so this is
  bounded by rounds x update size in practice). The queue lives in this process only.
* The Last Will (set_will) is QoS 1, not retained: the broker publishes it when the client
  vanishes without a DISCONNECT (crash, power loss, keepalive expiry).

Options (query string or keyword): ``timeout_s`` (connect/subscribe wait, default 10),
``close_timeout_s`` (flush wait at close, default 5), ``keepalive_s`` (default 30),
``max_inflight`` (unacknowledged QoS 1 messages on the wire, default 20), ``clean_session``
(default false), ``username``, ``password`` / ``password_file`` / ``password_env`` (no
default password, ever), and for ``mqtts``: ``ca_file``, ``cert_file``, ``key_file``,
``tls_insecure`` (skip host-name check only; default false), ``max_packet_bytes`` (the
broker's packet size limit when known, e.g. 4194304 for the shipped Mosquitto: a larger
message is refused before it is sent; default 0, unknown), ``share`` (a group name: every
subscription goes through ``$share/<group>/<pattern>``, a shared subscription, so the
broker hands each message to one member of the group; topics, ACL and the messages' topic
names are unchanged; for the aggregator on a broker cluster, docs/scaling.md; default none).

A message the broker disconnects on for its size is found after three losses in a row,
dropped, counted in ``stats.dropped`` and logged once as an ERROR, instead of being re-sent
forever (:mod:`edge_agent.transports.oversize`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any, Final

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, LogLevel, MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from edge_agent.errors import TransportConfigError, TransportError
from edge_agent.protocol import topics
from edge_agent.transports.base import Message, Role, Transport
from edge_agent.transports.oversize import OversizeDetector, Suspect, explain, packet_size
from edge_agent.transports.url import OptionReader, parse_url

log = logging.getLogger(__name__)

QOS = 1


def _no_delay(client: paho.Client, userdata: Any, sock: Any) -> None:
    """Send small messages at once: with Nagle's algorithm each hop of a round (update in,
    delta out) waited ~40 ms for a delayed ACK on loopback (88 ms rounds vs 8 ms on ZeroMQ)."""
    with contextlib.suppress(OSError, AttributeError):  # not TCP (e.g. a websocket wrapper)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


#: CONNACK codes (paho's MQTT v5 numbering of the v3.1.1 return codes) that a retry cannot
#: heal: bad user name or password, not authorized
_REFUSED_CREDENTIALS: Final = frozenset({134, 135})
#: unacceptable protocol version, client identifier rejected
_REFUSED_SETTINGS: Final = frozenset({132, 133})

#: paho's own log lines (see MqttTransport._on_paho_log)
_PAHO_LOG: Final = logging.getLogger(f"{__name__}.paho")
#: while the broker stays down, "still unreachable" is logged at most this often (s)
NOT_CONNECTED_EVERY_S: Final = 60.0


class MqttTransport(Transport):
    """Thread-safe MQTT client; see the module docstring for semantics and options."""

    def __init__(self, url: str, *, role: Role, client_id: str, **options: object) -> None:
        super().__init__(url, role=role, client_id=client_id)
        parsed = parse_url(url)
        if parsed.scheme not in ("mqtt", "mqtts"):
            raise TransportConfigError(
                f"{self.url} ({{url}}): MqttTransport needs an mqtt:// or mqtts:// URL", "url"
            )
        assert parsed.port is not None  # mqtt/mqtts have default ports
        self._host, self._port = parsed.host, parsed.port
        opts = OptionReader(url, {**parsed.options, **options})
        self._timeout_s = opts.get_float("timeout_s", 10.0)
        self._close_timeout_s = opts.get_float("close_timeout_s", 5.0)
        self._keepalive_s = opts.get_int("keepalive_s", 30, minimum=5)
        max_inflight = opts.get_int("max_inflight", 20, minimum=1)
        self._max_packet_bytes = opts.get_int("max_packet_bytes", 0)
        clean_session = opts.get_bool("clean_session", False)
        self._share = self._share_group(opts)
        username = opts.get_str("username")
        self._password_option = "password_file"  # the option to name when the broker refuses
        password = self._read_password(opts)
        tls: ssl.SSLContext | None = None
        if parsed.scheme == "mqtts":
            tls = self._tls_context(opts)
        opts.finish()

        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=clean_session,
            protocol=paho.MQTTv311,
            reconnect_on_failure=True,
        )
        client.on_log = self._on_paho_log  # not enable_logger: see _on_paho_log
        client.max_inflight_messages_set(max_inflight)
        client.max_queued_messages_set(0)  # unbounded: see module docstring
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        client.connect_timeout = max(1.0, min(self._timeout_s, 10.0))
        if username is not None:
            client.username_pw_set(username, password)
        elif password is not None:
            raise TransportConfigError(
                f"{self.url}: a password was given without a user name; set {{username}}",
                "username",
            )
        if tls is not None:
            client.tls_set_context(tls)
        client.on_connect = self._on_connect
        client.on_socket_open = _no_delay
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        self._client = client

        self._cond = threading.Condition()  # guards all fields below
        self._connect_lock = threading.Lock()  # serialises connect()/close()
        self._patterns: dict[str, None] = {}  # ordered set
        self._connected = False
        self._ever_connected = False
        self._loop_running = False
        self._closed = False
        self._refused: ReasonCode | None = None  # the broker's CONNACK, when it refused
        self._suback: dict[int, list[ReasonCode]] = {}
        self._sent = 0  # QoS 1 publishes handed to paho
        self._acked = 0  # PUBACKs received
        self._refused_counts: dict[str, int] = {}  # dropped inbound messages, by reason
        self._oversize = OversizeDetector()  # guarded by _cond
        self._oversize_logged = False
        self._tls = tls is not None
        self._not_connected_logged: float | None = None  # last "still not connected" line

    # -- configuration helpers -----------------------------------------------------------

    def _read_password(self, opts: OptionReader) -> str | None:
        password = opts.get_str("password")
        password_file = opts.get_str("password_file")
        password_env = opts.get_str("password_env")
        given = [n for n, v in (("password", password), ("password_file", password_file),
                                ("password_env", password_env)) if v is not None]  # fmt: skip
        if len(given) > 1:
            listed = ", ".join("{" + name + "}" for name in given)
            raise TransportConfigError(f"{self.url}: give only one of {listed}", *given)
        if given:
            self._password_option = given[0]
        if password_file is not None:
            try:
                return Path(password_file).read_text(encoding="utf-8").rstrip("\r\n")
            except OSError as exc:
                raise TransportConfigError(
                    f"{self.url}: cannot read {{password_file}} {password_file!r}: {exc.strerror}",
                    "password_file",
                ) from None
        if password_env is not None:
            value = os.environ.get(password_env)
            if value is None:
                raise TransportConfigError(
                    f"{self.url}: {{password_env}} names {password_env!r} but it is not set",
                    "password_env",
                )
            return value
        return password

    def _share_group(self, opts: OptionReader) -> str | None:
        """The ``share`` option: a shared-subscription group name (one topic level)."""
        group = opts.get_str("share")
        if group is not None:
            try:
                topics.validate_id(group, "share group")
            except ValueError as exc:
                raise TransportError(f"{self.url}: option share: {exc}") from None
        return group

    def _on_wire(self, pattern: str) -> str:
        """The filter sent to the broker: ``pattern`` itself, or through the share group."""
        return pattern if self._share is None else f"$share/{self._share}/{pattern}"

    def _tls_context(self, opts: OptionReader) -> ssl.SSLContext:
        ca_file = opts.get_str("ca_file")
        cert_file = opts.get_str("cert_file")
        key_file = opts.get_str("key_file")
        insecure = opts.get_bool("tls_insecure", False)
        try:
            context = ssl.create_default_context(cafile=ca_file)
            if cert_file is not None:
                context.load_cert_chain(cert_file, key_file)
            elif key_file is not None:
                raise TransportConfigError(
                    f"{self.url}: {{key_file}} given without {{cert_file}}", "key_file", "cert_file"
                )
        except OSError as exc:  # ssl.SSLError is an OSError
            raise TransportConfigError(
                f"{self.url}: cannot load TLS files ({{ca_file}} {ca_file!r}, "
                f"{{cert_file}} {cert_file!r}, {{key_file}} {key_file!r}): {exc}",
                "ca_file",
                "cert_file",
                "key_file",
            ) from None
        if insecure:
            context.check_hostname = False  # the certificate chain is still verified
        return context

    # -- paho callbacks (network thread) -------------------------------------------------

    def _on_connect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.ConnectFlags,
        reason_code: ReasonCode,
        properties: Any,
    ) -> None:
        if reason_code.is_failure:
            with self._cond:
                self._refused = reason_code
                self._cond.notify_all()
            return
        with self._cond:
            reconnect = self._ever_connected
            self._connected = self._ever_connected = True
            self._refused = None
            self._not_connected_logged = None  # a later outage starts its own count
            self._suback.clear()
            patterns = list(self._patterns)
            self._cond.notify_all()
        if reconnect:
            self._count("reconnects")
            log.info("%s: reconnected (session present: %s)", self.url, flags.session_present)
        if patterns:
            client.subscribe([(self._on_wire(p), QOS) for p in patterns])

    def _on_disconnect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Any,
    ) -> None:
        with self._cond:
            was_connected, self._connected = self._connected, False
            closing = self._closed
            suspect = self._oversize.lost() if was_connected and not closing else None
            self._cond.notify_all()
        if suspect is not None:
            self._drop_oversized(client, suspect)
        if was_connected and not closing:
            log.warning(
                "%s: connection lost (%s); reconnecting with backoff 1..30 s, "
                "QoS 1 publishes are queued meanwhile",
                self.url,
                reason_code,
            )

    def _on_paho_log(self, client: paho.Client, userdata: Any, level: int, buf: str) -> None:
        """paho's own log lines, on logger ``edge_agent.transports.mqtt.paho`` at paho's level,
        except "Client is not connected": paho logs it at ERROR on every pass of its network
        loop while the broker is down (every 1-30 s, its reconnect backoff). It goes to DEBUG;
        at most once per :data:`NOT_CONNECTED_EVERY_S` a WARNING says the broker is still
        unreachable (the loss itself was already logged by ``_on_disconnect``)."""
        if not buf.startswith("Client is not connected"):
            _PAHO_LOG.log(paho.LOGGING_LEVEL.get(LogLevel(level), logging.DEBUG), "%s", buf)
            return
        _PAHO_LOG.debug("%s: %s", self.url, buf)
        now = time.monotonic()
        last = self._not_connected_logged
        if self._closed or (last is not None and now - last < NOT_CONNECTED_EVERY_S):
            return
        self._not_connected_logged = now
        if last is not None:  # the first pass right after the loss: _on_disconnect said it
            log.warning(
                "%s: broker still unreachable; paho retries with backoff 1..30 s "
                "(this line repeats at most every %g s)",
                self.url,
                NOT_CONNECTED_EVERY_S,
            )

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        try:
            topic = msg.topic  # paho decodes it here; a lax broker may route invalid UTF-8
        except UnicodeDecodeError:
            self._refuse("topic_not_utf8", "a message's topic is not UTF-8")
            return
        self._deliver(Message(topic, bytes(msg.payload)))

    @property
    def refused(self) -> dict[str, int]:
        """Messages dropped before anyone read them, by reason (a copy; the aggregator adds
        them to ``cat_updates_rejected_total{reason}``): ``topic_not_utf8``."""
        with self._cond:
            return dict(self._refused_counts)

    def _refuse(self, reason: str, detail: str) -> None:
        with self._cond:
            self._refused_counts[reason] = self._refused_counts.get(reason, 0) + 1
        self._drop(reason, detail)

    def _on_publish(
        self,
        client: paho.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Any,
    ) -> None:
        with self._cond:
            self._acked += 1
            self._oversize.acked(mid)
            self._cond.notify_all()

    def _drop_oversized(self, client: paho.Client, suspect: Suspect) -> None:
        """Take the message the broker keeps disconnecting on out of paho's queue (paho has
        no public call for one message; its queue is guarded by ``_out_message_mutex``)."""
        with client._out_message_mutex:
            client._out_messages.pop(suspect.mid, None)
        with self._cond:
            self._sent -= 1  # never to be acknowledged: close() must not wait for it
            largest = self._oversize.largest_acked
        self._oversized(explain(self.url, suspect, largest))

    def _oversized(self, text: str) -> None:
        """Count a message dropped for its size; the first one is logged as an ERROR."""
        with self._cond:
            first, self._oversize_logged = not self._oversize_logged, True
        self._count("dropped")
        if first:
            log.error("%s", text)

    def _on_subscribe(
        self,
        client: paho.Client,
        userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Any,
    ) -> None:
        with self._cond:
            self._suback[mid] = reason_codes
            self._cond.notify_all()

    # -- the contract --------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected

    def connect(self) -> None:
        with self._connect_lock:
            if self._closed:
                raise TransportError(f"{self.url}: transport is closed; open a new one")
            if self._loop_running:
                return  # connected once; paho keeps reconnecting in the background
            deadline = time.monotonic() + self._timeout_s
            self._open_socket(deadline)
            self._client.loop_start()
            self._loop_running = True
            with self._cond:
                self._cond.wait_for(
                    lambda: self._connected or self._refused is not None,
                    timeout=max(0.0, deadline - time.monotonic()),
                )
                refused, connected = self._refused, self._connected
            if connected:
                return
            self._stop_loop()
            if refused is not None:
                raise self._refusal(refused)
            raise TransportError(
                f"MQTT broker at {self.url} accepted the TCP connection but sent no CONNACK "
                f"within {self._timeout_s:g} s; is it an MQTT broker (TLS: use mqtts://)?"
            )

    def _open_socket(self, deadline: float) -> None:
        """paho's blocking connect, retried until ``deadline`` so a broker that is starting
        up is waited for; fails with the last socket error."""
        while True:
            try:
                self._client.connect(self._host, self._port, keepalive=self._keepalive_s)
                return
            except ssl.SSLCertVerificationError as exc:
                raise TransportConfigError(
                    f"TLS handshake with {self.url} failed: the broker's certificate is not "
                    f"trusted ({exc.verify_message}); set {{ca_file}} to the CA that signed it "
                    "(and connect by the host name in it)",
                    "ca_file",
                ) from None
            except ssl.SSLError as exc:
                if isinstance(exc, ssl.SSLEOFError) or "WRONG_VERSION_NUMBER" in str(exc):
                    raise self._tls_mismatch(exc) from None
                raise TransportConfigError(
                    f"TLS handshake with {self.url} failed: {exc}; check {{ca_file}} (the CA "
                    "that signed the broker certificate), {cert_file}/{key_file}, and the host "
                    "name",
                    "ca_file",
                    "cert_file",
                    "key_file",
                ) from None
            except OSError as exc:
                remaining = deadline - time.monotonic()
                if self._tls and isinstance(exc, (ConnectionResetError, ConnectionAbortedError)):
                    raise self._tls_mismatch(exc) from None
                if remaining <= 0:
                    raise TransportError(
                        f"cannot connect to MQTT broker at {self.url}: "
                        f"{exc.strerror or exc} (waited {self._timeout_s:g} s); is the broker "
                        "running and listening there? Start Mosquitto or fix host/port "
                        "(e.g. mqtt://localhost:1883)"
                    ) from None
                time.sleep(min(0.25, remaining))

    def _tls_mismatch(self, exc: OSError) -> TransportConfigError:
        """The error for a peer that dropped our TLS ClientHello: most often a plain MQTT
        listener (Mosquitto closes on the bytes it cannot parse as MQTT)."""
        return TransportConfigError(
            f"TLS handshake with {self.url} failed: the server closed the connection "
            f"({exc.strerror or exc}); port {self._port} is likely a plain MQTT listener, "
            f"not TLS: in {{url}} use mqtt://{self._host}:{self._port} for a plain listener, "
            "or the broker's TLS port (usually 8883) with mqtts://",
            "url",
        )

    def _refusal(self, code: ReasonCode) -> TransportError:
        """The error for a refused CONNECT: credentials and client ids are configuration
        (exit 2 at the CLIs); "server unavailable" may heal, so it stays a TransportError."""
        head = f"MQTT broker at {self.url} refused client {self.client_id!r}: {code}"
        if code.value in _REFUSED_CREDENTIALS:
            return TransportConfigError(
                f"{head}; check {{username}} and {{{self._password_option}}} against the "
                "broker's password file (deploy/mosquitto/add-agent.sh writes both)",
                "username",
                self._password_option,
            )
        if code.value in _REFUSED_SETTINGS:
            return TransportConfigError(
                f"{head}; the broker does not accept this client id or protocol (MQTT "
                "v3.1.1): check {username} and the broker's settings",
                "username",
            )
        return TransportError(f"{head}; the broker may be overloaded or restarting")

    def _stop_loop(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()
        self._loop_running = False

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        topics.validate_topic(topic)
        if self._closed:
            raise TransportError(f"{self.url}: publish after close(); open a new transport")
        size = packet_size(topic, len(payload))
        if self._max_packet_bytes and size > self._max_packet_bytes:
            self._oversized(
                f"{self.url}: a {size}-byte message on {topic!r} is above the broker's packet "
                f"size limit of {self._max_packet_bytes} bytes (option max_packet_bytes); it "
                "is dropped (counted in stats.dropped). Raise the broker's max_packet_size "
                "and this option together, or send smaller messages (a smaller d or T)"
            )
            return
        info = self._client.publish(topic, bytes(payload), qos=QOS, retain=retain)
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            # NO_CONN means "queued until reconnect"; anything else means paho refused it.
            self._drop("paho refused the publish", paho.error_string(info.rc))
            return
        with self._cond:
            self._sent += 1
            self._oversize.sent(info.mid, size, topic)
        self._count("published")

    def subscribe(self, pattern: str) -> None:
        """Subscribe at QoS 1; when connected, waits (bounded by ``timeout_s``) for the
        broker's SUBACK so messages published right after this call are received."""
        topics.validate_pattern(pattern)
        with self._cond:
            if self._closed:
                raise TransportError(f"{self.url}: subscribe after close()")
            self._patterns[pattern] = None
            connected = self._connected
        if not connected:
            return  # on_connect subscribes
        rc, mid = self._client.subscribe(self._on_wire(pattern), qos=QOS)
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            return  # connection just dropped; on_connect re-subscribes
        with self._cond:
            self._cond.wait_for(
                lambda: mid in self._suback or not self._connected, timeout=self._timeout_s
            )
            codes = self._suback.pop(mid, None)
        if codes is None:
            log.warning(
                "%s: no SUBACK for %r yet; it will apply once acknowledged", self.url, pattern
            )
        elif any(code.is_failure for code in codes):
            raise TransportError(
                f"MQTT broker at {self.url} refused the subscription {pattern!r} for client "
                f"{self.client_id!r}; check the broker's ACL"
            )

    def set_will(self, topic: str, payload: bytes) -> None:
        topics.validate_topic(topic)
        if self._loop_running:
            raise TransportError(f"{self.url}: set_will() must be called before connect()")
        self._client.will_set(topic, bytes(payload), qos=QOS, retain=False)

    def close(self) -> None:
        """Wait up to ``close_timeout_s`` for outstanding QoS 1 publishes to be acknowledged,
        then disconnect cleanly (no Last Will) and join paho's thread."""
        with self._connect_lock:
            if self._closed:
                return
            if self._loop_running:
                with self._cond:
                    self._cond.wait_for(
                        lambda: self._acked >= self._sent, timeout=self._close_timeout_s
                    )
                    unacked = max(0, self._sent - self._acked)
                    self._closed = True
                if unacked:
                    self._drop(
                        "not acknowledged by the broker before close",
                        f"{unacked} QoS 1 message(s) after {self._close_timeout_s:g} s",
                        n=unacked,
                    )
                self._stop_loop()
            else:
                with self._cond:
                    unacked, self._closed = self._sent, True
                if unacked:
                    self._drop("closed before ever connecting", n=unacked)
            self._connected = False
        self._wake_receivers()
