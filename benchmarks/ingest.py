"""Aggregator ingest: updates/s the real service decodes and applies, against the raw rate of
the same payloads through the same transport to a plain subscriber, measured in the same run.

    python benchmarks/ingest.py [--quick] [--updates N] [--transport mqtt|zmq|both]
                                [--checkpoint-every K] [--profile]

The payloads are what agents send: top-k updates (d = 47,236, T = 100, float32 values)
encoded with :mod:`edge_agent.protocol.wire`, from 10 simulated agent ids, published by a separate
process through the product's agent transport (QoS 1 on MQTT, PUSH on ZeroMQ), hellos first.

* ``aggregator``: the real :class:`~aggregator.service.ingest.AggregatorService` (its transports,
  its SQLite journal and checkpoints in a temporary directory, default settings otherwise)
  in async mode with K = 10 and ``max_staleness`` = ``dedupe_window`` = N, so every update is
  accepted and applied and a model version (delta broadcast, journal, checkpoint every
  ``--checkpoint-every`` versions) is committed every 10 updates. Rate: N / (time from the
  publisher's first send to the service's ``accepted`` counter reaching N).
* ``raw``: the same payloads from the same publisher code to a plain subscriber that only
  counts them: a paho client subscribed with QoS 1 through the same broker (MQTT), a pyzmq
  PULL socket (ZeroMQ). Same clock.
* ``ratio`` = aggregator / raw (target >= 0.5). Each case runs ``--repeats`` times,
  alternating raw and aggregator; the medians are reported.

MQTT uses a private Mosquitto on a free 127.0.0.1 port with the deployment's
``max_inflight_messages 20``, but an unbounded ``max_queued_messages``: a fire-hose
publisher would otherwise overrun the deployment's 1000-message queue and the broker would
drop what a slower subscriber has not taken yet (that is queue policy, not ingest speed).

``--profile`` adds a line per transport with the seconds the ingest thread spent per stage
(decode, apply, delta encode, journal + history, checkpoint, publish) and the top of a
cProfile of the ingest thread.
"""

from __future__ import annotations

import cProfile
import io
import multiprocessing as mp
import os
import pstats
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, environment, parser

from aggregator.localnet import HOST, MosquittoBroker, free_port_pair

BENCH = "ingest"
JOB = "bench"
D = 47_236
T = 100
AGENTS = 10
PROFILE = "wifi_esp32_mqtt_tcp"  # priced like a real agent; no duty cycle holds a version
WAIT_S = 120.0  # no single measurement may take longer
#: most updates the publisher keeps outstanding (sent, not yet counted by the receiver): the
#: agent transports queue a bounded number (ZeroMQ drops beyond max_pending = 10,000)
WINDOW = 4_000


# --------------------------------------------------------------------------- payloads


def make_payloads(n: int, seed: int = 0) -> list[tuple[str, bytes]]:
    """``n`` distinct top-k updates (topic, payload), round-robin over the agents.

    Update ``i`` is agent ``i % AGENTS``'s answer to version ``i // AGENTS`` (its round and
    its ``seq``): the service closes a version every ``AGENTS`` accepted updates, and one
    publisher sends them in order, so each arrives at the version it answers and every one
    is accepted (async mode takes one contribution per agent per version: never a
    duplicate, never stale, never from the future).
    """
    from edge_agent.numerics.compressors import compress
    from edge_agent.protocol import topics
    from edge_agent.protocol.wire import encode

    rng = np.random.default_rng(seed)
    pool = [compress(rng.standard_normal(D) * rng.pareto(1.5, D), "topk", T) for _ in range(64)]
    out = []
    for i in range(n):
        agent = f"agent-{i % AGENTS:02d}"
        k = i // AGENTS
        blob = encode(pool[i % len(pool)], job=JOB, agent=agent, round=k, seq=k)
        out.append((topics.update(JOB, agent), blob))
    return out


def hellos() -> list[tuple[str, bytes]]:
    from edge_agent.protocol import messages, topics

    out = []
    for i in range(AGENTS):
        agent = f"agent-{i:02d}"
        hello = messages.Hello(
            job=JOB,
            agent=agent,
            d=D,
            rows=100,
            smoothness=1.0,
            model="logreg",
            compressor="topk",
            profile=PROFILE,
        )
        out.append((topics.hello(JOB, agent), messages.dump(hello)))
    return out


