"""The job's settings as the aggregator announces them, and the agent's check against them.

The aggregator publishes :class:`JobInfo` (JSON) retained on ``cat/<job>/job`` when it
starts, and addresses it to an agent (``cat/<job>/to/<agent>``) with every refusal of its
settings (a ZeroMQ subscriber that joined late never sees the start-up one); a hello that
fits the job is not answered with it: the aggregator checked the same fields.
:func:`judge` says what an announcement means for an agent whose settings are :class:`Fit`
(pure: it reads the message, and the agent acts on the :class:`Verdict`). One whose own
settings do not fit (d, model, feedback family, compressor) logs one ERROR line naming
both values and the fix, and gives up (``Agent.gave_up``: the CLI exits 2) before it sends
an update: restarting will not help.

``feedback`` is what the job runs (``AGG_FEEDBACK``): ``none``, ``ef``, ``dir`` (family
*mean*: they may share a job), ``ef21`` (family *ef21*) or ``any`` (``family`` is then
null: the first accepted hello fixes it, and the aggregator refuses the others).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Final, Literal

from edge_agent.errors import WireFormatError
from edge_agent.protocol import topics
from edge_agent.protocol.downlink import semantics_family
from edge_agent.validation import (
    Check,
    Invalid,
    build,
    compact_json,
    dump,
    integer,
    literal,
    number,
    optional,
    revalidate,
    string,
    tuple_of,
)

FeedbackSetting = Literal["none", "ef", "ef21", "dir", "local", "any"]
#: the values of ``AGG_FEEDBACK`` / ``EngineConfig.feedback``
FEEDBACK_SETTINGS: Final[tuple[str, ...]] = ("none", "ef", "ef21", "dir", "local", "any")

_IDENT: Final = string(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")


def family_of(feedback: str) -> Literal["mean", "ef21", "local"] | None:
    """The update family a feedback setting (or a hello's semantics) belongs to; None for
    ``any`` (no family configured)."""
    if feedback == "any":
        return None
    return semantics_family(feedback)


def agent_flag(feedback: str) -> str:
    """The agent option(s) that fit a job running ``feedback`` (for error messages)."""
    if feedback == "ef21":
        return "--feedback ef21"
    if feedback == "local":
        return "--local-steps H (H: the job's AGG_LOCAL_STEPS)"
    return "--feedback none (or ef, or --curvature directional)"


@dataclass(frozen=True, kw_only=True)
class JobInfo:
    """What the aggregator announces about its job (frozen; :func:`parse` ignores unknown
    fields so that a newer aggregator may add some). Built directly, its fields are checked
    and coerced as :func:`parse` does (ValueError)."""

    type: Literal["job"] = "job"
    job: str
    d: int
    model: str
    feedback: FeedbackSetting
    #: ``mean``, ``ef21`` or ``local``; null while ``feedback`` is ``any`` and no agent
    #: fixed it
    family: Literal["mean", "ef21", "local"] | None = None
    compressors: tuple[str, ...]
    #: the minibatch every agent must use (rows, or a fraction of its shard; AGG_BATCH_SIZE);
    #: null: any, full local gradients included
    batch_size: float | None = None
    #: local training: the local steps between communications (AGG_LOCAL_STEPS); null: none
    local_steps: int | None = None
    #: local training with a drawn schedule: the probability of communicating after each
    #: local step (AGG_COMM_PROB); null: none
    comm_prob: float | None = None

    CHECKS: ClassVar[Mapping[str, Check]] = {
        "type": literal("job"),
        "job": _IDENT,
        "d": integer(gt=0),
        "model": string(),
        "feedback": literal(*FEEDBACK_SETTINGS),
        "family": optional(literal("mean", "ef21", "local")),
        "compressors": tuple_of(string()),
        "batch_size": optional(number(gt=0)),
        "local_steps": optional(integer(gt=0)),
        "comm_prob": optional(number(gt=0)),
    }

    def __post_init__(self) -> None:
        revalidate(self)

    def dump(self) -> bytes:
        """The JSON announcement; ``batch_size``, ``local_steps`` and ``comm_prob`` only when
        set (older agents' view unchanged)."""
        data = dump(self, exclude_none=False)
        for key in ("batch_size", "local_steps", "comm_prob"):
            if data[key] is None:
                del data[key]
        return compact_json(data).encode()


def parse(payload: bytes) -> JobInfo | None:
    """The :class:`JobInfo` in ``payload``; None when it is JSON of another type (a control
    message); WireFormatError when it claims to be one and is not valid."""
    try:
        obj = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireFormatError(f"job info: not JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("type") != "job":
        return None
    try:
        return build(JobInfo, obj, extra="ignore")
    except Invalid as exc:
        first = exc.problems[0]
        raise WireFormatError(f"job info: {first.loc}: {first.msg}") from None


def wrong_d_fix(d: int) -> str:
    """What to do when an agent's model size is not the job's ``d`` (AGG_D): its data must
    have that many features; ``--features`` can only pad a shard that has fewer."""
    return (
        f"the agent's data must have {d} features (softmax: d / classes): --features {d} pads "
        f"a LIBSVM shard with fewer; a shard with more was made for another job: regenerate it "
        f"(edge-agent data generate --features {d}) or pass this job's shard with --data"
    )


def local_flag(local_steps: int | None, comm_prob: float | None) -> str:
    """The agent flag of a local-training schedule (``none`` without one)."""
    if comm_prob is not None:
        return f"--comm-prob {comm_prob:g}"
    return "none" if local_steps is None else f"--local-steps {local_steps}"


def local_misfit(
    job: tuple[int | None, float | None], agent: tuple[int | None, float | None]
) -> str | None:
    """What differs between the job's local-training schedule ``(local_steps, comm_prob)``
    and an agent's, with the fix; None when they fit or the job runs no local training."""
    if job == (None, None) or agent == job:
        return None
    want = local_flag(*job)
    return (
        f"runs local training with {want} (AGG_LOCAL_STEPS, AGG_COMM_PROB), this agent "
        f"{local_flag(*agent)}: run it with {want}"
    )


def conflict(
    info: JobInfo,
    *,
    job: str,
    d: int,
    model: str,
    semantics: str,
    compressor: str,
    batch_size: float | None = None,
    local_steps: int | None = None,
    comm_prob: float | None = None,
) -> str | None:
    """One line naming the job's value, the agent's and the fix; None when they fit."""
    if info.job != job:
        return None  # another job's announcement: not ours to judge
    if info.d != d:
        return f"job {job} has d={info.d} (AGG_D), this agent d={d}: {wrong_d_fix(info.d)}"
    if info.model != model:
        return (
            f"job {job} runs model {info.model!r} (AGG_MODEL), this agent {model!r}: "
            f"run it with --model {info.model}"
        )
    if info.family is not None and family_of(semantics) != info.family:
        return (
            f"job {job} runs {info.feedback} (AGG_FEEDBACK, family {info.family}), this agent "
            f"{semantics} (family {family_of(semantics)}): run the agent with "
            f"{agent_flag(info.feedback)}"
        )
    if compressor not in info.compressors:
        return (
            f"job {job} accepts compressors {', '.join(info.compressors)}, this agent "
            f"{compressor!r}: run it with --compressor {info.compressors[0]}"
        )
    if info.batch_size is not None and batch_size != info.batch_size:
        return (
            f"job {job} runs minibatch SGD with batch size {info.batch_size:g} "
            f"(AGG_BATCH_SIZE), this agent {'full gradients' if batch_size is None else f'{batch_size:g}'}: "
            f"run it with --batch-size {info.batch_size:g}"
        )
    misfit = local_misfit((info.local_steps, info.comm_prob), (local_steps, comm_prob))
    return None if misfit is None else f"job {job} {misfit}"


@dataclass(frozen=True)
class Fit:
    """The agent settings a job announcement is judged against."""

    job: str
    agent_id: str
    d: int
    model: str
    semantics: str
    compressor: str
    batch_size: float | None = None
    local_steps: int | None = None
    comm_prob: float | None = None


@dataclass(frozen=True)
class Verdict:
    """What the job's announcement means for an agent: ``conflict`` names the job's value,
    the agent's and the fix (None: they fit); ``give_up`` is then the line the agent ends
    with."""

    conflict: str | None
    give_up: str | None


def judge(topic: str, payload: bytes, fit: Fit) -> Verdict | None:
    """The verdict when the message is the job's announcement (on ``cat/<job>/job``, or a
    JSON :class:`JobInfo` addressed to the agent); None for any other message.
    WireFormatError when it claims to be one and is not valid."""
    if topic != topics.job_info(fit.job):
        addressed = topic == topics.to_agent(fit.job, fit.agent_id)
        if not addressed or payload[:1] != b"{":
            return None
    info = parse(payload)
    if info is None:
        return None
    line = conflict(
        info,
        job=fit.job,
        d=fit.d,
        model=fit.model,
        semantics=fit.semantics,
        compressor=fit.compressor,
        batch_size=fit.batch_size,
        local_steps=fit.local_steps,
        comm_prob=fit.comm_prob,
    )
    give_up = None if line is None else f"agent {fit.agent_id} does not fit the job: {line}"
    return Verdict(line, give_up)
