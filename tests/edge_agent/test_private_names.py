"""No module of edge_agent reaches into another module's ``_underscore`` names.

An AST scan of every module: ``from m import _name``, and ``obj._name`` where ``_name`` is
not defined in the same module (as a module-level name, a method, or an attribute a class
of the module assigns) flag; ``self._x``, ``cls._x`` and ``super()._x`` are a class's own
members, inherited ones included. Allowed, each for a stated reason: namedtuple's public
``_replace`` family, the paho-mqtt client internals the MQTT transport documents, and the
memory broker's delivery to its own module's transports.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

import edge_agent

ROOT: Final = Path(edge_agent.__file__).parent
#: namedtuple's public API (underscored to avoid clashing with field names)
NAMEDTUPLE_API: Final = frozenset({"_replace", "_asdict", "_make", "_fields"})
#: (module, attribute) pairs allowed for a stated reason
ALLOWED: Final = {
    # paho-mqtt keeps the in-flight queue private; the transport documents why it reads it
    ("transports/mqtt.py", "_out_message_mutex"),
    ("transports/mqtt.py", "_out_messages"),
    # the in-process broker hands messages to the MemoryTransport clients of its own module
    # (``_deliver``: the inbound hook every transport inherits from transports/base.py)
    ("transports/memory.py", "_deliver"),
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_object(value: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: a class's own (possibly inherited) members."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "super"
    )


def own_names(tree: ast.Module) -> set[str]:
    """Names a module defines: functions, classes, methods, assigned names and attributes."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ entries
    return names


def foreign_private(source: str, rel: str) -> list[str]:
    """Every use in module ``rel`` (its ``source``) of another module's underscore name,
    as ``rel:line: text``."""
    tree = ast.parse(source)
    own = own_names(tree)
    hits: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            hits += [
                f"{rel}:{node.lineno}: from {node.module} import {a.name}"
                for a in node.names
                if _private(a.name)
            ]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            if _own_object(node.value) or node.attr in own or node.attr in NAMEDTUPLE_API:
                continue
            if (rel, node.attr) in ALLOWED:
                continue
            hits.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_the_scan_finds_a_foreign_private_name() -> None:
    text = "from edge_agent.protocol.wire import _x\nfrom edge_agent.protocol import wire\n"
    text += "r = wire._Reader\nclass A:\n    def __init__(self) -> None:\n        self._own = 1\n"
    text += "    def f(self, other: 'A') -> int:\n        return other._own\n"
    hits = foreign_private(text, "protocol/probe.py")
    assert [h.split(": ", 1)[1] for h in hits] == [
        "from edge_agent.protocol.wire import _x",
        "wire._Reader",
    ]


def test_no_module_uses_another_modules_private_names() -> None:
    hits = [
        h
        for path in sorted(ROOT.rglob("*.py"))
        for h in foreign_private(
            path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix()
        )
    ]
    assert hits == [], "\n".join(hits)
