"""`make demo`: a heterogeneous fleet trains over ZeroMQ (or MQTT) on loopback.

Starts the aggregator with uvicorn and several `edge-agent run` processes, each on a
different shipped radio profile, training l2-logistic regression on generated RCV1-like
shards until the loss reaches a target (relative suboptimality, f* from an L-BFGS solve).
Shows a progress bar and the dashboard URL while it runs, ends with a summary table of what
every agent sent, received and both, against what dense float32 would have cost both ways
(dense updates up, one dense model change per agent per version down), and stops every
process it started (also on Ctrl-C). It prints, at the start and in the summary, every
setting of the aggregator and of the agents that differs from its default (the demo is
small and fast; README's headline figures come from other settings, see docs/results.md).
The progress bar redraws in place on a terminal only; in a log it is one line per 10 s.

    python deploy/demo.py [--agents 4] [--mqtt] [--target 0.05] [--keep] [--misconfigured]

``--keep`` (``make demo KEEP=1``) leaves the aggregator (dashboard, ``/status``) and the
broker running after the summary until Ctrl-C, and keeps the run directory (data, logs,
checkpoints) afterwards.

``--misconfigured`` (``make demo-misconfigured``) adds one agent, ``agent-bad``, once the
others have said hello, whose feedback family does not fit the job's (``AGG_FEEDBACK`` is
the fleet's ``--feedback``; agent-bad runs ``none`` in an EF21 job, ``ef21`` in a plain
one): the aggregator refuses its hello, tells it why and sends it the job's settings; the
demo shows the lagging list (``/status`` waiting_for) as it changes, then that agent's
WARNING and ERROR lines, its exit code (2: a configuration error) and the aggregator's
``/status`` refused_agents naming it, while the others train to the target. The last line
is a JSON object with those facts, for tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from aggregator.localnet import (
    HOST,
    MissingProgram,
    MosquittoBroker,
    ServiceProcess,
    StartupError,
    free_port_pair,
)
from aggregator.service.settings import Settings
from edge_agent.cli.commands import build_parser as agent_parser
from edge_agent.data import make_rcv1_like, split_shards, write_libsvm
from edge_agent.numerics.models import make_model
from edge_agent.numerics.optimum import solve_optimum

ROOT = Path(__file__).resolve().parents[1]
FLEET = [
    "lorawan_eu868_dr5_sf7",
    "ble5_2m_dle_notify",
    "nbiot_udp_psm_rai",
    "wifi_esp32_mqtt_tcp",
    "ieee802154_6lowpan_udp_threadlike",
    "lorawan_eu868_dr0_sf12",
    "ltem_udp_psm",
    "zigbee_aps_nwk_encrypted",
]


def get_json(url: str, timeout_s: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.loads(r.read())


def si(value: float, unit: str) -> str:
    """1234567 B -> '1.23 MB'."""
    for factor, prefix in (
        (1e12, "T"),
        (1e9, "G"),
        (1e6, "M"),
        (1e3, "k"),
        (1.0, ""),
        (1e-3, "m"),
        (1e-6, "µ"),
    ):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def bar(fraction: float, width: int = 30) -> str:
    fraction = min(max(fraction, 0.0), 1.0)
    full = int(fraction * width)
    return "[" + "#" * full + "-" * (width - full) + f"] {100 * fraction:5.1f}%"


def stop_all(procs: list[subprocess.Popen[bytes]], timeout_s: float = 10.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def dense_gd_rounds(model: Any, data: Any, target_loss: float, max_rounds: int) -> int | None:
    """Rounds plain gradient descent (step 1/L, every agent sending all d values, i.e. the
    full gradient) needs to reach ``target_loss``: the fair dense baseline."""
    step = 1.0 / model.smoothness(data, rng=np.random.default_rng(0))
    x = np.zeros(model.d)
    for k in range(1, max_rounds + 1):
        _, g = model.loss_grad(x, data)
        x -= step * g
        if model.loss(x, data) <= target_loss:
            return k
    return None


_COST_KEYS = ("bytes", "packets", "airtime_s", "energy_j")


def _uplink(c: dict[str, Any]) -> dict[str, Any]:
    """The API's uplink counters (``updates``) as a cost with ``messages``."""
    return {"messages": c.get("updates", 0), **{k: c[k] for k in _COST_KEYS}}


