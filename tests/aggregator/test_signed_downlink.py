"""Signed downlinks on the aggregator's side: every published message carries a signature
that verifies, and the accounts (published bytes, each agent's downlink charge, pacing)
count the signed bytes, not the unsigned ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from aggregator.engine.downlink.outbound import Outbound
from aggregator.engine.rounds import EngineConfig, RoundEngine
from aggregator.service.settings import Settings, SettingsError
from aggregator.sim.harness import FleetHarness
from edge_agent.agent.loop import AgentConfig
from edge_agent.data import make_rcv1_like
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.models import make_model
from edge_agent.protocol import topics
from edge_agent.protocol.signing import (
    TRAILER_BYTES,
    CountingSigner,
    Signer,
    Verifier,
    open_signed,
    write_keypair,
)
from edge_agent.transports import Message

JOB = "signed"
D = 60
SIGNER = Signer(bytes(range(32)))


def _run(*, signed: bool, profile: str = "lorawan_eu868_dr0_sf12") -> FleetHarness:
    """Two agents, three versions, downlink pacing on; the harness left open."""
    engine = RoundEngine(
        EngineConfig(
            job=JOB, d=D, min_agents=2, step_size=0.5, feedback="none", downlink_pacing=True
        ),
        profiles=lambda name: resolve_profile(name),
    )
    seal = CountingSigner(SIGNER) if signed else None
    harness = FleetHarness(engine, name="signed", seal=seal)
    keys = (SIGNER.public_key,) if signed else ()
    for i in range(2):
        harness.add_agent(
            AgentConfig(job=JOB, agent_id=f"a{i}", policy="fixed:6", resend_s=None,
                        duty_cycle="ignore", seed=i, aggregator_keys=keys),
            model=make_model("logreg", n_features=D),
            data=make_rcv1_like(40, D, rng=np.random.default_rng(i), nnz_per_row=8),
            profile=resolve_profile(profile),
        )  # fmt: skip
    harness.start()
    harness.pump(strict=True)
    for _ in range(40):  # bounded: each turn moves the clock past the downlinks' holds
        if harness.engine.version >= 3:
            break
        harness.deliver()
        harness.step()
        harness.clock.now = max(harness.clock.now, harness.engine.traffic.next_version_at) + 1.0
        harness.pump()
    harness.deliver()
    return harness


def test_signing_adds_exactly_the_trailers_to_every_account() -> None:
    with _run(signed=False) as plain, _run(signed=True) as signed:
        assert signed.engine.version == plain.engine.version == 3
        for a, b in zip(signed.agents, plain.agents, strict=True):
            assert a.x is not None and b.x is not None and a.x.tobytes() == b.x.tobytes()
            assert a.counters.dropped == {} and a.signatures.enforced
        published_s, published_p = signed.engine.traffic.published, plain.engine.traffic.published
        assert {k: v[0] for k, v in published_s.items()} == {
            k: v[0] for k, v in published_p.items()
        }
        for kind, (count, size) in published_s.items():
            assert size - published_p[kind][1] == TRAILER_BYTES * count, kind
        for agent in signed.engine.agents:
            sa, pa = signed.engine.agents[agent], plain.engine.agents[agent]
            assert sa.down.messages == pa.down.messages > 0
            # each message the engine charged the agent is 74 bytes longer, and costs more
            assert sa.down.bytes - pa.down.bytes == TRAILER_BYTES * sa.down.messages
            assert sa.down.airtime_s > pa.down.airtime_s and sa.down.energy_j > pa.down.energy_j
            got = next(a for a in signed.agents if a.config.agent_id == agent).ledger.down
            had = next(a for a in plain.agents if a.config.agent_id == agent).ledger.down
            assert got.messages == had.messages  # and so does each message it received
            assert got.bytes - had.bytes == TRAILER_BYTES * got.messages
        # pacing saw the longer messages: the next version may close later
        assert signed.engine.traffic.next_version_at > plain.engine.traffic.next_version_at


def test_every_published_message_verifies_for_its_topic() -> None:
    with _run(signed=True) as harness:
        sealed = [
            Outbound(topics.control(JOB), b'{"type":"control","cmd":"pause"}').sealed(
                harness.seal  # type: ignore[arg-type]
            ),
            harness.engine.snapshot_message().sealed(harness.seal),  # type: ignore[arg-type]
        ]
        verifier = Verifier([SIGNER.public_key])
        counters = []
        for out in sealed:
            opened = open_signed(out.payload)
            assert opened is not None and verifier.verify(out.topic, opened)
            counters.append(opened.counter)
        assert counters == sorted(counters) and len(set(counters)) == 2
        assert [o.kind for o in sealed] == ["control", "snapshot"]
        for agent in harness.agents:  # the agents checked every message they acted on
            assert agent.signatures.highest and agent.counters.dropped == {}
            agent.handle(Message(topics.control(JOB), b'{"type":"control","cmd":"stop"}'))
            assert not agent.finished and agent.counters.dropped == {"unsigned": 1}


def test_the_setting_reads_the_key_file_and_nothing_is_signed_without_it(tmp_path: Path) -> None:
    _, secret = write_keypair(tmp_path / "keys")
    base = {"job": JOB, "d": D, "transports": ["memory://x"], "data_dir": tmp_path / "data"}
    assert Settings(**base).downlink_signer() is None  # type: ignore[arg-type]
    signer = Settings(**base, signing_key_file=secret).downlink_signer()  # type: ignore[arg-type]
    assert signer is not None
    first, second = (open_signed(signer("cat/signed/control", b"{}")) for _ in range(2))
    assert first is not None and second is not None and second.counter > first.counter
    assert first.counter > 1_700_000_000 * 10**6  # microseconds of wall time: survives restarts
    bad = tmp_path / "bad.secret"
    bad.write_text("zz\n")
    with pytest.raises(SettingsError, match="AGG_SIGNING_KEY_FILE"):
        Settings(**base, signing_key_file=bad).downlink_signer()  # type: ignore[arg-type]
