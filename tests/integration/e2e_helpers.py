"""Helpers for the end-to-end and crash tests: a real uvicorn aggregator, real agent processes.

Everything listens on 127.0.0.1 and every wait is bounded. Processes write their output to
files in the test's directory (no pipes to fill up); :class:`Fleet` kills whatever is still
running when the test ends, by process object, never by name.

The problem is small on purpose (1500 rows x 1000 features, three shards): a round takes a
few milliseconds, so the tests spend their time in process start-up, not in training.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from aggregator.engine.downlink.broadcast import DownlinkMode
from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.localnet import HOST, ServiceProcess, free_port_pair, service_env, tail
from aggregator.service.ingest import AggregatorService
from aggregator.service.settings import Settings, load_settings
from aggregator.sim.harness import FleetHarness
from edge_agent.agent.loop import Agent, AgentConfig, FeedbackName
from edge_agent.data import load_dataset, make_rcv1_like, split_shards, write_libsvm
from edge_agent.links.catalog import resolve_profile
from edge_agent.links.profiles import CostProfile, parse_profile, profile_to_json
from edge_agent.numerics.local import LocalConfig
from edge_agent.numerics.models import make_model
from edge_agent.numerics.optimum import solve_optimum
from edge_agent.transports import Message, Transport, open_transport

#: one radio per agent, all shipped profiles with a non-zero energy model
PROFILES = ("lorawan_eu868_dr5_sf7", "ble5_2m_dle_notify", "nbiot_udp_psm_rai")
AGENT_IDS = ("agent-0", "agent-1", "agent-2")
L2 = 1e-3
TOKEN = "e2e-test-token-0123456789abcdef"


# --------------------------------------------------------------------------- the problem


@dataclass(frozen=True)
class Problem:
    """Generated RCV1-like data on disk: the full set (evaluation) and one shard per agent."""

    full: Path
    shards: tuple[Path, ...]
    features: int
    f0: float  # loss at x = 0
    f_star: float  # L-BFGS optimum

    def target_loss(self, rel_subopt: float) -> float:
        """The loss at relative suboptimality ``(f - f*) / (f(0) - f*) = rel_subopt``."""
        return self.f_star + rel_subopt * (self.f0 - self.f_star)


def scaled_profile(
    name: str, new_name: str, scale: float, *, downlink: float | None = None
) -> CostProfile:
    """Profile ``name`` with every uplink airtime divided by ``scale`` (and with ``downlink``
    every downlink airtime by that), its duty cycle unchanged, as ``new_name``: a
    time-scaled copy for tests on loopback."""
    data: dict[str, Any] = json.loads(profile_to_json(resolve_profile(name)))
    data["name"] = new_name
    # as on a private network server: TTN's fair-use cap (30 s a day, 0.035 %) would pace
    # the copy 58 times slower than its duty cycle; these tests are of the duty cycle
    data.pop("uplink_airtime_per_day_s", None)
    parts = [(data, scale)] + ([] if downlink is None else [(data["downlink"], downlink)])
    for part, divisor in parts:
        for cost in ("per_packet", "per_byte", "per_message"):
            if "airtime_s" in part.get(cost, {}):
                part[cost]["airtime_s"] /= divisor
    return parse_profile(data, source="test copy")


def make_problem(
    workdir: Path, *, rows: int = 1500, features: int = 1000, agents: int = 3, seed: int = 0
) -> Problem:
    rng = np.random.default_rng(seed)
    full = make_rcv1_like(rows, features, rng=rng, nnz_per_row=74.0)
    workdir.mkdir(parents=True, exist_ok=True)
    full_path = workdir / "full.svm"
    write_libsvm(full, full_path)
    shard_paths = []
    for i, shard in enumerate(split_shards(full, agents, rng=rng)):
        path = workdir / f"shard-{i}.svm"
        write_libsvm(shard, path)
        shard_paths.append(path)
    # the aggregator evaluates on what it reads back from the file: do the same here
    data = load_dataset(full_path, n_features=features)
    model = make_model("logreg", n_features=features, l2=L2)
    _, f_star = solve_optimum(model, data)
    f0 = model.loss(np.zeros(model.d), data)
    return Problem(full_path, tuple(shard_paths), features, float(f0), float(f_star))


# --------------------------------------------------------------------------- waiting


def wait_until(
    cond: Callable[[], bool],
    timeout_s: float,
    what: str,
    *,
    poll_s: float = 0.05,
    diagnose: Callable[[], str] | None = None,
) -> None:
    """Poll ``cond`` until it is true; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(poll_s)
    extra = f"\n{diagnose()}" if diagnose is not None else ""
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}{extra}")


