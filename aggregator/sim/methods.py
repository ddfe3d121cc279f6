"""The method grammar of ``aggregator simulate --methods``: how each agent trains.

A method is a compressor, a policy that picks T (how many entries each update carries), an
error-feedback scheme and the curvature the step uses, all of them the agent's own
(:class:`edge_agent.agent.loop.AgentConfig`).

``+ef:model`` is classic error feedback with the residual kept in model units under the
stochastic step schedule (``--batch-size``; edge_agent.numerics.stochastic.StepRatio);
``+ef`` keeps it in gradient units.

``+dir`` (``dense+dir``, ``cat-topk+dir``, ``cat-signtopk+dir``) runs the agents with
``curvature="directional"``: T priced with the curvature along the direction sent and the
update scaled to the best step along it (docs/curvature.md). It is defined for dense and
for CAT with topk or signtopk, without error feedback: ``+ef+dir`` and ``+ef21+dir`` are
refused, because the bound prices the gradient itself, not an error-feedback memory, and a
``dir`` update (family *mean*, step exactly 1/L) never shares a job with EF21.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from edge_agent.agent.loop import CurvatureName, FeedbackName
from edge_agent.errors import CatEdgeError
from edge_agent.numerics.compressors import COMPRESSOR_IDS
from edge_agent.numerics.selection import parse_policy


@dataclass(frozen=True)
class Method:
    """One way of training: compressor, policy for T, error feedback, curvature (``spec``
    as given)."""

    spec: str
    compressor: str
    policy: str
    feedback: FeedbackName
    curvature: CurvatureName = "global"
    #: ``+ef:model``: the classic-EF residual in model units (AgentConfig.schedule_t0)
    ef_model_units: bool = False


_FEEDBACKS: Final[dict[str, FeedbackName]] = {"": "none", "ef": "ef", "ef21": "ef21"}


def _compressor_and_policy(spec: str, head: str, arg: str) -> tuple[str, str]:
    """``topk`` + ``64`` -> (topk, fixed:64); ``hybrid-topk`` + ``200`` -> (topk, hybrid:200)."""
    if head in COMPRESSOR_IDS and head != "dense":
        return head, f"fixed:{arg}"
    pol, dash, compressor = head.partition("-")
    if not dash or compressor not in COMPRESSOR_IDS or compressor == "dense":
        raise ValueError(
            f"method {spec!r}: expected dense, <compressor>:T or <policy>-<compressor>[:arg] "
            f"with compressor in topk, signtopk, randk (e.g. cat-topk, hybrid-topk:200)"
        )
    return compressor, f"{pol}:{arg}" if arg else pol


def _suffixes(spec: str, parts: list[str]) -> tuple[FeedbackName, CurvatureName]:
    """The ``+`` suffixes: at most one error feedback, then optionally ``dir``."""
    curvature: CurvatureName = "global"
    if parts and parts[-1] == "dir":
        curvature = "directional"
        parts = parts[:-1]
    if len(parts) > 1 or (parts and parts[0] not in _FEEDBACKS):
        raise ValueError(
            f"method {spec!r}: unknown error feedback or suffix '+{'+'.join(parts)}'; "
            "use +ef, +ef:model, +ef21 and/or +dir"
        )
    feedback = _FEEDBACKS[parts[0]] if parts else "none"
    if curvature == "directional" and feedback != "none":
        raise ValueError(
            f"method {spec!r}: +dir is not defined with error feedback (the directional bound "
            f"prices the gradient itself, and dir updates never share a job with EF21); "
            f"drop +{parts[0]} or +dir"
        )
    return feedback, curvature


def parse_method(spec: str) -> Method:
    """``dense`` | ``<compressor>:T`` (static T) | ``<policy>-<compressor>[:arg]``, then
    ``+ef`` | ``+ef:model`` | ``+ef21`` | ``+dir``.

    Policies: ``cat``, ``dynamic``, ``hybrid`` (``:S``, default 200), ``fixed`` (``:T``);
    compressors: ``topk``, ``signtopk``, ``randk`` (and ``dense``). Examples: ``topk:64``,
    ``cat-topk``, ``dynamic-signtopk``, ``hybrid-topk:200``, ``cat-topk+ef21``,
    ``cat-signtopk+dir``, ``dense+dir`` (``+dir``: dense, or cat with topk/signtopk, no error
    feedback). Raises ValueError naming the spec and what was expected.
    """
    text = spec.strip()
    base, *parts = text.split("+")
    model_units = "ef:model" in parts
    parts = ["ef" if p == "ef:model" else p for p in parts]
    feedback, curvature = _suffixes(spec, parts)
    head, _, arg = base.partition(":")
    if head == "dense" and not arg:
        return Method(text, "dense", "cat", feedback, curvature, model_units)
    compressor, policy = _compressor_and_policy(spec, head, arg)
    if curvature == "directional" and (policy != "cat" or compressor == "randk"):
        raise ValueError(
            f"method {spec!r}: +dir picks T with CAT's directional gain; use dense+dir, "
            f"cat-topk+dir or cat-signtopk+dir"
        )
    try:
        parse_policy(policy)
    except (ValueError, CatEdgeError) as exc:
        raise ValueError(f"method {spec!r}: {exc}") from None
    if compressor == "randk" and policy.partition(":")[0] == "dynamic":
        raise ValueError(f"method {spec!r}: the dynamic rule is defined for topk/signtopk")
    return Method(text, compressor, policy, feedback, curvature, model_units)


__all__ = ["Method", "parse_method"]
