"""memory:// transport, topic namespace, URL parsing and the transport registry."""

from __future__ import annotations

import re
import threading

import pytest

from edge_agent.errors import TransportError, UnknownNameError
from edge_agent.protocol import topics
from edge_agent.transports import MemoryTransport, Message, open_transport, parse_url


def _pair(url: str) -> tuple[MemoryTransport, MemoryTransport]:
    agg = open_transport(url, role="aggregator", client_id="agg")
    agent = open_transport(url, role="agent", client_id="a1")
    assert isinstance(agg, MemoryTransport) and isinstance(agent, MemoryTransport)
    return agg, agent


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("cat/j/model", "cat/j/model", True),
        ("cat/j/model", "cat/j/delta", False),
        ("cat/j/update/+", "cat/j/update/a1", True),
        ("cat/j/update/+", "cat/j/update", False),
        ("cat/j/update/+", "cat/j/update/a1/x", False),
        ("cat/+/model", "cat/j/model", True),
        ("+/+/+", "cat/j/model", True),
        ("+", "cat", True),
        ("+", "cat/j", False),
        ("cat/j/#", "cat/j", True),
        ("cat/j/#", "cat/j/update/a1", True),
        ("cat/j/#", "cat/k/model", False),
        ("#", "cat/j/model", True),
        ("#", "$SYS/broker/uptime", False),
        ("+/broker/uptime", "$SYS/broker/uptime", False),
        ("$SYS/#", "$SYS/broker/uptime", True),
        ("cat/j/+/a1", "cat/j/update/a1", True),
        ("cat/j/+/a1", "cat/j/update/a2", False),
        ("cat/j/", "cat/j/", True),
        ("cat/j/+", "cat/j/", True),
    ],
)
def test_wildcard_matching_follows_mqtt(pattern: str, topic: str, expected: bool) -> None:
    assert topics.matches(pattern, topic) is expected


@pytest.mark.parametrize("pattern", ["", "cat/#/x", "cat/j#", "cat/j+/x", "cat/+x"])
def test_invalid_patterns_are_rejected(pattern: str) -> None:
    with pytest.raises(ValueError, match="invalid subscription pattern"):
        topics.validate_pattern(pattern)


def test_literal_prefix_for_zmq_filters() -> None:
    assert topics.literal_prefix("cat/j/update/+") == "cat/j/update/"
    assert topics.literal_prefix("cat/j/#") == "cat/j"
    assert topics.literal_prefix("cat/j/model") == "cat/j/model"
    assert topics.literal_prefix("#") == ""
    assert topics.literal_prefix("+/j") == ""


def test_topic_builders_and_parse_round_trip() -> None:
    assert topics.update("job1", "dev-7") == "cat/job1/update/dev-7"
    assert topics.model("job1") == "cat/job1/model"
    assert topics.parse(topics.hello("job1", "a.b_c")) == ("job1", "hello", "a.b_c")
    assert topics.parse(topics.delta("job1")) == ("job1", "delta", None)
    # hellos of every job (a wrong-job agent is counted), the rest of this job only
    assert topics.agent_inbound("j") == [
        "cat/+/hello/+",
        "cat/j/update/+",
        "cat/j/status/+",
        "cat/j/request/+",
    ]
    assert topics.agent_subscriptions("j") == [
        "cat/j/model",
        "cat/j/delta",
        "cat/j/control",
        "cat/j/job",
    ]
    for kind in ("update", "hello", "status", "request"):
        pattern = f"cat/{'+' if kind == 'hello' else 'j'}/{kind}/+"
        assert pattern in topics.agent_inbound("j")
        assert topics.matches(pattern, getattr(topics, kind)("j", "a1"))


@pytest.mark.parametrize(
    "topic", ["cat/j/bogus/a1", "cat/j/update", "cat/j/model/x", "dog/j/model", "cat/j/x/y/z"]
)
def test_parse_rejects_foreign_topics(topic: str) -> None:
    with pytest.raises(ValueError, match="not in the cat-edge namespace"):
        topics.parse(topic)


