"""The device path stays light: no service or heavy scientific stacks at run time."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = (
    "fastapi",
    "uvicorn",
    "starlette",
    "scipy",
    "sklearn",
    "aggregator",
    "matplotlib",
    "prometheus_client",
)


def test_agent_runtime_imports_no_service_or_scipy_modules() -> None:
    code = (
        "import sys\n"
        "import edge_agent, edge_agent.agent.loop, edge_agent.cli.commands, edge_agent.links.calibrate\n"
        "import edge_agent.transports.mqtt, edge_agent.transports.zmq\n"
        "from edge_agent.cli.commands import build_parser; build_parser()\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == ""


def test_the_check_would_catch_a_forbidden_import() -> None:
    code = (
        "import sys, edge_agent, json\n"
        "import aggregator\n"
        "print(any(m.split('.')[0] == 'aggregator' for m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "True"
