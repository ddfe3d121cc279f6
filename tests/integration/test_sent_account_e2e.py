"""The aggregator's account of everything an agent sent equals the agent's own ledger.

A real in-process :class:`~aggregator.service.ingest.AggregatorService` on real ZeroMQ sockets and
three real :class:`~edge_agent.agent.loop.Agent` loops (agent-0 on a LoRaWAN profile), each on a
:class:`CountingTransport` that counts what went on the wire. agent-0's radio goes deaf for
a few versions, so besides its hello, updates and goodbye it also sends requests (version
gap) and re-sends that are refused as duplicates: the aggregator's ``sent`` account prices
all of them on the profile's uplink, while ``spend`` keeps the accepted updates only.
``/status`` ``sent_total`` is the sum over the agents and equals the sum of their ledgers.

Also checked here: every message the service handed to its transport is counted by kind in
``/metrics`` (``cat_published_messages_total{kind}``, ``cat_published_bytes_total{kind}``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from e2e_helpers import (
    AGENT_IDS,
    PROFILES,
    AgentThread,
    Problem,
    make_problem,
    parse_metrics,
    server_url,
    service_settings,
    wait_until,
)

from aggregator.engine.downlink.outbound import PUBLISHED_KINDS
from aggregator.service.ingest import AggregatorService
from aggregator.web.app import get_status
from aggregator.web.metrics import AggregatorMetrics
from edge_agent.agent.loop import AgentConfig
from edge_agent.links.catalog import resolve_profile
from edge_agent.protocol import topics, wire
from edge_agent.protocol.downlink import StateSnapshot, decode_downlink

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def problem(tmp_path_factory: pytest.TempPathFactory) -> Problem:
    return make_problem(tmp_path_factory.mktemp("sent-data"), rows=300, features=100)


@pytest.fixture
def cleanup() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def _kind(topic: str, payload: bytes) -> str:
    """The kind of a published message as seen on the wire (topic and first bytes)."""
    parsed = topics.parse(topic)
    binary = payload[:2] == wire.MAGIC
    if parsed.kind == topics.TO_AGENT:
        if not binary:
            return "agent_control"
        # a state snapshot answer vs. merged steps / a delta: decode the type byte
        return "agent_snapshot" if _is_snapshot(payload) else "catchup"
    if parsed.kind == "model":
        return "snapshot"
    if parsed.kind in ("control", "job"):  # JSON on a job-wide topic (the job's settings too)
        return "control"
    return "steps" if not _is_delta(payload) else "delta"


def _is_snapshot(payload: bytes) -> bool:
    return isinstance(decode_downlink(payload), StateSnapshot | wire.Snapshot)


def _is_delta(payload: bytes) -> bool:
    return isinstance(decode_downlink(payload), wire.Delta)


def test_the_aggregators_sent_account_equals_the_lorawan_agents_ledger(
    problem: Problem, request: pytest.FixtureRequest, tmp_path: Path, cleanup: ExitStack
) -> None:
    assert PROFILES[0].startswith("lorawan")
    url = server_url("zmq", request)
    job = "sent-zmq"
    settings = service_settings(
        problem, job=job, url=url, data_dir=tmp_path / "agg", round_deadline_s=0.3
    )
    service = AggregatorService(settings)
    service.start()
    cleanup.callback(service.stop)
    # what went out at start (snapshot, resync), then a meter on the service's transport
    at_start = dict(service.read(lambda e: {k: tuple(v) for k, v in e.traffic.published.items()}))
    published: list[tuple[str, int]] = []
    inner = service._transports[0]
    real_publish = inner.publish

    def metered(topic: str, payload: bytes, *, retain: bool = False) -> None:
        published.append((_kind(topic, payload), len(payload)))
        real_publish(topic, payload, retain=retain)

    inner.publish = metered  # type: ignore[method-assign]

    agents = [
        AgentThread(
            AgentConfig(
                job=job,
                agent_id=AGENT_IDS[i],
                feedback="ef21",
                seed=i,
                resend_s=0.5,
                duty_cycle="ignore",
            ),
            url=url,
            shard=problem.shards[i],
            features=problem.features,
            profile=resolve_profile(PROFILES[i]),
        )
        for i in range(len(problem.shards))
    ]
    for a in agents:
        cleanup.callback(a.agent.stop)
        a.start()

    def version() -> int:
        return int(service.read(lambda e: e.version))

    wait_until(lambda: version() >= 3, 30.0, "three versions")
    lora = agents[0]
    lora.transport.deaf = True  # misses versions: re-sends, then requests when it hears again
    v_deaf = version()
    wait_until(lambda: version() >= v_deaf + 3, 20.0, "three versions without agent-0")
    wait_until(lambda: len(lora.transport.sent) > 0, 1.0, "agent-0 traffic")
    lora.transport.deaf = False
    v_back = version()
    wait_until(lambda: (lora.agent.version or -1) >= v_back, 20.0, "agent-0 to catch up")
    service.control("stop")
    for a in agents:
        a.join(15.0)  # each says goodbye (status "done") on the way out

    me = AGENT_IDS[0]

    def sent_matches() -> bool:
        info = service.read(lambda e: e.agents[me].sent)
        return info.messages == lora.agent.ledger.up.messages

    wait_until(sent_matches, 5.0, "the goodbye to reach the aggregator")
    info = service.read(lambda e: e.agents[me].copy())
    ledger, wire_up = lora.agent.ledger.up, lora.transport
    kinds = Counter(s.topic.split("/")[2] for s in wire_up.sent)
    assert all(kinds[k] >= 1 for k in ("hello", "status", "update", "request")), kinds
    assert (len(wire_up.sent), wire_up.sent_bytes) == (ledger.messages, ledger.bytes)
    # every message, priced on the LoRaWAN uplink, equals the agent's own ledger
    assert (info.sent.messages, info.sent.bytes, info.sent.packets) == (
        ledger.messages,
        ledger.bytes,
        ledger.packets,
    )
    assert info.sent.airtime_s == pytest.approx(ledger.airtime_s, rel=1e-9)
    assert info.sent.energy_j == pytest.approx(ledger.energy_j, rel=1e-9)
    assert info.sent.airtime_s > info.spend.actual.airtime_s > 0  # more than the accepted
    assert info.spend.actual.messages == info.accepted < ledger.messages

    # /status: sent_total sums every agent's account, re-sends included, beyond `totals`
    wait_until(
        lambda: service.read(lambda e: [e.agents[a.agent.config.agent_id].sent.messages
                                        for a in agents])
        == [a.agent.ledger.up.messages for a in agents],
        5.0,
        "every goodbye to reach the aggregator",
    )  # fmt: skip
    status = get_status(service)
    ledgers = [a.agent.ledger.up for a in agents]
    assert status.sent_total.messages == sum(u.messages for u in ledgers)
    assert status.sent_total.bytes == sum(u.bytes for u in ledgers)
    assert status.sent_total.packets == sum(u.packets for u in ledgers)
    assert status.sent_total.airtime_s == pytest.approx(sum(u.airtime_s for u in ledgers))
    assert status.sent_total.energy_j == pytest.approx(sum(u.energy_j for u in ledgers))
    assert status.sent_total.bytes > status.totals.bytes > 0  # more than the accepted
    assert status.received_total == status.downlink
    both = status.sent_and_received_total
    assert both.messages == status.sent_total.messages + status.received_total.messages
    assert both.bytes == status.sent_total.bytes + status.received_total.bytes

    # every message the service published, counted by kind in /metrics
    metrics = AggregatorMetrics()
    metrics.bind(service.metrics_snapshot)
    samples = parse_metrics(metrics.render().decode())
    counted = {k: [at_start.get(k, (0, 0))[0], at_start.get(k, (0, 0))[1]] for k in PUBLISHED_KINDS}
    for kind, size in published:
        counted[kind][0] += 1
        counted[kind][1] += size
    for kind in PUBLISHED_KINDS:
        assert samples[f'cat_published_messages_total{{kind="{kind}"}}'] == counted[kind][0], kind
        assert samples[f'cat_published_bytes_total{{kind="{kind}"}}'] == counted[kind][1], kind
    assert counted["steps"][0] + counted["delta"][0] >= 6
    assert counted["control"][0] >= 2  # resync at start, stop
