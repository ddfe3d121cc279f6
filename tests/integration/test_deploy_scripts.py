"""The deploy scripts' exit statuses and the file modes make-test-ca.sh leaves.

Usage errors exit 2 (as argparse and the CLIs do), other failures 1; the TLS key a system
Mosquitto reads after dropping root must be readable by its group.
"""

from __future__ import annotations

import grp
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ADD_AGENT = DEPLOY / "mosquitto" / "add-agent.sh"
MAKE_TEST_CA = DEPLOY / "tls" / "make-test-ca.sh"


def _run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("script", "args"),
    [
        (ADD_AGENT, ["--bogus"]),
        (ADD_AGENT, []),
        (ADD_AGENT, ["not/an id"]),
        (ADD_AGENT, ["aggregator"]),
        (ADD_AGENT, ["-o"]),
        (MAKE_TEST_CA, []),
        (MAKE_TEST_CA, ["--days", "zero", "out"]),
        (MAKE_TEST_CA, ["--bogus", "out"]),
        (MAKE_TEST_CA, ["--group", "no-such-group-cat-edge", "out"]),
    ],
)
def test_usage_error_exits_2(script: Path, args: list[str]) -> None:
    result = _run(script, *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(script.name + ":")


@pytest.mark.parametrize("script", [ADD_AGENT, MAKE_TEST_CA])
def test_help_exits_0_and_documents_the_statuses(script: Path) -> None:
    result = _run(script, "--help")
    assert result.returncode == 0
    assert "2 a usage error" in result.stdout


def test_group_makes_the_server_key_readable_by_the_brokers_group(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found")
    group = grp.getgrgid(os.getgid()).gr_name  # a group this user may hand files to
    out = tmp_path / "tls"
    result = _run(MAKE_TEST_CA, "--group", group, str(out))
    assert result.returncode == 0, result.stderr
    key, ca_key = (out / "server.key").stat(), (out / "ca.key").stat()
    assert stat.S_IMODE(key.st_mode) == 0o640 and key.st_gid == os.getgid()
    assert stat.S_IMODE(out.stat().st_mode) == 0o750
    assert stat.S_IMODE(ca_key.st_mode) == 0o600  # the broker never needs the CA key
