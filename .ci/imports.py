"""Import cycles and private-name use, run by ``make lint``: exit 1 on any offender that
is not in the baseline.

Two rules the import-linter contracts ([tool.importlinter] in pyproject.toml) cannot say:

* **No import cycles** between the modules of the packages given, counting every import:
  at module level, under ``if TYPE_CHECKING:`` and inside functions. A module that needs
  another only for an annotation still depends on it; a cycle means two modules are one
  concept cut in two, or a type lives in the wrong one. ``import a.b`` and
  ``from a.b import c`` are edges to ``a.b`` (to ``a.b.c`` when that is a module), never to
  the parent packages they load on the way. Every edge that lies on a cycle is reported
  (``cycle: a -> b``) with the way back from ``b`` to ``a``.
* **No use of another module's _private names** (one leading underscore, not a dunder):
  ``from m import _x`` and ``import m._x``; ``name._x`` where ``name`` was bound by an
  import (a module or anything taken from one); and ``expr._x`` on any other object
  unless some class of the accessing module itself defines ``_x`` (a method, a class-level
  assignment or annotation, a ``__slots__`` entry, or an ``<obj>._x = ...`` inside the
  class). So ``self._x`` and ``other._x`` within the class that owns ``_x`` are fine, while
  ``eng._guard`` in a module of free functions that take the engine is not: those
  functions are methods in the wrong file. ``ALLOWED`` lists the deliberate exceptions.

The baseline file lists known offenders, one per line (``#`` starts a comment); they are
reported but do not fail the run, and the count of entries left is printed so it can be
emptied as they are fixed. ``--write-baseline`` rewrites it with today's offenders.

Usage: ``python .ci/imports.py [--baseline FILE] [--write-baseline] edge_agent aggregator``
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: (accessing module, private attribute): exceptions, each with its reason.
ALLOWED: dict[tuple[str, str], str] = {
    # paho has no public call to drop one queued message; MqttTransport._drop_oversized
    # takes the one the broker keeps disconnecting on out of paho's queue under paho's lock.
    ("edge_agent.transports.mqtt", "_out_message_mutex"): "paho's queue lock",
    ("edge_agent.transports.mqtt", "_out_messages"): "paho's outgoing queue",
    # a standby's take-over runs in a thread after uvicorn serves: a failed one must end the
    # process with the start-up exit code (2 or 1), which only os._exit does from a thread.
    ("aggregator.web.startup", "_exit"): "the stdlib's exit from a thread",
}

#: Public API despite the underscore: the documented methods of ``typing.NamedTuple``
#: and ``collections.namedtuple`` (named so to stay clear of field names).
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})


def is_private(name: str) -> bool:
    """One leading underscore (or a mangled ``__x``), not a dunder and not ``_`` alone."""
    return name.startswith("_") and name != "_" and not name.endswith("__")


@dataclass(frozen=True)
class Finding:
    """One offender: ``key`` is its baseline line, ``where`` its places in the code."""

    key: str
    where: tuple[str, ...]


@dataclass
class Module:
    """One parsed module: its name, file, tree and whether it is a package's ``__init__``."""

    name: str
    path: Path
    tree: ast.Module
    is_package: bool

    @property
    def package(self) -> str:
        """The package relative imports start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


def load_modules(roots: Iterable[Path]) -> dict[str, Module]:
    """Every module under each root directory (a top-level package), by dotted name."""
    modules: dict[str, Module] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root.parent).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            name = ".".join(parts)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            modules[name] = Module(name, path, tree, is_package)
    return modules


def resolve_from(mod: Module, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` statement names."""
    if not node.level:
        return node.module or ""
    base = mod.package.split(".")
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def import_targets(mod: Module, known: set[str]) -> Iterator[tuple[str, int]]:
    """(module, line) of every import of ``mod`` anywhere in its tree, internal or not."""
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = resolve_from(mod, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in known else base), node.lineno


