"""Saving and restoring a :class:`~aggregator.engine.rounds.RoundEngine`: each part of the engine
exports its own state and the engine's checkpoint is their composition (arrays in an
:class:`~aggregator.engine.types.EngineSnapshot`, everything else in its JSON ``meta``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from aggregator.engine.accounting import RoundCosts, RoundRecord, Spend
from aggregator.engine.admission import REJECT_REASONS
from aggregator.engine.dedupe import SeenKeys
from aggregator.engine.types import STATE_FORMAT, AgentInfo, EngineSnapshot
from edge_agent.links.cost import Cost
from edge_agent.numerics.aggregation import EF21Mirror, MeanAccumulator

if TYPE_CHECKING:
    from aggregator.engine.rounds import RoundEngine


def export_engine(self: RoundEngine) -> EngineSnapshot:
    """A deep copy of the whole state (for a checkpoint)."""
    self._prune_seen()
    h_agents, h, sum_h = self._ef21.export()
    meta = {
        "format": STATE_FORMAT,
        "job": self.config.job,
        "d": self.config.d,
        "model": self.config.model,
        "version": self.version,
        "state": self.state,
        "resume_to": self._resume_to,
        "finish_reason": self.finish_reason,
        "family": self.family,
        "agents": [info.to_dict() for info in self.agents.values()],
        "accepted": self.accepted,
        "rejected": dict(self.rejected),
        "rounds": self.rounds,
        "totals": self.totals.to_dict(),
        "totals_down": self.totals_down.to_dict(),
        "next_version_at": self.next_version_at,
        "last_record": None if self.last_record is None else self.last_record.to_dict(),
        "loss": self.loss,
        "accuracy": self.accuracy,
        "downlink": self._down.export(),
        "guard": self._guard.export(),
        "round": {
            "contrib": dict(self._contrib),
            "count": self._count,
            **self._round_costs.export(),
            "opened_at": self._opened_at,
        },
    }
    json.dumps(meta)  # fail here, not in the writer, if something is not JSON-able
    return EngineSnapshot(
        x=self.x.copy(),
        acc=self._mean.export(),
        h_agents=h_agents,
        h=h,
        sum_h=sum_h,
        seen=self._seen.rows(),
        meta=meta,
    )


def restore_engine(eng: RoundEngine, snap: EngineSnapshot) -> None:
    """Load ``snap`` into a fresh engine built for its config (raises ValueError)."""
    config = eng.config
    snap.check(config)
    meta = snap.meta
    eng.version = int(meta["version"])
    eng.state = meta["state"]
    eng._resume_to = meta["resume_to"]
    eng.finish_reason = meta["finish_reason"]
    eng.family = meta["family"]
    agent_list = [AgentInfo.from_dict(a) for a in meta["agents"]]
    eng.agents = {a.agent: a for a in agent_list}
    eng._agent_index = {a.agent: i for i, a in enumerate(agent_list)}
    eng.accepted = int(meta["accepted"])
    eng.rejected = {**dict.fromkeys(REJECT_REASONS, 0), **meta["rejected"]}
    eng.rounds = int(meta["rounds"])
    eng.totals = Spend.from_dict(meta["totals"])
    eng.totals_down = Cost.from_dict(meta.get("totals_down"))
    eng.next_version_at = float(meta.get("next_version_at", 0.0))
    rec = meta["last_record"]
    eng.last_record = None if rec is None else RoundRecord.from_dict(rec)
    eng.loss = meta["loss"]
    eng.accuracy = meta["accuracy"]
    rnd = meta["round"]
    eng._mean = MeanAccumulator.restore(snap.acc)
    eng._contrib = {str(k): int(v) for k, v in rnd["contrib"].items()}
    eng._count = int(rnd["count"])
    eng._round_costs = RoundCosts.restore(rnd)
    eng._opened_at = rnd["opened_at"]
    eng._ef21 = EF21Mirror.restore(config.d, snap.h_agents, snap.h, snap.sum_h)
    eng._seen = SeenKeys.restore(snap.seen, [a.agent for a in agent_list])
    eng._down.restore(meta.get("downlink"))
    eng._guard.restore(meta.get("guard"))  # None in a checkpoint from before the guard
    eng._guard.sync(eng.x, snap.acc, eng._ef21)
    eng._prune_seen()
