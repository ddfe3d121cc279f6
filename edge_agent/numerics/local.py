"""Local training with drift correction and compressed changes both ways (docs/algorithm.md,
"Local training").

The method follows LoCoDL (Condat, Maranjyan and Richtarik, 2024): every agent ``i`` keeps
a local model ``x_i`` and a control variate ``u_i``; every party keeps the same *anchor*
``y`` and its control variate ``v``. One local step (no communication) is

    x_i <- x_i - gamma * grad f_i(x_i) + gamma * u_i          (every agent)
    y   <- y + gamma * v                                      (g = 0: the l2 term is in f_i)

and on a communication step (every H-th step, or with probability p) after it

    d_i   = C_i(x_i - y)                                      (uplink: agent i sends d_i)
    dbar  = (1 / ((1 + a) n)) sum_i d_i                       (the aggregator)
    dt    = C_0(dbar + e);  e <- dbar + e - dt               (downlink, with error memory)
    x_i  <- (1 - rho) x_i + rho (y + dt)
    u_i  <- u_i + c (dt - d_i),   v <- v + (c / a) dt,   c = p chi / gamma
    y    <- y + rho dt

The model is the anchor ``y``, which every party holds after a broadcast (with rho = 1
every ``x_i`` equals it too). ``a`` is the anchor's weight in the consensus relative to all the agents'
(LoCoDL: a = 1, dbar = sum_i d_i / (2n); a -> 0 is compressed Scaffnew).
``sum_i u_i + n a v + (1 + a) n c e`` is invariant (0 from zero start), so at any
fixed point (``x_i = y``, every ``d_i = 0``, ``e = 0``) ``(1/n) sum_i grad f_i(y) = 0``:
the optimum of the mean objective, with no client drift whatever the shards.

What the compressors are is the caller's choice (:class:`Compress`); the simulator uses CAT
sign-top-T on both ways. LoCoDL's analysis asks for unbiased compressors; with the biased
sign-top-T the damping ``chi`` and ``rho`` are measured, not proven (docs/algorithm.md).

Scaffnew/ProxSkip (Mishchenko, Malinovsky, Stich and Richtarik, 2022) is available with
dense communication only: with compressed uploads its averaging step has no correction
for the compression error (it diverged in an independent harness, and our anchor weight
``a -> 0``, which tends to it, diverged at a = 0.1), so :func:`validate` refuses it.

Minibatches (``batch_size``, a fraction 1/k of the shard): every local step uses the next
batch of a random reshuffling (:class:`edge_agent.numerics.sampling.PassSampler`), and the
H steps of a round must make whole passes (H a multiple of k). Measured on the preset class
at 10 % batches: with whole passes the round's change carries little sampling noise and the
method reaches 1e-2; with H = 15 (1.5 passes) the control variates ``u_i`` fill with the
noise of the half pass, as EF21's states do with noisy gradients, and it stalls near 0.5.
The default step is the full-gradient one times ``sqrt(batch_size)`` (docs/algorithm.md).

Pure numpy, no I/O: every random draw comes from an explicit Generator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from edge_agent.numerics.compressors import Update
from edge_agent.numerics.sampling import batches_per_pass

FloatArray = npt.NDArray[np.float64]
LocalMethod = Literal["locodl", "scaffnew"]
LOCAL_METHODS: Final[tuple[LocalMethod, ...]] = ("locodl", "scaffnew")

#: the damping tuned once on the preset problem class (docs/algorithm.md, "Local training")
#: gamma = min(1, STEP_BUDGET / H) / L: the H local steps of a round move about as far as
#: STEP_BUDGET full steps 1/L (tuned: gamma H L of 1.75-2 was best on the preset class)
STEP_BUDGET: Final = 2.0
DEFAULT_CHI: Final = 1.0
DEFAULT_RHO: Final = 0.75
DEFAULT_ANCHOR: Final = 1.0

#: compress a vector (round index, vector) -> the update that travels
Compress = Callable[[int, FloatArray], Update]
#: the local gradient of agent i at x
Gradient = Callable[[int, FloatArray], FloatArray]


@dataclass(frozen=True)
class LocalConfig:
    """How local training runs (the ``aggregator simulate`` flag of each field in brackets).

    ``local_steps`` H (``--local-steps``): communicate at every H-th local step;
    ``comm_prob`` p (``--comm-prob``): instead, after every step with probability p;
    ``step_factor`` (``--local-step-factor``): gamma = step_factor / L (None: the tuned
    ``min(1, STEP_BUDGET p)``, p = 1/H);
    ``chi`` (``--local-chi``) and ``rho`` (``--local-rho``): LoCoDL's damping;
    ``method`` (``--local-method``): locodl or scaffnew (dense only);
    ``anchor`` a (``--local-anchor``): the anchor's weight in the consensus, relative to
    all the agents' (LoCoDL: a = 1);
    ``batch_size`` b (``--batch-size``): each local step on a minibatch, a fraction 1/k of
    the shard (None: full local gradients)."""

    local_steps: int = 5
    comm_prob: float | None = None
    step_factor: float | None = None
    chi: float = DEFAULT_CHI
    rho: float = DEFAULT_RHO
    method: LocalMethod = "locodl"
    anchor: float = DEFAULT_ANCHOR
    batch_size: float | None = None

    @property
    def p(self) -> float:
        """The communication probability (1/H for the deterministic schedule)."""
        return self.comm_prob if self.comm_prob is not None else 1.0 / self.local_steps

    @property
    def schedule(self) -> tuple[int | None, float | None]:
        """``(local_steps, comm_prob)`` as a job announces it and an agent's hello says it:
        the probability when one is set (H then plays no part), else H."""
        return (None, self.comm_prob) if self.comm_prob is not None else (self.local_steps, None)

    @property
    def factor(self) -> float:
        """gamma * L: the configured step factor, else the tuned ``min(1, STEP_BUDGET p)``,
        times ``sqrt(batch_size)`` with minibatches (tuned at 10 %: 0.03 for H = 20)."""
        if self.step_factor is not None:
            return self.step_factor
        scale = 1.0 if self.batch_size is None else float(np.sqrt(self.batch_size))
        return min(1.0, STEP_BUDGET * self.p) * scale


def validate(cfg: LocalConfig, *, uplink: str, downlink: str) -> None:
    """ValueError naming the flag for a configuration that is undefined or known to diverge.

    ``uplink``/``downlink``: the compressor names (``dense`` or a sparsifier)."""
    if cfg.local_steps < 1:
        raise ValueError(f"--local-steps must be >= 1, got {cfg.local_steps}")
    if cfg.comm_prob is not None and not 0.0 < cfg.comm_prob <= 1.0:
        raise ValueError(f"--comm-prob must lie in (0, 1], got {cfg.comm_prob}")
    if cfg.step_factor is not None and not 0.0 < cfg.step_factor < 2.0:
        raise ValueError(
            f"--local-step-factor must lie in (0, 2) (gamma = factor/L; local gradient steps "
            f"diverge at 2/L), got {cfg.step_factor}"
        )
    if not 0.0 < cfg.chi <= 1.0:
        raise ValueError(f"--local-chi must lie in (0, 1], got {cfg.chi}")
    if not 0.0 < cfg.rho <= 1.0:
        raise ValueError(f"--local-rho must lie in (0, 1], got {cfg.rho}")
    if not cfg.anchor > 0.0:
        raise ValueError(
            f"--local-anchor must be > 0 (0 is compressed Scaffnew, which diverges), "
            f"got {cfg.anchor}"
        )
    if cfg.batch_size is not None:
        check_passes(cfg.local_steps, cfg.batch_size, comm_prob=cfg.comm_prob)
    if cfg.method not in LOCAL_METHODS:
        raise ValueError(f"--local-method must be one of {', '.join(LOCAL_METHODS)}")
    if cfg.method == "scaffnew" and (uplink != "dense" or downlink != "dense"):
        raise ValueError(
            "--local-method scaffnew: compressed Scaffnew (no correction of the compression "
            "error in its averaging step) diverges; use --local-method locodl with "
            "compression, or a dense method (--methods dense)"
        )


def check_passes(
    local_steps: int,
    batch_size: float,
    *,
    comm_prob: float | None = None,
    names: tuple[str, str] = ("--local-steps", "--batch-size"),
) -> None:
    """ValueError unless ``local_steps`` minibatch steps of ``batch_size`` make whole passes
    over a shard (see the module doc: partial passes stall); ``names``: how the caller
    spells the two settings (flags, or the service's variables)."""
    steps_name, batch_name = names
    try:
        parts = batches_per_pass(batch_size)
    except ValueError as exc:
        raise ValueError(f"{batch_name} {batch_size:g} with {steps_name}: {exc}") from None
    if comm_prob is not None:
        prob_name = "--comm-prob" if steps_name.startswith("--") else "AGG_COMM_PROB"
        raise ValueError(
            f"{prob_name} with {batch_name}: a random communication step cannot keep whole "
            f"passes between messages; use {steps_name} H"
        )
    if local_steps % parts:
        raise ValueError(
            f"{steps_name} {local_steps} with {batch_name} {batch_size:g}: the local steps of a "
            f"round must make whole passes over the shard ({parts} batches a pass; partial "
            f"passes stall, docs/algorithm.md): use a multiple of {parts}, e.g. {2 * parts}"
        )


class Schedule:
    """When to communicate: after every H-th step, or after each step with probability p."""

    def __init__(self, cfg: LocalConfig, rng: np.random.Generator) -> None:
        self.cfg = cfg
        self.rng = rng
        self.steps = 0

    def communicate(self) -> bool:
        """Called once after every local step: is this a communication step?"""
        self.steps += 1
        if self.cfg.comm_prob is not None:
            return bool(self.rng.random() < self.cfg.comm_prob)
        return self.steps % self.cfg.local_steps == 0


@dataclass(frozen=True)
class Exchange:
    """What travelled in one communication: every agent's update, the broadcast."""

    up: tuple[Update, ...]
    down: Update | None


@dataclass(frozen=True)
class LocalCoefs:
    """The coefficients of one communication, as the aggregator applied them and the
    downlink's LOCAL operation carries them (docs/wire-format.md): ``steps`` local steps
    of size ``gamma`` since the last communication, the damping ``rho``, the control
    variates' rate ``c = p chi / gamma`` and the anchor's ``c_v = c / a``;
    ``next_steps``: the local steps of the round this communication opens (None: as many
    as ``steps``, the fixed schedule; a job with a communication probability draws them)."""

    steps: int
    gamma: float
    rho: float
    c: float
    c_v: float
    next_steps: int | None = None

    @property
    def ahead(self) -> int:
        """The local steps every member takes before the next communication."""
        return self.steps if self.next_steps is None else self.next_steps

    @classmethod
    def of(cls, cfg: LocalConfig, gamma: float, *, steps: int | None = None,
           next_steps: int | None = None) -> LocalCoefs:  # fmt: skip
        """``steps``: the elapsed round's (None: the configured H)."""
        c = cfg.p * cfg.chi / gamma
        done = cfg.local_steps if steps is None else steps
        return cls(done, gamma, cfg.rho, c, c / cfg.anchor, next_steps)


#: the most local steps one round may announce (the wire's bound on a LOCAL's counts)
MAX_ROUND_STEPS: Final = 1 << 16


def round_steps(p: float, seed: int, draw: int) -> int:
    """The local steps of a round under a communication probability ``p``: how many steps
    until the first communication when each step communicates with probability ``p``
    (geometric, mean 1/p; at most :data:`MAX_ROUND_STEPS`). Draw number ``draw`` of the
    job's stream ``seed``: the same on a live engine, a restored one and a replay."""
    rng = np.random.default_rng([seed, draw])
    return int(min(MAX_ROUND_STEPS, rng.geometric(p)))


def anchor_drift(y: FloatArray, v: FloatArray, gamma: float, steps: int) -> None:
    """The anchor's local steps, in place: ``y += gamma * v``, ``steps`` times (every party
    performs exactly these float operations, so every copy of ``y`` holds the same bits)."""
    for _ in range(steps):
        y += gamma * v


def anchor_receive(y: FloatArray, v: FloatArray, dt: FloatArray, coefs: LocalCoefs) -> None:
    """A broadcast ``dt`` reaches the anchor, in place: ``y += rho dt``, ``v += c_v dt``."""
    y += coefs.rho * dt
    v += coefs.c_v * dt


def member_receive(
    x: FloatArray, u: FloatArray, y_h: FloatArray, dt: FloatArray, sent: FloatArray,
    coefs: LocalCoefs,
) -> None:  # fmt: skip
    """A broadcast ``dt`` reaches a member (or, row by row, every member), in place:
    ``x <- (1 - rho) x + rho (y_h + dt)`` (``y_h``: the anchor before it) and
    ``u += c (dt - sent)`` (``sent``: the change that member sent, decoded)."""
    x *= 1.0 - coefs.rho
    x += coefs.rho * (y_h + dt)
    variate_receive(u, dt, sent, coefs)


def variate_receive(u: FloatArray, dt: FloatArray, sent: FloatArray, coefs: LocalCoefs) -> None:
    """A member's control variate after a broadcast, in place: ``u += c (dt - sent)`` (the
    member's own update and the aggregator's mirror of it: the same float operations)."""
    u += coefs.c * (dt - sent)


def local_steps(
    x: FloatArray, u: FloatArray, grad: Callable[[FloatArray], FloatArray], gamma: float,
    steps: int,
) -> None:  # fmt: skip
    """A member's local steps, in place: ``x -= gamma (grad(x) - u)``, ``steps`` times."""
    for _ in range(steps):
        x -= gamma * (grad(x) - u)


class LocalTraining:
    """The state of a fleet under local training: every agent's ``x_i``, ``u_i``, and the
    anchor ``y``, ``v`` (the same on every party: they apply the same broadcasts), and the
    aggregator's downlink memory ``e``. See the module doc for the equations."""

    def __init__(self, cfg: LocalConfig, x0: FloatArray, n: int, gamma: float) -> None:
        if n < 1:
            raise ValueError(f"local training needs at least one agent, got {n}")
        if not gamma > 0:
            raise ValueError(f"local training needs a step gamma > 0, got {gamma}")
        self.cfg = cfg
        self.n = n
        self.gamma = gamma
        self.x = np.tile(np.asarray(x0, dtype=np.float64), (n, 1))
        self.u = np.zeros_like(self.x)
        self.y = np.asarray(x0, dtype=np.float64).copy()
        self.v = np.zeros_like(self.y)
        self.e = np.zeros_like(self.y)
        self.gradients = 0  # local gradient evaluations, summed over agents

    @property
    def model(self) -> FloatArray:
        """The consensus model every party holds after a communication (the anchor)."""
        return self.y

    def local_step(self, grad: Gradient) -> None:
        """One local gradient step on every agent, and the anchor's."""
        for i in range(self.n):
            local_steps(self.x[i], self.u[i], partial(grad, i), self.gamma, 1)
        self.gradients += self.n
        anchor_drift(self.y, self.v, self.gamma, 1)

    def communicate(self, k: int, up: Sequence[Compress], down: Compress | None) -> Exchange:
        """Round ``k``'s exchange; ``up[i]`` compresses agent i's change, ``down`` the
        broadcast (None: dense, exact)."""
        if self.cfg.method == "scaffnew":
            return self._scaffnew(k, up)
        sent = tuple(up[i](k, self.x[i] - self.y) for i in range(self.n))
        d = np.zeros((self.n, self.y.size))
        for i, upd in enumerate(sent):
            upd.add_to(d[i])
        dbar = d.sum(axis=0) / ((1.0 + self.cfg.anchor) * self.n)
        cast: Update | None = None
        if down is None:
            dt = dbar
        else:
            want = dbar + self.e
            cast = down(k, want)
            dt = cast.to_dense()
            self.e = want - dt
        coefs = LocalCoefs.of(self.cfg, self.gamma)
        member_receive(self.x, self.u, self.y, dt, d, coefs)
        anchor_receive(self.y, self.v, dt, coefs)
        return Exchange(sent, cast)

    def _scaffnew(self, k: int, up: Sequence[Compress]) -> Exchange:
        """ProxSkip/Scaffnew's communication with dense messages: average the local models,
        ``h_i += (p / gamma) (x_avg - x_i)`` (u_i plays h_i)."""
        sent = tuple(up[i](k, self.x[i] - self.y) for i in range(self.n))
        moved = np.zeros((self.n, self.y.size))
        for i, upd in enumerate(sent):
            upd.add_to(moved[i])
        moved += self.y  # x_i as the aggregator decoded it: sum_i u_i stays exactly 0
        avg = moved.mean(axis=0)
        self.u += (self.cfg.p / self.gamma) * (avg - moved)
        self.x[:] = avg
        self.y = avg.copy()
        self.v[:] = 0.0
        return Exchange(sent, None)


@dataclass(frozen=True)
class Roster:
    """Who one communication counted: the members whose change did not enter it
    (``absent``: they count ``d_i = 0``), the agents it made members (``joined``: their
    first change entered) and the members it dropped (``left``: absent too long)."""

    absent: tuple[str, ...] = ()
    joined: tuple[str, ...] = ()
    left: tuple[str, ...] = ()


class LocalHub:
    """The aggregator's side of local training for one job (the engine's ``local`` family).

    It owns the anchor's control variate ``v``, the downlink memory ``e``, the members and a
    mirror of every member's control variate ``u_i`` (the aggregator knows every ``dt`` and
    every accepted ``d_i``, so it follows each ``u_i`` exactly); the anchor ``y`` is the
    engine's model ``x``, which :meth:`close` changes in place, and ``gamma`` is fixed by
    the first communication.

    ``sum_i u_i + n a v + (1 + a) n c e`` is 0 from the start and every communication keeps
    it (docs/algorithm.md); at a fixed point (``e = 0``, ``v = 0``) it makes ``sum_i u_i =
    0``, i.e. the mean of the members' gradients zero. Members come and go without any
    message of their own: an agent whose first change enters a communication joins with
    ``u_i = 0``, a member that restarts (a fresh hello) or stays absent for ``max_absent``
    communications leaves with its ``u_i``, and either way only ``e``, which the aggregator
    alone holds, is adjusted so that the sum stays 0.
    """

    def __init__(self, d: int, cfg: LocalConfig, max_absent: int = 10, seed: int = 0) -> None:
        if d < 1:
            raise ValueError(f"LocalHub: d must be >= 1, got {d}")
        self.d = d
        self.cfg = cfg
        self.max_absent = max_absent
        #: the stream of the rounds' step counts under ``cfg.comm_prob`` (:func:`round_steps`)
        self.seed = seed
        #: communications so far: the number of the next draw
        self.draws = 0
        self.v: FloatArray = np.zeros(d)
        self.e: FloatArray = np.zeros(d)
        #: the members' mirrored control variates, in the order they joined
        self.u: dict[str, FloatArray] = {}
        #: consecutive communications each member was absent from
        self.absences: dict[str, int] = {}
        #: the local step, fixed by the first communication (None: none yet)
        self.gamma: float | None = None
        #: the open round's accepted changes, by agent, in arrival order
        self._sent: dict[str, Update] = {}

    @property
    def n(self) -> int:
        return len(self.u)

    @property
    def announced(self) -> int | None:
        """The step count the last communication announced for the open round, under a
        communication probability (None: none yet, or a fixed schedule): the last draw."""
        p = self.cfg.comm_prob
        return None if p is None or self.draws == 0 else round_steps(p, self.seed, self.draws - 1)

    def accepted(self, agent: str, update: Update) -> None:
        """An agent's change ``d_i`` entered the open round."""
        self._sent[agent] = update

    def round_dropped(self) -> None:
        self._sent = {}

    def coefs(self, gamma: float) -> LocalCoefs:
        """The coefficients of the next communication: ``gamma`` the first time, then the
        same (a step that changed with the fleet's hellos would break the sum above). With
        a communication probability, ``steps`` is the count the last communication
        announced (1 before the first: its round has no local steps that matter, v = 0)
        and ``next_steps`` the next draw of the job's stream."""
        g = self.gamma if self.gamma is not None else gamma
        p = self.cfg.comm_prob
        if p is None:
            return LocalCoefs.of(self.cfg, g)
        steps = 1 if self.announced is None else self.announced
        return LocalCoefs.of(self.cfg, g, steps=steps,
                             next_steps=round_steps(p, self.seed, self.draws))  # fmt: skip

    def close(
        self,
        y: FloatArray,
        total: FloatArray,
        down: Callable[[FloatArray], Update],
        coefs: LocalCoefs,
    ) -> tuple[Update, Roster] | None:
        """One communication: members join and leave (see the class doc); the anchor's
        ``coefs.steps`` local steps; ``dbar = total / ((1 + a) n)`` (``total``: the sum of
        the round's changes), ``dt = down(dbar + e)``, ``e <- dbar + e - dt``; every
        mirrored ``u_i`` and the anchor. ``y`` changes in place; returns ``dt``'s update and
        who counted, or None when a new value would not be finite (nothing changed)."""
        before = (self.e.copy(), dict(self.u), dict(self.absences))
        joined, left = self._roster(coefs.c)
        absent = tuple(m for m in self.u if m not in self._sent)
        y_new, v_new = y.copy(), self.v.copy()
        anchor_drift(y_new, v_new, coefs.gamma, coefs.steps)
        want = total / ((1.0 + self.cfg.anchor) * max(1, self.n)) + self.e
        cast = down(want) if np.isfinite(want).all() else None
        dt = None if cast is None else cast.to_dense()
        if dt is not None:
            anchor_receive(y_new, v_new, dt, coefs)
        if dt is None or not (np.isfinite(y_new).all() and np.isfinite(v_new).all()):
            self.e, self.u, self.absences = before
            return None
        assert cast is not None
        self.e = want - dt
        zero = np.zeros(self.d)
        for m, u in self.u.items():
            upd = self._sent.get(m)
            variate_receive(u, dt, zero if upd is None else upd.to_dense(), coefs)
            self.absences[m] = 0 if upd is not None else self.absences.get(m, 0) + 1
        y[...] = y_new
        self.v, self._sent, self.gamma = v_new, {}, coefs.gamma
        self.draws += 1
        return cast, Roster(absent, joined, left)

    def _roster(self, c: float) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Members join (their first change entered) and leave (absent ``max_absent``
        communications in a row, but never the last one): (joined, left)."""
        joined = tuple(a for a in self._sent if a not in self.u)
        for agent in joined:
            self._join(agent, c)
        left = tuple(
            m for m, k in self.absences.items()
            if m not in self._sent and k + 1 >= self.max_absent and self.n > 1
        )  # fmt: skip
        for agent in left:
            self._leave(agent, c)
        return joined, left

    def _join(self, agent: str, c: float) -> None:
        """``agent`` joins with ``u_i = 0``: ``e`` absorbs what the sum gains (``a v``)."""
        a, n = self.cfg.anchor, self.n
        self.e = (n * self.e - (a / ((1.0 + a) * c)) * self.v) / (n + 1)
        self.u[agent] = np.zeros(self.d)
        self.absences[agent] = 0

    def _leave(self, agent: str, c: float) -> None:
        """A member leaves with its ``u_i``: ``e`` absorbs it (the last member cannot)."""
        a, n = self.cfg.anchor, self.n
        u = self.u.pop(agent)
        self.absences.pop(agent, None)
        if n == 1:
            self.e = np.zeros(self.d)  # no member left: the sum is empty
            return
        self.e = (a * self.v + (1.0 + a) * n * c * self.e + u) / ((1.0 + a) * (n - 1) * c)

    def reset(self, agent: str) -> bool:
        """``agent`` lost its state (a fresh hello): it stops being a member; True when it
        was one. It joins again with its next change that enters."""
        self._sent.pop(agent, None)
        if agent not in self.u:
            return False
        c = self.coefs(self.gamma or 1.0).c
        self._leave(agent, c)
        return True

    def invariant(self, c: float) -> FloatArray:
        """``sum_i u_i + n a v + (1 + a) n c e`` (0 up to rounding, see the class doc)."""
        a, n = self.cfg.anchor, self.n
        total = sum(self.u.values(), np.zeros(self.d))
        return total + n * a * self.v + (1.0 + a) * n * c * self.e

    def export(self) -> dict[str, Any]:
        """JSON-able meta (gamma, absences, the step counts' draws) and the arrays ``v``,
        ``e`` and the mirrors."""
        agents = tuple(self.u)
        u = np.stack([self.u[a] for a in agents]) if agents else np.zeros((0, self.d))
        return {
            "gamma": self.gamma,
            "draws": self.draws,
            "absences": dict(self.absences),
            "u_agents": agents,
            "u": u,
            "v": self.v.copy(),
            "e": self.e.copy(),
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        """The inverse of :meth:`export` (raises ValueError on shapes or non-finite values)."""
        agents = tuple(data["u_agents"])
        u = np.asarray(data["u"], dtype=np.float64)
        v = np.asarray(data["v"], dtype=np.float64)
        e = np.asarray(data["e"], dtype=np.float64)
        if u.shape != (len(agents), self.d) or v.shape != (self.d,) or e.shape != (self.d,):
            raise ValueError("local-training state does not fit d or its members")
        if not (np.isfinite(u).all() and np.isfinite(v).all() and np.isfinite(e).all()):
            raise ValueError("local-training state contains nan or inf")
        gamma = data.get("gamma")
        self.gamma = None if gamma is None else float(gamma)
        self.draws = int(data.get("draws") or 0)
        if self.draws < 0:
            raise ValueError("local-training state: a negative number of draws")
        absences = data.get("absences") or {}
        self.u = {a: u[i].copy() for i, a in enumerate(agents)}
        self.absences = {a: int(absences.get(a, 0)) for a in agents}
        self.v, self.e, self._sent = v.copy(), e.copy(), {}


__all__ = [
    "DEFAULT_ANCHOR",
    "DEFAULT_CHI",
    "DEFAULT_RHO",
    "LOCAL_METHODS",
    "MAX_ROUND_STEPS",
    "STEP_BUDGET",
    "Compress",
    "Exchange",
    "Gradient",
    "LocalCoefs",
    "LocalConfig",
    "LocalHub",
    "LocalMethod",
    "LocalTraining",
    "Roster",
    "Schedule",
    "anchor_drift",
    "anchor_receive",
    "check_passes",
    "local_steps",
    "member_receive",
    "round_steps",
    "validate",
    "variate_receive",
]
