"""The layering rules of docs/architecture.md, as `make lint` checks them: the
import-linter contracts of pyproject.toml on a copy of the tree with one forbidden import
added, .ci/imports.py on small package trees, and the engine's imports at run time."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
IMPORTS_PY = ROOT / ".ci" / "imports.py"


def _lint_imports(tree: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """lint-imports with the repository's contracts on the packages under ``tree``."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(tree / "pyproject.toml"), *extra],
        cwd=tree,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """The two packages and pyproject.toml, copied."""
    if not LINT_IMPORTS.exists():
        pytest.skip("lint-imports is not installed (pip install -e '.[dev]')")
    ignore = shutil.ignore_patterns("__pycache__", "static")
    for pkg in ("edge_agent", "aggregator"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_contracts_hold_on_the_tree_as_it_is(tree_copy: Path) -> None:
    out = _lint_imports(tree_copy)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("edge_agent/links/cost.py", "import aggregator.engine", "one-way"),
        ("aggregator/engine/registry.py", "import aggregator.sim", "pure-engine"),
        ("aggregator/engine/dedupe.py", "import time", "pure-engine"),
        ("aggregator/engine/dedupe.py", "import edge_agent.transports.url", "pure-engine"),
        ("edge_agent/numerics/robust.py", "import zmq", "pure-core"),
        ("edge_agent/protocol/topics.py", "import socket", "pure-core"),
        ("edge_agent/protocol/topics.py", "import edge_agent.cli", "pure-core"),
        ("aggregator/web/deps.py", "import aggregator.localnet", "no-dev-helpers"),
        ("aggregator/service/store.py", "import aggregator.sim.harness", "no-dev-helpers"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tree_copy: Path, module: str, line: str, contract: str
) -> None:
    path = tree_copy / module
    # an import inside a function counts as much as one at the top
    path.write_text(path.read_text() + f"\n\ndef _probe() -> None:\n    {line}\n")
    out = _lint_imports(tree_copy, "--contract", contract)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "0 kept, 1 broken" in out.stdout
    assert f"{module.removesuffix('.py').replace('/', '.')} ->" in out.stdout


def test_the_engine_loads_no_transport_at_run_time() -> None:
    """Importing the engine loads no transport, service, web or simulator module."""
    code = (
        "import sys\n"
        "import aggregator.engine.rounds\n"
        "bad = ('edge_agent.transports', 'edge_agent.agent.loop', 'paho', 'zmq', 'sqlite3',\n"
        "       'fastapi', 'uvicorn', 'aggregator.service', 'aggregator.web', 'aggregator.sim',\n"
        "       'aggregator.localnet')\n"
        "print(sorted(m for m in sys.modules if any(m == b or m.startswith(b + '.') "
        "for b in bad)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def _package(root: Path, files: dict[str, str]) -> Path:
    """A package ``pkg`` under ``root`` with the given modules (name -> source)."""
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""A package."""\n')
    for name, source in files.items():
        (pkg / f"{name}.py").write_text(textwrap.dedent(source))
    return pkg


def _imports(pkg: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(IMPORTS_PY), *extra, str(pkg)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_cycle_through_type_checking_and_a_function_is_found(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "a": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from pkg.b import B
            """,
            "b": """
                def f() -> None:
                    from . import a
            """,
            "c": "import pkg.a\n",
        },
    )
    out = _imports(pkg)
    assert out.returncode == 1
    assert "NEW cycle: pkg.a -> pkg.b" in out.stdout
    assert "NEW cycle: pkg.b -> pkg.a" in out.stdout
    assert "pkg.c" not in out.stdout  # on the way in, not on the cycle
    assert "1 import cycle(s) over 2 edge(s)" in out.stdout


