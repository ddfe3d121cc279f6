"""Prometheus metrics on a private registry per app (never the process-global one).

Counters and gauges are read from the engine at scrape time (so they survive restarts with
the checkpoint); the two histograms are observed as rounds commit. Names (see
docs/http-api.md): ``cat_rounds_total``, ``cat_updates_accepted_total``,
``cat_updates_rejected_total{reason}``, ``cat_update_bytes_total``, ``cat_bits_total``,
``cat_packets_total``, ``cat_airtime_seconds_total``, ``cat_energy_joules_total``,
``cat_dense_equivalent_bytes_total``, the downlink (what the agents received, priced on
their profiles' downlink part) ``cat_downlink_messages_total``, ``cat_downlink_bytes_total``,
``cat_downlink_packets_total``, ``cat_downlink_airtime_seconds_total``,
``cat_downlink_energy_joules_total``, ``cat_model_version``, ``cat_agents``,
``cat_live_agents``, ``cat_loss``, ``cat_accuracy``, ``cat_up``, what the aggregator
published by kind ``cat_published_messages_total{kind}``, ``cat_published_bytes_total{kind}``
and ``cat_snapshot_answers_withheld_total`` (per-agent rate limit, aggregator.engine.downlink.pacing),
``cat_round_latency_seconds`` (histogram), ``cat_update_entries`` (histogram of T), and the
per-agent ``cat_agent_*{agent}`` series of :mod:`aggregator.web.agent_metrics` (bounded labels).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from aggregator.engine.accounting import RoundRecord
from aggregator.engine.downlink.outbound import PUBLISHED_KINDS
from aggregator.engine.rounds import REJECT_REASONS
from aggregator.web.agent_metrics import DEFAULT_MAX_AGENTS, AgentCollector, AgentSource

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_T_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 50_000, 100_000)
_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

Source = Callable[[], dict[str, Any]]

#: reasons a transport drops a message for before the engine sees it (ZeroMQ client
#: authentication, malformed frames, non-UTF-8 topics): shown from zero, like the engine's
TRANSPORT_REASONS = ("unauthenticated", "wrong_frame_count", "topic_not_utf8")


class _EngineCollector(Collector):
    def __init__(self, owner: AggregatorMetrics) -> None:
        self._owner = owner

    def collect(self) -> Iterator[Metric]:
        source = self._owner.source
        snap: dict[str, Any] | None = None
        if source is not None:
            try:
                snap = source()
            except RuntimeError:
                snap = None
        yield GaugeMetricFamily(
            "cat_up",
            "1 while the ingest loop is healthy.",
            0.0 if snap is None else float(snap["healthy"]),
        )
        if snap is None:
            return
        t = snap["totals"]
        counters = [
            ("cat_rounds", "Model versions committed.", snap["rounds"]),
            ("cat_updates_accepted", "Updates accepted.", snap["accepted"]),
            ("cat_update_bytes", "Encoded bytes of accepted updates.", t["bytes"]),
            ("cat_bits", "Bits of accepted updates, priced by each agent's profile.", t["bits"]),
            ("cat_packets", "Link packets of accepted updates (agent profiles).", t["packets"]),
            (
                "cat_airtime_seconds",
                "Radio airtime of accepted updates (agent profiles).",
                t["airtime_s"],
            ),
            (
                "cat_energy_joules",
                "Radio energy of accepted updates (agent profiles).",
                t["energy_j"],
            ),
            (
                "cat_dense_equivalent_bytes",
                "Bytes dense float32 updates would have taken.",
                t["dense_bytes"],
            ),
        ]
        for name, doc, value in counters + _downlink_counters(snap.get("totals_down") or {}):
            yield CounterMetricFamily(name, doc, value=float(value))
        rejected = CounterMetricFamily(
            "cat_updates_rejected", "Messages rejected, by reason.", labels=["reason"]
        )
        known = (*REJECT_REASONS, *TRANSPORT_REASONS)
        extra = sorted(set(snap["rejected"]) - set(known))
        for reason in (*known, *extra):
            rejected.add_metric([reason], float(snap["rejected"].get(reason, 0)))
        yield rejected
        yield from _published(snap.get("published") or {}, snap.get("snapshots_withheld", 0))
        gauges = [
            ("cat_model_version", "Current model version.", snap["version"]),
            ("cat_agents", "Agents that have said hello.", snap["agents"]),
            ("cat_live_agents", "Agents seen within the liveness timeout.", snap["live_agents"]),
        ]
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=float(value))
        if snap["loss"] is not None:
            yield GaugeMetricFamily(
                "cat_loss", "Evaluation loss of the current model.", value=float(snap["loss"])
            )
        if snap["accuracy"] is not None:
            yield GaugeMetricFamily(
                "cat_accuracy",
                "Evaluation accuracy of the current model.",
                value=float(snap["accuracy"]),
            )


def _downlink_counters(down: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """What the agents received (every message published while they were live)."""
    received = "received by the agents (their profiles' downlink part)"
    return [
        ("cat_downlink_messages", "Messages received by the agents.", down.get("messages", 0)),
        ("cat_downlink_bytes", "Message bytes received by the agents.", down.get("bytes", 0)),
        ("cat_downlink_packets", f"Link packets {received}.", down.get("packets", 0)),
        ("cat_downlink_airtime_seconds", f"Radio airtime {received}.", down.get("airtime_s", 0)),
        ("cat_downlink_energy_joules", f"Radio energy {received}.", down.get("energy_j", 0)),
    ]


def _published(published: dict[str, Any], withheld: int) -> Iterator[Metric]:
    """Every message the aggregator published, by kind (once per message, however many
    transports carried it), and the snapshot answers the per-agent rate limit withheld."""
    messages = CounterMetricFamily(
        "cat_published_messages", "Messages the aggregator published, by kind.", labels=["kind"]
    )
    sizes = CounterMetricFamily(
        "cat_published_bytes", "Payload bytes the aggregator published, by kind.", labels=["kind"]
    )
    for kind in dict.fromkeys([*PUBLISHED_KINDS, *published]):
        count, size = published.get(kind, (0, 0))
        messages.add_metric([kind], float(count))
        sizes.add_metric([kind], float(size))
    yield messages
    yield sizes
    yield CounterMetricFamily(
        "cat_snapshot_answers_withheld",
        "Snapshot answers to one agent withheld by the per-agent rate limit.",
        value=float(withheld),
    )


class AggregatorMetrics:
    """A registry for one app; :meth:`bind` it to the service's ``metrics_snapshot``."""

    def __init__(self, *, max_agents: int = DEFAULT_MAX_AGENTS) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.source: Source | None = None
        #: per-agent series: at most ``agents.max_agents`` labels, the rest as "_other"
        self.agents = AgentCollector(max_agents)
        self.round_latency = Histogram(
            "cat_round_latency_seconds",
            "Seconds from a round opening to its model version being committed.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.update_entries = Histogram(
            "cat_update_entries",
            "Entries T sent per agent per round (mean when an agent sent several updates).",
            buckets=_T_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_EngineCollector(self))
        self.registry.register(self.agents)

    def bind(self, source: Source | None, agents: AgentSource | None = None) -> None:
        self.source = source
        self.agents.source = agents

    def observe_round(self, record: RoundRecord) -> None:
        self.round_latency.observe(record.latency_s)
        for per in record.agents.values():
            if per.cost.messages:
                self.update_entries.observe(per.t / per.cost.messages)

    def render(self) -> bytes:
        return generate_latest(self.registry)
