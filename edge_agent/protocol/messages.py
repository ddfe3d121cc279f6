"""JSON control messages between agents and the aggregator (topics: docs/architecture.md).

Updates and model messages are binary (edge_agent.protocol.wire); these small, rare messages are JSON:
frozen dataclasses validated by hand on both ends (extra fields forbidden), with no
dependency beyond the standard library (the device path stays light). ``parse`` raises
WireFormatError so a service can count and drop a bad one like any other bad message; a
constructor given a bad value raises it too. The accepted inputs, the coercions (``"3"``
for an integer, ``"yes"`` for a boolean, ...), the error texts and the JSON written are
those of the pydantic models these classes replaced (tests/edge_agent/test_messages.py
checks both on the same inputs).

A message from an agent that holds a MAC key carries ``ctr``, its message counter, and
travels signed (edge_agent.protocol.mac, docs/wire-format.md section 11.1).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Literal, TypeVar

from edge_agent.errors import WireFormatError

#: the largest JSON text a message may have
MAX_JSON_BYTES = 4096


class _Invalid(Exception):
    """One field failed: ``msg`` is the text pydantic gave for it."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.msg = msg


Check = Callable[[Any], Any]

# ---------------------------------------------------------------- value checks

_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_INT_TEXT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
_IDENT = re.compile(r"[A-Za-z0-9._-]+")
#: strings JSON writes as they are (no escape needed)
_PLAIN_TEXT = re.compile(r"[ !#-\[\]-~]*")
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_I64 = 2**63


def _int(v: Any) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise _Invalid("Input should be a finite number")
        if v != int(v):
            raise _Invalid("Input should be a valid integer, got a number with a fractional part")
        if abs(v) >= _I64:
            raise _Invalid("Unable to parse input string as an integer, exceeded maximum size")
        return int(v)
    if isinstance(v, str):
        s = v.strip(_WS)
        if not _INT_TEXT.fullmatch(s):
            raise _Invalid("Input should be a valid integer, unable to parse string as an integer")
        return int(s.split(".")[0].replace("_", ""))
    raise _Invalid("Input should be a valid integer")


def _finite_float(v: Any) -> float:
    if isinstance(v, bool | int):
        return float(v)
    if isinstance(v, float):
        out = v
    elif isinstance(v, str):
        s = v.strip(_WS)
        bad = not s.isascii() or s[:1] == "_" or s[-1:] == "_" or "__" in s
        try:
            out = float("x" if bad else s.replace("_", ""))
        except ValueError:
            msg = "Input should be a valid number, unable to parse string as a number"
            raise _Invalid(msg) from None
    else:
        raise _Invalid("Input should be a valid number")
    if not math.isfinite(out):
        raise _Invalid("Input should be a finite number")
    return out


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, float) and v.is_integer() and abs(v) < _I64:
        v = int(v)
    if isinstance(v, int | str) and not (isinstance(v, int) and abs(v) >= _I64):
        key = v.lower() if isinstance(v, str) else str(v)
        if key in _TRUE or key in _FALSE:
            return key in _TRUE
        raise _Invalid("Input should be a valid boolean, unable to interpret input")
    raise _Invalid("Input should be a valid boolean")


def _text(min_length: int = 0, max_length: int | None = None, ident: bool = False) -> Check:
    def check(v: Any) -> str:
        if not isinstance(v, str):
            raise _Invalid("Input should be a valid string")
        if len(v) < min_length:
            raise _Invalid(f"String should have at least {min_length} character")
        if max_length is not None and len(v) > max_length:
            raise _Invalid(f"String should have at most {max_length} characters")
        if ident and not _IDENT.fullmatch(v):
            raise _Invalid("String should match pattern '^[A-Za-z0-9._-]+$'")
        return v

    return check


