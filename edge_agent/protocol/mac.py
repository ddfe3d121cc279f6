"""Per-update MACs: an 8-byte truncated HMAC-SHA256 keyed per agent (docs/wire-format.md).

An agent that holds a key signs every update it sends: flags bit 4 set and
``HMAC-SHA256(key, every preceding byte)[:8]`` appended. The aggregator, holding the same
key for that agent, recomputes it and refuses a mismatch (``bad_mac``), so a broker or
anyone between cannot forge or alter an update (integrity and origin; no confidentiality).
Replays of a valid message are caught by the (agent, round, seq) de-duplication.

Keys are 32 random bytes in a file ``<agent-id>.mac`` (mode 0600). Pure standard library:
``hmac``, ``hashlib``, ``secrets``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from edge_agent.errors import CatEdgeError

#: bytes of the truncated MAC at the end of a signed update
MAC_BYTES = 8
#: bytes of a key (HMAC-SHA256's block is 64; 32 random bytes are the full strength)
KEY_BYTES = 32
#: flags bit 4 of an update: a MAC follows the body
FLAG_MAC = 0x10
#: a key file's name: ``<agent-id>`` + this suffix
KEY_SUFFIX = ".mac"


class MacKeyError(CatEdgeError, ValueError):
    """A MAC key file is missing, unreadable or not :data:`KEY_BYTES` bytes."""


def compute(key: bytes, signed: bytes) -> bytes:
    """The MAC of ``signed`` (every byte of the message before the MAC) under ``key``."""
    return hmac.new(key, signed, hashlib.sha256).digest()[:MAC_BYTES]


def verify(key: bytes, blob: bytes) -> bool:
    """True iff ``blob`` (a whole update) carries the MAC bit and a valid MAC under ``key``.

    Constant-time comparison; a message without the bit (or too short) is False."""
    if len(blob) <= 6 + MAC_BYTES or not blob[5] & FLAG_MAC:
        return False
    return hmac.compare_digest(compute(key, blob[:-MAC_BYTES]), blob[-MAC_BYTES:])


def check_key(key: bytes, what: str) -> bytes:
    """``key`` if it has :data:`KEY_BYTES` bytes, else MacKeyError naming ``what``."""
    if len(key) != KEY_BYTES:
        raise MacKeyError(
            f"{what}: a MAC key is {KEY_BYTES} bytes, got {len(key)} "
            "(make one with `edge-agent keys mac --agent-id ID --out DIR`)"
        )
    return key


def write_key(out: Path, agent: str) -> Path:
    """Write a new random key to ``out/<agent>.mac`` (mode 0600; refuses to overwrite)."""
    from edge_agent.protocol.topics import validate_id

    validate_id(agent, "agent id")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{agent}{KEY_SUFFIX}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise MacKeyError(
            f"{path} exists; remove it first to rotate the key (docs/operating.md)"
        ) from None
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(KEY_BYTES))
    return path


def read_key(path: Path) -> bytes:
    """The key in ``path`` (exactly :data:`KEY_BYTES` bytes), else MacKeyError."""
    try:
        key = Path(path).read_bytes()
    except OSError as exc:
        raise MacKeyError(f"MAC key {path}: {exc.strerror or exc}") from None
    return check_key(key, f"MAC key {path}")


def read_keys_dir(directory: Path) -> dict[str, bytes]:
    """Every ``<agent-id>.mac`` key in ``directory``, by agent id."""
    d = Path(directory)
    if not d.is_dir():
        raise MacKeyError(f"MAC keys directory {d} does not exist (AGG_MAC_KEYS_DIR)")
    return {p.name[: -len(KEY_SUFFIX)]: read_key(p) for p in sorted(d.glob(f"*{KEY_SUFFIX}"))}
