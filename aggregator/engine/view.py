"""The round engine's read-only face: what the service's status API, the metrics, the
simulator and the tests read of one job, each a view of the part that owns it.

:class:`EngineView` is the base of :class:`aggregator.engine.rounds.RoundEngine`; it holds
no state and changes none. Each property reads one part (the model, the lifecycle, the
registry, the downlink traffic, the open round, the closing policy, the refusals), which
alone changes what it holds through its own methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aggregator.engine.accounting import RoundRecord, Spend, Tally
from aggregator.engine.cadence import Cadence
from aggregator.engine.closing import Closing
from aggregator.engine.downlink.pacing import DownlinkTraffic, Hold
from aggregator.engine.lifecycle import Lifecycle
from aggregator.engine.model import JobModel
from aggregator.engine.openround import OpenRound
from aggregator.engine.refusals import Refusals
from aggregator.engine.registry import AgentRegistry, Participation
from aggregator.engine.types import AgentInfo, EngineConfig, EngineStateName, FloatArray
from edge_agent.links.cost import Cost
from edge_agent.protocol.downlink import Family


class EngineView:
    """Read-only views of the parts of one job's engine (see the module doc)."""

    config: EngineConfig
    tally: Tally
    model: JobModel
    lifecycle: Lifecycle
    registry: AgentRegistry
    round_state: OpenRound
    closing: Closing
    refusals: Refusals
    traffic: DownlinkTraffic

    @property
    def version(self) -> int:
        """The model version: the versions committed since the job began."""
        return self.tally.version

    @property
    def rounds(self) -> int:
        """Rounds committed."""
        return self.tally.rounds

    @property
    def last_record(self) -> RoundRecord | None:
        """The record of the last version committed (None: none yet)."""
        return self.tally.last_record

    @property
    def accepted(self) -> int:
        """Updates accepted."""
        return self.tally.accepted

    @property
    def totals(self) -> Spend:
        """What the accepted updates cost, summed over agents (read it only)."""
        return self.tally.totals

    @property
    def x(self) -> FloatArray:
        """The model (the array the engine steps in place)."""
        return self.model.x

    @property
    def family(self) -> Family | None:
        """The update family the job runs (None: no hello fixed it yet)."""
        return self.model.family

    @property
    def loss(self) -> float | None:
        return self.model.loss

    @property
    def accuracy(self) -> float | None:
        return self.model.accuracy

    @property
    def state(self) -> EngineStateName:
        return self.lifecycle.state

    @property
    def finish_reason(self) -> str:
        return self.lifecycle.finish_reason

    @property
    def rejected(self) -> dict[str, int]:
        """Refused messages by reason (read-only: :class:`Refusals` counts them)."""
        return self.refusals.counts

    @property
    def agents(self) -> Mapping[str, AgentInfo]:
        """Every agent's record (read-only: :class:`AgentRegistry` changes them)."""
        return self.registry.records

    @property
    def live_agents(self) -> int:
        return self.registry.live_count

    @property
    def totals_down(self) -> Cost:
        """What the agents received, summed over agents."""
        return self.traffic.totals_down

    @property
    def next_version_at(self) -> float:
        """Downlink pacing: no version closes before this time."""
        return self.traffic.next_version_at

    @property
    def h(self) -> dict[str, FloatArray]:
        """EF21: each agent's state h_i (live view of the mirror)."""
        return self.model.mirror.h

    @property
    def sum_h(self) -> FloatArray | None:
        """EF21: the sum of every h_i (None before the first change arrived)."""
        return self.model.mirror.sum_h

    @property
    def broadcast_model(self) -> FloatArray:
        """The model the agents hold: ``x``, or the compressed downlink's ``w``."""
        return self.model.broadcast_model

    @property
    def open_round(self) -> dict[str, Any]:
        """Participants and age of the open round (for the status API)."""
        return self.round_state.summary()

    def gamma(self) -> float:
        """The step size: configured, else 1/L with L from the hellos' L_i under
        ``step_rule`` (:mod:`aggregator.engine.stepsize`; times ``ef21_step_factor`` in an EF21
        job). A job with ``dir`` agents steps exactly 1/L: they are family *mean* (factor
        1), and admission refuses them when a step size is configured."""
        return self.model.gamma(self.registry.hellos(), self.version)

    @property
    def cadence(self) -> Cadence:
        """The members' duty cycles (read-only: :class:`Closing` owns them)."""
        return self.closing.cadence

    def counted(self, now: float | None = None) -> Participation:
        """Who the open sync round counts at ``now`` (:mod:`aggregator.engine.closing`)."""
        return self.closing.counted(self.version, self.family, now)

    def quorum(self, base: int | None = None) -> int:
        """Contributions a sync round needs at its deadline: a fraction of the agents that
        take part (:mod:`aggregator.engine.registry`), at least ``quorum_min_agents``."""
        return self.closing.quorum(self.counted().quorum_base if base is None else base)

    def hold(self, now: float) -> Hold | None:
        """Whether a round that could close waits for downlinks at ``now``: the reason,
        the agents whose downlink holds it and until when (None: not held)."""
        return self.traffic.hold(now, self.registry) if self.state == "running" else None
