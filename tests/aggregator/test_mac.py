"""Signed updates (issue 13, deliver 3): an 8-byte HMAC-SHA256 per update, keyed per agent.

The wire form (docs/wire-format.md section 3.3), the batch decoder's agreement with the
single one, CAT's price of the 8 bytes, the engine's ``bad_mac`` refusals and require mode,
replays caught by the (agent, round, seq) de-duplication, the settings and the CLI, and a
fleet of signing agents training over memory://.
"""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.engine.admission import MacPolicy
from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.service.settings import SettingsError, load_settings
from aggregator.sim.harness import FleetHarness
from edge_agent.agent.loop import AgentConfig
from edge_agent.cli import commands as cli
from edge_agent.data import make_rcv1_like, write_libsvm
from edge_agent.errors import WireFormatError
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.compressors import Update
from edge_agent.numerics.models import make_model
from edge_agent.numerics.selection import make_price
from edge_agent.protocol import mac, messages, topics, wire
from edge_agent.protocol.wire_many import decode_many

pytestmark = pytest.mark.security

JOB = "signed"
D = 16
KEY_A = bytes(range(32))
KEY_B = bytes(range(1, 33))


def topk(index: list[int], values: list[float]) -> Update:
    return Update("topk", D, np.asarray(index, np.int64), np.asarray(values, np.float64))


def signed(agent: str = "a", key: bytes | None = KEY_A, **kw: Any) -> bytes:
    fields: dict[str, Any] = {"round": 0, "seq": 0} | kw
    return wire.encode(
        topk([1, 5, 9], [0.25, -0.5, 1.0]),
        job=JOB,
        agent=agent,
        value_dtype="float64",
        mac_key=key,
        **fields,
    )


def engine(keys: dict[str, bytes], required: bool = False) -> RoundEngine:
    cfg = EngineConfig(
        job=JOB, d=D, round_deadline_s=10.0, mac=MacPolicy(keys=keys, required=required)
    )
    eng = RoundEngine(cfg)
    for agent in ("a", "b"):
        hello = messages.Hello(
            job=JOB,
            agent=agent,
            d=D,
            rows=10,
            smoothness=2.0,
            model="logreg",
            compressor="topk",
        )
        text = messages.dump(hello)
        key = keys.get(agent)  # an agent with a key signs its hello (wire-format 11.1)
        if key is not None:
            text = mac.seal(key, "hello", JOB, agent, messages.dump(replace(hello, ctr=1)))
        refused = "bad_mac" if required and key is None else None  # require: every agent signs
        assert eng.handle(topics.hello(JOB, agent), text, 0.0).reason == refused
    return eng


def send(eng: RoundEngine, agent: str, blob: bytes) -> str | None:
    return eng.handle(topics.update(JOB, agent), blob, 1.0).reason


# ---------------------------------------------------------------- wire


def test_round_trip_reports_the_mac_and_verifies() -> None:
    blob = signed()
    header, update = wire.decode(blob)
    assert header.mac and (header.agent, header.round, header.seq) == ("a", 0, 0)
    assert update.indices is not None and update.indices.tolist() == [1, 5, 9]
    assert mac.verify(KEY_A, blob) and not mac.verify(KEY_B, blob)
    plain = signed(key=None)
    assert not wire.decode(plain)[0].mac and not mac.verify(KEY_A, plain)
    assert blob[:-8] == plain[:5] + bytes([plain[5] | mac.FLAG_MAC]) + plain[6:]


def test_a_flipped_bit_anywhere_fails_verification() -> None:
    blob = signed()
    for pos in range(len(blob)):
        for bit in range(8):
            bad = bytearray(blob)
            bad[pos] ^= 1 << bit
            assert not mac.verify(KEY_A, bytes(bad)), (pos, bit)


def test_encoded_size_prices_the_mac_and_cat_pays_for_it() -> None:
    t = np.arange(0, D + 1)
    kw: dict[str, Any] = {"d": D, "job": JOB, "agent": "a", "round": 3, "seq": 2}
    plain = np.asarray(wire.encoded_size("topk", t=t, **kw))
    with_mac = np.asarray(wire.encoded_size("topk", t=t, mac=True, **kw))
    assert (with_mac - plain).tolist() == [8] * (D + 1)
    rng = np.random.default_rng(0)
    for k in (0, 1, 7, D):
        idx = np.sort(rng.choice(D, k, replace=False))
        u = Update("topk", D, idx, rng.standard_normal(k).astype(np.float32))
        blob = wire.encode(u, job=JOB, agent="a", round=3, seq=2, mac_key=KEY_A)
        assert len(blob) == int(with_mac[k])
    profile = resolve_profile("paper_payload_bits")
    p_plain = make_price(profile, "topk", **kw)(t)
    p_mac = make_price(profile, "topk", mac=True, **kw)(t)
    assert np.array_equal(p_mac, profile.objective_cost(with_mac))
    assert (p_mac > p_plain).all()


