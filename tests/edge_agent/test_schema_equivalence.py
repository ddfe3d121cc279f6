"""The device's cost profiles and job info are plain dataclasses (issue 17): they accept
exactly what the pydantic models did, reject the same inputs with the same messages and
write the same JSON. The pydantic models are kept as the reference in pydantic_reference.py;
both are fed every shipped profile, each of them altered field by field, and hand-made
invalid inputs."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pydantic_reference as ref
import pytest

from edge_agent.errors import ProfileError, WireFormatError
from edge_agent.links.profiles import parse_profile, profile_to_json
from edge_agent.protocol import jobinfo

REPO_PROFILES = Path(__file__).resolve().parents[2] / "cost_profiles"
SHIPPED = sorted(REPO_PROFILES.glob("*.json"))
#: what a field is set to in the altered copies: JSON's types, numbers at and past the
#: bounds, numeric strings (pydantic's lax mode takes some), non-finite numbers
VALUES: tuple[object, ...] = (
    None, True, False, 0, 1, -1, 7, 8, 51, 1.5, 0.5, 1.0, -0.0, 1e-9, 1e300, 2**70,
    "1", "0", "-1", "x", "", " 2 ", "1.0", "1.5", "1e3", "1_000", "inf", "nan",
    math.inf, -math.inf, math.nan, [], ["a"], [1], ("b",), {}, {"bits": 1}, {"watts": 1},
    {"bits": -1}, {"bits": "x"}, {"a": 1, "b": 2}, "bits", "airtime_s", "packet",
    "measured", "continuous", "slotted", "ok name", np.int64(3), np.float64(0.25),
)  # fmt: skip
MEASURED: dict[str, Any] = {
    "kind": "measured",
    "name": "meas",
    "description": "calibrated",
    "objective": "energy_j",
    "duty_cycle": 0.5,
    "points": [
        {"size_bytes": 10, "energy_j": 1.0, "airtime_s": 0.1},
        {"size_bytes": 20, "energy_j": 2.0, "airtime_s": 0.2},
        {"size_bytes": 40, "energy_j": 2.5, "airtime_s": 0.2},
    ],
}


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _outcome(parse: Callable[[Any], Any], dump: Callable[[Any], str], data: Any) -> tuple[str, str]:
    try:
        return "ok", dump(parse(data))
    except ProfileError as exc:
        return "error", str(exc)


def _new(data: Any) -> tuple[str, str]:
    return _outcome(lambda d: parse_profile(d, "p.json"), profile_to_json, data)


def _old(data: Any) -> tuple[str, str]:
    return _outcome(lambda d: ref.parse_profile(d, "p.json"), ref.profile_to_json, data)


def _paths(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key or index under ``node`` (dicts and lists), depth first."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        yield (*path, key)
        if isinstance(value, dict | list) and len(path) < 4:
            yield from _paths(value, (*path, key))


def _with(data: dict[str, Any], path: tuple[Any, ...], value: object) -> dict[str, Any]:
    out = copy.deepcopy(data)
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _without(data: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return out


def _altered(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``data`` with one field set to each of VALUES, removed, or joined by an unknown one."""
    yield "unknown top-level field", {**data, "colour": "red"}
    for path in _paths(data):
        for value in VALUES:
            yield f"{path} = {value!r}", _with(data, path, value)
        parent: Any = data
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict):
            yield f"{path} removed", _without(data, path)
            if isinstance(parent[path[-1]], dict):
                yield f"{path} + colour", _with(data, (*path, "colour"), "red")


def _same(data: Any) -> tuple[str, str]:
    new, old = _new(data), _old(data)
    assert new == old
    return new


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_profile_gives_the_same_json(path: Path) -> None:
    status, text = _same(_load(path))
    assert status == "ok"
    assert json.loads(text)["name"] == path.stem


#: one profile of each kind and shape: a unicast packet link, a multicast group (class B:
#: slotted), an affine fit, measured points
ALTERED = ["lorawan_eu868_dr0_sf12", "lorawan_eu868_dr0_sf12_mcast_b_dr3", "zmq_tcp_affine_example"]


@pytest.mark.parametrize("stem", [*ALTERED, "measured"])
def test_profiles_altered_field_by_field_are_judged_the_same(stem: str) -> None:
    data = MEASURED if stem == "measured" else _load(REPO_PROFILES / f"{stem}.json")
    outcomes = {"ok": 0, "error": 0}
    for label, altered in _altered(data):
        new, old = _new(altered), _old(altered)
        assert new == old, label
        outcomes[new[0]] += 1
    # the alterations exercise both sides: many are accepted (lax numbers), most refused
    assert outcomes["ok"] > 50 and outcomes["error"] > 500, outcomes


