"""The JSON control messages without pydantic: the same accepted inputs, the same errors and
the same JSON as the pydantic models they replaced.

The reference below is the old pydantic code of edge_agent/protocol/messages.py, kept here
verbatim but for one intended change: the counters of signed messages (``ctr``, and
``will_ctr`` in a hello; docs/wire-format.md section 11.1), which the new code adds. Both
are fed the same valid and invalid payloads.
"""

from __future__ import annotations

import itertools
import json
import random
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge_agent.errors import WireFormatError
from edge_agent.protocol import messages

Ident = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class Hello(_Msg):
    type: Literal["hello"] = "hello"
    job: Ident
    agent: Ident
    d: int = Field(gt=0)
    rows: int = Field(ge=0)
    smoothness: float = Field(gt=0, allow_inf_nan=False)
    model: str
    compressor: str
    semantics: Literal["plain", "ef", "ef21", "dir", "local"] = "plain"
    policy: str = "cat"
    profile: str = ""
    objective: str = ""
    fresh: bool = True
    next_seq: int = Field(default=0, ge=0)
    version: int | None = Field(default=None, ge=0)
    group: str | None = Field(default=None, min_length=1, max_length=64)
    batch_size: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    local_steps: int | None = Field(default=None, gt=0)
    comm_prob: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)  # new
    ctr: int | None = Field(default=None, ge=0)  # new
    will_ctr: int | None = Field(default=None, ge=0)  # new


class Status(_Msg):
    type: Literal["status"] = "status"
    state: Literal["online", "offline", "done"]
    agent: Ident | None = None
    round: int | None = None
    ctr: int | None = Field(default=None, ge=0)  # new


class Request(_Msg):
    type: Literal["request"] = "request"
    want: Literal["snapshot"] = "snapshot"
    have: int | None = None
    ctr: int | None = Field(default=None, ge=0)  # new


class Control(_Msg):
    type: Literal["control"] = "control"
    cmd: Literal["stop", "pause", "resume", "resync", "reset", "refused"]
    version: int | None = None
    agent: Ident | None = None
    reason: str = ""
    detail: str = ""


def ref_parse(cls: type[_Msg], payload: bytes) -> _Msg:
    """The old ``messages.parse``."""
    if len(payload) > 4096:
        raise WireFormatError(
            f"{cls.__name__.lower()}: payload of {len(payload)} bytes exceeds 4096"
        )
    try:
        return cls.model_validate_json(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ())) or "payload"
        raise WireFormatError(f"{cls.__name__.lower()}: {loc}: {first.get('msg')}") from None


PAIRS: list[tuple[type[_Msg], type[messages._Msg]]] = [
    (Hello, messages.Hello),
    (Status, messages.Status),
    (Request, messages.Request),
    (Control, messages.Control),
]

#: values every field is tried with: good ones, coercible ones and bad ones
# fmt: off
ODD: list[Any] = [
    0, 1, 2, -1, 3, 10**20, 2**63, -(2**63) - 1, 3.0, 3.5, -0.0, 1e-5, 2.5e-5, 1.5e-7, 1e16,
    1e22, 9.3e18, 9.2e18, True, False, None, "", " ", "3", " 3 ", "+3", "-0", "3.0", "3.00",
    "3.", ".5", "1_000", "_1", "1__0", "1_", "1e3", "1_e3", "1.5_", "inf", "-inf", "NaN",
    "Infinity", "0x10", "\u0663", "\uff13", "1,5", "yes", "no", "on", "OFF", "t", "F", "Y",
    "TRUE", " true", "true", "false", "2", "0.0", "hello", "status", "request", "control",
    "online", "offline", "done", "snapshot", "plain", "ef", "ef21", "dir", "PLAIN", "stop",
    "refused", "pi-01", "a.b_c-9", "a b", "x" * 64, "x" * 65, "\u00e9", "\u00e9" * 65,
    "line\nfeed\x01\x7f\u2028", "quote\"back\\slash/", [], [1], {}, {"a": 1},
]
# fmt: on
FIELDS: dict[type[_Msg], list[str]] = {cls: list(cls.model_fields) for cls, _ in PAIRS}


def _outcome(parse: Any, cls: Any, payload: bytes) -> tuple[Any, ...]:
    try:
        msg = parse(cls, payload)
    except WireFormatError as exc:
        return ("error", exc.reason)
    dumped = msg.model_dump_json(exclude_none=True).encode() if isinstance(msg, BaseModel) else (
        messages.dump(msg))  # fmt: skip
    fields = msg.model_dump() if isinstance(msg, BaseModel) else msg.to_dict()
    return ("ok", fields, dumped)