# --------------------------------------------------------------------------- processes


class AggregatorProcess(ServiceProcess):
    """``uvicorn aggregator.app:app`` with ``AGG_*`` settings (the shared launcher), plus an
    HTTP client for the API; restartable on the same ports."""

    def __init__(self, workdir: Path, settings: dict[str, str], *, http_port: int | None = None):
        super().__init__(workdir, settings, port=http_port)
        self.base = self.base_url
        self.http = httpx.Client(base_url=self.base, timeout=5.0)

    def close(self) -> None:
        super().close()
        self.http.close()

    def get(self, path: str, **params: Any) -> Any:
        r = self.http.get(path, params=params)
        r.raise_for_status()
        return r.json()

    def status(self) -> dict[str, Any]:
        return dict(self.get("/status"))

    def history(self) -> list[dict[str, Any]]:
        """Every committed round, oldest first (pages of 1000)."""
        rows: list[dict[str, Any]] = []
        while True:
            page = self.get("/history", since=rows[-1]["version"] if rows else 0, limit=1000)
            rows.extend(page["rounds"])
            if len(page["rounds"]) < 1000:
                return rows

    def model(self) -> tuple[int, bytes]:
        """(X-Model-Version, the raw .npy body)."""
        r = self.http.get("/model")
        r.raise_for_status()
        return int(r.headers["X-Model-Version"]), r.content

    def metrics(self) -> dict[str, float]:
        """Prometheus samples as ``{'name{labels}': value}`` (comments skipped)."""
        r = self.http.get("/metrics")
        r.raise_for_status()
        return parse_metrics(r.text)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


@dataclass
class AgentProcess:
    """One ``edge-agent run``; ``summary()`` is the JSON line it prints on exit."""

    agent_id: str
    profile: str
    proc: subprocess.Popen[bytes]
    out_path: Path
    err_path: Path
    model_path: Path

    def summary(self) -> dict[str, Any]:
        lines = self.out_path.read_text().strip().splitlines()
        return dict(json.loads(lines[-1])) if lines else {}

    def saved_model(self) -> np.ndarray[Any, Any]:
        model: np.ndarray[Any, Any] = np.load(self.model_path, allow_pickle=False)
        return model

    def diagnose(self) -> str:
        return f"{self.agent_id} stderr:\n{tail(self.err_path, 10)}"


@dataclass
class Fleet:
    """The agent processes of one test; ``close()`` kills what is still running."""

    workdir: Path
    agents: list[AgentProcess] = field(default_factory=list)

    def start_agent(
        self,
        *,
        server: str,
        job: str,
        index: int,
        shard: Path,
        features: int,
        feedback: FeedbackName,
        resend_s: float,
        extra: Sequence[str] = (),
        agent_id: str | None = None,
        profile: str | None = None,
        duty_cycle: str = "ignore",
    ) -> AgentProcess:
        """``edge-agent run`` as agent ``index`` (its id and profile unless given);
        ``extra``: more ``edge-agent run`` flags (e.g. ``--aggregator-key FILE``)."""
        agent_id = AGENT_IDS[index] if agent_id is None else agent_id
        profile = PROFILES[index] if profile is None else profile
        model_path = self.workdir / f"{agent_id}.npy"
        out_path, err_path = self.workdir / f"{agent_id}.out", self.workdir / f"{agent_id}.err"
        cmd = [
            sys.executable,
            "-m",
            "edge_agent.cli",
            "run",
            "--server",
            server,
            "--job",
            job,
            "--agent-id",
            agent_id,
            "--profile",
            profile,
            "--data",
            str(shard),
            "--features",
            str(features),
            "--l2",
            str(L2),
            "--feedback",
            feedback,
            "--seed",
            str(index),
            "--duty-cycle",
            duty_cycle,
            "--resend-s",
            str(resend_s),
            "--save-model",
            str(model_path),
            "--quiet",
            *extra,
        ]
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(cmd, env=service_env({}), stdout=out, stderr=err)
        agent = AgentProcess(agent_id, profile, proc, out_path, err_path, model_path)
        self.agents.append(agent)
        return agent

    def start_all(
        self,
        problem: Problem,
        *,
        server: str,
        job: str,
        feedback: FeedbackName,
        resend_s: float,
        extra: Sequence[str] = (),
    ) -> None:
        """One agent per shard of ``problem``, agent ``i`` on shard ``i`` (``extra``: more
        ``edge-agent run`` flags for every one)."""
        for i, shard in enumerate(problem.shards):
            self.start_agent(
                server=server,
                job=job,
                index=i,
                shard=shard,
                features=problem.features,
                feedback=feedback,
                resend_s=resend_s,
                extra=extra,
            )

    def check_running(self) -> None:
        """AssertionError if an agent already exited (the job is not finished yet)."""
        for a in self.agents:
            if a.proc.poll() is not None:
                raise AssertionError(
                    f"{a.agent_id} exited early with {a.proc.returncode}\n{a.diagnose()}"
                )

    def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for a in self.agents:
            try:
                a.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"{a.agent_id} did not exit within {timeout_s:g} s\n{a.diagnose()}"
                ) from None

    def diagnose(self) -> str:
        return "\n".join(a.diagnose() for a in self.agents)

    def close(self) -> None:
        for a in self.agents:
            if a.proc.poll() is None:
                a.proc.kill()
                a.proc.wait(timeout=10)


