"""CAT with the directional gain: price T with the curvature along the direction actually sent.

The classic CAT gain (:mod:`edge_agent.numerics.selection`) steps ``1/L`` along every update, ``L``
the global smoothness. Along a sparse or sign direction ``q`` the curvature is usually far
below ``L |q|^2``; with a guaranteed bound ``B(q) >= q^T Hess f(x) q`` (every ``x``,
:meth:`edge_agent.numerics.models.Model.directional_curvature`) the descent lemma along ``q`` gives

    f(x - t q) <= f(x) - t <g, q> + t^2 B(q) / 2,   best at  t = <g, q> / B(q),
    guaranteed decrease  <g, q>^2 / (2 B(q)).

For topk ``q_T`` is ``g`` on the top-T entries (``<g, q_T> = A2(T)``), for signtopk
``sign(g)`` there (``<g, q_T> = A1(T)``, the step sets the magnitude). :func:`select_directional`
returns the exact ``T* = argmax decrease(T) / cost(T)`` over ``[t_min, t_max]`` (ties: the
smallest T): ``B(q_T)`` for every prefix comes from one incremental pass over the columns of
the top ``t_max`` entries (:meth:`~edge_agent.numerics.models.Model.prefix_curvature`), and the price
is evaluated exactly, skipping only blocks of T that provably cannot hold the maximum.

:func:`scale_for_step` rescales an update so that the aggregator's usual step ``1/L`` moves
``x`` by ``t q``. The guarantee is per agent, for its own objective: the mean of several
agents' directional steps carries no joint guarantee (docs/curvature.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from edge_agent.data import Dataset
from edge_agent.numerics.compressors import VALUE_DTYPES, Update, ValueDtype
from edge_agent.numerics.models import CurvaturePass, Model
from edge_agent.numerics.selection import Price

__all__ = [
    "DIRECTIONAL_COMPRESSORS",
    "DirectionalSelection",
    "dense_curvature",
    "directional_step",
    "guaranteed_decrease",
    "prefix_decrease",
    "scale_for_step",
    "select_directional",
    "top_order",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DIRECTIONAL_COMPRESSORS: tuple[str, ...] = ("topk", "signtopk")
"""Compressors whose prefixes :func:`select_directional` prices (dense: :func:`dense_curvature`)."""

_BLOCK = 64  # T per block when pruning the pricing
_FIRST_CHUNK = 64  # top entries whose columns the pass looks at first
_GROWTH = 4  # chunk growth while a longer prefix may still win
_GRID = 1.03  # geometric step of the bound intervals beyond the entries seen
_SLACK = 1e-9  # relative slack on block bounds: rounding never drops a block that may win


@dataclass(frozen=True)
class DirectionalSelection:
    """The chosen T, its guaranteed decrease per unit of cost, and the direction's numbers.

    ``indices``: the top-T parameter indices, sorted ascending. ``gq = <g, q_T>``,
    ``qmq = B(q_T)`` (the curvature bound along ``q_T``); ``ratio = decrease / cost(T)``
    in objective units per cost unit (the classic :class:`~edge_agent.numerics.selection.Selection`
    ratio omits the common ``1/(2L)``, so the two are not on the same scale).
    """

    t: int
    ratio: float
    indices: IntArray
    gq: float
    qmq: float

    @property
    def step(self) -> float:
        """``t = <g, q_T> / B(q_T)``: how far to move along ``q_T``."""
        return directional_step(self.gq, self.qmq)

    @property
    def decrease(self) -> float:
        """``<g, q_T>^2 / (2 B(q_T))``: the guaranteed decrease of the step."""
        return guaranteed_decrease(self.gq, self.qmq)


def directional_step(gq: float, qmq: float) -> float:
    """The step ``t = <g, q> / B(q)`` that minimises the descent-lemma bound along ``q``.

    ``B(q) = 0`` happens only when ``l2 = 0`` and ``A q = 0``, where ``<g, q> = 0`` too
    (the gradient of the data term lies in the row space of ``A``): the step is then 0.
    """
    if qmq < 0.0 or not np.isfinite(qmq):
        raise ValueError(
            f"directional_step: the curvature bound must be finite and >= 0, got {qmq}"
        )
    return 0.0 if qmq == 0.0 else gq / qmq


def guaranteed_decrease(gq: float, qmq: float) -> float:
    """``<g, q>^2 / (2 B(q))``: how much the step ``directional_step`` lowers f at least."""
    if qmq < 0.0 or not np.isfinite(qmq):
        raise ValueError(
            f"guaranteed_decrease: the curvature bound must be finite and >= 0, got {qmq}"
        )
    return 0.0 if qmq == 0.0 else gq * gq / (2.0 * qmq)


def prefix_decrease(gq: FloatArray, qmq: FloatArray) -> FloatArray:
    """Elementwise ``gq^2 / (2 qmq)``, 0 where ``qmq = 0`` (see :func:`directional_step`)."""
    out = np.zeros_like(gq)
    pos = qmq > 0.0
    out[pos] = gq[pos] * gq[pos] / (2.0 * qmq[pos])
    return out


def top_order(absg: FloatArray, t_max: int) -> IntArray:
    """Indices of the ``t_max`` largest entries of ``absg``, largest first.

    The order is canonical, that of ``np.argsort(-absg, kind="stable")[:t_max]`` (equal
    magnitudes by ascending index), found with a partition plus a sort of ``t_max`` entries.
    """
    d = absg.size
    t_max = max(0, min(t_max, d))
    if 2 * t_max >= d:
        return np.argsort(-absg, kind="stable")[:t_max].astype(np.int64)
    part = np.argpartition(-absg, t_max - 1)[:t_max]
    tau = float(absg[part].min())  # the t_max-th largest magnitude
    above = np.flatnonzero(absg > tau)
    ties = np.flatnonzero(absg == tau)[: t_max - above.size]  # the stable sort keeps the first
    cand = np.concatenate((above, ties))
    return cand[np.lexsort((cand, -absg[cand]))].astype(np.int64)


def _direction_values(g_top: FloatArray, compressor: str) -> FloatArray:
    """The entries of ``q`` on the top set: ``g`` (topk) or ``sign(g)`` with sign(0) = +1."""
    if compressor == "topk":
        return g_top
    return np.where(g_top < 0.0, -1.0, 1.0)


def _best(gain: FloatArray, t_min: int, price: Price) -> tuple[int, float]:
    """Exact argmax of ``gain[T-1] / price(T)`` over ``T in [t_min, len(gain)]``, smallest T
    on ties.

    The cost is nondecreasing in T, so on a block ``[a, b]`` the ratio is at most
    ``max gain / cost(a)``. Blocks whose bound is below a ratio already priced (each
    block's best-gain T) cannot hold the maximum and are not priced T by T; the kept
    values are computed exactly as an exhaustive search computes them.
    """
    ts = np.arange(t_min, gain.size + 1, dtype=np.int64)
    g = gain[t_min - 1 :]
    if ts.size <= 4 * _BLOCK:
        ratio = g / price(ts)
        k = int(np.argmax(ratio))
        return int(ts[k]), float(ratio[k])
    n_blocks = -(-ts.size // _BLOCK)
    padded = np.full(n_blocks * _BLOCK, -np.inf)
    padded[: ts.size] = g
    blocks = padded.reshape(n_blocks, _BLOCK)
    first = np.arange(n_blocks, dtype=np.int64) * _BLOCK
    block_best = first + np.argmax(blocks, axis=1)
    known = float((g[block_best] / price(ts[block_best])).max())
    bound = blocks.max(axis=1) / price(ts[first])
    keep = np.flatnonzero(bound * (1.0 + _SLACK) >= known)
    pos = (first[keep][:, None] + np.arange(_BLOCK, dtype=np.int64)[None, :]).ravel()
    pos = pos[pos < ts.size]  # the last block may be short; positions stay ascending
    ratio = g[pos] / price(ts[pos])
    k = int(np.argmax(ratio))
    return int(ts[pos[k]]), float(ratio[k])


def select_directional(
    g: npt.ArrayLike,
    compressor: str,
    price: Price,
    model: Model,
    data: Dataset,
    *,
    t_min: int = 1,
    t_max: int | None = None,
) -> DirectionalSelection:
    """CAT's ``T*`` with the directional gain, exact over ``[t_min, t_max]`` (default all d).

    ``g``: the gradient of ``model`` on ``data`` (the agent's own rows; any point, the
    bound does not depend on it); ``price``: cost of an update of T entries, nondecreasing
    in T (:func:`~edge_agent.numerics.selection.make_price`).

    The pass runs over the columns of the top entries in growing chunks (64, then 4x),
    never beyond ``t_max``. It stops early when no longer prefix can win: every curvature
    bound is at least ``l2 |q|^2``, so beyond the ``k`` entries seen (all later magnitudes
    at most the k-th, ``tau``) the decrease is at most ``A2(T) / (2 l2)`` (topk), resp.
    ``A1(T)^2 / (2 l2 T)`` (signtopk), with ``A2``, ``A1`` bounded through ``tau`` and
    the totals; when that bound over the cost stays below the best ratio seen, the answer
    is final. With ``l2 = 0`` there is no such bound and the pass reaches ``t_max``.
    """
    arr = np.asarray(g, dtype=np.float64).reshape(-1)
    d = arr.size
    if compressor not in DIRECTIONAL_COMPRESSORS:
        raise ValueError(
            f"the directional gain is defined for {list(DIRECTIONAL_COMPRESSORS)}, got "
            f"{compressor!r}; for dense use dense_curvature"
        )
    if d != model.d:
        raise ValueError(f"gradient has {d} entries, the {model.kind} model has d={model.d}")
    if not np.isfinite(arr).all():
        raise ValueError("gradient has non-finite entries (nan or inf); cannot select T")
    t_max = d if t_max is None else min(t_max, d)
    if not 1 <= t_min <= t_max:
        raise ValueError(f"need 1 <= t_min <= t_max <= d={d}, got t_min={t_min}, t_max={t_max}")
    absg = np.abs(arr)
    total = float(np.einsum("i,i->", arr, arr)) if compressor == "topk" else float(absg.sum())
    curv = CurvaturePass(model, data)
    gains: list[FloatArray] = []  # g_i q_i of the entries seen, in order
    curvatures: list[FloatArray] = []  # B(q_T) for the prefixes seen
    seen = 0
    want = max(t_min, _FIRST_CHUNK)
    while True:
        k = min(want, t_max)
        order = top_order(absg, k)  # canonical, so it extends the previous order
        new = order[seen:]
        g_new = arr[new]
        q_new = _direction_values(g_new, compressor)
        gains.append(g_new * q_new)
        curvatures.append(curv.extend(new, q_new))
        seen = k
        gq = np.cumsum(np.concatenate(gains))  # A2(T) for topk, A1(T) for signtopk
        qmq = np.concatenate(curvatures)
        t, ratio = _best(prefix_decrease(gq, qmq), t_min, price)
        if k == t_max:
            break
        beyond = _beyond(
            compressor, float(gq[-1]), float(absg[order[-1]]), total, k, t_max, model.l2, price
        )
        if beyond <= ratio:
            break
        want *= _GROWTH
    return DirectionalSelection(
        t, ratio, np.sort(order[:t]).astype(np.int64), float(gq[t - 1]), float(qmq[t - 1])
    )


def _beyond(
    compressor: str,
    a_k: float,
    tau: float,
    total: float,
    k: int,
    t_max: int,
    l2: float,
    price: Price,
) -> float:
    """An upper bound on decrease(T) / cost(T) for every T in ``(k, t_max]``.

    ``B(q_T) >= l2 |q_T|^2`` gives decrease(T) <= ``A2(T) / (2 l2)`` (topk) or
    ``A1(T)^2 / (2 l2 T)`` (signtopk). Unseen magnitudes are at most ``tau`` (the k-th
    largest), so ``A(T) <= min(A(k) + (T - k) tau^p, total)`` (``p`` = 2 for A2, 1 for A1).
    On each interval ``[a, b]`` of a geometric grid the numerator is taken at ``b`` and the
    cost at ``a`` (the cost is nondecreasing), so a few hundred prices cover every T.
    """
    if l2 <= 0.0:
        return float("inf")
    starts = [k + 1]
    while starts[-1] <= t_max:
        starts.append(max(starts[-1] + 1, int(starts[-1] * _GRID)))
    a = np.array(starts[:-1], dtype=np.int64)
    b = np.minimum(np.array(starts[1:], dtype=np.int64) - 1, t_max)
    if compressor == "topk":
        bound = np.minimum(a_k + (b - k) * tau * tau, total) / (2.0 * l2)
    else:
        bound = np.minimum(a_k + (b - k) * tau, total) ** 2 / (2.0 * l2 * a)
    return float((bound / price(a)).max()) * (1.0 + _SLACK)


def dense_curvature(g: npt.ArrayLike, model: Model, data: Dataset) -> tuple[float, float]:
    """``(<g, g>, B(g))`` for the dense direction ``q = g``: the step is ``|g|^2 / B(g)``,
    i.e. ``1 / L_g`` with ``L_g = B(g) / |g|^2 <= L``."""
    arr = np.asarray(g, dtype=np.float64).reshape(-1)
    return float(np.einsum("i,i->", arr, arr)), model.directional_curvature(data, None, arr)


def scale_for_step(
    update: Update, step: float, smoothness: float, *, value_dtype: ValueDtype = "float32"
) -> Update:
    """The update whose reconstruction is ``step * smoothness * q``, so that the aggregator's
    usual ``x <- x - (1/L) u`` (``L = smoothness``) moves ``x`` by ``step * q``.

    ``q`` is the direction the update encodes: its values (dense, topk) or its signs
    (signtopk: the scale becomes ``step * L``, replacing ``A1(T)/T``). Values and the scale
    are rounded to the wire dtype (``value_dtype`` for the signtopk scale, the values' own
    dtype otherwise); a relative rounding ``e`` of the step costs only a factor ``1 - e^2``
    of the guaranteed decrease.
    """
    factor = float(step) * float(smoothness)
    if not np.isfinite(factor) or factor < 0.0:
        raise ValueError(
            f"scale_for_step: step * L must be finite and >= 0, got {step} * {smoothness}"
        )
    if update.compressor == "signtopk":
        scale = float(np.asarray([factor]).astype(VALUE_DTYPES[value_dtype])[0])
        return Update(
            update.compressor, update.d, update.indices, update.values, scale, update.semantics
        )
    if update.compressor not in ("dense", "topk"):
        raise ValueError(
            f"scale_for_step: no directional step for compressor {update.compressor!r}; "
            "use dense, topk or signtopk"
        )
    dtype = np.asarray(update.values).dtype
    scaled = np.asarray(update.values, dtype=np.float64) * factor
    if dtype.itemsize < 8 and np.abs(scaled).max(initial=0.0) > float(np.finfo(dtype).max):
        raise ValueError(
            f"scale_for_step: a scaled value exceeds the {dtype} range; "
            "send with value_dtype='float64'"
        )
    return Update(
        update.compressor,
        update.d,
        update.indices,
        scaled.astype(dtype),
        update.scale,
        update.semantics,
    )
