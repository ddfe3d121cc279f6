"""No member holds the job: one LoRaWAN member and two fast members, a real aggregator
(uvicorn) and real ``edge-agent run`` processes with the default duty cycle (``wait``) over
ZeroMQ on loopback. The fast members' versions keep advancing while the LoRaWAN member
waits for its duty cycle, and the LoRaWAN member's updates are still accepted (its EF21
state counts in every step) and enter the versions its radio allows.

Speed: a copy of ``lorawan_eu868_dr5_sf7`` with every airtime scaled so that a 200 B message
owes about :data:`SILENCE_S` seconds of silence at the same duty cycle (1 % per sub-band); the aggregator
(``AGG_CADENCE=true``, set here: it is opt-in) knows that silence from the profile and the airtime of what
it accepted, and its rounds have a 1 s deadline, so the member is not waited for while it
is silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import (
    AggregatorProcess,
    Fleet,
    aggregator_settings,
    make_problem,
    scaled_profile,
    wait_until,
)

from aggregator.localnet import HOST, free_port_pair
from edge_agent.links.catalog import PROFILES_DIR_ENV, resolve_profile, save_profile

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: the silence the scaled LoRaWAN profile owes after a 200 B message
SILENCE_S = 3.0
LORA = "lora-0"
FAST = {"ble-0": "ble5_2m_dle_notify", "wifi-0": "wifi_esp32_mqtt_tcp"}


def _profiles_dir(root: Path) -> tuple[Path, str]:
    """A profiles directory with the fast members' shipped profiles and the scaled
    LoRaWAN one; returns it and the scaled profile's name."""
    root.mkdir()
    for name in FAST.values():
        save_profile(resolve_profile(name), root / f"{name}.json")
    base = "lorawan_eu868_dr5_sf7"
    # the silence of its duty cycle (the copy, as on a private network, has no fair-use cap)
    scale = scaled_profile(base, base, 1.0).message_cost(200).silence_s / SILENCE_S
    profile = scaled_profile(base, f"{base}_scaled", scale)
    assert profile.duty_cycle == 0.01
    assert profile.message_cost(200).silence_s == pytest.approx(SILENCE_S)
    save_profile(profile, root / f"{profile.name}.json")
    return root, profile.name


def test_fast_members_advance_while_the_lorawan_member_waits_for_its_duty_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profiles, lora_profile = _profiles_dir(tmp_path / "profiles")
    monkeypatch.setenv(PROFILES_DIR_ENV, str(profiles))  # the aggregator's and the agents'
    problem = make_problem(tmp_path / "data", rows=600, features=200, agents=3)
    job = "cadence"
    server = f"zmq+tcp://{HOST}:{free_port_pair()}"
    settings = aggregator_settings(
        problem, job=job, server=server, data_dir=tmp_path / "agg", round_deadline_s=1.0,
        quorum_min_agents=2, max_rounds=5000, cadence="true",
    )  # fmt: skip
    members = {LORA: lora_profile, **FAST}
    agg = AggregatorProcess(tmp_path, settings)
    fleet = Fleet(tmp_path)
    try:
        agg.start()
        for i, (agent_id, profile) in enumerate(members.items()):
            fleet.start_agent(server=server, job=job, index=i, shard=problem.shards[i],
                              features=problem.features, feedback="ef21", resend_s=10.0,
                              agent_id=agent_id, profile=profile, duty_cycle="wait")  # fmt: skip

        def lora_accepted() -> int:
            agents = {a["agent"]: a for a in agg.get("/agents")}
            return int(agents.get(LORA, {}).get("updates_accepted", 0))

        def diagnose() -> str:
            return fleet.diagnose() + agg.diagnose()

        wait_until(lambda: lora_accepted() >= 4, 90.0, "four LoRaWAN updates", diagnose=diagnose)
        fleet.check_running()
        history = agg.history()
        agents = {a["agent"]: a for a in agg.get("/agents")}
    finally:
        fleet.close()
        agg.close()

    summary = [(r["version"], r["reason"], round(r["latency_s"], 2), sorted(r["agents"]))
               for r in history[:40]]  # fmt: skip
    lora = agents[LORA]
    accepted = int(lora["updates_accepted"])
    # its updates were accepted, none refused: each EF21 change enters its h_i, which
    # counts in every step, fresh or not (most arrive while a later version is open)
    assert accepted >= 4 and lora["messages_rejected"] == 0 and not lora["needs_reset"]
    in_rounds = [r for r in history if LORA in r["agents"]]
    assert len(in_rounds) >= accepted - 1, summary
    # the fast members' versions advanced while the LoRaWAN member waited for its duty
    # cycle: many versions per LoRaWAN update, each closing as soon as the members that
    # are due had reported (not at the deadline)
    assert len(history) >= 5 * accepted, summary
    early = [r for r in history if r["reason"] == "all_reported"]
    assert len(early) >= 0.9 * len(history), summary
    assert all(set(FAST) <= set(r["participants"]) for r in early), summary