# --------------------------------------------------------------------------- the publisher


def _publisher(url: str, n: int, ctl: Any, progress: Any) -> None:
    """Child process: connect as an agent would, say hello, then on "go" publish n updates
    as fast as the transport takes them, never more than WINDOW ahead of ``progress`` (what
    the receiver has counted); report the monotonic start time; close on "close".
    """
    from edge_agent.transports import open_transport

    payloads = make_payloads(n)
    transport = open_transport(url, role="agent", client_id=f"bench-publisher-{os.getpid()}")
    transport.connect()
    for topic, blob in hellos():
        transport.publish(topic, blob)
    ctl.send("ready")
    if ctl.recv() != "go":
        transport.close()
        return
    started = time.monotonic()
    for i, (topic, blob) in enumerate(payloads):
        while i - progress.value >= WINDOW:
            time.sleep(0.0005)
        transport.publish(topic, blob)
    ctl.send(("sent", started, time.monotonic()))
    ctl.poll(WAIT_S)  # keep the connection until the receiver has everything
    transport.close()


@contextmanager
def publisher(
    url: str, n: int, count: Callable[[], int]
) -> Iterator[Callable[[], tuple[float, float]]]:
    """Start the publisher process; yields ``go()``: start sending, return (monotonic) when
    ``count()`` (what the receiver has taken) reaches n, with the time sending started."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    progress = ctx.Value("q", 0, lock=False)
    proc = ctx.Process(target=_publisher, args=(url, n, theirs, progress), daemon=True)
    proc.start()
    try:
        if not ours.poll(60) or ours.recv() != "ready":
            raise RuntimeError("the publisher did not start within 60 s")

        def go() -> tuple[float, float]:
            ours.send("go")
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                progress.value = got = count()
                if got >= n:
                    done = time.monotonic()
                    if not ours.poll(10):
                        raise RuntimeError("the publisher did not report its start time")
                    _, started, _ = ours.recv()
                    return float(started), done
                time.sleep(0.001)
            raise RuntimeError(f"only {count()} of {n} updates arrived within {WAIT_S:g} s")

        yield go
    finally:
        with suppress(OSError):
            ours.send("close")
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def wait_for(count: Callable[[], int], n: int, what: str) -> float:
    """Poll until ``count() >= n``; the monotonic time it got there."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if count() >= n:
            return time.monotonic()
        time.sleep(0.002)
    raise RuntimeError(f"{what}: only {count()} of {n} updates after {WAIT_S:g} s")


# --------------------------------------------------------------------------- raw baselines


