"""A real :class:`Agent` on ``memory://`` with a settable clock, and a peer that hears it
(shared by the agent's unit tests)."""

from __future__ import annotations

import numpy as np

from edge_agent.agent.loop import Agent, AgentConfig
from edge_agent.data import make_rcv1_like
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.models import make_model
from edge_agent.protocol import topics
from edge_agent.transports import Transport, open_transport

JOB = "job1"
D = 40


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make_agent(
    url: str, clock: Clock, *, profile: str = "wifi_rpi4_mqtt_tls13", **cfg: object
) -> Agent:
    """Agent ``me`` of job :data:`JOB` (d = :data:`D`); ``cfg`` are AgentConfig fields
    (``duty_cycle`` defaults to ``ignore`` here)."""
    data = make_rcv1_like(30, D, rng=np.random.default_rng(0), nnz_per_row=5)
    cfg.setdefault("duty_cycle", "ignore")
    config = AgentConfig(job=JOB, agent_id="me", **cfg)  # type: ignore[arg-type]
    return Agent(
        config,
        model=make_model("logreg", n_features=D),
        data=data,
        profile=resolve_profile(profile),
        transport=open_transport(url, role="agent", client_id="me"),
        smoothness=1.0,
        clock=clock,
    )


def listen(url: str) -> Transport:
    """The aggregator's end of ``url``, subscribed to what agents send."""
    t = open_transport(url, role="aggregator", client_id="peer")
    t.connect()
    for pattern in topics.agent_inbound(JOB):
        t.subscribe(pattern)
    return t
