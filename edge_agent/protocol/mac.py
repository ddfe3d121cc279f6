"""Per-agent MACs: an 8-byte truncated HMAC-SHA256 keyed per agent (docs/wire-format.md).

An agent that holds a key signs every update it sends: flags bit 4 set and
``HMAC-SHA256(key, every preceding byte)[:8]`` appended (section 3.3). It signs its JSON
hellos, status messages and requests too: the JSON text, one ``0x1E`` byte, and the MAC of
a domain-separated input naming the kind, the job and the agent (section 11.1, :func:`seal`).
The aggregator, holding the same key for that agent, recomputes it and refuses a mismatch
(``bad_mac``), so a broker or anyone between cannot forge or alter them (integrity and
origin; no confidentiality). Replays are refused by counters: the (agent, round, seq)
de-duplication with a per-agent seq floor for updates, the strictly increasing ``ctr`` of
every JSON message (:func:`next_counter`).

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


#: the byte between a signed JSON message's text and its MAC; JSON text never holds it
SEPARATOR = 0x1E
#: the first bytes of a JSON message's MAC input (an update's starts with 0xCA 0x7E)
JSON_DOMAIN = b"cat-edge/json/1\x00"
#: the JSON messages an agent signs (the kind is its topic's: cat/<job>/<kind>/<agent>)
SIGNED_KINDS = ("hello", "status", "request")
#: the unit of an agent's message counter: milliseconds of wall-clock time
COUNTER_UNIT_S = 1e-3


def json_mac_input(kind: str, job: str, agent: str, text: bytes) -> bytes:
    """What the MAC of a signed JSON message covers (docs/wire-format.md section 11.1)."""
    return b"\x00".join((JSON_DOMAIN + kind.encode(), job.encode(), agent.encode(), text))


def seal(key: bytes, kind: str, job: str, agent: str, text: bytes) -> bytes:
    """A JSON message of ``kind`` from ``agent`` in ``job``, signed: ``text``, 0x1E, MAC."""
    return text + bytes((SEPARATOR,)) + compute(key, json_mac_input(kind, job, agent, text))


def split_sealed(payload: bytes) -> tuple[bytes, bytes | None]:
    """``(JSON text, MAC)`` of a signed payload, ``(payload, None)`` of an unsigned one: a
    payload is signed iff its ninth byte from the end is 0x1E."""
    if len(payload) > MAC_BYTES and payload[-MAC_BYTES - 1] == SEPARATOR:
        return payload[: -MAC_BYTES - 1], payload[-MAC_BYTES:]
    return payload, None


def verify_sealed(key: bytes, kind: str, job: str, agent: str, payload: bytes) -> bool:
    """True iff ``payload`` is signed and its MAC verifies for this kind, job and agent."""
    text, tag = split_sealed(payload)
    return tag is not None and hmac.compare_digest(
        compute(key, json_mac_input(kind, job, agent, text)), tag
    )


def next_counter(previous: int | None, now_s: float) -> int:
    """An agent's next message counter: ``max(previous + 1, now in ms)``, ``now_s`` being
    wall-clock seconds since the Unix epoch. Strictly increasing within a process, and
    across restarts as long as the clock does not go back (docs/wire-format.md 11.1)."""
    now = int(now_s / COUNTER_UNIT_S)
    return now if previous is None else max(previous + 1, now)


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
