"""A private local network for development: free ports, a Mosquitto broker, the service process.

This is a development and test helper, not part of the service: the demo (``deploy/demo.py``),
the tests and the benchmarks start their servers through it, and no module of the service
imports it. It lives in the package only so that all three find one copy on the path. It
imports nothing from the service (starting the service is done in a child process), so it
costs nothing to import.

Contracts kept throughout:

- Everything binds to and connects to 127.0.0.1 only.
- Every wait has a timeout in seconds; every retry loop has a bound.
- A process is stopped through its own handle (SIGTERM, then SIGKILL after a timeout), never
  by name; its output goes to a log file (no pipe that can fill up) whose tail is quoted in
  the error when a start-up fails.
- A program that is not installed raises :class:`MissingProgram` (a ``FileNotFoundError``)
  saying how to install it; tests turn it into a skip.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Self

HOST = "127.0.0.1"

#: Debian and Ubuntu install the broker in sbin, which is often not on a user's PATH.
_EXTRA_SEARCH_PATH = ("/usr/sbin", "/usr/local/sbin")
_INSTALL_HINTS = {
    "mosquitto": "install it (apt-get install mosquitto)",
    "mosquitto_passwd": "install mosquitto (apt-get install mosquitto)",
}
#: Generated-config options this module writes itself; ``options`` may not set them.
_MANAGED_OPTIONS = frozenset({"listener", "user", "log_dest", "persistence_location"})
_PORT_ATTEMPTS = 200


class MissingProgram(FileNotFoundError):
    """A program this module starts is not installed; the message says how to install it."""

    def __init__(self, program: str) -> None:
        hint = _INSTALL_HINTS.get(Path(program).name, "install it")
        where = os.pathsep.join(_EXTRA_SEARCH_PATH)
        super().__init__(f"{program} not found on PATH nor in {where}; {hint}")
        self.program = program


class StartupError(RuntimeError):
    """A server exited during start-up or was not ready in time; the message quotes its log."""


# --------------------------------------------------------------------------- ports and waits


def find_program(name: str) -> str:
    """The executable ``name`` (a bare name or a path) on PATH or in sbin; else MissingProgram."""
    search = os.pathsep.join([os.environ.get("PATH", ""), *_EXTRA_SEARCH_PATH])
    found = shutil.which(name, path=search)
    if found is None:
        raise MissingProgram(name)
    return found


class _PortBook:
    """The ports this process has handed out, so that no two calls return the same port.

    A port is free only until someone binds it, and callers often choose several before
    starting anything (an HTTP port, then a ZeroMQ pair whose second port the OS may hand
    straight back). Remembering what was given out closes that gap within one process.
    """

    def __init__(self) -> None:
        self._given: set[int] = set()

    def taken(self, *ports: int) -> bool:
        return any(p in self._given for p in ports)

    def give(self, *ports: int) -> None:
        self._given.update(ports)


_BOOK = _PortBook()


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that were free on 127.0.0.1 a moment ago (the OS picks),
    none handed out before by this process (nor the second port of a ZeroMQ pair).

    All sockets stay bound until every port is chosen, so the ports are distinct. Another
    process may still take a port before the caller binds it; callers start at once.
    """
    if count < 1:
        raise ValueError(f"free_ports: count must be at least 1, got {count}")
    sockets: list[socket.socket] = []
    chosen: list[int] = []
    try:
        for _ in range(count * _PORT_ATTEMPTS):
            if len(chosen) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(s)  # held, so the OS does not offer it again in this loop
            s.bind((HOST, 0))
            port = int(s.getsockname()[1])
            if not _BOOK.taken(port):
                chosen.append(port)
        if len(chosen) < count:
            raise RuntimeError(f"no {count} unused free TCP ports on {HOST}; free some ports")
        _BOOK.give(*chosen)
        return chosen
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    return free_ports(1)[0]


def free_port_pair() -> int:
    """A port p such that p and p + 1 were both free on 127.0.0.1 (ZeroMQ binds both), neither
    handed out before by this process."""
    for _ in range(_PORT_ATTEMPTS):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as first:
            first.bind((HOST, 0))
            port = int(first.getsockname()[1])
            if port >= 65535 or _BOOK.taken(port, port + 1):
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as second:
                try:
                    second.bind((HOST, port + 1))
                except OSError:
                    continue
                _BOOK.give(port, port + 1)
                return port
    raise RuntimeError(
        f"no two adjacent free TCP ports on {HOST} in {_PORT_ATTEMPTS} tries; "
        "free some ports or widen net.ipv4.ip_local_port_range"
    )