@pytest.mark.parametrize("bad", ["", "a/b", "a+", "a#", "a b", "x" * 65, "é"])
def test_validate_id_names_the_bad_id(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid agent id") as info:
        topics.update("job", bad)
    assert "A-Z a-z 0-9 . _ -" in str(info.value)


def test_parse_url_defaults_credentials_and_options() -> None:
    assert parse_url("mqtt://broker") == ("mqtt", "broker", 1883, {})
    assert parse_url("mqtts://h") == ("mqtts", "h", 8883, {})
    parsed = parse_url("mqtt://u%40x:p%3Aw@h:1999?timeout_s=2")
    assert parsed == ("mqtt", "h", 1999, {"timeout_s": "2", "username": "u@x", "password": "p:w"})
    assert parse_url("memory://sim") == ("memory", "sim", None, {})
    assert parse_url("zmq+tcp://0.0.0.0:5555").port == 5555


@pytest.mark.parametrize("url", ["broker:1883", "mqtt://h:99999", "mqtt://h/path", "mqtt://"])
def test_parse_url_errors_name_the_url_and_show_an_example(url: str) -> None:
    with pytest.raises(TransportError) as info:
        parse_url(url)
    message = str(info.value)
    assert repr(url) in message
    assert re.search(r"(e\.g\.|examples:) [a-z+]+://\S+", message)


def test_unknown_scheme_lists_valid_schemes() -> None:
    with pytest.raises(UnknownNameError, match=r"memory, mqtt, mqtts, zmq\+tcp"):
        open_transport("amqp://h:5672", role="agent", client_id="a1")


def test_unknown_option_is_an_error(memory_url: str) -> None:
    with pytest.raises(TransportError, match="unknown option"):
        open_transport(memory_url + "?tiemout_s=3", role="agent", client_id="a1")


def test_round_trip_both_directions(memory_url: str) -> None:
    agg, agent = _pair(memory_url)
    with agg, agent:
        for pattern in topics.agent_inbound("j"):
            agg.subscribe(pattern)
        for pattern in topics.agent_subscriptions("j"):
            agent.subscribe(pattern)
        agent.publish(topics.update("j", "a1"), b"u")
        agg.publish(topics.delta("j"), b"d")
        assert agg.recv(1.0) == Message("cat/j/update/a1", b"u")
        assert agent.recv(1.0) == Message("cat/j/delta", b"d")
        assert agg.recv(0.0) is None  # the aggregator is not subscribed to its own delta


def test_retained_message_is_delivered_to_late_subscriber(memory_url: str) -> None:
    agg, agent = _pair(memory_url)
    with agg, agent:
        agg.publish(topics.model("j"), b"v1", retain=True)
        agg.publish(topics.model("j"), b"v2", retain=True)
        agent.subscribe(topics.model("j"))
        assert agent.recv(1.0) == Message("cat/j/model", b"v2")
        assert agent.recv(0.0) is None


def test_empty_retained_payload_clears_the_retained_message(memory_url: str) -> None:
    agg, agent = _pair(memory_url)
    with agg, agent:
        agg.publish(topics.model("j"), b"v1", retain=True)
        agg.publish(topics.model("j"), b"", retain=True)
        agent.subscribe(topics.model("j"))
        assert agent.recv(0.0) is None


def test_many_messages_arrive_complete_and_in_order(memory_url: str) -> None:
    agg, agent = _pair(memory_url)
    n = 20_000
    with agg, agent:
        agg.subscribe("cat/j/update/+")
        topic = topics.update("j", "a1")
        for i in range(n):
            agent.publish(topic, i.to_bytes(4, "big"))
        received = [agg.recv(1.0) for _ in range(n)]
        assert [int.from_bytes(m.payload, "big") for m in received if m] == list(range(n))
        assert agg.stats.received == n and agent.stats.published == n


def test_overlapping_subscriptions_deliver_one_copy(memory_url: str) -> None:
    agg, agent = _pair(memory_url)
    with agg, agent:
        agg.subscribe("cat/j/#")
        agg.subscribe("cat/j/update/+")
        agent.publish(topics.update("j", "a1"), b"u")
        assert agg.recv(1.0) is not None
        assert agg.recv(0.0) is None


def test_concurrent_publishers_lose_nothing(memory_url: str) -> None:
    agg = open_transport(memory_url, role="aggregator", client_id="agg")
    agents = [open_transport(memory_url, role="agent", client_id=f"a{i}") for i in range(4)]
    with agg:
        agg.subscribe("cat/j/update/+")
        for a in agents:
            a.connect()

        def run(t: object, name: str) -> None:
            assert isinstance(t, MemoryTransport)
            for i in range(2000):
                t.publish(topics.update("j", name), i.to_bytes(4, "big"))

        threads = [threading.Thread(target=run, args=(a, f"a{i}")) for i, a in enumerate(agents)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(10)
        per_agent: dict[str, list[int]] = {}
        while (m := agg.recv(0.0)) is not None:
            per_agent.setdefault(m.topic, []).append(int.from_bytes(m.payload, "big"))
        assert {k: v == list(range(2000)) for k, v in per_agent.items()} == {
            topics.update("j", f"a{i}"): True for i in range(4)
        }
        for a in agents:
            a.close()


def test_publish_before_connect_is_sent_on_connect(memory_url: str) -> None:
    agg, agent = _pair(memory_url)
    with agg:
        agg.subscribe("cat/j/hello/+")
        agent.publish(topics.hello("j", "a1"), b"hi")
        assert agg.recv(0.0) is None
        agent.connect()
        assert agg.recv(1.0) == Message("cat/j/hello/a1", b"hi")
        agent.close()


def test_kill_publishes_the_last_will_and_close_does_not(memory_url: str) -> None:
    agg = open_transport(memory_url, role="aggregator", client_id="agg")
    with agg:
        agg.subscribe("cat/j/status/+")
        polite = open_transport(memory_url, role="agent", client_id="a1")
        polite.set_will(topics.status("j", "a1"), b'{"state": "offline"}')
        with polite:
            pass
        assert agg.recv(0.0) is None
        doomed = open_transport(memory_url, role="agent", client_id="a2")
        assert isinstance(doomed, MemoryTransport)
        doomed.set_will(topics.status("j", "a2"), b'{"state": "offline"}')
        doomed.connect()
        doomed.kill()
        assert agg.recv(1.0) == Message("cat/j/status/a2", b'{"state": "offline"}')


def test_recv_returns_none_after_timeout_and_after_close(memory_url: str) -> None:
    agg, _ = _pair(memory_url)
    agg.connect()
    assert agg.recv(0.05) is None
    threading.Timer(0.1, agg.close).start()
    assert agg.recv(None) is None  # woken by close(), not stuck forever


def test_publish_after_close_raises(memory_url: str) -> None:
    agg, _ = _pair(memory_url)
    with agg:
        pass
    with pytest.raises(TransportError, match="after close"):
        agg.publish(topics.model("j"), b"x")


def test_publish_rejects_wildcard_topics(memory_url: str) -> None:
    agg, _ = _pair(memory_url)
    with agg, pytest.raises(ValueError, match="wildcards"):
        agg.publish("cat/j/+", b"x")


def test_same_name_reaches_same_broker_and_other_names_are_isolated(memory_url: str) -> None:
    other = memory_url + "-other"
    a = open_transport(memory_url, role="aggregator", client_id="agg")
    b = open_transport(memory_url, role="agent", client_id="a1")
    c = open_transport(other, role="agent", client_id="a2")
    with a, b, c:
        a.subscribe("#")
        c.publish("cat/j/hello/a2", b"elsewhere")
        b.publish("cat/j/hello/a1", b"here")
        assert a.recv(1.0) == Message("cat/j/hello/a1", b"here")
        assert a.recv(0.0) is None
