"""One aggregator per data directory: an OS lock on ``<AGG_DATA_DIR>/aggregator.lock``.

Two aggregators on one directory would both append to the journal, both write
checkpoints and both publish versions the other never saw. :meth:`DataDirLock.acquire`
takes an exclusive ``flock`` on the lock file (without waiting) and writes the holder into
it: ``{"pid": ..., "host": ..., "started": "<ISO 8601 UTC>"}``. The kernel holds the lock
for as long as the descriptor is open, so it ends with the process however the process
ends (SIGKILL and power loss included: a stale file never blocks a restart). A second
aggregator fails at once with :class:`DataDirInUse` naming the holder, unless it is a
standby (``AGG_STANDBY=true``): :meth:`DataDirLock.wait` then polls the lock every
``poll_s`` seconds until the holder is gone (a take-over) or it is told to stop.

The descriptor is close-on-exec, so a child process never inherits the lock. ``flock`` is
advisory: a standby on another host needs a shared file system whose locks work across
hosts (NFSv4, or NFSv3 with lockd); docs/standby.md lists what works.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from edge_agent.errors import CatEdgeError

LOCK_FILE: Final = "aggregator.lock"
#: the most bytes of a lock file read back to name its holder
_HOLDER_MAX: Final = 4096


class DataDirInUse(CatEdgeError):
    """Another process holds the data directory's lock; the message names it and ``holder``
    says who (``pid P on host H since T``)."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


def _holder(fd: int) -> str:
    """``pid P on host H since T`` from the lock file, or why it cannot say."""
    try:
        raw = os.pread(fd, _HOLDER_MAX, 0)
        info = json.loads(raw)
        return f"pid {info['pid']} on host {info['host']} since {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its holder has not written its pid yet"


class DataDirLock:
    """The exclusive lock of one data directory, held until :meth:`release` or exit."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Create ``data_dir`` if needed and lock it; DataDirInUse when another process has
        it (OSError when the directory cannot be made or written)."""
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise DataDirInUse(
                f"AGG_DATA_DIR={data_dir} is in use by another aggregator ({holder}; lock "
                f"file {path}); stop that one first, give this one its own AGG_DATA_DIR, "
                "or set AGG_STANDBY=true to take over when it ends",
                holder,
            ) from None
        except BaseException:
            os.close(fd)
            raise
        started = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": started}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        return cls(fd, path)

    @classmethod
    def wait(
        cls,
        data_dir: Path,
        stop: threading.Event,
        *,
        poll_s: float = 0.2,
        on_busy: Callable[[DataDirInUse], None] | None = None,
    ) -> DataDirLock | None:
        """:meth:`acquire`, retried every ``poll_s`` seconds while another process holds
        the lock; ``on_busy(exc)`` once, at the first refusal. None if ``stop`` is set
        first (the lock is then not held)."""
        told = False
        while not stop.is_set():
            try:
                return cls.acquire(data_dir)
            except DataDirInUse as exc:
                if not told and on_busy is not None:
                    on_busy(exc)
                told = True
            stop.wait(poll_s)
        return None

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        """Unlock (idempotent); the file stays, naming the last holder."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
