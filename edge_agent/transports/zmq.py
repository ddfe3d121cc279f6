"""Brokerless ZeroMQ transport (``zmq+tcp://host:port``), socket layout per docs/architecture.md.

* aggregator: binds ``PULL`` at ``port`` (inbound from agents) and ``PUB`` at ``port + 1``.
* agent: connects ``PUSH`` to ``port`` and ``SUB`` to ``port + 1``.

Messages are two frames ``[topic utf-8, payload]``. subscribe(pattern) installs the
pattern's literal prefix as the SUB filter (agents) and every inbound message is then matched
exactly with :func:`topics.matches`, on both roles, so filtering agrees with MQTT.

Threading: ZeroMQ sockets are not thread-safe, so one I/O thread per transport creates and
owns both sockets. publish()/subscribe() put commands on a queue and wake the thread through
a socket pair; inbound messages go to the base class inbox. publish() therefore never blocks.

Delivery: no broker, no retained message, no Last Will (set_will is a no-op) and no
persistence. The PUSH socket does not set ``IMMEDIATE``: like MQTT's offline queue, messages
published before the aggregator is reachable wait in the socket's pipe (up to ``sndhwm``)
and are delivered when it connects. Beyond that, a message waits in our own queue for at most
``send_timeout_s`` and is then dropped and counted in ``stats.dropped``. PUB never blocks
(slow subscribers lose messages beyond their high-water mark, which ZeroMQ does not report).

Close: every publish() that returned before close() was called is handed to the sockets
(publish() and close() are ordered by a lock, and the I/O thread looks at the stop flag
before it drains the queue, never after). close() then waits at most ``linger_ms`` in total
(default 2000; 0 discards at once; never infinite) for the peer to take what is queued:
first for room in the socket (a full ``sndhwm``), then libzmq's linger for the bytes in its
pipes. With the peer reachable a goodbye sent just before close() therefore arrives and
close() returns as soon as it is flushed; with the peer gone close() returns after about
``linger_ms``. Messages still in our queue then are counted in ``stats.dropped``; what libzmq
still holds when the linger expires is discarded without a count (ZeroMQ does not report it).

Options: ``timeout_s`` (bind/connect setup, default 5), ``linger_ms`` (flush time at close,
default 2000), ``sndhwm`` / ``rcvhwm`` (messages per peer queue, default 1000),
``max_message_bytes`` (largest inbound frame, default 256 MiB: libzmq reads a frame's size
before its body and disconnects a peer that announces more, so an oversized frame is never
taken into memory; set on PULL and SUB, with a small allowance for CURVE framing),
``send_timeout_s``
(default 5), ``max_pending`` (default 10000), ``reconnect_ivl_ms`` (default 100),
``reconnect_ivl_max_ms`` (default 5000), ``heartbeat_ms`` (ZMTP ping interval, default 5000;
a peer silent for 3 intervals is dropped and reconnected).

CurveZMQ (encryption + server authentication): the aggregator passes
``curve_server_secret_file``; an agent passes ``curve_server_public_key`` (z85, 40 chars) or
``curve_server_public_key_file``, and optionally ``curve_client_secret_file`` (an ephemeral
client key pair is generated otherwise).

Client authentication: with ``curve_agents_dir`` (a directory of ``<agent-id>.key`` public
keys) the aggregator also runs a ZAP handler (:mod:`edge_agent.transports.zmq_auth`) that
admits only those keys, on both sockets (an unknown key can neither send nor read the
broadcast), and binds each connection to its agent id: a message whose topic names another
agent is dropped and counted in :attr:`ZmqTransport.refused` (``agent_mismatch``), a refused
handshake as ``unauthenticated``. Agents then need ``curve_client_secret_file``. Without
``curve_agents_dir`` any client key is accepted (encryption and server authentication only).
Make keys with :func:`edge_agent.transports.zmq_auth.write_keypair` (``edge-agent keys zmq``).

Messages dropped before anyone reads them are counted in :attr:`ZmqTransport.refused` too
(the aggregator shows them in ``cat_updates_rejected_total{reason}`` and /status):
``wrong_frame_count`` (not the two frames ``[topic, payload]``), ``topic_not_utf8``, and
``peer_disconnected``: every connection the aggregator's PULL socket lost, which is how a
frame above ``max_message_bytes`` shows (libzmq disconnects that peer unread and reports
the disconnect only; an agent that closes or loses its link counts here too).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import queue
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from edge_agent.errors import TransportError
from edge_agent.protocol import topics
from edge_agent.transports.base import Message, Role, Transport
from edge_agent.transports.url import OptionReader, parse_url
from edge_agent.transports.zmq_auth import (
    AgentAuthenticator,
    AllowList,
    curve_config,
    generate_curve_keypair,
    speaks_for,
)

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "REFUSED_REASONS", "ZmqTransport", "generate_curve_keypair"]

#: default cap on an inbound frame: the largest payload the aggregator's engine reads
DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20
#: added to max_message_bytes for the ZMTP/CURVE envelope of a frame (MESSAGE command, box)
_FRAME_ALLOWANCE = 256
#: the reasons counted in ZmqTransport.refused (from the start; the transport-level drops
#: of TRANSPORT_DROPS appear once they happen)
REFUSED_REASONS = ("unauthenticated", "agent_mismatch", "peer_disconnected")
#: malformed ZeroMQ messages dropped and counted in ZmqTransport.refused
TRANSPORT_DROPS = ("wrong_frame_count", "topic_not_utf8")

log = logging.getLogger(__name__)

_MONITOR_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


@dataclass(frozen=True, slots=True)
class _Publish:
    topic: bytes
    payload: bytes


@dataclass(frozen=True, slots=True)
class _Subscribe:
    prefix: bytes


class ZmqTransport(Transport):
    """ZeroMQ PUSH/PULL + PUB/SUB transport; see the module docstring."""

    def __init__(self, url: str, *, role: Role, client_id: str, **options: object) -> None:
        super().__init__(url, role=role, client_id=client_id)
        parsed = parse_url(url)
        if parsed.scheme != "zmq+tcp":
            raise TransportError(f"{self.url}: ZmqTransport needs a zmq+tcp:// URL")
        if parsed.port is None or not 0 < parsed.port < 65535:
            raise TransportError(
                f"{self.url}: give a port below 65535 (the PUB socket uses port + 1), "
                "e.g. zmq+tcp://0.0.0.0:5555"
            )
        host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
        self._ipv6 = ":" in parsed.host
        self._endpoints = (f"tcp://{host}:{parsed.port}", f"tcp://{host}:{parsed.port + 1}")
        opts = OptionReader(url, {**parsed.options, **options})
        self._timeout_s = opts.get_float("timeout_s", 5.0)
        self._linger_ms = opts.get_int("linger_ms", 2000)
        self._sndhwm = opts.get_int("sndhwm", 1000)
        self._rcvhwm = opts.get_int("rcvhwm", 1000)
        self._send_timeout_s = opts.get_float("send_timeout_s", 5.0)
        self._max_pending = opts.get_int("max_pending", 10000, minimum=1)
        self._reconnect_ivl_ms = opts.get_int("reconnect_ivl_ms", 100, minimum=1)
        self._reconnect_ivl_max_ms = opts.get_int("reconnect_ivl_max_ms", 5000)
        self._heartbeat_ms = opts.get_int("heartbeat_ms", 5000)
        self._max_message_bytes = opts.get_int(
            "max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES, minimum=1
        )
        self._curve = curve_config(self.url, self.role, opts)
        opts.finish()
        self._host = parsed.host
        self._refused = dict.fromkeys(REFUSED_REASONS, 0)
        self._auth: AgentAuthenticator | None = None
        self._allow: AllowList | None = None

        self._commands: queue.SimpleQueue[_Publish | _Subscribe] = queue.SimpleQueue()
        self._patterns: tuple[str, ...] = ()  # replaced, never mutated: read lock-free
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._start_error: str | None = None
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._connected = False
        self._closed = False

    # -- the contract --------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Aggregator: both sockets bound. Agent: the PUSH socket has completed a handshake
        with the aggregator and not lost it since."""
        return self._connected

    @property
    def refused(self) -> dict[str, int]:
        """Counts of what client authentication refused (a copy): ``unauthenticated``
        handshakes (key not in ``curve_agents_dir``) and ``agent_mismatch`` messages (topic
        names another agent than the connection's key), and the malformed messages of
        :data:`TRANSPORT_DROPS`. Also counted in ``stats.dropped`` (all but handshakes)."""
        with self._stats_lock:
            return dict(self._refused)

    def _refuse(self, reason: str, detail: str = "") -> None:
        with self._stats_lock:
            self._refused[reason] = self._refused.get(reason, 0) + 1
        if reason != "unauthenticated":  # handshakes are not messages: logged by the list
            self._drop(reason, detail)

    def _warn_if_open(self) -> None:
        """Log once at start when the aggregator serves ZeroMQ to a network without checking
        who connects (the default is fine on loopback only)."""
        if self.role != "aggregator" or _is_loopback(self._host):
            return
        if self._curve is None:
            log.warning(
                "%s: serving ZeroMQ without CURVE on a non-loopback address: anyone who "
                "reaches the port can join, speak for any agent and read the model; for "
                "trusted networks only (set AGG_ZMQ_SECRET_KEY_FILE and AGG_ZMQ_AGENTS_DIR, "
                "docs/operating.md)",
                self.url,
            )
        elif self._curve.agents_dir is None:
            log.warning(
                "%s: CURVE without an allow-list of agent keys: any client key is admitted "
                "(set AGG_ZMQ_AGENTS_DIR / curve_agents_dir to authenticate agents)",
                self.url,
            )

    def _start_auth(self, ctx: zmq.Context[Any]) -> None:
        """Start the ZAP handler on ``ctx`` (before any socket binds) if keys are checked."""
        curve = self._curve
        if curve is None or curve.agents_dir is None:
            return
        self._allow = AllowList(curve.agents_dir, lambda _key: self._refuse("unauthenticated"))
        if not len(self._allow):
            log.warning(
                "%s: no <agent-id>.key files in %s yet: every agent is refused until one is added",
                self.url,
                curve.agents_dir,
            )
        self._auth = AgentAuthenticator(ctx, self._allow)
        self._auth.start()

    def connect(self) -> None:
        """Start the I/O thread, bind (aggregator) or connect (agent). An agent does not wait
        for the aggregator to exist: ZeroMQ connects in the background and reconnects."""
        with self._lock:
            if self._closed:
                raise TransportError(f"{self.url}: transport is closed; open a new one")
            if self._thread is not None:
                return
            self._stop.clear()
            self._ready.clear()
            self._start_error = None
            self._ctx = zmq.Context(io_threads=1)
            try:
                self._start_auth(self._ctx)
            except BaseException:
                self._stop_auth()
                self._ctx.term()
                self._ctx = None
                raise
            self._warn_if_open()
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._thread = threading.Thread(
                target=self._run, name=f"zmq-transport-{self.client_id}", daemon=True
            )
            self._thread.start()
        if not self._ready.wait(self._timeout_s) or self._start_error is not None:
            error = (
                self._start_error or f"the socket thread did not start within {self._timeout_s:g} s"
            )
            self._teardown()
            with self._lock:
                self._thread = None
            raise TransportError(error)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Queue for the I/O thread (never blocks for long). ``retain`` is ignored: ZeroMQ
        has no retained messages (agents send a snapshot request instead)."""
        topics.validate_topic(topic)
        command = _Publish(topic.encode(), bytes(payload))
        with self._lock:
            # Under the lock: a publish either precedes close() (and is flushed by it) or
            # raises; it can never slip in after the I/O thread's last look at the queue.
            if self._closed:
                raise TransportError(f"{self.url}: publish after close(); open a new transport")
            self._commands.put(command)
        self._count("published")
        self._wake()

    def subscribe(self, pattern: str) -> None:
        topics.validate_pattern(pattern)
        with self._lock:
            if self._closed:
                raise TransportError(f"{self.url}: subscribe after close()")
            if pattern in self._patterns:
                return
            self._patterns = (*self._patterns, pattern)
        if self.role == "agent":
            self._commands.put(_Subscribe(topics.literal_prefix(pattern).encode()))
            self._wake()

    def set_will(self, topic: str, payload: bytes) -> None:
        """No-op: ZeroMQ has no Last Will; the aggregator notices silence by timeout."""
        topics.validate_topic(topic)

    def close(self) -> None:
        """Flush what was published before this call and stop the I/O thread. Waits at most
        about ``linger_ms`` for an absent or slow peer (see the module docstring)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._teardown()
        self._wake_receivers()

    # -- internals -----------------------------------------------------------------------

    def _wake(self) -> None:
        w = self._wake_w
        if w is not None:
            # A full buffer means the thread is already awake; closing races are harmless.
            with contextlib.suppress(OSError):
                w.send(b"\0")

    def _teardown(self) -> None:
        self._stop.set()
        self._wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._timeout_s + self._linger_ms / 1000 + 5)
            if thread.is_alive():
                # term() would wait for its sockets forever; leak rather than hang close().
                log.error("%s: I/O thread did not stop; leaking it and its context", self.url)
                self._ctx = None
        if self._ctx is not None:
            self._stop_auth()
            # All sockets are closed by the I/O thread, the outbound one with what is left of
            # linger_ms after its flush: term() waits at most that long.
            self._ctx.term()
            self._ctx = None
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        self._wake_r = self._wake_w = None
        self._connected = False
        # Published but never taken by an I/O thread (none was started, or it failed).
        unsent = 0
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            unsent += isinstance(command, _Publish)
        if unsent:
            self._drop("unsent at close", "the I/O thread was not running", n=unsent)

    def _stop_auth(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def _configure(self, sock: zmq.Socket[Any], *, connect_side: bool) -> None:
        # Only outbound sockets have anything worth flushing at close; a SUB would otherwise
        # wait out the linger trying to deliver its subscriptions to a vanished publisher.
        sends = sock.type in (zmq.PUSH, zmq.PUB)
        sock.setsockopt(zmq.LINGER, self._linger_ms if sends else 0)
        sock.setsockopt(zmq.SNDHWM, self._sndhwm)
        sock.setsockopt(zmq.RCVHWM, self._rcvhwm)
        if not sends:
            sock.setsockopt(zmq.MAXMSGSIZE, self._max_message_bytes + _FRAME_ALLOWANCE)
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 60)
        sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 10)
        if self._ipv6:
            sock.setsockopt(zmq.IPV6, 1)
        if self._heartbeat_ms:
            sock.setsockopt(zmq.HEARTBEAT_IVL, self._heartbeat_ms)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * self._heartbeat_ms)
        if connect_side:
            sock.setsockopt(zmq.RECONNECT_IVL, self._reconnect_ivl_ms)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, self._reconnect_ivl_max_ms)
        curve = self._curve
        if curve is not None:
            if curve.server:
                sock.curve_server = True
                sock.curve_secretkey = curve.secret
                sock.curve_publickey = curve.public
            else:
                assert curve.server_public is not None
                sock.curve_serverkey = curve.server_public
                sock.curve_publickey = curve.public
                sock.curve_secretkey = curve.secret

    def _open_sockets(
        self, ctx: zmq.Context[Any]
    ) -> tuple[zmq.Socket[Any], zmq.Socket[Any], zmq.Socket[Any] | None]:
        """Return (inbound, outbound, monitor) sockets, bound or connected."""
        pull_ep, pub_ep = self._endpoints
        if self.role == "aggregator":
            inbound, outbound = ctx.socket(zmq.PULL), ctx.socket(zmq.PUB)
            opened = [inbound, outbound]
            try:
                for sock, ep in ((inbound, pull_ep), (outbound, pub_ep)):
                    self._configure(sock, connect_side=False)
                    try:
                        sock.bind(ep)
                    except zmq.ZMQError as exc:
                        raise TransportError(
                            f"{self.url}: cannot bind {ep}: {exc}; is another aggregator "
                            "running? Choose a free port (port and port + 1 are both used) "
                            "or a local address such as 0.0.0.0"
                        ) from None
            except BaseException:
                for s in opened:
                    s.close(linger=0)
                raise
            # libzmq drops a peer that announces a frame above MAXMSGSIZE without a word:
            # the lost connection is all it shows, and it is counted (peer_disconnected)
            return inbound, outbound, inbound.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        inbound, outbound = ctx.socket(zmq.SUB), ctx.socket(zmq.PUSH)
        monitor: zmq.Socket[Any] | None = None
        try:
            self._configure(inbound, connect_side=True)
            self._configure(outbound, connect_side=True)
            monitor = outbound.get_monitor_socket(_MONITOR_EVENTS)
            for sock, ep in ((outbound, pull_ep), (inbound, pub_ep)):
                try:
                    sock.connect(ep)
                except zmq.ZMQError as exc:
                    raise TransportError(
                        f"{self.url}: cannot connect to {ep}: {exc}; check the host name, "
                        "e.g. zmq+tcp://aggregator.local:5555"
                    ) from None
        except BaseException:
            if monitor is not None:
                outbound.disable_monitor()
                monitor.close(linger=0)
            outbound.close(linger=0)
            inbound.close(linger=0)
            raise
        return inbound, outbound, monitor

    def _run(self) -> None:
        assert self._ctx is not None and self._wake_r is not None
        try:
            inbound, outbound, monitor = self._open_sockets(self._ctx)
        except TransportError as exc:
            self._start_error = str(exc)
            self._ready.set()
            return
        except Exception as exc:  # a bug or an exotic zmq error: report, don't hang connect()
            self._start_error = f"{self.url}: cannot open ZeroMQ sockets: {exc!r}"
            self._ready.set()
            return
        if self.role == "aggregator":
            self._connected = True
        self._ready.set()
        linger_ms = self._linger_ms
        try:
            linger_ms = self._loop(inbound, outbound, monitor)
        except Exception:
            log.exception("%s: I/O thread failed; the transport is dead", self.url)
        finally:
            self._connected = False
            if monitor is not None:
                (inbound if self.role == "aggregator" else outbound).disable_monitor()
                monitor.close(linger=0)
            inbound.close()
            # libzmq keeps flushing the pipes for linger ms (context term() waits for it).
            outbound.close(linger=linger_ms)

    def _loop(
        self,
        inbound: zmq.Socket[Any],
        outbound: zmq.Socket[Any],
        monitor: zmq.Socket[Any] | None,
    ) -> int:
        """Serve until close(); return the linger (ms) left for the outbound socket."""
        assert self._wake_r is not None
        wake = self._wake_r
        poller = zmq.Poller()
        poller.register(inbound, zmq.POLLIN)
        poller.register(wake.fileno(), zmq.POLLIN)
        if monitor is not None:
            poller.register(monitor, zmq.POLLIN)
        pending: deque[tuple[float, _Publish]] = deque()
        handshakes = 0
        while True:
            timeout_ms = 50 if pending else None
            events = dict(poller.poll(timeout_ms))
            if wake.fileno() in events:
                try:
                    while wake.recv(4096):
                        pass
                except OSError:
                    pass  # drained (BlockingIOError)
            # Look at the flag BEFORE draining the queue: close() sets it only after every
            # publish() that preceded it has queued its command, so once it is seen, the drain
            # below takes them all. (Checking it after the drain lost a publish made while
            # this thread was busy sending: the thread returned with it still queued.) A
            # stop set after this read wakes the next poll (close() writes to the wake pipe).
            stopping = self._stop.is_set()
            if inbound in events:
                self._receive(inbound)
            if monitor is not None and monitor in events:
                handshakes = self._on_monitor(monitor, handshakes)
            now = time.monotonic()
            while True:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                if isinstance(command, _Subscribe):
                    inbound.setsockopt(zmq.SUBSCRIBE, command.prefix)
                else:
                    pending.append((now + self._send_timeout_s, command))
            if len(pending) > self._max_pending:
                excess = len(pending) - self._max_pending
                for _ in range(excess):
                    pending.popleft()
                self._drop("outbound queue full (max_pending)", f"{self._max_pending}", n=excess)
            self._send(outbound, pending)
            expired = 0
            while pending and pending[0][0] <= now:
                pending.popleft()
                expired += 1
            if expired:
                self._drop(
                    "no peer took the message within send_timeout_s",
                    f"{self._send_timeout_s:g} s; is the aggregator running?",
                    n=expired,
                )
            if stopping:
                return self._flush(outbound, pending)

    def _flush(self, outbound: zmq.Socket[Any], pending: deque[tuple[float, _Publish]]) -> int:
        """At close: wait up to linger_ms for room for what is still queued (a full sndhwm),
        drop what does not fit, and return the linger (ms) left for libzmq's own flush."""
        deadline = time.monotonic() + self._linger_ms / 1000
        self._send(outbound, pending)
        while pending:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                break
            if outbound.poll(remaining_ms, zmq.POLLOUT):
                self._send(outbound, pending)
        if pending:
            self._drop(
                "unsent at close",
                f"no room in the socket within linger_ms={self._linger_ms}; is the peer there?",
                n=len(pending),
            )
        return max(0, int((deadline - time.monotonic()) * 1000))

    def _send(self, outbound: zmq.Socket[Any], pending: deque[tuple[float, _Publish]]) -> None:
        while pending:
            message = pending[0][1]
            try:
                outbound.send_multipart(
                    [message.topic, message.payload], flags=zmq.NOBLOCK, copy=False
                )
            except zmq.Again:
                return  # high-water mark reached / no peer: retry on the next turn
            pending.popleft()

    def _receive(self, inbound: zmq.Socket[Any]) -> None:
        bound = self._allow is not None  # every connection carries its agent id (User-Id)
        for _ in range(1000):  # bounded batch so outbound work is not starved
            try:
                frames, user = _recv(inbound, with_user=bound)
            except zmq.Again:
                return
            if len(frames) != 2:
                self._refuse(
                    "wrong_frame_count", f"expected 2 frames [topic, payload], got {len(frames)}"
                )
                continue
            try:
                topic = frames[0].decode()
            except UnicodeDecodeError:
                self._refuse("topic_not_utf8", "the topic frame is not UTF-8")
                continue
            if bound and not speaks_for(topic, user):
                self._refuse(
                    "agent_mismatch",
                    f"a key bound to agent {user!r} sent on {topic!r}; each key may send "
                    "only its own agent's topics",
                )
                continue
            if any(topics.matches(p, topic) for p in self._patterns):
                self._deliver(Message(topic, frames[1]))

    def _on_monitor(self, monitor: zmq.Socket[Any], handshakes: int) -> int:
        while True:
            try:
                event = recv_monitor_message(monitor, flags=zmq.NOBLOCK)
            except zmq.Again:
                return handshakes
            kind = event["event"]
            if self.role == "aggregator":  # the PULL socket's monitor: disconnects only
                self._peer_lost()
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if handshakes:
                    self._count("reconnects")
                    log.info("%s: reconnected to the aggregator", self.url)
                handshakes += 1
                self._connected = True
            elif kind == zmq.EVENT_DISCONNECTED:
                if self._connected and not self._stop.is_set():
                    log.warning("%s: lost the aggregator; reconnecting", self.url)
                self._connected = False
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                # libzmq does not retry a key the aggregator's ZAP handler refused.
                self._connected = False
                log.error(
                    "%s: the aggregator refused this agent's CURVE key; put its public key "
                    "in the aggregator's AGG_ZMQ_AGENTS_DIR as <agent-id>.key, then restart "
                    "the agent",
                    self.url,
                )
            elif kind & _HANDSHAKE_FAILED:
                self._connected = False
                self._drop_log_once(
                    "handshake with the aggregator failed",
                    "wrong curve_server_public_key, or CURVE on one side only",
                )

    def _peer_lost(self) -> None:
        """An agent's connection to the PULL socket ended: it closed, its link or heartbeat
        failed, or it announced a frame above ``max_message_bytes`` (libzmq drops that peer
        before reading the frame and does not say which of these it was)."""
        with self._stats_lock:
            self._refused["peer_disconnected"] = self._refused.get("peer_disconnected", 0) + 1
        self._drop_log_once(
            "an agent's connection was dropped (it closed, its link failed, or it sent a "
            "frame above max_message_bytes, counted as peer_disconnected)",
            f"max_message_bytes={self._max_message_bytes}",
        )

    def _drop_log_once(self, reason: str, fix: str) -> None:
        with self._stats_lock:
            first = reason not in self._logged_reasons
            self._logged_reasons.add(reason)
        if first:
            log.warning("%s: %s (%s); will keep retrying", self.url, reason, fix)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: assume it is reachable from the network


def _recv(sock: zmq.Socket[Any], *, with_user: bool) -> tuple[list[bytes], str | None]:
    """One multipart message (non-blocking: zmq.Again when none) and, ``with_user``, the
    ZAP User-Id of the connection it came on (the agent id its key is bound to)."""
    if not with_user:
        return sock.recv_multipart(flags=zmq.NOBLOCK), None
    frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
    user = frames[0].get("User-Id")
    return [f.bytes for f in frames], user if isinstance(user, str) else None
