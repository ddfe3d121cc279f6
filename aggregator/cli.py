"""The ``aggregator`` console script.

``aggregator serve [--field value ...]``
    Run the service under uvicorn. Every setting (see :class:`aggregator.settings.Settings`)
    has a flag ``--<field-with-dashes>``; flags win over ``AGG_*`` variables and the config
    file. The API token is never a flag (it would show in ``ps``): use ``AGG_API_TOKEN``
    or ``--api-token-file``.

``aggregator simulate ...``
    The in-process simulator (:mod:`aggregator.sim`, entry ``aggregator.sim.cli.main(argv)``);
    everything after ``simulate`` is passed to it unchanged. This path imports none of the
    service's web dependencies (FastAPI, uvicorn, pydantic-settings, prometheus-client):
    the service modules are imported only for ``serve``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from edge_agent.errors import CatEdgeError

_NOT_FLAGS = frozenset({"api_token", "config_file"})
_SIMULATOR = "aggregator.sim.cli"


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from aggregator.settings import Settings, env_name

    p = sub.add_parser(
        "serve",
        help="run the aggregator service (FastAPI under uvicorn)",
        description="Run the aggregator. Flags override AGG_* environment variables and the "
        "AGG_CONFIG_FILE file.",
    )
    for name, field in Settings.model_fields.items():
        if name in _NOT_FLAGS:
            continue
        help_text = (field.description or "") + f" [env {env_name(name)}]"
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None, help=help_text)
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn and aggregator log level",
    )


def serve(args: argparse.Namespace) -> int:
    from aggregator.settings import Settings, SettingsError, load_settings

    overrides = {
        name: getattr(args, name)
        for name in Settings.model_fields
        if name not in _NOT_FLAGS and getattr(args, name, None) is not None
    }
    try:
        settings = load_settings(**overrides)
    except SettingsError as exc:
        print(f"aggregator: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from aggregator.app import create_app

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        uvicorn.run(
            create_app(settings), host=settings.host, port=settings.port, log_level=args.log_level
        )
    except CatEdgeError as exc:
        print(f"aggregator: {exc}", file=sys.stderr)
        return 1
    return 0


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
    parser = argparse.ArgumentParser(
        prog="aggregator", description="cat-edge aggregator: CAT training rounds over MQTT/ZeroMQ."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,simulate}")
    _serve_parser(sub)
    sub.add_parser("simulate", help="run agents and the aggregator in-process (simulator)")
    args = parser.parse_args(args_in)
    if args.command == "serve":
        return serve(args)
    return simulate([])  # pragma: no cover - handled above


if __name__ == "__main__":
    sys.exit(main())
