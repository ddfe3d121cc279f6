"""HTTP response models (pydantic, frozen), built from the engine's state, never the state itself.

Units are in the field names: ``*_s`` seconds, ``*_j`` joules, ``bytes`` application bytes
of encoded updates, ``bits``/``packets`` as priced by each agent's cost profile.

Both directions: ``totals``/``dense_equivalent`` are the uplink (accepted updates, as
before), ``downlink`` what the agents received (everything published while they were live,
priced on each one's downlink profile), ``total`` their sum; the ``*_downlink``/``*_total``
dense baselines send every committed version as a dense float32 model change to every live
agent (None when unknown: the service resumed the job past version 0). ``sent_total`` is
what the agents' radios actually sent (every message, re-sends and refused ones included),
``received_total`` what they received, ``sent_and_received_total`` both.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from aggregator.engine.accounting import RoundRecord, Spend
from aggregator.engine.downlink.pacing import Hold
from aggregator.engine.rounds import AgentInfo, RoundEngine
from aggregator.service.evaluation import FloorSource
from aggregator.web.eta import WINDOW, Eta, estimate
from edge_agent.links.cost import ZERO, Cost


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CostTotals(_Out):
    """Communication of accepted updates (``updates`` messages), priced per agent profile."""

    updates: int
    bytes: int = Field(description="Encoded update bytes received.")
    bits: float
    packets: int
    airtime_s: float
    energy_j: float

    @classmethod
    def of(cls, c: Cost) -> CostTotals:
        """``c`` with ``messages`` as ``updates`` (the field name of earlier versions)."""
        return cls(updates=c.messages, **_metrics(c))

    @classmethod
    def actual(cls, s: Spend) -> CostTotals:
        return cls.of(s.actual)

    @classmethod
    def dense(cls, s: Spend) -> CostTotals:
        return cls.of(s.dense)


def _metrics(c: Cost) -> dict[str, Any]:
    """Every field of ``c`` but the message count."""
    return {
        "bytes": c.bytes,
        "bits": c.bits,
        "packets": c.packets,
        "airtime_s": c.airtime_s,
        "energy_j": c.energy_j,
    }


class LinkCost(_Out):
    """What messages cost in one direction, or both (``messages`` count), priced per agent
    profile (its uplink or its downlink part)."""

    messages: int
    bytes: int = Field(description="Application bytes of the messages.")
    bits: float
    packets: int
    airtime_s: float
    energy_j: float

    @classmethod
    def of(cls, c: Cost) -> LinkCost:
        return cls(messages=c.messages, **_metrics(c))

    @classmethod
    def maybe(cls, c: Cost | None) -> LinkCost | None:
        return None if c is None else cls.of(c)


def _plus(a: Cost, b: Cost | None) -> Cost | None:
    return None if b is None else a + b


class TransportOut(_Out):
    url: str = Field(description="Transport URL (password redacted).")
    connected: bool


class WaitingOut(_Out):
    """A live agent the open round has no update from yet."""

    agent: str
    since: float | None = Field(
        description="Unix time (s) it has been waited for: when the round opened, or when the "
        "agent joined if later (None: unknown, the round's opening was not recovered)."
    )


def waiting_for(e: RoundEngine) -> list[WaitingOut]:
    """Agents the open round waits for (live, taking part or new: aggregator.engine.registry)
    without an update for it, longest waited for first (empty unless the job is running)."""
    if e.state != "running":
        return []
    opened = e.open_round["opened_at"]
    done = set(e.open_round["participants"])
    awaited = e.counted().awaited
    out = [
        WaitingOut(agent=a.agent, since=None if opened is None else max(opened, a.first_seen))
        for a in e.agents.values()
        if a.agent in awaited and a.agent not in done
    ]
    return sorted(out, key=lambda w: (w.since or 0.0, w.agent))


class RefusedOut(_Out):
    """An agent the aggregator refused (its hello or updates do not fit the job)."""

    agent: str
    reason: str = Field(description="The last refusal's reason (wrong_semantics, wrong_d, ...).")
    count: int = Field(description="Refusals since it was first recorded (rate limit aside).")
    last: float = Field(description="Unix time (s) of the last refusal.")


class HoldOut(_Out):
    """A round that could close but waits for agents' downlinks (downlink pacing)."""

    reason: Literal["downlink_busy", "daily_cap"] = Field(
        description="daily_cap: a member's network allows no more downlinks today; "
        "downlink_busy: airtime and its sender's duty cycle."
    )
    held_by: list[str] = Field(description="Agents whose downlink is not free yet.")
    held_until: float = Field(description="Unix time (s) the last of them is free again.")
    since: float = Field(description="Unix time (s) the hold started (AGG_MAX_HOLD_S bounds it).")

    @classmethod
    def of(cls, hold: Hold | None) -> HoldOut | None:
        if hold is None:
            return None
        return cls(reason=hold.reason, held_by=list(hold.held_by), held_until=hold.held_until,
                   since=hold.since)  # fmt: skip


