"""Shared test helpers that are not about the network (that is :mod:`aggregator.localnet`)."""

from __future__ import annotations

from aggregator.sim.harness import FleetHarness


def uvarint(n: int) -> bytes:
    """The wire format's unsigned LEB128 varint, written from the spec (not from
    edge_agent.protocol.wire): for tests that build messages by hand."""
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
        n >>= 7
        if not n:
            return bytes(out)


def lockstep_rounds(fleet: FleetHarness, k: int, *, strict: bool = True) -> None:
    """``k`` lockstep rounds of an in-process fleet: every agent answers the version it
    holds, the engine closes it, its broadcast is delivered (one simulated second each)."""
    for _ in range(k):
        fleet.deliver()
        fleet.step()
        fleet.pump(tick=False, strict=strict)
        fleet.clock.now += 1.0
        fleet.pump(strict=strict)
    fleet.deliver()


def close_without_publishing(fleet: FleetHarness) -> None:
    """Every agent answers and the engine closes the version, but dies before anything it
    returns is published (the window between a checkpoint and its publish)."""
    fleet.step()
    for msg in list(fleet.waiting()):
        fleet.engine.handle(msg.topic, msg.payload, fleet.clock.now)
