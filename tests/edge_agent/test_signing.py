"""Signed downlinks (docs/wire-format.md section 13): sign, verify, tamper, keys, vectors."""

from __future__ import annotations

import re
import stat
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edge_agent.errors import WireFormatError
from edge_agent.protocol import jobinfo, messages
from edge_agent.protocol.downlink import decode_downlink, encode_state, encode_steps, step_op
from edge_agent.protocol.signing import (
    TRAILER_BYTES,
    CountingSigner,
    Signer,
    SigningKeyError,
    Verifier,
    is_signed,
    open_signed,
    read_public_key,
    read_secret_key,
    strip,
    write_keypair,
)
from edge_agent.protocol.wire import encode_delta, encode_snapshot

SPEC = Path(__file__).resolve().parents[2] / "docs" / "wire-format.md"
DOC_SEED = bytes(range(32))
SIGNER = Signer(DOC_SEED)
OTHER = Signer(bytes(range(1, 33)))
STOP = messages.dump(messages.Control(cmd="stop", version=8))
JOB_INFO = jobinfo.JobInfo(
    job="demo", d=3, model="logreg", feedback="none", family="mean", compressors=("topk",)
).dump()

MESSAGES = {
    "snapshot": ("cat/demo/model", encode_snapshot([0.0, 1.5, -2.25], job="demo", version=8)),
    "delta": (
        "cat/demo/delta",
        encode_delta([1], [2.0], job="demo", base_version=7, version=8, d=3),
    ),
    "steps": (
        "cat/demo/delta",
        encode_steps([step_op(0.5)], job="demo", d=3, base_version=7, version=8, family="mean"),
    ),
    "state": ("cat/demo/to/pi-01", encode_state([0.0, 1.0, 0.0], job="demo", version=8)),
    "control": ("cat/demo/control", STOP),
    "job": ("cat/demo/job", JOB_INFO),
}


def _same(a: object, b: object) -> bool:
    """Decoded downlink messages compare field by field (their arrays by value)."""
    if type(a) is not type(b):
        return False
    for key, va in vars(a).items():
        vb = vars(b)[key]
        if isinstance(va, np.ndarray):
            if not np.array_equal(va, vb):
                return False
        elif key != "ops" and va != vb:
            return False
    return True


@pytest.mark.parametrize("kind", sorted(MESSAGES))
def test_a_sealed_message_verifies_and_opens_to_the_original(kind: str) -> None:
    topic, payload = MESSAGES[kind]
    sealed = SIGNER.seal(topic, payload, 42)
    assert len(sealed) == len(payload) + TRAILER_BYTES and is_signed(sealed)
    assert not is_signed(payload)
    opened = open_signed(sealed)
    assert opened is not None and opened.message == payload and opened.counter == 42
    assert Verifier([SIGNER.public_key]).verify(topic, opened)
    assert strip(sealed) == payload and strip(payload) == payload
    if payload[:1] != b"{":
        assert _same(decode_downlink(strip(sealed)), decode_downlink(payload))


@pytest.mark.parametrize("kind", ["snapshot", "control"])
def test_any_flipped_bit_or_another_topic_or_key_fails(kind: str) -> None:
    topic, payload = MESSAGES[kind]
    sealed = SIGNER.seal(topic, payload, 7)
    verifier = Verifier([SIGNER.public_key])
    for pos in range(len(sealed)):
        for bit in (0x01, 0x80):
            bad = bytearray(sealed)
            bad[pos] ^= bit
            try:
                opened = open_signed(bytes(bad))
            except WireFormatError:
                continue
            assert opened is None or not verifier.verify(topic, opened), (pos, bit)
    opened = open_signed(sealed)
    assert opened is not None
    assert not verifier.verify("cat/demo/to/pi-02", opened)  # bound to its topic
    assert not verifier.verify("cat/other/control", opened)  # and to its job
    assert not Verifier([OTHER.public_key]).verify(topic, opened)
    assert Verifier([OTHER.public_key, SIGNER.public_key]).verify(topic, opened)  # rotation


def test_todays_decoders_refuse_a_signed_message_as_a_whole() -> None:
    """Section 10: the flag bit (binary) and the trailing bytes (JSON) make a decoder that
    predates signing reject the message; it never misreads one."""
    for kind in ("snapshot", "delta", "steps", "state"):
        topic, payload = MESSAGES[kind]
        with pytest.raises(WireFormatError):
            decode_downlink(SIGNER.seal(topic, payload, 1))
    with pytest.raises(WireFormatError):
        messages.parse(messages.Control, SIGNER.seal("cat/demo/control", STOP, 1))
    with pytest.raises(WireFormatError):
        jobinfo.parse(SIGNER.seal("cat/demo/job", JOB_INFO, 1))


