"""Validated frozen dataclasses for the device's side of the boundary schemas, without pydantic.

Cost profiles (:mod:`edge_agent.links.profiles`) and the job's announcement
(:mod:`edge_agent.protocol.jobinfo`) are frozen dataclasses whose class attribute ``CHECKS``
maps each field, in order, to a :data:`Check`. :func:`build` turns a mapping (as read from
JSON) into one, collecting every problem as a :class:`Problem` that carries what a
pydantic error did (``loc``, ``type``, ``msg``, ``input``, ``ctx``) so the messages users
see did not change when pydantic left the device. The coercions are pydantic's lax ones for
the types used here: an integer field takes ``3``, ``3.0``, ``"3"`` and ``True``; a number
field takes ints and numeric strings; a tuple field takes a list. A class's
``__post_init__`` calls :func:`revalidate`, so building one directly checks and coerces
its fields the same way, and cross-field rules (a ``ValueError`` from the class) become a
``value_error`` problem.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import operator
import re
from collections.abc import Callable, KeysView, Mapping, ValuesView
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Final, Protocol, TypeVar

__all__ = [
    "INVALID",
    "Check",
    "Invalid",
    "Problem",
    "build",
    "compact_json",
    "dict_of",
    "dump",
    "field_names",
    "integer",
    "literal",
    "model",
    "number",
    "optional",
    "revalidate",
    "string",
    "tuple_of",
]

Loc = tuple[int | str, ...]


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with an input: where (``loc``, a path of field names and indices),
    its ``type`` (pydantic's error type names), a ``msg``, the offending ``input`` and the
    rule's parameters (``ctx``)."""

    loc: Loc
    type: str
    msg: str
    input: object
    ctx: Mapping[str, object]


class Invalid(ValueError):
    """Validation failed: ``problems`` lists every problem found, in input order."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        first = problems[0]
        where = ".".join(map(str, first.loc)) or "input"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"{where}: {first.msg}{more}")


class _Sentinel:
    def __repr__(self) -> str:
        return "INVALID"


#: what a check returns after recording a problem
INVALID: Final[Any] = _Sentinel()

Check = Callable[[object, Loc, list[Problem]], Any]
"""``check(value, loc, problems)``: the coerced value, or INVALID after appending problems."""


class Schema(Protocol):
    """A validated dataclass: its fields' checks, in order."""

    CHECKS: ClassVar[Mapping[str, Check]]


S = TypeVar("S", bound=Schema)


class _Bad(Exception):
    def __init__(self, type_: str, msg: str, ctx: Mapping[str, object] | None = None) -> None:
        super().__init__(msg)
        self.type, self.msg, self.ctx = type_, msg, ctx or {}


def _leaf(coerce: Callable[[object], object]) -> Check:
    def check(value: object, loc: Loc, problems: list[Problem]) -> Any:
        try:
            return coerce(value)
        except _Bad as bad:
            problems.append(Problem(loc, bad.type, bad.msg, value, bad.ctx))
            return INVALID

    return check


def _shown(bound: float) -> str:
    """A bound as pydantic's messages write it (``1.0`` as ``1``)."""
    if isinstance(bound, float) and bound.is_integer():
        return str(int(bound))
    return str(bound)


def _bounds(value: float, gt: float | None, ge: float | None, le: float | None) -> None:
    # pydantic's order: le before ge and gt (a NaN fails the first bound tried)
    if le is not None and not value <= le:
        raise _Bad(
            "less_than_equal", f"Input should be less than or equal to {_shown(le)}", {"le": le}
        )
    if ge is not None and not value >= ge:
        raise _Bad(
            "greater_than_equal",
            f"Input should be greater than or equal to {_shown(ge)}",
            {"ge": ge},
        )
    if gt is not None and not value > gt:
        raise _Bad("greater_than", f"Input should be greater than {_shown(gt)}", {"gt": gt})


