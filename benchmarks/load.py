"""Fleet load: hundreds of light MQTT agents through a real Mosquitto and the real service.

    python benchmarks/load.py [--quick] [--agents N] [--baseline-agents M] [--rounds R]
                              [--procs P] [--late-fraction F]
    python benchmarks/load.py --sites [--quick] [--agents N] [--baseline-agents M] [--rounds R]
                              [--deadline S]

Each agent is a light paho client (not an :class:`edge_agent.agent.loop.Agent` with a model
and data): it says hello (top-k, d = 2,000), subscribes to the job's model, delta and
control topics and its own ``to/<agent>`` topic, and for every model version it receives
(snapshot, steps or delta, read with :func:`edge_agent.protocol.downlink.decode_downlink`) below
``--rounds`` publishes one small valid update (QoS 1) encoded with
:func:`edge_agent.protocol.wire.encode` from a fixed sparse vector (T = 20 entries). The clients
run ``--procs`` to a process, one paho network thread each.

The aggregator is the real :class:`~aggregator.service.ingest.AggregatorService` in this process
(its MQTT transport, SQLite journal, checkpoints in a temporary directory), sync mode,
``min_agents`` = the fleet, a round closing when every live agent reported or, after
``AGG_ROUND_DEADLINE_S`` (``--deadline``), with the quorum. Mosquitto is a private one
(:class:`aggregator.localnet.MosquittoBroker`, generated config) on a free port.

Scenarios, each run with ``--agents`` and with ``--baseline-agents`` (the baseline,
measured in the same run; the report gives the ratios):

* ``on_time``: every agent answers at once;
* ``late``: ``--late-fraction`` of the agents answer ``deadline + 0.5 s`` late, past the
  deadline: their rounds close with the quorum and their updates are refused as
  ``stale`` (counted), every round.

``--sites`` instead runs the shipped broker configurations: ``deploy/mosquitto/mosquitto.conf``
(the centre, with the aggregator on its loopback listener) and ``deploy/mosquitto/site.conf``
(a site broker whose bridge reaches the central TLS listener; a throw-away CA from
``deploy/tls/make-test-ca.sh``), passwords for every agent and the shipped ACL on both. The
fleet, ``--agents`` (default 1000, 20 rounds), is split in half: one half on the central
broker, the other behind the bridge; the baseline, ``--baseline-agents`` (default 200), is on
the central broker alone, in the same run. Reported besides the checks and latencies: each
broker's RSS, the CPU seconds (``cpu_s``, from ``/proc/<pid>/stat``) and CPU share (CPU
seconds / ``rounds_s``, the wall seconds while the rounds run) of the aggregator (this
process), of each broker and of the client processes (summed), and ``updates_per_s``
(updates sent / ``rounds_s``). The deadline (``--deadline``, 0.5 s) is short for 1,000
agents on a small machine: rounds then close with the quorum and the rest is ``stale``;
``--deadline 30`` waits for the whole fleet. Needs mosquitto, mosquitto_passwd, openssl.

``--status-flood N`` instead measures the disk (docs/operating.md, Bounded disk): one agent
says hello, the job is paused (no version commits, so no checkpoint would ever trim the
journal), and one client sends N status messages, first N repeating ``online`` (changes
nothing: not journalled), then N alternating ``offline`` / ``online`` (each a change, each
journalled: the journal is compacted by checkpoints). Reported: the data directory's files
(``history.sqlite`` with its ``-wal``, the checkpoints) and the journal rows, before and
after each.

Checks (``ok``): per agent, updates the client sent == the engine's accepted + rejected
for it (each applied once or refused with a counted reason; the counts by reason are
reported), give or take what QoS 1 delivered twice (refused as ``duplicate``: counted,
never applied; over the fleet, accepted + the other refusals == sent), the participants summed over the history == accepted (each accepted update in
exactly one committed version), and ``rounds`` versions committed. Round latency: p50 /
p99 of ``closed_at - opened_at`` from the history. RSS: ``VmRSS`` (and ``VmHWM``, the
peak) of this process (the aggregator; the clients are in other processes) and of the
broker, from ``/proc/<pid>/status``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, environment, parser

from aggregator.localnet import HOST, MosquittoBroker, find_program

BENCH = "load"
JOB = "load"
D = 2_000
T = 20
WAIT_S = 300.0  # no scenario may take longer
LATE_EXTRA_S = 0.5  # a late agent answers this long after the deadline


# --------------------------------------------------------------------------- clients


@dataclass(frozen=True)
class Seat:
    """Where one light agent connects: its broker's port, its password (None: anonymous),
    and how late it answers (None: at once)."""

    agent: str
    port: int
    password: str | None = None
    late_s: float | None = None


class LightClient:
    """One light agent: a paho client that answers each new version with one update."""

    def __init__(
        self, port: int, agent: str, rounds: int, late_s: float | None, password: str | None
    ) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        from edge_agent.numerics.compressors import compress
        from edge_agent.protocol import messages, topics

        self.agent, self.rounds, self.late_s = agent, rounds, late_s
        self.sent = 0
        self.answered = -1  # the last version answered
        self.subscribed = threading.Event()
        self._lock = threading.Lock()
        self._timers: list[threading.Timer] = []
        self._pending: list[Any] = []  # paho MQTTMessageInfo of each update
        seed = int.from_bytes(agent.encode()[-4:], "little")
        rng = np.random.default_rng(seed)
        vec = np.zeros(D)
        vec[rng.choice(D, T, replace=False)] = 0.01 * rng.standard_normal(T)
        self.update = compress(vec, "topk", T)  # fixed: the same sparse vector every round
        self.topic = topics.update(JOB, agent)
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=f"load-{agent}", clean_session=True
        )
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *a: self.subscribed.set()
        if password is not None:  # the shipped configs: user name = agent id
            self.client.username_pw_set(agent, password)
        self.client.connect(HOST, port, keepalive=60)
        self.client.loop_start()
        hello = messages.Hello(
            job=JOB, agent=agent, d=D, rows=100, smoothness=1.0, model="logreg",
            compressor="topk",
        )  # fmt: skip
        # the hello first: the retained snapshot (and our first update) come after it
        self.client.publish(topics.hello(JOB, agent), messages.dump(hello), qos=1)
        subs = [topics.model(JOB), topics.delta(JOB), topics.control(JOB)]
        subs.append(f"{topics.job_prefix(JOB)}to/{agent}")
        self.client.subscribe([(s, 1) for s in subs])

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        from edge_agent.errors import WireFormatError
        from edge_agent.protocol.downlink import decode_downlink

        if msg.topic.endswith("/control"):
            return
        try:
            version = int(decode_downlink(msg.payload).version)
        except WireFormatError:
            return  # a JSON answer on our own topic (a refusal, a control): nothing to do
        with self._lock:
            if version <= self.answered or version >= self.rounds:
                return
            self.answered = version
        if self.late_s is None:
            self._send(version)
        else:
            timer = threading.Timer(self.late_s, self._send, args=(version,))
            timer.daemon = True
            self._timers.append(timer)
            timer.start()

    def _send(self, version: int) -> None:
        from edge_agent.protocol.wire import encode

        with self._lock:
            seq = self.sent
            self.sent += 1
        blob = encode(self.update, job=JOB, agent=self.agent, round=version, seq=seq)
        info = self.client.publish(self.topic, blob, qos=1)
        with self._lock:
            self._pending.append(info)

    def drain(self) -> None:
        """Wait for the late answers still pending, then for every update's PUBACK."""
        for timer in self._timers:
            timer.join(10)
        for info in self._pending:
            info.wait_for_publish(10)


