"""The method grammar of ``aggregator simulate --methods``: how each agent trains.

A method is a compressor, a policy that picks T (how many entries each update carries) and
an error-feedback scheme, all of them the agent's own (:class:`edge_agent.agent.AgentConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from edge_agent.agent import FeedbackName
from edge_agent.compressors import COMPRESSOR_IDS
from edge_agent.errors import CatEdgeError
from edge_agent.selection import parse_policy


@dataclass(frozen=True)
class Method:
    """One way of training: compressor, policy for T, error feedback (``spec`` as given)."""

    spec: str
    compressor: str
    policy: str
    feedback: FeedbackName


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


def parse_method(spec: str) -> Method:
    """``dense`` | ``<compressor>:T`` (static T) | ``<policy>-<compressor>[:arg]``, + ``+ef|+ef21``.

    Policies: ``cat``, ``dynamic``, ``hybrid`` (``:S``, default 200), ``fixed`` (``:T``);
    compressors: ``topk``, ``signtopk``, ``randk`` (and ``dense``). Examples: ``topk:64``,
    ``cat-topk``, ``dynamic-signtopk``, ``hybrid-topk:200``, ``cat-topk+ef21``. Raises
    ValueError naming the spec and what was expected.
    """
    text = spec.strip()
    base, _, fb = text.partition("+")
    if fb not in _FEEDBACKS:
        raise ValueError(f"method {spec!r}: unknown error feedback '+{fb}'; use +ef or +ef21")
    feedback = _FEEDBACKS[fb]
    head, _, arg = base.partition(":")
    if head == "dense" and not arg:
        return Method(text, "dense", "cat", feedback)
    compressor, policy = _compressor_and_policy(spec, head, arg)
    try:
        parse_policy(policy)
    except (ValueError, CatEdgeError) as exc:
        raise ValueError(f"method {spec!r}: {exc}") from None
    if compressor == "randk" and policy.partition(":")[0] == "dynamic":
        raise ValueError(f"method {spec!r}: the dynamic rule is defined for topk/signtopk")
    return Method(text, compressor, policy, feedback)


__all__ = ["Method", "parse_method"]