def _cost_cols(c: dict[str, Any] | None) -> str:
    if c is None:
        return f"{'?':>9} {'?':>9} {'?':>9}"
    return f"{si(c['bytes'], 'B'):>9} {si(c['airtime_s'], 's'):>9} {si(c['energy_j'], 'J'):>9}"


def _ratio(actual: dict[str, Any], dense: dict[str, Any] | None, key: str) -> str:
    """``"5.1x less"`` (or ``"1.2x more"``) than dense; ``"?"`` when unknown."""
    if dense is None or not actual.get(key) or not dense.get(key):
        return "?"
    r = dense[key] / actual[key]
    return f"{r:.1f}x less" if r >= 1 else f"{1 / r:.1f}x more"


def _scaled(c: dict[str, Any] | None, scale: float) -> dict[str, Any] | None:
    return None if c is None else {k: v * scale for k, v in c.items()}


def summary_table(
    agents: list[dict[str, Any]], status: dict[str, Any], dense_rounds: int | None
) -> str:
    """Per agent what it sent (uplink), received (downlink) and the total (bytes, airtime,
    energy), then the fleet both ways against dense float32 both ways."""
    group = f"{'bytes':>9} {'airtime':>9} {'energy':>9}"
    head = f"{'agent':<8} {'profile':<30} {'T last':>6} {'upd':>4} | sent: {group} | received: {group} | total: {group} | {'total vs dense':>16}"
    rows = [head, "-" * len(head)]
    # dense GD reaches the target in fewer rounds: price exactly that many dense rounds
    scale = dense_rounds / status["round"] if dense_rounds and status.get("round") else 1.0
    for a in sorted(agents, key=lambda a: a["agent"]):
        obj = a["objective"] or "bits"
        vs = _ratio(a["total"], _scaled(a.get("dense_equivalent_total"), scale), obj)
        rows.append(
            f"{a['agent']:<8} {a['profile'][:30]:<30} {a['last_t'] or 0:>6} {a['updates_accepted']:>4} | "
            f"      {_cost_cols(a['totals'])} |           {_cost_cols(a['downlink'])} |        {_cost_cols(a['total'])} | "
            f"{vs + ' ' + obj.split('_')[0]:>16}"
        )
    up, down, total = _uplink(status["totals"]), status["downlink"], status["total"]
    dense_up: dict[str, Any] | None = _uplink(status["dense_equivalent"])
    dense_down: dict[str, Any] | None = status.get("dense_equivalent_downlink")
    dense_total: dict[str, Any] | None = status.get("dense_equivalent_total")
    label = "(same rounds, all d values)"
    if scale != 1.0:
        dense_up, dense_down, dense_total = (
            _scaled(c, scale) for c in (dense_up, dense_down, dense_total)
        )
        label = f"(dense GD, {dense_rounds} rounds)"
    rows.append("-" * len(head))
    rows.append(
        f"{'fleet':<8} {'(CAT, adaptive)':<30} {'':>6} {up['messages']:>4} | "
        f"      {_cost_cols(up)} |           {_cost_cols(down)} |        {_cost_cols(total)} |"
    )
    rows.append(
        f"{'dense':<8} {label[:30]:<30} {'':>6} {'':>4} | "
        f"      {_cost_cols(dense_up)} |           {_cost_cols(dense_down)} |        {_cost_cols(dense_total)} |"
    )
    against = (
        "dense gradient descent to the same target"
        if dense_rounds is not None
        else "dense float32 for the same rounds"
    )
    for name, actual, dense in (
        ("uplink", up, dense_up),
        ("downlink", down, dense_down),
        ("total", total, dense_total),
    ):
        saving = ", ".join(
            f"{what} {_ratio(actual, dense, key)}"
            for what, key in (
                ("bytes", "bytes"),
                ("packets", "packets"),
                ("airtime", "airtime_s"),
                ("energy", "energy_j"),
            )
        )
        rows.append(f"{name:>8} against {against}: {saving}")
    if dense_down is None:
        rows.append(
            "(the dense downlink is unknown: the aggregator resumed this job past version 0)"
        )
    return "\n".join(rows)