def stop_fleet(clients: list[LightClient]) -> None:
    """Stop a process's clients in phases: drain all, disconnect all, then join the network
    threads. ``loop_stop`` alone only raises a flag the thread sees when its ``select``
    returns, up to paho's 1 s loop timeout later: one client after the other that is up to
    a second each (250 clients a process, 4 minutes, past the parent's 60 s wait). A
    ``disconnect`` wakes the thread and ends its loop, so all of them end together."""
    for c in clients:
        c.drain()
    for c in clients:
        c.client.disconnect()
    for c in clients:
        c.client.loop_stop()


def _fleet(seats: list[Seat], rounds: int, ctl: Any) -> None:
    """Child process: run these clients until told to stop; report what each sent."""
    clients = [LightClient(s.port, s.agent, rounds, s.late_s, s.password) for s in seats]
    ok = all(c.subscribed.wait(30) for c in clients)
    ctl.send("ready" if ok else "no SUBACK within 30 s")
    ctl.poll(WAIT_S)
    ctl.recv()  # "stop"
    stop_fleet(clients)
    ctl.send({c.agent: c.sent for c in clients})


# --------------------------------------------------------------------------- measures


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of ``pid`` in KiB, from /proc/<pid>/status."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` has used, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def scenario(
    seats: list[Seat],
    url: str,
    *,
    rounds: int,
    procs: int,
    deadline_s: float,
    pids: Mapping[str, int],
    **more: Any,
) -> dict[str, Any]:
    """One fleet (``seats``) against a fresh service on ``url``; ``more`` are further
    service settings (credentials); ``pids`` the brokers whose RSS and CPU are reported."""
    from aggregator.service.ingest import AggregatorService
    from aggregator.service.settings import load_settings

    n = len(seats)
    data_dir = Path(tempfile.mkdtemp(prefix="cat-edge-load-"))
    settings = load_settings(
        job=JOB, d=D, mode="sync", step_size=0.01, min_agents=n, round_deadline_s=deadline_s,
        feedback="none",  # the light clients send plain top-k (no EF21 state)
        liveness_timeout_s=600.0, transports=[url], data_dir=data_dir,
        client_id=f"aggregator-{JOB}-{data_dir.name}", max_agents=max(n, 1000), **more,
    )  # fmt: skip
    service = AggregatorService(settings)
    late = sum(s.late_s is not None for s in seats)
    ctx = mp.get_context("spawn")
    children: list[tuple[Any, Any]] = []
    try:
        service.start()
        started = time.monotonic()
        for p in range(procs):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_fleet, args=(seats[p::procs], rounds, theirs), daemon=True)
            proc.start()
            children.append((proc, ours))
        for _, pipe in children:
            if not pipe.poll(120) or (msg := pipe.recv()) != "ready":
                raise RuntimeError(f"a client process did not start: {locals().get('msg')}")
        ready = time.monotonic()
        watched = {"aggregator": os.getpid(), **pids}
        cpu0 = {name: cpu_s(pid) for name, pid in watched.items()}
        clients0 = sum(cpu_s(proc.pid) for proc, _ in children)
        peak = _wait_rounds(service, rounds, started)
        clients_cpu_s = sum(cpu_s(proc.pid) for proc, _ in children) - clients0
        elapsed = time.monotonic() - started
        busy = time.monotonic() - ready
        used = {name: cpu_s(pid) - cpu0[name] for name, pid in watched.items()}
        used["clients"] = clients_cpu_s  # the light agents' processes, summed
        sent: dict[str, int] = {}
        for _, pipe in children:
            pipe.send("stop")
        for _, pipe in children:
            if not pipe.poll(60):
                raise RuntimeError("a client process did not report what it sent")
            sent.update(pipe.recv())
        late_s = max((s.late_s or 0.0) for s in seats)
        time.sleep(0.5 + late_s)  # the last answers reach the service
        result = _account(service, sent, rounds)
        result.update(agents=n, late_agents=late, seconds=elapsed, aggregator_peak_kib=peak,
                      rounds_s=busy, cpu_s=used,
                      cpu_share={name: t / busy for name, t in used.items()},
                      updates_per_s=result["updates_sent"] / busy,
                      brokers_kib={name: rss_kib(pid) for name, pid in pids.items()})  # fmt: skip
        return result
    finally:
        for proc, _ in children:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        service.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def _seats(n: int, port: int, late: int, late_s: float) -> list[Seat]:
    """``n`` anonymous agents on ``port``, ``late`` of them answering ``late_s`` late."""
    return [
        Seat(f"a{i:04d}", port, late_s=late_s if _is_late(i, n, late) else None) for i in range(n)
    ]


