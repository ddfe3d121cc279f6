"""Error feedback, as options on top of any compressor (docs/algorithm.md, "Error feedback").

Both remedies keep agent-side memory of what compression dropped, so that biased
compressors (topk, signtopk) averaged over many agents do not stall at a noise floor.
Neither is ever on unless asked for.

* :class:`ResidualMemory` (classic EF, as in GRACE): ``v = g + e``; send ``C(v)``;
  ``e <- v - decode(C(v))``.
* :class:`EF21State` (Richtarik, Sokolov, Fatkhullin 2021): send ``c = C(g - h)``, then
  ``h <- h + c``. The aggregator mirrors ``h`` per agent and steps with the mean state.

Both use the *decoded* update (values already rounded to the wire dtype), so the agent and
the aggregator hold bit-identical state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import numpy.typing as npt

from edge_agent.numerics.compressors import Semantics, Update

FloatArray = npt.NDArray[np.float64]


class Feedback(ABC):
    """Agent-side memory wrapped around a compressor: ``prepare`` then ``commit``."""

    semantics: Semantics

    def __init__(self, d: int) -> None:
        self.state = np.zeros(d, dtype=np.float64)

    @abstractmethod
    def prepare(self, g: FloatArray) -> FloatArray:
        """The vector to compress this round."""

    @abstractmethod
    def commit(self, v: FloatArray, update: Update) -> None:
        """Record what was sent (call only once the update is handed to the transport)."""

    def reset(self) -> None:
        self.state[:] = 0.0

    def rescale(self, factor: float) -> None:
        """Multiply the memory by ``factor`` (the residual's step ratio under a decaying
        schedule, numerics/stochastic.py StepRatio; meaningful for classic EF only)."""
        if factor != 1.0:
            self.state *= factor


class NoFeedback(Feedback):
    """Plain CAT: compress the gradient itself."""

    semantics: Semantics = "plain"

    def __init__(self, d: int) -> None:
        self.state = np.zeros(0, dtype=np.float64)

    def prepare(self, g: FloatArray) -> FloatArray:
        return g

    def commit(self, v: FloatArray, update: Update) -> None:
        return None


class ResidualMemory(Feedback):
    """Classic error feedback: the residual ``e`` of every compression is added back next round."""

    semantics: Semantics = "ef"

    def prepare(self, g: FloatArray) -> FloatArray:
        return g + self.state

    def commit(self, v: FloatArray, update: Update) -> None:
        np.copyto(self.state, v)
        update.add_to(self.state, -1.0)


class EF21State(Feedback):
    """EF21: compress the change of the local gradient against the state ``h``."""

    semantics: Semantics = "ef21"

    def prepare(self, g: FloatArray) -> FloatArray:
        return g - self.state

    def commit(self, v: FloatArray, update: Update) -> None:
        update.add_to(self.state)


FEEDBACK: dict[str, type[Feedback]] = {"none": NoFeedback, "ef": ResidualMemory, "ef21": EF21State}
