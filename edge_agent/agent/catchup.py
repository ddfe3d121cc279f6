"""When an agent's model copy cannot follow the broadcast: what it asks for, and how often.

A model message the replica cannot apply (:class:`edge_agent.agent.replica.Replica`) says
what is missing:

- ``version_gap``: steps were missed; the agent asks for the merged steps from its version
  (``Request(have=<version>)``), which the aggregator sends while it holds them, else a
  state snapshot;
- ``no_model``, ``no_aggregate`` (an EF21 replica loaded a snapshot without the aggregate
  ``h`` the steps need), ``wrong_family``, ``not_finite``: the copy is no usable base; the
  agent asks for a state snapshot (``Request(have=None)``), which carries ``h``.

At most one request is outstanding: the next one waits a bounded exponential back-off
(:data:`FIRST_BACKOFF_S`, doubling up to the caller's cap), so a stream of messages it
cannot apply costs one request per back-off interval, never one per message. The back-off
restarts only once a broadcast step (or delta) applies again: a snapshot that loads but
leaves the replica unable to follow does not reset it. The caller sends the request when
its radio may send (the duty cycle applies to requests too).

An agent without a model asks at start-up (``startup``). Over MQTT the retained snapshot on
``cat/<job>/model`` usually arrives first; it is the model as of the aggregator's start,
possibly many versions old, and a stale EF21 update is applied without an answer, so that
want stays until an answer addressed to the agent or a broadcast step that applies shows
the copy is current.

Drops are logged once per reason: INFO at the first, WARNING when a reason reaches
:data:`REPEATED_DROPS` (the agent is stuck behind the fleet until it is answered).
"""

from __future__ import annotations

import logging
from typing import Final, Literal, TypeAlias

from edge_agent.protocol import messages

log = logging.getLogger("edge_agent")

Want: TypeAlias = Literal["steps", "snapshot"]
#: the first wait between two requests (seconds); it doubles up to the cap
FIRST_BACKOFF_S: Final = 1.0
#: drops of one reason after which the agent warns (once per reason)
REPEATED_DROPS: Final = 10

_WHY: Final[dict[str, str]] = {
    "version_gap": "it missed versions",
    "no_model": "it has no model yet",
    "no_aggregate": "its copy has no EF21 aggregate h (a snapshot without it loaded)",
    "wrong_family": "the steps are of another update family than this agent's",
    "not_finite": "replaying the steps gave a non-finite model",
}


def want_for(reason: str) -> Want:
    """What answers a refusal: merged steps for a gap, a state snapshot otherwise."""
    return "steps" if reason == "version_gap" else "snapshot"


class CatchUp:
    """The outstanding want of one agent and its back-off. Times are the agent's clock."""

    def __init__(self, max_backoff_s: float) -> None:
        self.max_backoff_s = max(FIRST_BACKOFF_S, max_backoff_s)
        self.want: Want | None = None
        self._next_at = float("-inf")
        self._backoff_s = FIRST_BACKOFF_S
        self._startup = False
        self._logged: set[tuple[str, str]] = set()

    @property
    def backoff_s(self) -> float:
        """The wait after the next request."""
        return self._backoff_s

    def need(self, want: Want, *, startup: bool = False) -> None:
        """The replica needs ``want``; a snapshot need is not narrowed to steps.
        ``startup``: the first model; only an addressed snapshot or a step satisfies it."""
        if self.want != "snapshot":
            self.want = want
        self._startup = self._startup or startup

    def ready(self, now: float) -> bool:
        """True when a request is wanted and its back-off has passed."""
        return self.want is not None and now >= self._next_at

    def request(self, now: float, version: int | None) -> messages.Request | None:
        """The request to send now (and the next one's back-off starts), or None."""
        if not self.ready(now):
            return None
        have = version if self.want == "steps" else None
        self._next_at = now + self._backoff_s
        self._backoff_s = min(2 * self._backoff_s, self.max_backoff_s)
        return messages.Request(have=have)

    def loaded(self, *, addressed: bool) -> None:
        """A snapshot was applied (``addressed``: an answer to this agent, not the job-wide
        retained one): nothing is wanted, until a step shows otherwise."""
        if addressed or not self._startup:
            self.want = None
            self._startup = False

    def followed(self) -> None:
        """A broadcast step or delta applied: the copy follows; the back-off restarts."""
        self.want = None
        self._startup = False
        self._next_at = float("-inf")
        self._backoff_s = FIRST_BACKOFF_S

    def dropped(self, reason: str, count: int) -> None:
        """A model message was dropped for ``reason`` (``count`` so far): log once per
        reason, at INFO first, at WARNING once it repeats."""
        why = _WHY.get(reason, reason)
        asks = "merged steps" if want_for(reason) == "steps" else "a state snapshot"
        if (reason, "info") not in self._logged:
            self._logged.add((reason, "info"))
            log.info(
                "dropped a model message it cannot apply (%s: %s); asking the aggregator for %s",
                reason,
                why,
                asks,
            )
        if count >= REPEATED_DROPS and (reason, "warning") not in self._logged:
            self._logged.add((reason, "warning"))
            log.warning(
                "dropped %d model messages it cannot apply (%s: %s); still asking for %s, "
                "at most once every %.0f s: the model copy lags until it is answered",
                count,
                reason,
                why,
                asks,
                self.max_backoff_s,
            )