@contextmanager
def running(aggregator: AggregatorProcess, fleet: Fleet) -> Iterator[None]:
    """Stop every process of the test on the way out, whatever happened."""
    try:
        yield
    finally:
        fleet.close()
        aggregator.close()


def server_url(transport: str, request: Any) -> str:
    """``zmq+tcp://127.0.0.1:<free pair>``, or the ``mosquitto`` fixture's URL (it skips
    the test when the broker is not installed)."""
    if transport == "zmq":
        return f"zmq+tcp://{HOST}:{free_port_pair()}"
    return str(request.getfixturevalue("mosquitto").url)


def aggregator_settings(
    problem: Problem, *, job: str, server: str, data_dir: Path, **more: object
) -> dict[str, str]:
    """``AGG_*`` for a three-agent job on ``problem``; ``more`` adds ``AGG_<KEY>`` values."""
    env = {
        "AGG_JOB": job,
        "AGG_D": str(problem.features),
        "AGG_L2": str(L2),
        "AGG_TRANSPORTS": server,
        "AGG_DATA_DIR": str(data_dir),
        "AGG_EVAL_DATA": str(problem.full),
        "AGG_MIN_AGENTS": str(len(problem.shards)),
        # loopback traffic in real time: the LoRaWAN agent's daily downlink cap would space
        # versions hours apart (the pacing has its own tests)
        "AGG_DOWNLINK_PACING": "false",
    }
    env.update({f"AGG_{k.upper()}": str(v) for k, v in more.items()})
    return env


def wait_finished(agg: AggregatorProcess, fleet: Fleet, timeout_s: float) -> dict[str, Any]:
    """Poll /status until the job is finished; fail early if a process died."""
    last: dict[str, Any] = {}

    def finished() -> bool:
        nonlocal last
        if not agg.alive():
            raise AssertionError(f"the aggregator died\n{agg.diagnose()}")
        last = agg.status()
        if last["state"] != "finished":
            fleet.check_running()
        return bool(last["state"] == "finished")

    wait_until(
        finished,
        timeout_s,
        "the job to finish",
        poll_s=0.1,
        diagnose=lambda: f"last status: {last}\n{agg.diagnose()}\n{fleet.diagnose()}",
    )
    return last


def assert_models_identical(agg: AggregatorProcess, fleet: Fleet) -> np.ndarray[Any, Any]:
    """GET /model equals every agent's saved copy bit for bit; returns the model."""
    version, body = agg.model()
    x: np.ndarray[Any, Any] = np.load(io.BytesIO(body), allow_pickle=False)
    assert x.dtype == np.float64
    for a in fleet.agents:
        copy = a.saved_model()
        assert copy.dtype == np.float64 and copy.shape == x.shape, a.agent_id
        assert copy.tobytes() == x.tobytes(), (
            f"{a.agent_id}'s copy differs from /model v{version} in "
            f"{int(np.count_nonzero(copy != x))} entries"
        )
    return x


