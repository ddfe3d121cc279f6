"""The per-agent answer topic ``cat/<job>/to/<agent>`` against the shipped broker: the
shipped ACL (``pattern read cat/+/to/%u``) lets each agent read its own answers and no one
else's, and only the aggregator may write them.

Same broker fixture and canary technique as test_deploy_broker.py (imported from it): the
shipped ``mosquitto.conf`` with its memory and queue limits, the shipped ACL unmodified.
"""

from __future__ import annotations

import contextlib

import pytest
from test_deploy_broker import (  # the module-scoped broker fixture and its helpers
    DeployedBroker,
    _agent,
    _aggregator,
    _until_canary,
    broker,
    job,
)

from edge_agent.errors import TransportError
from edge_agent.protocol import topics
from edge_agent.transports import Message

pytestmark = pytest.mark.integration
__all__ = ["broker", "job"]  # fixtures used by name


def test_an_agent_reads_its_own_answers_and_not_another_agents(
    broker: DeployedBroker, job: str
) -> None:
    mine, theirs = topics.to_agent(job, "pi-01"), topics.to_agent(job, "pi-02")
    with (
        _aggregator(broker, job) as agg,
        _agent(broker, "pi-01", job) as owner,
        _agent(broker, "pi-02", job) as snoop,
    ):
        for pattern in topics.agent_subscriptions(job, "pi-01"):
            owner.subscribe(pattern)
        for pattern in topics.agent_subscriptions(job, "pi-02"):
            snoop.subscribe(pattern)
        for pattern in (mine, f"cat/{job}/to/+", f"cat/{job}/#"):
            # Refused in the SUBACK (TransportError) is as good as receiving nothing.
            with contextlib.suppress(TransportError):
                snoop.subscribe(pattern)
        agg.publish(mine, b"snapshot for pi-01 only")
        assert _until_canary(owner, mine, broker) == [Message(mine, b"snapshot for pi-01 only")]
        agg.publish(theirs, b"canary")  # routed after pi-01's answer
        got = _until_canary(snoop, theirs, broker)
    assert got == [Message(theirs, b"canary")], "pi-02 read pi-01's answer"


def test_an_agent_cannot_forge_another_agents_answer(broker: DeployedBroker, job: str) -> None:
    victim_topic = topics.to_agent(job, "pi-02")
    with _aggregator(broker, job) as agg, _agent(broker, "pi-02", job) as victim:
        for pattern in topics.agent_subscriptions(job, "pi-02"):
            victim.subscribe(pattern)
        with _agent(broker, "pi-01", job) as attacker:
            attacker.publish(victim_topic, b"forged snapshot")
            attacker.publish(topics.to_agent(job, "pi-01"), b"to itself")
        assert attacker.stats.dropped == 0  # acknowledged (and dropped by the ACL)
        agg.publish(victim_topic, b"real answer")
        got = _until_canary(victim, victim_topic, broker)
    assert got == [Message(victim_topic, b"real answer")]
