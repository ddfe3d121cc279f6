"""A short fuzz of the whole ingest path (issue 13): junk among honest agents' updates.

The full run (100,000 inputs) is ``python benchmarks/fuzz_ingest.py``; this one runs a few
thousand through the same code: the real service (queue, ingest thread, batch decoder,
journal, checkpoints), with every check of the benchmark after each batch (no crash, every
input applied or refused with a counted reason, the model finite and bit-identical to a
reference engine fed only the honest messages).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import fuzz_ingest

pytestmark = [pytest.mark.security]


def test_fuzz_ingest_short() -> None:
    # 200 junk inputs per round: 15 rounds, so the norm warm-up ends and the relative bound
    # is fuzzed too (extremes from 1e8 up)
    out = fuzz_ingest.run(3_000, seed=13, per_round=200)
    assert out["crashes"] == 0 and out["healthy"]
    assert out["inputs"] == 3_000
    assert set(out["by_kind"]) == set(fuzz_ingest.GENERATORS)
    assert out["model_equals_honest_reference"] and out["model_moved_by_honest_only"]
    assert out["versions"] == 15
    # the relative norm bound and the divergence check were both reached
    assert out["rejected_by_reason"].get("too_large", 0) > 0
    assert out["rejected_by_reason"].get("would_diverge", 0) > 0
    # only valid snapshot requests are applied: junk never enters a step
    assert set(out["applied_by_kind"]) <= {"request"}
    refused = sum(out["rejected_by_reason"].values())
    assert refused + sum(out["applied_by_kind"].values()) == out["inputs"]