def import_graph(modules: dict[str, Module]) -> dict[str, dict[str, int]]:
    """module -> {imported internal module: first line}, self-imports left out."""
    known = set(modules)
    graph: dict[str, dict[str, int]] = {}
    for name, mod in modules.items():
        edges: dict[str, int] = {}
        for target, line in import_targets(mod, known):
            if target in known and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """Tarjan's components with more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp: set[str] = set()
                    member = ""
                    while member != node:
                        member = stack.pop()
                        on_stack.discard(member)
                        comp.add(member)
                    if len(comp) > 1:
                        found.append(comp)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def path_back(graph: dict[str, dict[str, int]], start: str, goal: str) -> list[str]:
    """The shortest import path from ``start`` to ``goal`` (both ends included)."""
    came: dict[str, str] = {start: start}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        if node == goal:
            break
        for nxt in sorted(graph[node]):
            if nxt not in came:
                came[nxt] = node
                todo.append(nxt)
    path = [goal]
    while path[-1] != start:
        path.append(came[path[-1]])
    return path[::-1]


def cycle_findings(modules: dict[str, Module]) -> tuple[list[Finding], int]:
    """Every import edge that lies on a cycle, and the number of cyclic groups."""
    graph = import_graph(modules)
    groups = strongly_connected(graph)
    out: list[Finding] = []
    for comp in groups:
        for a in sorted(comp):
            for b, line in sorted(graph[a].items()):
                if b in comp:
                    back = " -> ".join(path_back(graph, b, a))
                    where = f"{modules[a].path}:{line}: imports {b}; back: {back}"
                    out.append(Finding(f"cycle: {a} -> {b}", (where,)))
    return out, len(groups)


def class_private_attrs(cls: ast.ClassDef) -> set[str]:
    """The private attribute names one class defines (nested classes included)."""
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in targets):
                names.update(_strings(node.value))
    return {n for n in names if is_private(n)}


def _strings(node: ast.expr | None) -> Iterator[str]:
    """The string constants of a ``__slots__`` value."""
    for sub in ast.walk(node) if node is not None else ():
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            yield sub.value


def imported_names(mod: Module) -> dict[str, str]:
    """Local name -> what it was imported as (dotted), for every import in the module."""
    bound: dict[str, str] = {}
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = resolve_from(mod, node)
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    return bound


def dotted(node: ast.expr, bound: dict[str, str]) -> str | None:
    """``a.b.c`` rooted at an imported name, resolved to what it was imported as."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        base = dotted(node.value, bound)
        return f"{base}.{node.attr}" if base is not None else None
    return None


@dataclass
class _Collected:
    """Findings of one module, by key, each with its places."""

    places: dict[str, list[str]] = field(default_factory=dict)

    def add(self, key: str, where: str) -> None:
        self.places.setdefault(key, []).append(where)


def private_imports(mod: Module, out: _Collected) -> None:
    """``from m import _x`` and ``import m._x`` of anything but the module itself."""
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.ImportFrom):
            base = resolve_from(mod, node)
            for alias in node.names:
                if is_private(alias.name) and base != mod.name:
                    out.add(f"private: {mod.name} imports {base}.{alias.name}", _at(mod, node))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(is_private(p) for p in alias.name.split(".")):
                    out.add(f"private: {mod.name} imports {alias.name}", _at(mod, node))


class _Classes:
    """The top-level classes of every module, and what each inherits from internal bases."""

    def __init__(self, modules: dict[str, Module]) -> None:
        self.modules = modules
        self.bound = {name: imported_names(mod) for name, mod in modules.items()}
        self.defs = {
            (name, node.name): node
            for name, mod in modules.items()
            for node in mod.tree.body
            if isinstance(node, ast.ClassDef)
        }

    def base_of(self, module: str, expr: ast.expr) -> tuple[str, str] | None:
        """(module, class) of a base-class expression, when it is a class of ours."""
        if isinstance(expr, ast.Name) and (module, expr.id) in self.defs:
            return module, expr.id
        target = dotted(expr, self.bound[module])
        if target is None:
            return None
        owner, _, cls = target.rpartition(".")
        return (owner, cls) if (owner, cls) in self.defs else None

    def inherited(self, module: str, cls: ast.ClassDef) -> set[str]:
        """Private names defined by the internal base classes of ``cls``, transitively."""
        names: set[str] = set()
        todo = [(module, b) for b in cls.bases]
        seen: set[tuple[str, str]] = set()
        while todo:
            owner, expr = todo.pop()
            base = self.base_of(owner, expr)
            if base is None or base in seen:
                continue
            seen.add(base)
            node = self.defs[base]
            names |= class_private_attrs(node)
            todo.extend((base[0], b) for b in node.bases)
        return names


