"""``--help`` shows every default, the module entry points work, and the agent's id check.

The help test walks the parser (argparse's own action list: there is no public one) and
checks, for every option that has a default, that its help block says ``default``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from aggregator.sim.cli import build_parser as simulate_parser
from edge_agent.cli.commands import build_parser, main


def _parsers(
    parser: argparse.ArgumentParser, path: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def _block(help_text: str, option: str) -> str:
    """The lines of ``help_text`` that describe ``option`` (its line and the indented rest)."""
    lines = help_text.splitlines()
    pattern = re.compile(rf"^\s+(?:-\S+ .*?, )?{re.escape(option)}\b")
    for i, line in enumerate(lines):
        if pattern.match(line):
            rest = [ln for ln in lines[i + 1 :]]
            end = next((j for j, ln in enumerate(rest) if re.match(r"^\s{0,4}\S", ln)), len(rest))
            return "\n".join([line, *rest[:end]])
    raise AssertionError(f"{option} not in the help:\n{help_text}")


def _options_with_defaults(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if not action.option_strings or action.default in (None, argparse.SUPPRESS):
            continue
        if action.default is False or isinstance(
            action,
            argparse._HelpAction | argparse._VersionAction,
        ):
            continue
        yield action


PARSERS = [*_parsers(build_parser(), "edge-agent"), ("aggregator simulate", simulate_parser())]


@pytest.mark.parametrize(("path", "parser"), PARSERS, ids=[p for p, _ in PARSERS])
def test_help_shows_every_default(path: str, parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()
    missing = [
        action.option_strings[-1]
        for action in _options_with_defaults(parser)
        if "default" not in _block(text, action.option_strings[-1])
    ]
    assert not missing, f"{path} --help omits the default of {missing}"


def test_serve_help_shows_every_settings_default() -> None:
    pytest.importorskip("pydantic_settings")
    from aggregator.service.settings import Settings

    text = subprocess.run(
        [sys.executable, "-m", "aggregator", "serve", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    missing = []
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if flag not in text or field.is_required():
            continue
        has_default = field.get_default(call_default_factory=True) is not None
        if has_default and "default" not in _block(text, flag):
            missing.append(flag)
    assert not missing, f"aggregator serve --help omits the default of {missing}"


@pytest.mark.parametrize("module", ["edge_agent", "aggregator"])
def test_python_dash_m_help_exits_0(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")


def test_agent_id_that_differs_from_username_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["run", "--profile", "lorawan_eu868_dr5_sf7", "--data", "missing.svm",
            "--server", "mqtt://127.0.0.1:1", "--username", "pi-01", "--agent-id", "pi-02"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--agent-id 'pi-02' differs from --username 'pi-01'" in err
    assert "--agent-id pi-01" in err  # the fix


def test_agent_id_check_is_for_mqtt_only(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--profile", "lorawan_eu868_dr5_sf7", "--data", "missing.svm",
            "--server", "zmq+tcp://127.0.0.1:1", "--username", "pi-01", "--agent-id", "pi-02"]  # fmt: skip
    main(argv)
    err = capsys.readouterr().err
    assert "missing.svm" in err and "differs from --username" not in err
