"""Sites: a site broker bridged to the central broker, proven with real processes.

Two real Mosquitto brokers on 127.0.0.1, each from its shipped file with only listener
ports, file paths, the bridge's address and its password rewritten: the central one from
``deploy/mosquitto/mosquitto.conf`` (ACL: the shipped ``deploy/mosquitto/acl`` with its
``bridge-site-a`` block), the site one from ``deploy/mosquitto/site.conf`` (the same ACL
file; its bridge reaches the central TLS listener, verified against the test CA). One
aggregator (real uvicorn) on the central loopback listener; three ``edge-agent run``
processes with the README's flags over TLS, one on the central broker and two on the site
broker, unchanged (they do not know a bridge is there).

Checked: every update applied once (the aggregator's accepted count == the updates the
agents sent minus the counted refusals, re-sends refused as ``duplicate`` aside; no agent
twice in a version), the agents' final models equal the aggregator's bit for bit, and a
restart of the site broker in the middle of the job is survived: versions with the site's
agents in them keep committing afterwards. While the site is away the centre's agent
trains alone (the site's agents went offline), so the job is ended by the operator's
stop command rather than a round count.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_helpers import (
    AgentProcess,
    AggregatorProcess,
    Fleet,
    Problem,
    aggregator_settings,
    assert_models_identical,
    make_problem,
    running,
    wait_finished,
    wait_until,
)

from aggregator.localnet import HOST, MissingProgram, MosquittoBroker, find_program, service_env
from edge_agent.protocol import topics
from edge_agent.transports import open_transport

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.scaling]

REPO_ROOT = Path(__file__).resolve().parents[2]
MOSQUITTO = REPO_ROOT / "deploy" / "mosquitto"
CENTRAL_CONF, SITE_CONF = MOSQUITTO / "mosquitto.conf", MOSQUITTO / "site.conf"
SHIPPED_ACL = MOSQUITTO / "acl"
ADD_AGENT = MOSQUITTO / "add-agent.sh"
MAKE_TEST_CA = REPO_ROOT / "deploy" / "tls" / "make-test-ca.sh"
TLS_PORT, LOOPBACK_PORT = 8883, 1883
SITE = "site-a"
JOB = "sites"
#: (agent id, broker): one agent straight on the centre, two behind the site's bridge
AGENTS = (("hq-01", "central"), ("site-a-01", "site"), ("site-a-02", "site"))
PROFILE = "wifi_esp32_mqtt_tcp"
RESTART_AT = 10  # the site broker restarts once a later version has the site's agents
TOKEN = "site-bridge-test-token-0123456789"
GRACE_S = 1.0
SHARED_ROUNDS = 20


@dataclass(frozen=True)
class Sites:
    central: MosquittoBroker
    site: MosquittoBroker
    tls_dir: Path
    secrets: Path

    def diagnose(self) -> str:
        return (
            f"central broker log:\n{self.central.log_tail(15)}\n"
            f"site broker log:\n{self.site.log_tail(15)}"
        )


def _check(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, f"{cmd[:3]} failed: {result.stderr}"


def _add(passwd: Path, secret: Path, *args: str) -> None:
    """deploy/mosquitto/add-agent.sh: one user in ``passwd``, its password in ``secret``."""
    _check(["bash", str(ADD_AGENT), "-f", str(passwd), "-o", str(secret), *args])


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[Sites]:
    try:
        find_program("mosquitto")
        find_program("mosquitto_passwd")
    except MissingProgram as exc:
        pytest.skip(f"{exc}; the test needs mosquitto and openssl")
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found; install it (apt-get install openssl)")
    tls_dir, secrets = tmp_path / "tls", tmp_path / "secrets"
    secrets.mkdir()
    _check(["bash", str(MAKE_TEST_CA), str(tls_dir)])
    central_pw, site_pw = tmp_path / "central.passwd", tmp_path / "site.passwd"
    _add(central_pw, secrets / "aggregator", "--aggregator")
    _add(central_pw, secrets / f"bridge-{SITE}", "--bridge", SITE)
    for agent, where in AGENTS:
        _add(central_pw if where == "central" else site_pw, secrets / agent, agent)
    tls = {
        "acl_file": SHIPPED_ACL,  # the shipped file itself, on both ends
        "cafile": tls_dir / "ca.crt",
        "certfile": tls_dir / "server.crt",
        "keyfile": tls_dir / "server.key",
    }
    for name in ("central", "site"):
        (tmp_path / name / "persistence").mkdir(parents=True)
    central = MosquittoBroker(
        tmp_path / "central",
        config_file=CENTRAL_CONF,
        paths={**tls, "password_file": central_pw,
               "persistence_location": Path(f"{tmp_path / 'central' / 'persistence'}/")},
    )  # fmt: skip
    bridge_password = (secrets / f"bridge-{SITE}").read_text().strip()
    site = MosquittoBroker(
        tmp_path / "site",
        config_file=SITE_CONF,
        paths={**tls, "password_file": site_pw, "bridge_cafile": tls_dir / "ca.crt",
               "persistence_location": Path(f"{tmp_path / 'site' / 'persistence'}/")},
        values={"address": f"{HOST}:{central.ports[TLS_PORT]}",
                "remote_password": bridge_password},
    )  # fmt: skip
    with central, site:
        yield Sites(central, site, tls_dir, secrets)


def _start_agent(
    fleet: Fleet, problem: Problem, index: int, server: str, secrets: Path, *tls: str
) -> AgentProcess:
    """``edge-agent run`` as the README shows it: agent ``AGENTS[index]`` on ``server``
    with its own user name and password (and ``tls``: the --ca-file for mqtts://)."""
    agent_id = AGENTS[index][0]
    model_path = fleet.workdir / f"{agent_id}.npy"
    out_path, err_path = fleet.workdir / f"{agent_id}.out", fleet.workdir / f"{agent_id}.err"
    cmd = [
        sys.executable, "-m", "edge_agent.cli", "run", "--server", server,
        "--job", JOB, "--agent-id", agent_id, "--profile", PROFILE,
        "--data", str(problem.shards[index]), "--features", str(problem.features),
        "--username", agent_id, "--password-file", str(secrets / agent_id), *tls,
        "--seed", str(index), "--resend-s", "3", "--save-model", str(model_path), "--quiet",
    ]  # fmt: skip
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(cmd, env=service_env({}), stdout=out, stderr=err)
    agent = AgentProcess(agent_id, PROFILE, proc, out_path, err_path, model_path)
    fleet.agents.append(agent)
    return agent


def _assert_applied_once(agg: AggregatorProcess, fleet: Fleet) -> None:
    """Every update the agents sent was accepted or refused with a counted reason (their
    re-sends refused as ``duplicate`` aside), no agent is twice in a version, and an
    accepted update either entered its round's step (it is in that version's
    participants) or, late, only its sender's EF21 state (sync mode): never both."""
    status = agg.status()
    n = status["model_version"]
    sent = {a.agent_id: int(a.summary()["updates"]) for a in fleet.agents}
    refused = dict(status["updates_rejected"])
    refused.pop("duplicate", None)  # re-sends of an update already taken, not updates
    assert status["updates_accepted"] == sum(sent.values()) - sum(refused.values()), (
        f"sent {sent}, status {status}"
    )
    rows = agg.history()
    assert [r["version"] for r in rows] == list(range(1, n + 1))
    for row in rows:
        assert len(set(row["participants"])) == len(row["participants"]), row
    accepted = {a["agent"]: a["updates_accepted"] for a in agg.get("/agents")}
    assert sorted(accepted) == sorted(sent)
    for agent, count in accepted.items():
        assert sum(agent in r["participants"] for r in rows) <= count, agent


def _active(path: Path) -> list[list[str]]:
    return [ln.split() for ln in path.read_text().splitlines() if ln.strip() and ln[0] != "#"]


def test_the_bridge_carries_the_job_topics_and_the_central_acl_lets_it() -> None:
    """site.conf bridges exactly the namespace's kinds (agent kinds out, the aggregator's
    in, QoS 1), and the shipped ACL gives the bridge's user those rights, no more."""
    out = {f"cat/+/{kind}/+" for kind in topics.AGENT_KINDS}
    into = {f"cat/+/{kind}" for kind in topics.JOB_KINDS} | {f"cat/+/{topics.TO_AGENT}/+"}
    bridged = [w[1:] for w in _active(SITE_CONF) if w[0] == "topic"]
    assert sorted(bridged) == sorted(
        [[t, "out", "1"] for t in out] + [[t, "in", "1"] for t in into]
    )
    acl = _active(SHIPPED_ACL)
    start = acl.index(["user", f"bridge-{SITE}"])
    block = acl[start + 1 :]
    assert all(w[0] == "topic" for w in block), "the bridge's block must be the file's last"
    assert sorted(block) == sorted(
        [["topic", "write", t] for t in out] + [["topic", "read", t] for t in into]
    )


def _site_agents_in_a_version_after(agg: AggregatorProcess, version: int) -> bool:
    """Whether a version committed after ``version`` has both site agents in it."""
    site = {a for a, where in AGENTS if where == "site"}
    return any(r["version"] > version and site <= set(r["participants"]) for r in agg.history())


def test_agents_behind_a_site_bridge_train_with_the_centre_through_a_site_restart(
    sites: Sites, tmp_path: Path
) -> None:
    started = time.monotonic()
    problem = make_problem(tmp_path / "data", agents=len(AGENTS))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    settings = aggregator_settings(
        problem,
        job=JOB,
        server=f"mqtt://{HOST}:{sites.central.ports[LOOPBACK_PORT]}",
        data_dir=tmp_path / "agg",
        mqtt_username="aggregator",
        mqtt_password_file=sites.secrets / "aggregator",
        api_token_file=token_file,
    )
    agg = AggregatorProcess(tmp_path, settings)
    fleet = Fleet(tmp_path)
    with running(agg, fleet):
        agg.start()
        ca = ("--ca-file", str(sites.tls_dir / "ca.crt"))
        for i, (_, where) in enumerate(AGENTS):
            broker = sites.central if where == "central" else sites.site
            url = f"mqtts://{HOST}:{broker.ports[TLS_PORT]}"
            _start_agent(fleet, problem, i, url, sites.secrets, *ca)
        diagnose = lambda: f"{agg.diagnose()}\n{fleet.diagnose()}\n{sites.diagnose()}"  # noqa: E731
        # the site's agents reach the aggregator only through the bridge
        wait_until(lambda: _site_agents_in_a_version_after(agg, RESTART_AT), 30,
                   f"a version after {RESTART_AT} with the site's agents", diagnose=diagnose)  # fmt: skip
        sites.site.stop()
        before = agg.status()["model_version"]
        time.sleep(1.0)  # the site's agents and the bridge see it gone
        sites.site.start()
        wait_until(lambda: _site_agents_in_a_version_after(agg, before + 2), 30,
                   "the site's agents back after the site broker's restart", diagnose=diagnose)  # fmt: skip
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert agg.http.post("/control/stop", headers=auth).json()["applied"] is True
        wait_finished(agg, fleet, timeout_s=20)
        fleet.wait(timeout_s=20)
        time.sleep(GRACE_S)  # anything still queued on a bridge reaches the aggregator

        _assert_applied_once(agg, fleet)
        assert_models_identical(agg, fleet)
    assert time.monotonic() - started < 60


# --------------------------------------------------------------------------- shared subscriptions


@pytest.fixture
def plain_broker(tmp_path: Path) -> Iterator[tuple[MosquittoBroker, Path]]:
    """A private Mosquitto with passwords and the shipped ACL; (broker, secrets dir)."""
    try:
        find_program("mosquitto_passwd")
        broker = MosquittoBroker(tmp_path / "broker", password_file=tmp_path / "passwd",
                                 acl_file=SHIPPED_ACL)  # fmt: skip
    except MissingProgram as exc:
        pytest.skip(str(exc))
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    _add(tmp_path / "passwd", secrets / "aggregator", "--aggregator")
    for agent, _ in AGENTS:
        _add(tmp_path / "passwd", secrets / agent, agent)
    with broker:
        yield broker, secrets


def test_a_share_group_splits_the_agents_topics_between_its_members(
    plain_broker: tuple[MosquittoBroker, Path],
) -> None:
    """Through ``?share=``: each message reaches exactly one member of the group, with its
    own topic name, under the aggregator's unchanged ACL."""
    broker, secrets = plain_broker
    creds = {"username": "aggregator", "password_file": str(secrets / "aggregator"),
             "clean_session": True, "timeout_s": 5.0}  # fmt: skip
    members = [
        open_transport(f"{broker.url}?share=aggs", role="aggregator", client_id=f"agg-{i}", **creds)
        for i in range(2)
    ]
    agent = AGENTS[0][0]
    sender = open_transport(broker.url, role="agent", client_id=agent, username=agent,
                            password_file=str(secrets / agent), timeout_s=5.0)  # fmt: skip
    count = 20
    try:
        for m in members:
            m.connect()
            for pattern in topics.agent_inbound(JOB):
                m.subscribe(pattern)
        sender.connect()
        for i in range(count):
            sender.publish(topics.update(JOB, agent), bytes([i]))
        got: list[list[bytes]] = [[], []]
        deadline = time.monotonic() + 10
        while sum(map(len, got)) < count and time.monotonic() < deadline:
            for i, m in enumerate(members):
                if (msg := m.recv(0.05)) is not None:
                    assert msg.topic == topics.update(JOB, agent)
                    got[i].append(msg.payload)
        for i, m in enumerate(members):  # nothing more comes: each message went to one
            while (msg := m.recv(0.3)) is not None:
                got[i].append(msg.payload)
        assert sorted(got[0] + got[1]) == [bytes([i]) for i in range(count)], broker.log_tail()
        assert got[0] and got[1], "one member took everything: not a shared subscription"
    finally:
        sender.close()
        for m in members:
            m.close()


def test_the_aggregator_through_a_share_group_applies_every_update_once(
    plain_broker: tuple[MosquittoBroker, Path], tmp_path: Path
) -> None:
    broker, secrets = plain_broker
    problem = make_problem(tmp_path / "data", agents=len(AGENTS))
    settings = aggregator_settings(
        problem,
        job=JOB,
        server=f"{broker.url}?share=aggregators",
        data_dir=tmp_path / "agg",
        max_rounds=SHARED_ROUNDS,
        mqtt_username="aggregator",
        mqtt_password_file=secrets / "aggregator",
    )
    agg = AggregatorProcess(tmp_path, settings)
    fleet = Fleet(tmp_path)
    with running(agg, fleet):
        agg.start()
        for i in range(len(AGENTS)):
            _start_agent(fleet, problem, i, broker.url, secrets)
        status = wait_finished(agg, fleet, timeout_s=40)
        fleet.wait(timeout_s=20)
        assert status["model_version"] == SHARED_ROUNDS
        _assert_applied_once(agg, fleet)
        assert_models_identical(agg, fleet)
