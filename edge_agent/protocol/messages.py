"""JSON control messages between agents and the aggregator (topics: docs/architecture.md).

Updates and model messages are binary (edge_agent.protocol.wire); these small, rare messages are JSON
validated by pydantic on both ends (frozen, extra fields forbidden). ``parse`` raises
WireFormatError so a service can count and drop a bad one like any other bad message.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge_agent.errors import WireFormatError

Ident = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class Hello(_Msg):
    """Sent by an agent when it (re)joins. ``smoothness`` is its local L_i, ``rows`` its n_i.

    ``fresh`` says the agent starts with empty error-feedback state (a restart): the
    aggregator then resets what it mirrors for this agent (EF21 h_i) before applying updates.
    ``next_seq`` is the first sequence number the agent will use.
    """

    type: Literal["hello"] = "hello"
    job: Ident
    agent: Ident
    d: int = Field(gt=0)
    rows: int = Field(ge=0)
    smoothness: float = Field(gt=0, allow_inf_nan=False)
    model: str
    compressor: str
    semantics: Literal["plain", "ef", "ef21", "dir"] = "plain"
    policy: str = "cat"
    profile: str = ""
    objective: str = ""
    fresh: bool = True
    next_seq: int = Field(default=0, ge=0)
    version: int | None = Field(default=None, ge=0)  # the model version the agent holds, if any
    #: the shared downlink group (multicast) it receives job-wide messages on; None: the
    #: one its profile's ``downlink.shared`` names, or unicast without one
    group: str | None = Field(default=None, min_length=1, max_length=64)


class Status(_Msg):
    """Agent liveness. The MQTT Last Will carries ``{"state": "offline"}``."""

    type: Literal["status"] = "status"
    state: Literal["online", "offline", "done"]
    agent: Ident | None = None
    round: int | None = None


class Request(_Msg):
    """An agent asks for a full snapshot (it saw a version gap or has no model)."""

    type: Literal["request"] = "request"
    want: Literal["snapshot"] = "snapshot"
    have: int | None = None


class Control(_Msg):
    """Aggregator to agents: stop (training finished), pause, resume, resync, reset, refused.

    ``resync`` (with ``version``) is sent when the aggregator (re)starts: an agent that has
    already answered that version re-sends the very same update (same seq; de-duplicated),
    since the open round may have been lost; an agent behind it asks for a snapshot.

    ``reset`` (with ``agent``) is for that one EF21 agent: the aggregator could not tell
    whether one of its state changes was already applied (it arrived older than the
    de-duplication window), so it dropped its copy of the agent's state h_i; the agent
    must zero its own h_i and say hello with ``fresh=True``. Until that hello arrives, the
    agent's EF21 updates are refused and answered with the same reset.

    ``refused`` (with ``agent``, ``reason`` and ``detail``) tells that one agent that the
    aggregator refused its hello or update: ``reason`` is the rejection reason the
    aggregator counts (``wrong_semantics``, ``wrong_d``, ``wrong_model``, ...; see
    :data:`REFUSAL_FATAL`), ``detail`` says what differed. The aggregator sends at most one
    per (agent, reason) every 30 s; every agent of the job receives it (one control topic)
    and only the named one acts on it.
    """

    type: Literal["control"] = "control"
    cmd: Literal["stop", "pause", "resume", "resync", "reset", "refused"]
    version: int | None = None
    agent: Ident | None = None
    reason: str = ""
    detail: str = ""


#: Refusal reasons that cannot heal by retrying: the agent's settings (feedback, d, model,
#: compressor) do not fit the job's. An agent stops after a few of them (``--max-refusals``).
REFUSAL_FATAL: frozenset[str] = frozenset(
    {"wrong_semantics", "wrong_d", "wrong_model", "wrong_compressor"}
)


M = TypeVar("M", bound=_Msg)


def dump(msg: _Msg) -> bytes:
    return msg.model_dump_json(exclude_none=True).encode()


def parse(cls: type[M], payload: bytes) -> M:
    """Validate a JSON payload as ``cls``; raises WireFormatError naming the problem."""
    if len(payload) > 4096:
        raise WireFormatError(
            f"{cls.__name__.lower()}: payload of {len(payload)} bytes exceeds 4096"
        )
    try:
        return cls.model_validate_json(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ())) or "payload"
        raise WireFormatError(f"{cls.__name__.lower()}: {loc}: {first.get('msg')}") from None