# --------------------------------------------------------------------------- a reference run


def reference_run(
    problem: Problem,
    *,
    job: str,
    feedback: FeedbackName,
    rounds: int,
    local_steps: int | None = None,
    downlink: DownlinkMode = "exact",
) -> tuple[list[float], np.ndarray[Any, Any]]:
    """The same job without processes or failures: the same shards, seeds, profiles and
    :class:`RoundEngine`, the real :class:`Agent` code over ``memory://`` (the simulator's
    :class:`FleetHarness`), pumped one round at a time. Returns (loss after each version
    1..rounds, the final model).

    ``job`` must be the real job's id: it is in every update's header, so it changes the
    message sizes CAT prices, and with them the T it picks. ``local_steps``: the job runs
    local training (sign-top-T agents, as ``edge-agent run --local-steps H --compressor
    signtopk``). ``downlink``: the job's ``AGG_DOWNLINK``."""
    local = None if local_steps is None else LocalConfig(local_steps=local_steps)
    full = load_dataset(problem.full, n_features=problem.features)
    eval_model = make_model("logreg", n_features=problem.features, l2=L2)
    engine = RoundEngine(
        EngineConfig(
            job=job,
            d=problem.features,
            min_agents=len(problem.shards),
            max_rounds=rounds,
            feedback="local" if local else "any",
            local=local,
            downlink=downlink,
        ),
        evaluator=lambda x: (eval_model.loss(x, full), eval_model.accuracy(x, full)),
        profiles=resolve_profile,
    )
    losses: list[float] = []

    def pump(fleet: FleetHarness) -> None:
        for eff in fleet.pump():
            if eff.committed is not None and eff.committed.loss is not None:
                losses.append(eff.committed.loss)

    with FleetHarness(engine, name="e2e-ref") as fleet:
        for i, shard in enumerate(problem.shards):
            data = load_dataset(shard, n_features=problem.features)
            fleet.add_agent(
                AgentConfig(
                    job=job,
                    agent_id=AGENT_IDS[i],
                    feedback=feedback,
                    seed=i,
                    duty_cycle="ignore",
                    resend_s=None,
                    local_steps=local_steps,
                    compressor="signtopk" if local_steps else "topk",
                ),
                model=make_model("logreg", n_features=data.n_features, l2=L2),
                data=data,
                profile=resolve_profile(PROFILES[i]),
            )
        fleet.start()
        for _ in range(rounds + 2):
            fleet.clock.now += 0.001
            pump(fleet)
            fleet.deliver()
            fleet.step()
            pump(fleet)
            if engine.state == "finished":
                break
        assert engine.version == rounds, f"the reference stopped at version {engine.version}"
        return losses, engine.x.copy()


def versions(rows: Sequence[dict[str, Any]]) -> list[int]:
    return [int(r["version"]) for r in rows]


# --------------------------------------------------------------------------- in-process agents


@dataclass(frozen=True)
class Sent:
    """One message an agent handed to its transport: when (monotonic s), where, how big."""

    at: float
    topic: str
    size: int


class CountingTransport(Transport):
    """A real transport with a meter: every message the agent publishes (``sent``) and every
    message the transport carried to it (``carried``, bytes per topic) is counted here, below
    the agent, so the counts are what went over the wire, not what the agent believes.

    ``deaf``: while True, inbound messages are carried (counted in ``carried`` and
    ``missed``) but never reach the agent: a radio that missed its downlinks.
    """

    def __init__(self, inner: Transport) -> None:
        super().__init__(inner.url, role=inner.role, client_id=inner.client_id)
        self.inner = inner
        self.sent: list[Sent] = []
        self.carried: list[Message] = []
        self.missed = 0
        self.deaf = False

    def connect(self) -> None:
        self.inner.connect()

    def close(self) -> None:
        self.inner.close()

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.sent.append(Sent(time.monotonic(), topic, len(payload)))
        self.inner.publish(topic, payload, retain=retain)

    def subscribe(self, pattern: str) -> None:
        self.inner.subscribe(pattern)

    def set_will(self, topic: str, payload: bytes) -> None:
        self.inner.set_will(topic, payload)

    @property
    def connected(self) -> bool:
        return self.inner.connected

    def recv(self, timeout_s: float | None = None) -> Message | None:
        msg = self.inner.recv(timeout_s)
        if msg is None:
            return None
        self.carried.append(msg)
        if self.deaf:
            self.missed += 1
            return None
        return msg

    @property
    def sent_bytes(self) -> int:
        return sum(s.size for s in self.sent)

    @property
    def carried_bytes(self) -> int:
        return sum(len(m.payload) for m in self.carried)


