"""When the open round of a job closes, and when the job is done: the closing policy.

:class:`Closing` decides; the engine applies what it decides (the step, the record and the
broadcast of the new version, :class:`aggregator.engine.rounds.RoundEngine`). It owns the
members' cadence (:class:`~aggregator.engine.cadence.Cadence`: when each duty-cycled radio
may send again; it exports and restores it itself, the checkpoint's ``cadence``) and reads,
never changes, the registry and the open round it is given:

* **who a sync round counts** (:meth:`Closing.counted`): the registry's participation
  (:mod:`aggregator.engine.registry`: the agents taking part and the newcomers), less the
  members the cadence excuses (:mod:`aggregator.engine.cadence`), and the **quorum** a
  round needs at its deadline (:meth:`Closing.quorum`);
* **why the round closes now** (:meth:`Closing.reason`): the job runs, an update
  contributed, and the mode's rule holds (:meth:`aggregator.engine.openround.OpenRound.close_reason`:
  ``all_reported`` or ``deadline`` in sync mode, ``async`` every ``async_apply_every``
  contributions; a robust rule's minimum first). Downlinks aside: with pacing, the
  engine then asks the downlink traffic whether the links are free
  (:meth:`aggregator.engine.downlink.pacing.DownlinkTraffic.may_close`);
* **whether the job is done** with the version just committed (:meth:`Closing.done`):
  ``max_rounds`` versions, or the loss at ``target_loss``.
"""

from __future__ import annotations

from typing import Any

from aggregator.engine.accounting import Pricer
from aggregator.engine.cadence import Cadence
from aggregator.engine.openround import OpenRound
from aggregator.engine.registry import AgentRegistry, Participation
from aggregator.engine.types import EngineConfig, EngineStateName
from edge_agent.protocol.downlink import Family


class Closing:
    """The closing policy of one job's rounds (see the module doc)."""

    def __init__(
        self, config: EngineConfig, pricer: Pricer, *, registry: AgentRegistry, round: OpenRound
    ) -> None:
        self.config = config
        #: duty cycles: who a round excuses (read it; :meth:`heard` changes it)
        self.cadence = Cadence(pricer, config)
        self._registry = registry  # read only
        self._round = round  # read only

    def counted(self, version: int, family: Family | None, now: float | None) -> Participation:
        """Who the open sync round of ``version`` counts at ``now`` (None: the latest input's
        time)."""
        return self.cadence.counted(self._registry, self._round, version, now, family)

    def quorum(self, base: int) -> int:
        """Contributions a sync round counting ``base`` agents needs at its deadline: a
        fraction of them, at least ``quorum_min_agents``."""
        cfg = self.config
        return self._registry.quorum(base, cfg.quorum_min_agents, cfg.quorum_fraction)

    def reason(
        self, now: float, *, state: EngineStateName, version: int, family: Family | None
    ) -> str | None:
        """Why the open round closes at ``now``, downlinks aside (None: it does not)."""
        if state != "running" or not self._round:
            return None
        counted = self.counted(version, family, now) if self.config.mode == "sync" else None
        return self._round.close_reason(now, self.config, counted, self.quorum)

    def done(self, version: int, loss: float | None) -> str | None:
        """Why the job ends with ``version`` just committed at ``loss`` (None: it goes on)."""
        cfg = self.config
        if cfg.max_rounds is not None and version >= cfg.max_rounds:
            return f"reached max_rounds={cfg.max_rounds}"
        if cfg.target_loss is not None and loss is not None and loss <= cfg.target_loss:
            return f"loss {loss:.6g} <= target_loss {cfg.target_loss:g}"
        return None

    # ------------------------------------------------------------------ changes

    def heard(self, agent: str, profile: str, size: int, now: float) -> None:
        """A journalled message of ``size`` bytes from ``agent`` at ``now`` (a hello or an
        accepted update): its radio owes the duty-cycle silence after it."""
        self.cadence.heard(agent, profile, size, now)

    # ------------------------------------------------------------------ persistence

    def export(self) -> dict[str, Any]:
        """The checkpoint's ``cadence``."""
        return self.cadence.export()

    def restore(self, meta: dict[str, Any] | None) -> None:
        """Load :meth:`export` (None: a checkpoint from before cadence)."""
        self.cadence.restore(meta)