def follow(
    base: str,
    service: ServiceProcess,
    procs: list[subprocess.Popen[bytes]],
    work: Path,
    args: argparse.Namespace,
    *,
    f0: float,
    f_star: float,
    tolerated: tuple[subprocess.Popen[bytes], ...] = (),
    seen_waiting: set[str] | None = None,
) -> dict[str, Any]:
    """Show a progress bar until the job finishes or ``args.timeout_s`` seconds pass; the
    last /status. SystemExit if the aggregator or an agent dies (one in ``tolerated`` may:
    the misconfigured one); ``seen_waiting`` collects every agent /status waited for."""
    start = time.monotonic()
    status: dict[str, Any] = {}
    span = np.log10(1.0 / args.target)
    live, printed = sys.stdout.isatty(), -LOG_EVERY_S
    while time.monotonic() - start < args.timeout_s:
        try:
            status = get_json(base + "/status")
        except (urllib.error.URLError, OSError, ValueError):
            if not service.alive():
                raise SystemExit(f"demo: the aggregator died:\n{service.log_tail()}") from None
            time.sleep(0.5)
            continue
        loss = status.get("loss")
        rel = (loss - f_star) / (f0 - f_star) if loss is not None else 1.0
        frac = np.log10(1.0 / max(rel, 1e-300)) / span if rel > 0 else 1.0
        tot = status["totals"]
        line = (
            f"{bar(frac)} round {status['round']:>5}  loss {loss if loss is not None else float('nan'):.5f}  "
            f"rel {rel:.3g}  sent {si(tot['bytes'], 'B')}, {si(tot['airtime_s'], 's')} airtime, {si(tot['energy_j'], 'J')}  "
            f"eta {eta_text(status.get('eta'))}   "
        )
        if live:  # redrawn in place
            sys.stdout.write("\r" + line)
        elif time.monotonic() - printed >= LOG_EVERY_S or status["state"] == "finished":
            printed = time.monotonic()  # a log, a pipe: one plain line now and then
            sys.stdout.write(line.rstrip() + "\n")
        sys.stdout.flush()
        _note_waiting(status, seen_waiting)
        if status["state"] == "finished":
            break
        dead = [p for p in procs if p.poll() not in (None, 0) and p not in tolerated]
        if dead:
            raise SystemExit(f"\ndemo: an agent failed; see {work}/agent-*.log")
        time.sleep(0.5)
    return status


def eta_text(eta: dict[str, Any] | None) -> str:
    """/status's ETA in a few characters: "-" unknown, "~12 s" a midpoint while the loss
    decreases still grow, ">=12 s" a lower bound, "12 s" a measured rate."""
    if eta is None:
        return "-"
    mark = "~" if eta.get("early") and not eta.get("lower_bound") else ""
    mark = ">=" if eta.get("lower_bound") else mark
    return mark + si(float(eta["eta_s"]), "s")


def _note_waiting(status: dict[str, Any], seen: set[str] | None) -> None:
    """Add the agents /status says the open round waits for to ``seen``; print the list
    on its own line whenever it names someone new."""
    if seen is None:
        return
    names = {w["agent"] for w in status.get("waiting_for") or []}
    if names - seen:
        print(f"\n  round {status['round']} waits for: {', '.join(sorted(names))}")
    seen |= names


