"""Identity covers every message (issue 20, part 1): signed hellos, status messages and
requests, their counters, the seq floor of updates and the claims a hello may change.

The codec (docs/wire-format.md section 11.1), then the engine against the red team's
findings: an unsigned hello for a signing agent, replays of signed EF21 updates after a
fresh hello, a forged ``offline`` status; the Last Will's one use; claims without keys;
and the new state through a checkpoint and a journal replay.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.engine.admission import MacPolicy
from aggregator.engine.rounds import EngineConfig, RoundEngine
from edge_agent.numerics.compressors import Update
from edge_agent.protocol import mac, messages, topics, wire

pytestmark = pytest.mark.security

JOB = "auth"
D = 8
KEY = bytes(range(32))
KEY_B = bytes(range(2, 34))


def hello(agent: str = "a", **kw: Any) -> messages.Hello:
    fields: dict[str, Any] = {"job": JOB, "agent": agent, "d": D, "rows": 100,
                              "smoothness": 0.25, "model": "logreg", "compressor": "topk",
                              "profile": "wifi_rpi4_mqtt_tls13"}  # fmt: skip
    return messages.Hello(**(fields | kw))


class Signer:
    """What a signing agent sends: sealed JSON with a strictly increasing counter."""

    def __init__(self, agent: str = "a", key: bytes = KEY, start: int = 1000) -> None:
        self.agent, self.key, self.ctr = agent, key, start

    def seal(self, msg: messages.Hello | messages.Status | messages.Request) -> bytes:
        self.ctr += 1
        text = messages.dump(replace(msg, ctr=self.ctr))
        return mac.seal(self.key, msg.type, JOB, self.agent, text)

    def update(self, round: int, seq: int, semantics: str = "plain") -> bytes:
        u = Update("topk", D, np.array([1, 4]), np.array([0.5, -0.25]), semantics=semantics)  # type: ignore[arg-type]
        return wire.encode(u, job=JOB, agent=self.agent, round=round, seq=seq, mac_key=self.key)


def engine(keys: dict[str, bytes] | None = None, **kw: Any) -> RoundEngine:
    policy = MacPolicy(keys={"a": KEY} if keys is None else keys, required=True)
    cfg: dict[str, Any] = {"job": JOB, "d": D, "round_deadline_s": 30.0, "mac": policy} | kw
    return RoundEngine(EngineConfig(**cfg))


def send(eng: RoundEngine, kind: str, payload: bytes, now: float = 1.0, agent: str = "a") -> Any:
    topic = {"hello": topics.hello, "status": topics.status, "request": topics.request,
             "update": topics.update}[kind](JOB, agent)  # fmt: skip
    return eng.handle(topic, payload, now)


# ---------------------------------------------------------------- the codec


def test_sealed_json_round_trip_and_every_flipped_bit_fails() -> None:
    text = messages.dump(hello(ctr=7))
    sealed = mac.seal(KEY, "hello", JOB, "a", text)
    assert len(sealed) == len(text) + 9 and sealed[len(text)] == 0x1E and 0x1E not in text
    assert mac.split_sealed(sealed) == (text, sealed[-8:]) and mac.split_sealed(text) == (
        text,
        None,
    )
    assert mac.verify_sealed(KEY, "hello", JOB, "a", sealed)
    assert messages.parse(messages.Hello, mac.split_sealed(sealed)[0]).ctr == 7
    for pos in range(len(sealed)):
        for bit in range(8):
            bad = bytearray(sealed)
            bad[pos] ^= 1 << bit
            assert not mac.verify_sealed(KEY, "hello", JOB, "a", bytes(bad)), (pos, bit)
    assert not mac.verify_sealed(KEY_B, "hello", JOB, "a", sealed)  # another key
    assert not mac.verify_sealed(KEY, "status", JOB, "a", sealed)  # another kind
    assert not mac.verify_sealed(KEY, "hello", "other", "a", sealed)  # another job
    assert not mac.verify_sealed(KEY, "hello", JOB, "b", sealed)  # another agent
    assert not mac.verify_sealed(KEY, "hello", JOB, "a", text)  # unsigned


def test_the_example_of_the_wire_format_page() -> None:
    """docs/wire-format.md section 11.1: computed from the page's words with the standard
    library alone, and the MAC the page prints, against the reference code."""
    text = b'{"type":"request","want":"snapshot","ctr":5}'
    assert messages.dump(messages.Request(ctr=5)) == text
    signed_input = b"cat-edge/json/1\x00request\x00" + JOB.encode() + b"\x00a\x00" + text
    want = hmac.new(KEY, signed_input, hashlib.sha256).digest()[:8]
    assert mac.seal(KEY, "request", JOB, "a", text) == text + b"\x1e" + want
    page = (Path(__file__).parents[2] / "docs" / "wire-format.md").read_text()
    printed = re.search(r"the MAC `([0-9a-f ]+)`", page)
    assert printed is not None and bytes.fromhex(printed.group(1)) == want


def test_the_counter_increases_within_a_process_and_across_a_restart() -> None:
    c1 = mac.next_counter(None, 1_764_700_000.0005)
    assert c1 == 1_764_700_000_000
    c2 = mac.next_counter(c1, 1_764_700_000.0005)  # same millisecond: +1
    assert c2 == c1 + 1 and mac.next_counter(c2, 1_764_700_100.0) == 1_764_700_100_000
    assert mac.next_counter(None, 1_764_700_001.0) > c2  # a restart one second later


# ---------------------------------------------------------------- the findings


def test_unsigned_hello_for_a_signing_agent_changes_nothing() -> None:
    eng = engine()
    a = Signer()
    assert send(eng, "hello", a.seal(hello())).reason is None
    gamma, before, sent = eng.gamma(), eng.agents["a"].hello, eng.agents["a"].sent
    stranger = hello(rows=1, smoothness=1e-6, profile="lorawan_eu868_dr0_sf12", fresh=True)
    for forged in (messages.dump(stranger), messages.dump(replace(stranger, compressor="randk"))):
        eff = send(eng, "hello", forged, 2.0)
        assert eff.reason == "bad_mac" and not eff.journal and not eff.outbound
    wrong_key = mac.seal(KEY_B, "hello", JOB, "a", messages.dump(replace(stranger, ctr=10**13)))
    assert send(eng, "hello", wrong_key).reason == "bad_mac"
    assert eng.agents["a"].hello == before and eng.gamma() == gamma == 4.0
    assert eng.agents["a"].sent == sent  # nothing charged to its radio either
    assert eng.rejected["bad_mac"] == 3
    assert send(eng, "update", a.update(0, 2000)).reason is None  # not wrong_compressor
    assert eng.version == 1


def test_replayed_or_misdirected_signed_messages_are_refused() -> None:
    eng = engine()
    a = Signer()
    first = a.seal(hello())
    assert send(eng, "hello", first).reason is None
    assert send(eng, "hello", first).reason == "replayed"  # the same hello again
    status = a.seal(messages.Status(state="online", agent="a"))
    request = a.seal(messages.Request(have=None))
    assert send(eng, "request", request).reason is None
    assert send(eng, "status", status).reason == "replayed"  # sealed before the request
    assert send(eng, "request", request).reason == "replayed"
    assert send(eng, "status", a.seal(messages.Request())).reason == "bad_mac"  # wrong kind
    other = Signer()
    other_job = mac.seal(KEY, "hello", "job2", "a", messages.dump(hello(job="job2", ctr=10**6)))
    assert send(eng, "hello", other_job).reason == "bad_mac"  # signed for another job
    assert other.ctr < a.ctr
    assert eng.rejected["replayed"] == 3 and eng.rejected["bad_mac"] == 2
    assert eng.agents["a"].ctr == a.ctr - 1  # the misdirected one (a.ctr) moved nothing


def test_ef21_replays_after_a_fresh_hello_are_refused() -> None:
    eng = engine(feedback="ef21")
    a = Signer()
    assert send(eng, "hello", a.seal(hello(semantics="ef21"))).reason is None
    rounds = [a.update(r, 2000 + r, "ef21") for r in range(3)]
    for r, blob in enumerate(rounds):
        assert send(eng, "update", blob, 1.0 + r).reason is None
    assert eng.version == 3 and eng.accepted == 3
    # the agent restarts: a fresh hello (its counter, from the clock, is above them all)
    restart = Signer(start=a.ctr + 5000)
    nxt = restart.ctr + 2
    assert send(eng, "hello", restart.seal(hello(semantics="ef21", next_seq=nxt))).reason is None
    reasons = [send(eng, "update", blob, 10.0).reason for blob in rounds]
    assert reasons == ["replayed"] * 3 and eng.accepted == 3 and eng.version == 3
    assert eng.agents["a"].seq_floor == nxt
    assert send(eng, "update", restart.update(3, nxt, "ef21"), 11.0).reason is None


def test_a_fresh_hello_whose_next_seq_is_low_still_keeps_the_keys_floor() -> None:
    eng = engine()
    a = Signer()
    assert send(eng, "hello", a.seal(hello())).reason is None
    assert send(eng, "update", a.update(0, 50)).reason is None
    assert send(eng, "hello", a.seal(hello(next_seq=0))).reason is None  # fresh, low next_seq
    assert eng.agents["a"].seq_floor == 51
    assert send(eng, "update", a.update(0, 50)).reason == "replayed"


def test_forged_offline_status_is_ignored_and_the_last_will_counts_once() -> None:
    eng = engine({"a": KEY, "b": KEY_B}, min_agents=2)
    a, b = Signer(), Signer("b", KEY_B)
    will_ctr = b.ctr + 1  # reserved at connect, before the hello
    will = b.seal(messages.Status(state="offline", agent="b"))
    assert send(eng, "hello", a.seal(hello())).reason is None
    assert send(eng, "hello", b.seal(hello("b", will_ctr=will_ctr)), agent="b").reason is None
    assert send(eng, "update", a.update(0, 5000), 2.0).reason is None
    forged = messages.dump(messages.Status(state="offline", agent="b"))
    assert send(eng, "status", forged, 3.0, agent="b").reason == "bad_mac"
    assert eng.tick(3.0).committed is None and eng.version == 0  # still waiting for b
    assert eng.agents["b"].state == "online"
    # the broker publishes b's will: a lower counter, but the one its hello announced
    assert send(eng, "status", will, 4.0, agent="b").reason is None
    assert eng.agents["b"].state == "offline" and eng.agents["b"].will_spent == will_ctr
    assert send(eng, "status", will, 5.0, agent="b").reason == "replayed"  # once only
    # a later hello announcing the spent will again does not re-arm it
    assert send(eng, "hello", b.seal(hello("b", will_ctr=will_ctr)), 6.0, agent="b").reason is None
    assert eng.agents["b"].will_ctr is None
    assert send(eng, "status", will, 7.0, agent="b").reason == "replayed"


def test_without_keys_a_non_fresh_hello_may_not_change_claims() -> None:
    eng = engine(keys={}, mac=MacPolicy())
    assert send(eng, "hello", messages.dump(hello())).reason is None
    changed = hello(smoothness=1e-6, fresh=False)
    eff = send(eng, "hello", messages.dump(changed), 2.0)
    assert eff.reason == "claims_changed" and eng.agents["a"].hello.smoothness == 0.25
    assert send(eng, "hello", messages.dump(hello(fresh=False, version=0))).reason is None
    # a fresh hello (a restart) may change them: what a stranger without keys can still do
    assert send(eng, "hello", messages.dump(replace(changed, fresh=True))).reason is None
    assert eng.agents["a"].hello.smoothness == 1e-6 and eng.rejected["claims_changed"] == 1
    # a signature from an agent the aggregator holds no key for is not checked
    sealed = mac.seal(KEY, "status", JOB, "a", messages.dump(messages.Status(state="done")))
    assert send(eng, "status", sealed, 3.0).reason is None and eng.agents["a"].state == "done"


def test_the_counters_survive_a_checkpoint_and_a_journal_replay() -> None:
    eng = engine({"a": KEY, "b": KEY_B}, min_agents=2)
    a, b = Signer(), Signer("b", KEY_B)
    journal: list[tuple[str, str, bytes, float]] = []

    def feed(kind: str, payload: bytes, now: float, agent: str = "a") -> None:
        eff = send(eng, kind, payload, now, agent)
        assert eff.reason is None
        if eff.journal:
            journal.append((kind, agent, payload, now))

    feed("hello", a.seal(hello(will_ctr=a.ctr + 1)), 0.0)
    feed("hello", b.seal(hello("b")), 0.0, "b")
    snap = eng.export()
    journal.clear()
    feed("update", a.update(0, 9000), 1.0)
    feed("request", a.seal(messages.Request(have=None)), 1.5)
    feed("status", a.seal(messages.Status(state="online", agent="a")), 1.6)  # a repeat
    feed("hello", b.seal(hello("b", fresh=False, version=0, next_seq=7000)), 2.0, "b")
    assert [k for k, *_ in journal] == ["update", "request", "status", "hello"]
    again = RoundEngine.restore(eng.config, snap)
    for kind, agent, payload, now in journal:
        send(again, kind, payload, now, agent)
    assert again.export().meta["agents"] == eng.export().meta["agents"]
    assert again.agents["a"].ctr == a.ctr and again.agents["b"].seq_floor == 7000
    assert again.agents["a"].will_ctr is not None
    restored = RoundEngine.restore(eng.config, eng.export())
    assert send(restored, "request", a.seal(messages.Request(have=None)), 3.0).reason is None
    assert send(restored, "hello", b.seal(hello("b")), 3.0, "b").reason is None
