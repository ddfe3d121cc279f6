"""What an agent spent and dropped: the cost ledger (both directions), one log line per
update sent, and the counters of inbound messages by what happened to them."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_agent.links.cost import ZERO, Cost, MessageCost, Traffic

__all__ = ["AgentCounters", "CostLedger", "RoundLog"]


@dataclass
class CostLedger:
    """Everything this agent put on its link (``up``) and received (``down``), priced on
    its own profile (units in the names; :class:`edge_agent.links.cost.Cost`).

    ``up`` counts every message sent (updates, re-sends, hellos, status, requests),
    ``down`` every message received from the aggregator (snapshots, steps, deltas,
    control); ``update_cost`` is the part of ``up`` that was first sends of updates.
    ``silence_s`` sums the duty-cycle silence owed after each send. The scalar fields
    (``messages``, ``bits``, ``airtime_s``, ...) are the uplink's, as before.
    """

    up: Cost = ZERO
    down: Cost = ZERO
    update_cost: Cost = ZERO
    bytes_on_air: int = 0
    bytes_on_air_down: int = 0
    silence_s: float = 0.0
    #: the silence the senders of what it received owed afterwards (e.g. a LoRaWAN gateway)
    sender_silence_s: float = 0.0

    def add(self, cost: MessageCost, *, update: bool) -> None:
        """Account one message sent."""
        c = cost.cost
        self.up = self.up + c
        if update:
            self.update_cost = self.update_cost + c
        self.bytes_on_air += cost.bytes_on_air
        self.silence_s += cost.silence_s

    def received(self, cost: MessageCost) -> None:
        """Account one message received."""
        self.down = self.down + cost.cost
        self.bytes_on_air_down += cost.bytes_on_air
        self.sender_silence_s += cost.silence_s

    @property
    def traffic(self) -> Traffic:
        return Traffic(self.up, self.down)

    @property
    def messages(self) -> int:
        return self.up.messages

    @property
    def updates(self) -> int:
        return self.update_cost.messages

    @property
    def size_bytes(self) -> int:
        return self.up.bytes

    @property
    def packets(self) -> int:
        return self.up.packets

    @property
    def bits(self) -> float:
        return self.up.bits

    @property
    def airtime_s(self) -> float:
        return self.up.airtime_s

    @property
    def energy_j(self) -> float:
        return self.up.energy_j

    def summary(self) -> dict[str, object]:
        """JSON-able: uplink, downlink and total, plus updates and silence owed."""
        return {
            **self.traffic.to_dict(),
            "updates": self.updates,
            "bytes_on_air": self.bytes_on_air,
            "bytes_on_air_down": self.bytes_on_air_down,
            "silence_s": self.silence_s,
        }


@dataclass(frozen=True)
class RoundLog:
    """One update sent: its level, its cost on the link, and where the time went."""

    round: int
    seq: int
    t: int
    size_bytes: int
    packets: int
    airtime_s: float
    energy_j: float
    loss: float
    grad_s: float
    select_s: float
    compress_s: float
    encode_s: float
    send_s: float

    def line(self) -> str:
        return (
            f"round {self.round:>5}  T={self.t:<6} bytes={self.size_bytes:<7} "
            f"packets={self.packets:<4} airtime={self.airtime_s:.4f}s "
            f"energy={self.energy_j:.5f}J loss={self.loss:.6f}"
        )


@dataclass
class AgentCounters:
    """Inbound messages this agent dropped, by reason."""

    dropped: dict[str, int] = field(default_factory=dict)
    snapshots: int = 0
    deltas: int = 0
    steps: int = 0  # replicated steps messages applied
    requests: int = 0
    resends: int = 0
    resets: int = 0  # EF21 state resets the aggregator asked for
    #: refusals the aggregator sent this agent, by reason (a ``reset`` counts as ef21_reset)
    refused: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str) -> int:
        """Count one drop; the count of ``reason`` so far."""
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        return self.dropped[reason]
