"""What every method is measured on: the data, the model, ``f*``, and the fleet of shards.

A :class:`Problem` is built once per ``aggregator simulate`` run; a :class:`Fleet` once per
(agents, profiles) case, and every method of the case trains on the same fleet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aggregator.engine.downlink.broadcast import network_of
from edge_agent.data import Dataset, load_dataset, make_rcv1_like, split_shards
from edge_agent.links.catalog import resolve_profile
from edge_agent.links.profiles import CostProfile
from edge_agent.numerics.models import Model, make_model
from edge_agent.numerics.optimum import solve_optimum


@dataclass(frozen=True)
class Problem:
    """The data, the model, and the reference values every method is measured against.

    ``f_star``: the optimum of the regularised objective on all the data (L-BFGS);
    ``f0``: the objective at the model's initial point (``f0 > f_star``).
    """

    name: str
    model: Model
    data: Dataset
    f_star: float
    f0: float
    split: str
    seed: int


@dataclass(frozen=True)
class Fleet:
    """N agents: shards (equal sizes, +-1 row), their link profiles and local smoothness."""

    shards: tuple[Dataset, ...]
    profiles: tuple[CostProfile, ...]
    smoothness: tuple[float, ...]

    @property
    def agents(self) -> int:
        return len(self.shards)

    @property
    def profile_label(self) -> str:
        names = list(dict.fromkeys(p.name for p in self.profiles))
        return names[0] if len(names) == 1 else "mixed:" + ",".join(names)

    @property
    def label(self) -> str:
        return f"{self.agents} agent{'s' if self.agents != 1 else ''}, {self.profile_label}"


def nonzeros(data: Dataset) -> int:
    """The entries a gradient over every row of ``data`` reads: the sparse matrix's stored
    entries, every entry of a dense one."""
    x = data.X
    return int(x.size) if isinstance(x, np.ndarray) else int(x.nnz)


def _load_or_generate(
    data_path: str | None, rows: int, features: int, seed: int
) -> tuple[Dataset, str]:
    if data_path is not None:
        return load_dataset(data_path), Path(data_path).name
    data = make_rcv1_like(rows, features, rng=np.random.default_rng(seed))
    return data, f"rcv1-like(rows={rows}, d={features}, seed={seed})"


def _class_labels(data: Dataset, model_kind: str) -> tuple[Dataset, int]:
    """Softmax needs labels 0..C-1: relabel in sorted order. Returns (data, classes)."""
    if model_kind != "softmax":
        return data, 2
    labels = np.unique(data.y)
    if not np.array_equal(labels, np.arange(labels.size)):
        data = Dataset(data.X, np.searchsorted(labels, data.y).astype(np.float64))
    return data, max(2, int(labels.size))


def build_problem(
    *,
    data_path: str | None,
    rows: int,
    features: int,
    seed: int,
    model_kind: str,
    l2: float,
    split: str,
    optimum_tol: float,
) -> Problem:
    """Load ``data_path`` (LIBSVM or .npz) or generate an RCV1-like set of ``rows`` x
    ``features``, build the model, solve for ``f*``. ValueError if ``f(x0) <= f*``."""
    data, name = _load_or_generate(data_path, rows, features, seed)
    data, n_classes = _class_labels(data, model_kind)
    model = make_model(model_kind, n_features=data.n_features, n_classes=n_classes, l2=l2)
    _, f_star = solve_optimum(model, data, tol=optimum_tol, max_iter=20_000)
    f0 = model.loss(model.initial_point(), data)
    if not f0 > f_star:
        raise ValueError(f"f(x0) = {f0!r} is not above f* = {f_star!r}: nothing to optimise")
    return Problem(name, model, data, f_star, f0, split, seed)


def agent_seed(seed: int, index: int) -> int:
    """The seed of agent ``index`` (its AgentConfig.seed: RNG of randk and of its L estimate)."""
    return seed * 1_000_003 + index


def on_group(profile: CostProfile, group: CostProfile) -> CostProfile:
    """``profile`` with ``group``'s shared downlink (``downlink.shared``), uplink fair-use cap
    and uplink sub-bands when both are the same technology in the same region (the first
    two parts of their names, e.g. ``lorawan_eu868``) and ``profile`` has a unicast
    downlink; else ``profile`` itself.
    The result is named ``<profile>.<group>``."""
    shared = group.shared_downlink
    if shared is None:
        raise ValueError(f"--multicast {group.name}: that profile has no downlink.shared part")
    if profile.downlink is None or network_of(profile.name) != network_of(group.name):
        return profile
    if profile.shared_downlink is not None:
        return profile
    down = dataclasses.replace(profile.downlink, shared=shared)
    # the group's network server is the group profile's (a private one, which a multicast
    # group needs: docs/multicast.md): its fair-use cap (none) and its channel plan (the
    # sub-bands its uplink channels lie in) replace the member's own
    bands = profile.duty_cycle_bands if profile.duty_cycle is None else group.duty_cycle_bands
    return dataclasses.replace(profile, name=f"{profile.name}.{group.name}", downlink=down,
                               uplink_airtime_per_day_s=group.uplink_airtime_per_day_s,
                               duty_cycle_bands=bands)  # fmt: skip


def build_fleet(
    problem: Problem,
    agents: int,
    profile_names: Sequence[str],
    *,
    multicast: str | None = None,
) -> Fleet:
    """Split the data into ``agents`` shards; profiles are cycled over the agents.
    ``multicast``: a profile with a shared downlink; the members of its technology and
    region receive job-wide messages on it (:func:`on_group`)."""
    if agents < 1:
        raise ValueError(f"--agents must be >= 1, got {agents}")
    if not profile_names:
        raise ValueError("need at least one cost profile")
    cache = {name: resolve_profile(name) for name in dict.fromkeys(profile_names)}
    if multicast is not None:
        group = resolve_profile(multicast)
        cache = {name: on_group(p, group) for name, p in cache.items()}
    rng = np.random.default_rng([problem.seed, agents])
    shards = (
        split_shards(problem.data, agents, how=problem.split, rng=rng)
        if agents > 1
        else [problem.data]
    )
    profiles = tuple(cache[profile_names[i % len(profile_names)]] for i in range(agents))
    # The same estimate an Agent makes when it is not given one (same rng seed), computed
    # once per shard instead of once per method.
    smoothness = tuple(
        problem.model.smoothness(s, rng=np.random.default_rng(agent_seed(problem.seed, i)))
        for i, s in enumerate(shards)
    )
    return Fleet(tuple(shards), profiles, smoothness)


__all__ = [
    "Fleet",
    "Problem",
    "agent_seed",
    "build_fleet",
    "build_problem",
    "nonzeros",
    "on_group",
]
