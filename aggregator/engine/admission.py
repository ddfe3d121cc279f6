"""Which inbound messages the engine looks at: the checks that need no round state.

Every refused message is counted under one reason of :data:`REJECT_REASONS`. The checks
here depend only on the job's configuration and the sender's hello; whether a valid update
enters a round (duplicate, stale, paused, ...) is the engine's business
(:meth:`aggregator.engine.rounds.RoundEngine.handle`). Each check raises :class:`Reject`
before anything changed, so a refused message leaves no trace but its count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from edge_agent.errors import WireFormatError
from edge_agent.numerics.compressors import COMPRESSOR_IDS, Update
from edge_agent.protocol import jobinfo, messages, topics, wire
from edge_agent.protocol import mac as update_mac
from edge_agent.protocol.downlink import semantics_family

#: Every reason a message can be rejected for (the Prometheus label values).
REJECT_REASONS: Final[tuple[str, ...]] = (
    "malformed",
    "unexpected_topic",
    "wrong_job",
    "agent_mismatch",
    "unknown_agent",
    "wrong_d",
    "wrong_model",
    "wrong_compressor",
    "wrong_semantics",
    "wrong_batch_size",
    "wrong_local_steps",
    "out_of_bounds",
    "unknown_profile",
    "too_many_agents",
    "too_large",
    "oversize",
    "would_diverge",
    "bad_mac",
    "replayed",
    "claims_changed",
    "duplicate",
    "one_per_version",
    "stale",
    "ef21_reset",
    "future_version",
    "paused",
    "finished",
    "internal_error",
)

#: Largest payload the engine looks at (a dense float64 update of d = 2**24 fits).
MAX_PAYLOAD_BYTES: Final = 256 * 2**20

_TOPIC_CACHE_MAX: Final = 8192

#: the largest round, seq or version number an agent may name (the wire's uvarint cap)
MAX_COUNTER: Final = 2**63 - 1
#: the longest free-text field (profile, objective, policy) a hello may carry
MAX_TEXT: Final = 256


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Bounds on what an agent may claim; a message outside them is refused before
    anything changes (``out_of_bounds`` for a hello, ``too_large`` for an update).

    ``max_rows`` bounds n_i and ``[min_smoothness, max_smoothness]`` the L_i of a hello
    (they set the step size, docs/algorithm.md). ``update_norm_factor``: once
    ``update_norm_warmup`` updates were accepted, a mean-family update whose L2 norm
    exceeds this multiple of the median norm of the last accepted ones is refused
    (:mod:`aggregator.engine.guard`).

    ``profile_problem(name)``: None when the cost profile a hello names can be priced here,
    else why not (the hello is refused ``unknown_profile``); None: profiles are not checked
    (an unknown one is then priced as bytes only).
    """

    max_rows: int = 10**9
    min_smoothness: float = 1e-6
    max_smoothness: float = 1e12
    update_norm_factor: float = 1e3
    update_norm_warmup: int = 16
    profile_problem: Callable[[str], str | None] | None = field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        checks = [
            (self.max_rows >= 1, "max_rows must be >= 1"),
            (0 < self.min_smoothness <= self.max_smoothness, "need 0 < min <= max smoothness"),
            (math.isfinite(self.max_smoothness), "max_smoothness must be finite"),
            (self.update_norm_factor >= 1, "update_norm_factor must be >= 1"),
            (self.update_norm_warmup >= 1, "update_norm_warmup must be >= 1"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"Limits: {msg}")


@dataclass(frozen=True, kw_only=True)
class MacPolicy:
    """Which messages must carry a valid MAC (docs/wire-format.md sections 3.3 and 11.1).

    ``keys``: the MAC key of each agent that has one (``AGG_MAC_KEYS_DIR``); an update,
    hello, status or request from such an agent must carry a MAC that verifies under it.
    ``required`` (``AGG_REQUIRE_MAC``): one without a MAC, or from an agent without a key,
    is refused too. Every refusal is ``bad_mac``. Keys never appear in a repr."""

    keys: Mapping[str, bytes] = field(default_factory=dict, repr=False, hash=False)
    required: bool = False

    def check(self, blob: bytes, header: wire.UpdateHeader, agent: str) -> None:
        """Raise ``bad_mac`` unless ``blob`` (from ``agent``, decoded as ``header``) passes."""
        key = self.keys.get(agent)
        if key is None:
            if self.required:
                raise Reject(
                    "bad_mac",
                    f"{agent}: no MAC key for this agent and AGG_REQUIRE_MAC=true (add "
                    f"{agent}.mac to AGG_MAC_KEYS_DIR)",
                )
            return
        if not header.mac:
            raise Reject("bad_mac", f"{agent}: unsigned update; run it with --mac-key-file")
        if not update_mac.verify(key, blob):
            raise Reject("bad_mac", f"{agent}: MAC does not verify under its key")

    def open_json(self, kind: str, job: str, agent: str, payload: bytes) -> tuple[bytes, bool]:
        """The JSON text of ``agent``'s hello, status or request (``kind``) and whether it is
        authenticated; raises ``bad_mac`` when the policy wants a MAC that does not verify.
        The signature of an agent without a key here is ignored (not verifiable)."""
        text, tag = update_mac.split_sealed(payload)
        key = self.keys.get(agent)
        if key is None:
            if self.required:
                raise Reject("bad_mac", f"{agent}: no MAC key for its {kind} (AGG_REQUIRE_MAC)")
            return text, False
        if tag is None:
            raise Reject("bad_mac", f"{agent}: unsigned {kind}; it has a MAC key")
        if not update_mac.verify_sealed(key, kind, job, agent, payload):
            raise Reject("bad_mac", f"{agent}: the MAC of its {kind} does not verify")
        return text, True


#: an update's decoding: what wire.decode returns, or the error it raises
Decoded = tuple[wire.UpdateHeader, Update] | WireFormatError


class Reject(Exception):
    """A message is refused: ``reason`` (one of :data:`REJECT_REASONS`) and a detail."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


class TopicParser:
    """Parses agent topics of one job, caching the few each agent uses (bounded)."""

    def __init__(self, job: str) -> None:
        self.job = job
        self._cache: dict[str, topics.Topic] = {}

    def parse(self, topic: str) -> tuple[str, str]:
        """``(agent, kind)`` of an agent topic of this job, else :class:`Reject`."""
        parsed = self._cache.get(topic)
        if parsed is None:
            try:
                parsed = topics.parse(topic)
            except ValueError:
                raise Reject("unexpected_topic", topic[:80]) from None
            if len(self._cache) >= _TOPIC_CACHE_MAX:
                self._cache.clear()
            self._cache[topic] = parsed
        if parsed.job != self.job:
            raise Reject("wrong_job", parsed.job)
        if parsed.agent is None:
            raise Reject("unexpected_topic", topic)
        return parsed.agent, parsed.kind


def check_payload(payload: object) -> bytes:
    """The payload as bytes, unless it is not bytes-like or too large."""
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise Reject("malformed", "payload is not bytes")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise Reject("oversize", f"{len(payload)} bytes > {MAX_PAYLOAD_BYTES}")
    return bytes(payload)


def check_hello(
    blob: bytes,
    *,
    agent: str,
    job: str,
    d: int,
    model: str,
    family: str | None,
    alone: bool,
    fixed_step: bool = False,
    limits: Limits | None = None,
    feedback: str = "any",
    batch_size: float | None = None,
    local_steps: int | None = None,
    comm_prob: float | None = None,
) -> messages.Hello:
    """A hello that fits the job and ``limits`` (None: the defaults). ``feedback``: the
    job's configured feedback (``AGG_FEEDBACK``; ``any``: ``family`` decides); ``family``:
    the job's semantics family so far (None: not fixed yet); ``alone``: no other agent is
    registered, so an unconfigured family may change; ``fixed_step``: the job configures
    its step size (``dir`` agents need ``1/L``); ``batch_size``: the job's minibatch
    (``AGG_BATCH_SIZE``; None: any, full gradients included); ``local_steps`` or
    ``comm_prob``: the job's local-training schedule (both None: no local training)."""
    try:
        hello = messages.parse(messages.Hello, blob)
    except WireFormatError as exc:
        raise Reject("malformed", exc.reason) from None
    if hello.agent != agent:
        raise Reject("agent_mismatch", f"hello from {hello.agent!r} on {agent!r}'s topic")
    if hello.job != job:
        raise Reject("wrong_job", hello.job)
    if hello.d != d:
        raise Reject(
            "wrong_d",
            f"{agent}: d={hello.d}; job has d={d} (AGG_D); {jobinfo.wrong_d_fix(d)}",
        )
    if hello.model != model:
        raise Reject(
            "wrong_model",
            f"{agent}: model {hello.model!r}; job runs {model!r} (AGG_MODEL); "
            f"run the agent with --model {model}",
        )
    if hello.compressor not in COMPRESSOR_IDS:
        raise Reject(
            "wrong_compressor",
            f"{agent}: {hello.compressor!r}; job accepts {', '.join(COMPRESSOR_IDS)}",
        )
    check_family(hello, feedback=feedback, family=family, alone=alone)
    check_batch_size(hello, batch_size)
    misfit = jobinfo.local_misfit((local_steps, comm_prob), (hello.local_steps, hello.comm_prob))
    if misfit is not None:
        raise Reject("wrong_local_steps", f"{hello.agent}: the job {misfit}")
    if hello.semantics == "dir":
        _check_directional(hello, fixed_step=fixed_step)
    check_hello_bounds(hello, limits or Limits())
    return hello


def check_batch_size(hello: messages.Hello, batch_size: float | None) -> None:
    """Raise ``wrong_batch_size`` when the job runs minibatch SGD with ``batch_size`` and the
    hello claims another (a hello without one computes full gradients)."""
    if batch_size is None or hello.batch_size == batch_size:
        return
    own = "full gradients" if hello.batch_size is None else f"batch size {hello.batch_size:g}"
    raise Reject(
        "wrong_batch_size",
        f"{hello.agent}: {own}; job runs minibatch SGD with batch size {batch_size:g} "
        f"(AGG_BATCH_SIZE); run the agent with --batch-size {batch_size:g}",
    )


def check_hello_bounds(hello: messages.Hello, limits: Limits) -> None:
    """Raise ``out_of_bounds`` unless every number and text a hello claims is in range."""
    who = hello.agent
    if hello.rows > limits.max_rows:
        raise Reject("out_of_bounds", f"{who}: rows={hello.rows} > {limits.max_rows}")
    if not limits.min_smoothness <= hello.smoothness <= limits.max_smoothness:
        raise Reject(
            "out_of_bounds",
            f"{who}: smoothness={hello.smoothness:g} outside "
            f"[{limits.min_smoothness:g}, {limits.max_smoothness:g}]",
        )
    counters = (hello.next_seq, hello.version, hello.ctr, hello.will_ctr)
    if max(c or 0 for c in counters) > MAX_COUNTER:
        raise Reject("out_of_bounds", f"{who}: next_seq, version or a ctr beyond 2**63 - 1")
    if max(len(hello.profile), len(hello.objective), len(hello.policy)) > MAX_TEXT:
        raise Reject("out_of_bounds", f"{who}: profile/objective/policy over {MAX_TEXT} chars")
    problem = limits.profile_problem(hello.profile) if limits.profile_problem else None
    if hello.profile and problem is not None:
        raise Reject("unknown_profile", f"{who}: {problem}")


#: what a hello says about its session, not the agent: the rest may change only in a
#: fresh hello (a restart) or, for an agent with a MAC key, an authenticated one
SESSION_FIELDS: Final = frozenset({"fresh", "next_seq", "version", "ctr", "will_ctr"})


def check_claims(hello: messages.Hello, known: messages.Hello | None) -> None:
    """Raise ``claims_changed`` when a non-fresh hello of a known agent (``known``: its
    accepted hello) claims another profile, rows, smoothness, compressor, ... than that."""
    if known is None or hello.fresh:
        return
    was = known.to_dict()
    changed = [k for k, v in hello.to_dict().items() if k not in SESSION_FIELDS and was[k] != v]
    if changed:
        raise Reject(
            "claims_changed",
            f"{hello.agent}: {', '.join(changed)} changed in a hello with fresh=false "
            "(an agent changes its claims only when it restarts)",
        )


def check_counter(ctr: int | None, last: int | None, *, signed: bool, what: str) -> None:
    """Raise unless a signed message's counter ``ctr`` is above ``last``, the agent's last
    accepted one (None: none yet): ``bad_mac`` without one, ``replayed`` when not above."""
    if not signed:
        return
    if ctr is None:
        raise Reject("bad_mac", f"{what}: signed without ctr")
    if last is not None and ctr <= last:
        raise Reject("replayed", f"{what}: ctr {ctr} <= {last}, the last accepted")


def check_capacity(agent: str, registered: int, cap: int) -> None:
    """Raise ``too_many_agents`` when a hello from an unknown ``agent`` would register
    more than ``cap`` agents (the registry, the checkpoint and /agents stay bounded)."""
    if registered >= cap:
        raise Reject(
            "too_many_agents",
            f"{agent}: {registered} agents are registered, the cap; raise AGG_MAX_AGENTS "
            "if the fleet is larger",
        )


#: compressors whose update a ``dir`` step can carry (the step scales values or the scale)
DIRECTIONAL_COMPRESSORS: Final[tuple[str, ...]] = ("dense", "topk", "signtopk")


def _check_directional(hello: messages.Hello, *, fixed_step: bool) -> None:
    """A ``dir`` agent scaled its update for ``x <- x - (1/L) u``: the job must step 1/L."""
    if hello.compressor not in DIRECTIONAL_COMPRESSORS:
        raise Reject(
            "wrong_semantics",
            f"{hello.agent}: dir updates need compressor dense, topk or signtopk, "
            f"not {hello.compressor!r}",
        )
    if fixed_step:
        raise Reject(
            "wrong_semantics",
            f"{hello.agent}: dir updates are scaled for the step 1/L; this job configures "
            "step_size (unset it, or run the agent with --curvature global)",
        )


def check_family(hello: messages.Hello, *, feedback: str, family: str | None, alone: bool) -> None:
    """Raise ``wrong_semantics`` unless the hello's update family is the job's: the
    configured one (``feedback``), or with ``any`` the one the first hello fixed (which a
    lone agent may still change). The detail names the job's value and the fix."""
    own = semantics_family(hello.semantics)
    want = jobinfo.family_of(feedback)
    if own == "local" and want != "local":
        raise Reject(
            "wrong_semantics",
            f"{hello.agent}: local training; job {hello.job} does not run it (AGG_FEEDBACK="
            f"{feedback}; set AGG_LOCAL_STEPS for local training)",
        )
    if want is not None and own != want:
        raise Reject(
            "wrong_semantics",
            f"{hello.agent}: {hello.semantics}; job runs {feedback} (AGG_FEEDBACK); "
            f"run the agent with {jobinfo.agent_flag(feedback)}",
        )
    if want is None and family is not None and own != family and not alone:
        fits = "ef21" if family == "ef21" else "none"
        raise Reject(
            "wrong_semantics",
            f"{hello.agent}: {hello.semantics} in a {family} job (fixed by its first agent, "
            f"AGG_FEEDBACK=any); run the agent with {jobinfo.agent_flag(fits)}",
        )


def check_update(
    blob: bytes,
    decoded: Decoded | None,
    *,
    agent: str,
    job: str,
    d: int,
    hello: messages.Hello | None,
    mac: MacPolicy | None = None,
) -> tuple[wire.UpdateHeader, Update]:
    """A decoded update that fits the job and its sender's ``hello`` (None: the agent has
    not said hello) and, with ``mac``, carries the MAC that policy asks for.
    ``decoded``: the caller's decoding of ``blob``, if it has one."""
    if decoded is None:
        try:
            decoded = wire.decode(blob)
        except WireFormatError as exc:
            decoded = exc
    if isinstance(decoded, WireFormatError):
        raise Reject("malformed", decoded.reason)
    header, update = decoded
    if header.job != job:
        raise Reject("wrong_job", header.job)
    if header.agent != agent:
        raise Reject("agent_mismatch", f"update from {header.agent!r} on {agent!r}'s topic")
    if mac is not None:
        mac.check(blob, header, agent)
    if hello is None:
        raise Reject("unknown_agent", f"{agent} sent an update before its hello")
    if header.d != d:
        raise Reject("wrong_d", f"{agent}: d={header.d}, job has d={d}")
    if header.compressor != hello.compressor:
        raise Reject(
            "wrong_compressor", f"{agent}: {header.compressor}, hello said {hello.compressor}"
        )
    if header.semantics != hello.semantics:
        raise Reject(
            "wrong_semantics", f"{agent}: {header.semantics}, hello said {hello.semantics}"
        )
    return header, update


def check_status(blob: bytes, *, agent: str) -> messages.Status:
    """A status message about ``agent`` itself."""
    try:
        status = messages.parse(messages.Status, blob)
    except WireFormatError as exc:
        raise Reject("malformed", exc.reason) from None
    if status.agent is not None and status.agent != agent:
        raise Reject("agent_mismatch", f"status for {status.agent!r} on {agent!r}'s topic")
    return status


def check_request(blob: bytes) -> messages.Request:
    """A well-formed request (for the current model)."""
    try:
        return messages.parse(messages.Request, blob)
    except WireFormatError as exc:
        raise Reject("malformed", exc.reason) from None
