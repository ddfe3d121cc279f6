"""``edge-agent``: the device command line (run, calibrate, profiles, data).

Every subcommand has ``--help``; errors name the bad argument and the fix. Exit status:
0 done; 2 a configuration error, which no restart heals (a bad flag, as argparse does;
for ``run`` also an unknown profile, a missing data or password file, a bad server URL,
credentials the broker refuses, a CA that does not sign the broker's certificate, TLS
against a plain listener, an ``--agent-id`` the shipped ACL drops, and an aggregator that
keeps refusing the agent's settings); 1 any other error (e.g. the broker is unreachable:
worth a restart); 130 stopped by SIGINT (Ctrl-C), 143 by SIGTERM (128 + the signal).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from edge_agent.cli.keys import add_keys_parser
from edge_agent.cli.logs import LOG_FORMATS
from edge_agent.cli.logs import configure as configure_logging
from edge_agent.cli.parser import (
    EPILOG,
    LOG_FORMAT_HELP,
    DefaultsFormatter,
    add_run_parser,
    package_version,
)
from edge_agent.cli.profiles import cmd_profiles
from edge_agent.cli.summary import run_summary
from edge_agent.errors import CatEdgeError, TransportConfigError

if TYPE_CHECKING:  # the agent's imports load only for `run`
    from edge_agent.agent.loop import Agent

log = logging.getLogger("edge_agent")

#: exit status of a configuration error (systemd: RestartPreventExitStatus=2)
EXIT_CONFIG = 2


# --------------------------------------------------------------------------- run


def _transport_options(args: argparse.Namespace) -> dict[str, object]:
    scheme = args.server.split("://", 1)[0]
    opts: dict[str, object] = {}
    if scheme in ("mqtt", "mqtts"):
        for name in ("username", "password_file", "ca_file", "cert_file", "key_file"):
            value = getattr(args, name)
            if value:
                opts[name] = value
        if os.environ.get("CAT_EDGE_MQTT_PASSWORD") and "password_file" not in opts:
            opts["password_env"] = "CAT_EDGE_MQTT_PASSWORD"
    elif scheme == "zmq+tcp":
        if args.curve_server_key:
            opts["curve_server_public_key_file"] = args.curve_server_key
        if args.curve_secret_file:
            opts["curve_client_secret_file"] = args.curve_secret_file
    elif any(
        getattr(args, n)
        for n in ("username", "password_file", "ca_file", "curve_server_key", "curve_secret_file")
    ):
        raise CatEdgeError(
            f"--server {args.server}: credentials and keys apply to mqtt://, mqtts:// or zmq+tcp:// only"
        )
    return opts


class ConfigurationError(CatEdgeError):
    """A setting of ``run`` is wrong (exit 2: restarting will not help)."""


#: the ``run`` flag (or variable) that sets each transport option, where it is not
#: ``--<option-with-dashes>``
_OPTION_FLAGS = {
    "url": "--server",
    "password": "the password in --server",
    "password_env": "CAT_EDGE_MQTT_PASSWORD",
    "tls_insecure": "?tls_insecure=true in --server",
    "curve_server_public_key_file": "--zmq-server-key-file",
    "curve_client_secret_file": "--zmq-secret-key-file",
}


def option_flag(option: str) -> str:
    """The ``edge-agent run`` flag that sets transport option ``option``."""
    return _OPTION_FLAGS.get(option, "--" + option.replace("_", "-"))


def cmd_run(args: argparse.Namespace) -> int:
    try:
        agent = _build_agent(args)
    except (CatEdgeError, OSError, ValueError) as exc:
        raise ConfigurationError(_describe(exc)) from exc
    signals: list[int] = []

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        signals.append(signum)
        agent.stop()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 <pid>`: every thread's stack on stderr
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        agent.start()
    except TransportConfigError as exc:
        raise ConfigurationError(_describe(exc)) from exc
    try:
        agent.run()
    finally:
        agent.close("done" if agent.finished else "offline")
    summary = run_summary(agent.config.agent_id, agent)
    print(json.dumps(summary), flush=True)
    if args.save_model and agent.x is not None:
        np.save(args.save_model, agent.x)
    if agent.gave_up is not None:
        raise ConfigurationError(agent.gave_up)
    return 128 + signals[0] if signals else 0


def agent_id_for(args: argparse.Namespace) -> str:
    """``--agent-id``, else ``--username`` on MQTT (the shipped broker's identity), else the
    host name.

    The shipped Mosquitto ACL (``pattern write cat/+/update/%u``) lets a user publish only
    under its own name and drops anything else without telling the client, so an id that
    differs from the user name is refused here (ConfigurationError, exit 2).
    """
    mqtt = args.server.split("://", 1)[0] in ("mqtt", "mqtts")
    username = args.username if mqtt else None  # ZeroMQ has no user names
    if args.agent_id and username and args.agent_id != username:
        raise ConfigurationError(
            f"--agent-id {args.agent_id!r} differs from --username {args.username!r}: the "
            "shipped broker ACL (deploy/mosquitto/acl, pattern ... %u) drops every message an "
            f"agent publishes under another id. Drop --agent-id (it defaults to --username), "
            f"or pass --agent-id {args.username}"
        )
    return str(args.agent_id or username or socket.gethostname().split(".")[0])


def _build_agent(args: argparse.Namespace) -> Agent:
    """Everything ``run`` needs before it connects (each error here is a configuration error)."""
    from edge_agent.agent.loop import Agent, AgentConfig
    from edge_agent.data import load_dataset
    from edge_agent.links.catalog import resolve_profile
    from edge_agent.numerics.models import make_model
    from edge_agent.protocol.mac import read_key
    from edge_agent.protocol.signing import read_public_key
    from edge_agent.transports import open_transport

    agent_id = agent_id_for(args)
    profile = resolve_profile(args.profile)
    data = load_dataset(args.data, n_features=args.features)
    n_classes = args.classes
    model = make_model(args.model, n_features=data.n_features, n_classes=n_classes, l2=args.l2)
    config = AgentConfig(
        job=args.job,
        agent_id=agent_id,
        compressor=args.compressor,
        policy=args.policy,
        feedback=args.feedback or _default_feedback(args),
        value_dtype=args.value_dtype,
        seed=args.seed,
        resend_s=None if args.resend_s <= 0 else args.resend_s,
        duty_cycle=args.duty_cycle,
        max_rounds=args.max_rounds,
        curvature=args.curvature,
        max_refusals=args.max_refusals,
        mac_key=None if args.mac_key_file is None else read_key(args.mac_key_file),
        aggregator_keys=tuple(read_public_key(p) for p in args.aggregator_key or ()),
        # control signed before this start (less 10 min of clock difference) is a replay
        aggregator_not_before_us=time.time_ns() // 1000 - 600_000_000,
        group=args.group,
        batch_size=args.batch_size,
        local_steps=args.local_steps,
        comm_prob=args.comm_prob,
    )
    transport = open_transport(
        args.server,
        role="agent",
        client_id=f"cat-{args.job}-{agent_id}",
        **_transport_options(args),
    )
    agent = Agent(
        config,
        model=model,
        data=data,
        profile=profile,
        transport=transport,
        on_round=None if args.quiet else (lambda entry: log.info("%s", entry.line())),
    )
    log.info(
        "agent %s: job %s, %d rows x %d features, model %s (d=%d, L=%.4g), %s/%s on %s (objective %s), server %s",
        agent_id,
        args.job,
        data.n_rows,
        data.n_features,
        model.kind,
        model.d,
        agent.smoothness,
        args.compressor,
        args.policy,
        profile.name,
        profile.objective,
        args.server,
    )
    return agent


# --------------------------------------------------------------------------- data


def cmd_data_generate(args: argparse.Namespace) -> int:
    from edge_agent.data import make_rcv1_like, write_libsvm, write_npz

    rng = np.random.default_rng(args.seed)
    ds = make_rcv1_like(args.rows, args.features, rng=rng, idf=not args.no_idf)
    return _write_shards(ds, args, write_libsvm if args.format == "svm" else write_npz, rng)


def cmd_data_split(args: argparse.Namespace) -> int:
    from edge_agent.data import load_dataset, write_libsvm, write_npz

    ds = load_dataset(args.file)
    rng = np.random.default_rng(args.seed)
    return _write_shards(ds, args, write_libsvm if args.format == "svm" else write_npz, rng)


def _write_shards(ds: Any, args: argparse.Namespace, writer: Any, rng: np.random.Generator) -> int:
    from edge_agent.data import split_shards

    out = Path(args.out)
    names = [f"shard-{i:03d}.{args.format}" for i in range(max(args.shards, 1))]
    names += [f"full.{args.format}"] if args.full else []
    existing = [name for name in names if (out / name).exists()]
    if existing and not args.force:
        raise CatEdgeError(
            f"{out} already holds {', '.join(existing)}; pass --force to overwrite them, "
            "or choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    shards = split_shards(ds, args.shards, how=args.how, rng=rng) if args.shards > 1 else [ds]
    for name, shard in zip(names, shards, strict=False):
        path = out / name
        writer(shard, path)
        print(f"{path}: {shard.n_rows} rows x {shard.n_features} features")
    if args.full:
        path = out / names[-1]
        writer(ds, path)
        print(f"{path}: {ds.n_rows} rows x {ds.n_features} features (all shards, for evaluation)")
    return 0


# --------------------------------------------------------------------------- calibrate


def cmd_calibrate_serve(args: argparse.Namespace) -> int:
    from edge_agent.links.calibrate import serve_echo

    serve_echo(args.bind, max_requests=args.max_requests)
    return 0


def cmd_calibrate_measure(args: argparse.Namespace) -> int:
    from edge_agent.links.calibrate import measure_link, write_measured_profile

    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else None
    points = measure_link(args.peer, sizes=sizes, repeats=args.repeats, timeout_s=args.timeout_s)
    profile, fit = write_measured_profile(
        points,
        name=args.name,
        out=args.out,
        power_w=args.power_w,
        overhead_bytes=args.overhead_bytes,
    )
    for p in points:
        print(f"{p.size_bytes:>7} B  one-way {p.seconds * 1e3:9.3f} ms (median of {args.repeats})")
    print(f"affine fit: cost_s = {fit[0]:.6g} + {fit[1]:.6g} * bytes")
    print(f"wrote {args.out} (profile {profile.name}, objective {profile.objective})")
    return 0


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    fmt = DefaultsFormatter
    parser = argparse.ArgumentParser(
        prog="edge-agent",
        description="cat-edge device agent: train with communication-aware adaptive compression (CAT).",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="lowest level logged",
    )
    parser.add_argument("--log-format", default="text", choices=LOG_FORMATS, help=LOG_FORMAT_HELP)
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{run,profiles,data,calibrate,keys}"
    )

    run = add_run_parser(sub, fmt)
    run.set_defaults(func=cmd_run)

    add_keys_parser(sub, fmt)

    prof = sub.add_parser(
        "profiles",
        help="list cost profiles and the T CAT would pick on each",
        formatter_class=fmt,
        epilog=EPILOG,
    )
    prof.add_argument(
        "profile", nargs="*", help="profile files or names (default: every shipped profile)"
    )
    prof.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="profile directory (default: the shipped cost_profiles/)",
    )
    prof.add_argument("--d", type=int, default=47236, help="model dimension")
    prof.add_argument(
        "--compressor",
        default="topk",
        choices=["dense", "topk", "signtopk", "randk"],
        help="the compressor to price",
    )
    prof.add_argument(
        "--gradient", default=None, help="a gradient (.npy) to price instead of a synthetic one"
    )
    prof.add_argument("--seed", type=int, default=0, help="seed of the synthetic gradient")
    prof.add_argument("--json", action="store_true", help="one JSON object per profile")
    prof.set_defaults(func=cmd_profiles)

    data = sub.add_parser(
        "data",
        help="generate synthetic shards or split a data file",
        formatter_class=fmt,
        epilog=EPILOG,
    )
    dsub = data.add_subparsers(dest="data_command", required=True, metavar="{generate,split}")
    for name, helptext in (
        ("generate", "generate an RCV1-like sparse set and split it"),
        ("split", "split a LIBSVM/.npz/.csv file into shards"),
    ):
        p = dsub.add_parser(name, help=helptext, formatter_class=fmt)
        if name == "generate":
            p.add_argument("--rows", type=int, default=2000, help="rows in all")
            p.add_argument("--features", type=int, default=47236, help="features per row")
            p.add_argument(
                "--no-idf",
                action="store_true",
                help="values log-tf only (no idf weighting) before the unit-norm scaling",
            )
            p.set_defaults(func=cmd_data_generate)
        else:
            p.add_argument("file", help="data file to split")
            p.set_defaults(func=cmd_data_split)
        p.add_argument("--shards", type=int, default=1, help="number of agent shards")
        p.add_argument(
            "--how", default="iid", choices=["iid", "label"], help="iid, or skewed by label"
        )
        p.add_argument("--out", required=True, help="output directory")
        p.add_argument(
            "--format", default="svm", choices=["svm", "npz"], help="file format of the shards"
        )
        p.add_argument(
            "--full",
            action="store_true",
            help="also write the whole set (for the aggregator's evaluation)",
        )
        p.add_argument("--seed", type=int, default=0, help="seed of the data and the split")
        p.add_argument(
            "--force", action="store_true", help="overwrite shards already in --out (else: exit 1)"
        )

    cal = sub.add_parser(
        "calibrate",
        help="measure a real link and write a measured cost profile",
        formatter_class=fmt,
        epilog=EPILOG,
    )
    csub = cal.add_subparsers(dest="calibrate_command", required=True, metavar="{serve,measure}")
    srv = csub.add_parser(
        "serve", help="run the echo peer (on the other end of the link)", formatter_class=fmt
    )
    srv.add_argument("--bind", default="tcp://127.0.0.1:5599", help="ZeroMQ endpoint to bind")
    srv.add_argument("--max-requests", type=int, default=None, help="exit after this many echoes")
    srv.set_defaults(func=cmd_calibrate_serve)
    mea = csub.add_parser(
        "measure",
        help="send 16 B .. 64 KiB payloads to the peer, fit, write a profile",
        formatter_class=fmt,
    )
    mea.add_argument(
        "--peer", required=True, help="ZeroMQ endpoint of the echo peer, e.g. tcp://10.0.0.2:5599"
    )
    mea.add_argument("--name", required=True, help="profile name ([A-Za-z0-9_.-])")
    mea.add_argument("--out", required=True, help="profile file to write (.json)")
    mea.add_argument(
        "--sizes",
        default=None,
        help="comma-separated payload sizes in bytes (default 16..65536, powers of two)",
    )
    mea.add_argument(
        "--repeats", type=int, default=20, help="round trips per size (the median is used)"
    )
    mea.add_argument(
        "--timeout-s", type=float, default=5.0, help="give up on a round trip after this long"
    )
    mea.add_argument(
        "--power-w",
        type=float,
        default=None,
        help="radio power while sending (W): adds energy_j = power * time",
    )
    mea.add_argument(
        "--overhead-bytes", type=int, default=0, help="framing bytes per message not in the payload"
    )
    mea.set_defaults(func=cmd_calibrate_measure)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    try:
        return int(args.func(args))
    except ConfigurationError as exc:
        print(f"edge-agent {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (CatEdgeError, FileNotFoundError, PermissionError, IsADirectoryError, ValueError) as exc:
        print(f"edge-agent {args.command}: error: {_describe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


def _directional(args: argparse.Namespace) -> bool:
    """``--curvature directional`` prices the gradient itself: no error feedback by default."""
    return bool(getattr(args, "curvature", "global") == "directional")


def _default_feedback(args: argparse.Namespace) -> Literal["none", "ef", "ef21"]:
    """No feedback for directional pricing, classic EF for minibatch SGD, EF21 otherwise."""
    local = getattr(args, "local_steps", None) is not None or getattr(args, "comm_prob", None)
    if _directional(args) or local:
        return "none"
    return "ef" if getattr(args, "batch_size", None) is not None else "ef21"


def _describe(exc: Exception) -> str:
    """One line for an error: an OSError names its file and the system's reason."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    if isinstance(exc, TransportConfigError):
        return exc.naming(option_flag)
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
