"""An agent's minibatch SGD: which rows each gradient uses, how noisy it is, the residual's units.

docs/algorithm.md, "Stochastic gradients (minibatch SGD)"; the numerics are in
edge_agent.numerics.sampling and edge_agent.numerics.stochastic."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from edge_agent.data import Dataset
from edge_agent.numerics.feedback import Feedback
from edge_agent.numerics.models import Model
from edge_agent.numerics.sampling import EpochSampler, batch_rows
from edge_agent.numerics.selection import Policy
from edge_agent.numerics.stochastic import StepRatio, batch_variance

FloatArray = npt.NDArray[np.float64]


class Minibatch:
    """The sampler (its own stream of the agent's seed), whether the variance is wanted
    (``cat`` prices it, randk scales by it; never under ``cat:nominal``), and the residual's
    step ratio when the agent keeps a classic-EF residual in model units (``schedule_t0``
    given; the model's ``l2`` is the schedule's lambda, ``1/smoothness`` its gamma)."""

    def __init__(
        self,
        batch_size: float,
        data: Dataset,
        seed: int,
        *,
        wants_variance: bool,
        step_ratio: StepRatio | None,
    ) -> None:
        self.n_rows = data.n_rows
        self.sampler = EpochSampler(
            data.n_rows, batch_rows(batch_size, data.n_rows), np.random.default_rng([seed, 1])
        )
        self.wants_variance = wants_variance
        self.step_ratio = step_ratio

    def draw(self, data: Dataset) -> Dataset:
        """The next minibatch of ``data``."""
        return data.take(self.sampler.next())

    def variance(
        self, model: Model, x: FloatArray, batch: Dataset, g: FloatArray
    ) -> FloatArray | None:
        """The noise variance of ``g`` (the gradient on ``batch`` at ``x``) per entry, or None
        when nothing uses it."""
        if not self.wants_variance:
            return None
        return batch_variance(lambda rows: model.grad(x, rows), batch, self.n_rows, g)

    def rescale(self, feedback: Feedback, version: int) -> None:
        """Before the residual is added back for ``version``: into this version's units."""
        if self.step_ratio is not None:
            feedback.rescale(self.step_ratio.factor(version))

    def reset(self) -> None:
        """The feedback memory was zeroed: the next residual has no earlier step."""
        if self.step_ratio is not None:
            self.step_ratio.reset()


class MinibatchSettings(Protocol):
    """The AgentConfig fields a minibatch needs."""

    @property
    def batch_size(self) -> float | None: ...
    @property
    def seed(self) -> int: ...
    @property
    def compressor(self) -> str: ...
    @property
    def feedback(self) -> str: ...
    @property
    def schedule_t0(self) -> float | None: ...


def for_agent(
    cfg: MinibatchSettings, data: Dataset, policy: Policy, smoothness: float, l2: float
) -> Minibatch | None:
    """The agent's :class:`Minibatch` (None: full gradients). The residual is kept in model
    units for classic EF with a schedule (``schedule_t0`` given, ``l2 > 0``)."""
    if cfg.batch_size is None:
        return None
    ratio = (
        StepRatio(1.0 / smoothness, l2, cfg.schedule_t0)
        if cfg.feedback == "ef" and cfg.schedule_t0 is not None and l2 > 0
        else None
    )
    wants = not policy.nominal and (policy.wants_variance or cfg.compressor == "randk")
    return Minibatch(cfg.batch_size, data, cfg.seed, wants_variance=wants, step_ratio=ratio)
