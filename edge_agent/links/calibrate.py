"""Measure a real link the way the paper did for ZeroMQ over TCP, and write a profile.

One end runs :func:`serve_echo` (a ZeroMQ REP socket that sends every payload back); the
device runs :func:`measure_link`, which times round trips of payloads from 16 B to 64 KiB,
takes the median per size and halves it (one-way time, seconds). The result becomes a
``measured`` profile (piecewise-linear through the points, objective ``airtime_s``, or
``energy_j`` when the radio's transmit power is given) plus the affine fit a + b*bytes for
the record.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_agent.errors import TransportError
from edge_agent.links.catalog import save_profile
from edge_agent.links.profile_fit import fit_affine, measured_profile
from edge_agent.links.profiles import CostProfile

DEFAULT_SIZES = tuple(2**k for k in range(4, 17))  # 16 B .. 64 KiB


@dataclass(frozen=True)
class LinkPoint:
    size_bytes: int
    seconds: float  # one-way: half the median round trip


def serve_echo(bind: str, *, max_requests: int | None = None, poll_ms: int = 500) -> None:
    """Echo every request on a ZeroMQ REP socket bound at ``bind`` (e.g. tcp://0.0.0.0:5599)."""
    import zmq

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 1000)
    try:
        sock.bind(bind)
    except zmq.ZMQError as exc:
        sock.close()
        raise TransportError(
            f"calibrate serve: cannot bind {bind}: {exc}; is the port in use?"
        ) from None
    served = 0
    try:
        while max_requests is None or served < max_requests:
            if sock.poll(poll_ms):
                sock.send(sock.recv(copy=True))
                served += 1
    finally:
        sock.close()


def measure_link(
    peer: str, *, sizes: Sequence[int] | None = None, repeats: int = 20, timeout_s: float = 5.0
) -> list[LinkPoint]:
    """Median one-way time per payload size against an echo peer (ZeroMQ REQ)."""
    import zmq

    sizes = sorted(set(sizes or DEFAULT_SIZES))
    if sizes[0] < 1:
        raise ValueError(f"calibrate: sizes must be >= 1 byte, got {sizes[0]}")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    sock.connect(peer)
    rng = np.random.default_rng(0)
    points = []
    try:
        # one warm-up round trip: the TCP and ZMTP handshakes are not part of a message's cost
        _round_trip(sock, b"w", peer, timeout_s)
        for size in sizes:
            payload = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            times = [_round_trip(sock, payload, peer, timeout_s) for _ in range(repeats)]
            points.append(LinkPoint(size, float(np.median(times)) / 2))
    finally:
        sock.close()
    return points


def _round_trip(sock: object, payload: bytes, peer: str, timeout_s: float) -> float:
    import zmq

    assert isinstance(sock, zmq.Socket)
    t0 = time.perf_counter()
    sock.send(payload)
    try:
        back = sock.recv()
    except zmq.Again:
        raise TransportError(
            f"calibrate: no echo from {peer} within {timeout_s} s; is `edge-agent calibrate serve` running there?"
        ) from None
    elapsed = time.perf_counter() - t0
    if back != payload:
        raise TransportError(f"calibrate: the peer at {peer} did not echo the payload")
    return elapsed


def write_measured_profile(
    points: Sequence[LinkPoint],
    *,
    name: str,
    out: str | Path,
    power_w: float | None = None,
    overhead_bytes: int = 0,
) -> tuple[CostProfile, tuple[float, float]]:
    """Write a ``measured`` profile through the points; return it and the affine fit (a, b) in seconds."""
    sizes = np.array([p.size_bytes for p in points], dtype=np.int64)
    # Timing noise can make a larger message look cheaper; a cost must be nondecreasing.
    seconds = np.maximum.accumulate(np.array([p.seconds for p in points]))
    fit = fit_affine(sizes, seconds)
    rows: list[dict[str, float]] = []
    for size, s in zip(sizes.tolist(), seconds.tolist(), strict=True):
        row: dict[str, float] = {"size_bytes": size, "airtime_s": s, "bits": 8.0 * size}
        if power_w is not None:
            row["energy_j"] = power_w * s
        rows.append(row)
    profile = measured_profile(
        name,
        rows,
        "energy_j" if power_w is not None else "airtime_s",
        description=f"measured by `edge-agent calibrate` ({len(points)} sizes, one-way = half the median round trip)",
        sources=["edge-agent calibrate"],
        estimated=["energy_j = power_w * time"] if power_w is not None else [],
        notes=f"affine fit: airtime_s = {fit[0]:.6g} + {fit[1]:.6g} * bytes",
        message_overhead_bytes=overhead_bytes,
    )
    save_profile(profile, out)
    return profile, fit
