"""CurveZMQ keys and client authentication for the ``zmq+tcp://`` transport.

Key files are z85 text (40 characters, one line): ``<name>.key`` holds a public key,
``<name>.secret`` a secret key (written 0600). :func:`write_keypair` makes a pair
(``edge-agent keys zmq``); the readers also accept pyzmq/czmq certificate files
(``public-key = "..."`` / ``secret-key = "..."`` lines).

Client authentication: the aggregator's sockets are CURVE servers and a ZAP handler
(:class:`AgentAuthenticator`, pyzmq's thread authenticator) admits only the public keys in
an allow-list directory of ``<agent-id>.key`` files. The agent id is the file name: the
authenticator hands it to libzmq as the connection's ZAP User-Id, which every message from
that connection carries, so the transport can refuse a message whose topic names another
agent. The directory is re-read when its modification time changes (adding or removing a
key file takes effect at the next handshake; connections already admitted stay admitted
until they reconnect, so restart the aggregator to cut a revoked key off at once).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from edge_agent.errors import TransportError
from edge_agent.protocol import topics
from edge_agent.transports.url import OptionReader

log = logging.getLogger(__name__)

KEY_LENGTH = 40  # z85 characters of a 32-byte CURVE key
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".secret"
#: distinct unknown keys logged (each once); beyond that they are only counted
_MAX_LOGGED_KEYS = 64


def _require_curve() -> None:
    if not zmq.has("curve"):
        raise TransportError("this libzmq was built without CURVE support; install pyzmq wheels")


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the start (never readable by others)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT: force it
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def write_keypair(directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Write a new CurveZMQ key pair as ``<name>.key`` (public, 0644) and ``<name>.secret``
    (0600) in ``directory`` (created 0700 if missing); return (public_path, secret_path).

    ``name`` must be a valid agent id (it becomes the id the key is bound to). Refuses to
    overwrite an existing secret: delete it first if you really mean to rotate the key.
    """
    _require_curve()
    topics.validate_id(name, "key name (agent id)")
    folder = Path(directory)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    public_path, secret_path = folder / f"{name}{PUBLIC_SUFFIX}", folder / f"{name}{SECRET_SUFFIX}"
    if secret_path.exists():
        raise TransportError(
            f"{secret_path} exists; delete it first to make a new key for {name!r} "
            "(and replace its public key in the aggregator's AGG_ZMQ_AGENTS_DIR)"
        )
    public, secret = zmq.curve_keypair()
    _write_private(secret_path, secret + b"\n")
    public_path.write_bytes(public + b"\n")
    public_path.chmod(0o644)
    return public_path, secret_path


def parse_key(text: bytes, what: str, field: str = "public-key") -> bytes:
    """The z85 key in ``text``: a bare 40-character line, or a certificate's ``field = "..."``
    line. TransportError naming ``what`` otherwise."""
    stripped = text.strip()
    if len(stripped) == KEY_LENGTH and b"\n" not in stripped:
        key = stripped
    else:
        key = b""
        for line in stripped.splitlines():
            name, sep, value = line.strip().partition(b"=")
            if sep and name.strip().decode(errors="replace") == field:
                key = value.strip().strip(b'"')
    if len(key) != KEY_LENGTH:
        raise TransportError(
            f"{what} must hold a 40-character z85 CURVE key (make one with "
            f"`edge-agent keys zmq`), got {len(stripped)} characters"
        )
    try:
        z85.decode(key)
    except ValueError:
        raise TransportError(f"{what} is not a z85 CURVE key") from None
    return key


