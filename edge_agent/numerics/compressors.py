"""Compressors: what an agent sends instead of its full gradient.

Each compressor maps a vector ``g`` (d float64 entries) and a level ``T`` to an
:class:`Update` whose reconstruction ``u = update.to_dense()`` is *pre-scaled* so that the
aggregator always steps ``x <- x - (1/L) * mean_i(u_i)`` (docs/algorithm.md derives each gain):

=========  =======================================  =====================================
name       sends                                    reconstruction u
=========  =======================================  =====================================
dense      all d values                             g
topk       T indices + T values                     g on the T largest-magnitude entries
signtopk   T indices + T sign bits + one scale s    s * sign(g_i) on the top-T entries,
                                                    s = A1(T) / T
randk      sampled indices + values                 rho * g_i / p_i on sampled entries
=========  =======================================  =====================================

Values are rounded to the wire dtype (float32 by default) *inside* the Update, so what the
agent keeps (error-feedback memories, EF21 state) is bit-for-bit what the aggregator decodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from edge_agent.errors import lookup
from edge_agent.numerics.stochastic import variance_scale

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

ValueDtype = Literal["float32", "float16", "float64"]
Semantics = Literal["plain", "ef", "ef21", "dir", "local"]
VALUE_DTYPES: dict[str, np.dtype[np.floating]] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "float64": np.dtype("<f8"),
}
#: wire code = position (docs/wire-format.md section 3.2); never renumbered
SEMANTICS: tuple[Semantics, ...] = ("plain", "ef", "ef21", "dir", "local")


@dataclass(frozen=True, eq=False)
class Update:
    """A compressed update as it travels on the wire.

    ``indices`` are sorted ascending and distinct (``None`` for dense). ``values`` hold the
    T transmitted values in the wire dtype; for ``signtopk`` they are the signs (+1/-1, int8)
    and ``scale`` is the common magnitude s. ``semantics`` says how the aggregator applies
    it: ``plain`` (a gradient estimate), ``ef`` (residual error feedback), ``ef21``
    (a compressed *change* c_i of the agent's EF21 state) or ``dir`` (a directional step
    already scaled so that the aggregator's ``1/L`` step moves ``x`` by ``t q``;
    docs/curvature.md) or ``local`` (local training: the change ``x_i - y`` of the
    agent's local model from the anchor, docs/algorithm.md "Local training").
    """

    compressor: str
    d: int
    indices: IntArray | None
    values: npt.NDArray[np.generic]
    scale: float | None = None
    semantics: Semantics = "plain"

    @property
    def t(self) -> int:
        """Number of transmitted entries (d for dense)."""
        return self.d if self.indices is None else int(self.indices.size)

    def dense_values(self) -> FloatArray:
        """The T reconstructed values as float64 (sign times scale for signtopk)."""
        if self.scale is not None:
            return np.asarray(self.values, dtype=np.float64) * self.scale
        return np.asarray(self.values, dtype=np.float64)

    def to_dense(self) -> FloatArray:
        """The reconstruction u as a length-d float64 vector."""
        out = np.zeros(self.d, dtype=np.float64)
        self.add_to(out)
        return out

    def add_to(self, out: FloatArray, weight: float = 1.0) -> None:
        """``out += weight * u`` in place, touching only the T transmitted entries."""
        vals = self.dense_values()
        if weight != 1.0:
            vals = vals * weight
        if self.indices is None:
            out += vals
        else:
            out[self.indices] += vals


def top_indices(absg: FloatArray, t: int) -> IntArray:
    """Indices of the t largest entries of ``absg``, sorted ascending.

    The set is canonical, that of ``np.argsort(-absg, kind="stable")[:t]``: among entries
    equal to the t-th largest magnitude the lowest indices are taken. A partition alone
    would pick any of them, and which depends on the array it partitions, so two exact
    selectors (or two versions of one) could send different, equally valid updates."""
    d = absg.size
    if t >= d:
        return np.arange(d, dtype=np.int64)
    if t <= 0:
        return np.zeros(0, dtype=np.int64)
    tau = np.partition(absg, d - t)[d - t]  # the t-th largest magnitude
    above = absg > tau
    need = t - int(np.count_nonzero(above))
    if need:
        above[np.flatnonzero(absg == tau)[:need]] = True
    return np.flatnonzero(above).astype(np.int64, copy=False)


def _round(values: FloatArray, dtype: ValueDtype) -> npt.NDArray[np.floating]:
    dt = VALUE_DTYPES[dtype]
    if dt.itemsize < 8:
        finfo = np.finfo(dt)
        big = np.abs(values) > finfo.max
        if big.any():
            raise ValueError(
                f"value {float(np.abs(values[big]).max()):.3g} exceeds the {dtype} range "
                f"({float(finfo.max):.3g}); use value_dtype='float32' or 'float64'"
            )
    return values.astype(dt)


def _check(g: FloatArray, t: int) -> None:
    if g.ndim != 1:
        raise ValueError(f"gradient must be a 1-D array, got shape {g.shape}")
    if not 0 <= t <= g.size:
        raise ValueError(f"T must be in [0, d={g.size}], got {t}")


def compress_dense(
    g: FloatArray,
    t: int,
    *,
    value_dtype: ValueDtype,
    rng: np.random.Generator | None,
    order: IntArray | None,
) -> Update:
    """Send every entry; T is ignored (always d)."""
    return Update("dense", g.size, None, _round(g, value_dtype))


def compress_topk(
    g: FloatArray,
    t: int,
    *,
    value_dtype: ValueDtype,
    rng: np.random.Generator | None,
    order: IntArray | None,
) -> Update:
    """Deterministic sparsification: g on its t largest-magnitude entries."""
    _check(g, t)
    idx = order if order is not None else top_indices(np.abs(g), t)
    return Update("topk", g.size, idx, _round(g[idx], value_dtype))


def compress_signtopk(
    g: FloatArray,
    t: int,
    *,
    value_dtype: ValueDtype,
    rng: np.random.Generator | None,
    order: IntArray | None,
) -> Update:
    """Sparsification + 1-bit quantisation: s * sign(g_i) on the top-t entries, s = A1(t)/t.

    sign(0) is taken as +1 (the wire has one bit per entry).
    """
    _check(g, t)
    idx = order if order is not None else top_indices(np.abs(g), t)
    if idx.size == 0:
        return Update("signtopk", g.size, idx, np.zeros(0, dtype=np.int8), scale=0.0)
    sel = g[idx]
    s = float(_round(np.array([np.abs(sel).sum() / idx.size]), value_dtype)[0])
    signs = np.where(sel < 0, -1, 1).astype(np.int8)
    return Update("signtopk", g.size, idx, signs, scale=s)


def randk_probabilities(absg: FloatArray, t: float) -> tuple[FloatArray, float]:
    """Water-filling keep-probabilities p_i = min(1, lam*|g_i|) with sum p_i = t.

    Returns (p, V) where V = sum g_i^2 / p_i over entries with p_i > 0: the variance term
    in randk's expected gain ||g||^4 / (2 L V) (docs/algorithm.md). Requires 0 < t <= nnz(g).
    """
    mags = np.sort(absg)[::-1]
    nnz = int(np.count_nonzero(mags))
    t = min(float(t), float(nnz))
    tail = np.concatenate([np.cumsum(mags[::-1])[::-1], [0.0]])  # tail[r] = sum_{i>=r} mags[i]
    # c[r] = r + tail[r] / mags[r]: entry r (0-based) is unsaturated iff t < c[r]
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.arange(nnz) + tail[:nnz] / mags[:nnz]
    r = int(np.searchsorted(c, t, side="right"))
    r = min(r, nnz)
    rest = tail[r]
    thr = mags[r - 1] if r > 0 else np.inf
    # (t - r) * |g_i| / rest rather than lam * |g_i|: lam overflows for tiny (subnormal) tails
    with np.errstate(over="ignore"):
        scaled = (t - r) * absg / rest if rest > 0 else np.zeros_like(absg)
    p = np.where(absg >= thr, 1.0, np.minimum(1.0, scaled))
    a2_r = float(np.einsum("i,i->", mags[:r], mags[:r]))
    v = a2_r + (rest * rest / (t - r) if t > r else 0.0)
    return p, v


def compress_randk(
    g: FloatArray,
    t: int,
    *,
    value_dtype: ValueDtype,
    rng: np.random.Generator | None,
    order: IntArray | None,
    noise: float = 0.0,
) -> Update:
    """Stochastic sparsification (Wangni et al. 2018) with expected size t, pre-scaled by
    rho = |g|^2 / V(T). ``noise``: the total variance of a minibatch ``g`` (the trace of its
    covariance); rho is then ``max(|g|^2 - noise, 0) / V(T)``, the scale that maximises the
    expected decrease of the noiseless gradient (edge_agent.numerics.stochastic)."""
    _check(g, t)
    if rng is None:
        raise ValueError("randk draws random numbers: pass rng=np.random.default_rng(seed)")
    absg = np.abs(g)
    norm2 = float(np.einsum("i,i->", g, g))
    if t == 0 or norm2 == 0.0:
        return Update(
            "randk",
            g.size,
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=VALUE_DTYPES[value_dtype]),
        )
    p, v = randk_probabilities(absg, t)
    keep = np.flatnonzero(rng.random(g.size) < p)
    rho = variance_scale(norm2, noise, v)
    return Update(
        "randk", g.size, keep.astype(np.int64), _round(rho * g[keep] / p[keep], value_dtype)
    )


Compressor = Callable[..., Update]
COMPRESSORS: dict[str, Compressor] = {
    "dense": compress_dense,
    "topk": compress_topk,
    "signtopk": compress_signtopk,
    "randk": compress_randk,
}
# Stable numeric ids for the wire (docs/wire-format.md); never renumber.
COMPRESSOR_IDS: dict[str, int] = {"dense": 0, "topk": 1, "signtopk": 2, "randk": 3}


def compress(
    g: npt.ArrayLike,
    name: str,
    t: int,
    *,
    rng: np.random.Generator | None = None,
    value_dtype: ValueDtype = "float32",
    order: IntArray | None = None,
    noise: float = 0.0,
) -> Update:
    """Compress ``g`` with the named compressor at level ``t``.

    ``order`` optionally passes the already-known sorted indices of the top-t entries
    (the selector finds them) to skip a second partition. ``rng`` is required by randk.
    ``noise``: randk only, the total variance of a minibatch ``g`` (its scale shrinks).
    """
    fn = lookup(COMPRESSORS, name, "compressor")
    if value_dtype not in VALUE_DTYPES:
        raise ValueError(f"value_dtype must be one of {sorted(VALUE_DTYPES)}, got {value_dtype!r}")
    arr = np.ascontiguousarray(g, dtype=np.float64)
    if not np.isfinite(arr).all():
        raise ValueError("gradient has non-finite entries (nan or inf); refusing to send it")
    if name == "randk":
        return compress_randk(
            arr, int(t), value_dtype=value_dtype, rng=rng, order=order, noise=noise
        )
    return fn(arr, int(t), value_dtype=value_dtype, rng=rng, order=order)
