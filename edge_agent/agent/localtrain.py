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
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from edge_agent.agent.replica import Exchange
from edge_agent.numerics.local import LocalCoefs, anchor_drift, local_steps, member_receive
from edge_agent.protocol.downlink import member_tag

FloatArray = npt.NDArray[np.float64]

__all__ = ["LocalMember"]


class LocalMember:
    """One member's local-training state (see the module doc)."""

    def __init__(self, agent_id: str, d: int) -> None:
        self.d = d
        self.tag = member_tag(agent_id)
        #: the local model (None: not started, or reset: it starts at the anchor)
        self.x: FloatArray | None = None
        self.u: FloatArray = np.zeros(d)
        #: the coefficients of the last communication (None: none yet)
        self.coefs: LocalCoefs | None = None
        #: the change sent for each round not yet answered by a broadcast
        self._sent: dict[int, FloatArray] = {}
        #: local gradient evaluations so far
        self.gradients = 0
        #: whether the aggregator counts this agent (a broadcast listed it as joined)
        self.member = False

    @property
    def started(self) -> bool:
        """Whether this member's state moved away from a fresh start."""
        return self.x is not None and (self.coefs is not None or bool(self._sent))

    def change(
        self, y: FloatArray, v: FloatArray, grad: Callable[[FloatArray], FloatArray]
    ) -> FloatArray:
        """This round's change to send: ``x_i - y_h`` after the local steps (``y_h``: the
        anchor after the same steps); all zero before the first communication."""
        if self.x is None:
            self.x = y.copy()
        if self.coefs is None:
            return np.zeros(self.d)
        steps, gamma = self.coefs.steps, self.coefs.gamma
        local_steps(self.x, self.u, grad, gamma, steps)
        self.gradients += steps
        y_h = y.copy()
        anchor_drift(y_h, v, gamma, steps)  # reads v, changes only y_h
        return self.x - y_h

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
