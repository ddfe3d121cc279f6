"""One in-process fleet: a :class:`RoundEngine` and N real :class:`Agent` s over ``memory://``.

Whatever needs "the real protocol, no processes, no network" uses this one harness: the
simulator (:mod:`aggregator.sim.experiment`), the EF21 reset test, the end-to-end tests'
reference run (the benchmarks measure the service and the codec, not such a fleet). It owns a fresh in-process broker, the aggregator's end
of it (subscribed to every agent topic of the engine's job) and one transport per agent;
it pumps messages synchronously, so a run is deterministic (signed downlinks too: ``seal``
counts 1, 2, 3, ...)::

    with FleetHarness(RoundEngine(config)) as fleet:
        fleet.add_agent(AgentConfig(job=config.job, agent_id="a1", resend_s=None), ...)
        fleet.start()
        fleet.pump(strict=True)          # hellos in, the model out
        while ...:
            fleet.deliver()              # agents take the model / deltas
            fleet.step()                 # gradient, compress, publish
            fleet.clock.now += 1.0       # simulated seconds
            fleet.pump(strict=True)      # engine handles the updates, closes the round

Time is the harness's :class:`SimClock`: the agents read it and the engine is handed its
value, so nothing depends on the wall clock. Closing (or leaving the ``with`` block) closes
every transport and forgets the broker.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from types import TracebackType

from aggregator.engine.downlink.pacing import Published, as_outbound
from aggregator.engine.rounds import Effects, RoundEngine
from edge_agent.agent.loop import Agent, AgentConfig, RoundLog
from edge_agent.data import Dataset
from edge_agent.links.profiles import CostProfile
from edge_agent.numerics.models import Model
from edge_agent.protocol import topics
from edge_agent.transports import Message, drop_broker, open_transport


class SimClock:
    """Simulated seconds: callable like ``time.monotonic``, advanced by assigning ``now``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FleetHarness:
    """A round engine and its agents over one private ``memory://`` broker.

    ``name`` prefixes the broker's random name (it shows in errors only). The engine is the
    caller's, built with whatever config, evaluator and profile lookup the caller needs.
    """

    def __init__(
        self,
        engine: RoundEngine,
        *,
        name: str = "harness",
        seal: Callable[[str, bytes], bytes] | None = None,
    ) -> None:
        self.engine = engine
        #: signs what the engine publishes before it is charged, as the service does
        #: (``edge_agent.protocol.signing.CountingSigner``); None: nothing is signed
        self.seal = seal
        self.job = engine.config.job
        self.clock = SimClock()
        self.broker = f"{name}-{uuid.uuid4().hex}"
        self.url = f"memory://{self.broker}"
        self.agents: list[Agent] = []
        #: per topic, what a message becomes on its way to the engine (:meth:`tamper`)
        self._tampered: dict[str, Callable[[bytes], bytes]] = {}
        self.hub = open_transport(self.url, role="aggregator", client_id="aggregator")
        try:
            self.hub.connect()
            for pattern in topics.agent_inbound(self.job):
                self.hub.subscribe(pattern)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ set-up

    def add_agent(
        self,
        config: AgentConfig,
        *,
        model: Model,
        data: Dataset,
        profile: CostProfile,
        smoothness: float | None = None,
    ) -> Agent:
        """A real agent on the harness's broker and clock (not started: see :meth:`start`)."""
        if config.job != self.job:
            raise ValueError(
                f"agent {config.agent_id!r} is for job {config.job!r}, not {self.job!r}"
            )
        transport = open_transport(self.url, role="agent", client_id=config.agent_id)
        try:
            agent = Agent(
                config,
                model=model,
                data=data,
                profile=profile,
                transport=transport,
                smoothness=smoothness,
                clock=self.clock,
            )
        except BaseException:
            transport.close()
            raise
        self.agents.append(agent)
        return agent

    def start(self) -> None:
        """Every agent connects, says hello and asks for the model (queued for :meth:`pump`)."""
        for agent in self.agents:
            agent.start()

    # ------------------------------------------------------------------ the agents' side

    def deliver(self) -> int:
        """Every agent handles the messages waiting in its inbox; returns how many."""
        count = 0
        for agent in self.agents:
            while (msg := agent.transport.recv(timeout_s=0)) is not None:
                agent.handle(msg)
                count += 1
        return count

    def step(self) -> list[RoundLog | None]:
        """Every agent steps once (an update if it has an unanswered model version)."""
        return [agent.step() for agent in self.agents]

    # ------------------------------------------------------------------ the engine's side

    def waiting(self) -> Iterator[Message]:
        """The messages waiting for the aggregator, one at a time, until none is left."""
        while (msg := self.hub.recv(timeout_s=0)) is not None:
            yield msg

    def publish(self, *outbound: Published) -> None:
        """Publish engine output to the agents, in order (signed first, with ``seal``)."""
        if self.seal is not None:
            outbound = tuple(as_outbound(o).sealed(self.seal) for o in outbound)
        if outbound:  # what every live agent receives, in the engine's accounts
            self.engine.charge_downlink(outbound, self.clock.now)
        for out in outbound:
            self.hub.publish(out.topic, out.payload, retain=out.retain)

    def handle(self, msg: Message, *, strict: bool = False) -> Effects:
        """The engine handles ``msg`` at ``clock.now``; its output is published.

        ``strict``: a rejected message raises RuntimeError (nothing published) — in a
        simulation every message is well formed, so a rejection is a bug.
        """
        payload = msg.payload
        if (transform := self._tampered.get(msg.topic)) is not None:
            payload = transform(payload)
        effects = self.engine.handle(msg.topic, payload, self.clock.now)
        if strict and effects.reason is not None:
            raise RuntimeError(f"the engine rejected {msg.topic}: {effects.reason}")
        self.publish(*effects.outbound)
        return effects

    def tamper(self, topic: str, transform: Callable[[bytes], bytes]) -> None:
        """From now on every message on ``topic`` reaches the engine as ``transform`` of
        its payload (the simulator's hostile agent, aggregator/sim/hostile.py); the agent
        that sent it is untouched."""
        self._tampered[topic] = transform

    def pump(self, *, tick: bool = True, strict: bool = False) -> list[Effects]:
        """Hand every waiting message to the engine, then (``tick``) advance its time to
        ``clock.now``; everything it returns is published. Returns the effects, in order."""
        effects = [self.handle(msg, strict=strict) for msg in self.waiting()]
        if tick:
            ticked = self.engine.tick(self.clock.now)
            self.publish(*ticked.outbound)
            effects.append(ticked)
        return effects

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        """Close every transport and forget the broker. Idempotent."""
        for agent in self.agents:
            agent.transport.close()
        self.hub.close()
        drop_broker(self.broker)

    def __enter__(self) -> FleetHarness:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["FleetHarness", "SimClock"]
