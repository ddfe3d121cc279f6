"""What the round engine does when an update must not enter the model: the EF21 rejoin
of a refused change's sender, and dropping a round whose step would not be finite.

Functions of :class:`~aggregator.engine.rounds.RoundEngine` kept apart from its round logic; the
checks themselves are :class:`aggregator.engine.guard.UpdateGuard`'s (see its module doc).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggregator.engine.admission import Reject
from aggregator.engine.outbound import Outbound
from aggregator.engine.types import AgentInfo, Effects
from edge_agent.numerics.compressors import Update

if TYPE_CHECKING:
    from aggregator.engine.rounds import RoundEngine


def guarded(
    eng: RoundEngine, agent: str, info: AgentInfo, update: Update, weight: float
) -> tuple[float, float] | Effects:
    """The update's (norm, max |value|) if it may enter the step; raises Reject if not.

    A refused EF21 change is answered instead: the agent already added it to its own
    h_i, so ours and its would stay apart. Its state is dropped and it is asked to rejoin
    fresh, as for an ``ef21_reset`` (the refusal is counted under the guard's reason).
    """
    try:
        return eng._guard.check(
            update,
            agent=agent,
            gamma=eng.gamma(),
            weight=weight,
            x=eng.x,
            acc=eng._mean,
            mirror=eng._ef21,
        )
    except Reject as rej:
        if update.semantics != "ef21":
            raise
        eng._reset_agent_state(agent)
        info.needs_reset = True
        eff = eng._reject(rej.reason, rej.detail, agent)
        return Effects(outbound=(eng._reset_message(agent),), journal=True, reason=eff.reason)


def drop_round(eng: RoundEngine, now: float) -> Effects:
    """The open round's step would make the model non-finite although every update passed
    the guard (the step size grew after they were admitted, e.g. a hello lowered L).

    The round's updates are refused (each counted ``would_diverge``), the model stays as
    it is and the job keeps running (it used to finish as "diverged"). The senders may
    send their updates again: a mean-family sender's de-duplication keys are forgotten;
    every EF21 state is dropped (sum_h held the change that overflowed) and its agent
    asked to rejoin fresh.
    """
    detail = f"round {eng.version} at gamma={eng.gamma():.3g}"
    for _ in range(eng._count):
        eng._reject("would_diverge", detail, None)
    ef21 = eng.family == "ef21"
    out: list[Outbound] = []
    for agent in list(eng._ef21.h if ef21 else eng._contrib):
        eng._reset_agent_state(agent)  # EF21: drops h_i; both: forgets the agent's keys
        if ef21:
            eng.agents[agent].needs_reset = True
            out.append(eng._reset_message(agent))
    eng._guard.round_dropped()
    eng._reset_round(now)
    return Effects(outbound=tuple(out), changed=True)