def wait_for_port(port: int, timeout_s: float, *, alive: Callable[[], bool] | None = None) -> bool:
    """True once something accepts TCP connections on 127.0.0.1:``port``; False after
    ``timeout_s`` seconds, or as soon as ``alive()`` says the server process is gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            return False
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, or a note that there is none."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def _terminate(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM (an orderly shutdown), SIGKILL if it is still running after ``timeout_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)


class _Workdir:
    """A directory given by the caller (kept) or a fresh temporary one (removed on close)."""

    def __init__(self, workdir: Path | None, prefix: str) -> None:
        self._owned = workdir is None
        self.path = Path(tempfile.mkdtemp(prefix=prefix)) if workdir is None else workdir
        self.path.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        if self._owned:
            shutil.rmtree(self.path, ignore_errors=True)


class _Server(ABC):
    """Context-manager plumbing: :meth:`start` on enter (cleaning up if it fails), :meth:`close`
    on exit, whatever happened inside."""

    @abstractmethod
    def start(self, timeout_s: float = 30.0) -> None:
        """Start the server and wait until it serves (bounded by ``timeout_s``)."""

    @abstractmethod
    def close(self) -> None:
        """Stop it and remove what it wrote; idempotent."""

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --------------------------------------------------------------------------- Mosquitto


def _option_lines(options: Mapping[str, object]) -> list[str]:
    lines = []
    for key, value in options.items():
        text = str(value)
        if key in _MANAGED_OPTIONS:
            raise ValueError(f"mosquitto option {key!r} is set by MosquittoBroker itself")
        if not key or any(c.isspace() for c in key) or "\n" in text:
            raise ValueError(f"mosquitto option {key!r}={text!r}: one word, one line")
        lines.append(f"{key} {text}")
    return lines


def _words(line: str) -> list[str]:
    """The words of an active config line; none for a comment or a blank line."""
    return [] if line.lstrip().startswith("#") else line.split()


def listener_ports(text: str) -> list[int]:
    """The port of every ``listener`` line of a Mosquitto config, in order."""
    return [int(w[1]) for w in map(_words, text.splitlines()) if w[:1] == ["listener"]]


def render_config(
    text: str,
    *,
    ports: Mapping[int, int],
    paths: Mapping[str, Path],
    values: Mapping[str, str] | None = None,
    source: str = "config",
) -> str:
    """A Mosquitto config (``text``, e.g. a shipped file) made to run here: every ``listener
    <port> [address]`` line becomes ``listener ports[port] 127.0.0.1``; every option named in
    ``paths`` gets that path and every option named in ``values`` that value (e.g. a bridge's
    ``address`` and ``remote_password``), each of them appearing exactly once; everything
    else verbatim.

    Raises ValueError naming ``source`` when a listener's port is not in ``ports`` or a path
    or value option is missing or repeated, so a config other than the one meant never runs
    silently.
    A ``user`` line is refused: the broker runs as the current user (as root, Mosquitto
    would switch to the "mosquitto" user, who cannot read a test's temporary files).
    """
    given: dict[str, object] = {**paths, **(values or {})}
    if any("\n" in str(v) for v in given.values()):
        raise ValueError(f"{source}: a path or value to set spans lines: {given}")
    seen: dict[str, int] = dict.fromkeys(given, 0)
    out: list[str] = []
    for line in text.splitlines():
        words = _words(line)
        key = words[0] if words else ""
        if key == "listener":
            shipped = int(words[1])
            if shipped not in ports:
                raise ValueError(f"{source}: listener {shipped} has no local port to move to")
            line = f"listener {ports[shipped]} {HOST}"
        elif key in given:
            seen[key] += 1
            line = f"{key} {given[key]}"
        elif key == "user":
            raise ValueError(f"{source}: remove the 'user' line; the broker runs as you")
        out.append(line)
    wrong = {k: n for k, n in seen.items() if n != 1}
    if wrong:
        raise ValueError(f"{source}: expected each of these options once, found {wrong}")
    out.append(f"user {getpass.getuser()}")
    return "\n".join(out) + "\n"


class MosquittoBroker(_Server):
    """A private Mosquitto on 127.0.0.1, from a generated config or a config file.

    Generated (the default): one listener on ``port`` (a free one if None), anonymous access
    unless ``password_file`` is given, ``acl_file`` if given, TCP_NODELAY, on-disk
    persistence in the work directory when ``persistence`` (so a :meth:`stop` / :meth:`start`
    cycle on the same port keeps persistent sessions and their queued QoS 1 messages), and
    ``options`` as further ``key value`` lines (they override those defaults).

    ``config_file`` instead (e.g. the shipped ``deploy/mosquitto/mosquitto.conf``): every
    listener moves to a free port on 127.0.0.1, the options named in ``paths`` (password,
    ACL, TLS files, persistence location) point where given and those named in ``values``
    (a bridge's ``address``, its credentials) take the value given; see :func:`render_config`.
    :attr:`ports` maps each listener's port in the file to the local one.

    The config and the broker's log (its stdout and stderr; generated configs log there)
    live in ``workdir``, a temporary directory removed on :meth:`close` when None. Raises
    :class:`MissingProgram` at construction when ``executable`` is not installed. Use it as
    a context manager (start on enter, stop and clean up on exit) or call :meth:`start` /
    :meth:`stop` yourself.
    """

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        port: int | None = None,
        persistence: bool = True,
        password_file: Path | None = None,
        acl_file: Path | None = None,
        options: Mapping[str, object] | None = None,
        config_file: Path | None = None,
        paths: Mapping[str, Path] | None = None,
        values: Mapping[str, str] | None = None,
        executable: str = "mosquitto",
    ) -> None:
        self.executable = find_program(executable)
        self._workdir = _Workdir(workdir, "cat-edge-mosquitto-")
        self.workdir = self._workdir.path
        self.config_path = self.workdir / "mosquitto.conf"
        self.log_path = self.workdir / "mosquitto.log"
        self._proc: subprocess.Popen[bytes] | None = None
        if config_file is not None:
            if (port, password_file, acl_file, options) != (None, None, None, None):
                raise ValueError(
                    "MosquittoBroker: with config_file, give paths= (port, password_file, "
                    "acl_file and options belong to the generated config)"
                )
            text = config_file.read_text(encoding="utf-8")
            shipped = listener_ports(text)
            if not shipped:
                raise ValueError(f"{config_file}: no 'listener' line; add one")
            self.ports = dict(zip(shipped, free_ports(len(shipped)), strict=True))
            config = render_config(
                text, ports=self.ports, paths=paths or {}, values=values, source=str(config_file)
            )
        else:
            local = port if port is not None else free_port()
            self.ports = {local: local}
            config = self._generated(local, persistence, password_file, acl_file, options or {})
        self.config_path.write_text(config, encoding="utf-8")

    def _generated(
        self,
        port: int,
        persistence: bool,
        password_file: Path | None,
        acl_file: Path | None,
        options: Mapping[str, object],
    ) -> str:
        settings: dict[str, object] = {
            "allow_anonymous": "false" if password_file is not None else "true",
            "set_tcp_nodelay": "true",
            "persistence": "true" if persistence else "false",
        }
        if password_file is not None:
            settings["password_file"] = password_file
        if acl_file is not None:
            settings["acl_file"] = acl_file
        settings.update(options)
        lines = [
            *_option_lines(settings),
            f"user {getpass.getuser()}",  # as root, Mosquitto would switch to "mosquitto"
            "log_dest stdout",
            f"listener {port} {HOST}",
        ]
        if persistence:
            store = self.workdir / "persistence"
            store.mkdir(exist_ok=True)
            lines.insert(0, f"persistence_location {store}/")
        return "\n".join(lines) + "\n"

    @property
    def port(self) -> int:
        """The local port of the first listener."""
        return next(iter(self.ports.values()))

    @property
    def url(self) -> str:
        """``mqtt://127.0.0.1:<port>`` of the first listener."""
        return f"mqtt://{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs (for its RSS and CPU in /proc), else None."""
        return self._proc.pid if self.running and self._proc is not None else None

    def start(self, timeout_s: float = 10.0) -> None:
        """Start (or restart, on the same ports) and wait until every listener accepts
        connections; StartupError with the log's tail after ``timeout_s`` seconds."""
        if self.running:
            return
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                [self.executable, "-c", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._proc = proc
        deadline = time.monotonic() + timeout_s
        for port in self.ports.values():
            left = max(0.0, deadline - time.monotonic())
            if not wait_for_port(port, left, alive=lambda: proc.poll() is None):
                code = proc.poll()
                self.stop()
                why = f"exited with {code}" if code is not None else f"not ready in {timeout_s:g} s"
                raise StartupError(
                    f"mosquitto ({self.config_path}) {why}: nothing accepts connections on "
                    f"{HOST}:{port}; its log:\n{self.log_tail()}"
                )

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (Mosquitto writes its persistence file on the way out), SIGKILL after
        ``timeout_s`` seconds. Does nothing when not running."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _terminate(proc, timeout_s)

    def log_tail(self, lines: int = 30) -> str:
        return tail(self.log_path, lines)

    def close(self) -> None:
        """Stop, and remove the work directory if this broker made it."""
        self.stop()
        self._workdir.close()


# --------------------------------------------------------------------------- the service


def service_env(settings: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without any ``AGG_*`` (a developer's own settings must not
    leak into a test or the demo), unbuffered output, and ``settings`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGG_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(settings)
    return env


class ServiceProcess(_Server):
    """``python -m uvicorn aggregator.app:app`` on 127.0.0.1:``port`` with ``AGG_*`` settings.

    ``settings`` are the environment variables on top of :func:`service_env`; ``port`` is a
    free one if None. :meth:`start` waits until ``health_path`` answers 200; the process
    runs in ``workdir`` (a temporary directory removed on :meth:`close` when None) and
    writes its output to ``<name>-<n>.log`` there, one file per start. Restartable on the
    same port (:meth:`kill` then :meth:`start` is a crash and a recovery). Use it as a
    context manager (start on enter, stop on exit) or call the methods yourself.
    """

    def __init__(
        self,
        workdir: Path | None,
        settings: Mapping[str, str],
        *,
        port: int | None = None,
        app: str = "aggregator.app:app",
        health_path: str = "/healthz",
        log_level: str = "warning",
        name: str = "aggregator",
    ) -> None:
        self._workdir = _Workdir(workdir, "cat-edge-service-")
        self.workdir = self._workdir.path
        self.settings = dict(settings)
        self.port = port if port is not None else free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        self.app, self.health_path, self.log_level, self.name = app, health_path, log_level, name
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        """The log of the latest start."""
        return self.workdir / f"{self.name}-{self.starts}.log"

    def start(self, timeout_s: float = 30.0) -> None:
        """Start and wait until ``health_path`` answers 200; StartupError with the log's
        tail if the process exits first or after ``timeout_s`` seconds."""
        if self.alive():
            raise RuntimeError(f"{self.name} is already running on {self.base_url}; stop it first")
        self.starts += 1
        cmd = [sys.executable, "-m", "uvicorn", self.app, "--host", HOST,
               "--port", str(self.port), "--log-level", self.log_level]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                env=service_env(self.settings),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.returncode
                raise StartupError(
                    f"{self.name} exited with {code} during start-up; {self.diagnose()}"
                )
            if self._healthy():
                return
            time.sleep(0.05)
        self.stop()
        raise StartupError(
            f"{self.name} did not answer {self.base_url}{self.health_path} with 200 within "
            f"{timeout_s:g} s; {self.diagnose()}"
        )

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + self.health_path, timeout=1.0) as r:
                return int(r.status) == 200
        except (urllib.error.URLError, OSError):  # refused, 503, timeout
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, timeout_s: float = 10.0) -> None:
        """SIGKILL (no shutdown hook, no flush) and wait until the process is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=timeout_s)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (uvicorn's orderly shutdown), SIGKILL after ``timeout_s`` seconds."""
        if self.proc is not None:
            _terminate(self.proc, timeout_s)

    def log_tail(self, lines: int = 25) -> str:
        return tail(self.log_path, lines)

    def diagnose(self) -> str:
        return f"{self.name} log ({self.log_path.name}):\n{self.log_tail()}"

    def close(self) -> None:
        """Stop, and remove the work directory if this object made it."""
        self.stop()
        self._workdir.close()
