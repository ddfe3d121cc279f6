"""Per-agent Prometheus series with a bounded label set (``agent="..."``).

One series per agent is what an operator wants (who is lagging, who spends the airtime, who
is refused), but an open fleet could grow a label per device without end. So at most
``max_agents`` agents (``AGG_METRICS_MAX_AGENTS``, default 100) get a label of their own: the
first to join (by first seen, then id; a label once given stays while those agents are
known), and every other agent is folded into ``agent="_other"`` (sums; the newest
last-seen time). ``max_agents=0`` folds all of them.

Series (docs/http-api.md):

* ``cat_agent_bytes_sent_total{agent}`` -- application bytes of every message it sent that
  reached the engine (hellos, status, requests, refused and duplicate updates too);
* ``cat_agent_bytes_received_total{agent}`` -- bytes of what was published to it while live;
* ``cat_agent_airtime_seconds_total{agent,direction}`` -- the same, as radio airtime priced
  on its profile (``direction`` = ``up`` | ``down``);
* ``cat_agent_messages_rejected_total{agent}`` -- its messages the engine refused;
* ``cat_agent_last_seen_seconds{agent}`` -- Unix time of its latest message (gauge;
  ``time() - cat_agent_last_seen_seconds`` is how long it has been silent).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from aggregator.engine.rounds import RoundEngine
from aggregator.service.settings import SettingsError

MAX_AGENTS_ENV = "AGG_METRICS_MAX_AGENTS"
DEFAULT_MAX_AGENTS = 100
OTHER = "_other"


@dataclass(frozen=True)
class AgentSample:
    """What /metrics reports for one agent (or for the ``_other`` fold)."""

    agent: str
    first_seen: float
    last_seen: float
    bytes_sent: int
    bytes_received: int
    airtime_up_s: float
    airtime_down_s: float
    rejected: int


def agent_samples(e: RoundEngine) -> list[AgentSample]:
    """One sample per known agent (call under the service's read lock: it copies)."""
    return [
        AgentSample(
            a.agent,
            a.first_seen,
            a.last_seen,
            a.sent.bytes,
            a.down.bytes,
            a.sent.airtime_s,
            a.down.airtime_s,
            a.rejected,
        )
        for a in e.agents.values()
    ]


def fold(samples: list[AgentSample], max_agents: int) -> list[AgentSample]:
    """The first ``max_agents`` samples by (first_seen, agent), then one ``_other`` sample
    summing the rest (absent when nothing is left over); at most ``max_agents + 1`` rows."""
    ordered = sorted(samples, key=lambda s: (s.first_seen, s.agent))
    kept, rest = ordered[:max_agents], ordered[max_agents:]
    if not rest:
        return kept
    other = AgentSample(
        OTHER,
        min(s.first_seen for s in rest),
        max(s.last_seen for s in rest),
        sum(s.bytes_sent for s in rest),
        sum(s.bytes_received for s in rest),
        sum(s.airtime_up_s for s in rest),
        sum(s.airtime_down_s for s in rest),
        sum(s.rejected for s in rest),
    )
    return [*kept, other]


def max_agents_from(env: Mapping[str, str]) -> int:
    """``AGG_METRICS_MAX_AGENTS`` (default 100); SettingsError naming it when invalid."""
    raw = env.get(MAX_AGENTS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_AGENTS
    if not raw.isdigit():
        raise SettingsError(
            f"{MAX_AGENTS_ENV}={raw!r}: use a whole number >= 0 (agents past it are "
            f'reported as agent="{OTHER}")'
        )
    return int(raw)


AgentSource = Callable[[], list[AgentSample]]


class AgentCollector(Collector):
    """Collects the per-agent families from ``source()`` at scrape time (nothing when the
    source is unset or the service is not running)."""

    def __init__(self, max_agents: int = DEFAULT_MAX_AGENTS) -> None:
        self.max_agents = max_agents
        self.source: AgentSource | None = None

    def collect(self) -> Iterator[Metric]:
        if self.source is None:
            return
        try:
            rows = fold(self.source(), self.max_agents)
        except RuntimeError:  # the service is not started (or stopped)
            return
        sent = CounterMetricFamily(
            "cat_agent_bytes_sent", "Bytes of every message the agent sent.", labels=["agent"]
        )
        received = CounterMetricFamily(
            "cat_agent_bytes_received", "Bytes published to the agent while live.", labels=["agent"]
        )
        airtime = CounterMetricFamily(
            "cat_agent_airtime_seconds",
            "Radio airtime of the agent's messages, priced on its profile.",
            labels=["agent", "direction"],
        )
        rejected = CounterMetricFamily(
            "cat_agent_messages_rejected", "The agent's messages refused.", labels=["agent"]
        )
        seen = GaugeMetricFamily(
            "cat_agent_last_seen_seconds",
            "Unix time of the agent's latest message.",
            labels=["agent"],
        )
        for r in rows:
            sent.add_metric([r.agent], float(r.bytes_sent))
            received.add_metric([r.agent], float(r.bytes_received))
            airtime.add_metric([r.agent, "up"], r.airtime_up_s)
            airtime.add_metric([r.agent, "down"], r.airtime_down_s)
            rejected.add_metric([r.agent], float(r.rejected))
            seen.add_metric([r.agent], r.last_seen)
        yield from (sent, received, airtime, rejected, seen)
