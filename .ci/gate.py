"""Size and complexity gate, run by ``make lint``: exit 1 naming every offender.

A function (method, closure) may have a cyclomatic complexity of at most ``MAX_CC``
(as ``radon cc`` counts it) and a module at most ``MAX_LINES`` physical lines. Past those
limits a reader can no longer hold a function or a file in their head; split by concept.

Usage: ``python .ci/gate.py edge_agent aggregator`` (directories are searched for *.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from radon.complexity import cc_visit
from radon.visitors import Class, Function

MAX_CC = 20
MAX_LINES = 700


def _functions(blocks: Iterable[Any]) -> Iterator[Any]:
    """Every function block, including methods, closures and methods of inner classes.

    radon does not add a closure's complexity to its parent's, so closures are checked
    on their own rather than hidden."""
    for b in blocks:
        if isinstance(b, Function):
            yield b
            yield from _functions(b.closures)
        elif isinstance(b, Class):
            yield from _functions(b.methods)
            yield from _functions(b.inner_classes)


def offenders(path: Path) -> list[str]:
    """One line per violation in the module at ``path``."""
    source = path.read_text(encoding="utf-8")
    out = []
    n_lines = len(source.splitlines())
    if n_lines > MAX_LINES:
        out.append(f"{path}: {n_lines} lines > {MAX_LINES}; split the module by concept")
    # radon lists a method both on its own and under its class: report it once
    funcs = {(f.lineno, f.col_offset): f for f in _functions(cc_visit(source))}
    for f in funcs.values():
        if f.complexity > MAX_CC:
            out.append(
                f"{path}:{f.lineno}: {f.fullname} has complexity {f.complexity} > {MAX_CC}; "
                "split it into named steps"
            )
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: gate.py PATH [PATH ...]", file=sys.stderr)
        return 2
    files: list[Path] = []
    for arg in argv:
        p = Path(arg)
        if not p.exists():
            print(f"gate.py: {p} does not exist", file=sys.stderr)
            return 2
        files.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    found = [line for f in files for line in offenders(f)]
    for line in found:
        print(line)
    print(
        f"gate: {len(files)} modules, {len(found)} over the limits "
        f"(complexity <= {MAX_CC}, lines <= {MAX_LINES})"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