BAD_AGENT = "agent-bad"
#: off a terminal, the progress line is printed once per this many seconds
LOG_EVERY_S = 10.0
#: agent flags that differ per agent by design (not settings of the demo)
PER_AGENT = frozenset({"agent_id", "profile", "data", "seed", "server"})
#: settings every run sets for itself (the problem, ports, directories): listed by name only
PER_RUN = frozenset(
    {
        "AGG_D",
        "AGG_TRANSPORTS",
        "AGG_DATA_DIR",
        "AGG_EVAL_DATA",
        "AGG_TARGET_LOSS",
    }
)
#: where README's headline ratio comes from (docs/results.md, "Both directions")
HEADLINE = (
    "README's 34x (total bytes vs dense) is `aggregator simulate` with 10 agents (LoRaWAN "
    "SF7/SF12, BLE 5, NB-IoT), 10,000 rows, d=47,236, method cat-signtopk+ef21 (agents "
    "--compressor signtopk), AGG_DOWNLINK=cat, target 1e-2 (docs/results.md); this demo runs "
    "--compressor topk (the default) with the settings above"
)


def _is_default(value: str, default: Any) -> bool:
    """Whether the environment value ``value`` means the settings default ``default``."""
    if default is None:
        return False
    if isinstance(default, bool):
        return value.strip().lower() in (
            ("true", "1", "yes", "on") if default else ("false", "0", "no", "off")
        )
    if isinstance(default, int | float):
        try:
            return float(value) == float(default)
        except ValueError:
            return False
    if isinstance(default, list | tuple):
        return value == ",".join(str(v) for v in default)
    return value == str(default)


def aggregator_differences(settings: dict[str, str]) -> list[str]:
    """``AGG_X=value (default d)`` for every demo setting that is not the service's default."""
    out = []
    for key, value in settings.items():
        if key in PER_RUN:
            continue
        field = Settings.model_fields.get(key.removeprefix("AGG_").lower())
        default = None if field is None else field.get_default(call_default_factory=True)
        if not _is_default(value, default):
            out.append(f"{key}={value} (default {'none' if default is None else default})")
    return out


def agent_differences(flags: list[str]) -> list[str]:
    """``--flag value (default d)`` for every ``edge-agent run`` flag of the demo's agents
    that differs from its default (per-agent ones, such as --agent-id, left out)."""
    parser = agent_parser()
    ns = vars(parser.parse_args(["run", *flags]))
    required = ["--profile", str(ns["profile"]), "--data", str(ns["data"])]
    defaults = vars(parser.parse_args(["run", *required]))
    out = []
    for key, value in ns.items():
        if key in PER_AGENT or value == defaults.get(key):
            continue
        flag, default = "--" + key.replace("_", "-"), defaults.get(key)
        shown = "none" if default is None else default
        out.append(flag if value is True else f"{flag} {value} (default {shown})")
    return out


def print_differences(settings: dict[str, str], flags: list[str]) -> None:
    """Every aggregator setting and agent flag of the demo that is not the default."""
    print("settings that differ from the defaults:")
    print("  aggregator: " + ", ".join(aggregator_differences(settings)))
    print(f"              (and, for this run: {', '.join(sorted(PER_RUN & set(settings)))})")
    print("  agents:     " + ", ".join(agent_differences(flags)))