def _corruptions(blob: bytes, rng: np.random.Generator) -> list[bytes]:
    out = [blob[:-1], blob + b"\x00", blob[: len(blob) - 8]]
    for _ in range(40):
        bad = bytearray(blob)
        bad[int(rng.integers(len(bad)))] ^= 1 << int(rng.integers(8))
        out.append(bytes(bad))
    return out


def _outcome(r: Any) -> Any:
    if isinstance(r, WireFormatError):
        return ("error", r.reason)
    header, u = r
    return (header, u.compressor, u.t, None if u.indices is None else u.indices.tolist(),
            np.asarray(u.values).tolist(), u.scale)  # fmt: skip


def test_decode_many_agrees_with_decode_on_signed_unsigned_and_corrupted() -> None:
    rng = np.random.default_rng(13)
    blobs: list[bytes] = []
    for compressor in ("topk", "signtopk", "randk", "dense"):
        for k in (0, 1, 5, D):
            idx = np.sort(rng.choice(D, k, replace=False))
            if compressor == "signtopk":
                u = Update(compressor, D, idx, rng.choice(np.array([-1, 1], np.int8), k), scale=0.5)
            elif compressor == "dense":
                u = Update(compressor, D, None, rng.standard_normal(D).astype(np.float32))
            else:
                u = Update(compressor, D, idx, rng.standard_normal(k).astype(np.float32))
            for key in (None, KEY_A):
                blob = wire.encode(u, job=JOB, agent="a", round=1, seq=k, mac_key=key)
                blobs.append(blob)
                blobs.extend(_corruptions(blob, rng))
    many = decode_many(blobs)
    signed_ok = 0
    for blob, got in zip(blobs, many, strict=True):
        try:
            want: Any = wire.decode(blob)
        except WireFormatError as exc:
            want = exc
        assert _outcome(got) == _outcome(want), blob.hex()
        signed_ok += not isinstance(got, WireFormatError) and got[0].mac
    assert signed_ok >= 16


# ---------------------------------------------------------------- the engine


def test_a_valid_mac_is_accepted_and_a_replay_is_a_duplicate() -> None:
    eng = engine({"a": KEY_A})
    blob = signed()
    assert send(eng, "a", blob) is None
    assert send(eng, "a", blob) == "duplicate"  # the same valid message again
    assert eng.rejected["duplicate"] == 1 and eng.rejected["bad_mac"] == 0


def test_forged_or_wrong_key_or_unsigned_updates_are_bad_mac() -> None:
    eng = engine({"a": KEY_A, "b": KEY_B})
    x0 = eng.x.copy()
    forged = signed()[:-8] + bytes(8)
    assert send(eng, "a", forged) == "bad_mac"
    assert send(eng, "a", signed(key=KEY_B)) == "bad_mac"  # b's key for a's id
    assert send(eng, "a", signed(key=None)) == "bad_mac"  # a has a key: it must sign
    tampered = bytearray(signed())
    tampered[-12] ^= 0x01  # a value bit: still decodes
    assert send(eng, "a", bytes(tampered)) == "bad_mac"
    assert eng.rejected["bad_mac"] == 4
    assert eng.x.tobytes() == x0.tobytes() and eng.version == 0
    # the refusals left no key behind: the genuine message is then accepted
    assert send(eng, "a", signed()) is None


def test_without_require_an_agent_without_a_key_may_send_unsigned() -> None:
    eng = engine({"a": KEY_A})
    assert send(eng, "b", signed("b", key=None)) is None


def test_require_mode_refuses_unsigned_and_keyless_agents() -> None:
    eng = engine({"a": KEY_A}, required=True)
    assert send(eng, "a", signed(key=None)) == "bad_mac"
    assert send(eng, "b", signed("b", key=None)) == "bad_mac"  # b has no key
    assert send(eng, "b", signed("b", key=KEY_B)) == "bad_mac"  # signed, but unverifiable
    assert eng.rejected["bad_mac"] == 4  # and b's hello before them
    assert send(eng, "a", signed()) is None


def test_keys_never_show_in_a_repr() -> None:
    policy = MacPolicy(keys={"a": KEY_A}, required=True)
    assert KEY_A.hex() not in repr(policy) and repr(KEY_A) not in repr(policy)


# ---------------------------------------------------------------- keys, settings, CLI


def test_keys_mac_writes_a_private_32_byte_key_and_never_overwrites(tmp_path: Path) -> None:
    assert cli.main(["keys", "mac", "--agent-id", "pi-01", "--out", str(tmp_path)]) == 0
    path = tmp_path / "pi-01.mac"
    assert len(path.read_bytes()) == 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    before = path.read_bytes()
    with pytest.raises(mac.MacKeyError, match="exists"):
        mac.write_key(tmp_path, "pi-01")
    assert path.read_bytes() == before
    assert mac.read_keys_dir(tmp_path) == {"pi-01": before}


