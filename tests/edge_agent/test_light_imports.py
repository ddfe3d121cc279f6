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


def _stdout(code: str) -> str:
    """What a fresh interpreter prints running ``code`` (stripped)."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.strip()


def test_agent_runtime_imports_no_service_or_scipy_modules() -> None:
    code = (
        "import sys\n"
        "import edge_agent, edge_agent.agent.loop, edge_agent.cli.commands, edge_agent.links.calibrate\n"
        "import edge_agent.transports.mqtt, edge_agent.transports.zmq\n"
        "from edge_agent.cli.commands import build_parser; build_parser()\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    assert _stdout(code) == ""


def test_the_check_would_catch_a_forbidden_import() -> None:
    code = (
        "import sys, edge_agent, json\n"
        "import aggregator\n"
        "print(any(m.split('.')[0] == 'aggregator' for m in sys.modules))\n"
    )
    assert _stdout(code) == "True"


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    return set(_stdout(f"{code}\nimport sys\nprint(','.join(sorted(sys.modules)))").split(","))


def test_importing_the_package_loads_no_numerics_and_no_pydantic() -> None:
    # edge_agent/__init__.py resolves its public names on first use (PEP 562)
    loaded = _modules_after("import edge_agent")
    assert sorted(m for m in loaded if m.split(".")[0] in ("numpy", "pydantic")) == []
    assert "edge_agent.links.profiles" not in loaded


def test_the_public_api_still_resolves_every_name() -> None:
    code = (
        "import edge_agent as ea\n"
        "missing = [n for n in ea.__all__ if getattr(ea, n, None) is None]\n"
        "print(','.join(missing))\n"
    )
    assert _stdout(code) == ""


def test_the_cli_parser_loads_no_pydantic() -> None:
    loaded = _modules_after("from edge_agent.cli.commands import build_parser; build_parser()")
    assert sorted(m for m in loaded if m.split(".")[0] == "pydantic") == []


RUN_PATH_LAZY = (
    "edge_agent.links.calibrate",
    "edge_agent.links.profile_fit",
    "edge_agent.transports.mqtt",
    "paho",
)


def test_the_zmq_run_path_skips_calibration_fitting_and_mqtt() -> None:
    loaded = _modules_after(
        "import edge_agent.cli.commands, edge_agent.agent.loop, edge_agent.data\n"
        "import edge_agent.transports.zmq\n"
        "from edge_agent.links.profiles import resolve_profile\n"
        "resolve_profile('lorawan_eu868_dr5_sf7')"
    )
    assert sorted(m for m in loaded if m.split(".")[0] == "paho" or m in RUN_PATH_LAZY) == []


def test_profile_models_build_their_validators_only_when_used() -> None:
    code = (
        "from edge_agent.links.profiles import PacketProfile, resolve_profile\n"
        "before = PacketProfile.__pydantic_complete__\n"
        "resolve_profile('lorawan_eu868_dr5_sf7')\n"
        "print(before)\n"
    )
    assert _stdout(code) == "False"
