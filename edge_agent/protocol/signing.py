"""Signed downlinks: an Ed25519 signature on every aggregator -> agent message.

Every message the aggregator publishes to agents (job settings, control, model and steps
messages, on job-wide topics and on ``cat/<job>/to/<agent>``) may end with a 74-byte
trailer (docs/wire-format.md section 13)::

    message' | 0xCA 0x5E | counter (u64 LE) | Ed25519 signature (64 bytes)

``message'`` is the unsigned message, with flags bit 4 set when it is binary (types 2-5);
JSON is unchanged. The signature covers ``DOMAIN | uvarint(len(topic)) | topic |`` every
transmitted byte before the signature, so it binds the message to its topic (job and kind,
and the addressee of ``to`` messages) and to the counter, which the aggregator raises with
every message it signs and agents keep the highest of per topic (replays are refused).

Ed25519, a public-key signature, because one broadcast (a retained job message, a multicast
group's frames) must be verifiable by every member without giving any of them the power to
forge one: a per-agent HMAC cannot do that. The crypto library (PyCA ``cryptography``, the
``signing`` extra) is imported only when a key is used: an agent without
``--aggregator-key`` never loads it. Pure otherwise: no network; key files are read and
written only when asked to.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from edge_agent.errors import CatEdgeError, WireFormatError
from edge_agent.protocol.wire import MAGIC, uvarint

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

#: what every signature input starts with (no other cat-edge signature can be mistaken for it)
DOMAIN: Final = b"cat-edge downlink signature v1\x00"
#: the trailer's first two bytes (0xCA then an ASCII byte: never valid UTF-8, never in JSON)
TRAILER_MAGIC: Final = b"\xca\x5e"
COUNTER_BYTES: Final = 8
SIGNATURE_BYTES: Final = 64
#: bytes a signature adds to every message: magic, counter, signature
TRAILER_BYTES: Final = len(TRAILER_MAGIC) + COUNTER_BYTES + SIGNATURE_BYTES
#: flags bit 4 (byte 5) of a binary downlink message: the trailer follows
FLAG_SIGNED: Final = 0x10
#: an Ed25519 public key and a private key seed are 32 bytes each
KEY_BYTES: Final = 32
MAX_COUNTER: Final = 2**64 - 1
#: the default key pair's file names: ``<name>.key`` (public), ``<name>.secret`` (secret)
DEFAULT_NAME: Final = "aggregator-signing"
_COUNTER: Final = struct.Struct("<Q")
_FLAGS_AT: Final = 5


class SigningKeyError(CatEdgeError, ValueError):
    """A signing key file is missing, unreadable or malformed, or the crypto library is not
    installed."""


@dataclass(frozen=True)
class Opened:
    """A signed message taken apart (not verified): ``message`` is the unsigned message
    its decoders read (flags bit 4 cleared), ``head`` what the signature covers after the
    domain and topic (every byte before the signature), ``counter`` and ``signature``."""

    message: bytes
    head: bytes
    counter: int
    signature: bytes


def _binary(payload: bytes) -> bool:
    return payload[:2] == MAGIC


def is_signed(payload: bytes) -> bool:
    """True when ``payload`` says it carries a trailer: flags bit 4 of a binary message,
    the trailer magic at its place in a JSON (or other) one."""
    if _binary(payload):
        return len(payload) > _FLAGS_AT and bool(payload[_FLAGS_AT] & FLAG_SIGNED)
    return len(payload) > TRAILER_BYTES and payload[-TRAILER_BYTES:][:2] == TRAILER_MAGIC


def open_signed(payload: bytes) -> Opened | None:
    """The parts of a signed ``payload``; None when it is not signed (:func:`is_signed`).
    WireFormatError when it says it is signed and the trailer is not there."""
    if not is_signed(payload):
        return None
    if _binary(payload) and len(payload) < _FLAGS_AT + 1 + TRAILER_BYTES:
        raise WireFormatError("signed downlink message: too short for its signature trailer")
    cut = len(payload) - TRAILER_BYTES
    if payload[cut : cut + 2] != TRAILER_MAGIC:
        raise WireFormatError("signed downlink message: no signature trailer (bad magic)")
    body = payload[:cut]
    if _binary(body):
        body = body[:_FLAGS_AT] + bytes([body[_FLAGS_AT] & ~FLAG_SIGNED]) + body[_FLAGS_AT + 1 :]
    (counter,) = _COUNTER.unpack_from(payload, cut + 2)
    return Opened(body, payload[:-SIGNATURE_BYTES], counter, payload[-SIGNATURE_BYTES:])


def strip(payload: bytes) -> bytes:
    """``payload`` without its trailer (unchanged when unsigned), for a receiver that does
    not verify. WireFormatError when the trailer it announces is missing."""
    opened = open_signed(payload)
    return payload if opened is None else opened.message


def signature_input(topic: str, head: bytes) -> bytes:
    """The bytes the signature is computed over: the domain, the topic, and ``head``
    (every byte of the signed message before the signature)."""
    raw = topic.encode("ascii")
    return DOMAIN + uvarint(len(raw)) + raw + head


def _head(payload: bytes, counter: int) -> bytes:
    if not 0 <= counter <= MAX_COUNTER:
        raise ValueError(f"counter must be in 0 .. 2^64 - 1, got {counter}")
    if is_signed(payload):
        raise ValueError("the message is signed already")
    if _binary(payload):
        if len(payload) <= _FLAGS_AT:
            raise ValueError("a binary message has at least 6 bytes")
        payload = (
            payload[:_FLAGS_AT]
            + bytes([payload[_FLAGS_AT] | FLAG_SIGNED])
            + payload[_FLAGS_AT + 1 :]
        )
    return payload + TRAILER_MAGIC + _COUNTER.pack(counter)


def _crypto() -> tuple[type[Ed25519PrivateKey], type[Ed25519PublicKey]]:
    """The Ed25519 classes, imported here (only a configured key loads the library)."""
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import (
            Ed25519PrivateKey,
            Ed25519PublicKey,
        )
    except ImportError:
        raise SigningKeyError(
            "signed downlinks need the 'cryptography' package: pip install 'cat-edge[signing]'"
        ) from None
    return Ed25519PrivateKey, Ed25519PublicKey


class Signer:
    """Signs what the aggregator publishes with its Ed25519 secret key (a 32-byte seed)."""

    def __init__(self, seed: bytes) -> None:
        private_cls, _ = _crypto()
        if len(seed) != KEY_BYTES:
            raise SigningKeyError(f"an Ed25519 secret key is {KEY_BYTES} bytes, got {len(seed)}")
        self._key = private_cls.from_private_bytes(seed)

    @property
    def public_key(self) -> bytes:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        return self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def seal(self, topic: str, payload: bytes, counter: int) -> bytes:
        """``payload`` as published on ``topic``, signed with ``counter``."""
        head = _head(payload, counter)
        return head + self._key.sign(signature_input(topic, head))


class CountingSigner:
    """A :class:`Signer` and its counter: every message gets a counter above the last
    one and at least ``floor()`` (the service passes wall-clock microseconds, so the
    counter keeps rising across restarts without being stored; the simulator passes
    nothing and counts 1, 2, 3, ...)."""

    def __init__(self, signer: Signer, floor: Callable[[], int] | None = None) -> None:
        self.signer = signer
        self._floor = floor
        self.last = 0

    def __call__(self, topic: str, payload: bytes) -> bytes:
        floor = 0 if self._floor is None else self._floor()
        self.last = max(self.last + 1, floor)
        return self.signer.seal(topic, payload, self.last)


class Verifier:
    """Checks signatures against one or more public keys (more than one while a key is
    rotated: a message is valid when any of them verifies it)."""

    def __init__(self, public_keys: list[bytes]) -> None:
        _, public_cls = _crypto()
        if not public_keys:
            raise SigningKeyError("a verifier needs at least one public key")
        for key in public_keys:
            if len(key) != KEY_BYTES:
                raise SigningKeyError(f"an Ed25519 public key is {KEY_BYTES} bytes, got {len(key)}")
        self._keys = [public_cls.from_public_bytes(k) for k in public_keys]

    def verify(self, topic: str, opened: Opened) -> bool:
        """True iff ``opened`` was signed for ``topic`` by the holder of one of the keys."""
        from cryptography.exceptions import InvalidSignature

        data = signature_input(topic, opened.head)
        for key in self._keys:
            try:
                key.verify(opened.signature, data)
            except InvalidSignature:
                continue
            return True
        return False


# ---------------------------------------------------------------- key files


def _read_hex_key(path: Path, what: str) -> bytes:
    try:
        text = Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not a text file"
        raise SigningKeyError(f"{what} {path}: {reason or exc}") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise SigningKeyError(
            f"{what} {path}: expected {2 * KEY_BYTES} hex digits on one line "
            "(make a pair with `edge-agent keys signing --out DIR`)"
        )
    return key


def read_public_key(path: Path) -> bytes:
    """The aggregator's public key in ``path`` (64 hex digits), else SigningKeyError."""
    return _read_hex_key(path, "aggregator public key")


def read_secret_key(path: Path) -> bytes:
    """The aggregator's secret key (seed) in ``path`` (64 hex digits), else SigningKeyError."""
    return _read_hex_key(path, "aggregator signing key")


def write_keypair(out: Path, name: str = DEFAULT_NAME) -> tuple[Path, Path]:
    """Write a new key pair: ``out/<name>.key`` (public, 0644) and ``out/<name>.secret``
    (0600; a directory it creates is 0700). Refuses to overwrite either file."""
    from edge_agent.protocol.topics import validate_id

    private_cls, _ = _crypto()
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        PublicFormat,
    )

    validate_id(name, "key name")
    if not out.exists():
        out.mkdir(parents=True, mode=0o700)
    public, secret = out / f"{name}.key", out / f"{name}.secret"
    for path in (public, secret):
        if path.exists():
            raise SigningKeyError(
                f"{path} exists; write the new pair under another --name or into another "
                "directory to rotate (docs/operating.md)"
            )
    key = private_cls.generate()
    seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    for path, data, mode in ((secret, seed, 0o600), (public, raw, 0o644)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(data.hex() + "\n")
        os.chmod(path, mode)  # the umask does not loosen or tighten it
    return public, secret
