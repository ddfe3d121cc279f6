"""The agent loop over the in-memory transport, with a test peer playing the aggregator."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from edge_agent.agent.loop import Agent, AgentConfig
from edge_agent.data import Dataset, make_rcv1_like
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.models import make_model
from edge_agent.protocol import messages, topics, wire
from edge_agent.transports import Transport, open_transport
from edge_agent.transports.memory import MemoryTransport

JOB = "job1"
D = 300


class Peer:
    """A minimal aggregator: steps x <- x - u/L for every update and broadcasts a delta."""

    def __init__(self, url: str, lipschitz: float = 1.0) -> None:
        self.t: Transport = open_transport(url, role="aggregator", client_id="peer")
        self.t.connect()
        for pattern in topics.agent_inbound(JOB):
            self.t.subscribe(pattern)
        self.x = np.zeros(D)
        self.version = 0
        self.lipschitz = lipschitz
        self.updates: list[wire.UpdateHeader] = []
        self.hellos: list[messages.Hello] = []
        self.statuses: list[str] = []
        self.requests = 0
        self.sent_bytes = 0  # everything published to the agent

    def snapshot(self) -> None:
        blob = wire.encode_snapshot(self.x, job=JOB, version=self.version)
        self.sent_bytes += len(blob)
        self.t.publish(topics.model(JOB), blob, retain=True)

    def pump(self, *, step: bool = True) -> None:
        while (m := self.t.recv(timeout_s=0)) is not None:
            kind = topics.parse(m.topic).kind
            if kind == "hello":
                self.hellos.append(messages.parse(messages.Hello, m.payload))
            elif kind == "status":
                self.statuses.append(messages.parse(messages.Status, m.payload).state)
            elif kind == "request":
                self.requests += 1
                self.snapshot()
            elif kind == "update":
                header, u = wire.decode(m.payload)
                self.updates.append(header)
                if step and header.round == self.version:
                    new = self.x.copy()
                    u.add_to(new, -1.0 / self.lipschitz)
                    idx = np.flatnonzero(new != self.x)
                    blob = wire.encode_delta(
                        idx,
                        new[idx],
                        job=JOB,
                        base_version=self.version,
                        version=self.version + 1,
                        d=D,
                    )
                    self.x, self.version = new, self.version + 1
                    self.sent_bytes += len(blob)
                    self.t.publish(topics.delta(JOB), blob)


@pytest.fixture
def shard() -> Dataset:
    return make_rcv1_like(200, D, rng=np.random.default_rng(0), nnz_per_row=20)


@pytest.fixture
def peer(memory_url: str) -> Iterator[Peer]:
    p = Peer(memory_url)
    yield p
    p.t.close()


def make_agent(url: str, shard: Dataset, **kw: object) -> Agent:
    config = AgentConfig(job=JOB, agent_id="a1", duty_cycle="ignore", **kw)  # type: ignore[arg-type]
    return Agent(
        config,
        model=make_model("logreg", n_features=D),
        data=shard,
        profile=resolve_profile("lorawan_eu868_dr5_sf7"),
        transport=open_transport(url, role="agent", client_id="a1"),
    )


def drive(agent: Agent, peer: Peer, rounds: int) -> None:
    for _ in range(rounds):
        while (m := agent.transport.recv(timeout_s=0)) is not None:
            agent.handle(m)
        agent.step()
        peer.pump()
    while (m := agent.transport.recv(timeout_s=0)) is not None:
        agent.handle(m)


def test_hello_carries_the_agents_facts(memory_url: str, peer: Peer, shard: Dataset) -> None:
    agent = make_agent(memory_url, shard)
    agent.start()
    peer.pump()
    (hello,) = peer.hellos
    assert (hello.agent, hello.d, hello.rows, hello.model) == ("a1", D, 200, "logreg")
    assert hello.profile == "lorawan_eu868_dr5_sf7" and hello.fresh
    assert hello.smoothness == pytest.approx(agent.smoothness)
    assert peer.requests == 1  # no model yet: it asked for one


def test_agent_keeps_a_bit_identical_model_and_loss_falls(
    memory_url: str, peer: Peer, shard: Dataset
) -> None:
    agent = make_agent(memory_url, shard)
    peer.lipschitz = agent.smoothness
    agent.start()
    peer.pump()
    drive(agent, peer, 40)
    assert agent.version == peer.version == 40
    assert agent.x is not None and np.array_equal(agent.x, peer.x)
    losses = [agent.model.loss(np.zeros(D), shard), agent.model.loss(agent.x, shard)]
    assert losses[1] < losses[0]
    assert [h.round for h in peer.updates] == list(range(40))
    assert [h.seq for h in peer.updates] == list(range(40))


def test_ledger_accounts_every_message_on_the_profile(
    memory_url: str, peer: Peer, shard: Dataset
) -> None:
    agent = make_agent(memory_url, shard)
    agent.start()
    peer.pump()
    drive(agent, peer, 5)
    profile = agent.profile
    assert agent.ledger.updates == 5
    assert agent.ledger.messages == 5 + 2  # hello, snapshot request
    assert agent.last_log is not None
    expected = profile.message_cost(agent.last_log.size_bytes)
    assert agent.last_log.airtime_s == expected.airtime_s
    assert agent.ledger.silence_s > 0  # EU868 1% duty cycle is owed even when ignored
    # the downlink: the snapshot and the five deltas, priced on the profile's downlink part
    down = agent.ledger.down
    assert down.messages == 1 + 5
    assert down.bytes == peer.sent_bytes
    assert agent.ledger.traffic.total.bytes == agent.ledger.up.bytes + peer.sent_bytes
    assert down.airtime_s > 0 and down.energy_j > 0


def test_version_gap_triggers_a_snapshot_request(
    memory_url: str, peer: Peer, shard: Dataset
) -> None:
    agent = make_agent(memory_url, shard)
    agent.start()
    peer.pump()
    drive(agent, peer, 2)
    requests = peer.requests
    gap = wire.encode_delta(np.array([0]), np.array([1.0]), job=JOB, base_version=7, version=8, d=D)
    peer.t.publish(topics.delta(JOB), gap)
    drive(agent, peer, 1)
    assert agent.counters.dropped.get("version_gap") == 1
    assert peer.requests == requests + 1
    drive(agent, peer, 2)
    assert agent.x is not None and np.array_equal(agent.x, peer.x)


def test_malformed_and_foreign_messages_are_counted_and_dropped(
    memory_url: str, peer: Peer, shard: Dataset
) -> None:
    agent = make_agent(memory_url, shard)
    agent.start()
    peer.pump()
    drive(agent, peer, 3)
    before = agent.x.copy() if agent.x is not None else None
    peer.t.publish(topics.delta(JOB), b"\xca\x7e\x01\x03garbage")
    peer.t.publish(topics.control(JOB), b"{not json")
    peer.t.publish(topics.model(JOB), wire.encode_snapshot(np.ones(D + 1), job=JOB, version=99))
    peer.t.publish(topics.model(JOB), wire.encode_snapshot(np.ones(D), job="other", version=99))
    while (m := agent.transport.recv(timeout_s=0)) is not None:
        agent.handle(m)
    assert agent.counters.dropped == {"malformed": 2, "wrong_d": 1, "wrong_job": 1}
    assert before is not None and agent.x is not None and np.array_equal(agent.x, before)


def test_stop_control_finishes_the_run_loop(memory_url: str, peer: Peer, shard: Dataset) -> None:
    agent = make_agent(memory_url, shard)
    agent.start()
    peer.pump()
    peer.t.publish(topics.control(JOB), messages.dump(messages.Control(cmd="stop")))
    agent.run(poll_s=0.01)  # returns because of the stop command
    assert agent.finished


def test_max_rounds_ends_the_run(memory_url: str, peer: Peer, shard: Dataset) -> None:
    agent = make_agent(memory_url, shard, max_rounds=3)
    agent.start()
    peer.pump()
    import threading

    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            peer.pump()
            done.wait(0.005)

    th = threading.Thread(target=serve)
    th.start()
    try:
        agent.run(poll_s=0.01)
    finally:
        done.set()
        th.join()
    assert agent.rounds == 3
    assert agent.finished  # its work is over: the CLI says "done", not "offline"
    agent.close("done")
    peer.pump()
    assert peer.statuses == ["done"]  # a hello says online


class _Reconnecting(MemoryTransport):
    """Reaches the peer but reports no connection, as a ZeroMQ agent does between the
    aggregator's restart and its next handshake."""

    @property
    def connected(self) -> bool:
        return False


