"""Crash recovery with downlink pacing on: the state rebuilt from the data directory is the
live state, bit for bit (model, version, pacing, every agent's downlink account).

What the service publishes is charged to the agents' downlinks and paces the next version
(``AGG_DOWNLINK_PACING``); that charge used to be neither journalled nor checkpointed, so
a replay closed a paced round at its deadline instead of when the links were free.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.engine.rounds import RoundEngine
from aggregator.service.ingest import AggregatorService
from aggregator.service.settings import load_settings
from aggregator.service.store import Store, recover
from edge_agent.numerics.compressors import Semantics, compress
from edge_agent.protocol import messages, topics, wire
from edge_agent.transports import Message

JOB = "paced"
D = 1000
#: a slow downlink: a message keeps its link busy for 1 to 3 s (the deadline is 1 s)
SLOW = "nbiot_udp_psm_rai"
AGENTS = ("a", "b", "c")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _crash_and_recover(svc: AggregatorService, settings: Any, data_dir: Path) -> RoundEngine:
    """The process dies here (its store closed, nothing more written): the engine rebuilt
    from the same data directory."""
    store = svc._store
    assert store is not None
    store.close()
    fresh = Store(data_dir)
    try:
        return recover(fresh, settings.engine_config(), profiles=_profile).engine
    finally:
        fresh.close()


def _service(data_dir: Path, clock: _Clock, **more: Any) -> tuple[AggregatorService, Any]:
    """A started service whose ingest thread is stopped: the test runs its batches, as the
    ingest thread does, on the fake clock."""
    base: dict[str, Any] = dict(
        job=JOB, d=D, mode="sync", step_size=0.1, quorum_min_agents=2, round_deadline_s=1.0,
        min_agents=3, downlink_pacing=True, liveness_timeout_s=600.0, feedback="any",
        transports=[f"memory://{data_dir.name}"], data_dir=data_dir, downlink="exact",
    )  # fmt: skip
    settings = load_settings(**{**base, **more})
    svc = AggregatorService(settings, clock=clock)
    svc.start()
    svc.stop()
    svc._store = Store(data_dir)
    return svc, settings


def _hello(agent: str, profile: str = SLOW, semantics: Semantics = "plain") -> Message:
    msg = messages.Hello(
        job=JOB, agent=agent, d=D, rows=10, smoothness=2.0, model="logreg",
        compressor="topk", profile=profile, semantics=semantics,
    )  # fmt: skip
    return Message(topics.hello(JOB, agent), messages.dump(msg))


def _update(
    agent: str, round: int, rng: np.random.Generator, semantics: Semantics = "plain", seq: int = -1
) -> Message:
    update = replace(compress(rng.standard_normal(D), "topk", 200), semantics=semantics)
    blob = wire.encode(update, job=JOB, agent=agent, round=round,
                       seq=round if seq < 0 else seq)  # fmt: skip
    return Message(topics.update(JOB, agent), blob)


def _state(eng: RoundEngine) -> tuple[Any, ...]:
    export = eng.export()
    meta = export.meta
    return (
        eng.version,
        eng.x.tobytes(),
        eng.broadcast_model.tobytes(),
        eng.totals_down,
        meta.get("next_version_at"),
        meta.get("down_free_at"),
        [(a["agent"], a["down"], a["accepted"], a["rejected"]) for a in meta["agents"]],
        dict(eng.rejected),
        meta["round"],
        meta.get("cadence"),
    )


def _drive(svc: AggregatorService, clock: _Clock, steps: list[tuple[float, list[Message]]]) -> None:
    for now, batch in steps:
        clock.now = now
        svc._process([*batch])


@pytest.mark.parametrize("downlink", ["exact", "auto"])
def test_a_paced_job_recovers_exactly_after_a_crash(tmp_path: Path, downlink: str) -> None:
    """Three agents on a slow downlink, quorum 2, deadline 1 s: version 1 is published
    (its links stay busy for a few seconds), then the round of version 2 gets all three
    updates while the links are busy, and the process dies after the last one was accepted.
    The engine rebuilt from the data directory must hold exactly the live state (under the
    automatic downlink the agents' copy ``w`` too), and both must close the next version
    the same way."""
    rng = np.random.default_rng(7)
    ups = {(a, r): _update(a, r, rng) for r in range(3) for a in AGENTS}
    clock = _Clock()
    svc, settings = _service(tmp_path / "data", clock, downlink=downlink)
    _drive(svc, clock, [
        (1.0, [_hello(a) for a in AGENTS]),
        (1.5, [ups[(a, 0)] for a in AGENTS]),  # version 1 closes, is published: links busy
        (2.0, [ups[("a", 1)]]),
        (2.7, [ups[("b", 1)]]),  # past the deadline with quorum, but the links are busy
        (2.8, [ups[("c", 1)]]),
    ])  # fmt: skip
    live = svc.read(_state)
    if downlink == "exact":  # the automatic downlink's smaller messages free the links sooner
        assert live[0] == 1, "pacing holds version 2 while the links are busy"
    # the process dies here; the live service goes on to close version 2 when the links free
    rebuilt = _crash_and_recover(svc, settings, tmp_path / "data")
    if downlink == "auto":
        # version 2 closed at the deadline with a and b, so c's update was refused as
        # stale: a refusal is counted, not journalled (it changes no state), so compare
        # everything but the refusal counters
        assert _without_refusals(_state(rebuilt)) == _without_refusals(live)
    else:
        assert _state(rebuilt) == live
    later = svc.read(lambda e: e.tick(12.0))
    again = rebuilt.tick(12.0)
    if downlink == "exact":
        assert later.committed is not None and again.committed is not None
        assert later.committed.participants == again.committed.participants == AGENTS
        assert svc.read(_state) == _state(rebuilt)
    else:
        assert later.outbound == again.outbound
        assert _without_refusals(svc.read(_state)) == _without_refusals(_state(rebuilt))


def _without_refusals(state: tuple[Any, ...]) -> tuple[Any, ...]:
    """:func:`_state` without the refusal counters (each agent's downlink account kept)."""
    return (*state[:6], [row[:2] for row in state[6]], *state[8:])


def _profile(name: str) -> Any:
    from edge_agent.links.catalog import resolve_profile

    return resolve_profile(name)


#: a duty-cycled uplink: a LoRaWAN SF7 update owes minutes of silence at 1 %
LORA = "lorawan_eu868_dr5_sf7"
#: no duty cycle: always due
FAST = "ble5_2m_dle_notify"


def test_a_job_at_its_members_cadence_recovers_exactly_after_a_crash(tmp_path: Path) -> None:
    """EF21, cadence on: the LoRaWAN member is silent after its update, so the next versions
    close with the fast members alone (its state counting); the process dies while its
    silence runs. The rebuilt engine holds the same uplink free-at times and excuses the
    same member, and both close the next versions the same way, the member awaited again
    once its radio is free."""
    rng = np.random.default_rng(11)
    ef21: Semantics = "ef21"
    profiles = {"a": LORA, "b": FAST, "c": FAST}
    clock = _Clock()
    svc, settings = _service(tmp_path / "data", clock, feedback="ef21", cadence=True,
                             downlink_pacing=False, quorum_min_agents=3)  # fmt: skip
    hellos = [_hello(a, p, ef21) for a, p in profiles.items()]
    _drive(svc, clock, [
        (1.0, hellos),
        (300.0, [_update(a, 0, rng, ef21) for a in profiles]),  # everyone's radio is free
        (301.0, [_update(a, 1, rng, ef21) for a in ("b", "c")]),  # "a" is silent
        (302.0, [_update(a, 2, rng, ef21) for a in ("b", "c")]),
    ])  # fmt: skip
    live = svc.read(_state)
    assert live[0] == 3, "two versions closed without the silent member"
    free = svc.read(lambda e: e.cadence.up_free_at("a"))
    assert free > 310.0
    rebuilt = _crash_and_recover(svc, settings, tmp_path / "data")
    assert _state(rebuilt) == live
    assert rebuilt.counted(303.0).awaited == svc.read(lambda e: e.counted(303.0).awaited)
    late = [_update(a, 3, rng, ef21) for a in ("b", "c")]
    mine = _update("a", 3, rng, ef21, seq=1)

    def rest(eng: RoundEngine) -> list[tuple[str, ...] | None]:
        """The fast members report when the silence is over: the round waits for "a"."""
        out = []
        for msg, now in ((late[0], free + 1.0), (late[1], free + 1.0), (mine, free + 2.0)):
            done = eng.handle(msg.topic, msg.payload, now).committed
            out.append(None if done is None else tuple(sorted(done.participants)))
        return out

    assert svc.read(rest) == rest(rebuilt) == [None, None, ("a", "b", "c")]
    assert svc.read(_state) == _state(rebuilt)
