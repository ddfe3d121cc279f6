"""When each member's radio may send again, and which members a sync round of an EF21 or
local-training job does not wait for because of it: the fleet's version advances at the cadence of the
members that are due.

A duty-cycled radio (LoRaWAN EU868 at 1 % in each of its sub-bands, Sigfox) must stay
silent for ``airtime * (1/share - 1)`` seconds after every message it sends (``share``: the
profile's ``uplink_duty_share``, the duty cycle times its sub-bands). The aggregator knows
that silence without asking: the member's hello names its profile, and the engine sees the
size of every message it accepts. :class:`Cadence` keeps, per member, the time its uplink is
free again (``up_free_at``), advanced by every journalled message of the member (its
hellos and accepted updates), exactly as the agent advances its own ``_quiet_until``:
``free = max(free, now) + silence``, with ``now`` the time the engine received the message
(the end of its airtime on a real radio). Messages the engine does not journal (repeated
status, duplicates, requests) are left out, so the estimate may end early: the round then
waits for the member a little sooner than needed, never later.

**The rule** (``EngineConfig.cadence``, sync mode, EF21 and local-training jobs): at model version ``v``,
a member is *excused* when its uplink is not free before the round would close anyway, at
its deadline or now if that is past (``up_free_at > max(now, opened_at +
round_deadline_s)``), and its last accepted update
is fewer than ``S = cadence_max_lag`` versions old (or it has none yet). An excused member is neither awaited
(the round closes as ``all_reported`` once the members that are due have reported) nor in
the quorum's base. Its state keeps counting: the EF21 step is ``x <- x - gamma * H / n``
with ``H`` the sum of every member's ``h_i``, fresh or not, and its next change, when its
radio is free, enters ``h_i`` whatever version it was computed at. A member whose last
update is ``S`` or more versions old is awaited again like any member, silent or not: no
``h_i`` in the step is computed at a point more than about ``S`` versions old (the bound
the theory needs, docs/algorithm.md "Members at their own cadence"). So that the bound is
reachable, a member takes part for ``max(K, S + 1)`` versions after its last update (K:
``participation_window``) instead of ``K``.

In a local-training job an excused member is *absent* from the communication (its change
counts 0 on both sides, docs/wire-format.md 4.3.1: its control variate and the aggregator's
mirror of it follow the broadcast) and does not leave the membership for it: its absences
are bounded by ``S`` the same way, and the hub keeps members absent up to ``max(K, S + 1)``
communications (docs/algorithm.md "Local training").

Plain (mean-family) jobs keep waiting: there is no state to keep counting, and re-using a
member's last update in every version would apply the same gradient many times, weighting
the slow members' data by how long they are silent.

The engine has no clock: ``now`` is the input's time, journalled with it. ``up_free_at`` is
checkpointed (:meth:`Cadence.export`), so a replay rebuilds the same decisions.
"""

from __future__ import annotations

from typing import Any

from aggregator.engine.accounting import Pricer
from aggregator.engine.openround import OpenRound
from aggregator.engine.registry import AgentRegistry, Participation
from aggregator.engine.types import AgentInfo, EngineConfig
from edge_agent.protocol.downlink import Family


class Cadence:
    """Each member's uplink free-at time and the excuses it gives (see the module doc)."""

    def __init__(self, pricer: Pricer, config: EngineConfig) -> None:
        self.enabled = config.cadence and config.mode == "sync"
        self.max_lag = config.cadence_max_lag
        #: the participation window with cadence: a member lagging S versions still counts
        self.window = config.participation_span
        self.deadline_s = config.round_deadline_s
        self._pricer = pricer
        self._free_at: dict[str, float] = {}
        self._latest = 0.0  # the latest input time seen (for reads without a time)

    def up_free_at(self, agent: str) -> float:
        """When ``agent``'s uplink may send again (0.0: never heard, or no duty cycle)."""
        return self._free_at.get(agent, 0.0)

    def heard(self, agent: str, profile: str, size: int, now: float) -> None:
        """A journalled message of ``size`` bytes from ``agent`` (on ``profile``) at ``now``:
        its radio owes the profile's duty-cycle silence after it."""
        self._latest = max(self._latest, now)
        silence_s = self._pricer.up_silence_s(profile, size)
        if silence_s > 0.0:
            self._free_at[agent] = max(self._free_at.get(agent, 0.0), now) + silence_s

    def excused(self, info: AgentInfo, version: int, close_by: float) -> bool:
        """Whether the round at ``version``, which would close by ``close_by`` anyway (its
        deadline), does not wait for ``info``."""
        if self._free_at.get(info.agent, 0.0) <= close_by:
            return False
        return info.last_round is None or version - info.last_round < self.max_lag

    def counted(
        self,
        registry: AgentRegistry,
        round: OpenRound,
        version: int,
        now: float | None,
        family: Family | None,
    ) -> Participation:
        """Who the open ``round`` counts at ``now`` (None: the latest input's time): the
        registry's participation, less the excused members when the rule applies (an
        EF21 or local-training job in sync mode with ``cadence`` on)."""
        if not (self.enabled and family in ("ef21", "local")):
            return registry.counted(version)
        opened = round.opened_at
        at = self._latest if now is None else now
        close_by = max(at, (at if opened is None else opened) + self.deadline_s)
        excused = frozenset(a.agent for a in registry if self.excused(a, version, close_by))
        return registry.counted(version, excused=excused, window=self.window)

    # ------------------------------------------------------------------ persistence

    def export(self) -> dict[str, Any]:
        """The checkpoint's ``cadence`` meta."""
        return {"up_free_at": dict(self._free_at), "latest": self._latest}

    def restore(self, meta: dict[str, Any] | None) -> None:
        """Load :meth:`export` (None: a checkpoint from before cadence, nothing known)."""
        meta = meta or {}
        self._free_at = {str(a): float(t) for a, t in meta.get("up_free_at", {}).items()}
        self._latest = float(meta.get("latest", 0.0))
