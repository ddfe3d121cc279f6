"""The topic namespace (docs/architecture.md) and the one MQTT wildcard matcher.

Every topic lives under ``cat/<job>/``; agent-to-aggregator topics end in the agent id::

    cat/<job>/hello/<agent>    cat/<job>/update/<agent>
    cat/<job>/status/<agent>   cat/<job>/request/<agent>
    cat/<job>/model            cat/<job>/delta            cat/<job>/control
    cat/<job>/to/<agent>       (aggregator -> one agent: answers addressed to it only)

Job and agent ids are 1..64 characters of ``[A-Za-z0-9._-]``, so they can never contain a
level separator or a wildcard. :func:`matches` implements MQTT filter semantics and is used
by every transport that filters on its own (memory, ZeroMQ), so all of them agree with
Mosquitto.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

ROOT = "cat"
ID_CHARS = "A-Z a-z 0-9 . _ -"
_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")

#: Kinds an agent publishes (topic ends in the agent id).
AGENT_KINDS: tuple[str, ...] = ("hello", "update", "status", "request")
#: Kinds the aggregator publishes to the whole job.
JOB_KINDS: tuple[str, ...] = ("model", "delta", "control", "job")
#: The kind the aggregator publishes to one agent (topic ends in that agent's id): the
#: catch-up steps, snapshot and control answers meant for it alone, so that the rest of
#: the fleet neither receives nor pays for them (the broker's ACL lets each agent read
#: only its own).
TO_AGENT = "to"


class Topic(NamedTuple):
    """A parsed topic; ``agent`` is None for job-wide kinds (model, delta, control); for
    ``to`` it is the addressee."""

    job: str
    kind: str
    agent: str | None


@lru_cache(maxsize=4096)
def validate_id(value: str, what: str = "id") -> str:
    """Return ``value`` if it is a valid job/agent id, else raise ValueError naming it."""
    if not isinstance(value, str) or _ID_RE.fullmatch(value) is None:
        raise ValueError(
            f"invalid {what} {value!r}: use 1 to 64 characters from {ID_CHARS} "
            "(no '/', '+', '#' or spaces)"
        )
    return value


def job_prefix(job: str) -> str:
    """``cat/<job>/``: the common prefix of every topic of a job (the ZeroMQ SUB filter)."""
    return f"{ROOT}/{validate_id(job, 'job id')}/"


def _agent_topic(kind: str, job: str, agent: str) -> str:
    return f"{job_prefix(job)}{kind}/{validate_id(agent, 'agent id')}"


def hello(job: str, agent: str) -> str:
    return _agent_topic("hello", job, agent)


def update(job: str, agent: str) -> str:
    return _agent_topic("update", job, agent)


def status(job: str, agent: str) -> str:
    return _agent_topic("status", job, agent)


def request(job: str, agent: str) -> str:
    return _agent_topic("request", job, agent)


def model(job: str) -> str:
    return f"{job_prefix(job)}model"


def delta(job: str) -> str:
    return f"{job_prefix(job)}delta"


def control(job: str) -> str:
    return f"{job_prefix(job)}control"


def job_info(job: str) -> str:
    """``cat/<job>/job``: the job's settings (retained JSON, :mod:`edge_agent.protocol.jobinfo`)."""
    return f"{job_prefix(job)}job"


def to_agent(job: str, agent: str) -> str:
    """``cat/<job>/to/<agent>``: what the aggregator addresses to ``agent`` alone."""
    return _agent_topic(TO_AGENT, job, agent)


def agent_inbound(job: str) -> list[str]:
    """Subscription patterns the aggregator needs: everything agents of ``job`` send, and
    the hellos of every job (``cat/+/hello/+``: rare, small), so that an agent configured
    for another job is counted as rejected ``wrong_job`` instead of going unnoticed."""
    return [
        f"{ROOT}/+/hello/+" if kind == "hello" else f"{job_prefix(job)}{kind}/+"
        for kind in AGENT_KINDS
    ]


