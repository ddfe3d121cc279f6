"""Shared downlinks: one transmission that reaches every member of a group.

A profile's ``downlink`` part may carry a ``shared`` object (docs/cost-profiles.md, "Shared
downlinks"): a LoRaWAN class C or class B multicast group, BLE periodic advertising, and the
like. The sender transmits each frame once, at the group's data rate, under its own duty
cycle, and every member pays to receive it. For a message of ``size_bytes``:

- frames: the message cut by :mod:`edge_agent.protocol.fragments` into ``n`` data frames of
  at most ``max_payload_bytes`` (the 7-byte fragment header included), plus
  ``r = ceil(redundancy * n)`` parity frames;
- the sender's airtime ``A = frames * frame_airtime_s + byte_airtime_s * frame_bytes``
  (``frame_bytes``: every frame's fragment header and payload; ``frame_airtime_s`` is the
  time on air of a frame with no payload, its link headers included);
- the time the group's downlink is busy: ``A / sender_duty_cycle`` (``A`` without one); a
  slotted delivery sends at most one frame per slot, so at least ``frames * slot_period_s``;
- each member's receive energy: ``A * rx_power_w`` plus ``listen_power_w`` times the time it
  listens without receiving, by delivery:

  - ``continuous`` (LoRaWAN class C): the receiver is on from ``session_guard_s`` before the
    first frame to the end of the last one: ``session_guard_s + span - A``, where the span
    is the busy time less the sender's silence after the last frame;
  - ``slotted`` (LoRaWAN class B ping slots, BLE periodic advertising events): the receiver
    opens a window of ``slot_listen_s`` in each slot of the busy time,
    ``ceil(busy / slot_period_s)`` slots, plus ``sync_listen_s`` for each synchronisation
    event (a class B beacon every ``sync_period_s``) in it.

Every member receives every frame, parity included (a member that reassembles early could
stop listening: not modelled). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal, TypeAlias

import numpy as np
from numpy.typing import NDArray

from edge_agent.protocol.fragments import FRAME_HEADER_BYTES, frame_cut, parity_frames_for
from edge_agent.validation import (
    Check,
    integer,
    literal,
    number,
    optional,
    revalidate,
    string,
    tuple_of,
)

__all__ = ["DAY_SECONDS", "SharedDelivery", "SharedDownlink", "duty_share"]

IntArray: TypeAlias = NDArray[np.int64]
FloatArray: TypeAlias = NDArray[np.float64]
#: seconds or watts: finite, >= 0
NONNEGATIVE: Final = number(ge=0.0, finite=True)
#: a period in seconds: finite, > 0
PERIOD: Final = number(gt=0.0, finite=True)
#: a duty cycle: a fraction in (0, 1]
FRACTION: Final = number(gt=0.0, le=1.0)
POSITIVE_INT: Final = integer(gt=0)
NONNEGATIVE_INT: Final = integer(ge=0)
TEXTS: Final = tuple_of(string())
#: seconds of a day: > 0, at most a day (a fair-use cap on airtime)
DAY_SECONDS: Final = number(gt=0.0, le=86_400.0)


def duty_share(duty_cycle: float | None, bands: int, cap_s_per_day: float | None) -> float | None:
    """The share of time an uplink may be on the air: ``duty_cycle`` in each of ``bands``
    sub-bands, or a fair-use cap of ``cap_s_per_day`` seconds a day (``cap / 86400``) when
    smaller; at most 1; None with neither."""
    shares = [] if duty_cycle is None else [duty_cycle * bands]
    shares += [] if cap_s_per_day is None else [cap_s_per_day / 86_400.0]
    return min(1.0, *shares) if shares else None


@dataclass(frozen=True, slots=True)
class SharedDelivery:
    """One message on a shared downlink.

    ``data_frames`` + ``parity_frames`` = ``frames``; ``frame_bytes``: their fragment headers
    and payloads; ``bytes_on_air``: plus the link's per-packet overhead. ``airtime_s``: the
    sender's time on air (seconds); ``busy_s``: the time the group's downlink is busy
    (airtime over the sender's duty cycle, or the slots it takes); ``listen_s``: the time
    each member listens without receiving; ``rx_energy_j`` (airtime at the RX power) +
    ``listen_energy_j`` = ``energy_j``, what each member pays (joules)."""

    size_bytes: int
    data_frames: int
    parity_frames: int
    frames: int
    frame_bytes: int
    bytes_on_air: int
    airtime_s: float
    busy_s: float
    listen_s: float
    rx_energy_j: float
    listen_energy_j: float
    energy_j: float


@dataclass(frozen=True, kw_only=True)
class SharedDownlink:
    """A shared delivery: one transmission per frame reaches every member of a group.

    Fields: ``group`` (the group in one line: class, data rate, channel, e.g. ``class C,
    DR3 on 869.525 MHz``); ``max_payload_bytes``, the group's largest payload per frame,
    the fragment header included; ``frame_airtime_s``, the time on air of a frame with an
    empty payload (its link headers included); ``max_messages_per_day``, the network's cap
    on the group's downlink frames per day (None: none)."""

    group: str
    delivery: Literal["continuous", "slotted"]
    max_payload_bytes: int
    per_packet_overhead_bytes: int = 0
    frame_airtime_s: float
    byte_airtime_s: float
    sender_duty_cycle: float | None = None
    rx_power_w: float
    listen_power_w: float
    session_guard_s: float = 0.0
    slot_period_s: float | None = None
    slot_listen_s: float = 0.0
    sync_period_s: float | None = None
    sync_listen_s: float = 0.0
    redundancy: float = 0.0
    max_messages_per_day: int | None = None
    estimated: tuple[str, ...] = ()
    notes: str | None = None

    CHECKS: ClassVar[Mapping[str, Check]] = {
        "group": string(),
        "delivery": literal("continuous", "slotted"),
        "max_payload_bytes": POSITIVE_INT,
        "per_packet_overhead_bytes": NONNEGATIVE_INT,
        "frame_airtime_s": NONNEGATIVE,
        "byte_airtime_s": NONNEGATIVE,
        "sender_duty_cycle": optional(FRACTION),
        "rx_power_w": NONNEGATIVE,
        "listen_power_w": NONNEGATIVE,
        "session_guard_s": NONNEGATIVE,
        "slot_period_s": optional(PERIOD),
        "slot_listen_s": NONNEGATIVE,
        "sync_period_s": optional(PERIOD),
        "sync_listen_s": NONNEGATIVE,
        "redundancy": number(ge=0.0, le=1.0),
        "max_messages_per_day": optional(POSITIVE_INT),
        "estimated": TEXTS,
        "notes": optional(string()),
    }

    def __post_init__(self) -> None:
        revalidate(self)
        self._check_delivery()

    def _check_delivery(self) -> None:
        if self.max_payload_bytes <= FRAME_HEADER_BYTES:
            raise ValueError(
                f"downlink.shared.max_payload_bytes must be > {FRAME_HEADER_BYTES} (the "
                f"fragment header), got {self.max_payload_bytes}"
            )
        slotted = self.delivery == "slotted"
        if slotted != (self.slot_period_s is not None):
            raise ValueError(
                "downlink.shared.slot_period_s: required for a slotted delivery and only there"
                f" (delivery {self.delivery!r})"
            )
        if not slotted and (self.sync_period_s is not None or self.slot_listen_s):
            raise ValueError(
                "downlink.shared: sync_period_s and slot_listen_s belong to a slotted delivery"
            )
        if slotted and self.session_guard_s:
            raise ValueError("downlink.shared.session_guard_s belongs to a continuous delivery")

    # --- vectorised over message sizes ------------------------------------------------

    def _frames(self, size_bytes: NDArray[np.integer[Any]]) -> dict[str, IntArray]:
        sizes = np.asarray(size_bytes, dtype=np.int64)
        if sizes.size and int(sizes.min()) < 0:
            raise ValueError(f"size_bytes must be >= 0, got {int(sizes.min())}")
        n, block, last = frame_cut(sizes, self.max_payload_bytes)
        r = parity_frames_for(n, self.redundancy)
        payload = (n - 1 + r) * block + last
        last_frame = np.where(r > 0, block, last) + FRAME_HEADER_BYTES
        return {
            "data": n,
            "parity": r,
            "frames": n + r,
            "frame_bytes": payload + (n + r) * FRAME_HEADER_BYTES,
            "last_frame_bytes": last_frame,
        }

    def _times(self, frames: dict[str, IntArray]) -> dict[str, FloatArray]:
        count = frames["frames"].astype(np.float64)
        airtime = count * self.frame_airtime_s + self.byte_airtime_s * frames["frame_bytes"]
        stretch = 1.0 if self.sender_duty_cycle is None else 1.0 / self.sender_duty_cycle
        busy = airtime * stretch
        if self.delivery == "continuous":
            last = self.frame_airtime_s + self.byte_airtime_s * frames["last_frame_bytes"]
            listen = self.session_guard_s + busy - last * (stretch - 1.0) - airtime
        else:
            assert self.slot_period_s is not None
            busy = np.maximum(busy, count * self.slot_period_s)
            listen = np.ceil(busy / self.slot_period_s) * self.slot_listen_s
            if self.sync_period_s is not None:
                listen = listen + np.ceil(busy / self.sync_period_s) * self.sync_listen_s
        return {"airtime": airtime, "busy": busy, "listen": np.maximum(listen, 0.0)}

    def airtime_s(self, size_bytes: NDArray[np.integer[Any]]) -> FloatArray:
        """The sender's time on air for messages of ``size_bytes`` (seconds, vectorised)."""
        return self._times(self._frames(size_bytes))["airtime"]

    def busy_s(self, size_bytes: NDArray[np.integer[Any]]) -> FloatArray:
        """Seconds the group's downlink is busy with messages of ``size_bytes`` (vectorised)."""
        return self._times(self._frames(size_bytes))["busy"]

    def member_energy_j(self, size_bytes: NDArray[np.integer[Any]]) -> FloatArray:
        """What each member spends to receive messages of ``size_bytes`` (joules, vectorised)."""
        t = self._times(self._frames(size_bytes))
        return t["airtime"] * self.rx_power_w + t["listen"] * self.listen_power_w

    def delivery_of(self, size_bytes: int) -> SharedDelivery:
        """Full accounting of one message of ``size_bytes`` on this shared downlink."""
        f = {k: int(v[0]) for k, v in self._frames(np.array([size_bytes])).items()}
        t = {
            k: float(v[0]) for k, v in self._times({k: np.array([v]) for k, v in f.items()}).items()
        }
        rx, listen = t["airtime"] * self.rx_power_w, t["listen"] * self.listen_power_w
        return SharedDelivery(
            size_bytes=int(size_bytes),
            data_frames=f["data"],
            parity_frames=f["parity"],
            frames=f["frames"],
            frame_bytes=f["frame_bytes"],
            bytes_on_air=f["frame_bytes"] + f["frames"] * self.per_packet_overhead_bytes,
            airtime_s=t["airtime"],
            busy_s=t["busy"],
            listen_s=t["listen"],
            rx_energy_j=rx,
            listen_energy_j=listen,
            energy_j=rx + listen,
        )

    def days_at_cap(self, size_bytes: int) -> float | None:
        """Days the network's daily cap on the group's frames spreads one message over
        (frames / cap, not rounded); None without a cap."""
        if self.max_messages_per_day is None:
            return None
        return self.delivery_of(size_bytes).frames / self.max_messages_per_day
