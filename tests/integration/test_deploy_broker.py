"""The shipped broker deployment, proven against a real Mosquitto.

The broker runs ``deploy/mosquitto/mosquitto.conf`` with only the listener ports (free ports
on 127.0.0.1), the file paths (temporary copies, certificates from
``deploy/tls/make-test-ca.sh``) and the process user rewritten; ``acl_file`` points at the
shipped ``deploy/mosquitto/acl`` itself, unmodified. Users are made with
``deploy/mosquitto/add-agent.sh`` and ``mosquitto_passwd``; clients are the product's own
``MqttTransport``: agents on the TLS listener, the aggregator on the loopback listener, as in
the systemd deployment.

Mosquitto acknowledges and silently drops an ACL-denied publish from an MQTT v3.1.1 client,
so "not delivered" is proven against a canary: a permitted message that the broker routes
after the forbidden one and that *is* received. One broker serves the whole module; every
test uses its own job id.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from aggregator.localnet import HOST, MissingProgram, MosquittoBroker, find_program, tail
from edge_agent.errors import TransportError
from edge_agent.protocol import topics, wire
from edge_agent.transports import Message, Transport, open_transport

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
SHIPPED_CONF = DEPLOY / "mosquitto" / "mosquitto.conf"
SHIPPED_ACL = DEPLOY / "mosquitto" / "acl"
ADD_AGENT = DEPLOY / "mosquitto" / "add-agent.sh"
MAKE_TEST_CA = DEPLOY / "tls" / "make-test-ca.sh"
OPENSSL = shutil.which("openssl")

#: Shipped listener lines (the test moves each to a free port on 127.0.0.1).
TLS_LISTENER = "listener 8883"
LOOPBACK_LISTENER = "listener 1883 127.0.0.1"
TLS_PORT, LOOPBACK_PORT = 8883, 1883

AGENTS = ("pi-01", "pi-02")
CONNECT_TIMEOUT_S = 5.0
CANARY_TIMEOUT_S = 5.0
#: Extra wait after the canary: anything still in flight would have arrived before it anyway.
GRACE_S = 0.3


@dataclass(frozen=True)
class DeployedBroker:
    tls_port: int
    plain_port: int
    tls_dir: Path
    secrets: Path
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)


def _run(cmd: list[str], *, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30, check=False)


def _check(cmd: list[str], *, stdin: str | None = None) -> None:
    result = _run(cmd, stdin=stdin)
    assert result.returncode == 0, f"{cmd[0]} failed: {result.stderr}"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeployedBroker]:
    try:
        mosquitto_passwd = find_program("mosquitto_passwd")
        find_program("mosquitto")
    except MissingProgram as exc:
        pytest.skip(f"{exc}; the test needs mosquitto and openssl")
    if OPENSSL is None:
        pytest.skip("openssl not found; install mosquitto and openssl")
    base = tmp_path_factory.mktemp("deploy-broker")
    tls_dir, secrets = base / "tls", base / "secrets"
    secrets.mkdir()
    _check(["bash", str(MAKE_TEST_CA), "--client", "pi-01", str(tls_dir)])

    passwd = base / "passwd"
    _check(["bash", str(ADD_AGENT), "-f", str(passwd), "--aggregator",
            "-o", str(secrets / "aggregator")])  # fmt: skip
    _check(["bash", str(ADD_AGENT), "-f", str(passwd), "-o", str(secrets / "pi-01"), "pi-01"])
    # pi-02 the plain way, as docs/operating.md shows for a hand-picked password.
    (secrets / "pi-02").write_text("pi-02-test-password\n", encoding="utf-8")
    _check([mosquitto_passwd, str(passwd), "pi-02"], stdin="pi-02-test-password\n" * 2)

    persistence = base / "persistence"
    persistence.mkdir()
    # The shipped config with only the listener ports (free ones on 127.0.0.1) and the
    # paths rewritten; the shared renderer fails unless each path option is there once.
    server = MosquittoBroker(
        base,
        config_file=SHIPPED_CONF,
        paths={
            "password_file": passwd,
            "acl_file": SHIPPED_ACL,  # the shipped file itself, never a copy
            "cafile": tls_dir / "ca.crt",
            "certfile": tls_dir / "server.crt",
            "keyfile": tls_dir / "server.key",
            "persistence_location": Path(f"{persistence}/"),
        },
    )
    assert list(server.ports) == [TLS_PORT, LOOPBACK_PORT], f"{SHIPPED_CONF}: {server.ports}"
    with server:
        yield DeployedBroker(
            server.ports[TLS_PORT], server.ports[LOOPBACK_PORT], tls_dir, secrets, server.log_path
        )


@pytest.fixture
def job() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def _agent(broker: DeployedBroker, agent: str, job: str, **options: object) -> Transport:
    """An agent as deployed: mqtts:// to the TLS listener, trusting the test CA."""
    opts: dict[str, object] = {
        "username": agent,
        "password_file": str(broker.secrets / agent),
        "ca_file": str(broker.tls_dir / "ca.crt"),
        "timeout_s": CONNECT_TIMEOUT_S,
        "close_timeout_s": 2.0,
        "clean_session": True,
        **options,
    }
    opts = {k: v for k, v in opts.items() if v is not None}
    url = f"mqtts://{HOST}:{broker.tls_port}"
    return open_transport(url, role="agent", client_id=f"cat-{job}-{agent}", **opts)


