"""Cost-profile validation errors: the problems found as one readable line per problem.

A profile that fails validation raises :class:`~edge_agent.errors.ProfileError` naming
the source, then per problem ``field: what is allowed, got X`` (the field as a path such
as ``points[2].size_bytes``). The profile models live in :mod:`edge_agent.links.profiles`; they
reach this module as a :class:`ProfileSchema`, so the dependency runs one way. The problems
(:class:`edge_agent.validation.Problem`) carry pydantic's error types and texts, which the
device's profiles were validated with before; the lines read as they did then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from edge_agent.errors import ProfileError
from edge_agent.links.cost import METRICS
from edge_agent.validation import Problem, Schema, field_names

__all__ = ["ProfileSchema", "describe", "profile_error"]


@dataclass(frozen=True, slots=True)
class ProfileSchema:
    """What the messages need to know of the profile models.

    ``kinds``: the values of the ``kind`` discriminator, in the order they are listed;
    ``kind_models``: the model of each kind (the first element of an error's location);
    ``nested_models``: the model of a nested field by its name (``downlink``, ...), to
    list its fields when an unknown one is given."""

    kinds: tuple[str, ...]
    kind_models: Mapping[str, type[Schema]]
    nested_models: Mapping[str, type[Schema]]


#: the bound error types -> (the operator shown, the key of the bound in ctx)
_BOUNDS: Final[dict[str, tuple[str, str]]] = {
    "greater_than": ("> ", "gt"),
    "greater_than_equal": (">= ", "ge"),
    "less_than": ("< ", "lt"),
    "less_than_equal": ("<= ", "le"),
}


def _loc_path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bad_kind(error: Problem, kinds: tuple[str, ...]) -> str:
    """A ``kind`` that is not one of ``kinds`` (or an input without one)."""
    allowed = ", ".join(repr(k) for k in kinds)
    raw = error.input
    shown = f", got {raw.get('kind')!r}" if isinstance(raw, dict) and "kind" in raw else ""
    return f"kind must be one of {allowed}{shown}"


def _unknown_field(
    loc: list[int | str], field: str, kind_model: type[Schema] | None, schema: ProfileSchema
) -> str:
    """A field no model declares; lists the allowed fields of its model where known."""
    model: type[Schema] | None = kind_model if len(loc) == 1 else None
    parents = [p for p in loc[:-1] if isinstance(p, str)]
    if len(loc) > 1 and parents and parents[-1] in schema.nested_models:
        model = schema.nested_models[parents[-1]]
    allowed = f"; allowed fields: {', '.join(field_names(model))}" if model else ""
    return f"{field}: unknown field{allowed}"


def _bad_value(error: Problem, field: str) -> str:
    """A value out of its bounds, not among the allowed ones, or of the wrong type."""
    etype, ctx, got = error.type, error.ctx, _short(error.input)
    if etype in _BOUNDS:
        op, key = _BOUNDS[etype]
        return f"{field} must be {op}{ctx.get(key)}, got {got}"
    if etype == "literal_error" or etype == "enum":
        return f"{field} must be one of {ctx.get('expected')}, got {got}"
    return f"{field}: {error.msg[0].lower()}{error.msg[1:]}, got {got}"


def describe(error: Problem, schema: ProfileSchema) -> str:
    """One problem as ``field: what is allowed, got X``."""
    loc: list[Any] = list(error.loc)
    kind_model: type[Schema] | None = None
    head = loc[0] if loc else None
    if isinstance(head, str) and head in schema.kind_models:
        kind_model = schema.kind_models[head]
        loc.pop(0)
    etype, ctx = error.type, error.ctx
    if loc and loc[-1] == "[key]":  # a bad key in a metric map, e.g. per_byte
        field = _loc_path(loc[:-2])
        return f"{field}: key {loc[-2]!r} must be one of {', '.join(map(repr, METRICS))}"
    field = _loc_path(loc)
    if etype == "value_error":
        return str(ctx.get("error", error.msg))
    if etype in ("union_tag_invalid", "union_tag_not_found"):
        return _bad_kind(error, schema.kinds)
    if etype == "extra_forbidden":
        return _unknown_field(loc, field, kind_model, schema)
    if etype == "missing":
        return f"{field}: required field is missing"
    return _bad_value(error, field)


def profile_error(source: str, problems: Sequence[Problem], schema: ProfileSchema) -> ProfileError:
    """The :class:`ProfileError` for a profile from ``source`` that failed validation."""
    lines = [describe(e, schema) for e in problems]
    if len(lines) == 1:
        return ProfileError(f"profile {source}: {lines[0]}")
    return ProfileError(f"profile {source}: {len(lines)} errors: " + "; ".join(lines))
