"""Accounting: Spend sums, the per-agent round costs and their checkpoint form, round records,
and the Pricer (profile prices, the dense baseline, caches, unknown profiles)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from aggregator.engine.accounting import (
    AgentRound,
    Pricer,
    RoundCosts,
    RoundRecord,
    Spend,
    uvarint_len,
)
from edge_agent.links.catalog import resolve_profile
from edge_agent.links.cost import Cost
from edge_agent.links.profiles import CostProfile
from edge_agent.numerics.compressors import compress
from edge_agent.protocol import wire

PROFILE = "lorawan_eu868_dr5_sf7"
D = 200


def _header(round: int = 3, seq: int = 1, agent: str = "a") -> wire.UpdateHeader:
    u = compress(np.arange(D, dtype=np.float64), "topk", 8)
    header, _ = wire.decode(wire.encode(u, job="j", agent=agent, round=round, seq=seq))
    return header


def test_spend_adds_every_field_and_round_trips_through_a_dict() -> None:
    a = Spend(Cost(1, 10, 80.0, 1, 0.5, 0.25), Cost(1, 100, 800.0, 2, 1.0, 0.5))
    total = Spend()
    total.add(a)
    total.add(a)
    assert total == Spend(Cost(2, 20, 160.0, 2, 1.0, 0.5), Cost(2, 200, 1600.0, 4, 2.0, 1.0))
    assert Spend.from_dict(total.to_dict()) == total
    # the flat JSON of earlier versions, missing fields zero
    assert total.to_dict()["dense_bytes"] == 200 and total.to_dict()["updates"] == 2
    assert Spend.from_dict({"bytes": 5, "unknown": 1}) == Spend(Cost(bytes=5))


def test_round_costs_sum_per_agent_and_restore_old_entries() -> None:
    costs = RoundCosts()
    s = Spend(Cost(messages=1, bytes=30, packets=2, airtime_s=0.5, energy_j=0.25), Cost(1, 300))
    costs.add("a", 8, s)
    costs.add("a", 4, s)
    costs.add("b", 1, s)
    assert costs.agents["a"].to_dict() == {"t": 12, "bytes": 60, "updates": 2, "packets": 4,
                                           "bits": 0.0, "airtime_s": 1.0, "energy_j": 0.5}  # fmt: skip
    assert costs.spend.actual.messages == 3 and costs.spend.actual.bytes == 90
    again = RoundCosts.restore(costs.export())
    assert again == costs
    assert again.agents is not costs.agents  # a copy, not a view
    old = AgentRound.from_dict({"t": 3, "bytes": 7})  # written before the cost fields
    assert old == AgentRound(3, Cost(bytes=7))
    assert isinstance(old.cost.airtime_s, float) and isinstance(old.t, int)


def test_round_record_round_trips_through_a_dict() -> None:
    rec = RoundRecord(version=4, base_version=3, opened_at=1.0, closed_at=3.5, reason="deadline",
                      gamma=0.1, participants=("a", "b"),
                      agents={"a": AgentRound(2, Cost(1, 9))},
                      spend=Spend(Cost(1, 9), Cost(1, 90)), loss=0.5, accuracy=None)  # fmt: skip
    assert rec.latency_s == 2.5
    assert RoundRecord.from_dict(rec.to_dict()) == rec


def test_uvarint_len_is_the_wire_length() -> None:
    for n in (0, 1, 127, 128, 16383, 16384, 2**21, 2**35, 2**63 - 1):
        assert uvarint_len(n) == len(wire.uvarint(n))


def test_pricer_prices_on_the_profile_and_the_dense_float32_twin() -> None:
    pricer = Pricer(resolve_profile)
    header = _header()
    spend = pricer.price(PROFILE, header, 57)
    profile = resolve_profile(PROFILE)
    mc = profile.message_cost(57)
    dense_size = wire.encoded_size("dense", d=D, t=D, job="j", agent="a", round=3, seq=1,
                                   value_dtype="float32")  # fmt: skip
    dense = profile.message_cost(int(dense_size))
    assert spend.actual == mc.cost and spend.dense == dense.cost
    assert (spend.actual.messages, spend.actual.bytes, spend.dense.bytes) == (1, 57, dense_size)
    assert pricer.price(PROFILE, header, 57) is spend  # cached and shared
    # the dense size depends on round and seq only through their varint lengths
    assert pricer.dense_size(_header(round=4, seq=2)) == dense_size  # same lengths: cached
    big = wire.encoded_size("dense", d=D, t=D, job="j", agent="a", round=2**14, seq=1,
                            value_dtype="float32")  # fmt: skip
    assert pricer.dense_size(_header(round=2**14, seq=1)) == big == dense_size + 2


def test_an_unknown_profile_is_logged_once_and_priced_as_bytes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def lookup(name: str) -> CostProfile | None:
        raise KeyError(name)

    pricer = Pricer(lookup)
    with caplog.at_level(logging.WARNING, logger="aggregator.engine.accounting"):
        a = pricer.price("nope", _header(), 40)
        b = pricer.price("nope", _header(seq=2), 41)
    assert sum("nope" in r.getMessage() for r in caplog.records) == 1
    assert a.actual == Cost(1, 40) and b.actual.bytes == 41
    assert Pricer(None).price(PROFILE, _header(), 40).actual.bits == 0.0  # no lookup: bytes only
    assert Pricer(resolve_profile).price("", _header(), 40).actual.bits == 0.0  # no profile named
