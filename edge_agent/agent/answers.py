"""What an agent hears back from the aggregator, or does not: refusals and silence.

A refusal (control ``refused`` naming this agent, :class:`edge_agent.protocol.messages.Control`) is
logged at WARNING and counted by reason; after ``max_refusals`` refusals that cannot heal
(:data:`edge_agent.protocol.messages.REFUSAL_FATAL`: the job's d, model, compressor or update
semantics differ from the agent's) the agent gives up with one line saying why. An agent
that says hello and hears nothing at all for :data:`NO_ANSWER_WARN_S` seconds says so,
with what it tried (a wrong server, port or job id all look like this).
"""

from __future__ import annotations

import logging

from edge_agent.protocol import messages, topics

log = logging.getLogger("edge_agent")

#: an agent without a model that has heard nothing for this long says so (seconds)
NO_ANSWER_WARN_S = 60.0


class Answers:
    """Refusal counts (``refused``: the caller's dict, by reason) and the silence timer.
    Times are the agent's clock, in seconds."""

    def __init__(
        self, job: str, agent: str, max_refusals: int, refused: dict[str, int], now: float
    ) -> None:
        self.job = job
        self.agent = agent
        self.max_refusals = max_refusals
        self.refused = refused
        self.fatal = 0  # refusals that cannot heal
        self.hellos = 0  # hellos repeated for want of an answer
        self._last_heard = now
        self._warn_at = now + NO_ANSWER_WARN_S

    def heard(self, now: float) -> None:
        """Something arrived (any message counts: the link and the job are right)."""
        self._last_heard = now

    def count(self, reason: str) -> int:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        return self.refused[reason]

    def refusal(self, reason: str, detail: str) -> str | None:
        """Log and count one refusal; the line to end with once the agent must give up."""
        n = self.count(reason)
        log.warning(
            "the aggregator refused this agent's message: %s%s (%d so far)",
            reason,
            f" ({detail})" if detail else "",
            n,
        )
        if reason not in messages.REFUSAL_FATAL:
            return None
        self.fatal += 1
        if self.fatal < self.max_refusals:
            return None
        return (
            f"job {self.job} refused agent {self.agent} {self.fatal} times, last for {reason}"
            f"{f' ({detail})' if detail else ''}: the agent's settings do not fit the job's; "
            "change them (or the job's) and restart"
        )

    def hello_unanswered(self, now: float, server: str) -> None:
        """A hello is repeated: warn (every NO_ANSWER_WARN_S) while nothing arrives."""
        self.hellos += 1
        if now - self._last_heard < NO_ANSWER_WARN_S or now < self._warn_at:
            return
        self._warn_at = now + NO_ANSWER_WARN_S
        log.warning(
            "no answer from the aggregator for %.0f s (%d hellos): server %s, job %s, hello "
            "on %s, listening on %s; check --server and --job against the aggregator's "
            "AGG_TRANSPORTS and AGG_JOB",
            now - self._last_heard,
            self.hellos,
            server,
            self.job,
            topics.hello(self.job, self.agent),
            ", ".join(topics.agent_subscriptions(self.job)),
        )