def _same(ref: tuple[Any, ...], new: tuple[Any, ...], payload: bytes) -> None:
    assert ref[0] == new[0], (payload, ref, new)
    if ref[0] == "ok":
        assert ref[1] == new[1], payload
        assert ref[2] == new[2], payload  # the same JSON text, byte for byte
        return
    if "Invalid JSON" in ref[1]:  # the two JSON parsers word their errors differently
        assert new[1].startswith(ref[1].split("Invalid JSON")[0] + "Invalid JSON"), (ref, new)
    else:
        assert ref[1] == new[1], payload


def _valid(cls: type[_Msg]) -> dict[str, Any]:
    if cls is Hello:
        return {"job": "j", "agent": "a", "d": 3, "rows": 10, "smoothness": 2.0,
                "model": "logreg", "compressor": "topk"}  # fmt: skip
    return {"state": "online"} if cls is Status else {"cmd": "stop"} if cls is Control else {}


def _payloads(cls: type[_Msg], rng: random.Random) -> list[bytes]:
    base = _valid(cls)
    out = [json.dumps(base).encode()]
    for name, value in itertools.product(FIELDS[cls], ODD):  # every field x every odd value
        out.append(json.dumps({**base, name: value}).encode())
    for name in base:  # a required field missing, an unknown one, both
        rest = {k: v for k, v in base.items() if k != name}
        out += [json.dumps(rest).encode(), json.dumps({"zz": 1, **rest}).encode()]
    out.append(json.dumps({**base, "extra": 1}).encode())
    for _ in range(300):  # a few odd values at once: which error comes first
        fields = rng.sample(FIELDS[cls], min(3, len(FIELDS[cls])))
        out.append(json.dumps({**base, **{f: rng.choice(ODD) for f in fields}}).encode())
    return out


# fmt: off
RAW: list[bytes] = [
    b"", b"[]", b"null", b"1", b'"x"', b"{", b'{"state":"online"', b'{"state":"online"}\n',
    b' {"state":"online"} ', b'\xef\xbb\xbf{"state":"online"}', b'{"state":"\xff"}',
    b'{"state":"online","state":"done"}', b'{"state":NaN}', b'{"state":"online","round":NaN}',
    b'{"state":"online","round":Infinity}', b'{"state":"online","round":-Infinity}',
    b'{"state":"online","round":1e400}', b'{"state":"online","round":1.0}',
    b'{"state":"online","round":"\\u0031"}', b'{"state":"online","agent":"a\\ud800"}',
    b'{"state":"online"} x', b"[" * 300 + b"]" * 300, b'{"state":"online","agent":null}',
    b'{"state":"online","round":123456789012345678901234567890}', b"{}" + b" " * 4095,
]
# fmt: on


@pytest.mark.parametrize(("ref", "new"), PAIRS, ids=lambda c: c.__name__)
def test_same_verdicts_values_errors_and_json(ref: type[_Msg], new: Any) -> None:
    rng = random.Random(f"messages-{ref.__name__}")
    payloads = _payloads(ref, rng) + RAW
    accepted = 0
    for payload in payloads:
        want = _outcome(ref_parse, ref, payload)
        _same(want, _outcome(messages.parse, new, payload), payload)
        accepted += want[0] == "ok"
    assert accepted >= 20 and len(payloads) - accepted >= 100  # both kinds were exercised


def test_constructors_coerce_and_refuse_as_the_models_did() -> None:
    assert messages.Hello(job="j", agent="a", d="3", rows=0, smoothness=1, model="m",  # type: ignore[arg-type]
                          compressor="c").d == 3  # fmt: skip
    with pytest.raises(WireFormatError, match="hello: d: Input should be greater than 0"):
        messages.Hello(job="j", agent="a", d=0, rows=0, smoothness=1.0, model="m", compressor="c")
    with pytest.raises(WireFormatError, match="status: state"):
        messages.Status(state="asleep")  # type: ignore[arg-type]
    hello = messages.Hello(job="j", agent="a", d=3, rows=1, smoothness=0.5, model="m",
                           compressor="c", version=4, ctr=7)  # fmt: skip
    assert messages.Hello.from_dict(hello.to_dict()) == hello  # the checkpoint's round trip
    assert hello.to_dict() == Hello.model_validate_json(messages.dump(hello)).model_dump()


def test_messages_import_no_pydantic() -> None:
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(messages))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(n.split(".")[0] == "pydantic" for n in names)
