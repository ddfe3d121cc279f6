"""The model one job serves and the state its steps need: ``x``, the update family, the
EF21 mirror (:mod:`edge_agent.numerics.aggregation`), the local-training hub of a ``local``
job (:class:`edge_agent.numerics.local.LocalHub`: ``x`` is then the anchor ``y``), the
update guard and the broadcast of each new version. :class:`JobModel` is the only writer
of that state; it exports and restores it itself (the checkpoint's ``x``, ``h``, ``sum_h``
arrays and its ``family``, ``downlink``, ``guard`` and ``local`` meta; a local job keeps
its members' mirrored control variates in ``h`` and the anchor's ``v`` in ``sum_h``)."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from aggregator.engine import stepsize
from aggregator.engine.accounting import Pricer
from aggregator.engine.downlink.broadcast import (
    Broadcast,
    DownPrice,
    array_from_b64,
    b64_array,
)
from aggregator.engine.downlink.outbound import Outbound
from aggregator.engine.guard import UpdateGuard
from aggregator.engine.openround import OpenRound
from aggregator.engine.robust_round import downlink
from aggregator.engine.types import EngineConfig, EngineSnapshot, Evaluator, FloatArray
from edge_agent.numerics.aggregation import EF21Mirror, StepResult
from edge_agent.numerics.compressors import Update
from edge_agent.numerics.local import LocalHub
from edge_agent.protocol import downlink as dl
from edge_agent.protocol import messages, topics, wire
from edge_agent.protocol.downlink import Family

log = logging.getLogger("aggregator.engine.rounds")


class JobModel:
    """``x`` and what stepping and broadcasting it needs (see the module doc)."""

    def __init__(
        self,
        config: EngineConfig,
        x0: FloatArray | None,
        pricer: Pricer,
        evaluator: Evaluator | None = None,
    ) -> None:
        self.config = config
        d = config.d
        self.x: FloatArray = np.zeros(d) if x0 is None else np.array(x0, dtype=np.float64)
        if self.x.shape != (d,):
            raise ValueError(f"x0 must have shape ({d},), got {self.x.shape}")
        self.family: Family | None = None
        #: ``x -> (loss, accuracy or None)``, called by :meth:`evaluate`
        self.evaluator = evaluator
        self.loss: float | None = None
        self.accuracy: float | None = None
        self._failed = False  # an evaluation failed (logged once)
        self._pricer = pricer
        self._ef21 = EF21Mirror(d)
        self._guard = UpdateGuard(config.limits)
        self._gamma: float | None = None  # cached step size (hellos change it)
        mode = downlink(config.aggregation, config.downlink)
        relay = config.aggregation.kind == "mean"  # replicas replay only a mean step
        self._down = Broadcast(config.job, d, mode, window=config.downlink_window, relay=relay)
        #: local training (feedback ``local``): v, e and the members' mirrored u_i
        self._local = (
            None
            if config.local is None
            else LocalHub(
                d,
                config.local,
                max_absent=config.participation_span,
                seed=zlib.crc32(config.job.encode()),
            )
        )
        #: local training: the LOCAL operation of the version being closed (set by
        #: :meth:`step`, sent by :meth:`stepped` in the same close; never checkpointed)
        self._local_op: bytes | None = None

    # ------------------------------------------------------------------ reading

    @property
    def mirror(self) -> EF21Mirror:
        """The EF21 states (read them only)."""
        return self._ef21

    @property
    def local_hub(self) -> LocalHub | None:
        """A local job's hub: v, e and the members' mirrored u_i (read it only)."""
        return self._local

    @property
    def t_down(self) -> int | None:
        """The last compressed broadcast's level T (None: none yet)."""
        return self._down.t_down

    @property
    def broadcast_model(self) -> FloatArray:
        """The model the agents hold: ``x`` (local training too), or the compressed
        downlink's ``w``."""
        if self._local is not None:
            return self.x
        return self._down.model(self.x)

    def gamma(self, hellos: Iterable[messages.Hello], version: int = 0) -> float:
        """The step size at ``version``: configured, else 1/L from ``hellos`` (cached until
        :meth:`hellos_changed`; see :meth:`aggregator.engine.rounds.RoundEngine.gamma`),
        decayed by the stochastic schedule when the job sets one (``schedule_l2``)."""
        cfg = self.config
        if cfg.step_size is not None:
            base = cfg.step_size
        else:
            if self._gamma is None:
                factor = cfg.ef21_step_factor if self.family == "ef21" else 1.0
                if cfg.local is not None:
                    factor = cfg.local.factor
                self._gamma = stepsize.gamma(list(hellos), cfg.step_rule, cfg.limits, factor)
            base = self._gamma
        return stepsize.scheduled(base, version, cfg.schedule_l2, cfg.schedule_t0)

    def snapshot(self, version: int) -> Outbound:
        """The retained state snapshot of ``x`` at ``version`` (local training: the anchor
        and its ``v``)."""
        if self._local is not None:
            blob = dl.encode_state(self.x, job=self.config.job, version=version,
                                   aggregate=self._local.v)  # fmt: skip
            return Outbound(topics.model(self.config.job), blob, retain=True)
        return self._down.snapshot(self.x, version, self._ef21.sum_h, self.family)

    def settle(self, version: int) -> Outbound | None:
        """What makes every copy ``x`` when the job ends between versions (None: they are)."""
        if self._local is not None:
            return None  # every copy of the anchor is exact
        return self._down.settle(self.x, version, self._ef21.sum_h, self.family)

    def catch_up(self, have: int | None, version: int) -> Outbound | None:
        """The merged steps from ``have`` to ``version`` (None: not held)."""
        return self._down.catch_up(have, version)

    def latest(self, version: int) -> Outbound | None:
        """The broadcast that ended at ``version``, if held (None: a snapshot must go)."""
        return self._down.latest(version)

    # ------------------------------------------------------------------ changes

    def evaluate(self) -> None:
        """The loss (and accuracy) of ``x``, if there is an evaluator (a failure is logged
        once and keeps the last values)."""
        if self.evaluator is None:
            return
        try:
            loss, accuracy = self.evaluator(self.x)
        except Exception as exc:
            if not self._failed:
                self._failed = True
                log.warning("evaluation failed: %s", exc)
            return
        self.loss = float(loss)
        self.accuracy = None if accuracy is None else float(accuracy)

    def hellos_changed(self) -> None:
        """A hello may change L (rows, smoothness) or the family: forget the step size."""
        self._gamma = None

    def set_family(self, family: Family) -> bool:
        """The job runs ``family``; return whether it switched from another one."""
        switched = self.family is not None and self.family != family
        self.family = family
        return switched

    def check(
        self, update: Update, agent: str, gamma: float, weight: float, acc: OpenRound
    ) -> tuple[float, float]:
        """The update's (norm, max |value|) if it may enter the step; raises Reject if not
        (:class:`~aggregator.engine.guard.UpdateGuard`)."""
        return self._guard.check(
            update,
            agent=agent,
            gamma=gamma,
            weight=weight,
            x=self.x,
            acc=acc.accumulator,
            mirror=self._ef21,
        )

    def apply(
        self,
        agent: str,
        header: wire.UpdateHeader,
        update: Update,
        blob: bytes,
        *,
        contributes: bool,
        weight: float,
        norms: tuple[float, float],
    ) -> None:
        """An admitted update: the EF21 state it changes, what the broadcast replays, and
        the guard's bounds (``norms`` from :meth:`check`)."""
        ef21 = header.semantics == "ef21"
        if self._local is not None:
            if contributes:
                self._local.accepted(agent, update)
        elif ef21:
            self._ef21.apply(agent, update)
            self._down.add(blob, header.t, 1.0)
        elif contributes:
            self._down.add(blob, header.t, weight)
        self._guard.accepted(agent, *norms, ef21=ef21, weight=weight)

    def reset_agent(self, agent: str) -> None:
        """Drop ``agent``'s EF21 state (none: nothing); in a local job its membership and
        mirrored control variate (it joins again with its next change)."""
        if self._local is not None:
            self._local.reset(agent)
            return
        h = self._ef21.h.get(agent)
        self._ef21.reset_agent(agent)
        if h is not None:
            self._guard.state_dropped(h)
            self._down.drop_state(h, none_left=not self._ef21.h)

    def step(
        self,
        round: OpenRound,
        gamma: float,
        profiles: Iterable[tuple[str, str | None]] = (),
    ) -> tuple[StepResult, float]:
        """Step ``x`` in place with the open round's state (docs/algorithm.md); returns what
        the step did and its coefficient (replicas step with the same one). EF21 averages
        the states over the agents that hold one (an accepted change, h_i kept): ids that
        only said hello hold none and do not shrink the step. A local job communicates
        (``profiles`` price the broadcast)."""
        if self._local is not None:
            return self._communicate(round, gamma, self._pricer.down_prices(profiles))
        if self.family == "ef21":
            n_agents = max(1, len(self._ef21.h))
            # async: only `count` of the n states are fresh; a full step per K updates
            # would re-apply stale states n/K times per refresh of all agents
            fresh = 1.0 if self.config.mode == "sync" else min(1.0, round.count / n_agents)
            coef = gamma * fresh / n_agents
            return self._ef21.step(self.x, coef), coef
        coef = gamma / round.count
        return round.step(self.x, coef), coef

    def _communicate(
        self, round: OpenRound, gamma: float, prices: list[DownPrice]
    ) -> tuple[StepResult, float]:
        """Local training: one communication of the hub on ``x`` (the anchor); the LOCAL
        operation that replays it waits in ``_local_op`` for :meth:`stepped`."""
        hub, cfg = self._local, self.config
        assert hub is not None and cfg.local is not None
        coefs = hub.coefs(gamma)
        old = self.x.copy()
        done = hub.close(self.x, round.accumulator.export(),
                         lambda r: self._down.compress_change(r, prices), coefs)  # fmt: skip
        if done is None:
            return StepResult(np.zeros(0, dtype=np.int64), False), coefs.gamma
        cast, who = done
        self._local_op = dl.local_op(cast, coefs, job=cfg.job, absent=who.absent,
                                     joined=who.joined, left=who.left)  # fmt: skip
        return StepResult(np.flatnonzero(self.x != old), True), coefs.gamma

    def stepped(
        self,
        step: StepResult,
        base: int,
        version: int,
        coef: float,
        profiles: Iterable[tuple[str, str | None]],
        *,
        final: bool = False,
    ) -> list[Outbound]:
        """``x`` stepped from ``base`` to ``version``: what the fleet receives (priced on
        the receivers' (profile, shared group or None) for the compressed and the
        automatic downlink). ``final``: the job ends with this version, whose broadcast
        makes every copy exact whatever the downlink mode."""
        cfg = self.config
        self._guard.stepped(self.x, step.changed)
        if self._local is not None:
            op, self._local_op = self._local_op, None
            assert op is not None  # step() made it in this close
            out = [self._down.local(base, version, op)]
            if cfg.snapshot_every and version % cfg.snapshot_every == 0:
                out.append(self.snapshot(version))
            return out
        sent = self._down.close(
            x=self.x,
            changed=step.changed,
            base=base,
            version=version,
            family=self.family or "mean",
            coef=coef,
            prices=self._pricer.down_prices(profiles),
            aggregate=self._ef21.sum_h,
            final=final,
        )
        out = [sent or self.snapshot(version)]
        if sent is not None and cfg.snapshot_every and version % cfg.snapshot_every == 0:
            out.append(self.snapshot(version))
        return out

    def round_dropped(self) -> None:
        self._guard.round_dropped()
        if self._local is not None:
            self._local.round_dropped()

    # ------------------------------------------------------------------ persistence

    def export(self) -> dict[str, Any]:
        """The arrays of :class:`EngineSnapshot` (but ``acc`` and ``seen``) and the meta keys
        ``family``, ``downlink`` and ``guard``."""
        h_agents, h, sum_h = self._ef21.export()
        local: dict[str, Any] | None = None
        if self._local is not None:
            state = self._local.export()
            h_agents, h, sum_h = state["u_agents"], state["u"], state["v"]
            local = {
                "gamma": state["gamma"],
                "draws": state["draws"],
                "absences": state["absences"],
                "e": b64_array(state["e"]),
            }
        return {
            "arrays": {
                "x": self.x.copy(),
                "h_agents": h_agents,
                "h": h,
                "sum_h": sum_h,
            },
            "meta": {
                "family": self.family,
                "loss": self.loss,
                "accuracy": self.accuracy,
                "downlink": self._down.export(),
                "guard": self._guard.export(),
                "local": local,
            },
        }

    def restore(self, snap: EngineSnapshot) -> None:
        """Load a checkpoint (raises ValueError)."""
        meta = snap.meta
        self.x = np.array(snap.x, dtype=np.float64)
        self.family = meta["family"]
        self.loss, self.accuracy = meta["loss"], meta["accuracy"]
        if self._local is not None:
            self._restore_local(snap)
        else:
            self._ef21 = EF21Mirror.restore(self.config.d, snap.h_agents, snap.h, snap.sum_h)
        self._down.restore(meta.get("downlink"))
        self._guard.restore(meta.get("guard"))  # None in a checkpoint from before the guard
        self._guard.sync(self.x, snap.acc, self._ef21)

    def _restore_local(self, snap: EngineSnapshot) -> None:
        """A local job's hub from the checkpoint (see the module doc); raises ValueError."""
        assert self._local is not None
        saved = snap.meta.get("local")
        if not isinstance(saved, dict):
            raise ValueError("checkpoint of a local-training job without its local state")
        d = self.config.d
        e = array_from_b64(saved["e"], d)
        v = snap.sum_h if snap.sum_h.size else np.zeros(d)
        if e is None:
            raise ValueError("local-training state: e does not fit d")
        keep = ("gamma", "draws", "absences")
        self._local.restore({**{k: saved.get(k) for k in keep},
                             "u_agents": snap.h_agents, "u": snap.h, "v": v, "e": e})  # fmt: skip
