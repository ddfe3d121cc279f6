"""cat-edge device side: communication-aware adaptive tuning (CAT) for IoT training.

Public API::

    import numpy as np
    import edge_agent as ea
    p = ea.resolve_profile("lorawan_eu868_dr5_sf7")  # a shipped name, or a path to a JSON file
    g = np.random.default_rng(0).standard_normal(1000)  # a local gradient
    t = ea.select_t(g, "topk", p, job="demo", agent="pi-01")
    u = ea.compress(g, "topk", t)
    blob = ea.encode(u, job="demo", agent="pi-01", round=3, seq=0)
    header, u2 = ea.decode(blob)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_agent.errors import (
        CatEdgeError,
        DataError,
        ProfileError,
        TransportError,
        UnknownNameError,
        WireFormatError,
    )
    from edge_agent.links.catalog import list_profiles, load_profile, resolve_profile
    from edge_agent.links.profiles import CostProfile
    from edge_agent.numerics.compressors import COMPRESSORS, Update, compress
    from edge_agent.numerics.feedback import EF21State, ResidualMemory
    from edge_agent.numerics.selection import parse_policy, select_t
    from edge_agent.protocol.wire import (
        Delta,
        Snapshot,
        UpdateHeader,
        decode,
        decode_model,
        encode,
        encode_delta,
        encode_snapshot,
        encoded_size,
    )

#: Where each public name lives. The package imports none of them up front (PEP 562): a
#: device that runs ``edge_agent.agent.loop`` loads only the modules its run needs (not the
#: aggregator's helpers), while ``import edge_agent as ea; ea.select_t`` still works.
_HOME: dict[str, str] = {
    **dict.fromkeys(
        (
            "CatEdgeError",
            "DataError",
            "ProfileError",
            "TransportError",
            "UnknownNameError",
            "WireFormatError",
        ),
        "edge_agent.errors",
    ),
    "CostProfile": "edge_agent.links.profiles",
    **dict.fromkeys(
        ("list_profiles", "load_profile", "resolve_profile"), "edge_agent.links.catalog"
    ),
    **dict.fromkeys(("COMPRESSORS", "Update", "compress"), "edge_agent.numerics.compressors"),
    **dict.fromkeys(("EF21State", "ResidualMemory"), "edge_agent.numerics.feedback"),
    **dict.fromkeys(("parse_policy", "select_t"), "edge_agent.numerics.selection"),
    **dict.fromkeys(
        (
            "Delta",
            "Snapshot",
            "UpdateHeader",
            "decode",
            "decode_model",
            "encode",
            "encode_delta",
            "encode_snapshot",
            "encoded_size",
        ),
        "edge_agent.protocol.wire",
    ),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'edge_agent' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # imported once: later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


__version__ = "0.1.0"

__all__ = [
    "COMPRESSORS",
    "CatEdgeError",
    "CostProfile",
    "DataError",
    "Delta",
    "EF21State",
    "ProfileError",
    "ResidualMemory",
    "Snapshot",
    "TransportError",
    "UnknownNameError",
    "Update",
    "UpdateHeader",
    "WireFormatError",
    "__version__",
    "compress",
    "decode",
    "decode_model",
    "encode",
    "encode_delta",
    "encode_snapshot",
    "encoded_size",
    "list_profiles",
    "load_profile",
    "parse_policy",
    "resolve_profile",
    "select_t",
]