PRIVATE = {
    "owner": """
        _LIMIT = 3

        def _helper() -> None: ...

        class Engine:
            __slots__ = ("_slot",)

            def __init__(self) -> None:
                self._state = 0

            def _hook(self) -> None: ...

            def same(self, other: "Engine") -> int:
                return other._state + self._state
    """,
    "user": """
        from collections import namedtuple

        from pkg import owner
        from pkg.owner import Engine, _LIMIT

        def step(eng: Engine) -> int:
            owner._helper()
            return eng._state

        class Child(Engine):
            def _hook(self) -> None:
                super()._hook()
                print(self._slot, self._state)  # what it inherits: fine

        P = namedtuple("P", "x")
        p = P(1)._replace(x=2)
    """,
}


def test_private_names_of_another_module_are_found(tmp_path: Path) -> None:
    out = _imports(_package(tmp_path, PRIVATE))
    new = sorted(ln for ln in out.stdout.splitlines() if ln.startswith("NEW"))
    assert new == [
        "NEW private: pkg.user imports pkg.owner._LIMIT",
        "NEW private: pkg.user uses <object>._state",
        "NEW private: pkg.user uses pkg.owner._helper",
    ]
    assert out.returncode == 1


def test_the_baseline_passes_known_offenders_and_says_which_are_fixed(tmp_path: Path) -> None:
    pkg = _package(tmp_path, PRIVATE)
    baseline = tmp_path / "baseline.txt"
    assert _imports(pkg, "--baseline", str(baseline), "--write-baseline").returncode == 0
    (pkg / "user.py").write_text((pkg / "user.py").read_text().replace(", _LIMIT", ""))
    out = _imports(pkg, "--baseline", str(baseline))
    assert out.returncode == 0, out.stdout
    assert "fixed (delete from the baseline): private: pkg.user imports pkg.owner._LIMIT" in (
        out.stdout
    )
    assert "baseline: 2 entr(ies) remain, 1 fixed" in out.stdout
    (pkg / "more.py").write_text("from pkg.owner import _helper\n")
    again = _imports(pkg, "--baseline", str(baseline))
    assert again.returncode == 1
    assert "NEW private: pkg.more imports pkg.owner._helper" in again.stdout


ARCHITECTURE_PY = ROOT / ".ci" / "architecture.py"


def _architecture(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ARCHITECTURE_PY), *args], capture_output=True, text=True, timeout=60
    )


def test_the_module_table_is_rebuilt_and_a_stale_one_fails_the_check(tmp_path: Path) -> None:
    pkg = _package(tmp_path, {"codec": '"""The codec. More here."""\n'})
    doc = tmp_path / "doc.md"
    begin, end = _architecture_markers()
    doc.write_text(f"# Doc\n\n{begin}\n| stale |\n{end}\n\nafter\n")
    assert _architecture("--check", str(doc), str(pkg)).returncode == 1
    assert _architecture(str(doc), str(pkg)).returncode == 0
    text = doc.read_text()
    assert "| **`pkg/`** | A package. |\n| `pkg/codec.py` | The codec. |" in text
    assert text.endswith(f"{end}\n\nafter\n") and "stale" not in text
    assert _architecture("--check", str(doc), str(pkg)).returncode == 0
    (pkg / "wire.py").write_text('"""The wire."""\n')
    assert _architecture("--check", str(doc), str(pkg)).returncode == 1


def test_a_module_without_a_docstring_is_named(tmp_path: Path) -> None:
    pkg = _package(tmp_path, {"bare": "X = 1\n"})
    doc = tmp_path / "doc.md"
    begin, end = _architecture_markers()
    doc.write_text(f"{begin}\n{end}\n")
    out = _architecture("--check", str(doc), str(pkg))
    assert out.returncode == 1
    assert "bare.py: no module docstring" in out.stderr


def _architecture_markers() -> tuple[str, str]:
    """The two marker lines, as the repository's doc has them."""
    lines = (ROOT / "docs" / "architecture.md").read_text().splitlines()
    begin = next(ln for ln in lines if ln.startswith("<!-- modules: generated"))
    return begin, "<!-- end of modules -->"