class EtaOut(_Out):
    """When the job reaches its target loss at the recent rate (aggregator.web.eta)."""

    target_loss: float = Field(description="AGG_TARGET_LOSS, or the request's ?target=.")
    eta_s: float = Field(description="Seconds after the last version's close to the target.")
    eta_at: float = Field(description="Unix time (s) the target is reached at that rate.")
    versions_left: int
    rho: float = Field(description="Fitted ratio of successive per-version loss decreases.")
    seconds_per_version: float = Field(description="Mean over the fitted window.")
    window: int = Field(description="Versions with a loss the fit used.")
    early: bool = Field(
        False, description="The decreases still grow (rho 1): versions_left is a midpoint."
    )
    lower_bound: bool = Field(
        description="Early and no loss floor known: the target is most likely later."
    )
    eta_low_s: float | None = Field(None, description="The ETA of the low count.")
    eta_high_s: float | None = Field(
        None, description="The ETA of the high count (null: early without a loss floor)."
    )
    versions_left_high: int | None = None

    @classmethod
    def of(cls, eta: Eta | None) -> EtaOut | None:
        if eta is None:
            return None
        return cls(target_loss=eta.target_loss, eta_s=eta.eta_s, eta_at=eta.at + eta.eta_s,
                   versions_left=eta.versions_left, rho=eta.rho,
                   seconds_per_version=eta.seconds_per_version, window=eta.window,
                   early=eta.early, lower_bound=eta.lower_bound, eta_low_s=eta.eta_low_s,
                   eta_high_s=eta.eta_high_s,
                   versions_left_high=eta.versions_left_high)  # fmt: skip


