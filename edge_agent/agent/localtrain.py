"""A member's side of local training (LoCoDL, docs/algorithm.md "Local training").

:class:`LocalMember` owns the agent's local model ``x_i``, its control variate ``u_i``, the
changes it sent and the coefficients of the last communication. The anchor ``y`` and its
``v`` are the replica's (:class:`edge_agent.agent.replica.Replica`: every party replays the
aggregator's LOCAL operations); the equations are :mod:`edge_agent.numerics.local`'s, the
same float operations as the aggregator's mirror of ``u_i``.

A job's first round carries no change: the step ``gamma`` and the number of local steps
come with the aggregator's first broadcast (its LOCAL operation), so until then an agent
sends an empty update. An agent is a *member* from the broadcast that lists it as joined
(its first change entered) until one lists it as left (absent too long) or it resets; a
change of an agent that is not a member is discarded on both sides, and the agent starts
again from the anchor with ``u_i = 0``.

With a minibatch (``--batch-size``, a fraction 1/k of the shard) every local step uses the
next batch of a random reshuffling in whole passes (:class:`PassSampler`, seeded by the
agent's seed, stream 1); the job's H is then a multiple of k (checked at start-up).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from edge_agent.agent.replica import Exchange
from edge_agent.numerics.local import LocalCoefs, anchor_drift, local_steps, member_receive
from edge_agent.numerics.sampling import PassSampler
from edge_agent.protocol.downlink import member_tag

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.int64]
#: the local gradient at x on the given rows of the shard (None: all of them)
RowsGradient = Callable[[FloatArray, IndexArray | None], FloatArray]

__all__ = ["LocalMember"]


class LocalMember:
    """One member's local-training state (see the module doc)."""

    def __init__(
        self, agent_id: str, d: int, n_rows: int, *, batch_size: float | None = None,
        seed: int = 0,
    ) -> None:  # fmt: skip
        self.d = d
        self.n_rows = n_rows
        #: the minibatch sampler of the local steps (None: full local gradients)
        self.batches = None if batch_size is None else PassSampler.of(batch_size, n_rows, seed)
        self.tag = member_tag(agent_id)
        #: the local model (None: not started, or reset: it starts at the anchor)
        self.x: FloatArray | None = None
        self.u: FloatArray = np.zeros(d)
        #: the coefficients of the last communication (None: none yet)
        self.coefs: LocalCoefs | None = None
        #: the change sent for each round not yet answered by a broadcast
        self._sent: dict[int, FloatArray] = {}
        #: local gradient evaluations so far, and the rows they read
        self.gradients = 0
        self.rows = 0
        #: whether the aggregator counts this agent (a broadcast listed it as joined)
        self.member = False

    @property
    def started(self) -> bool:
        """Whether this member's state moved away from a fresh start."""
        return self.x is not None and (self.coefs is not None or bool(self._sent))

    def skips(self, version: int, held: int | None) -> bool:
        """Whether to leave a job-wide snapshot of ``version`` unloaded while the copy is at
        ``held``: a started member's own state follows every LOCAL operation, so it asks
        for the steps instead (after a restart of the aggregator, its retained snapshot may
        be ahead) and loads a snapshot, starting again, only when one answers it."""
        return self.started and held is not None and version > held

    def change(self, y: FloatArray, v: FloatArray, grad: RowsGradient) -> FloatArray:
        """This round's change to send: ``x_i - y_h`` after the local steps (``y_h``: the
        anchor after the same steps); all zero before the first communication."""
        if self.x is None:
            self.x = y.copy()
        if self.coefs is None:
            return np.zeros(self.d)
        steps, gamma = self.coefs.ahead, self.coefs.gamma
        local_steps(self.x, self.u, self._step_gradient(grad), gamma, steps)
        self.gradients += steps
        y_h = y.copy()
        anchor_drift(y_h, v, gamma, steps)  # reads v, changes only y_h
        return self.x - y_h

    def _step_gradient(self, grad: RowsGradient) -> Callable[[FloatArray], FloatArray]:
        """One local step's gradient: on the next minibatch, or on the whole shard."""

        def at(x: FloatArray) -> FloatArray:
            rows = None if self.batches is None else self.batches.next()
            self.rows += self.n_rows if rows is None else rows.size
            return grad(x, rows)

        return at

    def sent(self, round: int, change: FloatArray) -> None:
        """The change for ``round`` went out as ``change`` (the decoded update's values)."""
        self._sent[round] = change

    def received(self, exchanges: list[Exchange]) -> None:
        """The communications the replica replayed: ``x_i`` and ``u_i`` follow each one
        while this agent is a member, counting its change only where it entered (not
        listed as absent); a member listed as left, or an agent not listed as joined
        before it is a member, starts again (see the module doc)."""
        for ex in exchanges:
            sent = self._sent.pop(ex.version - 1, None)
            for old in [r for r in self._sent if r < ex.version - 1]:
                del self._sent[old]
            self.coefs = ex.coefs
            if self.tag in ex.joined:
                self.member = True
            if self.tag in ex.left or not self.member:
                self.reset()
                continue
            if sent is None or self.tag in ex.absent:
                sent = np.zeros(self.d)
            if self.x is None:
                self.x = ex.y_h.copy()
            member_receive(self.x, self.u, ex.y_h, ex.dt, sent, ex.coefs)

    def reset(self) -> None:
        """The aggregator dropped its mirror of ``u_i`` (or this member lost track): start
        again from ``u_i = 0`` at the anchor (the coefficients stay known)."""
        self.x = None
        self.u = np.zeros(self.d)
        self._sent = {}
        self.member = False
