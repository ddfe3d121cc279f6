"""The simulator stands apart: no web dependency on its path, the service never imports it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import aggregator

WEB = ("fastapi", "uvicorn", "starlette", "prometheus_client", "pydantic_settings")
TINY = ["--rows", "120", "--features", "80", "--max-rounds", "20", "--methods", "dense,cat-topk"]
PACKAGE = Path(aggregator.__file__).parent

# Run in a fresh interpreter where importing any of `blocked` fails as if not installed.
PROLOGUE = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # import raises ModuleNotFoundError
from aggregator.cli import main
code = main({argv!r})
loaded = sorted(m for m in sys.modules if sys.modules[m] is not None
                and (m.split('.')[0] in {blocked!r} or m.startswith('aggregator.')))
print('LOADED=' + ','.join(loaded))
sys.exit(code)
"""


def _run(argv: list[str], blocked: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    code = PROLOGUE.format(blocked=blocked, argv=argv)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_simulate_runs_without_the_web_dependencies_or_matplotlib(tmp_path: Path) -> None:
    out = tmp_path / "records.json"
    proc = _run(["simulate", *TINY, "--no-progress", "--json", str(out)], (*WEB, "matplotlib"))
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())
    assert [r["method"] for r in records] == ["dense"] * 3 + ["cat-topk"] * 3
    loaded = proc.stdout.rsplit("LOADED=", 1)[1].strip().split(",")
    assert "aggregator.sim.cli" in loaded
    service = {"aggregator.service.settings", "aggregator.web.app", "aggregator.service.ingest",
               "aggregator.service.store", "aggregator.web.metrics", "aggregator.web.schemas"}  # fmt: skip
    assert not service & set(loaded), loaded


def test_plot_without_matplotlib_says_how_to_install_it_before_any_work(
    tmp_path: Path,
) -> None:
    proc = _run(
        ["simulate", *TINY, "--no-progress", "--plot", str(tmp_path / "p.png")], ("matplotlib",)
    )
    assert proc.returncode == 2
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 1 and "pip install" in errors[0] and "matplotlib" in errors[0]
    # no work done: the problem line (printed once f* is solved) never appeared
    assert not proc.stdout.startswith("#") and "# rcv1-like" not in proc.stdout
    assert not (tmp_path / "p.png").exists()


def _imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_service_module_imports_the_simulator() -> None:
    """Every aggregator module but the simulator itself and the console script."""
    checked = [
        p
        for p in PACKAGE.rglob("*.py")
        if PACKAGE / "sim" not in p.parents and p != PACKAGE / "cli.py"
    ]
    assert {p.stem for p in checked} >= {"app", "ingest", "store", "settings", "rounds"}
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(
            n for n in _imports_of(p) if n == "aggregator.sim" or n.startswith("aggregator.sim.")
        )
        for p in checked
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_import_scan_sees_a_simulator_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from aggregator.sim.harness import FleetHarness\nimport aggregator.sim\n")
    assert {"aggregator.sim.harness", "aggregator.sim"} <= _imports_of(probe)
