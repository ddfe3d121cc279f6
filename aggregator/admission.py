"""Which inbound messages the engine looks at: the checks that need no round state.

Every refused message is counted under one reason of :data:`REJECT_REASONS`. The checks
here depend only on the job's configuration and the sender's hello; whether a valid update
enters a round (duplicate, stale, paused, ...) is the engine's business
(:meth:`aggregator.rounds.RoundEngine.handle`). Each check raises :class:`Reject`
before anything changed, so a refused message leaves no trace but its count.
"""

from __future__ import annotations

from typing import Final, Literal

from edge_agent import messages, topics, wire
from edge_agent.compressors import COMPRESSOR_IDS, Update
from edge_agent.errors import WireFormatError

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
    "duplicate",
    "stale",
    "ef21_reset",
    "future_version",
    "paused",
    "finished",
    "internal_error",
)

#: the two families of update semantics a job can run (the first hello fixes it)
Family = Literal["mean", "ef21"]

#: Largest payload the engine looks at (a dense float64 update of d = 2**24 fits).
MAX_PAYLOAD_BYTES: Final = 256 * 2**20

_TOPIC_CACHE_MAX: Final = 8192

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
        raise Reject("malformed", f"{len(payload)} bytes")
    return bytes(payload)


def check_hello(
    blob: bytes, *, agent: str, job: str, d: int, model: str, family: str | None, alone: bool
) -> messages.Hello:
    """A hello that fits the job. ``family``: the job's semantics family so far (None:
    not fixed yet); ``alone``: no other agent is registered, so the family may change."""
    try:
        hello = messages.parse(messages.Hello, blob)
    except WireFormatError as exc:
        raise Reject("malformed", exc.reason) from None
    if hello.agent != agent:
        raise Reject("agent_mismatch", f"hello from {hello.agent!r} on {agent!r}'s topic")
    if hello.job != job:
        raise Reject("wrong_job", hello.job)
    if hello.d != d:
        raise Reject("wrong_d", f"{agent}: d={hello.d}, job has d={d}")
    if hello.model != model:
        raise Reject("wrong_model", f"{agent}: model {hello.model!r}, job runs {model!r}")
    if hello.compressor not in COMPRESSOR_IDS:
        raise Reject("wrong_compressor", f"{agent}: {hello.compressor!r}")
    if family is not None and semantics_family(hello.semantics) != family and not alone:
        raise Reject("wrong_semantics", f"{agent}: {hello.semantics} in a {family} job")
    return hello


def semantics_family(semantics: str) -> Family:
    """``"ef21"`` for EF21 updates, ``"mean"`` for the others (plain, ef)."""
    return "ef21" if semantics == "ef21" else "mean"


def check_update(
    blob: bytes,
    decoded: Decoded | None,
    *,
    agent: str,
    job: str,
    d: int,
    hello: messages.Hello | None,
) -> tuple[wire.UpdateHeader, Update]:
    """A decoded update that fits the job and its sender's ``hello`` (None: the agent has
    not said hello). ``decoded``: the caller's decoding of ``blob``, if it has one."""
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