def wait_for_agents(base: str, n: int, timeout_s: float) -> None:
    """Until /status counts ``n`` agents that said hello; SystemExit after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if get_json(base + "/status")["agents"] >= n:
                return
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"demo: the {n} agents did not say hello within {timeout_s:g} s")


def bad_feedback(feedback: str) -> str:
    """A feedback mode of the other family: EF21 agents and plain ones never share a job."""
    return "none" if feedback == "ef21" else "ef21"


def report_misconfigured(
    proc: subprocess.Popen[bytes], log: Path, seen_waiting: set[str], timeout_s: float
) -> dict[str, Any]:
    """What happened to the misconfigured agent: its exit code (waited for up to
    ``timeout_s``; None: still running), its WARNING lines, and whether /status listed it
    as waited for. Printed, and returned for the demo's last line."""
    try:
        code: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    warnings = [line for line in text.splitlines() if " WARNING " in line or " ERROR " in line]
    errors = [line for line in text.splitlines() if line.startswith("edge-agent run: error")]
    print(f"\n{BAD_AGENT} (misconfigured): exit code {code}")
    for line in warnings + errors:
        print(f"  {line}")
    named = "yes" if BAD_AGENT in seen_waiting else "no (a refused hello never makes it live)"
    print(
        f"  /status waiting_for named it: {named}; "
        f"the rounds waited for: {', '.join(sorted(seen_waiting)) or 'nobody (not polled mid-round)'}"
    )
    return {
        "agent": BAD_AGENT,
        "exit_code": code,
        "warnings": warnings,
        "errors": errors,
        "waiting_for_named_it": BAD_AGENT in seen_waiting,
        "waiting_for_seen": sorted(seen_waiting),
    }


def refused_agents(status: dict[str, Any]) -> list[dict[str, Any]]:
    """Print and return /status refused_agents (agents whose hello or updates the aggregator
    refused: a refused hello registers nothing, so /agents never lists them)."""
    refused: list[dict[str, Any]] = status.get("refused_agents") or []
    print("  /status refused_agents:")
    for r in refused:
        print(f"    {r['agent']}: {r['reason']} x{r['count']}")
    if not refused:
        print("    (none)")
    return refused


def start_broker(work: Path) -> MosquittoBroker:
    """A private Mosquitto for --mqtt; SystemExit naming the fix when it is not installed."""
    try:
        broker = MosquittoBroker(work / "mosquitto", persistence=False)
    except MissingProgram as exc:
        raise SystemExit(
            f"demo: MQTT=1 needs Mosquitto ({exc}); run `make demo` for ZeroMQ"
        ) from None
    broker.start()
    return broker


def start_agent(
    work: Path,
    server: str,
    args: argparse.Namespace,
    agent_id: str,
    profile: str,
    index: int,
    extra: list[str],
) -> subprocess.Popen[bytes]:
    """One ``edge-agent run`` on shard ``index`` (the shards of the fleet; the misconfigured
    agent reuses shard 0), logging to ``<work>/<agent_id>.log``; ``extra`` flags win."""
    cmd = [sys.executable, "-m", "edge_agent.cli", "run",
           *agent_flags(work, server, args, agent_id, profile, index), *extra]  # fmt: skip
    with (work / f"{agent_id}.log").open("wb") as log:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, cwd=ROOT)


def agent_flags(
    work: Path, server: str, args: argparse.Namespace, agent_id: str, profile: str, index: int
) -> list[str]:
    """The ``edge-agent run`` flags of one demo agent (shard ``index``; the misconfigured
    agent reuses shard 0)."""
    shard = work / f"shard-{index}.svm"
    if not shard.is_file():
        shard = work / "shard-0.svm"
    return [
        *("--server", server, "--job", "demo"),
        *("--agent-id", agent_id, "--profile", profile, "--data", str(shard)),
        *("--features", str(args.features), "--l2", str(args.l2)),
        *("--duty-cycle", "ignore", "--seed", str(index), "--quiet", "--resend-s", "5"),
        # the agents' own default is ef21 (the job's AGG_FEEDBACK below)
        *(("--feedback", args.feedback) if args.feedback != "ef21" else ()),
    ]


