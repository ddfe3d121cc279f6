"""Fuzz the aggregator's whole ingest path: junk interleaved with honest agents' updates.

    python benchmarks/fuzz_ingest.py [--inputs 100000] [--seed 0] [--quick]

The real :class:`~aggregator.service.ingest.AggregatorService` runs (memory transport for what
it publishes, its ingest thread, the batch decoder :func:`edge_agent.protocol.wire_many.decode_many`,
the SQLite journal and a checkpoint per version in a temporary directory). Inputs are put
on its inbound queue exactly as a transport delivers them (a ZeroMQ peer can send any topic
frame, so wrong topics reach the engine too). Three honest agents (``h0`` to ``h2``, top-k
updates, d = 64) report every round; between the first two honest updates of a round and
the last one, a batch of junk goes in:

* ``bitflip``, ``truncate``, ``extend``: an honest update of this or the last round with
  1-8 flipped bits, cut short, or with random bytes appended;
* ``header``: an honest update re-encoded with one header field changed (future, past or
  maximal round; another agent id in the header; another job; another d; a new seq);
* ``duplicate``: an exact re-send of an applied update;
* ``random``: random bytes (sometimes behind a valid magic and version);
* ``extreme``: a well-formed update from ``h2`` (which has not reported yet, so it would
  enter the step) with values from 1e8 to 1e308, inf or nan, dense or T = d; the sizes
  below 1e300 only once the job's norm warm-up is over (before it, only the divergence
  check applies: docs/operating.md);
* ``huge_t``: a header claiming a huge T or d over a tiny body;
* ``hello``, ``status``, ``request``: random JSON, and hellos with one field out of bounds
  or of the wrong type, on honest and invented ids and other jobs' topics; valid snapshot
  requests from honest ids (these are *applied*: answered, nothing changes);
* ``topic``: any of the above on a topic the aggregator does not serve.

The step size is configured: without agent authentication a forged hello that is valid
is indistinguishable from a real one (it would legitimately change L), so the fuzz keeps
hellos it cannot tell apart out of the comparison.

After every batch (a barrier: a no-op control command through the same queue) it checks:
the ingest thread is alive; every input reached the engine and was either applied or
refused with a reason, and the engine's refusal counters grew by exactly those reasons;
the model is finite and bit-identical to a reference :class:`~aggregator.engine.rounds.RoundEngine`
fed only the honest messages at the same times. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aggregator.engine.rounds import Effects, RoundEngine
from aggregator.service.ingest import AggregatorService
from aggregator.service.settings import load_settings
from edge_agent.numerics.compressors import Update
from edge_agent.protocol import messages, topics, wire
from edge_agent.transports import Message

JOB = "fuzz"
D = 64
T = 8
HONEST = ("h0", "h1", "h2")
#: accepted updates before the relative norm bound applies (the default warm-up)
WARMUP = 16
NOW0 = 1000.0

Rng = np.random.Generator
Junk = tuple[str, bytes]


@dataclass
class _Round:
    """What the junk generators may derive from: applied blobs and the current version."""

    version: int
    blobs: list[tuple[str, bytes]]  # (agent, blob) of h0/h1 this round and the last
    warm: bool  # the relative norm bound is active


@dataclass
class Tally:
    """What happened to every input."""

    tried: Counter[str] = field(default_factory=Counter)
    applied: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    crashes: int = 0


def _topk(rng: Rng, scale: float = 0.1) -> Update:
    idx = np.sort(rng.choice(D, size=T, replace=False)).astype(np.int64)
    vals = (scale * rng.standard_normal(T)).astype(np.float32)
    return Update("topk", D, idx, vals)


def _hello_fields(agent: str) -> dict[str, Any]:
    return {
        "job": JOB,
        "agent": agent,
        "d": D,
        "rows": 100,
        "smoothness": 1.0,
        "model": "logreg",
        "compressor": "topk",
    }


def _honest_hello(agent: str) -> Message:
    hello = messages.Hello(**_hello_fields(agent))
    return Message(topics.hello(JOB, agent), messages.dump(hello))


def _random_json(rng: Rng, depth: int = 0) -> Any:
    pick = int(rng.integers(0, 7 if depth < 3 else 5))
    if pick == 0:
        return int(rng.integers(-(2**62), 2**62)) * int(rng.choice([1, 2**40]))
    if pick == 1:
        return float(rng.choice([0.0, -1.0, 1e-300, 1e308, 3.5, -2e9]))
    if pick == 2:
        return "".join(chr(int(c)) for c in rng.integers(32, 0x2FF, size=int(rng.integers(0, 20))))
    if pick == 3:
        return bool(rng.integers(0, 2))
    if pick == 4:
        return None
    if pick == 5:
        return [_random_json(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]
    keys = ["type", "job", "agent", "d", "rows", "state", "have", "want", "round", "x"]
    return {str(rng.choice(keys)): _random_json(rng, depth + 1) for _ in range(rng.integers(0, 6))}


#: one hello field set out of bounds or to the wrong type: each must be refused
_BAD_HELLO: tuple[tuple[str, Any], ...] = (
    ("rows", 10**18),
    ("rows", -1),
    ("smoothness", 1e-300),
    ("smoothness", 1e300),
    ("smoothness", "nan"),
    ("d", D + 1),
    ("d", 0),
    ("job", "other"),
    ("model", "softmax"),
    ("compressor", "nope"),
    ("semantics", "ef21"),
    ("agent", "someone-else"),
    ("next_seq", -5),
    ("version", -1),
)


def _ids(rng: Rng) -> str:
    """An honest id or an invented one."""
    if rng.random() < 0.5:
        return str(rng.choice(HONEST))
    return f"x{int(rng.integers(0, 10**6))}"


def _gen_hello(rng: Rng, rnd: _Round) -> Junk:
    agent = _ids(rng)
    if rng.random() < 0.5:
        fields = _hello_fields(agent)
        key, bad = _BAD_HELLO[int(rng.integers(0, len(_BAD_HELLO)))]
        fields[key] = bad
        body = json.dumps({"type": "hello", **fields}).encode()
    else:
        body = json.dumps(_random_json(rng)).encode()
    job = JOB if rng.random() < 0.9 else "otherjob"
    return topics.hello(job, agent), body


def _gen_status(rng: Rng, rnd: _Round) -> Junk:
    obj = _random_json(rng)
    if rng.random() < 0.3:
        obj = {"type": "status", "state": str(rng.choice(["gone", "", "ONLINE", "done "]))}
    return topics.status(JOB, _ids(rng)), json.dumps(obj).encode()


def _gen_request(rng: Rng, rnd: _Round) -> Junk:
    agent = _ids(rng)
    if rng.random() < 0.3:  # a valid request: applied (answered, rate-limited)
        have = int(rng.choice([0, rnd.version, 2**63 - 1, 10**30]))
        return topics.request(JOB, agent), json.dumps({"type": "request", "have": have}).encode()
    return topics.request(JOB, agent), json.dumps(_random_json(rng)).encode()


def _applied_blob(rng: Rng, rnd: _Round) -> tuple[str, bytes]:
    return rnd.blobs[int(rng.integers(0, len(rnd.blobs)))]


def _gen_bitflip(rng: Rng, rnd: _Round) -> Junk:
    agent, blob = _applied_blob(rng, rnd)
    buf = bytearray(blob)
    for bit in rng.integers(0, 8 * len(buf), size=int(rng.integers(1, 9))):
        buf[int(bit) // 8] ^= 1 << (int(bit) % 8)
    return topics.update(JOB, agent), bytes(buf)


def _gen_truncate(rng: Rng, rnd: _Round) -> Junk:
    agent, blob = _applied_blob(rng, rnd)
    return topics.update(JOB, agent), blob[: int(rng.integers(0, len(blob)))]


def _gen_extend(rng: Rng, rnd: _Round) -> Junk:
    agent, blob = _applied_blob(rng, rnd)
    tail = rng.bytes(int(rng.integers(1, 64)))
    return topics.update(JOB, agent), blob + tail


def _gen_duplicate(rng: Rng, rnd: _Round) -> Junk:
    agent, blob = _applied_blob(rng, rnd)
    return topics.update(JOB, agent), blob


def _gen_header(rng: Rng, rnd: _Round) -> Junk:
    agent, blob = _applied_blob(rng, rnd)
    header, update = wire.decode(blob)
    fields: dict[str, Any] = {"job": JOB, "agent": agent, "round": header.round, "seq": header.seq}
    pick = int(rng.integers(0, 6))
    if pick == 0:
        fields["round"] = rnd.version + int(rng.integers(1, 10**6))
    elif pick == 1:
        fields["round"] = 2**63 - 1
    elif pick == 2:
        fields["agent"] = str(rng.choice(["h2", "x1", agent + "x"]))  # not the topic's id
    elif pick == 3:
        fields["job"] = "otherjob"
    elif pick == 4:
        update = Update("topk", D * 2, update.indices, update.values)
    else:
        fields["seq"] = header.seq + int(rng.integers(1, 10**9))  # already reported: refused
    return topics.update(JOB, agent), wire.encode(update, **fields)


def _gen_random(rng: Rng, rnd: _Round) -> Junk:
    body = rng.bytes(int(rng.integers(0, 512)))
    if rng.random() < 0.5:
        body = wire.MAGIC + bytes([wire.VERSION, wire.TYPE_UPDATE]) + body
    return topics.update(JOB, _ids(rng)), body


def _gen_extreme(rng: Rng, rnd: _Round) -> Junk:
    """A well-formed update from h2, which has not reported yet this round."""
    sizes = [1e300, 1e308, float("inf"), float("nan")]
    if rnd.warm:
        sizes += [1e8, 1e12, 1e20, 1e38]
    size = float(rng.choice(sizes))
    seq = 10**6 + int(rng.integers(0, 10**9))
    if rng.random() < 0.3:
        vals = np.full(D, size) * np.sign(rng.standard_normal(D))
        update = Update("dense", D, None, vals)
    else:
        t = int(rng.choice([1, T, D]))
        idx = np.sort(rng.choice(D, size=t, replace=False)).astype(np.int64)
        update = Update("topk", D, idx, np.full(t, size))
    blob = wire.encode(
        update, job=JOB, agent="h2", round=rnd.version, seq=seq, value_dtype="float64"
    )
    return topics.update(JOB, "h2"), blob


def _gen_huge_t(rng: Rng, rnd: _Round) -> Junk:
    empty = Update("topk", D, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
    agent = str(rng.choice(["h0", "h1", "h2"]))
    head = wire.encode(empty, job=JOB, agent=agent, round=rnd.version, seq=7 * 10**9)
    head = head[: -(len(wire.uvarint(D)) + 1)]  # up to seq: d and T follow
    if rng.random() < 0.5:
        d, t = D, int(rng.choice([D + 1, 2**32, 2**62]))
    else:
        d, t = int(rng.choice([2**32 - 1, 2**40])), int(rng.choice([1, 2**20]))
    return topics.update(JOB, agent), head + wire.uvarint(d) + wire.uvarint(t) + rng.bytes(16)


def _gen_topic(rng: Rng, rnd: _Round) -> Junk:
    kind = str(rng.choice(list(GENERATORS)[:-1]))
    _, body = GENERATORS[kind](rng, rnd)
    bad = [
        f"cat/{JOB}/to/h0",
        f"cat/{JOB}/model",
        "cat/otherjob/update/h0",
        f"cat/{JOB}/update/",
        f"cat/{JOB}/update/{'y' * 300}",
        f"cat/{JOB}/update/h0/extra",
        f"cat/{JOB}/upd\u00e4te/h0",
        "",
        "#",
        f"cat/{JOB}/update/h 0",
    ]
    return str(rng.choice(bad)), body


GENERATORS: dict[str, Callable[[Rng, _Round], Junk]] = {
    "bitflip": _gen_bitflip,
    "truncate": _gen_truncate,
    "extend": _gen_extend,
    "header": _gen_header,
    "duplicate": _gen_duplicate,
    "random": _gen_random,
    "extreme": _gen_extreme,
    "huge_t": _gen_huge_t,
    "hello": _gen_hello,
    "status": _gen_status,
    "request": _gen_request,
    "topic": _gen_topic,
}


class Fuzz:
    """The service under test, the reference engine, and the checks after each batch."""

    def __init__(self, data_dir: Path, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.now = NOW0
        self.settings = load_settings(
            job=JOB,
            d=D,
            step_size=0.05,
            round_deadline_s=1e6,
            liveness_timeout_s=1e9,
            downlink_pacing=False,
            feedback="any",  # honest agents of both families: the first hello fixes it
            transports=[f"memory://fuzz-{seed}-{time.monotonic_ns()}"],
            data_dir=data_dir,
        )
        self.svc = AggregatorService(self.settings, clock=lambda: self.now)
        self.ref = RoundEngine(self.settings.engine_config())
        self.tally = Tally()
        self.seen: list[tuple[str, Effects]] = []
        self._last: list[tuple[str, bytes]] = []

    def __enter__(self) -> Fuzz:
        self.svc.start()
        eng = self.svc.read(lambda e: e)
        real = eng.handle

        def spy(topic: str, payload: bytes, now: float, **kw: Any) -> Effects:
            eff = real(topic, payload, now, **kw)
            self.seen.append((topic, eff))
            return eff

        eng.handle = spy  # type: ignore[method-assign]
        self._batch([(None, _honest_hello(a)) for a in HONEST])
        return self

    def __exit__(self, *exc: object) -> None:
        self.svc.stop()

    def _batch(self, items: list[tuple[str | None, Message]]) -> None:
        """Put ``items`` (kind None: honest) on the queue, wait, check, compare."""
        self.now += 1.0
        eng = self.svc.read(lambda e: e)
        before = Counter({k: v for k, v in eng.rejected.items() if v})
        self.seen.clear()
        for kind, msg in items:
            if kind is None:
                self.ref.handle(msg.topic, msg.payload, self.now)
            self.svc._inbox.put(msg)
        self.svc.control("resume")  # a no-op command: returns once the batch is processed
        self.ref.tick(self.now)
        self._check(items, eng, before)

    def _check(
        self, items: list[tuple[str | None, Message]], eng: RoundEngine, before: Counter[str]
    ) -> None:
        self.tally.batches += 1
        if not self.svc.healthy or len(self.seen) != len(items):
            self.tally.crashes += 1
            raise AssertionError(
                f"batch {self.tally.batches}: {len(self.seen)} of {len(items)} inputs reached "
                f"the engine; service error: {self.svc.fatal_error}"
            )
        reasons: Counter[str] = Counter()
        for (kind, msg), (topic, eff) in zip(items, self.seen, strict=True):
            assert topic == msg.topic
            if kind is None:
                assert eff.reason is None, f"an honest message was refused: {eff.reason}"
                continue
            self.tally.tried[kind] += 1
            if eff.reason is None:
                self.tally.applied[kind] += 1
            else:
                reasons[eff.reason] += 1
        self.tally.rejected.update(reasons)
        after = self.svc.read(lambda e: Counter({k: v for k, v in e.rejected.items() if v}))
        assert after - before == reasons, f"uncounted refusals: {after - before} vs {reasons}"
        x, version = self.svc.read(lambda e: (e.x.copy(), e.version))
        assert np.isfinite(x).all(), "the model holds nan or inf"
        assert version == self.ref.version, f"version {version} != reference {self.ref.version}"
        assert np.array_equal(x, self.ref.x), "the model differs from the honest reference"

    def round(self, junk: int) -> None:
        """h0 and h1 report; ``junk`` inputs; h2 reports (the round closes)."""
        version = self.ref.version
        honest = {
            a: wire.encode(_topk(self.rng), job=JOB, agent=a, round=version, seq=0) for a in HONEST
        }
        items: list[tuple[str | None, Message]] = [
            (None, Message(topics.update(JOB, a), honest[a])) for a in HONEST[:2]
        ]
        applied = [(a, honest[a]) for a in HONEST[:2]]
        rnd = _Round(version, applied + self._last, warm=3 * version >= WARMUP + 3)
        kinds = list(GENERATORS)
        for _ in range(junk):
            kind = kinds[int(self.rng.integers(0, len(kinds)))]
            topic, payload = GENERATORS[kind](self.rng, rnd)
            items.append((kind, Message(topic, payload)))
        items.append((None, Message(topics.update(JOB, "h2"), honest["h2"])))
        self._last = applied
        self._batch(items)
        assert self.ref.version == version + 1, "the honest round did not close"


def run(inputs: int, seed: int = 0, per_round: int = 500) -> dict[str, Any]:
    """Fuzz ``inputs`` junk inputs in rounds of ``per_round``; raises AssertionError on the
    first failed check. Returns the tally as a JSON-able dict."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, Fuzz(Path(tmp), seed) as fz:
        left = inputs
        while left > 0:
            fz.round(min(per_round, left))
            left -= per_round
        x0 = np.zeros(D)
        tally = fz.tally
        out = {
            "bench": "fuzz_ingest",
            "inputs": sum(tally.tried.values()),
            "by_kind": dict(sorted(tally.tried.items())),
            "applied_by_kind": dict(sorted(tally.applied.items())),
            "rejected_by_reason": dict(sorted(tally.rejected.items())),
            "crashes": tally.crashes,
            "batches": tally.batches,
            "versions": fz.ref.version,
            "model_equals_honest_reference": bool(
                np.array_equal(fz.svc.read(lambda e: e.x), fz.ref.x)
            ),
            "model_moved_by_honest_only": bool(not np.array_equal(fz.ref.x, x0)),
            "healthy": fz.svc.healthy,
            "seconds": round(time.perf_counter() - t0, 1),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--inputs", type=int, default=100_000, help="junk inputs (default 100,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-round", type=int, default=500, help="junk inputs per honest round")
    p.add_argument("--quick", action="store_true", help="2,000 inputs (a smoke run)")
    args = p.parse_args(argv)
    result = run(2_000 if args.quick else args.inputs, args.seed, args.per_round)
    print(json.dumps(result))
    return 0 if result["crashes"] == 0 and result["model_equals_honest_reference"] else 1


if __name__ == "__main__":
    sys.exit(main())