class AgentThread:
    """A real :class:`Agent` on a real transport (wrapped in a :class:`CountingTransport`),
    served by :meth:`Agent.run` on its own thread, closed the way ``edge-agent run`` closes
    it ("done" when finished, else "offline")."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        url: str,
        shard: Path,
        features: int,
        profile: CostProfile,
        **transport_options: object,
    ) -> None:
        inner = open_transport(
            url, role="agent", client_id=config.agent_id, timeout_s=5.0, **transport_options
        )
        self.transport = CountingTransport(inner)
        self.agent = Agent(
            config,
            model=make_model("logreg", n_features=features, l2=L2),
            data=load_dataset(shard, n_features=features),
            profile=profile,
            transport=self.transport,
        )
        self.error: BaseException | None = None
        self.started_at = 0.0
        self._thread = threading.Thread(target=self._serve, name=config.agent_id, daemon=True)

    def start(self) -> None:
        self.started_at = time.monotonic()
        self._thread.start()

    def _serve(self) -> None:
        try:
            self.agent.start()
            self.agent.run(poll_s=0.02)
        except BaseException as exc:  # reported by join()
            self.error = exc
        finally:
            self.agent.close("done" if self.agent.finished else "offline")

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float) -> None:
        """Wait for the loop to end (the aggregator said stop, or :meth:`stop`); raise what
        it raised; AssertionError after ``timeout_s``."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise AssertionError(
                f"{self.agent.config.agent_id} still running after {timeout_s:g} s"
            )
        if self.error is not None:
            raise AssertionError(f"{self.agent.config.agent_id} failed: {self.error!r}")

    def stop(self, timeout_s: float = 10.0) -> None:
        self.agent.stop()
        self.join(timeout_s)


def service_settings(
    problem: Problem, *, job: str, url: str, data_dir: Path, **more: Any
) -> Settings:
    """In-process aggregator settings for ``problem`` (no evaluation data: rounds stay fast)."""
    return load_settings(
        job=job,
        d=problem.features,
        l2=L2,
        transports=[url],
        data_dir=data_dir,
        min_agents=len(problem.shards),
        tick_s=0.05,
        **{"downlink_pacing": False, "cadence": False, **more},
    )


@contextmanager
def in_process_service(settings: Settings) -> Iterator[AggregatorService]:
    """A started :class:`AggregatorService` (real transports), stopped on the way out."""
    service = AggregatorService(settings)
    service.start()
    try:
        yield service
    finally:
        service.stop()


def check_refused_alone(agg: AggregatorProcess, agent_id: str, reason: str) -> None:
    """The job has not started and /status names ``agent_id`` refused for ``reason``."""
    status = agg.status()
    assert status["agents"] == 0 and status["round"] == 0, status
    [refused] = status["refused_agents"]
    assert (refused["agent"], refused["reason"]) == (agent_id, reason), refused


def check_trained_fleet(
    agg: AggregatorProcess, fleet: Fleet, status: dict[str, Any], *, max_rounds: int,
    target: float, semantics: str,
) -> None:  # fmt: skip
    """A fleet of AGENT_IDS finished at ``target``: every version in the history, every
    agent of ``semantics``, 10x fewer bytes than dense, every copy the aggregator's model,
    every agent exited 0 with a finished summary."""
    n = status["round"]
    assert "target_loss" in status["finish_reason"], status["finish_reason"]
    assert 0 < n < max_rounds and status["loss"] <= target
    assert versions(agg.history()) == list(range(1, n + 1))
    agents = {a["agent"]: a for a in agg.get("/agents")}
    assert sorted(agents) == list(AGENT_IDS)
    assert all(agents[a]["semantics"] == semantics for a in AGENT_IDS)
    totals, dense = status["totals"], status["dense_equivalent"]
    assert dense["bytes"] > 10 * totals["bytes"], (totals, dense)
    assert_models_identical(agg, fleet)
    for a in fleet.agents:
        assert a.proc.returncode == 0, a.diagnose()
        assert a.summary()["finished"] is True, a.summary()
