"""The service's logging under uvicorn: ``AGG_LOG_FORMAT`` and ``AGG_LOG_LEVEL``.

uvicorn configures only its own loggers, so without this the service's INFO lines
("serving ...", "recovered ...") vanish and its warnings print bare. :func:`configure_service`
gives the root logger (so ``aggregator.*``, ``edge_agent.*`` and library loggers) one handler
in the :mod:`edge_agent.cli.logs` format, and restyles uvicorn's own handlers the same way (only
those still wearing uvicorn's default formatters: a ``--log-config`` of yours is kept).

Both variables are read from the environment *before* the settings, not from
:class:`~aggregator.service.settings.Settings`: a settings error is itself logged, in the format asked
for. So they cannot live in ``AGG_CONFIG_FILE``.

``AGG_LOG_FORMAT``: ``text`` (default) or ``json`` (one object per line: time, level,
logger, message). ``AGG_LOG_LEVEL``: ``DEBUG``, ``INFO`` (default), ``WARNING``, ``ERROR``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from aggregator.service.settings import SettingsError
from edge_agent.cli.logs import LOG_FORMATS, LOG_LEVELS, LogFormat, configure, formatter

FORMAT_ENV = "AGG_LOG_FORMAT"
LEVEL_ENV = "AGG_LOG_LEVEL"
#: uvicorn's loggers that own handlers (``uvicorn.error`` propagates to ``uvicorn``)
UVICORN_LOGGERS = ("uvicorn", "uvicorn.access")


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
    """Root logger in ``fmt`` at ``level``; uvicorn's default-formatted handlers in ``fmt``."""
    configure(fmt, level)
    for name in UVICORN_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            current = handler.formatter
            if current is None or type(current).__module__ == "uvicorn.logging":
                handler.setFormatter(formatter(fmt))
