"""The job's smoothness constant L from what the agents claim in their hellos.

Without a configured step size the engine steps ``gamma = factor / L``
(:meth:`aggregator.engine.rounds.RoundEngine.gamma`), with L formed from each agent's claimed
local constant L_i (``smoothness``) and shard size n_i (``rows``) by one of two rules:

``mean`` (the default, and the rule every published figure used)
    ``L = sum n_i L_i / sum n_i`` (the plain mean of the L_i when every n_i is 0): the
    smoothness constant of the whole data set's average loss when every claim is true.
    One agent can move it anywhere inside the claim bounds (:class:`aggregator.engine.admission.Limits`)
    by claiming a huge n_i and a tiny L_i.
``median``
    the weighted median of the L_i with weights ``min(n_i, median n)``: an agent claiming
    more rows than the median agent weighs like the median agent, so one liar among three
    or more agents cannot move L outside the honest agents' range. Ties take the larger
    L (the smaller, safer step). On a fleet of equal shards it is the median of the L_i,
    close to the mean but not bit-identical to it.

The result is clipped to ``[min_smoothness, max_smoothness]``.

Stochastic jobs (agents sending minibatch gradients) add a decaying schedule on top of
that constant step: :func:`scheduled` gives ``min(gamma, 2 / (lambda (t + t0)))`` at model
version ``t``, the ``O(1/t)`` step under which SGD on a ``lambda``-strongly convex
objective converges in expectation, while the constant ``1/L`` step only reaches a
noise ball whose radius grows with the gradient variance (docs/algorithm.md, "Stochastic
gradients"). ``t0`` delays the decay (the step stays ``gamma`` for longer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from aggregator.engine.admission import Limits
from edge_agent.numerics.stochastic import scheduled_step
from edge_agent.protocol import messages

StepRule = Literal["mean", "median"]


def gamma(
    hellos: Sequence[messages.Hello], rule: StepRule, limits: Limits, factor: float = 1.0
) -> float:
    """``factor / L`` (0.0 before any hello: nothing to step with yet)."""
    return factor / smoothness(hellos, rule, limits) if hellos else 0.0


def scheduled(gamma: float, version: int, l2: float | None, t0: float = 0.0) -> float:
    """``gamma`` decayed for stochastic gradients: ``min(gamma, 2 / (l2 (version + t0)))``
    (:func:`edge_agent.numerics.stochastic.scheduled_step`, which an agent keeping its
    residual in model units uses too). ``l2``: the objective's strong-convexity constant;
    None: no schedule. Before the decay can bite (``version + t0 <= 0``) the step is ``gamma``.
    """
    return scheduled_step(gamma, version, l2, t0)


def smoothness(hellos: Sequence[messages.Hello], rule: StepRule, limits: Limits) -> float:
    """L for ``hellos`` (at least one) under ``rule`` (see the module doc), clipped."""
    if not hellos:
        raise ValueError("smoothness: no hello to take L from")
    big_l = _mean(hellos) if rule == "mean" else _median(hellos)
    return min(max(big_l, limits.min_smoothness), limits.max_smoothness)


def _mean(hellos: Sequence[messages.Hello]) -> float:
    rows = sum(h.rows for h in hellos)
    if rows > 0:
        return sum(h.rows * h.smoothness for h in hellos) / rows
    return sum(h.smoothness for h in hellos) / len(hellos)


def _median(hellos: Sequence[messages.Hello]) -> float:
    rows = sorted(h.rows for h in hellos)
    cap = rows[(len(rows) - 1) // 2]  # the lower median: a liar never raises it
    weights = [min(h.rows, cap) for h in hellos]
    if sum(weights) == 0:
        weights = [1] * len(hellos)
    pairs = sorted(zip((h.smoothness for h in hellos), weights, strict=True))
    total = sum(weights)
    acc = 0
    for value, weight in pairs:
        acc += weight
        if 2 * acc > total:  # strictly past half: ties go to the larger L
            return value
    return pairs[-1][0]
