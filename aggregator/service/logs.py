"""The service's logging: one format for every line the process prints, uvicorn's included.

``AGG_LOG_FORMAT``: ``text`` (default) or ``json`` (one object per line: time, level,
logger, message). ``AGG_LOG_LEVEL``: ``DEBUG``, ``INFO`` (default), ``WARNING``, ``ERROR``.

:func:`configure_service` gives the root logger (so ``aggregator.*``, ``edge_agent.*``,
library loggers and Python warnings) one handler on stderr in the
:mod:`edge_agent.cli.logs` format, and sends uvicorn's loggers (its error and access lines)
through it: a uvicorn logger whose handlers all wear uvicorn's default formatters loses
them and propagates to the root (a ``--log-config`` of yours is kept as it is). Under
``uvicorn aggregator.app:app`` this runs when uvicorn loads the app, after uvicorn set up
its defaults and before its first line; ``aggregator serve`` passes uvicorn
:func:`uvicorn_log_config`, which leaves the handlers alone and only makes its loggers
propagate. A thread's uncaught exception is logged too (one record, the traceback in it).

Both variables are read from the environment *before* the settings, not from
:class:`~aggregator.service.settings.Settings`: a settings error is itself logged, in the
format asked for. So they cannot live in ``AGG_CONFIG_FILE``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from aggregator.engine.accounting import RoundRecord
from aggregator.service.settings import SettingsError
from edge_agent.cli.logs import LOG_FORMATS, LOG_LEVELS, LogFormat, configure

FORMAT_ENV = "AGG_LOG_FORMAT"
LEVEL_ENV = "AGG_LOG_LEVEL"
#: uvicorn's loggers (``uvicorn.error`` and ``uvicorn.asgi`` propagate to ``uvicorn``)
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


def log_options(env: Mapping[str, str]) -> tuple[LogFormat, str]:
    """(format, level) from ``env``; SettingsError naming the variable when invalid."""
    fmt = env.get(FORMAT_ENV, "text").strip().lower() or "text"
    if fmt not in LOG_FORMATS:
        raise SettingsError(f"{FORMAT_ENV}={fmt!r}: use one of {', '.join(LOG_FORMATS)}")
    level = env.get(LEVEL_ENV, "INFO").strip().upper() or "INFO"
    if level not in LOG_LEVELS:
        raise SettingsError(f"{LEVEL_ENV}={level!r}: use one of {', '.join(LOG_LEVELS)}")
    return fmt, level


def configure_service(fmt: LogFormat = "text", level: str = "INFO") -> None:
    """Root logger in ``fmt`` at ``level``; uvicorn's default handlers replaced by it."""
    configure(fmt, level)
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        if all(_uvicorn_default(h) for h in logger.handlers):
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.propagate = True


def uvicorn_log_config() -> dict[str, Any]:
    """``uvicorn.run(log_config=...)`` after :func:`configure_service`: an incremental
    dictConfig (existing handlers stay) that makes uvicorn's loggers propagate to the
    root handler, so their lines come in the service's format."""
    return {
        "version": 1,
        "incremental": True,
        "loggers": {name: {"propagate": True} for name in UVICORN_LOGGERS},
    }


def _uvicorn_default(handler: logging.Handler) -> bool:
    current = handler.formatter
    return current is None or type(current).__module__ == "uvicorn.logging"


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("aggregator").error(
        "thread %s died: %s",
        name,
        args.exc_value,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


#: a "checkpoint written" INFO line at most once per this many versions (and the first)
CHECKPOINT_LOG_EVERY = 100
#: participants a "round closed" line names (the count is always there)
NAMED_PARTICIPANTS = 10


class ProgressLog:
    """The INFO lines an operator follows a job by, from what the engine returned to the
    service (committed round records), once they are durable: every round closed, and a
    checkpoint written at most every :data:`CHECKPOINT_LOG_EVERY` versions."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._checkpoint_logged: int | None = None  # version of the last line

    def round_closed(self, rec: RoundRecord) -> None:
        names = rec.participants[:NAMED_PARTICIPANTS]
        more = len(rec.participants) - len(names)
        self._log.info(
            "round closed: version %d from %d (%s), %d participants (%s%s), loss %s, %.2f s",
            rec.version,
            rec.base_version,
            rec.reason,
            len(rec.participants),
            ", ".join(names),
            f" and {more} more" if more > 0 else "",
            "n/a (no AGG_EVAL_DATA)" if rec.loss is None else f"{rec.loss:.6g}",
            rec.latency_s,
        )

    def checkpoint_written(self, version: int, every: int) -> None:
        """A checkpoint at ``version`` was written (``every``: AGG_CHECKPOINT_EVERY)."""
        last = self._checkpoint_logged
        if last is not None and version - last < CHECKPOINT_LOG_EVERY:
            return
        self._checkpoint_logged = version
        self._log.info(
            "checkpoint written at version %d (one every %d versions; this line every %d)",
            version,
            every,
            CHECKPOINT_LOG_EVERY,
        )
