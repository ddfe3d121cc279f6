"""Optional robust aggregation of a round (``AGG_AGGREGATION``), wired into the engine.

``mean`` (the default) is the engine's plain :class:`~edge_agent.numerics.aggregation.MeanAccumulator`,
unchanged. ``clipped_mean`` and ``trimmed_mean`` use :class:`RobustAccumulator`: the same
running sum (the update guard, the checkpoint and a crash replay see exactly what they see
under ``mean``) plus the round's weighted updates stacked densely, which the step
aggregates with :mod:`edge_agent.numerics.robust`. They apply to the mean family (plain, ef, dir
semantics); an EF21 job steps with the sum of its agents' states as always.

Replicas: under the ``exact`` downlink agents replay the plain mean step from the update
blobs, which a robust step is not, so a robust job that asks for ``exact`` is broadcast
with ``delta`` (the new values of the entries that changed; :func:`downlink`). ``cat``
works unchanged (it broadcasts the model change).

A restart in the middle of a round: the checkpoint holds the round's sum, not its rows,
so that one round (the updates that arrived before the restart and after it) is stepped
with the plain mean; the next round is robust again.

Small rounds: a rule tolerates f hostile rows only when the round has enough of them
(:attr:`Aggregation.min_contributions`, for f = 1). ``clipped_mean`` clips to c times the
*median* norm, an honest norm only when at most f of 2f + 1 rows are hostile: with two
rows the median is their mean, c = 2 times it exceeds the larger norm and nothing is
clipped (one hostile of two drove the loss to 2.8e22). It needs 3. ``trimmed_mean`` drops
``trim_count(K, trim)`` values per side and coordinate, at least f = 1 from
``K = max(3, ceil(1 / trim))`` rows (10 at the default 0.1; below that it is the plain
mean). A mean-family round of a robust job does not close with fewer contributions (one
per agent: sync rounds and async rounds take one per agent and version); the open round
says so in the log once and in /status (``robust_wait``). ``mean`` needs 1 (it tolerates
no hostile row, robust or not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

from aggregator.engine.downlink.broadcast import DownlinkMode
from edge_agent.numerics import robust
from edge_agent.numerics.aggregation import FloatArray, MeanAccumulator, StepResult
from edge_agent.numerics.compressors import Update

AggregationKind = Literal["mean", "clipped_mean", "trimmed_mean"]
AGGREGATIONS: Final[tuple[str, ...]] = ("mean", "clipped_mean", "trimmed_mean")


@dataclass(frozen=True)
class Aggregation:
    """How a round's updates are combined. ``clip`` (clipped_mean): each weighted update
    is scaled to a norm of at most ``clip`` times the round's median norm. ``trim``
    (trimmed_mean): the fraction of values dropped per side, per coordinate."""

    kind: AggregationKind = "mean"
    clip: float = 2.0
    trim: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}")
        if not self.clip > 0:
            raise ValueError(f"aggregation clip must be > 0, got {self.clip}")
        if not 0.0 <= self.trim < 0.5:
            raise ValueError(f"aggregation trim must be in [0, 0.5), got {self.trim}")

    @property
    def min_contributions(self) -> int:
        """Rows a round needs before the rule tolerates one hostile row (module doc)."""
        if self.kind == "clipped_mean":
            return 3  # 2f + 1 for f = 1: the median norm is an honest one
        if self.kind == "trimmed_mean" and self.trim > 0:
            k = 3
            while robust.trim_count(k, self.trim) < 1:
                k += 1
            return k
        return 1

    def why(self) -> str:
        """The arithmetic behind :attr:`min_contributions`, for the log and /status."""
        if self.kind == "clipped_mean":
            return "tolerating f hostile needs a median of 2f+1 norms, f = 1"
        return f"trimming needs floor({self.trim:g} K) >= 1 value per side"


class RobustAccumulator(MeanAccumulator):
    """A :class:`MeanAccumulator` whose step aggregates the round robustly."""

    __slots__ = ("_partial", "_rows", "rule")

    def __init__(self, d: int, rule: Aggregation, *, restored: FloatArray | None = None) -> None:
        super().__init__(d)
        self.rule = rule
        self._rows: list[FloatArray] = []
        #: restored mid-round: the rows before the restart are unknown (plain mean once)
        self._partial = False
        if restored is not None:  # which entries were touched is unknown, as after any restore
            self.load(restored)
            self._partial = bool(np.any(restored))

    def add(self, update: Update, weight: float = 1.0) -> None:
        super().add(update, weight)
        row = np.zeros(self.d)
        update.add_to(row, weight)
        self._rows.append(row)

    def step(self, x: FloatArray, coef: float) -> StepResult:
        """``x <- x - coef * S`` with ``S`` the robust sum of the round's rows
        (:mod:`edge_agent.numerics.robust`), unless an entry would be nan or inf."""
        if self._partial or not self._rows:
            return super().step(x, coef)
        rows = np.stack(self._rows)
        if self.rule.kind == "clipped_mean":
            total = robust.clipped_sum(rows, self.rule.clip)
        else:
            total = robust.trimmed_sum(rows, self.rule.trim)
        new = x - coef * total
        if not np.isfinite(new).all():
            return StepResult(np.zeros(0, dtype=np.int64), False)
        changed = np.flatnonzero(new != x)
        x[...] = new
        return StepResult(changed, True)

    @property
    def robust(self) -> bool:
        """Whether the round's step is robust: it holds rows, or the rows before a restore
        (whose step is the plain mean once) are unknown."""
        return bool(self._rows) or self._partial

    def reset(self) -> None:
        super().reset()
        self._rows = []
        self._partial = False


def accumulator(d: int, rule: Aggregation) -> MeanAccumulator:
    """The round accumulator ``rule`` asks for."""
    if rule.kind == "mean":
        return MeanAccumulator(d)
    return RobustAccumulator(d, rule)


def restored(rule: Aggregation, acc: MeanAccumulator) -> MeanAccumulator:
    """``acc`` (restored from a checkpoint's sum) as the accumulator ``rule`` asks for."""
    if rule.kind == "mean":
        return acc
    return RobustAccumulator(acc.d, rule, restored=acc.export())


def downlink(rule: Aggregation, mode: DownlinkMode) -> DownlinkMode:
    """The downlink mode the engine broadcasts with: ``delta`` for a robust job configured
    with ``exact`` (replicas cannot replay a robust step), else ``mode``."""
    if rule.kind != "mean" and mode == "exact":
        return "delta"
    return mode


def parse_aggregation(text: str) -> Aggregation:
    """``AGG_AGGREGATION``: ``mean``, ``clipped_mean[:c]`` or ``trimmed_mean[:fraction]``
    (e.g. ``clipped_mean:3``, ``trimmed_mean:0.2``; defaults c = 2, fraction = 0.1).
    Raises ValueError naming the accepted forms."""
    kind, _, arg = text.strip().partition(":")
    forms = "mean, clipped_mean[:c] (c > 0) or trimmed_mean[:fraction] (0 <= fraction < 0.5)"
    try:
        value = float(arg) if arg else None
        if kind == "mean" and value is None:
            return Aggregation()
        if kind == "clipped_mean":
            return Aggregation("clipped_mean", clip=2.0 if value is None else value)
        if kind == "trimmed_mean":
            return Aggregation("trimmed_mean", trim=0.1 if value is None else value)
    except ValueError as exc:
        raise ValueError(f"aggregation {text!r}: {exc}; expected {forms}") from None
    raise ValueError(f"aggregation {text!r}: expected {forms}")