def _text_of(value: str | bytes) -> str | None:
    """A numeric string's ASCII text, None when it holds anything else."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if value.isascii() else None


_INT_TEXT: Final = re.compile(r"[+-]?[0-9_]+")
_INT_POINT_ZERO: Final = re.compile(r"([+-]?[0-9]+)\.0+")
_I64: Final = 2**63
_INT_PARSING: Final = "Input should be a valid integer, unable to parse string as an integer"


def _int_from_text(value: str | bytes) -> int:
    text = _text_of(value)
    text = None if text is None else text.strip()
    if text is not None and _INT_TEXT.fullmatch(text):
        with contextlib.suppress(ValueError):  # e.g. "1__2": the pattern admits it, int() not
            return int(text)
    elif text is not None and (m := _INT_POINT_ZERO.fullmatch(text)):
        return int(m.group(1))
    raise _Bad("int_parsing", _INT_PARSING)


def _int_from_float(value: float) -> int:
    if not math.isfinite(value):
        raise _Bad("finite_number", "Input should be a finite number")
    if not value.is_integer():
        raise _Bad(
            "int_from_float", "Input should be a valid integer, got a number with a fractional part"
        )
    if not -_I64 <= value < _I64:
        raise _Bad(
            "int_parsing_size", "Unable to parse input string as an integer, exceeded maximum size"
        )
    return int(value)


def _as_int(value: object) -> int:
    if isinstance(value, int):  # bool included: True is 1
        return int(value)
    if isinstance(value, float):
        return _int_from_float(value)
    if isinstance(value, str | bytes):
        return _int_from_text(value)
    if isinstance(value, list | tuple | dict | set | frozenset | bytearray) or value is None:
        raise _Bad("int_type", "Input should be a valid integer")
    if hasattr(value, "__index__"):  # numpy integers
        return operator.index(value)
    if hasattr(value, "__float__"):  # numpy floats, Decimal, Fraction
        return _int_from_float(float(value))
    raise _Bad("int_type", "Input should be a valid integer")


def _as_float(value: object) -> float:
    if isinstance(value, float | int):
        return float(value)
    if isinstance(value, str | bytes):
        text = _text_of(value)
        if text is not None:
            with contextlib.suppress(ValueError):
                return float(text)
        raise _Bad(
            "float_parsing", "Input should be a valid number, unable to parse string as a number"
        )
    if isinstance(value, list | tuple | dict | set | frozenset | bytearray) or value is None:
        raise _Bad("float_type", "Input should be a valid number")
    if hasattr(value, "__float__"):
        return float(value)
    raise _Bad("float_type", "Input should be a valid number")


def integer(*, gt: int | None = None, ge: int | None = None) -> Check:
    """An int (also from an integral float, a numeric string or a bool) within the bounds."""

    def coerce(value: object) -> int:
        out = _as_int(value)
        _bounds(out, gt, ge, None)
        return out

    return _leaf(coerce)


def number(
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    finite: bool = False,
) -> Check:
    """A float (also from an int or a numeric string) within the bounds; ``finite``: no inf
    or NaN."""

    def coerce(value: object) -> float:
        out = _as_float(value)
        if finite and not math.isfinite(out):
            raise _Bad("finite_number", "Input should be a finite number")
        _bounds(out, gt, ge, le)
        return out

    return _leaf(coerce)


def string(
    *, pattern: str | None = None, min_length: int | None = None, max_length: int | None = None
) -> Check:
    """A str (bytes are decoded as UTF-8), of a length and a pattern when given."""
    compiled = None if pattern is None else re.compile(pattern)

    def coerce(value: object) -> str:
        if isinstance(value, bytes | bytearray):
            try:
                value = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                raise _Bad(
                    "string_unicode",
                    "Input should be a valid string, unable to parse raw data as a unicode string",
                ) from None
        if not isinstance(value, str):
            raise _Bad("string_type", "Input should be a valid string")
        if min_length is not None and len(value) < min_length:
            s = "" if min_length == 1 else "s"
            raise _Bad(
                "string_too_short",
                f"String should have at least {min_length} character{s}",
                {"min_length": min_length},
            )
        if max_length is not None and len(value) > max_length:
            s = "" if max_length == 1 else "s"
            raise _Bad(
                "string_too_long",
                f"String should have at most {max_length} character{s}",
                {"max_length": max_length},
            )
        if compiled is not None and compiled.search(value) is None:
            raise _Bad(
                "string_pattern_mismatch",
                f"String should match pattern '{pattern}'",
                {"pattern": pattern},
            )
        return str(value)

    return _leaf(coerce)


def literal(*allowed: str) -> Check:
    """One of the strings ``allowed``."""
    quoted = [repr(a) for a in allowed]
    expected = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"

    def coerce(value: object) -> str:
        if isinstance(value, str) and value in allowed:
            return value
        raise _Bad("literal_error", f"Input should be {expected}", {"expected": expected})

    return _leaf(coerce)


def optional(inner: Check) -> Check:
    """None, or what ``inner`` accepts."""

    def check(value: object, loc: Loc, problems: list[Problem]) -> Any:
        return None if value is None else inner(value, loc, problems)

    return check


_SEQUENCES: Final = (list, tuple, set, frozenset, KeysView, ValuesView)


def tuple_of(item: Check) -> Check:
    """A tuple (from a list, tuple or set) of what ``item`` accepts."""

    def check(value: object, loc: Loc, problems: list[Problem]) -> Any:
        if not isinstance(value, _SEQUENCES):
            problems.append(Problem(loc, "tuple_type", "Input should be a valid tuple", value, {}))
            return INVALID
        before = len(problems)
        out = tuple(item(v, (*loc, i), problems) for i, v in enumerate(value))
        return out if len(problems) == before else INVALID

    return check


def dict_of(key: Check, value: Check) -> Check:
    """A dict whose keys ``key`` accepts and values ``value`` does (a bad key is reported at
    ``(*loc, key, "[key]")``, its value checked all the same)."""

    def check(data: object, loc: Loc, problems: list[Problem]) -> Any:
        if not isinstance(data, dict):
            problems.append(
                Problem(loc, "dict_type", "Input should be a valid dictionary", data, {})
            )
            return INVALID
        before = len(problems)
        out = {}
        for k, v in data.items():
            good_key = key(k, (*loc, k, "[key]"), problems)
            out[good_key] = value(v, (*loc, k), problems)
        return out if len(problems) == before else INVALID

    return check


def model(cls: type[Schema], *, extra: str = "forbid") -> Check:
    """A nested validated dataclass: an instance of ``cls`` as it is, or a dict to build one."""

    def check(value: object, loc: Loc, problems: list[Problem]) -> Any:
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            name = cls.__name__
            msg = f"Input should be a valid dictionary or instance of {name}"
            problems.append(Problem(loc, "model_type", msg, value, {"class_name": name}))
            return INVALID
        return build(cls, value, loc, problems, extra=extra)

    return check


def build(
    cls: type[S],
    data: dict[Any, Any],
    loc: Loc = (),
    problems: list[Problem] | None = None,
    *,
    extra: str = "forbid",
) -> S:
    """A ``cls`` from ``data``: every field checked in ``cls.CHECKS`` order (a field that is
    absent takes its default, or is reported ``missing``), then each unknown key
    (``extra="forbid"``; ``"ignore"`` drops them), then the class's own cross-field rules.

    With ``problems`` given, problems are appended there and INVALID is returned; without,
    :class:`Invalid` is raised listing them.
    """
    sink: list[Problem] = [] if problems is None else problems
    before = len(sink)
    defaults = _field_defaults(cls)
    values: dict[str, object] = {}
    for name, check in cls.CHECKS.items():
        if name in data:
            values[name] = check(data[name], (*loc, name), sink)
        elif name in defaults:
            values[name] = defaults[name]()
        else:
            sink.append(Problem((*loc, name), "missing", "Field required", data, {}))
    if extra == "forbid":
        for key, value in data.items():
            if key not in cls.CHECKS:
                sink.append(
                    Problem(
                        (*loc, key), "extra_forbidden", "Extra inputs are not permitted", value, {}
                    )
                )
    if len(sink) == before:
        try:
            return cls(**values)  # __post_init__: revalidate and the cross-field rules
        except Invalid as exc:
            sink.extend(
                Problem((*loc, *p.loc), p.type, p.msg, p.input, p.ctx) for p in exc.problems
            )
        except ValueError as exc:
            sink.append(Problem(loc, "value_error", f"Value error, {exc}", data, {"error": exc}))
    if problems is None:
        raise Invalid(sink)
    result: S = INVALID
    return result


@functools.cache
def _field_defaults(cls: type) -> dict[str, Callable[[], object]]:
    out: dict[str, Callable[[], object]] = {}
    for f in fields(cls):
        if f.default_factory is not MISSING:
            out[f.name] = f.default_factory
        elif f.default is not MISSING:
            out[f.name] = functools.partial(_same, f.default)
    return out


def _same(value: object) -> object:
    return value


def revalidate(obj: Schema) -> None:
    """Check and coerce ``obj``'s own fields in place (a frozen dataclass's
    ``__post_init__``); raises :class:`Invalid`."""
    problems: list[Problem] = []
    for name, check in type(obj).CHECKS.items():
        value = getattr(obj, name)
        out = check(value, (name,), problems)
        if out is not INVALID and out is not value:
            object.__setattr__(obj, name, out)
    if problems:
        raise Invalid(problems)


def field_names(cls: type[Schema]) -> list[str]:
    """The fields of a validated dataclass, in order."""
    return list(cls.CHECKS)


def dump(obj: Schema, *, exclude_none: bool) -> dict[str, Any]:
    """The fields of ``obj`` as JSON-ready data, in order (nested dataclasses as dicts,
    tuples as lists); ``exclude_none`` leaves out fields that are None, at every level."""
    out: dict[str, Any] = {}
    for name in type(obj).CHECKS:
        value = getattr(obj, name)
        if value is not None or not exclude_none:
            out[name] = _plain(value, exclude_none)
    return out


def compact_json(data: object) -> str:
    """``data`` (JSON-ready, as :func:`dump` gives) as compact JSON text, written as pydantic
    wrote it: no spaces, UTF-8 kept, floats as ``0.00001`` and ``1e-6`` (Python's repr
    with a bare exponent below 1e-5), a non-finite float as null."""
    if isinstance(data, float):
        return _float_text(data)
    if isinstance(data, dict):
        return (
            "{"
            + ",".join(
                f"{json.dumps(str(k), ensure_ascii=False)}:{compact_json(v)}"
                for k, v in data.items()
            )
            + "}"
        )
    if isinstance(data, list | tuple):
        return "[" + ",".join(compact_json(v) for v in data) + "]"
    return json.dumps(data, ensure_ascii=False)


def _float_text(value: float) -> str:
    if not math.isfinite(value):
        return "null"
    text = repr(float(value))
    if "e-" not in text:
        return text
    mantissa, exponent = text.split("e-")
    places = int(exponent)
    if places > 5:
        return f"{mantissa}e-{places}"
    sign = "-" if mantissa.startswith("-") else ""
    return f"{sign}0.{'0' * (places - 1)}{mantissa.lstrip('-').replace('.', '')}"


def _plain(value: object, exclude_none: bool) -> Any:
    if hasattr(type(value), "CHECKS"):
        return dump(value, exclude_none=exclude_none)  # type: ignore[arg-type]
    if isinstance(value, tuple | list):
        return [_plain(v, exclude_none) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v, exclude_none) for k, v in value.items()}
    return value
