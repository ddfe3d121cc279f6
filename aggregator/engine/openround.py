"""The open round of one job: what its accepted updates sum to, who contributed, what they
cost and when it opened. :class:`OpenRound` is the only writer of that state; it exports
and restores it itself (a checkpoint's ``acc`` array and its ``round`` meta)."""

from __future__ import annotations

import logging
from collections.abc import Callable, KeysView
from typing import Any

from aggregator.engine.accounting import RoundCosts, RoundRecord, Spend
from aggregator.engine.admission import Reject
from aggregator.engine.registry import Participation
from aggregator.engine.robust_round import (
    Aggregation,
    RobustAccumulator,
    accumulator,
    restored,
)
from aggregator.engine.types import EngineConfig
from edge_agent.numerics.aggregation import FloatArray, MeanAccumulator, StepResult
from edge_agent.numerics.compressors import Update

log = logging.getLogger("aggregator.engine")


class OpenRound:
    """The round being collected: the accumulator (the mean, or a robust rule), the
    contributions per participant, the count of contributing updates (the async K
    counter), the round's costs and the time it opened (None: not yet)."""

    def __init__(self, d: int, aggregation: Aggregation) -> None:
        self.d = d
        self.aggregation = aggregation
        self._acc = accumulator(d, aggregation)
        self._contrib: dict[str, int] = {}  # participant -> contributing updates
        self._count = 0
        self._costs = RoundCosts()
        self._opened_at: float | None = None
        self._told = False  # the robust_wait line was logged

    # ------------------------------------------------------------------ reading

    @property
    def accumulator(self) -> MeanAccumulator:
        """The round's sum (read it only: the update guard checks a step against it)."""
        return self._acc

    @property
    def count(self) -> int:
        """Contributing updates so far."""
        return self._count

    @property
    def participants(self) -> KeysView[str]:
        """The agents that contributed, in the order they first did (a live view)."""
        return self._contrib.keys()

    def has(self, agent: str) -> bool:
        """Whether ``agent`` contributed to this round."""
        return agent in self._contrib

    def __bool__(self) -> bool:
        """Whether any update contributed."""
        return bool(self._contrib)

    def __len__(self) -> int:
        """How many agents contributed."""
        return len(self._contrib)

    @property
    def opened_at(self) -> float | None:
        return self._opened_at

    @property
    def costs(self) -> RoundCosts:
        """The round's costs (a committed record keeps this very object)."""
        return self._costs

    def robust_wait(self) -> str | None:
        """Why this round may not close under its robust rule: fewer contributions than the
        rule needs to tolerate one hostile (:mod:`aggregator.engine.robust_round`); None:
        it may (a mean rule, an EF21 round, or enough)."""
        acc, need = self._acc, self.aggregation.min_contributions
        if not isinstance(acc, RobustAccumulator) or not acc.robust or len(self) >= need:
            return None
        return (f"{self.aggregation.kind} needs {need} contributions from distinct agents "
                f"({self.aggregation.why()}); the round has {len(self)}")  # fmt: skip

    def short_of_rule(self) -> bool:
        """:meth:`robust_wait` as a yes/no; the first wait is logged once."""
        wait = self.robust_wait()
        if wait is not None and not self._told:
            self._told = True
            log.warning("the round waits: %s (AGG_AGGREGATION; logged once)", wait)
        return wait is not None

    def summary(self) -> dict[str, Any]:
        """Participants and age (for the status API), and why a robust round waits."""
        return {
            "participants": sorted(self._contrib),
            "updates": self._count,
            "opened_at": self._opened_at,
            "robust_wait": self.robust_wait(),
        }

    def admits(
        self, agent: str, round: int, staleness: int, ef21: bool, *, paused: bool,
        config: EngineConfig, last_round: int | None = None,
    ) -> bool:  # fmt: skip
        """Whether an admissible update for ``round`` (``staleness`` versions old) enters
        this round's step (else: EF21 state only, or a refusal for the mean family). Raises
        ``duplicate`` for a second mean-family update of an agent in a sync round.

        Async: one contribution per agent per version. An agent that contributed to this
        round already, or whose update is for a version no newer than its last accepted
        one (``last_round``), does not contribute again: a mean-family update is refused
        ``one_per_version``, an EF21 change enters the agent's state only. So no agent makes
        versions alone (``async_apply_every`` > 1) and a robust round's rows come from
        distinct agents."""
        if config.mode != "sync":
            if paused or staleness > config.max_staleness:
                return False
            again = agent in self._contrib or (last_round is not None and round <= last_round)
            if again and not ef21:
                raise Reject("one_per_version", f"{agent}: a second update for version {round}")
            return not again
        contributes = not paused and staleness == 0
        if agent in self._contrib and staleness == 0:
            if not ef21:
                raise Reject("duplicate", f"{agent} already reported for round {round}")
            contributes = False  # a second EF21 change for the same round: state only
        return contributes

    def close_reason(
        self, now: float, config: EngineConfig, counted: Participation | None,
        quorum: Callable[[int], int],
    ) -> str | None:  # fmt: skip
        """Why this round would close at ``now``, downlinks aside (None: it would not):
        the robust rule's minimum first (:meth:`short_of_rule`); async, ``async_apply_every``
        contributions; sync (``counted``: who the round counts), ``all_reported`` or, past
        the deadline, ``quorum(counted.quorum_base)`` contributions (``deadline``)."""
        if self.short_of_rule():
            return None
        if counted is None:
            return "async" if self._count >= config.async_apply_every else None
        if counted.awaited <= self._contrib.keys():
            return "all_reported"
        opened = now if self._opened_at is None else self._opened_at
        if now >= opened + config.round_deadline_s and len(self) >= quorum(counted.quorum_base):
            return "deadline"
        return None

    def record(
        self, version: int, base: int, now: float, reason: str, gamma: float,
        loss: float | None, accuracy: float | None,
    ) -> RoundRecord:  # fmt: skip
        """The record of this round, committed at ``now`` as ``version`` (stepped from
        ``base`` with ``gamma``; the new model's ``loss`` and ``accuracy``); it keeps the
        round's costs object."""
        opened = self._opened_at
        return RoundRecord(
            version=version,
            base_version=base,
            opened_at=now if opened is None else opened,
            closed_at=now,
            reason=reason,
            gamma=gamma,
            participants=tuple(sorted(self._contrib)),
            agents=self._costs.agents,
            spend=self._costs.spend,
            loss=loss,
            accuracy=accuracy,
        )

    # ------------------------------------------------------------------ changes

    def open(self, now: float, *, again: bool = False) -> None:
        """The round opens at ``now`` unless it is open already (``again``: its deadline
        counts from ``now`` anyway, when the job starts; what it collected is kept)."""
        if self._opened_at is None or again:
            self._opened_at = now

    def restart_deadline(self, now: float) -> None:
        """An open round's deadline counts from ``now`` (after a pause)."""
        if self._opened_at is not None:
            self._opened_at = now

    def cost(self, agent: str, t: int, spend: Spend) -> None:
        """An accepted update of ``agent`` (``t`` values) cost ``spend``."""
        self._costs.add(agent, t, spend)

    def contribute(self, agent: str, update: Update | None, weight: float) -> None:
        """An update of ``agent`` enters the step; ``update`` is summed (None: an EF21
        change, which the mirror holds instead)."""
        self._contrib[agent] = self._contrib.get(agent, 0) + 1
        self._count += 1
        if update is not None:
            self._acc.add(update, weight)

    def step(self, x: FloatArray, coef: float) -> StepResult:
        """``x <- x - coef * sum`` (the mean family's step; in place, only if finite)."""
        return self._acc.step(x, coef)

    def reset(self, now: float) -> None:
        """Open the next round at ``now`` (a committed record keeps the old costs object)."""
        self._acc.reset()
        self._contrib = {}
        self._count = 0
        self._costs = RoundCosts()
        self._opened_at = now

    # ------------------------------------------------------------------ persistence

    def export_sum(self) -> FloatArray:
        """A copy of the round's sum (the checkpoint's ``acc``)."""
        return self._acc.export()

    def export(self) -> dict[str, Any]:
        """The checkpoint's ``round`` meta."""
        return {
            "contrib": dict(self._contrib),
            "count": self._count,
            **self._costs.export(),
            "opened_at": self._opened_at,
        }

    def restore(self, meta: dict[str, Any], acc: FloatArray) -> None:
        """Load what :meth:`export` and :meth:`export_sum` wrote (raises ValueError)."""
        self._acc = restored(self.aggregation, MeanAccumulator.restore(acc))
        self._contrib = {str(k): int(v) for k, v in meta["contrib"].items()}
        self._count = int(meta["count"])
        self._costs = RoundCosts.restore(meta)
        self._opened_at = meta["opened_at"]
