"""The job's evaluation objective: the model on ``AGG_EVAL_DATA``, the loss of each version,
and the least that loss can be.

:class:`Evaluation` loads the data once; the engine's evaluator and the floor share it.

:class:`LossFloor` owns the floor ``/status``'s ETA uses while the loss decreases still grow
(aggregator/web/eta.py: the high count needs the least the loss can be). ``AGG_LOSS_FLOOR``:

* a number: that value, as set;
* ``auto`` (the default): with evaluation data, solved on it in a background thread at
  start-up (:func:`edge_agent.numerics.optimum.loss_floor`: L-BFGS, then the strong-convexity
  bound ``f(x) - |grad f(x)|^2 / (2 l2)``, a proven lower bound on the minimum for ``l2 >
  0``); under a second on 10,000 RCV1-like rows at d = 47,236. Until it is solved the floor
  is unknown (the ETA is a lower bound, as without one); if the solve fails it stays
  unknown and one WARNING says why. It is solved again on every start (not checkpointed:
  it depends on the data and the model only);
* ``none``: unknown.

The minimum of the evaluation objective is the floor of the training loss only when the
evaluation data is the training data (the union of the shards, as the demo runs). On a
held-out set the training converges above that minimum, and the ETA's high count is then
too high: set the floor, or ``none``.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Final, Literal

from aggregator.engine.rounds import FloatArray
from aggregator.service.settings import Settings, SettingsError
from edge_agent.data import Dataset, load_dataset
from edge_agent.errors import CatEdgeError
from edge_agent.numerics.models import Model, make_model
from edge_agent.numerics.optimum import loss_floor

log = logging.getLogger("aggregator.service")

#: where the floor comes from (``/status`` ``loss_floor_source``)
FloorSource = Literal["set", "solved", "solving", "failed", "none"]
#: the solver's bounds: gradient norm relative to the start's, and iterations
FLOOR_TOL: Final = 1e-10
FLOOR_MAX_ITER: Final = 5000


class Evaluation:
    """The evaluation model and data of a job (``AGG_EVAL_DATA``, ``AGG_MODEL``, ``AGG_L2``)."""

    def __init__(self, model: Model, data: Dataset, path: Path) -> None:
        self.model = model
        self.data = data
        self.path = path

    @classmethod
    def load(cls, settings: Settings) -> Evaluation | None:
        """The evaluation of ``settings``, or None when ``AGG_EVAL_DATA`` is unset."""
        s, path = settings, settings.eval_data
        if path is None:
            return None
        n_features = s.d // s.n_classes if s.model == "softmax" else s.d
        try:
            model = make_model(s.model, n_features=n_features, n_classes=s.n_classes, l2=s.l2)
            data = load_dataset(path, n_features=n_features)
        except CatEdgeError as exc:
            raise SettingsError(f"AGG_EVAL_DATA: {exc}") from None
        if model.d != s.d:
            raise SettingsError(
                f"AGG_D={s.d} does not fit model {s.model} with {n_features} features "
                f"(d={model.d}); fix AGG_D or AGG_N_CLASSES"
            )
        return cls(model, data, path)

    def evaluate(self, x: FloatArray) -> tuple[float, float | None]:
        """``x -> (loss, accuracy)`` on the evaluation data (the engine's evaluator)."""
        return self.model.loss(x, self.data), self.model.accuracy(x, self.data)


class LossFloor:
    """The least the evaluation loss can be (see the module doc). Thread-safe to read."""

    def __init__(
        self,
        setting: float | Literal["auto", "none"],
        evaluation: Evaluation | None,
        *,
        target_loss: float | None = None,
    ) -> None:
        self._evaluation = evaluation if setting == "auto" else None
        self._target = target_loss
        self._stop = threading.Event()
        self._lock = threading.Lock()  # value and source change together
        self._thread: threading.Thread | None = None
        self._value: float | None = None
        self._source: FloorSource = "none"
        if isinstance(setting, float):
            self._value, self._source = setting, "set"
        elif self._evaluation is not None:
            self._source = "solving"

    @property
    def value(self) -> float | None:
        """The floor (None: unknown, or not solved yet)."""
        return self.read()[0]

    @property
    def source(self) -> FloorSource:
        return self.read()[1]

    def read(self) -> tuple[float | None, FloorSource]:
        """The floor and where it came from, read together."""
        with self._lock:
            return self._value, self._source

    def _settle(self, value: float | None, source: FloorSource) -> None:
        with self._lock:
            self._value, self._source = value, source

    def start(self) -> None:
        """Solve in the background when ``auto`` with evaluation data (else nothing)."""
        if self._source == "solving" and self._thread is None:
            self._thread = threading.Thread(target=self._solve, name="loss-floor", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the solver to stop at its next iteration and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the solve; whether it is over (or never ran)."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True

    def _solve(self) -> None:
        ev = self._evaluation
        assert ev is not None
        started = time.perf_counter()
        try:
            floor = loss_floor(ev.model, ev.data, tol=FLOOR_TOL, max_iter=FLOOR_MAX_ITER,
                               stop=self._stop.is_set)  # fmt: skip
        except Exception as exc:  # a broken data set or model must not stop the service
            self._settle(None, "failed")
            log.warning("loss floor (AGG_LOSS_FLOOR=auto) not solved on %s: %s: %s; the "
                        "ETA stays a lower bound while the loss decreases grow", ev.path,
                        type(exc).__name__, exc)  # fmt: skip
            return
        if self._stop.is_set():
            self._settle(None, "none")
            return
        self._settle(floor.value, "solved")
        log.info("loss floor %.12g on %s (%s; L-BFGS %d iterations, gradient norm %.2e, "
                 "%.1f s)", floor.value, ev.path,
                 "a proven lower bound" if floor.certified else "the solver's value, l2 = 0",
                 floor.iterations, floor.grad_norm,
                 time.perf_counter() - started)  # fmt: skip
        if self._target is not None and self._target < floor.value:
            log.warning("AGG_TARGET_LOSS=%g is below the least the evaluation loss can be "
                        "(%.12g on %s): the job will not reach it", self._target,
                        floor.value, ev.path)  # fmt: skip
