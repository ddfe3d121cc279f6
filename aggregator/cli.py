"""The ``aggregator`` console script.

``aggregator serve [--field value ...]``
    Run the service under uvicorn. Every setting (see :class:`aggregator.service.settings.Settings`)
    has a flag ``--<field-with-dashes>``; flags win over ``AGG_*`` variables and the config
    file. The API token is never a flag (it would show in ``ps``): use ``AGG_API_TOKEN``
    or ``--api-token-file``.

``aggregator simulate ...``
    The in-process simulator (:mod:`aggregator.sim`, entry ``aggregator.sim.cli.main(argv)``);
    everything after ``simulate`` is passed to it unchanged. This path imports none of the
    service's web dependencies (FastAPI, uvicorn, pydantic-settings, prometheus-client):
    the service modules are imported only for ``serve``.

Without the ``aggregator`` extras (a device install), ``aggregator --help`` still works and
``aggregator serve`` prints the one-line install hint (exit 2) before doing anything.

``serve`` exits 0 when uvicorn stops by itself, 2 on a configuration error (a setting, a
transport setting the broker refuses: the line names the ``AGG_*`` variable), 1 on a
broker that cannot be reached or an HTTP port uvicorn cannot bind (worth a restart), 130
after SIGINT and 143 after SIGTERM (128 + the signal, once uvicorn has shut down
gracefully).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any, Literal, Protocol, get_args, get_origin

from edge_agent.cli.parser import DefaultsFormatter, package_version
from edge_agent.errors import CatEdgeError


class Subcommands(Protocol):
    """What ``ArgumentParser.add_subparsers()`` returns, as far as this module uses it."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


_NOT_FLAGS = frozenset({"api_token", "config_file"})
_SIMULATOR = "aggregator.sim.cli"
#: the modules ``serve`` imports from the ``aggregator`` extras (pyproject.toml)
SERVICE_MODULES = ("fastapi", "uvicorn", "pydantic_settings", "dotenv", "prometheus_client")
INSTALL_HINT = "pip install 'cat-edge[aggregator]'"


def missing_service_module() -> str | None:
    """The first module of :data:`SERVICE_MODULES` that is not installed, else None."""
    for name in SERVICE_MODULES:
        if importlib.util.find_spec(name) is None:
            return name
    return None


def _shown_default(field: Any) -> str:
    """``; default <value>`` for a settings field's help ("; required", or "" if unset)."""
    if field.is_required():
        return "; required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return ""
    if isinstance(value, list):
        return "; default " + ",".join(str(v) for v in value)
    return f"; default {str(value).lower() if isinstance(value, bool) else value}"


def _serve_parser(sub: Subcommands) -> None:
    missing = missing_service_module()
    if missing is not None:  # a device install: no settings to list, only the hint
        p = sub.add_parser(
            "serve",
            help=f"run the aggregator service (not installed here: {INSTALL_HINT})",
            description=f"Needs the aggregator extras: {INSTALL_HINT}",
        )
        p.set_defaults(missing=missing)
        return
    from aggregator.service.settings import Settings, env_name

    p = sub.add_parser(
        "serve",
        help="run the aggregator service (FastAPI under uvicorn)",
        description="Run the aggregator. Flags override AGG_* environment variables and the "
        "AGG_CONFIG_FILE file.",
        formatter_class=DefaultsFormatter,
    )
    for name, field in Settings.model_fields.items():
        if name in _NOT_FLAGS:
            continue
        help_text = f"{field.description or ''} [env {env_name(name)}{_shown_default(field)}]"
        kind = field.annotation
        choices = get_args(kind) if get_origin(kind) is Literal else None
        if kind is bool:  # a switch: `--mqtt-tls-insecure` alone means true
            p.add_argument(
                f"--{name.replace('_', '-')}",
                dest=name,
                default=None,
                nargs="?",
                const="true",
                choices=["true", "false"],
                metavar="true|false",
                help=f"{help_text.strip()} (the flag alone: true)",
            )
            continue
        p.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            default=None,
            choices=choices,
            help=help_text.strip(),
        )
    p.add_argument(
        "--log-level",
        default=None,
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn and aggregator log level [env AGG_LOG_LEVEL; default info]; the "
        "format is AGG_LOG_FORMAT (text | json), for uvicorn's lines too",
    )
    p.set_defaults(missing=None)


