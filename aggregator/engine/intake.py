"""The intake of updates: what becomes of one update, and the keys of those applied.

:class:`UpdateIntake` is the only owner of the job's de-duplication keys
(:class:`~aggregator.engine.dedupe.SeenKeys`: the (agent, round, seq) of every update
applied within ``dedupe_window`` versions); it exports and restores them itself (the
checkpoint's ``seen`` array). For each update the engine hands it, :meth:`UpdateIntake.judge`
validates it against the job and its sender's hello
(:func:`~aggregator.engine.admission.check_update`), then decides, reading (never changing)
the model, the registry, the open round and the downlink traffic, and returns a verdict
that the engine applies:

* :class:`Admit`: the update is applied, entering this round's step or not (sync: computed
  at this version, and the agent's first for it; async: within ``max_staleness``, weighted
  ``1/(1+staleness)``), with the norms the update guard measured
  (:class:`~aggregator.engine.guard.UpdateGuard`, held by the model);
* :class:`Refresh`: a re-send of an update applied to this version while the round waits
  for downlinks: the agent is alive, nothing is refused;
* :class:`Answer`: refused, and answered with the steps (or the snapshot) the agent misses
  on its own topic: a re-send of an update applied to an older version (``duplicate``),
  or a mean-family update for a round that closed without it (``stale``); without the
  model it would re-send forever;
* :class:`Rejoin`: an EF21 change that cannot be applied exactly once (older than the
  de-duplication window: ``ef21_reset``; or refused by the guard, after the agent added it
  to its own h_i): the agent's state is dropped and it is asked to rejoin fresh.

Anything else refused (a bad update, a replayed seq, a finished job, a future version, a
stale plain update, a paused round, a guard refusal of a mean-family update) raises
:class:`~aggregator.engine.admission.Reject`: counted, and answered only when the reason
concerns the sender (:mod:`aggregator.engine.refusals`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from aggregator.engine import admission
from aggregator.engine.admission import Decoded, Reject
from aggregator.engine.dedupe import SeenKeys
from aggregator.engine.downlink.pacing import DownlinkTraffic
from aggregator.engine.model import JobModel
from aggregator.engine.openround import OpenRound
from aggregator.engine.registry import AgentRegistry
from aggregator.engine.types import AgentInfo, EngineConfig, EngineStateName
from edge_agent.numerics.compressors import Update
from edge_agent.protocol import wire

log = logging.getLogger("aggregator.engine.rounds")


@dataclass(frozen=True, slots=True)
class Admit:
    """Apply the update; ``contributes``: it enters this round's step, with ``weight``;
    ``norms``: its (norm, max |value|), for the guard's bounds."""

    info: AgentInfo
    header: wire.UpdateHeader
    update: Update
    contributes: bool
    weight: float
    norms: tuple[float, float]


@dataclass(frozen=True, slots=True)
class Refresh:
    """A re-send while the round waits for downlinks: its sender is alive."""


@dataclass(frozen=True, slots=True)
class Answer:
    """Refused (``reason``), and answered with what the agent holding ``have`` misses
    (``controls``: with the pause or stop it must see)."""

    reason: str
    detail: str
    have: int
    controls: bool


@dataclass(frozen=True, slots=True)
class Rejoin:
    """Refused (``reason``): the agent must rejoin fresh; ``drop``: drop its state now
    (else it was dropped already and the reset is only repeated)."""

    reason: str
    detail: str
    drop: bool


Verdict = Admit | Refresh | Answer | Rejoin


