"""Shared test helpers that are not about the network (that is :mod:`aggregator.localnet`)."""

from __future__ import annotations


def uvarint(n: int) -> bytes:
    """The wire format's unsigned LEB128 varint, written from the spec (not from
    edge_agent.protocol.wire): for tests that build messages by hand."""
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
        n >>= 7
        if not n:
            return bytes(out)