def raw_mqtt(url: str, n: int) -> float:
    """Updates/s through the broker to a plain paho subscriber (QoS 1) that counts them."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    from edge_agent.protocol import topics

    port = int(url.rsplit(":", 1)[1])
    received = 0
    subscribed = threading.Event()
    client = paho.Client(
        CallbackAPIVersion.VERSION2, client_id=f"bench-raw-{os.getpid()}", clean_session=True
    )

    def on_message(c: Any, u: Any, msg: Any) -> None:
        nonlocal received
        received += 1

    client.on_message = on_message
    client.on_subscribe = lambda *a: subscribed.set()
    client.connect(HOST, port)
    client.loop_start()
    try:
        client.subscribe(f"{topics.job_prefix(JOB)}update/+", qos=1)
        if not subscribed.wait(10):
            raise RuntimeError("the raw MQTT subscriber did not get its SUBACK")
        with publisher(url, n, lambda: received) as go:
            started, done = go()
    finally:
        client.loop_stop()
        client.disconnect()
    return n / (done - started)


def raw_zmq(url: str, n: int) -> float:
    """Updates/s into a plain pyzmq PULL socket (bound where the aggregator binds)."""
    import zmq

    port = int(url.rsplit(":", 1)[1])
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(f"tcp://{HOST}:{port}")
    received = 0
    stop = threading.Event()

    def drain() -> None:
        nonlocal received
        poller = zmq.Poller()
        poller.register(pull, zmq.POLLIN)
        while not stop.is_set():
            if poller.poll(100):
                while True:
                    try:
                        frames = pull.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if b"/update/" in frames[0]:
                        received += 1

    th = threading.Thread(target=drain, daemon=True)
    th.start()
    try:
        with publisher(url, n, lambda: received) as go:
            started, done = go()
    finally:
        stop.set()
        th.join(5)
        pull.close(linger=0)
        ctx.term()
    return n / (done - started)


# --------------------------------------------------------------------------- the aggregator


@dataclass
class Stages:
    """Seconds the ingest thread spent per stage (only with --profile)."""

    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
                self.calls[name] = self.calls.get(name, 0) + 1

        return timed


def aggregator_run(
    url: str, n: int, *, checkpoint_every: int, profile: bool
) -> tuple[float, dict[str, Any]]:
    """Updates/s accepted by the real service; plus what it did (and, with ``profile``, where
    the ingest thread's time went)."""
    from aggregator.service.ingest import AggregatorService
    from aggregator.service.settings import load_settings

    data_dir = Path(tempfile.mkdtemp(prefix="cat-edge-ingest-"))
    settings = load_settings(
        job=JOB,
        d=D,
        mode="async",
        async_apply_every=AGENTS,
        max_staleness=n,
        dedupe_window=n,
        min_agents=AGENTS,
        transports=[url],
        data_dir=data_dir,
        checkpoint_every=checkpoint_every,
        feedback="none",  # the publisher sends plain top-k updates (the default job is ef21)
        # the exact relay, as when the target was set: the automatic downlink's choice costs
        # ~13 ms a version at this d (a CAT selection over x - w), which at a version every
        # 10 updates would measure the downlink, not the ingest
        downlink="exact",
        downlink_pacing=False,  # loopback: no version waits for a modelled radio
        # a new MQTT session per run: the broker would otherwise queue the next raw run's
        # messages for this (persistent, offline) client and replay them into the next run
        client_id=f"aggregator-{JOB}-{data_dir.name}",
    )
    service = AggregatorService(settings)
    stages = Stages()
    prof = cProfile.Profile() if profile else None
    restore: list[tuple[Any, str, Any]] = []
    if profile:
        from edge_agent.protocol import wire  # the module the engine calls through

        for owner, attr, name in (
            (wire, "decode", "decode"),
            (wire, "encode_delta", "delta_encode"),
        ):
            restore.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, stages.wrap(name, getattr(owner, attr)))
        original_ingest = AggregatorService._ingest

        def profiled_ingest(self: AggregatorService) -> None:
            assert prof is not None
            prof.enable()
            try:
                original_ingest(self)
            finally:
                prof.disable()

        restore.append((AggregatorService, "_ingest", original_ingest))
        AggregatorService._ingest = profiled_ingest  # type: ignore[method-assign]
    try:
        service.start()
        if profile:
            store, engine = service._store, service._engine
            assert store is not None and engine is not None
            store.commit = stages.wrap("journal_history", store.commit)  # type: ignore[method-assign]
            store.write_checkpoint = stages.wrap("checkpoint_write", store.write_checkpoint)  # type: ignore[method-assign]
            engine.handle = stages.wrap("handle", engine.handle)  # type: ignore[method-assign]
            engine.export = stages.wrap("checkpoint_export", engine.export)  # type: ignore[method-assign]
            service._publish = stages.wrap("publish", service._publish)  # type: ignore[method-assign]

        def accepted() -> int:
            return int(service.read(lambda e: e.accepted))

        with publisher(url, n, accepted) as go:
            wait_for(lambda: service.read(lambda e: len(e.agents)), AGENTS, "hellos")
            started, done = go()
        info = service.read(
            lambda e: {
                "versions": e.version,
                "accepted": e.accepted,
                "rejected": {k: v for k, v in e.rejected.items() if v},
            }
        )
    finally:
        service.stop()
        for owner, attr, value in restore:
            setattr(owner, attr, value)
        shutil.rmtree(data_dir, ignore_errors=True)
    if profile:
        s = dict(stages.seconds)
        handle = s.pop("handle", 0.0)
        # decode and delta encoding run inside handle(); "apply" is the rest of it
        s["apply"] = handle - s.get("decode", 0.0) - s.get("delta_encode", 0.0)
        info["stages_s"] = s
        info["stage_calls"] = dict(stages.calls)
        assert prof is not None
        info["cprofile_top"] = _top(prof)
    return n / (done - started), info