class UpdateIntake:
    """The de-duplication keys and the admission rule of updates (see the module doc)."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        model: JobModel,
        registry: AgentRegistry,
        round: OpenRound,
        traffic: DownlinkTraffic,
    ) -> None:
        self.config = config
        self._model = model  # read only: the guard's check and the step size
        self._registry = registry  # read only: the sender's record
        self._round = round  # read only: does the update enter this round's step
        self._traffic = traffic  # read only: is the round held by downlinks
        self._seen = SeenKeys()

    # ------------------------------------------------------------------ reading

    @property
    def seen_keys(self) -> SeenKeys:
        """The de-duplication keys (read them only)."""
        return self._seen

    def highest(self, agent: str) -> int | None:
        """The highest seq of ``agent`` among the keys kept (None: none kept)."""
        return self._seen.highest(agent)

    def judge(
        self,
        agent: str,
        blob: bytes,
        decoded: Decoded | None,
        now: float,
        *,
        version: int,
        state: EngineStateName,
    ) -> Verdict:
        """What becomes of the update ``blob`` of ``agent`` at ``now``, the model being at
        ``version`` and the job ``state`` (see the module doc); raises Reject when it is
        refused without an answer. Changes nothing."""
        cfg = self.config
        info = self._registry.get(agent)
        header, update = admission.check_update(blob, decoded, agent=agent, job=cfg.job, d=cfg.d,
                                                hello=None if info is None else info.hello,
                                                mac=cfg.mac)  # fmt: skip
        assert info is not None  # check_update rejects an agent without a hello
        if self._seen.contains(agent, header.round, header.seq):
            return self._duplicate(agent, header, now, version)
        if header.seq < info.seq_floor:  # below what its last authenticated hello allowed
            raise Reject("replayed", f"{agent}: seq {header.seq} < {info.seq_floor}")
        if state == "finished":
            raise Reject("finished")
        if header.round > version:
            raise Reject("future_version", f"{agent}: round {header.round} > version {version}")
        staleness = version - header.round
        ef21 = header.semantics == "ef21"
        if ef21 and (info.needs_reset or staleness > cfg.dedupe_window):
            return self._ef21_reset(agent, info, staleness)
        if staleness > cfg.dedupe_window:
            raise Reject("stale", f"{agent}: {staleness} versions old (beyond the dedupe window)")
        paused = state == "paused"
        contributes = self._round.admits(agent, header.round, staleness, ef21, config=cfg,
                                         paused=paused, last_round=info.last_round)  # fmt: skip
        if not ef21 and not contributes:
            if paused:
                raise Reject("paused", f"{agent}: round {header.round}")
            # The round closed without this agent (deadline + quorum) and it may have missed
            # the delta: answer with the model, or it would re-send this update forever.
            return Answer("stale", f"{agent}: round {header.round}", header.round, False)
        weight = 1.0 if cfg.mode == "sync" else 1.0 / (1.0 + staleness)
        gamma = self._model.gamma(self._registry.hellos(), version)
        try:
            norms = self._model.check(update, agent, gamma, weight, self._round)
        except Reject as rej:
            if not ef21:
                raise
            # the agent added the change to its h_i already, so ours and its would differ:
            # counted under the guard's reason, answered as an ef21_reset
            return Rejoin(rej.reason, rej.detail, drop=True)
        return Admit(info, header, update, contributes, weight, norms)

    def _duplicate(
        self, agent: str, header: wire.UpdateHeader, now: float, version: int
    ) -> Verdict:
        """An update whose (round, seq) key was applied already."""
        detail = f"{agent} round {header.round} seq {header.seq}"
        if header.round == version and self._traffic.hold(now, self._registry) is not None:
            return Refresh()  # a re-send while the round waits for downlinks
        if header.round < version:
            # A re-send of an update applied to an older version: the agent never saw the
            # versions since (e.g. a restart recovered a version persisted but not yet
            # published, and ZeroMQ dropped the start-up snapshot before the agent
            # re-subscribed). Without the model it would re-send forever.
            return Answer("duplicate", detail, header.round, True)
        raise Reject("duplicate", detail)

    def _ef21_reset(self, agent: str, info: AgentInfo, staleness: int) -> Rejoin:
        """An EF21 change older than the de-duplication window may or may not have been
        applied already: applying it could count it twice, dropping it would leave the
        agent's h_i and ours apart for good. Drop our h_i instead and ask the agent to zero
        its own and rejoin fresh (refusing its changes until then)."""
        if not info.needs_reset:
            window = self.config.dedupe_window
            log.warning("%s: EF21 update %d versions old (beyond the de-duplication window of "
                        "%d); its state was reset, waiting for a fresh hello", agent, staleness,
                        window)  # fmt: skip
        return Rejoin(
            "ef21_reset", f"{agent}: waiting for a fresh hello", drop=not info.needs_reset
        )

    # ------------------------------------------------------------------ changes

    def applied(self, agent: str, index: int, header: wire.UpdateHeader) -> None:
        """The update ``header`` of ``agent`` (registration ``index``) was applied."""
        self._seen.add(agent, index, header.round, header.seq)

    def forget(self, agent: str, index: int) -> None:
        """Forget ``agent``'s keys: it may send those updates again."""
        self._seen.forget(agent, index)

    def renumber(self, new_index: list[int]) -> None:
        """The registry forgot agents (unproven ones: they hold no key); see
        :meth:`aggregator.engine.dedupe.SeenKeys.renumber`."""
        self._seen.renumber(new_index)

    def prune(self, version: int) -> None:
        """Forget the keys older than the de-duplication window."""
        self._seen.prune(version - self.config.dedupe_window)

    # ------------------------------------------------------------------ persistence

    def export(self) -> npt.NDArray[np.int64]:
        """The keys as rows (agent index, round, seq): the checkpoint's ``seen``."""
        return self._seen.rows()

    def restore(self, rows: npt.NDArray[np.int64], agents: Sequence[str]) -> None:
        """Load :meth:`export` (``agents``: the registry's ids in order; raises ValueError)."""
        self._seen = SeenKeys.restore(rows, agents)