PACKET: dict[str, Any] = {
    "kind": "packet",
    "name": "lora",
    "description": "test link",
    "objective": "airtime_s",
    "max_payload_bytes": 51,
    "per_packet": {"bits": 104, "packets": 1, "airtime_s": 1.155},
    "per_byte": {"bits": 8, "airtime_s": 0.03277},
}
INVALID: list[object] = [
    [1, 2],
    "text",
    {},
    {"kind": "magic"},
    {"kind": 5},
    {"kind": None},
    {"kind": ["packet"]},
    {"kind": "packet"},
    {**PACKET, "objective": "energy_j"},
    {**PACKET, "objective": "bits", "duty_cycle": 0.01, "per_packet": {}, "per_byte": {"bits": 8}},
    {**PACKET, "per_byte": {"watts": -1, "bits": "x", 3: 1}},
    {**PACKET, "max_payload_bytes": 0, "name": "bad name", "zz": 1, "yy": 2},
    {**PACKET, "downlink": {"max_payload_bytes": 0, "shared": {"group": 1}}},
    {**PACKET, "downlink": {"shared": {"group": "g", "delivery": "slotted"}}},
    {**PACKET, "downlink": 5},
    {**MEASURED, "points": []},
    {**MEASURED, "points": [{"size_bytes": 1, "bits": 1}]},
    {**MEASURED, "points": [{"size_bytes": 1, "bits": 1}, 7, {"size_bytes": 2, "zz": 1}]},
    {**MEASURED, "points": [{"size_bytes": 1, "energy_j": 1}, {"size_bytes": 2, "bits": 2}]},
    {**MEASURED, "points": [{"size_bytes": 5, "energy_j": 1}, {"size_bytes": 5, "energy_j": 2}]},
    {**MEASURED, "points": [{"size_bytes": 1, "energy_j": 3}, {"size_bytes": 2, "energy_j": 2}]},
    {**MEASURED, "points": {"size_bytes": 1}},
    {"kind": "affine", "name": "a", "description": "d", "objective": "bits", "coefficients": {}},
    {
        "kind": "affine",
        "name": "a",
        "description": "d",
        "objective": "bits",
        "coefficients": {"bits": {"a": -1, "c": 2}, "watts": {"a": 1, "b": 1}, "energy_j": 3},
    },
]


@pytest.mark.parametrize("data", INVALID, ids=range(len(INVALID)))
def test_hand_made_invalid_profiles_get_the_same_message(data: object) -> None:
    status, message = _same(data)
    assert status == "error" and message.startswith("profile p.json: ")


# --- job info ------------------------------------------------------------------------

JOB: dict[str, Any] = {
    "type": "job",
    "job": "job-1",
    "d": 47236,
    "model": "logreg",
    "feedback": "ef21",
    "family": "ef21",
    "compressors": ["dense", "topk", "randk"],
    "batch_size": 0.25,
}


def _job(parse: Callable[[dict[str, Any]], Any], data: dict[str, Any]) -> tuple[str, object]:
    try:
        info = parse(data)
    except (ValueError, WireFormatError) as exc:
        return "error", str(exc).removeprefix("job info: ")
    return "ok", (info.dump(), tuple(getattr(info, f) for f in ref.JobInfo.model_fields))


def _job_new(data: dict[str, Any]) -> tuple[str, object]:
    return _job(lambda d: jobinfo.parse(json.dumps(d).encode()), data)


@pytest.mark.parametrize("base", [JOB, {k: v for k, v in JOB.items() if k != "batch_size"}])
def test_job_info_altered_field_by_field_is_judged_the_same(base: dict[str, Any]) -> None:
    cases = [("as is", base), ("newer field", {**base, "colour": "red"})]
    for path in _paths(base):
        if path == ("type",):
            continue  # parse() reads only type "job" as job info
        cases += [(f"{path} = {v!r}", _with(base, path, v)) for v in VALUES if _json_ok(v)]
        if len(path) == 1:
            cases.append((f"{path} removed", _without(base, path)))
    outcomes = {"ok": 0, "error": 0}
    for label, data in cases:
        new, old = _job_new(data), _job(ref.parse_job_info, json.loads(json.dumps(data)))
        assert new == old, label
        outcomes[new[0]] += 1
    assert outcomes["ok"] > 20 and outcomes["error"] > 100, outcomes


def _json_ok(value: object) -> bool:
    """Values a JSON message can carry (numpy scalars cannot)."""
    try:
        json.dumps(value, allow_nan=True)
    except TypeError:
        return False
    return True


def test_job_info_built_directly_checks_its_fields_as_pydantic_did() -> None:
    fields: dict[str, Any] = {**JOB, "compressors": ("topk",)}
    assert jobinfo.JobInfo(**fields).dump() == ref.JobInfo(**fields).dump()
    for bad in ({"d": 0}, {"job": "a b"}, {"feedback": "sometimes"}, {"batch_size": -1}):
        with pytest.raises(ValueError) as new:
            jobinfo.JobInfo(**{**fields, **bad})
        with pytest.raises(ValueError) as old:
            ref.JobInfo(**{**fields, **bad})
        assert type(new.value).__name__ == "Invalid"
        (field,) = bad
        assert field in str(new.value) and field in str(old.value)
