"""The README's commands and its Library use snippet, run as written outside the checkout.

Builds the wheel from a copy of the sources (the project venv's setuptools, no network),
installs it with ``--no-deps`` into a fresh venv in a temporary directory, and lets that venv
see the project venv's site-packages through a ``.pth`` line (numpy, paho, pyzmq... come
from there, offline). The installed ``edge_agent`` wins over that path (site-packages comes
first), which the first test asserts: nothing below imports the checkout. Every command runs
with a temporary directory as its working directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: what the wheel is built from (pyproject.toml's packages, data files and readme)
SOURCES = ("pyproject.toml", "README.md", "edge_agent", "aggregator", "cost_profiles")


@dataclass(frozen=True)
class Installed:
    venv: Path
    cwd: Path  # a temporary working directory, not the checkout

    def run(self, *argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.pop("CAT_EDGE_PROFILES_DIR", None)
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.run(
            list(argv), cwd=self.cwd, env=env, capture_output=True, text=True, timeout=timeout
        )

    def script(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def _build_wheel(out: Path, scratch: Path) -> Path:
    src = scratch / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--no-index",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("cat_edge-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(root / "dist", root)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # The dependencies from the project venv: one path line, no editable finders run.
    (Path(purelib) / "project-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    cwd = root / "elsewhere"
    cwd.mkdir()
    yield Installed(venv, cwd)


def test_the_installed_wheel_is_what_runs(installed: Installed) -> None:
    done = installed.run(
        installed.script("python"),
        "-c",
        "import aggregator, edge_agent, edge_agent.links.catalog, numpy; "
        "print(edge_agent.__file__); "
        "print(aggregator.__file__); print(edge_agent.links.catalog.default_profiles_dir())",
    )
    assert done.returncode == 0, done.stderr
    edge_file, agg_file, profiles_dir = done.stdout.split()
    venv = str(installed.venv)
    assert edge_file.startswith(venv) and agg_file.startswith(venv), done.stdout
    assert Path(profiles_dir) == installed.venv / "share" / "cat-edge" / "cost_profiles"
    assert (Path(profiles_dir) / "lorawan_eu868_dr5_sf7.json").is_file()


def test_readme_commands_run_outside_the_checkout(installed: Installed) -> None:
    listed = installed.run(installed.script("edge-agent"), "profiles")
    assert listed.returncode == 0, listed.stderr
    shipped = sorted(p.stem for p in (REPO / "cost_profiles").glob("*.json"))
    assert all(name in listed.stdout for name in shipped), listed.stdout
    helped = installed.run(installed.script("edge-agent"), "run", "--help")
    assert helped.returncode == 0 and "--profile" in helped.stdout, helped.stderr
    made = installed.run(
        installed.script("edge-agent"),
        *("data", "generate", "--rows", "200", "--features", "300", "--shards", "2"),
        *("--out", "shards", "--full"),
    )
    assert made.returncode == 0, made.stderr
    assert (installed.cwd / "shards" / "shard-000.svm").is_file()


def test_run_with_a_bare_profile_name_starts_and_fails_cleanly(installed: Installed) -> None:
    """No broker at the URL: the profile and data resolve (the start line is logged), then
    one line naming the broker, exit 1 (an outage, not a configuration error), no traceback."""
    if not (installed.cwd / "shards" / "shard-001.svm").is_file():
        installed.run(
            installed.script("edge-agent"),
            *("data", "generate", "--rows", "200", "--features", "300", "--shards", "2"),
            *("--out", "shards"),
        )
    done = installed.run(
        installed.script("edge-agent"),
        *("run", "--profile", "lorawan_eu868_dr5_sf7", "--data", "shards/shard-001.svm"),
        *("--features", "300", "--server", "mqtt://127.0.0.1:9?timeout_s=1", "--agent-id", "a1"),
        timeout=30,
    )
    assert done.returncode == 1, done.stderr
    assert "on lorawan_eu868_dr5_sf7" in done.stderr
    assert "cannot connect to MQTT broker at mqtt://127.0.0.1:9" in done.stderr
    assert "Traceback" not in done.stderr
    wrong = installed.run(
        installed.script("edge-agent"),
        *("run", "--profile", "cost_profiles/lorawan_eu868_dr5_sf7.json"),
        *("--data", "shards/shard-001.svm", "--server", "mqtt://127.0.0.1:9?timeout_s=1"),
        timeout=30,
    )
    assert wrong.returncode == 2, wrong.stderr
    assert "--profile lorawan_eu868_dr5_sf7" in wrong.stderr  # the hint to the bare name


def test_readme_library_snippet_runs_as_written(installed: Installed) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    match = re.search(r"## Library use\n\n```python\n(.*?)```", readme, re.S)
    assert match is not None, "README.md has no Library use python block"
    snippet = installed.cwd / "snippet.py"
    snippet.write_text(match.group(1) + "\nprint('snippet ok', t, len(blob))\n")
    done = installed.run(installed.script("python"), str(snippet))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("snippet ok")
    by_name = installed.run(
        installed.script("python"),
        "-c",
        "import edge_agent as ea; print(ea.load_profile('ble5_2m_dle_notify').name)",
    )
    assert by_name.stdout.strip() == "ble5_2m_dle_notify", by_name.stderr


def test_aggregator_simulate_on_a_tiny_problem(installed: Installed) -> None:
    done = installed.run(
        installed.script("aggregator"),
        *("simulate", "--rows", "200", "--features", "300", "--agents", "2"),
        *("--profiles", "lorawan_eu868_dr5_sf7,ble5_2m_dle_notify"),
        *("--methods", "dense,cat-topk+ef21", "--max-rounds", "20"),
    )
    assert done.returncode == 0, done.stderr
    assert "cat-topk+ef21" in done.stdout and "dense" in done.stdout, done.stdout
