"""What an agent does: :class:`AgentConfig`, checked when it is built (everything else an
agent needs, its data, model, link and transport, is passed to
:class:`edge_agent.agent.loop.Agent` itself)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from edge_agent.numerics.compressors import ValueDtype
from edge_agent.numerics.curvature import DIRECTIONAL_COMPRESSORS
from edge_agent.numerics.local import check_passes

__all__ = ["AgentConfig", "CurvatureName", "FeedbackName"]

FeedbackName = Literal["none", "ef", "ef21"]
CurvatureName = Literal["global", "directional"]


@dataclass(frozen=True)
class AgentConfig:
    """What an agent does; everything else (data, model, link, transport) is passed in."""

    job: str
    agent_id: str
    compressor: str = "topk"
    policy: str = "cat"
    feedback: FeedbackName = "none"
    value_dtype: ValueDtype = "float32"
    t_min: int = 1
    t_max: int | None = None
    seed: int = 0
    #: Re-send the last update (same seq: the aggregator de-duplicates) or the hello after
    #: this many seconds without a new model version; None: never (MQTT QoS 1 delivers).
    resend_s: float | None = 10.0
    #: "wait": stay silent as the profile's duty cycle demands; "ignore": only account it.
    duty_cycle: Literal["wait", "ignore"] = "wait"
    max_rounds: int | None = None
    #: give up (``Agent.gave_up``) after this many refusals that cannot heal (answers.py)
    max_refusals: int = 3
    #: "global": the aggregator's 1/L step along every update, T from ``policy``;
    #: "directional": T priced with the curvature along the direction sent, the update
    #: scaled so that the 1/L step moves x by t q (semantics ``dir``; docs/curvature.md).
    curvature: CurvatureName = "global"
    #: sign every update, hello, status and request with this key (edge_agent.protocol.mac)
    mac_key: bytes | None = None
    #: the aggregator's Ed25519 public keys (more than one while rotating): act only on
    #: messages it signed (agent/signatures.py); empty: take every message, as before
    aggregator_keys: tuple[bytes, ...] = ()
    #: with keys: control and job settings on ``control`` / ``to`` signed before this
    #: (aggregator clock, microseconds since 1970) are replays; the CLI passes its start
    aggregator_not_before_us: int = 0
    #: the downlink group it receives job-wide messages on (hello ``group``); None: the
    #: profile's shared downlink names it, or there is none (unicast)
    group: str | None = None
    #: minibatch SGD: rows per gradient (an integer) or a fraction of the shard in (0, 1);
    #: None: the full local gradient. Rows drawn without replacement per epoch (sampling.py).
    batch_size: float | None = None
    #: with ``batch_size`` and ``feedback="ef"``: keep the residual in model units under
    #: the job's step schedule ``min(1/L, 2/(l2 (t + t0)))`` (``l2`` the model's, ``t0``
    #: this: the job's AGG_SCHEDULE_T0); None (the default, it measured better): in
    #: gradient units, classic EF. numerics/stochastic.py, StepRatio.
    schedule_t0: float | None = None
    #: local training (LoCoDL, edge_agent/agent/localtrain.py): H local steps between the
    #: messages of a job that runs it (AGG_LOCAL_STEPS: the job's H, checked on arrival of
    #: its settings); the update carries the change of the local model, semantics ``local``
    local_steps: int | None = None
    #: local training with a drawn schedule (AGG_COMM_PROB): the job's probability of a
    #: communication after each local step; each round's count comes with the broadcast
    comm_prob: float | None = None

    @property
    def local(self) -> bool:
        """Whether this agent runs local training (``local_steps`` or ``comm_prob``)."""
        return self.local_steps is not None or self.comm_prob is not None

    def _check_local(self) -> None:
        """ValueError for a local-training setting that is undefined or known to fail: one
        schedule (H or p), no feedback of its own, global curvature, whole passes."""
        if self.local_steps is not None and self.comm_prob is not None:
            raise ValueError("local_steps or comm_prob: the job runs one schedule")
        if self.comm_prob is not None and not 0.0 < self.comm_prob <= 1.0:
            raise ValueError(f"comm_prob must lie in (0, 1], got {self.comm_prob}")
        if not (
            (self.local_steps is None or self.local_steps >= 1)
            and self.feedback == "none"
            and self.curvature == "global"
        ):
            raise ValueError(
                "local training (local_steps H >= 1 or comm_prob): feedback 'none' and "
                "curvature 'global' (local training corrects its own compression error)"
            )
        if self.batch_size is not None:
            check_passes(self.local_steps or 1, self.batch_size, comm_prob=self.comm_prob)

    def __post_init__(self) -> None:
        if self.local:
            self._check_local()
        if self.batch_size is not None and not self.batch_size > 0:
            raise ValueError(f"batch_size must be > 0 (rows or a fraction), got {self.batch_size}")
        if self.batch_size is not None and self.curvature == "directional":
            raise ValueError(
                "curvature='directional' prices the exact local gradient: use batch_size=None "
                "or curvature='global'"
            )
        if self.curvature not in ("global", "directional"):
            raise ValueError(f"curvature must be 'global' or 'directional', got {self.curvature!r}")
        if self.curvature == "global":
            return
        if self.compressor != "dense" and self.compressor not in DIRECTIONAL_COMPRESSORS:
            raise ValueError(
                f"curvature='directional' needs compressor dense, topk or signtopk, "
                f"not {self.compressor!r}"
            )
        if self.feedback != "none":
            raise ValueError(
                f"curvature='directional' prices the gradient itself: use feedback='none', "
                f"not {self.feedback!r} (the bound does not cover error-feedback memories)"
            )
        if self.compressor != "dense" and self.policy != "cat":
            raise ValueError(
                f"curvature='directional' picks T itself (CAT with the directional gain): "
                f"use policy='cat', not {self.policy!r}"
            )