def _on_self(node: ast.Attribute) -> bool:
    """``self._x``, ``cls._x`` or ``super()._x``: a class using what it inherits."""
    value = node.value
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "super"
    )


def private_attributes(mod: Module, classes: _Classes, out: _Collected) -> None:
    """``x._name`` on an imported name, or on an object whose class is not this module's.

    A subclass's ``self._x`` / ``super()._x`` is fine when one of its bases in these
    packages defines ``_x`` (the base's protected interface for its subclasses)."""
    bound = classes.bound[mod.name]
    own = {
        n for c in ast.walk(mod.tree) if isinstance(c, ast.ClassDef) for n in class_private_attrs(c)
    }
    inherited: dict[int, set[str]] = {}
    for cls in (n for n in mod.tree.body if isinstance(n, ast.ClassDef)):
        names = classes.inherited(mod.name, cls)
        inherited.update((id(sub), names) for sub in ast.walk(cls))
    for node in ast.walk(mod.tree):
        if not isinstance(node, ast.Attribute) or not is_private(node.attr):
            continue
        if node.attr in NAMEDTUPLE_API or (mod.name, node.attr) in ALLOWED:
            continue
        target = dotted(node.value, bound)
        if target is not None:
            out.add(f"private: {mod.name} uses {target}.{node.attr}", _at(mod, node))
        elif node.attr in own or (_on_self(node) and node.attr in inherited.get(id(node), ())):
            continue
        else:
            out.add(f"private: {mod.name} uses <object>.{node.attr}", _at(mod, node))


def _at(mod: Module, node: ast.stmt | ast.expr) -> str:
    return f"{mod.path}:{node.lineno}"


def private_findings(modules: dict[str, Module]) -> list[Finding]:
    """Every use of another module's private name, one finding per (module, name)."""
    out = _Collected()
    classes = _Classes(modules)
    for mod in modules.values():
        private_imports(mod, out)
        private_attributes(mod, classes, out)
    return [Finding(k, tuple(v)) for k, v in sorted(out.places.items())]


def read_baseline(path: Path | None) -> set[str]:
    """The baseline's entries (blank lines and ``#`` comments skipped)."""
    if path is None or not path.exists():
        return set()
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {line for line in lines if line}


def write_baseline(path: Path, findings: list[Finding]) -> None:
    head = (
        "# Known offenders of .ci/imports.py, one per line; `make lint` fails on any other.\n"
        "# Delete a line when its offender is fixed (the run says which ones are).\n"
    )
    path.write_text(head + "".join(f"{f.key}\n" for f in findings))


def report(findings: list[Finding], baseline: set[str], groups: int) -> int:
    """Print every finding, new ones first; 1 when any is not in the baseline."""
    new = [f for f in findings if f.key not in baseline]
    known = [f for f in findings if f.key in baseline]
    fixed = baseline - {f.key for f in findings}
    for f in new:
        print(f"NEW {f.key}")
        for where in f.where:
            print(f"    {where}")
    for key in sorted(fixed):
        print(f"fixed (delete from the baseline): {key}")
    n_cycle = sum(f.key.startswith("cycle:") for f in findings)
    n_private = len(findings) - n_cycle
    uses = sum(len(f.where) for f in findings if not f.key.startswith("cycle:"))
    print(
        f"imports: {groups} import cycle(s) over {n_cycle} edge(s); {n_private} private "
        f"name(s) of other modules used ({uses} place(s)); {len(new)} new; baseline: "
        f"{len(known)} entr(ies) remain, {len(fixed)} fixed"
    )
    return 1 if new else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", type=Path, help="top-level package directories")
    parser.add_argument("--baseline", type=Path, help="known offenders, one per line")
    parser.add_argument("--write-baseline", action="store_true", help="rewrite the baseline")
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.roots if not (r / "__init__.py").is_file()]
    if missing:
        print(f"imports.py: not a package directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    modules = load_modules(args.roots)
    cycles, groups = cycle_findings(modules)
    findings = cycles + private_findings(modules)
    if args.write_baseline:
        if args.baseline is None:
            print("imports.py: --write-baseline needs --baseline FILE", file=sys.stderr)
            return 2
        write_baseline(args.baseline, findings)
    return report(findings, read_baseline(args.baseline), groups)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