def test_close_says_goodbye_even_while_the_transport_reports_no_connection(
    memory_url: str, peer: Peer, shard: Dataset
) -> None:
    agent = make_agent(memory_url, shard)
    agent.uplink.transport = _Reconnecting(memory_url, role="agent", client_id="a1")
    agent.start()
    agent.close("done")
    peer.pump()
    assert peer.statuses == ["done"]  # a hello says online


def test_close_is_idempotent_and_survives_a_transport_closed_under_it(
    memory_url: str, peer: Peer, shard: Dataset
) -> None:
    agent = make_agent(memory_url, shard)
    agent.start()
    agent.close("done")
    agent.close("offline")  # a second goodbye would contradict the first
    peer.pump()
    assert peer.statuses == ["done"]  # a hello says online
    other = make_agent(memory_url, shard)
    other.start()
    other.transport.close()
    other.close()  # publish() after close() raises inside; close() logs it and returns


def test_close_before_start_says_nothing(memory_url: str, peer: Peer, shard: Dataset) -> None:
    agent = make_agent(memory_url, shard)
    agent.close()
    peer.pump()
    assert peer.statuses == []


def test_resync_of_an_answered_version_resends_the_same_update(
    memory_url: str, peer: Peer, shard: Dataset
) -> None:
    """An aggregator that restarted says resync at version v: the agent re-sends (same seq)."""
    agent = make_agent(memory_url, shard)
    agent.start()
    peer.pump()
    while (m := agent.transport.recv(timeout_s=0)) is not None:
        agent.handle(m)
    agent.step()
    peer.pump(step=False)
    peer.snapshot()  # a plain snapshot of the answered version is no reason to re-send
    ctl = messages.Control(cmd="resync", version=0)
    peer.t.publish(topics.control(JOB), messages.dump(ctl))
    while (m := agent.transport.recv(timeout_s=0)) is not None:
        agent.handle(m)
    peer.pump(step=False)
    assert [(h.round, h.seq) for h in peer.updates] == [(0, 0), (0, 0)]
    assert agent.counters.resends == 1