def agent_subscriptions(job: str, agent: str | None = None) -> list[str]:
    """Subscription patterns an agent needs: model snapshots, deltas, control and the job's
    settings, and with ``agent`` its own ``cat/<job>/to/<agent>`` (answers addressed to it)."""
    subs = [model(job), delta(job), control(job), job_info(job)]
    return subs if agent is None else [*subs, to_agent(job, agent)]


def parse(topic: str) -> Topic:
    """Split a namespace topic into (job, kind, agent); raise ValueError on anything else."""
    levels = topic.split("/")
    if len(levels) in (3, 4) and levels[0] == ROOT:
        job, kind = levels[1], levels[2]
        if _ID_RE.fullmatch(job):
            if len(levels) == 3 and kind in JOB_KINDS:
                return Topic(job, kind, None)
            if (
                len(levels) == 4
                and (kind in AGENT_KINDS or kind == TO_AGENT)
                and _ID_RE.fullmatch(levels[3])
            ):
                return Topic(job, kind, levels[3])
    raise ValueError(
        f"topic {topic!r} is not in the cat-edge namespace; expected "
        f"cat/<job>/{{{','.join((*AGENT_KINDS, TO_AGENT))}}}/<agent> or "
        f"cat/<job>/{{{','.join(JOB_KINDS)}}}"
    )


def validate_topic(topic: str) -> str:
    """Return ``topic`` if it is a valid topic *name* to publish to (no wildcards)."""
    if not topic or "+" in topic or "#" in topic or "\0" in topic:
        raise ValueError(
            f"cannot publish to {topic!r}: a topic name must be non-empty and contain no "
            "wildcards ('+', '#')"
        )
    return topic


@lru_cache(maxsize=1024)
def validate_pattern(pattern: str) -> str:
    """Return ``pattern`` if it is a valid MQTT topic filter, else raise ValueError.

    ``+`` must fill a whole level; ``#`` must fill the last level.
    """
    levels = pattern.split("/") if pattern else []
    ok = bool(levels) and "\0" not in pattern
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            ok = False
        if "+" in level and level != "+":
            ok = False
    if not ok:
        raise ValueError(
            f"invalid subscription pattern {pattern!r}: '+' must be a whole level and '#' "
            "the whole last level, e.g. cat/job1/update/+ or cat/job1/#"
        )
    return pattern


@lru_cache(maxsize=1024)
def _levels(pattern: str) -> tuple[str, ...]:
    return tuple(pattern.split("/"))


def matches(pattern: str, topic: str) -> bool:
    """True if topic name ``topic`` matches MQTT filter ``pattern``.

    ``+`` matches exactly one level, a trailing ``#`` matches the parent level and any number
    of levels below it; topics starting with ``$`` are not matched by a leading wildcard.
    """
    if pattern == topic:
        return True
    plevels = _levels(pattern)
    if topic.startswith("$") and plevels[0] in ("+", "#"):
        return False
    tlevels = topic.split("/")
    n = len(tlevels)
    for i, p in enumerate(plevels):
        if p == "#":
            return True
        if i >= n or (p != "+" and p != tlevels[i]):
            return False
    return len(plevels) == n


def literal_prefix(pattern: str) -> str:
    """The longest literal prefix every topic matching ``pattern`` starts with.

    Used as a ZeroMQ SUB prefix filter (exact matching then happens with :func:`matches`):
    ``cat/j/update/+`` -> ``cat/j/update/``; ``cat/j/#`` -> ``cat/j`` (``#`` also matches
    the parent ``cat/j``); ``#`` -> ``""``.
    """
    levels = _levels(validate_pattern(pattern))
    literal: list[str] = []
    for level in levels:
        if level == "+":
            return "/".join(literal) + "/" if literal else ""
        if level == "#":
            return "/".join(literal)
        literal.append(level)
    return pattern