def _aggregator(broker: DeployedBroker, job: str) -> Transport:
    """The aggregator as deployed by systemd: mqtt:// on the loopback listener."""
    return open_transport(
        f"mqtt://{HOST}:{broker.plain_port}",
        role="aggregator",
        client_id=f"aggregator-{job}",
        username="aggregator",
        password_file=str(broker.secrets / "aggregator"),
        timeout_s=CONNECT_TIMEOUT_S,
        close_timeout_s=2.0,
        clean_session=True,
    )


def _until_canary(t: Transport, canary: str, broker: DeployedBroker) -> list[Message]:
    """Every message received up to and including the first on topic ``canary`` (plus what
    arrives in a short grace period after it); fails if the canary never comes."""
    got: list[Message] = []
    deadline = time.monotonic() + CANARY_TIMEOUT_S
    while not any(m.topic == canary for m in got):
        left = deadline - time.monotonic()
        assert left > 0, (
            f"canary {canary} never arrived (got {[m.topic for m in got]}); the test would be "
            f"vacuous.\n{broker.log_tail()}"
        )
        if (m := t.recv(left)) is not None:
            got.append(m)
    while (m := t.recv(GRACE_S)) is not None:
        got.append(m)
    return got


def _assert_refused(t: Transport, match: str) -> None:
    try:
        with pytest.raises(TransportError, match=match):
            t.connect()
    finally:
        t.close()


# --------------------------------------------------------------------------- static


def test_shipped_config_exposes_only_tls_and_loopback() -> None:
    lines = [ln.strip() for ln in SHIPPED_CONF.read_text(encoding="utf-8").splitlines()]
    active = [ln for ln in lines if ln and not ln.startswith("#")]
    assert [ln for ln in active if ln.startswith("listener ")] == [TLS_LISTENER, LOOPBACK_LISTENER]
    assert "allow_anonymous false" in active
    assert "persistence true" in active
    tls_block = active[active.index(TLS_LISTENER) : active.index(LOOPBACK_LISTENER)]
    assert {ln.split()[0] for ln in tls_block} >= {"cafile", "certfile", "keyfile"}
    # A float64 snapshot of d = 47,236 (~378 KB) must fit with room to spare.
    size_limit = int(next(ln.split()[1] for ln in active if ln.startswith("max_packet_size ")))
    assert size_limit >= 2 * 47_236 * 8


def test_make_test_ca_refuses_to_write_into_the_repository() -> None:
    if OPENSSL is None:
        pytest.skip("openssl not found")
    target = DEPLOY / "tls" / f"never-{uuid.uuid4().hex[:8]}"
    result = _run(["bash", str(MAKE_TEST_CA), str(target)])
    assert result.returncode == 1
    assert "refusing to write keys inside the repository" in result.stderr
    assert not target.exists()


def test_add_agent_refuses_reserved_and_invalid_ids(tmp_path: Path) -> None:
    for bad in ("aggregator", "pi/01", "pi+", ""):
        result = _run(["bash", str(ADD_AGENT), "-f", str(tmp_path / "pw"),
                       "-o", str(tmp_path / "s"), bad])  # fmt: skip
        assert result.returncode == 2, bad  # a usage error
    assert not (tmp_path / "pw").exists()
    assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------------- ACL


