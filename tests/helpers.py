"""Shared test helpers: free ports and a real Mosquitto broker we start and stop ourselves."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

HOST = "127.0.0.1"

# Debian/Ubuntu install the broker in sbin, which is often not on a normal user's PATH.
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
MOSQUITTO: str | None = shutil.which("mosquitto", path=_SEARCH_PATH)
MOSQUITTO_PASSWD: str | None = shutil.which("mosquitto_passwd", path=_SEARCH_PATH)


def uvarint(n: int) -> bytes:
    """The wire format's unsigned LEB128 varint, written from the spec (not from
    edge_agent.wire): for tests that build messages by hand."""
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
        n >>= 7
        if not n:
            return bytes(out)


def free_port(host: str = HOST) -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port_pair(host: str = HOST) -> int:
    """A port p such that p and p + 1 are both free (the ZeroMQ aggregator binds both)."""
    for _ in range(100):
        port = free_port(host)
        if port < 65535 and _port_free(host, port + 1):
            return port
    raise RuntimeError("no two adjacent free TCP ports found")


def wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    """True once something accepts TCP connections on host:port, False after the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False


class MosquittoBroker:
    """A Mosquitto process on 127.0.0.1:``port`` with a generated config in ``workdir``.

    Anonymous access and on-disk persistence (in ``workdir``), so a stop()/start() cycle keeps
    persistent sessions and their queued QoS 1 messages, on the same port. ``extra_config``
    lines are appended (e.g. ``password_file ...`` with ``allow_anonymous false``).
    """

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        allow_anonymous: bool = True,
        extra_config: str = "",
    ) -> None:
        if MOSQUITTO is None:
            raise RuntimeError("mosquitto binary not found")
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port if port is not None else free_port()
        self.host = HOST
        self.config_path = workdir / "mosquitto.conf"
        self.log_path = workdir / "mosquitto.log"
        persistence_dir = workdir / "persistence"
        persistence_dir.mkdir(exist_ok=True)
        lines = [
            f"listener {self.port} {HOST}",
            f"allow_anonymous {'true' if allow_anonymous else 'false'}",
            "persistence true",
            "set_tcp_nodelay true",
            f"persistence_location {persistence_dir}/",
            # Run as ourselves: as root, Mosquitto would otherwise switch to the
            # "mosquitto" user, who cannot write to the test's temporary directory.
            f"user {_current_user()}",
            f"log_dest file {self.log_path}",
            "log_type all",
            extra_config,
        ]
        self.config_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = 10.0) -> None:
        """Start (or restart) the broker on the same port; wait until it accepts connections."""
        if self.running:
            return
        assert MOSQUITTO is not None
        self._proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.config_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        if not wait_for_port(self.host, self.port, timeout_s):
            stderr = b""
            if self._proc.poll() is not None and self._proc.stderr is not None:
                stderr = self._proc.stderr.read()
            self.stop()
            raise RuntimeError(
                f"mosquitto did not listen on {self.host}:{self.port} within {timeout_s} s: "
                f"{stderr.decode(errors='replace')}\n{self.log_tail()}"
            )

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (Mosquitto writes its persistence file on the way out) and wait."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        if proc.stderr is not None:
            proc.stderr.close()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no mosquitto log)"


def _current_user() -> str:
    import getpass

    return getpass.getuser()
