"""The automatic downlink (AGG_DOWNLINK=auto): per version the exact relay or the compressed
change, and the agents' replica stays what the aggregator believes it is, bit for bit,
through every mix of the two (and across an export/restore)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

from aggregator.engine.downlink.broadcast import Broadcast
from aggregator.engine.downlink.outbound import Outbound
from edge_agent.agent.replica import Replica
from edge_agent.numerics.aggregation import MeanAccumulator
from edge_agent.numerics.compressors import compress
from edge_agent.protocol import downlink, wire

JOB, D = "auto", 300
Price = Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float64]]


def per_message(sizes: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Every message costs the same: the exact relay (all of the miss) always wins."""
    return np.ones(np.shape(sizes))


def per_byte_steep(sizes: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Cost grows fast with size: a few signs beat relaying every update."""
    return np.asarray(sizes, dtype=np.float64) ** 3


def _apply(replica: Replica, out: Outbound) -> None:
    assert replica.apply(downlink.decode_downlink(out.payload)) is None


class Fleet:
    """An aggregator side (x, the EF21 aggregate or the round's mean) driving one Broadcast,
    and one agent's replica receiving what it sends."""

    def __init__(self, family: downlink.Family, seed: int = 0, mode: str = "auto") -> None:
        self.family: downlink.Family = family
        self.rng = np.random.default_rng(seed)
        self.x = self.rng.standard_normal(D)
        self.agg = np.zeros(D)
        self.b = Broadcast(JOB, D, mode)  # type: ignore[arg-type]
        self.version = 0
        self.last = b""
        self.replica = Replica(D, family)
        snap = self.b.snapshot(self.x, 0, self.agg, family)
        _apply(self.replica, snap)

    def version_with(self, prices: list[Price], updates: int = 3, *, final: bool = False) -> str:
        """One version: ``updates`` top-T updates enter, x steps, the broadcast goes out and
        the replica applies it; returns what was chosen."""
        before = dict(self.b.chosen)
        acc = MeanAccumulator(D)
        for i in range(updates):
            u = compress(self.rng.standard_normal(D), "topk", 20)
            blob = wire.encode(u, job=JOB, agent=f"a{i}", round=self.version, seq=self.version)
            _, decoded = wire.decode(blob)
            if self.family == "ef21":
                decoded.add_to(self.agg)
            else:
                acc.add(decoded, 1.0)
            self.b.add(blob, decoded.t, 1.0)
        coef = 0.01
        if self.family == "ef21":
            self.x = self.x - coef * self.agg
            changed = np.flatnonzero(self.agg).astype(np.int64)
        else:
            changed = acc.step(self.x, coef).changed
        base, self.version = self.version, self.version + 1
        out = self.b.close(x=self.x, changed=changed, base=base, version=self.version,
                           family=self.family, coef=coef, prices=prices,
                           aggregate=self.agg, final=final)  # fmt: skip
        if out is None:
            out = self.b.snapshot(self.x, self.version, self.agg, self.family)
        self.last = out.payload
        _apply(self.replica, out)
        assert self.replica.version == self.version
        changed_counts = [k for k, v in self.b.chosen.items() if v != before[k]]
        return changed_counts[0] if changed_counts else "snapshot"

    def check(self) -> None:
        """The replica holds the broadcast model bit for bit; while the copies are exact it
        is x itself (and, EF21, the aggregate too)."""
        assert self.replica.x is not None
        assert np.array_equal(self.replica.x, self.b.model(self.x))
        if self.b.synced:
            assert np.array_equal(self.replica.x, self.x)
            if self.family == "ef21":
                assert self.replica.aggregate is not None
                assert np.array_equal(self.replica.aggregate, self.agg)


@pytest.mark.parametrize("family", ["mean", "ef21"])
def test_every_mix_of_relay_and_compressed_change_keeps_the_replica_exact(family: str) -> None:
    fleet = Fleet(family)  # type: ignore[arg-type]
    plan = [per_message, per_byte_steep, per_byte_steep, per_message, per_message]
    plan += [per_byte_steep, per_message, per_byte_steep, per_message, per_message]
    choices = []
    for price in plan:
        choices.append(fleet.version_with([price]))
        fleet.check()
    # a fixed price per message relays everything; a steep one sends a compressed change;
    # the first relay after a compressed change is a resync, the next one the steps again
    assert choices[0] == "exact" and choices[1] == choices[2] == "cat"
    assert choices[3] == "resync" and choices[4] == "exact"
    assert set(choices) == {"exact", "resync", "cat"}


def test_the_relay_grows_with_the_updates_and_the_compressed_change_does_not() -> None:
    fleet = Fleet("mean", seed=3)
    assert fleet.version_with([per_message], updates=1) == "exact"
    fleet.check()
    # ten updates a version: the relay grows with them, one compressed change does not
    assert fleet.version_with([per_byte_steep], updates=10) == "cat"
    fleet.check()
    assert fleet.b.t_down is not None and 0 < fleet.b.t_down < D


@pytest.mark.parametrize("family", ["mean", "ef21"])
def test_a_restored_broadcast_chooses_as_the_live_one(family: str) -> None:
    """The choice is a function of checkpointed state: export mid-run (after a version
    with the copies inexact, and with the open version's updates recorded), restore into a
    fresh Broadcast, and it sends the same bytes as the live one for the next versions."""
    fleet = Fleet(family)  # type: ignore[arg-type]
    for price in (per_message, per_byte_steep):
        fleet.version_with([price])
    twin = copy.deepcopy(fleet)
    twin.b = Broadcast(JOB, D, "auto")
    twin.b.restore(fleet.b.export())
    assert not twin.b.synced and np.array_equal(twin.b.model(twin.x), fleet.b.model(fleet.x))
    for price in (per_byte_steep, per_message, per_message, per_byte_steep):
        assert twin.version_with([price]) == fleet.version_with([price])
        assert twin.last == fleet.last
        twin.check()


def test_a_checkpoint_from_another_mode_resyncs_at_the_next_version() -> None:
    b = Broadcast(JOB, D, "auto")
    b.restore({"mode": "exact"})
    assert not b.synced


@pytest.mark.parametrize("mode", ["auto", "cat"])
@pytest.mark.parametrize("family", ["mean", "ef21"])
def test_the_last_version_leaves_every_copy_exact(mode: str, family: str) -> None:
    """A job's last version (target reached, max_rounds): whatever the compressed downlink
    chose before, the broadcast makes the agents' copies the trained model, bit for bit."""
    fleet = Fleet(family, seed=5, mode=mode)  # type: ignore[arg-type]
    for _ in range(3):
        fleet.version_with([per_byte_steep])
    assert fleet.replica.x is not None
    assert not np.array_equal(fleet.replica.x, fleet.x)  # the copies are inexact here
    fleet.version_with([per_byte_steep], final=True)
    assert fleet.replica.x is not None and np.array_equal(fleet.replica.x, fleet.x)
    assert np.array_equal(fleet.b.model(fleet.x), fleet.x)


@pytest.mark.parametrize("mode", ["auto", "cat"])
def test_a_stop_between_versions_leaves_every_copy_exact(mode: str) -> None:
    """An operator's stop comes between versions: settle() sends the snapshot that makes the
    copies x (and nothing when they are x already)."""
    fleet = Fleet("mean", seed=7, mode=mode)
    for _ in range(2):
        fleet.version_with([per_byte_steep])
    assert fleet.replica.x is not None and not np.array_equal(fleet.replica.x, fleet.x)
    out = fleet.b.settle(fleet.x, fleet.version, fleet.agg, fleet.family)
    assert out is not None
    _apply(fleet.replica, out)
    assert fleet.replica.x is not None and np.array_equal(fleet.replica.x, fleet.x)
    assert fleet.b.settle(fleet.x, fleet.version, fleet.agg, fleet.family) is None