def _top(prof: cProfile.Profile, k: int = 15) -> list[str]:
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(k)
    lines = [ln.strip() for ln in buf.getvalue().splitlines()]
    start = next((i for i, ln in enumerate(lines) if ln.startswith("ncalls")), len(lines))
    return [" ".join(ln.split()) for ln in lines[start + 1 :] if ln][:k]


# --------------------------------------------------------------------------- Mosquitto


@contextmanager
def mosquitto() -> Iterator[str]:
    """A private broker tuned as the benchmark has always run it: no persistence, no
    TCP_NODELAY (Mosquitto's default), 20 in flight, no queue limit. MissingProgram (a
    FileNotFoundError) when Mosquitto is not installed."""
    options = {"set_tcp_nodelay": "false", "max_inflight_messages": 20, "max_queued_messages": 0}
    with MosquittoBroker(persistence=False, options=options) as broker:
        yield broker.url


# --------------------------------------------------------------------------- main


def run_case(transport: str, url_for: Callable[[], str], n: int, repeats: int, args: Any) -> None:
    raw_rates, agg_rates = [], []
    info: dict[str, Any] = {}
    raw = raw_mqtt if transport == "mqtt" else raw_zmq
    for i in range(repeats):
        raw_rates.append(raw(url_for(), n))
        rate, info = aggregator_run(
            url_for(), n, checkpoint_every=args.checkpoint_every, profile=args.profile and i == 0
        )
        agg_rates.append(rate)
        if args.profile and i == 0:
            emit(
                f"{BENCH}-profile",
                {
                    "transport": transport,
                    "updates": n,
                    "stages_s": info.pop("stages_s"),
                    "stage_calls": info.pop("stage_calls"),
                    "cprofile_top": info.pop("cprofile_top"),
                },
            )
    raw_rate, agg_rate = statistics.median(raw_rates), statistics.median(agg_rates)
    emit(
        BENCH,
        {
            "transport": transport,
            "updates": n,
            "agents": AGENTS,
            "d": D,
            "t": T,
            "payload_bytes": len(make_payloads(1)[0][1]),
            "checkpoint_every": args.checkpoint_every,
            "repeats": repeats,
            "aggregator_updates_per_s": agg_rate,
            "raw_updates_per_s": raw_rate,
            "ratio": agg_rate / raw_rate,
            # the target is against a paho subscriber through the broker; a raw
            # PULL socket is C speed end to end, so ZeroMQ is reported without one
            "target": 0.5 if transport == "mqtt" else None,
            "meets_target": agg_rate / raw_rate >= 0.5 if transport == "mqtt" else None,
            "aggregator_runs": agg_rates,
            "raw_runs": raw_rates,
            "versions": info.get("versions"),
            "rejected": info.get("rejected"),
        },
    )


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--updates", type=int, default=None, help="updates per measurement")
    p.add_argument("--repeats", type=int, default=None, help="measurements per case")
    p.add_argument("--transport", choices=["mqtt", "zmq", "both"], default="both")
    p.add_argument("--checkpoint-every", type=int, default=1, help="AGG_CHECKPOINT_EVERY")
    p.add_argument("--profile", action="store_true", help="stage timings and a cProfile")
    args = p.parse_args()
    n = args.updates or (2_000 if args.quick else 20_000)
    repeats = args.repeats or (1 if args.quick else 3)
    emit(BENCH, {"environment": environment()})
    if args.transport in ("zmq", "both"):
        run_case("zmq", lambda: f"zmq+tcp://{HOST}:{free_port_pair()}", n, repeats, args)
    if args.transport in ("mqtt", "both"):
        try:
            with mosquitto() as url:
                run_case("mqtt", lambda: url, n, repeats, args)
        except FileNotFoundError as exc:
            emit(BENCH, {"transport": "mqtt", "skipped": str(exc)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