def _literal(*allowed: str) -> Check:
    quoted = [f"'{a}'" for a in allowed]
    said = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"

    def check(v: Any) -> str:
        if isinstance(v, str) and v in allowed:
            return v
        raise _Invalid(f"Input should be {said}")

    return check


def _bounded(
    check: Check, *, gt: float | None = None, ge: int | None = None, le: float | None = None
) -> Check:
    def bounded(v: Any) -> Any:
        out = check(v)
        if gt is not None and not out > gt:
            raise _Invalid(f"Input should be greater than {gt:g}")
        if ge is not None and not out >= ge:
            raise _Invalid(f"Input should be greater than or equal to {ge}")
        if le is not None and not out <= le:
            raise _Invalid(f"Input should be less than or equal to {le:g}")
        return out

    return bounded


def _optional(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


_IDENT_CHECK = _text(1, 64, ident=True)
_COUNTER = _optional(_bounded(_int, ge=0))


def _spec(check: Check, default: Any = MISSING) -> Any:
    """A dataclass field validated by ``check`` (``default``: optional)."""
    return field(default=default, metadata={"check": check})


# ---------------------------------------------------------------- JSON text


def _number_text(v: float) -> str:
    """A float as pydantic writes it: Python's repr, but ``0.00001`` and ``1.5e-7``."""
    r = repr(v)
    if "e-" not in r:
        return r
    mantissa, exp = r.split("e-")
    if int(exp) == 5:  # Python writes 1e-05 where pydantic writes 0.00001
        sign, digits = ("-", mantissa[1:]) if mantissa[0] == "-" else ("", mantissa)
        return f"{sign}0.0000{digits.replace('.', '')}"
    return f"{mantissa}e-{int(exp)}"


def _json_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _number_text(value)
    if isinstance(value, str) and _PLAIN_TEXT.fullmatch(value):
        return f'"{value}"'
    return json.dumps(value, ensure_ascii=False)


#: the deepest nesting of arrays and objects pydantic's JSON parser reads
_MAX_DEPTH = 201


def _well_formed(obj: Any, depth: int = 0) -> bool:
    """No lone surrogate in any string and no nesting beyond :data:`_MAX_DEPTH` (pydantic's
    JSON parser refuses both)."""
    if isinstance(obj, str):
        return not any("\ud800" <= c <= "\udfff" for c in obj)
    if isinstance(obj, dict | list):
        if depth >= _MAX_DEPTH:
            return False
        items = [*obj.keys(), *obj.values()] if isinstance(obj, dict) else obj
        return all(_well_formed(v, depth + 1) for v in items)
    return True


#: a \\u escape of a surrogate: only then can a decoded string hold a lone one
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _load_json(payload: bytes) -> Any:
    try:
        text = payload.decode("utf-8")
        obj = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _Invalid(f"Invalid JSON: {exc}") from None
    deep = text.count("[") + text.count("{") > _MAX_DEPTH
    if (deep or _SURROGATE_ESCAPE.search(text)) and not _well_formed(obj):  # rare: walk it
        raise _Invalid("Invalid JSON: a lone surrogate, or nesting too deep")
    return obj


# ---------------------------------------------------------------- the messages


#: per message class: (name, check, default) of each field, in order (built on first use)
_SPECS: dict[type, tuple[tuple[str, Check, Any], ...]] = {}


def _specs(cls: type) -> tuple[tuple[str, Check, Any], ...]:
    specs = _SPECS.get(cls)
    if specs is None:
        specs = tuple((f.name, f.metadata["check"], f.default) for f in fields(cls))
        _SPECS[cls] = specs
    return specs


class _Msg:
    """Validation shared by the messages: every field's check, in field order, then the
    fields no message has (refused)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    def __post_init__(self) -> None:
        for name, check, _ in _specs(type(self)):
            try:
                value = check(getattr(self, name))
            except _Invalid as exc:
                raise WireFormatError(f"{type(self).__name__.lower()}: {name}: {exc.msg}") from None
            object.__setattr__(self, name, value)

    @classmethod
    def from_dict(cls: type[M], data: Mapping[str, Any]) -> M:
        """Validate a decoded JSON object as ``cls``; raises WireFormatError naming the
        first problem (``<kind>: <field>: <why>``)."""
        name = cls.__name__.lower()
        if not isinstance(data, Mapping):
            raise WireFormatError(f"{name}: payload: Input should be an object")
        values: dict[str, Any] = {}
        for fname, check, default in _specs(cls):
            if fname not in data:
                if default is MISSING:
                    raise WireFormatError(f"{name}: {fname}: Field required")
                values[fname] = default
                continue
            try:
                values[fname] = check(data[fname])
            except _Invalid as exc:
                raise WireFormatError(f"{name}: {fname}: {exc.msg}") from None
        known = cls.__dataclass_fields__
        if not data.keys() <= known.keys():
            extra = next(k for k in data if k not in known)
            raise WireFormatError(f"{name}: {extra}: Extra inputs are not permitted")
        msg = object.__new__(cls)  # validated above, once: not again by __post_init__
        msg.__dict__.update(values)
        return msg

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (None included): the JSON-able form a checkpoint keeps."""
        return {name: getattr(self, name) for name, _, _ in _specs(type(self))}


@dataclass(frozen=True, kw_only=True)
class Hello(_Msg):
    """Sent by an agent when it (re)joins. ``smoothness`` is its local L_i, ``rows`` its n_i.

    ``fresh`` says the agent starts with empty error-feedback state (a restart): the
    aggregator then resets what it mirrors for this agent (EF21 h_i) before applying updates.
    ``next_seq`` is the first sequence number the agent will use (a lower bound: no later
    update has a smaller seq). ``ctr`` (signed hellos): the agent's message counter;
    ``will_ctr``: the counter of the signed ``offline`` status its MQTT Last Will carries
    (docs/wire-format.md section 11.1).
    """

    type: Literal["hello"] = _spec(_literal("hello"), "hello")
    job: str = _spec(_IDENT_CHECK)
    agent: str = _spec(_IDENT_CHECK)
    d: int = _spec(_bounded(_int, gt=0))
    rows: int = _spec(_bounded(_int, ge=0))
    smoothness: float = _spec(_bounded(_finite_float, gt=0))
    model: str = _spec(_text())
    compressor: str = _spec(_text())
    semantics: Literal["plain", "ef", "ef21", "dir", "local"] = _spec(
        _literal("plain", "ef", "ef21", "dir", "local"), "plain"
    )
    policy: str = _spec(_text(), "cat")
    profile: str = _spec(_text(), "")
    objective: str = _spec(_text(), "")
    fresh: bool = _spec(_bool, True)
    next_seq: int = _spec(_bounded(_int, ge=0), 0)
    #: the model version the agent holds, if any
    version: int | None = _spec(_COUNTER, None)
    #: the shared downlink group (multicast) it receives job-wide messages on; None: the
    #: one its profile's ``downlink.shared`` names, or unicast without one
    group: str | None = _spec(_optional(_text(1, 64)), None)
    #: minibatch SGD: rows per gradient or a fraction of the shard (``--batch-size``);
    #: None: full local gradients
    batch_size: float | None = _spec(_optional(_bounded(_finite_float, gt=0)), None)
    #: local training: the local steps between messages (``--local-steps``); None: none
    local_steps: int | None = _spec(_optional(_bounded(_int, gt=0)), None)
    #: local training with a drawn schedule: the probability of communicating after each
    #: local step (``--comm-prob``); None: none
    comm_prob: float | None = _spec(_optional(_bounded(_finite_float, gt=0, le=1)), None)
    ctr: int | None = _spec(_COUNTER, None)
    will_ctr: int | None = _spec(_COUNTER, None)


@dataclass(frozen=True, kw_only=True)
class Status(_Msg):
    """Agent liveness. The MQTT Last Will carries ``{"state": "offline"}``."""

    type: Literal["status"] = _spec(_literal("status"), "status")
    state: Literal["online", "offline", "done"] = _spec(_literal("online", "offline", "done"))
    agent: str | None = _spec(_optional(_IDENT_CHECK), None)
    round: int | None = _spec(_optional(_int), None)
    ctr: int | None = _spec(_COUNTER, None)


@dataclass(frozen=True, kw_only=True)
class Request(_Msg):
    """An agent asks for a full snapshot (it saw a version gap or has no model)."""

    type: Literal["request"] = _spec(_literal("request"), "request")
    want: Literal["snapshot"] = _spec(_literal("snapshot"), "snapshot")
    have: int | None = _spec(_optional(_int), None)
    ctr: int | None = _spec(_COUNTER, None)


@dataclass(frozen=True, kw_only=True)
class Control(_Msg):
    """Aggregator to agents: stop (training finished), pause, resume, resync, reset, refused.

    ``resync`` (with ``version``) is sent when the aggregator (re)starts: an agent that has
    already answered that version re-sends the very same update (same seq; de-duplicated),
    since the open round may have been lost; an agent behind it asks for a snapshot.

    ``reset`` (with ``agent``) is for that one EF21 agent: the aggregator could not tell
    whether one of its state changes was already applied (it arrived older than the
    de-duplication window), so it dropped its copy of the agent's state h_i; the agent
    must zero its own h_i and say hello with ``fresh=True``. Until that hello arrives, the
    agent's EF21 updates are refused and answered with the same reset.

    ``refused`` (with ``agent``, ``reason`` and ``detail``) tells that one agent that the
    aggregator refused its hello or update: ``reason`` is the rejection reason the
    aggregator counts (``wrong_semantics``, ``wrong_d``, ``wrong_model``, ...; see
    :data:`REFUSAL_FATAL`), ``detail`` says what differed. The aggregator sends at most one
    per (agent, reason) every 30 s; every agent of the job receives it (one control topic)
    and only the named one acts on it.
    """

    type: Literal["control"] = _spec(_literal("control"), "control")
    cmd: Literal["stop", "pause", "resume", "resync", "reset", "refused"] = _spec(
        _literal("stop", "pause", "resume", "resync", "reset", "refused")
    )
    version: int | None = _spec(_optional(_int), None)
    agent: str | None = _spec(_optional(_IDENT_CHECK), None)
    reason: str = _spec(_text(), "")
    detail: str = _spec(_text(), "")


#: Refusal reasons that cannot heal by retrying: the agent's settings (feedback, d, model,
#: compressor, batch size) do not fit the job's. An agent stops after a few of them
#: (``--max-refusals``).
REFUSAL_FATAL: frozenset[str] = frozenset(
    {
        "wrong_semantics",
        "wrong_d",
        "wrong_model",
        "wrong_compressor",
        "wrong_batch_size",
        "wrong_local_steps",
    }
)


M = TypeVar("M", bound=_Msg)


def dump(msg: _Msg) -> bytes:
    """The message as compact JSON, fields in order, None fields left out."""
    parts = [f'"{k}":{_json_text(v)}' for k, v in msg.to_dict().items() if v is not None]
    return ("{" + ",".join(parts) + "}").encode()


def parse(cls: type[M], payload: bytes) -> M:
    """Validate a JSON payload as ``cls``; raises WireFormatError naming the problem."""
    if len(payload) > MAX_JSON_BYTES:
        raise WireFormatError(
            f"{cls.__name__.lower()}: payload of {len(payload)} bytes exceeds {MAX_JSON_BYTES}"
        )
    try:
        obj = _load_json(bytes(payload))
    except _Invalid as exc:
        raise WireFormatError(f"{cls.__name__.lower()}: payload: {exc.msg}") from None
    return cls.from_dict(obj)
