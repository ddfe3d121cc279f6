"""Tests for edge_agent.protocol.fragments: round trips, parity recovery, malformed frames."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.errors import WireFormatError
from edge_agent.protocol.fragments import (
    FRAME_HEADER_BYTES,
    Reassembler,
    encode_fragments,
    parity_frames_for,
    parse_fragment,
    plan_fragments,
)

SPEC = Path(__file__).resolve().parents[2] / "docs" / "wire-format.md"


@st.composite
def sessions(draw: st.DrawFn) -> tuple[bytes, int, list[bytes]]:
    """A message, its frame payload size and its frames with some parity."""
    message = draw(st.binary(max_size=3000))
    frame_payload = draw(st.integers(FRAME_HEADER_BYTES + 1, 260))
    n = plan_fragments(len(message), frame_payload).data_frames
    r = draw(st.integers(0, min(n, 255)))
    frames = encode_fragments(message, draw(st.integers(0, 2**20)), frame_payload, r)
    return message, r, frames


def _reassemble(frames: list[bytes]) -> Reassembler:
    out = Reassembler()
    for frame in frames:
        out.add(frame)
    return out


@given(sessions(), st.randoms(use_true_random=False))
def test_any_message_round_trips_in_any_order_with_duplicates(
    session: tuple[bytes, int, list[bytes]], rnd: object
) -> None:
    message, _, frames = session
    shuffled = frames + frames[: len(frames) // 2]
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    got = _reassemble(shuffled)
    assert got.complete and got.missing() == ()
    assert got.message() == message


@given(sessions(), st.data())
def test_one_loss_per_parity_class_is_recovered(
    session: tuple[bytes, int, list[bytes]], data: st.DataObject
) -> None:
    message, r, frames = session
    n = len(frames) - r
    if r == 0:
        return
    # per class j: lose nothing, one of its data frames, or its parity frame
    lost: set[int] = set()
    for j in range(r):
        members = [*range(j, n, r), n + (j - n) % r]
        choice = data.draw(st.sampled_from([None, *members]))
        if choice is not None:
            lost.add(choice)
    got = _reassemble([f for i, f in enumerate(frames) if i not in lost])
    assert got.missing() == ()
    assert got.message() == message


@given(sessions(), st.data())
def test_a_burst_of_r_lost_frames_is_recovered(
    session: tuple[bytes, int, list[bytes]], data: st.DataObject
) -> None:
    message, r, frames = session
    start = data.draw(st.integers(0, len(frames) - 1))
    kept = frames[:start] + frames[start + r :]
    assert _reassemble(kept).message() == message


@given(sessions(), st.data())
def test_two_losses_in_a_class_are_reported_missing(
    session: tuple[bytes, int, list[bytes]], data: st.DataObject
) -> None:
    _, r, frames = session
    n = len(frames) - r
    step = max(r, 1)
    first = data.draw(st.integers(0, n - 1))
    if first + step >= n:
        return
    lost = {first, first + step}
    if len(lost) == len(frames):
        return  # nothing received: the message is not even known
    got = _reassemble([f for i, f in enumerate(frames) if i not in lost])
    assert set(got.missing()) == lost
    with pytest.raises(WireFormatError, match="data frames missing"):
        got.message()


def test_missing_lists_unrecoverable_data_frames_only() -> None:
    frames = encode_fragments(bytes(range(200)), 7, 27, parity_frames=2)  # 20 B blocks
    n = len(frames) - 2
    got = _reassemble([f for i, f in enumerate(frames) if i not in {0, 2, 3}])
    # class 0 lost 0 and 2 (parity cannot help), class 1 lost 3 only (recoverable)
    assert n == 11 and got.missing() == (0, 2)
    assert Reassembler().missing() == (0,)


@given(st.binary(max_size=64))
def test_arbitrary_bytes_parse_or_raise_the_wire_error(frame: bytes) -> None:
    try:
        fragment = parse_fragment(frame)
    except WireFormatError:
        return
    assert fragment.index < fragment.data_count + fragment.parity_count


@given(st.lists(st.binary(min_size=8, max_size=40), max_size=12), sessions())
def test_garbage_frames_never_crash_a_reassembler(
    garbage: list[bytes], session: tuple[bytes, int, list[bytes]]
) -> None:
    _, _, frames = session
    got = Reassembler()
    for frame in [*frames[:1], *garbage, *frames[1:]]:
        try:
            got.add(frame)
        except WireFormatError:
            continue
    assert got.complete or got.missing()
    with contextlib.suppress(WireFormatError):
        assert isinstance(got.message(), bytes)


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (bytes(7), "at least 1 byte of payload"),
        (bytes.fromhex("0100000000000080"), "data_count 0"),
        (bytes.fromhex("0100000001000280"), "parity_count 2 exceeds"),
        (bytes.fromhex("0100030002000180"), "index 3 not below"),
    ],
)
def test_malformed_headers_are_wire_errors(frame: bytes, reason: str) -> None:
    with pytest.raises(WireFormatError, match=reason):
        parse_fragment(frame)


def test_frames_that_contradict_the_session_are_refused() -> None:
    frames = encode_fragments(bytes(100), 5, 40, parity_frames=1)
    got = Reassembler()
    got.add(frames[0])
    other = encode_fragments(bytes(100), 6, 40, parity_frames=1)
    with pytest.raises(WireFormatError, match="does not belong to message 5"):
        got.add(other[1])
    with pytest.raises(WireFormatError, match="two payloads"):
        got.add(frames[0][:-1] + b"\x01")
    with pytest.raises(WireFormatError, match="blocks are 33 B"):
        got.add(frames[1][:-2])
    with pytest.raises(WireFormatError, match="does not end with 0x80"):
        got.add(frames[3][:-1] + b"\x00")
    assert got.missing() == (1, 2, 3)  # what was held survives the refusals


def test_plan_counts_headers_and_parity() -> None:
    plan = plan_fragments(1700, 115, int(parity_frames_for(np.array(16), 0.25)))
    assert (plan.data_frames, plan.parity_frames, plan.block_bytes) == (16, 4, 108)
    assert plan.last_bytes == 1701 - 15 * 108
    assert plan.frame_bytes == 20 * FRAME_HEADER_BYTES + 1701 + 4 * 108
    assert sum(len(f) for f in encode_fragments(bytes(1700), 0, 115, 4)) == plan.frame_bytes
    np.testing.assert_array_equal(parity_frames_for(np.array([1, 30, 1000]), 0.1), [1, 3, 100])
    assert int(parity_frames_for(np.array(1000), 1.0)) == 255
    with pytest.raises(ValueError, match="frame_payload_bytes must be > 7"):
        plan_fragments(10, 7)


def test_the_spec_example_is_what_the_code_sends() -> None:
    text = SPEC.read_text(encoding="utf-8")
    section = text[text.index("## 12. Fragmented downlinks") :]
    shown = re.findall(r"^frame \d: ([0-9a-f ]+)$", section, flags=re.MULTILINE)
    frames = encode_fragments(b"CAT multicast!", 0x0102, 15, parity_frames=1)
    assert [s.replace(" ", "") for s in shown] == [f.hex() for f in frames]
