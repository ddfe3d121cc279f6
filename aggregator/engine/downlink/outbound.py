"""What the engine asks the service to publish: :class:`Outbound` messages, and the model
deltas they may carry (:class:`DeltaParts`), merged per ingest batch by :func:`merge_deltas`.

A delta says which entries of the model changed from ``base_version`` to ``version`` and
their *new* values (not differences), so an agent that applies it holds the aggregator's
model bit for bit. Its bytes are encoded only when a transport asks for them, so a batch
that commits many versions encodes only the one merged delta.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from edge_agent.protocol import downlink, messages, topics, wire

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class DeltaParts:
    """What a delta message says (the *new* values at the changed indices), not yet
    encoded: the service merges a batch's consecutive deltas into one (:func:`merge_deltas`)
    and encodes only that."""

    job: str
    d: int
    base_version: int
    version: int
    indices: npt.NDArray[np.int64]  # sorted, distinct
    values: FloatArray

    def encode(self) -> bytes:
        return wire.encode_delta(
            self.indices,
            self.values,
            job=self.job,
            base_version=self.base_version,
            version=self.version,
            d=self.d,
        )


@dataclass(frozen=True, slots=True)
class StepsParts:
    """A replicated-steps message (:mod:`edge_agent.protocol.downlink`) not yet encoded: the encoded
    operations of the versions ``base_version`` -> ``version``, in the aggregator's order.
    Consecutive ones merge by concatenating their operations."""

    job: str
    d: int
    base_version: int
    version: int
    family: downlink.Family
    ops: tuple[bytes, ...]

    def encode(self) -> bytes:
        return downlink.encode_steps(
            list(self.ops),
            job=self.job,
            d=self.d,
            base_version=self.base_version,
            version=self.version,
            family=self.family,
        )

    @property
    def size_bytes(self) -> int:
        """``len(self.encode())`` without encoding (header plus operations)."""
        head = len(
            downlink.encode_steps(
                [],
                job=self.job,
                d=self.d,
                base_version=self.base_version,
                version=self.version,
                family=self.family,
            )
        )
        return head + sum(map(len, self.ops))


#: What the aggregator publishes, by kind (``cat_published_messages_total{kind}``): on the
#: job-wide topics ``steps``, ``delta`` (a version), ``snapshot`` (the retained model) and
#: ``control``; on one agent's ``cat/<job>/to/<agent>`` ``catchup`` (merged steps or a
#: delta it missed), ``agent_snapshot`` and ``agent_control``.
PUBLISHED_KINDS: tuple[str, ...] = (
    "steps",
    "delta",
    "snapshot",
    "control",
    "catchup",
    "agent_snapshot",
    "agent_control",
)


class Outbound:
    """A message to publish on every transport. A delta's or steps' bytes are encoded on
    first use. ``target``: the one agent it is addressed to (on ``cat/<job>/to/<agent>``,
    see :func:`addressed`), None for the whole job."""

    __slots__ = ("_payload", "delta", "retain", "steps", "target", "topic")

    def __init__(
        self,
        topic: str,
        payload: bytes | None = None,
        retain: bool = False,
        *,
        delta: DeltaParts | None = None,
        steps: StepsParts | None = None,
        target: str | None = None,
    ) -> None:
        if (payload is not None) + (delta is not None) + (steps is not None) != 1:
            raise ValueError("an Outbound has exactly one of a payload, delta or steps parts")
        self.topic = topic
        self.retain = retain
        self.target = target
        self.delta = delta
        self.steps = steps
        self._payload = payload

    @property
    def payload(self) -> bytes:
        if self._payload is None:
            parts = self.delta if self.delta is not None else self.steps
            assert parts is not None
            self._payload = parts.encode()
        return self._payload

    @property
    def kind(self) -> str:
        """One of :data:`PUBLISHED_KINDS` (a payload is a snapshot when it is a binary
        downlink message, else a JSON control message)."""
        if self.delta is not None or self.steps is not None:
            if self.target is not None:
                return "catchup"
            return "delta" if self.delta is not None else "steps"
        binary = self.payload[:2] == wire.MAGIC
        if self.target is not None:
            return "agent_snapshot" if binary else "agent_control"
        return "snapshot" if binary else "control"

    def sealed(self, seal: Callable[[str, bytes], bytes]) -> Outbound:
        """This message with its payload as ``seal(topic, payload)`` makes it (the signed
        bytes the agents receive: docs/wire-format.md section 13), its parts (and so its
        kind) kept. Its charge and its published count are then of the signed bytes."""
        parts = self.delta is not None or self.steps is not None
        out = Outbound(
            self.topic,
            None if parts else self.payload,
            self.retain,
            delta=self.delta,
            steps=self.steps,
            target=self.target,
        )
        out._payload = seal(self.topic, self.payload)
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Outbound):
            return NotImplemented
        return (self.topic, self.payload, self.retain) == (other.topic, other.payload, other.retain)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = self.delta if self.delta is not None else self.steps
        what = f"{type(parts).__name__} {parts.base_version}->{parts.version}" if parts else ""
        size = f"{len(self._payload)} bytes" if self._payload is not None else "not encoded"
        return f"Outbound({self.topic!r}, {what or size}, retain={self.retain})"


def addressed(out: Outbound, job: str, agent: str) -> Outbound:
    """``out`` re-addressed to ``agent`` alone, on ``cat/<job>/to/<agent>`` (never
    retained: a retained answer would greet the agent's next subscription with an old
    model). The payload or parts are shared, not copied."""
    topic = topics.to_agent(job, agent)
    if out.delta is not None:
        return Outbound(topic, delta=out.delta, target=agent)
    if out.steps is not None:
        return Outbound(topic, steps=out.steps, target=agent)
    return Outbound(topic, out.payload, target=agent)


def merge_deltas(outbound: Iterable[Outbound]) -> list[Outbound]:
    """Replace every run of consecutive, chained deltas (each one's base is the previous
    one's version) by one delta from the first base to the last version.

    Applying the merged delta sets every index to the value the last delta of the run gave
    it, exactly what applying the run in order does, so agents reach the same bits with one
    message. Everything else keeps its place. The service publishes a batch's messages
    through this: a batch that committed 37 versions broadcasts one delta, not 37 (agents
    only ever hold broadcast versions, so none needs the ones in between).
    """
    out: list[Outbound] = []
    run: list[Outbound] = []

    def flush() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            out.append(_merged(run))
        run.clear()

    for o in outbound:
        d = o.delta if o.delta is not None else o.steps
        if d is None:
            flush()
            out.append(o)
            continue
        last = run[-1] if run else None
        prev = None if last is None else (last.delta if last.delta is not None else last.steps)
        if prev is not None and (
            type(prev) is not type(d)
            or prev.version != d.base_version
            or o.topic != run[-1].topic
            or (
                isinstance(d, StepsParts)
                and isinstance(prev, StepsParts)
                and prev.family != d.family
            )
        ):
            flush()
        run.append(o)
    flush()
    return out


def _merged(run: list[Outbound]) -> Outbound:
    """One message for a chained run: steps concatenate their operations; for deltas each
    index keeps the value of the run's last delta."""
    if run[0].steps is not None:
        chain = [o.steps for o in run if o.steps is not None]
        joined = StepsParts(
            chain[0].job,
            chain[0].d,
            chain[0].base_version,
            chain[-1].version,
            chain[0].family,
            tuple(op for part in chain for op in part.ops),
        )
        return Outbound(run[0].topic, retain=run[0].retain, steps=joined, target=run[0].target)
    parts = [o.delta for o in run if o.delta is not None]
    first, last = parts[0], parts[-1]
    idx = np.concatenate([p.indices for p in parts])
    vals = np.concatenate([p.values for p in parts])
    order = np.argsort(idx, kind="stable")  # equal indices stay in version order
    idx, vals = idx[order], vals[order]
    last_of_each = np.empty(idx.size, dtype=bool)
    if idx.size:
        np.not_equal(idx[1:], idx[:-1], out=last_of_each[:-1])
        last_of_each[-1] = True
    merged = DeltaParts(
        job=first.job,
        d=first.d,
        base_version=first.base_version,
        version=last.version,
        indices=idx[last_of_each],
        values=vals[last_of_each],
    )
    return Outbound(run[0].topic, retain=run[0].retain, delta=merged, target=run[0].target)


def control_message(job: str, ctl: messages.Control) -> Outbound:
    """``ctl`` on the job's control topic ``cat/<job>/control``."""
    return Outbound(topics.control(job), messages.dump(ctl))


def reset_message(job: str, agent: str, version: int) -> Outbound:
    """Control ``reset`` for the EF21 ``agent`` (its state was dropped: it zeroes its own and
    rejoins fresh), addressed to it alone."""
    ctl = messages.Control(cmd="reset", agent=agent, version=version)
    return addressed(control_message(job, ctl), job, agent)