def _is_late(i: int, n: int, late: int) -> bool:
    """Spread the late agents over the fleet (and so over the client processes)."""
    return late > 0 and i % max(1, n // late) == 0 and i // max(1, n // late) < late


def _wait_rounds(service: Any, rounds: int, started: float) -> int:
    """Until ``rounds`` versions are committed; the aggregator's peak RSS seen (KiB)."""
    peak = 0
    while service.read(lambda e: e.version) < rounds:
        if time.monotonic() - started > WAIT_S:
            got = service.read(lambda e: e.version)
            raise RuntimeError(f"only {got} of {rounds} rounds within {WAIT_S:g} s")
        if not service.healthy:
            raise RuntimeError(f"the service stopped: {service.fatal_error}")
        peak = max(peak, rss_kib(os.getpid())["VmRSS"])
        time.sleep(0.05)
    return peak


def _account(service: Any, sent: dict[str, int], rounds: int) -> dict[str, Any]:
    """Every update sent is accepted or refused with a counted reason, and each accepted
    one is in exactly one committed version."""

    def grab(e: Any) -> dict[str, Any]:
        return {
            "version": e.version,
            "accepted": e.accepted,
            "rejected": {k: v for k, v in e.rejected.items() if v},
            "per_agent": {a: (i.accepted, i.rejected) for a, i in e.agents.items()},
        }

    got = service.read(grab)
    history = service.history(0, rounds + 10)
    in_versions = sum(len(r.participants) for r in history)
    latencies = [r.closed_at - r.opened_at for r in history]
    # QoS 1 is at least once: a message the broker or a bridge delivers twice is refused
    # as a duplicate (counted, never applied), so per agent accepted <= sent <= accepted +
    # rejected, and over the fleet accepted + the refusals other than duplicate == sent
    mismatched = sorted(a for a, s in sent.items() if not _accounted(got["per_agent"].get(a), s))
    total = sum(sent.values())
    refused = sum(v for k, v in got["rejected"].items() if k != "duplicate")
    ok = (
        got["version"] == rounds
        and not mismatched
        and got["accepted"] + refused == total
        and in_versions == got["accepted"]
    )
    reasons: dict[str, int] = {}
    for r in history:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    return {
        "ok": ok,
        "versions": got["version"],
        "updates_sent": total,
        "accepted": got["accepted"],
        "rejected": got["rejected"],
        "accepted_in_versions": in_versions,
        "agents_mismatched": mismatched[:10],
        "round_close_reasons": reasons,
        "round_latency_p50_s": percentile(latencies, 50),
        "round_latency_p99_s": percentile(latencies, 99),
        "aggregator_kib": rss_kib(os.getpid()),
    }


def _accounted(counts: tuple[int, int] | None, sent: int) -> bool:
    accepted, rejected = counts or (0, 0)
    return accepted <= sent <= accepted + rejected


# --------------------------------------------------------------------------- disk


def dir_bytes(path: Path) -> dict[str, int]:
    return {f.name: f.stat().st_size for f in sorted(path.iterdir()) if f.is_file()}


def status_flood(port: int, n: int) -> list[dict[str, Any]]:
    """N repeated then N alternating status messages from one agent of a paused job."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    from aggregator.service.ingest import AggregatorService
    from aggregator.service.settings import load_settings
    from edge_agent.protocol import messages, topics

    data_dir = Path(tempfile.mkdtemp(prefix="cat-edge-flood-"))
    settings = load_settings(
        job=JOB, d=D, step_size=0.01, liveness_timeout_s=600.0,
        transports=[f"mqtt://{HOST}:{port}"], data_dir=data_dir,
        client_id=f"aggregator-{JOB}-{data_dir.name}",
    )  # fmt: skip
    service = AggregatorService(settings)
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="load-flood", clean_session=True)
    client.max_queued_messages_set(4096)
    out: list[dict[str, Any]] = []

    def hello(agent: str) -> bytes:
        msg = messages.Hello(
            job=JOB, agent=agent, d=D, rows=100, smoothness=1.0, model="logreg",
            compressor="topk",
        )  # fmt: skip
        return messages.dump(msg)

    def sync(marker: str) -> None:
        """Wait until the service has taken everything sent before ``marker``'s hello
        (one connection, QoS 1: the broker keeps the order)."""
        client.publish(topics.hello(JOB, marker), hello(marker), qos=1).wait_for_publish(60)
        deadline = time.monotonic() + WAIT_S
        while marker not in service.read(lambda e: set(e.agents)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the service did not take the flood within {WAIT_S:g} s")
            time.sleep(0.05)

    def measure() -> dict[str, Any]:
        store = service._store
        assert store is not None
        rows, payload = store.journal_size()
        files = dir_bytes(data_dir)
        return {"files": files, "total_bytes": sum(files.values()), "journal_rows": rows,
                "journal_payload_bytes": payload}  # fmt: skip

    try:
        service.start()
        client.connect(HOST, port)
        client.loop_start()
        client.publish(topics.hello(JOB, "a"), hello("a"), qos=1)
        sync("m0")
        service.control("pause")
        status = {s: messages.dump(messages.Status(state=s)) for s in ("online", "offline")}
        for case in ("repeated_online", "alternating"):
            before = measure()
            started = time.monotonic()
            info = None
            for i in range(n):
                state = "offline" if case == "alternating" and i % 2 == 0 else "online"
                info = client.publish(topics.status(JOB, "a"), status[state], qos=1)
                if i % 2000 == 1999:
                    info.wait_for_publish(60)  # a window: the client queue stays bounded
            sync(f"m-{case}")
            out.append({"status_flood": case, "messages": n, "before": before,
                        "after": measure(), "seconds": time.monotonic() - started})  # fmt: skip
    finally:
        client.loop_stop()
        client.disconnect()
        service.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- sites

REPO = Path(__file__).resolve().parents[1]
MOSQUITTO_DIR = REPO / "deploy" / "mosquitto"
TLS_PORT, LOOPBACK_PORT = 8883, 1883
SITE = "site-a"


@dataclass(frozen=True)
class Pair:
    """The central broker and one site broker bridged to it (the shipped configs)."""

    central: MosquittoBroker
    site: MosquittoBroker
    passwords: dict[str, str]  # user -> password, on whichever broker holds the user
    aggregator_password_file: Path


def _password_file(path: Path, users: Mapping[str, str]) -> None:
    """A Mosquitto password file: plain ``user:password`` lines hashed by mosquitto_passwd."""
    path.write_text("".join(f"{u}:{pw}\n" for u, pw in users.items()), encoding="utf-8")
    subprocess.run([find_program("mosquitto_passwd"), "-U", str(path)], check=True, timeout=120)


@contextmanager
def bridged_pair(
    workdir: Path, central_agents: list[str], site_agents: list[str]
) -> Iterator[Pair]:
    """deploy/mosquitto/mosquitto.conf and site.conf on 127.0.0.1, the site's bridge on the
    central TLS listener (a test CA from deploy/tls/make-test-ca.sh), the shipped ACL on
    both, one random password per user; agents connect to the loopback listeners."""
    tls = workdir / "tls"
    subprocess.run(["bash", str(REPO / "deploy" / "tls" / "make-test-ca.sh"), str(tls)],
                   check=True, timeout=60, capture_output=True)  # fmt: skip
    pw = {u: secrets.token_urlsafe(16) for u in
          ("aggregator", f"bridge-{SITE}", *central_agents, *site_agents)}  # fmt: skip
    central_users = {u: pw[u] for u in ("aggregator", f"bridge-{SITE}", *central_agents)}
    _password_file(workdir / "central.passwd", central_users)
    _password_file(workdir / "site.passwd", {u: pw[u] for u in site_agents})
    agg_pw = workdir / "aggregator.password"
    agg_pw.write_text(pw["aggregator"] + "\n", encoding="utf-8")
    files = {"acl_file": MOSQUITTO_DIR / "acl", "cafile": tls / "ca.crt",
             "certfile": tls / "server.crt", "keyfile": tls / "server.key"}  # fmt: skip
    for name in ("central", "site"):
        (workdir / name / "persistence").mkdir(parents=True)
    central = MosquittoBroker(
        workdir / "central", config_file=MOSQUITTO_DIR / "mosquitto.conf",
        paths={**files, "password_file": workdir / "central.passwd",
               "persistence_location": Path(f"{workdir / 'central' / 'persistence'}/")},
    )  # fmt: skip
    site = MosquittoBroker(
        workdir / "site", config_file=MOSQUITTO_DIR / "site.conf",
        paths={**files, "password_file": workdir / "site.passwd", "bridge_cafile": tls / "ca.crt",
               "persistence_location": Path(f"{workdir / 'site' / 'persistence'}/")},
        values={"address": f"{HOST}:{central.ports[TLS_PORT]}",
                "remote_password": pw[f"bridge-{SITE}"]},
    )  # fmt: skip
    with central, site:
        yield Pair(central, site, pw, agg_pw)


def sites_main(args: Any) -> int:
    """``--sites``: ``--agents`` (default 1000) split between the central broker and one
    bridged site broker, against ``--baseline-agents`` (default 200) on the central
    broker alone, in the same run."""
    n = args.agents or (100 if args.quick else 1000)
    base = args.baseline_agents or (40 if args.quick else 200)
    rounds = args.rounds or (5 if args.quick else 20)
    emit(BENCH, {"environment": environment()})
    try:
        find_program("mosquitto")
        find_program("mosquitto_passwd")
        find_program("openssl")
    except FileNotFoundError as exc:
        emit(BENCH, {"skipped": str(exc)})
        return 0
    names = [f"a{i:04d}" for i in range(n)]
    central_agents, site_agents = names[: n // 2], names[n // 2 :]
    workdir = Path(tempfile.mkdtemp(prefix="cat-edge-sites-"))
    try:
        with bridged_pair(workdir, central_agents, site_agents) as pair:
            assert pair.central.pid is not None and pair.site.pid is not None
            central_port = pair.central.ports[LOOPBACK_PORT]
            site_port = pair.site.ports[LOOPBACK_PORT]
            url = f"mqtt://{HOST}:{central_port}"
            creds = {"mqtt_username": "aggregator",
                     "mqtt_password_file": pair.aggregator_password_file}  # fmt: skip
            pids = {"central_broker": pair.central.pid, "site_broker": pair.site.pid}

            def seat(agent: str, port: int) -> Seat:
                return Seat(agent, port, pair.passwords[agent])

            one = [seat(a, central_port) for a in central_agents[:base]]
            if len(one) < base:  # a baseline bigger than half the fleet
                raise SystemExit(f"--baseline-agents {base} > half of --agents {n}; lower it")
            two = [seat(a, central_port) for a in central_agents]
            two += [seat(a, site_port) for a in site_agents]
            common = {"rounds": rounds, "deadline_s": args.deadline, "pids": pids, **creds}
            small = scenario(one, url, procs=min(args.procs, base), **common)
            big = scenario(two, url, procs=args.procs, **common)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    emit(BENCH, {
        "scenario": "sites",
        "rounds": rounds,
        "deadline_s": args.deadline,
        "ok": big["ok"] and small["ok"],
        "fleet": {**big, "layout": f"{len(central_agents)} on the central broker, "
                                   f"{len(site_agents)} on the site broker (bridged)"},
        "baseline": {**small, "layout": f"{base} on the central broker"},
        "ratio": {
            "agents": n / base,
            "round_latency_p50": _ratio(big, small, "round_latency_p50_s"),
            "round_latency_p99": _ratio(big, small, "round_latency_p99_s"),
            "aggregator_rss": big["aggregator_kib"]["VmRSS"] / small["aggregator_kib"]["VmRSS"],
        },
    })  # fmt: skip
    return 0


# --------------------------------------------------------------------------- main


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--agents", type=int, default=None, help="the fleet (default 200)")
    p.add_argument("--baseline-agents", type=int, default=None, help="baseline (default 20)")
    p.add_argument("--rounds", type=int, default=None, help="versions per scenario (50)")
    p.add_argument("--procs", type=int, default=4, help="client processes")
    p.add_argument("--late-fraction", type=float, default=0.1, help="late agents (0.1)")
    p.add_argument("--deadline", type=float, default=0.5, help="AGG_ROUND_DEADLINE_S")
    p.add_argument("--status-flood", type=int, default=None, help="measure the disk instead")
    p.add_argument("--sites", action="store_true", help="bridged brokers instead (see above)")
    args = p.parse_args()
    if args.sites:
        return sites_main(args)
    if args.status_flood is not None:
        emit(BENCH, {"environment": environment()})
        options = {"max_queued_messages": 0}  # the flood must reach the service whole
        with MosquittoBroker(persistence=False, options=options) as flood_broker:
            for record in status_flood(next(iter(flood_broker.ports.values())), args.status_flood):
                emit(BENCH, record)
        return 0
    n = args.agents or (40 if args.quick else 200)
    base = args.baseline_agents or (8 if args.quick else 20)
    rounds = args.rounds or (8 if args.quick else 50)
    emit(BENCH, {"environment": environment()})
    try:
        broker = MosquittoBroker(persistence=False)
    except FileNotFoundError as exc:
        emit(BENCH, {"skipped": str(exc)})
        return 0
    with broker:
        assert broker.pid is not None
        broker_pid = broker.pid
        port = next(iter(broker.ports.values()))
        for name, fraction in (("on_time", 0.0), ("late", args.late_fraction)):
            runs = {}
            for size in (base, n):
                seats = _seats(size, port, round(fraction * size), args.deadline + LATE_EXTRA_S)
                runs[size] = scenario(
                    seats, broker.url, rounds=rounds, procs=min(args.procs, size),
                    deadline_s=args.deadline, pids={"broker": broker_pid},
                )  # fmt: skip
                runs[size]["broker_kib"] = rss_kib(broker_pid)
            big, small = runs[n], runs[base]
            emit(
                BENCH,
                {
                    "scenario": name,
                    "rounds": rounds,
                    "deadline_s": args.deadline,
                    "ok": big["ok"] and small["ok"],
                    "fleet": big,
                    "baseline": small,
                    "ratio": {
                        "agents": n / base,
                        "round_latency_p50": _ratio(big, small, "round_latency_p50_s"),
                        "round_latency_p99": _ratio(big, small, "round_latency_p99_s"),
                        "aggregator_rss": big["aggregator_kib"]["VmRSS"]
                        / small["aggregator_kib"]["VmRSS"],
                        "broker_rss": big["broker_kib"]["VmRSS"] / small["broker_kib"]["VmRSS"],
                    },
                },
            )
    return 0


def _ratio(big: dict[str, Any], small: dict[str, Any], key: str) -> float | None:
    a, b = big.get(key), small.get(key)
    return None if a is None or not b else float(a) / float(b)


if __name__ == "__main__":
    raise SystemExit(main())