class StatusOut(_Out):
    """The job at a glance."""

    job: str
    state: Literal["waiting", "running", "paused", "finished"]
    finish_reason: str
    mode: Literal["sync", "async"]
    round: int = Field(description="The open round: updates computed at this version are due.")
    model_version: int
    loss: float | None
    loss_floor: float | None = Field(
        None, description="Least the eval loss can be (AGG_LOSS_FLOOR; null: unknown)."
    )
    loss_floor_source: FloorSource = Field(
        "none", description="set (AGG_LOSS_FLOOR), solved or solving (auto), failed, none."
    )
    accuracy: float | None
    gamma: float = Field(description="Step size used by the next step.")
    agents: int = Field(description="Agents that have said hello.")
    live_agents: int
    quorum: int = Field(description="Reports that close a sync round after its deadline.")
    open_round_participants: list[str]
    hold: HoldOut | None = Field(
        None, description="Why a round that could close waits for downlinks (null: not held)."
    )
    waiting_for: list[WaitingOut] = Field(
        description="Live agents the open round still waits for, and since when."
    )
    refused_agents: list[RefusedOut] = Field(
        description="The last 100 distinct agents refused for their settings or state (a "
        "refused hello registers nothing), most recent first; an accepted hello removes one. "
        "In memory only."
    )
    updates_accepted: int
    updates_rejected: dict[str, int] = Field(description="Rejections by reason (non-zero only).")
    transport_refused: dict[str, int] = Field(
        default_factory=dict,
        description="What the transports dropped before the engine saw it, by reason (also "
        "in cat_updates_rejected_total): ZeroMQ unauthenticated, agent_mismatch, "
        "peer_disconnected (a frame above the ZeroMQ cap shows as one), malformed frames.",
    )
    robust_wait: str | None = Field(
        None,
        description="Why the open round may not close yet under a robust AGG_AGGREGATION "
        "(too few contributions for the rule; null: it may).",
    )
    totals: CostTotals
    dense_equivalent: CostTotals = Field(
        description="What dense float32 updates with the same headers would have cost."
    )
    downlink: LinkCost = Field(
        description="What the agents received (everything published to live agents)."
    )
    total: LinkCost = Field(description="Uplink (totals) + downlink.")
    dense_equivalent_downlink: LinkCost | None = Field(
        description="Every committed version as a dense float32 model change to every live "
        "agent (None: unknown, the service resumed the job past version 0)."
    )
    dense_equivalent_total: LinkCost | None = Field(
        description="dense_equivalent + dense_equivalent_downlink (None when unknown)."
    )
    sent_total: LinkCost = Field(
        description="Every message the agents sent that reached the aggregator once they "
        "were known (hellos, status, requests, refused and duplicate re-sends as well as the "
        "accepted updates), priced on each one's uplink: what their radios spent sending "
        "(the sum of /agents `sent`); `totals` is the accepted updates only."
    )
    received_total: LinkCost = Field(
        description="Every message the agents received (the same as `downlink`, named to "
        "pair with `sent_total`)."
    )
    sent_and_received_total: LinkCost = Field(
        description="sent_total + received_total: what the agents spent, both directions."
    )
    transports: list[TransportOut]
    recovered_from: str
    eta: EtaOut | None = Field(
        None,
        description="Time to the target loss from the recent rate of loss decrease (a "
        "log-linear fit of the per-version decreases over the last versions, "
        "docs/http-api.md); null when there is no target or the rate is unknown.",
    )

    @classmethod
    def build(
        cls,
        e: RoundEngine,
        *,
        transports: list[tuple[str, bool]],
        recovered_from: str,
        dense_down: Cost | None = None,
        now: float | None = None,
        eta: Eta | None = None,
        transport_refused: dict[str, int] | None = None,
        loss_floor: tuple[float | None, FloorSource] = (None, "none"),
    ) -> StatusOut:
        up, down = e.totals.actual, e.totals_down
        sent = sum((a.sent for a in e.agents.values()), ZERO)
        hold = None if now is None else e.hold(now)
        return cls(
            job=e.config.job,
            state=e.state,
            finish_reason=e.finish_reason,
            mode=e.config.mode,
            round=e.version,
            model_version=e.version,
            loss=e.loss,
            loss_floor=loss_floor[0],
            loss_floor_source=loss_floor[1],
            accuracy=e.accuracy,
            gamma=e.gamma(),
            agents=len(e.agents),
            live_agents=e.live_agents,
            quorum=e.quorum(),
            open_round_participants=list(e.open_round["participants"]),
            hold=HoldOut.of(hold),
            waiting_for=waiting_for(e),
            refused_agents=[RefusedOut(**r) for r in e.refusals.refused_agents.listing()],
            updates_accepted=e.accepted,
            updates_rejected={k: v for k, v in e.rejected.items() if v},
            transport_refused={k: v for k, v in (transport_refused or {}).items() if v},
            robust_wait=e.open_round.get("robust_wait"),
            totals=CostTotals.actual(e.totals),
            dense_equivalent=CostTotals.dense(e.totals),
            downlink=LinkCost.of(down),
            total=LinkCost.of(up + down),
            dense_equivalent_downlink=LinkCost.maybe(dense_down),
            dense_equivalent_total=LinkCost.maybe(_plus(e.totals.dense, dense_down)),
            sent_total=LinkCost.of(sent),
            received_total=LinkCost.of(down),
            sent_and_received_total=LinkCost.of(sent + down),
            transports=[TransportOut(url=u, connected=c) for u, c in transports],
            recovered_from=recovered_from,
            eta=EtaOut.of(eta),
        )