def read_key(path: str | os.PathLike[str], what: str, *, secret: bool = False) -> bytes:
    """Read a z85 key file (see :func:`parse_key`); errors name ``what`` and the file."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise TransportError(f"{what}: cannot read {os.fspath(path)!r}: {exc.strerror}") from None
    return parse_key(text, f"{what} {os.fspath(path)!r}", "secret-key" if secret else "public-key")


def load_allow_list(directory: Path) -> dict[bytes, str]:
    """``{z85 public key: agent id}`` from the ``<agent-id>.key`` files in ``directory``.

    Raises TransportError on an unreadable directory, a bad file name or key, and on one key
    listed under two agent ids (which would let either speak for the other).
    """
    try:
        files = sorted(p for p in directory.iterdir() if p.suffix == PUBLIC_SUFFIX)
    except OSError as exc:
        raise TransportError(
            f"agents key directory {str(directory)!r}: {exc.strerror}; set it to a directory "
            "of <agent-id>.key public key files (AGG_ZMQ_AGENTS_DIR / curve_agents_dir)"
        ) from None
    keys: dict[bytes, str] = {}
    for path in files:
        agent = path.stem
        try:
            topics.validate_id(agent, "agent id")
        except ValueError as exc:
            raise TransportError(f"{path}: the file name must be <agent-id>.key: {exc}") from None
        key = read_key(path, "agent public key")
        if key in keys:
            raise TransportError(
                f"{path}: the same public key is also {keys[key]}.key; give every agent its "
                "own key pair (`edge-agent keys zmq --agent-id ID`)"
            )
        keys[key] = agent
    return keys


class AllowList:
    """The agent keys of a directory, re-read when the directory changes (thread-safe).

    ``on_refused(z85_key)`` is called for every handshake with a key not on the list.
    """

    def __init__(self, directory: Path, on_refused: Callable[[bytes], None]) -> None:
        self.directory = directory
        self._on_refused = on_refused
        self._lock = threading.Lock()
        self._mtime_ns = directory.stat().st_mtime_ns if directory.is_dir() else -1
        self._keys = load_allow_list(directory)  # errors at start are fatal: fail loudly
        self._logged: set[bytes] = set()

    def __len__(self) -> int:
        return len(self._keys)

    def _refresh(self) -> None:
        try:
            mtime = self.directory.stat().st_mtime_ns
            if mtime == self._mtime_ns:
                return
            keys = load_allow_list(self.directory)
        except (OSError, TransportError) as exc:
            # Keep serving with the last good list rather than locking every agent out.
            log.error("%s; keeping the previous list of %d keys", exc, len(self._keys))
            return
        self._mtime_ns, self._keys = mtime, keys
        log.info("agents key directory %s: %d keys", self.directory, len(keys))

    def agent_of(self, z85_key: bytes) -> str | None:
        """The agent id bound to ``z85_key`` (None: not allowed)."""
        with self._lock:
            self._refresh()
            return self._keys.get(z85_key)

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq credentials-provider hook: admit ``key`` (z85) if it is on the list."""
        if self.agent_of(key) is not None:
            return True
        with self._lock:
            first = key not in self._logged and len(self._logged) < _MAX_LOGGED_KEYS
            if first:
                self._logged.add(key)
        if first:
            log.warning(
                "ZeroMQ: refused a client with unknown CURVE key %s (not in %s; add "
                "<agent-id>.key there to admit it)",
                key.decode(errors="replace"),
                self.directory,
            )
        self._on_refused(key)
        return False


class AgentAuthenticator(ThreadAuthenticator):
    """pyzmq's ZAP thread for one context: CURVE clients on ``allow`` only, User-Id = agent id."""

    def __init__(self, context: zmq.Context[Any], allow: AllowList) -> None:
        super().__init__(context)
        self._allow = allow
        # Configured before start(): no handshake is ever judged without the list.
        self.configure_curve_callback("*", credentials_provider=allow)

    def curve_user_id(self, client_public_key: bytes) -> str:
        """The agent id the key is bound to (called only for admitted keys)."""
        agent = self._allow.agent_of(z85.encode(client_public_key))
        # Removed between the check and here: an id no topic can carry, so nothing passes.
        return agent if agent is not None else "-"