def test_ef21_agent_marks_its_updates(memory_url: str, peer: Peer, shard: Dataset) -> None:
    agent = make_agent(memory_url, shard, feedback="ef21")
    agent.start()
    peer.pump()
    drive(agent, peer, 2)
    assert {h.semantics for h in peer.updates} == {"ef21"}


def test_minibatch_agent_evaluates_only_its_batch_and_still_descends(
    memory_url: str, peer: Peer, shard: Dataset
) -> None:
    agent = make_agent(memory_url, shard, batch_size=0.1, feedback="ef")
    peer.lipschitz = agent.smoothness
    agent.start()
    peer.pump()
    drive(agent, peer, 40)
    assert agent.gradient_rows == 40 * 20  # 10 % of 200 rows per round, not the shard
    assert agent.x is not None and np.array_equal(agent.x, peer.x)
    assert agent.model.loss(agent.x, shard) < agent.model.loss(np.zeros(D), shard)


def test_a_minibatch_agent_prices_the_noise_of_its_gradient(
    memory_url: str, peer: Peer, shard: Dataset
) -> None:
    """The same batch, model and (zero) residual: ``cat`` prices the expected decrease of
    the noisy gradient and sends fewer entries than ``cat:nominal``. Only the agent given
    the job's schedule (``schedule_t0``) keeps its residual in model units."""
    agents = [
        Agent(
            AgentConfig(
                job=JOB,
                agent_id=name,
                duty_cycle="ignore",
                batch_size=0.1,
                feedback="ef",
                policy=policy,
                compressor="signtopk",
                schedule_t0=t0,
            ),
            model=make_model("logreg", n_features=D),
            data=shard,
            profile=resolve_profile("lorawan_eu868_dr5_sf7"),
            transport=open_transport(memory_url, role="agent", client_id=name),
        )
        for name, policy, t0 in (("a1", "cat", None), ("a2", "cat:nominal", 0.0))
    ]
    for agent in agents:
        agent.start()
    peer.pump()
    for agent in agents:
        while (m := agent.transport.recv(timeout_s=0)) is not None:
            agent.handle(m)
        agent.step()
    mb = [a.minibatch for a in agents]
    assert mb[0] is not None and mb[1] is not None
    assert mb[0].step_ratio is None and mb[1].step_ratio is not None
    peer.pump(step=False)
    t = {h.agent: h.t for h in peer.updates}
    assert 1 <= t["a1"] < t["a2"], t


def test_directional_pricing_refuses_a_minibatch() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        AgentConfig(job=JOB, agent_id="a1", curvature="directional", batch_size=0.1)
