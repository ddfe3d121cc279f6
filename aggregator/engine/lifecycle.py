"""The lifecycle of one job: ``waiting`` for its first agents, ``running``, ``paused`` by
the operator, ``finished`` (``finish_reason`` says why). :class:`Lifecycle` is the only
writer of that state and exports and restores it itself (the checkpoint's ``state``,
``resume_to`` and ``finish_reason``)."""

from __future__ import annotations

import logging
from typing import Any, Literal

from aggregator.engine.downlink.outbound import Outbound, control_message
from aggregator.engine.types import EngineStateName
from edge_agent.protocol import messages

log = logging.getLogger("aggregator.engine")

ControlCmd = Literal["pause", "resume", "stop"]


class Lifecycle:
    """Where the job is, and where a resume returns it to."""

    def __init__(self, job: str) -> None:
        self.job = job
        self._state: EngineStateName = "waiting"
        self._resume_to: EngineStateName = "waiting"
        self._finish_reason = ""

    @property
    def state(self) -> EngineStateName:
        return self._state

    @property
    def finish_reason(self) -> str:
        return self._finish_reason

    def start(self) -> bool:
        """A waiting job starts running; return whether it did."""
        if self._state != "waiting":
            return False
        self._state = "running"
        return True

    def finish(self, reason: str, version: int) -> None:
        self._state, self._finish_reason = "finished", reason
        log.info("job %s finished at version %d: %s", self.job, version, reason)

    def control(self, cmd: ControlCmd, version: int) -> Outbound | None:
        """Apply an operator command at model ``version``; return the control message to
        broadcast (None: the state did not change). A finished job only resumes when an
        older version finished it as diverged (it kept its last finite model), and then
        paused (the resume below runs it)."""
        if not self._apply(cmd, version):
            return None
        reason = self._finish_reason if cmd == "stop" else ""
        ctl = messages.Control(cmd=cmd, version=version, reason=reason)
        return control_message(self.job, ctl)

    def _apply(self, cmd: ControlCmd, version: int) -> bool:
        if self._state == "finished":
            if cmd != "resume" or not self._finish_reason.startswith("diverged"):
                return False
            self._state, self._resume_to, self._finish_reason = "paused", "running", ""
        if cmd == "pause":
            if self._state == "paused":
                return False
            self._resume_to, self._state = self._state, "paused"
        elif cmd == "resume":
            if self._state != "paused":
                return False
            self._state = self._resume_to
        else:
            self.finish("stopped by operator", version)
        return True

    def resync(self, version: int) -> Outbound:
        """Control ``resync``: the aggregator (re)started at ``version``."""
        ctl = messages.Control(cmd="resync", version=version, reason="aggregator started")
        return control_message(self.job, ctl)

    def controls(self, version: int) -> list[Outbound]:
        """The pause or stop agents must see now (none while waiting or running)."""
        if self._state not in ("paused", "finished"):
            return []
        cmd: Literal["pause", "stop"] = "pause" if self._state == "paused" else "stop"
        ctl = messages.Control(cmd=cmd, version=version, reason=self._finish_reason)
        return [control_message(self.job, ctl)]

    def export(self) -> dict[str, Any]:
        return {
            "state": self._state,
            "resume_to": self._resume_to,
            "finish_reason": self._finish_reason,
        }

    def restore(self, meta: dict[str, Any]) -> None:
        self._state = meta["state"]
        self._resume_to = meta["resume_to"]
        self._finish_reason = meta["finish_reason"]
