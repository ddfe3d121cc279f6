"""The agent's check of the aggregator's signatures, before any message is parsed.

With the aggregator's public key (``--aggregator-key``) an agent acts only on messages the
aggregator signed for the topic they arrived on, with a counter above the highest it
accepted on that topic (docs/wire-format.md section 13). Everything else is counted by
reason, logged once per reason at WARNING, and ignored; it never stops the agent:

- ``unsigned``: no signature trailer;
- ``bad_signature``: a trailer that does not verify (forged, altered, another key, meant
  for another topic) or is malformed;
- ``replayed``: valid, but its counter is below the highest accepted on its topic, or
  (control and job settings on a topic that is never retained) older than the agent's
  start, by its own clock less an allowance (``not_before_us``);
- ``repeated``: valid, with the counter accepted last on its topic (a retained message
  delivered again on a reconnect): ignored and counted, not logged.

Without a key the agent takes every message as before, signed or not (the trailer is
stripped and not checked); ``cryptography`` is then never imported.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from edge_agent.agent.ledger import AgentCounters
from edge_agent.errors import WireFormatError
from edge_agent.protocol import topics
from edge_agent.protocol.signing import Opened, Verifier, open_signed

log = logging.getLogger("edge_agent")

#: drop reasons the check counts (AgentCounters.dropped); "repeated" is not logged
REASONS: tuple[str, ...] = ("unsigned", "bad_signature", "replayed", "repeated")
_EXPLAIN = {
    "unsigned": "an unsigned message (this agent has the aggregator's key: only signed "
    "messages are acted on)",
    "bad_signature": "a message whose signature does not verify under the aggregator's key",
    "replayed": "a validly signed but old message (its counter is below one already "
    "accepted on the topic: a replay)",
}


class SignatureCheck:
    """What the agent lets through from its inbound messages."""

    def __init__(
        self, public_keys: Sequence[bytes], counters: AgentCounters, not_before_us: int = 0
    ) -> None:
        self._verifier = Verifier(list(public_keys)) if public_keys else None
        self._counters = counters
        #: JSON (control, job settings) on a topic that is never retained must be at least
        #: this new: the counter is the aggregator's clock in microseconds, so a stop
        #: recorded before this agent started is refused even as its first on the topic
        self.not_before_us = not_before_us
        #: the highest counter accepted per topic (an agent subscribes to five topics)
        self.highest: dict[str, int] = {}

    @property
    def enforced(self) -> bool:
        """True when messages must carry a valid signature (the agent has a key)."""
        return self._verifier is not None

    def admit(self, topic: str, payload: bytes) -> bytes | None:
        """The unsigned message to act on, or None (counted and dropped). Without a key,
        ``payload`` without its trailer; a trailer it announces but lacks raises
        WireFormatError (counted ``malformed`` by the caller)."""
        if self._verifier is None:
            opened = open_signed(payload)
            return payload if opened is None else opened.message
        reason, message = self._check(topic, payload)
        if reason is not None and self._counters.drop(reason) == 1 and reason in _EXPLAIN:
            log.warning("ignored %s on %s (counted as dropped %r)", _EXPLAIN[reason], topic, reason)
        return message

    def _check(self, topic: str, payload: bytes) -> tuple[str | None, bytes | None]:
        """(None, the message) when it is the aggregator's and new, else (why not, None)."""
        assert self._verifier is not None
        try:
            opened = open_signed(payload)
        except WireFormatError:
            return "bad_signature", None
        if opened is None:
            return "unsigned", None
        if not self._verifier.verify(topic, opened):
            return "bad_signature", None
        last = self.highest.get(topic)
        if last is None and opened.counter < self.not_before_us and _live_json(topic, opened):
            return "replayed", None
        if last is not None and opened.counter <= last:
            return ("replayed" if opened.counter < last else "repeated"), None
        self.highest[topic] = opened.counter
        return None, opened.message


def _live_json(topic: str, opened: Opened) -> bool:
    """A JSON message on a topic never retained (control, ``to``): it was published after
    the agent subscribed, so its counter cannot predate the agent's start."""
    if opened.message[:1] != b"{":
        return False
    try:
        kind = topics.parse(topic).kind
    except ValueError:
        return False
    return kind in ("control", topics.TO_AGENT)