def stay_up(base: str) -> None:
    """``--keep``: leave the aggregator and the broker serving until Ctrl-C."""
    print(f"\n--keep: the aggregator stays up at {base}/ (dashboard, /status); Ctrl-C stops it")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--agents",
        type=int,
        default=4,
        help="number of agent processes (each on a different radio profile)",
    )
    ap.add_argument(
        "--rows",
        type=int,
        default=4000,
        help="rows of the generated RCV1-like set (split over the agents)",
    )
    ap.add_argument("--features", type=int, default=20000, help="features (model dimension d)")
    ap.add_argument("--l2", type=float, default=1e-3)
    ap.add_argument(
        "--target",
        type=float,
        default=1e-3,
        help="target relative suboptimality (f - f*)/(f(0) - f*)",
    )
    ap.add_argument("--max-rounds", type=int, default=5000)
    ap.add_argument(
        "--downlink",
        default="auto",
        choices=["auto", "exact", "delta", "cat"],
        help="how the aggregator broadcasts the model (AGG_DOWNLINK): auto (the service's "
        "default) chooses per version between the exact relay and cat, a compressed change "
        "with error feedback",
    )
    ap.add_argument(
        "--feedback",
        default="ef21",
        choices=["none", "ef", "ef21"],
        help="error feedback on the agents",
    )
    ap.add_argument(
        "--mqtt", action="store_true", help="go through a Mosquitto broker instead of ZeroMQ"
    )
    ap.add_argument(
        "--port", type=int, default=0, help="HTTP port of the aggregator (0: a free one)"
    )
    ap.add_argument("--timeout-s", type=float, default=300.0, help="give up after this long")
    ap.add_argument(
        "--keep",
        action="store_true",
        help="after the summary, keep the aggregator and broker running until Ctrl-C, and "
        "keep the run directory (data, logs, checkpoints)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--misconfigured",
        action="store_true",
        help=f"add {BAD_AGENT}, whose feedback does not fit the job: see its refusal and exit",
    )
    ap.add_argument(
        "--bad-max-refusals",
        type=int,
        default=3,
        help=f"{BAD_AGENT}'s --max-refusals (the agent's default; it gives up at once when it "
        "reads the job's settings, which come right after the first refusal)",
    )
    args = ap.parse_args()
    if not 1 <= args.agents <= len(FLEET):
        raise SystemExit(f"demo: --agents must be in 1..{len(FLEET)}")

    work = Path(tempfile.mkdtemp(prefix="cat-edge-demo-"))
    procs: list[subprocess.Popen[bytes]] = []  # the agents
    broker: MosquittoBroker | None = None
    service: ServiceProcess | None = None
    try:
        print(
            f"cat-edge demo: {args.agents} agents, d={args.features}, {args.rows} rows, run directory {work}"
        )
        rng = np.random.default_rng(args.seed)
        full = make_rcv1_like(
            args.rows, args.features, rng=rng, nnz_per_row=min(74.0, args.features / 10)
        )
        write_libsvm(full, work / "full.svm")
        for i, shard in enumerate(split_shards(full, args.agents, rng=rng)):
            write_libsvm(shard, work / f"shard-{i}.svm")
        model = make_model("logreg", n_features=args.features, l2=args.l2)
        _, f_star = solve_optimum(model, full)
        f0 = model.loss(np.zeros(model.d), full)
        target_loss = f_star + args.target * (f0 - f_star)
        print(
            f"f(0) = {f0:.6f}, f* = {f_star:.6f} (L-BFGS); target loss {target_loss:.6f} (relative suboptimality {args.target:g})"
        )

        if args.mqtt:
            broker = start_broker(work)
            server = broker.url
        else:
            server = f"zmq+tcp://{HOST}:{free_port_pair()}"
        settings = {
            "AGG_JOB": "demo",
            "AGG_D": str(args.features),
            "AGG_L2": str(args.l2),
            "AGG_TRANSPORTS": server,
            "AGG_DATA_DIR": str(work / "aggregator"),
            "AGG_EVAL_DATA": str(work / "full.svm"),
            "AGG_MIN_AGENTS": str(args.agents),
            "AGG_FEEDBACK": args.feedback,  # announced on cat/demo/job; others are refused
            # the radios are modelled and the traffic is loopback: downlink caps (a LoRaWAN
            # network's 10 a day) are accounted, not waited for, like the duty cycles
            "AGG_DOWNLINK_PACING": "false",
            "AGG_DOWNLINK": args.downlink,
            "AGG_QUORUM_FRACTION": "1.0",
            "AGG_ROUND_DEADLINE_S": "10",
            "AGG_TARGET_LOSS": repr(target_loss),
            "AGG_MAX_ROUNDS": str(args.max_rounds),
            "AGG_CHECKPOINT_EVERY": "20",
        }
        flags = agent_flags(work, server, args, "agent-0", FLEET[0], 0)
        print_differences(settings, flags)
        service = ServiceProcess(work, settings, port=args.port or None)
        service.start(timeout_s=30)
        base = service.base_url
        print(f"aggregator up: {server} | dashboard {base}/  | status {base}/status")
        for i in range(args.agents):
            procs.append(start_agent(work, server, args, f"agent-{i}", FLEET[i], i, []))
            print(f"  agent-{i}: {FLEET[i]}")
        bad: subprocess.Popen[bytes] | None = None
        if args.misconfigured:
            # the fleet's hellos come first, as on a real site where one misconfigured
            # device joins a running job
            wait_for_agents(base, args.agents, timeout_s=60.0)
            wrong = bad_feedback(args.feedback)
            extra = ["--feedback", wrong, "--max-refusals", str(args.bad_max_refusals)]
            profile = FLEET[args.agents % len(FLEET)]
            bad = start_agent(work, server, args, BAD_AGENT, profile, args.agents, extra)
            procs.append(bad)
            print(f"  {BAD_AGENT}: {profile}, --feedback {wrong} in a {args.feedback} job")
        print(
            "(duty cycles are accounted, not waited for: the radios are modelled, the traffic is loopback)"
        )

        start = time.monotonic()
        seen: set[str] = set()
        status = follow(
            base,
            service,
            procs,
            work,
            args,
            f0=f0,
            f_star=f_star,
            tolerated=() if bad is None else (bad,),
            seen_waiting=seen,
        )
        print()
        agents = get_json(base + "/agents")
        reached = status.get("state") == "finished" and "target" in status.get("finish_reason", "")
        elapsed = time.monotonic() - start
        print(
            f"\n{'reached' if reached else 'did NOT reach'} the target in {status.get('round')} rounds, {elapsed:.1f} s: {status.get('finish_reason') or 'timeout'}"
        )
        print(f"final loss {status.get('loss')}, accuracy {status.get('accuracy')}")
        print(
            f"loss floor {status.get('loss_floor')} ({status.get('loss_floor_source')} by the "
            f"service on AGG_EVAL_DATA; the demo's f* {f_star!r})\n"
        )
        dense_rounds = dense_gd_rounds(model, full, target_loss, args.max_rounds)
        print(summary_table(agents, status, dense_rounds))
        print_differences(settings, flags)
        print(HEADLINE)
        if bad is not None:
            facts = report_misconfigured(bad, work / f"{BAD_AGENT}.log", seen, timeout_s=5.0)
            rejected = status.get("updates_rejected") or {}
            print(f"  the aggregator counted refusals: {rejected}")
            facts["refused_agents"] = refused_agents(get_json(base + "/status"))
            print(
                json.dumps(
                    {
                        "reached": reached,
                        "round": status.get("round"),
                        "updates_rejected": rejected,
                        "loss_floor": status.get("loss_floor"),
                        "loss_floor_source": status.get("loss_floor_source"),
                        "f_star": f_star,
                        "bad": facts,
                    }
                )
            )
            named = any(r["agent"] == BAD_AGENT for r in facts["refused_agents"])
            result = 0 if reached and facts["exit_code"] == 2 and named else 1
        else:
            result = 0 if reached else 1
        if args.keep:
            stay_up(base)
        return result
    except StartupError as exc:
        raise SystemExit(f"demo: {exc}") from None
    except KeyboardInterrupt:
        print("\ndemo: interrupted; stopping everything")
        return 130
    finally:
        stop_all(list(reversed(procs)))
        if service is not None:
            service.close()
        if broker is not None:
            broker.close()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
