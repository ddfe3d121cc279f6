"""What ``edge-agent`` accepts: the help formatter every cat-edge command line shares, and
the flags of ``edge-agent run`` (the device's one long-running command), grouped as its
``--help`` shows them. The commands themselves are :mod:`edge_agent.cli.commands`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from edge_agent.cli.logs import LOG_FORMATS

DEFAULT_SERVER = "zmq+tcp://127.0.0.1:5555"
#: the same default as the aggregator's AGG_JOB, so that defaults meet
DEFAULT_JOB = "cat"
EPILOG = "Docs: README.md and docs/ in the cat-edge repository."
LOG_FORMAT_HELP = "log lines as text (time level logger: message) or json (one object per line)"


def add_run_parser(sub: Any, fmt: type[argparse.HelpFormatter]) -> argparse.ArgumentParser:
    """The ``run`` subcommand and its flags (its handler is set by the caller)."""
    run: argparse.ArgumentParser = sub.add_parser(
        "run", help="join a job and train on a local data shard", formatter_class=fmt, epilog=EPILOG
    )
    run.add_argument(  # also after `run`, where the systemd unit's flags are
        "--log-format",
        default=argparse.SUPPRESS,
        choices=LOG_FORMATS,
        help=f"{LOG_FORMAT_HELP} (default: the value before `run`, else text)",
    )
    run.add_argument(
        "--profile",
        required=True,
        help="cost profile of this device's link: a JSON file or a shipped profile name (see `edge-agent profiles`)",
    )
    run.add_argument(
        "--server",
        default=DEFAULT_SERVER,
        help="aggregator/broker URL: zmq+tcp://host:port, mqtt://host:port, mqtts://host:port",
    )
    run.add_argument(
        "--job",
        default=DEFAULT_JOB,
        help="job id ([A-Za-z0-9._-]): the aggregator's AGG_JOB, whose default is the same",
    )
    run.add_argument(
        "--agent-id",
        default=None,
        help="this agent's id (default: --username on mqtt(s)://, else the host name); under "
        "the shipped broker ACL it must equal --username",
    )
    run.add_argument(
        "--data", required=True, help="local data shard: LIBSVM (.svm/.libsvm/.txt), .npz or .csv"
    )
    run.add_argument(
        "--features",
        type=int,
        default=None,
        help="number of features of the job's model: pads a LIBSVM shard that lacks the last "
        "features; a .npz or .csv must have exactly this many (docs/data-formats.md)",
    )
    run.add_argument(
        "--model",
        default="logreg",
        choices=["logreg", "lsq", "softmax"],
        help="the job's model (must match the aggregator's AGG_MODEL)",
    )
    run.add_argument("--classes", type=int, default=2, help="classes (softmax)")
    run.add_argument(
        "--l2", type=float, default=1e-3, help="l2 regularisation (must match the aggregator's)"
    )
    run.add_argument(
        "--compressor",
        default="topk",
        choices=["dense", "topk", "signtopk", "randk"],
        help="how the update is compressed (one the job allows)",
    )
    run.add_argument(
        "--policy",
        default="cat",
        help="how T is chosen: cat | cat:nominal | fixed:T | dynamic | "
        "hybrid:S (with --batch-size, cat prices the noisy gradient's expected decrease, "
        "cat:nominal its deterministic gain; docs/algorithm.md)",
    )
    run.add_argument(
        "--feedback",
        default=None,
        choices=["none", "ef", "ef21"],
        help="error feedback; the aggregator's AGG_FEEDBACK (default ef21) sets the job's family, ef21 or plain "
        "(none, ef): others must match (default: ef21, which converges with many agents; "
        "none with --curvature directional)",
    )
    run.add_argument(
        "--curvature",
        default="global",
        choices=["global", "directional"],
        help="global: T from --policy, the aggregator steps 1/L along every update; "
        "directional: T priced with a bound on the curvature of this shard's objective along "
        "the direction sent, and the update scaled so the aggregator's 1/L step moves x by "
        "the best step along it (semantics 'dir'; dense: step 1/L_g). Needs --feedback none, "
        "--policy cat and compressor dense, topk or signtopk; guaranteed for one agent only "
        "(docs/curvature.md)",
    )
    run.add_argument(
        "--value-dtype",
        default="float32",
        choices=["float32", "float16", "float64"],
        help="precision of the values sent",
    )
    run.add_argument(
        "--group",
        default=None,
        help="the multicast group this device receives versions on (default: the one its profile's downlink.shared names; none: unicast)",
    )
    run.add_argument(
        "--duty-cycle",
        default="wait",
        choices=["wait", "ignore"],
        help="wait: stay silent as the profile's duty cycle demands; ignore: only account it (loopback tests)",
    )
    run.add_argument(
        "--resend-s",
        type=float,
        default=10.0,
        help="re-send the last update after this many silent seconds (0: never)",
    )
    run.add_argument(
        "--max-rounds", type=int, default=None, help="stop after answering this many rounds"
    )
    run.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of this agent's random choices (randk, power iteration)",
    )
    run.add_argument(
        "--batch-size",
        type=float,
        default=None,
        help="minibatch SGD: rows per gradient (e.g. 64) or a fraction of the shard (e.g. 0.1); "
        "default: the full local gradient. With it the default feedback is 'ef' (classic "
        "error feedback; EF21 stalls on noisy gradients, docs/algorithm.md)",
    )
    schedule = run.add_mutually_exclusive_group()
    schedule.add_argument(
        "--local-steps",
        type=int,
        default=None,
        metavar="H",
        help="local training (LoCoDL): H local gradient steps between messages, the change of "
        "the local model CAT-compressed up, a compressed anchor change down; the job must run "
        "it with the same H (AGG_LOCAL_STEPS). Default feedback then: none. With "
        "--batch-size 1/k (0.1, 0.05, ...) each local step takes a minibatch and H must be a "
        "multiple of k (whole passes a round)",
    )
    schedule.add_argument(
        "--comm-prob",
        type=float,
        default=None,
        metavar="P",
        help="local training (LoCoDL) with a drawn schedule, Scaffnew/ProxSkip's coin: each "
        "round's number of local steps comes with the broadcast (mean 1/P); the job must run "
        "it with the same P (AGG_COMM_PROB). Default feedback then: none. Not with "
        "--batch-size (a drawn count cannot keep whole passes)",
    )
    run.add_argument(
        "--max-refusals",
        type=int,
        default=3,
        help="exit (status 2) after the aggregator refused this agent's settings this many "
        "times (wrong d, model, compressor or feedback family)",
    )
    run.add_argument("--save-model", default=None, help="write the final model copy here (.npy)")
    run.add_argument("--quiet", action="store_true", help="no per-round log line")
    sec = run.add_argument_group("credentials (never defaults; secrets from files or environment)")
    sec.add_argument("--username", default=None, help="MQTT user name")
    sec.add_argument(
        "--password-file",
        default=None,
        help="file holding the MQTT password (or set CAT_EDGE_MQTT_PASSWORD)",
    )
    sec.add_argument("--ca-file", default=None, help="CA certificate for mqtts://")
    sec.add_argument("--cert-file", default=None, help="client certificate for mqtts://")
    sec.add_argument("--key-file", default=None, help="client key for mqtts://")
    sec.add_argument(
        "--zmq-server-key-file",
        "--curve-server-key",
        dest="curve_server_key",
        default=None,
        help="file with the aggregator's CurveZMQ public key (z85): encrypts, and checks "
        "that the server is the aggregator",
    )
    sec.add_argument(
        "--zmq-secret-key-file",
        "--curve-secret-file",
        dest="curve_secret_file",
        default=None,
        help="this agent's CurveZMQ secret key file (`edge-agent keys zmq`); needed when the "
        "aggregator admits listed agent keys only (AGG_ZMQ_AGENTS_DIR)",
    )
    sec.add_argument(
        "--mac-key-file",
        type=Path,
        default=None,
        help="sign every update, hello, status and request with this agent's MAC key "
        "(`edge-agent keys mac`; the aggregator holds a copy in AGG_MAC_KEYS_DIR)",
    )
    sec.add_argument(
        "--aggregator-key",
        type=Path,
        action="append",
        metavar="FILE",
        help="the aggregator's public signing key (`edge-agent keys signing`): act only on "
        "messages it signed; give it twice while the key is rotated (docs/operating.md)",
    )
    return run


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default, unless there is none to show (None, a store_true flag's
    False) or the help text already says it ("(default: ...")."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or action.default is False or "(default" in text:
            return text
        return super()._get_help_string(action)


def package_version() -> str:
    """The installed cat-edge version (``pyproject.toml``), or "unknown" from a bare checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cat-edge")
    except PackageNotFoundError:
        return "unknown"