def test_a_flagged_message_without_its_trailer_is_malformed() -> None:
    snap = bytearray(MESSAGES["snapshot"][1])
    snap[5] |= 0x10
    with pytest.raises(WireFormatError):
        open_signed(bytes(snap))
    with pytest.raises(WireFormatError):
        strip(bytes(snap))
    signed = SIGNER.seal("cat/demo/model", MESSAGES["snapshot"][1], 1)
    with pytest.raises(ValueError, match="signed already"):
        SIGNER.seal("cat/demo/model", signed, 2)


def test_the_counter_rises_with_every_message_and_never_below_its_floor() -> None:
    floor = [100]
    seal = CountingSigner(SIGNER, floor=lambda: floor[0])
    counters = []
    for _ in range(3):
        opened = open_signed(seal("cat/demo/control", STOP))
        assert opened is not None
        counters.append(opened.counter)
    floor[0] = 50  # the clock stepped back: the counter still rises
    opened = open_signed(seal("cat/demo/control", STOP))
    assert opened is not None
    assert [*counters, opened.counter] == [100, 101, 102, 103]
    plain = CountingSigner(SIGNER)
    assert [open_signed(plain("t", STOP)).counter for _ in range(2)] == [1, 2]  # type: ignore[union-attr]


def test_key_files_are_written_once_with_owner_only_secrets(tmp_path: Path) -> None:
    public, secret = write_keypair(tmp_path / "keys")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    signer = Signer(read_secret_key(secret))
    assert read_public_key(public) == signer.public_key
    with pytest.raises(SigningKeyError, match="exists"):
        write_keypair(tmp_path / "keys")
    bad = tmp_path / "bad.key"
    bad.write_text("abcd\n")
    with pytest.raises(SigningKeyError, match="64 hex digits"):
        read_public_key(bad)
    with pytest.raises(SigningKeyError):
        read_secret_key(tmp_path / "missing.secret")


def test_the_crypto_library_loads_only_when_a_key_is_used() -> None:
    code = (
        "import sys\n"
        "import edge_agent.agent.loop, edge_agent.cli.commands, edge_agent.protocol.signing\n"
        "from edge_agent.agent.signatures import SignatureCheck\n"
        "from edge_agent.agent.ledger import AgentCounters\n"
        "SignatureCheck((), AgentCounters()).admit('cat/j/control', b'{}')\n"
        "print(any(m.split('.')[0] == 'cryptography' for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- the spec's test vectors


def _vectors() -> dict[str, tuple[str, int, bytes]]:
    """Each ``signed-hex NAME topic=... counter=...`` block of section 13."""
    found = re.finditer(
        r"```signed-hex ([\w-]+) topic=(\S+) counter=(\d+)\n(.*?)```",
        SPEC.read_text(encoding="utf-8"),
        re.S,
    )
    return {m[1]: (m[2], int(m[3]), bytes.fromhex(m[4])) for m in found}


def _spec_verify(public: bytes, topic: str, message: bytes) -> bytes:
    """A verifier written from section 13 alone: the unsigned message, or InvalidSignature."""
    assert message[-74:-72] == b"\xca\x5e"
    signature, covered = message[-64:], message[:-64]
    raw = topic.encode()
    Ed25519PublicKey.from_public_bytes(public).verify(
        signature, b"cat-edge downlink signature v1\x00" + bytes([len(raw)]) + raw + covered
    )
    body = bytearray(message[:-74])
    if body[:2] == b"\xca\x7e":
        body[5] &= 0xEF
    return bytes(body)


def test_the_spec_vectors_are_what_the_signer_emits_and_verify_by_the_spec() -> None:
    vectors = _vectors()
    assert set(vectors) == {"signed-control", "signed-snapshot"}
    doc_public = re.search(r"public key \(hex\): `([0-9a-f]{64})`", SPEC.read_text())
    assert doc_public is not None and bytes.fromhex(doc_public[1]) == SIGNER.public_key
    payloads = {"signed-control": STOP, "signed-snapshot": MESSAGES["snapshot"][1]}
    for name, (topic, counter, blob) in vectors.items():
        assert SIGNER.seal(topic, payloads[name], counter) == blob, name
        assert _spec_verify(SIGNER.public_key, topic, blob) == payloads[name]
        assert struct.unpack("<Q", blob[-72:-64])[0] == counter
        with pytest.raises(InvalidSignature):
            _spec_verify(OTHER.public_key, topic, blob)