def test_agent_publishes_its_own_topics_to_the_aggregator(broker: DeployedBroker, job: str) -> None:
    own = [getattr(topics, kind)(job, "pi-01") for kind in topics.AGENT_KINDS]
    with _aggregator(broker, job) as agg, _agent(broker, "pi-01", job) as agent:
        for pattern in topics.agent_inbound(job):
            agg.subscribe(pattern)
        for i, topic in enumerate(own):
            agent.publish(topic, bytes([i]) * 100)
        got = _until_canary(agg, own[-1], broker)
    assert got == [Message(topic, bytes([i]) * 100) for i, topic in enumerate(own)]


def test_agent_cannot_publish_as_another_agent(broker: DeployedBroker, job: str) -> None:
    forged = [getattr(topics, kind)(job, "pi-02") for kind in topics.AGENT_KINDS]
    canary = topics.update(job, "pi-01")
    with _aggregator(broker, job) as agg, _agent(broker, "pi-01", job) as agent:
        for pattern in topics.agent_inbound(job):
            agg.subscribe(pattern)
        for topic in forged:
            agent.publish(topic, b"forged")
        agent.publish(canary, b"genuine")  # same connection: routed after the forgeries
        got = _until_canary(agg, canary, broker)
    assert got == [Message(canary, b"genuine")]


def test_agent_cannot_publish_model_delta_or_control(broker: DeployedBroker, job: str) -> None:
    canary = topics.control(job)
    with _aggregator(broker, job) as agg, _agent(broker, "pi-02", job) as victim:
        for pattern in topics.agent_subscriptions(job):
            victim.subscribe(pattern)
        with _agent(broker, "pi-01", job) as attacker:
            attacker.publish(topics.model(job), b"forged snapshot", retain=True)
            attacker.publish(topics.delta(job), b"forged delta")
            attacker.publish(topics.control(job), b'{"cmd": "stop"}')
        # close() waited for every PUBACK: the broker had routed (or dropped) the forgeries
        # before the aggregator's canary below was even sent.
        assert attacker.stats.dropped == 0
        agg.publish(canary, b'{"cmd": "pause"}')
        got = _until_canary(victim, canary, broker)
    assert got == [Message(canary, b'{"cmd": "pause"}')]


def test_agent_cannot_read_other_agents_updates(broker: DeployedBroker, job: str) -> None:
    update = topics.update(job, "pi-01")
    canary = topics.control(job)
    with _aggregator(broker, job) as agg, _agent(broker, "pi-02", job) as snoop:
        for pattern in topics.agent_inbound(job):
            agg.subscribe(pattern)
        snoop.subscribe(canary)
        for pattern in (f"cat/{job}/update/+", f"cat/{job}/#", "#"):
            # Refused in the SUBACK (TransportError) is as good as receiving nothing.
            with contextlib.suppress(TransportError):
                snoop.subscribe(pattern)
        with _agent(broker, "pi-01", job) as agent:
            agent.publish(update, b"private gradient")
        assert _until_canary(agg, update, broker)[0] == Message(update, b"private gradient")
        agg.publish(canary, b'{"cmd": "resume"}')
        got = _until_canary(snoop, canary, broker)
    assert [m.topic for m in got] == [canary]


def test_retained_dense_snapshot_reaches_a_late_agent(broker: DeployedBroker, job: str) -> None:
    x = np.linspace(-1.0, 1.0, 47_236)  # float64: the largest message a job of d=47,236 sends
    snapshot = wire.encode_snapshot(x, job=job, version=7)
    assert len(snapshot) > 47_236 * 8
    with _aggregator(broker, job) as agg:
        agg.publish(topics.model(job), snapshot, retain=True)
    with _agent(broker, "pi-02", job) as agent:
        agent.subscribe(topics.model(job))
        got = agent.recv(CANARY_TIMEOUT_S)
    assert got == Message(topics.model(job), snapshot), broker.log_tail()


_DOOMED_AGENT = """
import sys, time
from edge_agent.transports import open_transport
url, job, password_file, ca_file, will_agent = sys.argv[1:]
t = open_transport(url, role="agent", client_id="cat-" + job + "-pi-01", username="pi-01",
                   password_file=password_file, ca_file=ca_file, timeout_s=5,
                   clean_session=True)
t.set_will("cat/" + job + "/status/" + will_agent, b'{"state": "offline"}')
try:
    t.connect()
except Exception as exc:  # a broker may refuse a forbidden will at CONNECT
    print("refused:", exc, flush=True)
    raise SystemExit(0)
print("ready", flush=True)
time.sleep(60)
"""


