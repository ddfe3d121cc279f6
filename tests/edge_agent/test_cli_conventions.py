"""Both command lines follow the conventions a user expects (issue 12, findings 1, 3, 7, 9
and 10): --version, help without "(default: None)", defaults that converge and meet,
exit 2 on a configuration error (and the systemd units stop restarting on it), every
imported module declared, and an install hint instead of a traceback without the extras."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions, version
from pathlib import Path

import numpy as np
import pytest

from aggregator import cli as agg_cli
from edge_agent.cli import commands as cli
from edge_agent.data import make_rcv1_like, write_libsvm

ROOT = Path(__file__).resolve().parents[2]


def _helps(parser: argparse.ArgumentParser) -> list[str]:
    """The help text of a parser and of every subcommand below it."""
    out = [parser.format_help()]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out.extend(_helps(sub))
    return out


def _agg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aggregator")
    sub = parser.add_subparsers(dest="command")
    agg_cli._serve_parser(sub)
    return parser


@pytest.mark.parametrize("main", [cli.main, agg_cli.main], ids=["edge-agent", "aggregator"])
def test_version(main: object, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])  # type: ignore[operator]
    assert done.value.code == 0
    assert capsys.readouterr().out.split()[-1] == version("cat-edge")


def test_help_texts_show_defaults_without_none_noise() -> None:
    texts = _helps(cli.build_parser()) + _helps(_agg_parser())
    assert len(texts) >= 8
    for text in texts:
        flat = " ".join(text.split())
        assert "(default: None)" not in flat and "default: False" not in flat
        assert flat.count("(default: the host name)") <= 1
        assert "(default: the host name) (default" not in flat
    serve = " ".join(_helps(_agg_parser())[1].split())
    assert "[env AGG_JOB; default cat]" in serve
    assert "--mode {sync,async}" in serve and "[env AGG_D; required]" in serve
    assert "--log-level {critical,error,warning,info,debug}" in serve
    assert "[env AGG_LOG_LEVEL; default info]" in serve


def test_agent_defaults_converge_and_meet_the_aggregator(tmp_path: Path) -> None:
    from aggregator.service.settings import Settings

    data = tmp_path / "shard.svm"
    write_libsvm(make_rcv1_like(20, 30, rng=np.random.default_rng(0)), data)
    args = cli.build_parser().parse_args(
        [
            "run",
            "--profile",
            "wifi_rpi4_mqtt_tls13",
            "--data",
            str(data),
            "--server",
            "memory://conventions",
            "--agent-id",
            "a",
        ]
    )
    agent = cli._build_agent(args)
    assert agent.config.feedback == "ef21"  # the mode that converges with many agents
    assert agent.config.job == Settings.model_fields["job"].default == "cat"
    agent.transport.close()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--profile", "no_such_profile"], "unknown cost profile"),
        (["--data", "/nonexistent/shard.svm"], "/nonexistent/shard.svm"),
        (["--server", "mqtt://127.0.0.1:1", "--password-file", "/nonexistent/pw"], "password"),
        (["--server", "http://127.0.0.1:1"], "unknown transport scheme 'http'"),
    ],
    ids=["profile", "data", "password-file", "url-scheme"],
)
def test_configuration_errors_of_run_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    data = tmp_path / "shard.svm"
    write_libsvm(make_rcv1_like(20, 30, rng=np.random.default_rng(0)), data)
    argv = ["run", "--profile", "wifi_rpi4_mqtt_tls13", "--data", str(data), *extra]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("edge-agent run: error:") and needle in err[0]


@pytest.mark.parametrize("unit", sorted((ROOT / "deploy" / "systemd").glob("*.service")))
def test_systemd_units_do_not_restart_a_configuration_error(unit: Path) -> None:
    lines = [ln.strip() for ln in unit.read_text().splitlines()]
    assert "Restart=on-failure" in lines
    assert "RestartPreventExitStatus=2" in lines


def _imported_modules(package: Path) -> set[str]:
    names: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"edge_agent", "aggregator", "__future__"}


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def test_every_imported_module_is_declared_in_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in ("aggregator", "plot", "signing"):
        reqs += project["optional-dependencies"][extra]
    declared = {_norm(r.split(">")[0].split("=")[0].split("[")[0].strip()) for r in reqs}
    dists = packages_distributions()
    imported = _imported_modules(ROOT / "edge_agent") | _imported_modules(ROOT / "aggregator")
    assert {"numpy", "dotenv", "fastapi"} <= imported
    undeclared = {
        m: dists.get(m) for m in imported if not {_norm(d) for d in dists.get(m, [m])} & declared
    }
    assert undeclared == {}


def test_aggregator_help_works_without_the_service_extras() -> None:
    """A device install: none of the aggregator extras importable."""
    blocked = ", ".join(repr(m) for m in agg_cli.SERVICE_MODULES)
    code = (
        "import sys, importlib.util\n"
        f"blocked = {{{blocked}}}\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n in blocked else real(n, *a)\n"
        "for m in blocked: sys.modules[m] = None\n"
        "from aggregator.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT,
            timeout=60,
        )  # fmt: skip

    helped = run("--help")
    assert helped.returncode == 0, helped.stderr
    assert "serve" in helped.stdout and "cat-edge[aggregator]" in helped.stdout
    served = run("serve", "--d", "5")
    assert served.returncode == 2
    [line] = served.stderr.strip().splitlines()
    assert "pip install 'cat-edge[aggregator]'" in line and "Traceback" not in served.stderr