class AgentOut(_Out):
    """One agent as the aggregator sees it."""

    agent: str
    live: bool
    state: str = Field(description="online | offline | done | lost (silent past the timeout)")
    first_seen: float = Field(description="Unix time, seconds.")
    last_seen: float = Field(description="Unix time, seconds.")
    joined_version: int
    rows: int
    smoothness: float
    compressor: str
    semantics: str
    policy: str
    profile: str
    objective: str
    updates_accepted: int
    messages_rejected: int
    last_round: int | None
    last_t: int | None
    needs_reset: bool = Field(
        description="EF21 only: its state was dropped (a change older than the "
        "de-duplication window arrived); its updates are refused until it rejoins fresh."
    )
    totals: CostTotals = Field(description="Its accepted updates (uplink).")
    dense_equivalent: CostTotals
    downlink: LinkCost = Field(description="What it received while live (its downlink).")
    sent: LinkCost = Field(
        description="Every message it sent that reached the aggregator once it was known "
        "(hellos, status, snapshot requests, refused and duplicate updates as well as the "
        "accepted ones), priced on its profile's uplink; `totals` is the accepted updates only."
    )
    total: LinkCost = Field(description="Uplink (totals) + downlink.")
    dense_equivalent_downlink: LinkCost | None = Field(
        description="Every version it was live for as a dense float32 model change "
        "(None: unknown, the service resumed the job past version 0)."
    )
    dense_equivalent_total: LinkCost | None

    @classmethod
    def build(cls, a: AgentInfo, dense_down: Cost | None = None) -> AgentOut:
        h = a.hello
        return cls(
            agent=a.agent,
            live=a.live,
            state=a.state,
            first_seen=a.first_seen,
            last_seen=a.last_seen,
            joined_version=a.joined_version,
            rows=h.rows,
            smoothness=h.smoothness,
            compressor=h.compressor,
            semantics=h.semantics,
            policy=h.policy,
            profile=h.profile,
            objective=h.objective,
            updates_accepted=a.accepted,
            messages_rejected=a.rejected,
            last_round=a.last_round,
            last_t=a.last_t,
            needs_reset=a.needs_reset,
            totals=CostTotals.actual(a.spend),
            dense_equivalent=CostTotals.dense(a.spend),
            downlink=LinkCost.of(a.down),
            sent=LinkCost.of(a.sent),
            total=LinkCost.of(a.spend.actual + a.down),
            dense_equivalent_downlink=LinkCost.maybe(dense_down),
            dense_equivalent_total=LinkCost.maybe(_plus(a.spend.dense, dense_down)),
        )


class AgentRoundOut(_Out):
    t: int = Field(description="Entries sent (sum over the agent's updates this round).")
    bytes: int
    updates: int
    packets: int = Field(default=0, description="Packets on the agent's link (its profile).")
    airtime_s: float = Field(default=0.0, description="Airtime on the agent's link, seconds.")
    energy_j: float = Field(default=0.0, description="Radio energy, joules.")


class RoundOut(_Out):
    """One committed model version."""

    version: int
    base_version: int
    opened_at: float
    closed_at: float
    latency_s: float
    reason: str = Field(description="all_reported | deadline | async")
    gamma: float
    participants: list[str]
    agents: dict[str, AgentRoundOut]
    totals: CostTotals
    dense_equivalent: CostTotals
    loss: float | None
    accuracy: float | None

    @classmethod
    def build(cls, r: RoundRecord) -> RoundOut:
        return cls(
            version=r.version,
            base_version=r.base_version,
            opened_at=r.opened_at,
            closed_at=r.closed_at,
            latency_s=r.latency_s,
            reason=r.reason,
            gamma=r.gamma,
            participants=list(r.participants),
            agents={
                a: AgentRoundOut(
                    t=v.t,
                    bytes=v.cost.bytes,
                    updates=v.cost.messages,
                    packets=v.cost.packets,
                    airtime_s=v.cost.airtime_s,
                    energy_j=v.cost.energy_j,
                )
                for a, v in r.agents.items()
            },
            totals=CostTotals.actual(r.spend),
            dense_equivalent=CostTotals.dense(r.spend),
            loss=r.loss,
            accuracy=r.accuracy,
        )


class HistoryOut(_Out):
    since: int
    rounds: list[RoundOut]


class HealthOut(_Out):
    """``ok`` (200); ``degraded`` (503): a transport is down, agents on it cannot reach the
    job; ``unavailable`` (503): the ingest thread stopped; ``standby`` (503): waiting for the
    aggregator holding the data directory to end (``AGG_STANDBY``). ``detail`` says why."""

    status: Literal["ok", "degraded", "unavailable", "standby"]
    detail: str = ""
    transports: list[TransportOut] = Field(default_factory=list)


class ControlOut(_Out):
    cmd: Literal["pause", "resume", "stop"]
    applied: bool = Field(
        description="False when the command changed nothing (e.g. resume while running)."
    )
    state: Literal["waiting", "running", "paused", "finished"]
    model_version: int


def eta_of(
    records: list[RoundRecord],
    target: float | None,
    engine_target: float | None,
    floor: float | None = None,
) -> Eta | None:
    """The ETA over the committed ``records`` (the last :data:`~aggregator.web.eta.WINDOW`
    versions and one more), to ``target`` or else the job's ``engine_target``; ``floor``:
    the least the loss can be (``AGG_LOSS_FLOOR``, or solved on the evaluation data), None
    when unknown."""
    goal = engine_target if target is None else target
    points = [(r.version, r.closed_at, r.loss) for r in records[-(WINDOW + 1) :]]
    return estimate(points, goal, floor)