def _not_installed(missing: str) -> int:
    print(
        f"aggregator serve: the service is not installed (no module {missing!r}): {INSTALL_HINT}",
        file=sys.stderr,
    )
    return 2


def serve(args: argparse.Namespace) -> int:
    """Start the service as ``uvicorn aggregator.app:app`` does (one log line and exit 2 or
    1 on failure: :mod:`aggregator.web.startup`), then serve it under uvicorn with every
    line in the ``AGG_LOG_FORMAT`` format (uvicorn's loggers print through the service's
    handler: :func:`aggregator.service.logs.uvicorn_log_config`). Exits 130 after SIGINT and
    143 after SIGTERM, once uvicorn has shut down cleanly."""
    if args.missing is not None:
        return _not_installed(args.missing)
    import uvicorn

    from aggregator.service.logs import uvicorn_log_config
    from aggregator.service.settings import Settings
    from aggregator.web.app import create_app
    from aggregator.web.startup import start_from_environment

    overrides = {
        name: getattr(args, name)
        for name in Settings.model_fields
        if name not in _NOT_FLAGS and getattr(args, name, None) is not None
    }
    level = None if args.log_level is None else args.log_level.upper()
    try:
        started = start_from_environment(overrides, level=level)
    except SystemExit as exc:  # logged in one line already
        return exc.code if isinstance(exc.code, int) else 2
    uvicorn_level = logging.getLogger().getEffectiveLevel()
    host, port = started.settings.host, started.settings.port
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:  # uvicorn shuts down on the signal, then raises it again: here, as Stopped
        uvicorn.run(
            create_app(started=started),
            host=host,
            port=port,
            log_config=uvicorn_log_config(),
            log_level=uvicorn_level,
        )
    except Stopped as stop:
        return 128 + stop.signum
    except CatEdgeError as exc:
        logging.getLogger("aggregator.cli").error("aggregator serve: %s", exc)
        return 1
    except SystemExit as exc:  # uvicorn's own failures (a port in use: 3) may heal: retry
        if exc.code in (0, None):
            return 0
        logging.getLogger("aggregator.cli").error(
            "aggregator serve: uvicorn could not serve on %s:%s (its ERROR line above says why)",
            host,
            port,
        )
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


class Stopped(Exception):
    """A stop signal (SIGINT, SIGTERM), re-raised by uvicorn after its graceful shutdown."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


# ---------------------------------------------------------------------------- simulate slot


def simulate(argv: Sequence[str]) -> int:
    """Hand over to ``aggregator.sim.cli.main(argv)`` (imported only when asked for)."""
    try:
        module = importlib.import_module(_SIMULATOR)
    except ModuleNotFoundError as exc:
        if exc.name not in (_SIMULATOR, "aggregator.sim"):
            raise
        print(
            "aggregator: the simulator is not installed in this build "
            "(aggregator/sim/ is missing); `aggregator serve` is available.",
            file=sys.stderr,
        )
        return 2
    entry = getattr(module, "main", None)
    if entry is None:
        print(f"aggregator: {_SIMULATOR} has no main(argv) function", file=sys.stderr)
        return 2
    result = entry(list(argv))
    return int(result) if result is not None else 0


# ---------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in and args_in[0] == "simulate":
        return simulate(args_in[1:])
    missing = missing_service_module()
    if (
        args_in
        and args_in[0] == "serve"
        and missing is not None
        and not {"-h", "--help"} & set(args_in)
    ):
        return _not_installed(missing)  # before parsing: its flags come from the settings
    parser = argparse.ArgumentParser(
        prog="aggregator", description="cat-edge aggregator: CAT training rounds over MQTT/ZeroMQ."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,simulate}")
    _serve_parser(sub)
    sub.add_parser("simulate", help="run agents and the aggregator in-process (simulator)")
    args = parser.parse_args(args_in)
    if args.command == "serve":
        return serve(args)
    return simulate([])  # pragma: no cover - handled above


if __name__ == "__main__":
    sys.exit(main())