def generate_curve_keypair(
    directory: str | os.PathLike[str], name: str = "curve"
) -> tuple[Path, Path]:
    """Write a CurveZMQ key pair as z85 text: ``<name>.public`` and ``<name>.secret`` (0600).

    Returns (public_path, secret_path). Give the secret file to the process that owns it
    (``curve_server_secret_file`` / ``curve_client_secret_file``) and the public key to peers.
    """
    if not zmq.has("curve"):
        raise TransportError("this libzmq was built without CURVE support; install pyzmq wheels")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    public_path, secret_path = folder / f"{name}.public", folder / f"{name}.secret"
    public_path.write_bytes(public + b"\n")
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret + b"\n")
    return public_path, secret_path


def _read_key(url: str, option: str, path: str, *, secret: bool = False) -> bytes:
    return read_key(path, f"{url}: {option}", secret=secret)


def _check_key(url: str, option: str, key: bytes) -> bytes:
    if len(key) != 40:
        raise TransportError(
            f"{url}: {option} must be a 40-character z85 CURVE key (see "
            f"generate_curve_keypair), got {len(key)} characters"
        )
    return key


@dataclass(frozen=True, slots=True)
class Curve:
    """One transport's CURVE keys (z85) and, on the aggregator, the allow-list directory."""

    server: bool
    public: bytes
    secret: bytes
    server_public: bytes | None = None
    agents_dir: Path | None = None  # aggregator: the allow-list (None: any client key)


def curve_config(url: str, role: str, opts: OptionReader) -> Curve | None:
    """The CURVE set-up a transport's options ask for (None: plaintext); see
    :mod:`edge_agent.transports.zmq` for the option names. TransportError on a wrong mix."""
    server_secret_file = opts.get_str("curve_server_secret_file")
    server_public = opts.get_str("curve_server_public_key")
    server_public_file = opts.get_str("curve_server_public_key_file")
    client_secret_file = opts.get_str("curve_client_secret_file")
    agents_dir = opts.get_str("curve_agents_dir")
    if role == "aggregator":
        if server_public or server_public_file or client_secret_file:
            raise TransportError(
                f"{url}: the aggregator takes curve_server_secret_file and "
                "curve_agents_dir; curve_server_public_key(_file) and "
                "curve_client_secret_file are agent options"
            )
        if server_secret_file is None:
            if agents_dir is not None:
                raise TransportError(
                    f"{url}: curve_agents_dir needs curve_server_secret_file "
                    "(client keys are checked only on CURVE sockets)"
                )
            return None
        secret = _read_key(url, "curve_server_secret_file", server_secret_file, secret=True)
        return Curve(
            server=True,
            public=zmq.curve_public(secret),
            secret=secret,
            agents_dir=None if agents_dir is None else Path(agents_dir),
        )
    if agents_dir is not None:
        raise TransportError(f"{url}: curve_agents_dir is an aggregator option")
    if server_secret_file is not None:
        raise TransportError(
            f"{url}: curve_server_secret_file is an aggregator option; agents take "
            "curve_server_public_key (or _file) and optionally curve_client_secret_file"
        )
    if server_public is not None and server_public_file is not None:
        raise TransportError(
            f"{url}: give curve_server_public_key or curve_server_public_key_file, not both"
        )
    if server_public_file is not None:
        server_key = _read_key(url, "curve_server_public_key_file", server_public_file)
    elif server_public is not None:
        server_key = _check_key(url, "curve_server_public_key", server_public.encode())
    else:
        if client_secret_file is not None:
            raise TransportError(f"{url}: curve_client_secret_file needs curve_server_public_key")
        return None
    if client_secret_file is not None:
        secret = _read_key(url, "curve_client_secret_file", client_secret_file, secret=True)
        public = zmq.curve_public(secret)
    else:
        public, secret = zmq.curve_keypair()
    return Curve(server=False, public=public, secret=secret, server_public=server_key)


def speaks_for(topic: str, agent: str | None) -> bool:
    """Whether a connection authenticated as ``agent`` may send on ``topic``: only agent
    kinds (hello/update/status/request) whose last level is that very id."""
    try:
        parsed = topics.parse(topic)
    except ValueError:
        return False
    return agent is not None and parsed.kind in topics.AGENT_KINDS and parsed.agent == agent