def test_settings_load_the_keys_and_require_needs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mac.write_key(tmp_path, "a")
    (tmp_path / "short.mac").write_bytes(b"x" * 5)
    monkeypatch.setenv("AGG_MAC_KEYS_DIR", str(tmp_path))
    with pytest.raises(SettingsError, match=r"AGG_MAC_KEYS_DIR.*32 bytes"):
        load_settings(job=JOB, d=D).engine_config()
    (tmp_path / "short.mac").unlink()
    monkeypatch.setenv("AGG_REQUIRE_MAC", "true")
    policy = load_settings(job=JOB, d=D).engine_config().mac
    assert policy.required and set(policy.keys) == {"a"} and len(policy.keys["a"]) == 32
    monkeypatch.delenv("AGG_MAC_KEYS_DIR")
    with pytest.raises(SettingsError, match="AGG_REQUIRE_MAC"):
        load_settings(job=JOB, d=D).engine_config()


def test_run_mac_key_file_makes_the_agent_sign(tmp_path: Path) -> None:
    data = tmp_path / "shard.svm"
    write_libsvm(make_rcv1_like(20, 30, rng=np.random.default_rng(0)), data)
    key = mac.write_key(tmp_path, "a")
    base = ["run", "--profile", "wifi_rpi4_mqtt_tls13", "--data", str(data)]
    base += ["--server", "memory://mac-cli", "--agent-id", "a"]
    agent = cli._build_agent(cli.build_parser().parse_args([*base, "--mac-key-file", str(key)]))
    assert agent.config.mac_key == key.read_bytes()
    agent.transport.close()
    (tmp_path / "bad.mac").write_bytes(b"short")
    with pytest.raises(mac.MacKeyError, match="32 bytes"):
        cli._build_agent(
            cli.build_parser().parse_args([*base, "--mac-key-file", str(tmp_path / "bad.mac")])
        )


# ---------------------------------------------------------------- end to end


def _fleet(keys: dict[str, bytes], agent_keys: dict[str, bytes], required: bool) -> FleetHarness:
    mac_policy = MacPolicy(keys=keys, required=required)
    eng = RoundEngine(EngineConfig(job=JOB, d=60, min_agents=2, step_size=0.5, mac=mac_policy))
    fleet = FleetHarness(eng, name="mac")
    for i, agent in enumerate(("a", "b")):
        fleet.add_agent(
            AgentConfig(job=JOB, agent_id=agent, policy="cat", resend_s=None,
                        duty_cycle="ignore", seed=i, mac_key=agent_keys.get(agent)),
            model=make_model("logreg", n_features=60),
            data=make_rcv1_like(60, 60, rng=np.random.default_rng(i), nnz_per_row=8),
            profile=resolve_profile("paper_payload_bits"),
        )  # fmt: skip
    return fleet


def _objective(fleet: FleetHarness) -> float:
    model = make_model("logreg", n_features=60)
    total = 0.0
    for agent in fleet.agents:
        loss, _ = model.loss_grad(fleet.engine.x, agent.data)
        total += float(loss)
    return total


def test_signing_agents_train_over_memory_with_require_mode() -> None:
    keys = {"a": KEY_A, "b": KEY_B}
    with _fleet(keys, keys, required=True) as fleet:
        fleet.start()
        fleet.pump(strict=True)
        start = _objective(fleet)
        for _ in range(8):
            fleet.deliver()
            logs = fleet.step()
            assert all(e is not None for e in logs)
            for e in logs:  # the ledger counts the signed size: 8 bytes over the unsigned
                assert e is not None and e.size_bytes == wire.encoded_size(
                    "topk", d=60, t=e.t, job=JOB, agent="a", round=e.round, seq=e.seq, mac=True
                )
            fleet.clock.now += 1.0
            fleet.pump(strict=True)  # strict: any refusal (bad_mac included) raises
        fleet.deliver()
        assert fleet.engine.version == 8 and fleet.engine.rejected["bad_mac"] == 0
        assert _objective(fleet) < start
        for agent in fleet.agents:  # the relay carries signed bodies; replicas follow
            assert agent.x is not None and agent.x.tobytes() == fleet.engine.x.tobytes()


def test_an_agent_with_the_wrong_key_is_refused_and_the_job_goes_on() -> None:
    with _fleet({"a": KEY_A, "b": KEY_B}, {"a": KEY_A, "b": KEY_A}, required=False) as fleet:
        fleet.start()
        # b's hello and request, signed with a's key, are refused: b never registers
        reasons = [e.reason for e in fleet.pump()]
        assert reasons.count("bad_mac") == 2 and set(fleet.engine.agents) == {"a"}
        eng = fleet.engine
        blob = wire.encode(topk([1], [0.5]), job=JOB, agent="b", round=0, seq=0, mac_key=KEY_A)
        assert eng.handle(topics.update(JOB, "b"), blob, 1.0).reason == "bad_mac"
        assert eng.rejected["bad_mac"] == 3 and eng.x.tobytes() == bytes(8 * 60)
