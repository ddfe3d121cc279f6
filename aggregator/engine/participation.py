"""Which registered agents a sync round counts: its quorum and its "everyone reported".

Registering costs an agent one hello; taking part costs it updates. Counting every live
registered agent let anyone who can send hellos (20,000 invented ids over ZeroMQ) raise
the quorum beyond what the real agents can reach, and no round closed again. So, with
``K = EngineConfig.participation_window`` (model versions), at model version ``v``:

* an agent **takes part** when it is live and had an update accepted for one of the
  last ``K`` rounds (its last accepted update's round ``> v - K``; the open round is
  round ``v``). The deadline quorum is a fraction of these agents (at least
  ``quorum_min_agents``);
* a **newcomer** is a live agent with no accepted update yet that joined fewer than ``K``
  versions ago (at version ``> v - K``). The round waits for newcomers before it closes
  as ``all_reported`` (a new agent's first update is not left out of the round it
  joined in), and they join the quorum's base, but at most as many as take part: the
  quorum is ``max(quorum_min_agents, ceil(quorum_fraction * n))`` with
  ``n = taking_part + min(newcomers, taking_part)``.

What it costs: hellos from agents that never send an update can at most double the
quorum's base (with ``quorum_fraction <= 0.5`` the agents that take part always reach
it) and make rounds wait for their deadline, for ``K`` versions; an agent whose updates stop being
accepted (silent, refused, or late beyond ``K`` versions) stops counting after ``K``
versions and counts again from its next accepted update. Dead agents (liveness timeout)
never count. The number of registered agents is capped separately
(``EngineConfig.max_agents``, :func:`aggregator.engine.admission.check_capacity`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from aggregator.engine.types import AgentInfo


@dataclass(frozen=True, slots=True)
class Participation:
    """The agents a sync round counts at one model version (ids)."""

    #: live agents with an accepted update for one of the last K versions (the quorum base)
    taking_part: frozenset[str]
    #: the round closes as ``all_reported`` once all of these contributed (taking part or new)
    awaited: frozenset[str]

    @property
    def quorum_base(self) -> int:
        """``n`` of the quorum: those taking part and at most as many newcomers."""
        taking = len(self.taking_part)
        return taking + min(len(self.awaited) - taking, taking)


def takes_part(info: AgentInfo, version: int, window: int) -> bool:
    """Whether ``info`` is live with an accepted update for one of the last ``window``
    rounds (the open round being round ``version``)."""
    return info.live and info.last_round is not None and version - info.last_round < window


def is_newcomer(info: AgentInfo, version: int, window: int) -> bool:
    """Whether ``info`` is live, has no accepted update yet and joined fewer than
    ``window`` versions ago."""
    return info.live and info.last_round is None and version - info.joined_version < window


def participation(agents: Iterable[AgentInfo], version: int, window: int) -> Participation:
    """Who takes part and who is awaited at ``version`` (see the module doc)."""
    taking: set[str] = set()
    new: set[str] = set()
    for info in agents:
        if takes_part(info, version, window):
            taking.add(info.agent)
        elif is_newcomer(info, version, window):
            new.add(info.agent)
    return Participation(frozenset(taking), frozenset(taking | new))
