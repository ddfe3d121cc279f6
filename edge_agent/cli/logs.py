"""One log format for the agent and the service: text or JSON lines.

``text`` (the default) is one line per record::

    2026-12-01 18:40:02,113 INFO edge_agent.agent.loop: radio silent for 36.9 s (duty cycle 1 %)

``json`` is one JSON object per line with the keys ``time`` (ISO 8601, UTC, milliseconds),
``level``, ``logger`` and ``message`` (plus ``exc`` with the formatted traceback when the
record carries one), for log shippers that should not parse text.

:func:`configure` installs one handler on a logger (the root logger by default) and is
idempotent: calling it again replaces the handler it installed, never anyone else's (a
test harness's, uvicorn's).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal, TextIO

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message (and exc)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, tz=UTC)
        out: dict[str, str] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def formatter(fmt: LogFormat) -> logging.Formatter:
    """The formatter for ``fmt`` (``text`` or ``json``); ValueError for anything else."""
    if fmt == "text":
        return logging.Formatter(TEXT_FORMAT)
    if fmt == "json":
        return JsonFormatter()
    raise ValueError(f"unknown log format {fmt!r}; valid: {', '.join(LOG_FORMATS)}")


class _OurHandler(logging.StreamHandler[TextIO]):
    """The handler :func:`configure` installs (a second call replaces only it). Without a
    stream it writes to whatever ``sys.stderr`` is when a record comes (a test harness may
    swap it), never to a stream closed since."""

    def __init__(self, stream: TextIO | None) -> None:
        super().__init__(stream if stream is not None else sys.stderr)
        self._follow_stderr = stream is None

    def emit(self, record: logging.LogRecord) -> None:
        if self._follow_stderr:
            self.stream = sys.stderr  # handle() holds the handler's lock here
        super().emit(record)


def configure(
    fmt: LogFormat = "text",
    level: str | int = "INFO",
    *,
    logger: str = "",
    stream: TextIO | None = None,
) -> logging.Handler:
    """Log records of ``logger`` (root: ``""``) and its children at ``level`` and above to
    ``stream`` (stderr when None) in ``fmt``; returns the handler installed."""
    target = logging.getLogger(logger)
    for old in [h for h in target.handlers if isinstance(h, _OurHandler)]:
        target.removeHandler(old)
    handler = _OurHandler(stream)
    handler.setFormatter(formatter(fmt))
    target.addHandler(handler)
    target.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