def _run_doomed_agent(broker: DeployedBroker, job: str, will_agent: str) -> str:
    """Run an agent process (user pi-01) with a Last Will naming ``will_agent`` and SIGKILL
    it once connected; return its first output line: "ready" or "refused: <reason>"."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    args = [f"mqtts://{HOST}:{broker.tls_port}", job, str(broker.secrets / "pi-01"),
            str(broker.tls_dir / "ca.crt"), will_agent]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", _DOOMED_AGENT, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
    finally:
        proc.kill()  # no DISCONNECT: the broker must publish the will
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    return line


def test_last_will_is_allowed_on_the_agents_own_status(broker: DeployedBroker, job: str) -> None:
    with _aggregator(broker, job) as agg:
        agg.subscribe(f"cat/{job}/status/+")
        assert _run_doomed_agent(broker, job, "pi-01") == "ready"
        got = agg.recv(CANARY_TIMEOUT_S)
    assert got == Message(topics.status(job, "pi-01"), b'{"state": "offline"}'), broker.log_tail()


def test_last_will_naming_another_agent_is_never_published(
    broker: DeployedBroker, job: str
) -> None:
    with _aggregator(broker, job) as agg:
        agg.subscribe(f"cat/{job}/status/+")
        # Mosquitto 2.0 accepts the CONNECT and drops the will when it fires; a broker that
        # refuses the CONNECT instead is just as good. Anything else (a crash) is not.
        outcome = _run_doomed_agent(broker, job, "pi-02")
        assert outcome == "ready" or outcome.startswith("refused:"), outcome
        with _agent(broker, "pi-01", job) as agent:
            agent.publish(topics.status(job, "pi-01"), b'{"state": "online"}')
        got = _until_canary(agg, topics.status(job, "pi-01"), broker)
    assert got == [Message(topics.status(job, "pi-01"), b'{"state": "online"}')]


# --------------------------------------------------------------------------- authentication


@pytest.mark.parametrize("listener", ["tls", "loopback"])
def test_anonymous_connection_is_refused(broker: DeployedBroker, job: str, listener: str) -> None:
    if listener == "tls":
        url = f"mqtts://{HOST}:{broker.tls_port}?ca_file={broker.tls_dir / 'ca.crt'}"
    else:
        url = f"mqtt://{HOST}:{broker.plain_port}"
    t = open_transport(url, role="agent", client_id="anon", timeout_s=CONNECT_TIMEOUT_S)
    _assert_refused(t, "refused")


def test_wrong_password_is_refused(broker: DeployedBroker, job: str, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n", encoding="utf-8")
    _assert_refused(_agent(broker, "pi-01", job, password_file=str(wrong)), "refused")


# --------------------------------------------------------------------------- TLS


def test_test_ca_signs_server_and_client_certificates(broker: DeployedBroker) -> None:
    assert OPENSSL is not None
    ca = str(broker.tls_dir / "ca.crt")
    for cert in ("server.crt", "client-pi-01.crt"):
        _check([OPENSSL, "verify", "-CAfile", ca, str(broker.tls_dir / cert)])
    text = _run([OPENSSL, "x509", "-noout", "-text", "-in", str(broker.tls_dir / "server.crt")])
    assert "DNS:localhost" in text.stdout
    assert "IP Address:127.0.0.1" in text.stdout
    for key in broker.tls_dir.glob("*.key"):
        assert key.stat().st_mode & 0o007 == 0, f"{key} is readable by others"
        if key.name != "server.key":  # only the broker's key may be its group's (--group)
            assert key.stat().st_mode & 0o077 == 0, f"{key} is readable by its group"


def test_tls_listener_accepts_an_agent_trusting_the_test_ca(
    broker: DeployedBroker, job: str
) -> None:
    # The host name 127.0.0.1 is checked against the certificate's IP SAN.
    with _agent(broker, "pi-01", job) as t:
        assert t.connected


def test_tls_listener_refuses_plain_mqtt(broker: DeployedBroker, job: str) -> None:
    t = open_transport(
        f"mqtt://{HOST}:{broker.tls_port}",
        role="agent",
        client_id="plain",
        username="pi-01",
        password_file=str(broker.secrets / "pi-01"),
        timeout_s=2.0,
    )
    _assert_refused(t, "no CONNACK")


def test_tls_listener_refuses_a_client_that_does_not_trust_the_ca(
    broker: DeployedBroker, job: str
) -> None:
    _assert_refused(_agent(broker, "pi-01", job, ca_file=None), "TLS handshake")
