"""CAT selection: the compression level T that maximises guaranteed decrease per unit of cost.

    T* = argmax_{T_min <= T <= T_max} gain(T) / cost(size(T))      (ties: smallest T)

``gain`` is the descent-lemma guarantee of the compressor (the common 1/(2L) cancels),
``size(T)`` the exact byte size :func:`edge_agent.protocol.wire.encoded_size` gives (priced
through :func:`~edge_agent.protocol.wire.update_sizer`, built once per price), ``cost`` the
profile's objective metric. The answer is exact, and for topk/signtopk it needs no full
sort: the largest entries are found by one threshold pass, and every T beyond them is
bounded from above using that no unseen entry exceeds the threshold (and the cost is
nondecreasing in T). Only if the bound cannot rule them out is the threshold lowered.

Policies wrap the rule: ``cat`` (every round), ``fixed:T``, ``dynamic`` (T_dyn of
Alistarh et al.: the smallest T with A1(T) >= ||g||_2), ``hybrid:S`` (re-solve every S rounds).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from edge_agent.errors import lookup
from edge_agent.numerics.compressors import ValueDtype, top_indices
from edge_agent.numerics.stochastic import noisy_gain
from edge_agent.protocol.wire import update_sizer

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Price = Callable[[IntArray], FloatArray]

_SAMPLE = 2048  # entries looked at to guess the threshold
_GRID = 1.03  # geometric step of the bound intervals beyond the seen entries


class SupportsObjectiveCost(Protocol):
    def objective_cost(self, size_bytes: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]: ...


@dataclass(frozen=True)
class Selection:
    """The chosen T, its ratio gain/cost, and (topk/signtopk) the top-T indices, sorted."""

    t: int
    ratio: float
    indices: IntArray | None = None
    widenings: int = 0


def make_price(
    profile: SupportsObjectiveCost,
    compressor: str,
    *,
    d: int,
    job: str,
    agent: str,
    round: int = 0,
    seq: int = 0,
    value_dtype: ValueDtype = "float32",
    mac: bool = False,
) -> Price:
    """cost(T): the profile's objective cost of the exact encoded update of T entries
    (``mac``: signed, so 8 bytes more: :mod:`edge_agent.protocol.mac`)."""
    sizer = update_sizer(
        compressor,
        d=d,
        job=job,
        agent=agent,
        round=round,
        seq=seq,
        value_dtype=value_dtype,
        mac=mac,
    )

    def price(t: IntArray) -> FloatArray:
        t_arr = np.asarray(t, dtype=np.int64)
        sizes = sizer(t_arr.reshape(-1)).reshape(t_arr.shape)
        return np.asarray(profile.objective_cost(sizes), dtype=np.float64)

    return price


def _prefix(compressor: str, sorted_mags: FloatArray) -> FloatArray:
    """A2 (topk) or A1 (signtopk) for T = 1..len(sorted_mags)."""
    if compressor == "topk":
        return np.cumsum(sorted_mags * sorted_mags)
    return np.cumsum(sorted_mags)


def _gain_of(compressor: str, prefix: FloatArray, t: IntArray) -> FloatArray:
    """gain(T) * 2L from the prefix sums: A2(T), or A1(T)^2 / T."""
    if compressor == "topk":
        return np.asarray(prefix[t - 1], dtype=np.float64)
    return np.asarray(prefix[t - 1] ** 2 / t, dtype=np.float64)


def _gain(compressor: str, sorted_mags: FloatArray, t: IntArray) -> FloatArray:
    """gain(T) * 2L for T = t (1-based counts into sorted_mags, all <= its length)."""
    return _gain_of(compressor, _prefix(compressor, sorted_mags), t)


def _argmax(ratio: FloatArray) -> int:
    return int(np.argmax(ratio))  # first maximum: the smallest T wins ties


def select_exhaustive(
    g: npt.ArrayLike, compressor: str, price: Price, *, t_min: int = 1, t_max: int | None = None
) -> Selection:
    """Reference answer by a full sort: evaluates every T in [t_min, t_max]."""
    arr, t_max = _prepare(g, t_min, t_max)
    d = arr.size
    if compressor == "dense":
        return Selection(d, float(np.einsum("i,i->", arr, arr) / price(np.array([d]))[0]))
    absg = np.abs(arr)
    if compressor == "randk":
        return _select_randk(arr, absg, price, t_min, t_max)
    order = np.argsort(-absg, kind="stable")
    ts = np.arange(t_min, t_max + 1, dtype=np.int64)
    ratio = _gain(compressor, absg[order][:t_max], ts) / price(ts)
    k = _argmax(ratio)
    t = int(ts[k])
    return Selection(t, float(ratio[k]), np.sort(order[:t]).astype(np.int64))


def _prepare(g: npt.ArrayLike, t_min: int, t_max: int | None) -> tuple[FloatArray, int]:
    """g as float64 and the effective t_max, after checking 1 <= t_min <= t_max <= d."""
    arr = np.asarray(g, dtype=np.float64)
    d = arr.size
    t_max = d if t_max is None else min(t_max, d)
    if not 1 <= t_min <= t_max <= d:
        raise ValueError(f"need 1 <= t_min <= t_max <= d={d}, got t_min={t_min}, t_max={t_max}")
    return arr, t_max


def _select_randk(
    g: FloatArray, absg: FloatArray, price: Price, t_min: int, t_max: int
) -> Selection:
    """randk: gain = ||g||^4 / V(T) in expectation; priced at the expected size T (exact, sorted)."""
    mags = np.sort(absg)[::-1]
    nnz = int(np.count_nonzero(mags))
    if nnz == 0:
        return Selection(t_min, 0.0)
    t_max = min(t_max, nnz)
    t_min = min(t_min, t_max)
    tail = np.concatenate([np.cumsum(mags[:nnz][::-1])[::-1], [0.0]])
    a2 = np.concatenate([[0.0], np.cumsum(mags[:nnz] ** 2)])
    c = np.arange(nnz) + tail[:nnz] / mags[:nnz]
    ts = np.arange(t_min, t_max + 1, dtype=np.int64)
    r = np.minimum(np.searchsorted(c, ts, side="right"), nnz)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = a2[r] + np.where(ts > r, tail[r] ** 2 / (ts - r), 0.0)
    norm2 = a2[nnz]
    ratio = norm2 * norm2 / v / price(ts)
    k = _argmax(ratio)
    return Selection(int(ts[k]), float(ratio[k]))


def select(
    g: npt.ArrayLike, compressor: str, price: Price, *, t_min: int = 1, t_max: int | None = None
) -> Selection:
    """Exact CAT argmax; the same answer as :func:`select_exhaustive`, without a full sort."""
    arr, t_max = _prepare(g, t_min, t_max)
    d = arr.size
    if compressor in ("dense", "randk"):
        return select_exhaustive(arr, compressor, price, t_min=t_min, t_max=t_max)
    if compressor not in ("topk", "signtopk"):
        raise ValueError(f"CAT has no gain model for compressor {compressor!r}")
    absg = np.abs(arr, out=_scratch(d))
    # einsum, not dot: BLAS threads can stall for milliseconds on a loaded small device
    total = float(np.einsum("i,i->", arr, arr)) if compressor == "topk" else float(absg.sum())
    sample, stride = _sample(absg)
    want = _guess_count(sample, stride, compressor, price, t_max)
    widenings = 0
    while True:
        want = max(want, t_min)
        if 2 * want >= d:
            out = select_exhaustive(arr, compressor, price, t_min=t_min, t_max=t_max)
            return Selection(out.t, out.ratio, out.indices, widenings)
        tau = _threshold(sample, stride, want)
        cand = np.flatnonzero(absg >= tau)
        if cand.size >= t_min and cand.size < d:
            cand_mags = absg[cand]
            mags = np.sort(cand_mags)[::-1]
            k_seen = min(cand.size, t_max)
            best_t, best = _best_seen(compressor, mags[:k_seen], t_min, price)
            if (
                k_seen == t_max
                or _beyond_bound(compressor, mags, cand.size, tau, total, price, t_max) <= best
                or _beyond_bound(
                    compressor,
                    mags,
                    cand.size,
                    tau,
                    total,
                    price,
                    t_max,
                    _levels(absg, sample, stride, cand.size),
                )
                <= best
            ):
                # cand is ascending, so the canonical top set of the candidates is that of g
                top = cand[top_indices(cand_mags, best_t)]
                return Selection(best_t, best, top.astype(np.int64, copy=False), widenings)
        widenings += 1
        want *= 4


_BLOCK = 64  # T per block when pruning the exact evaluation
#: each thread (each context) has its own buffer: a new thread starts with none
_SCRATCH: ContextVar[FloatArray | None] = ContextVar("cat_edge_select_scratch", default=None)


def _scratch(d: int) -> FloatArray:
    """A float64 buffer of d entries, reused by this thread's next selection of the same d:
    |g| is written there instead of into a fresh d-sized array (whose pages the kernel
    would map and zero again on every call: ~0.2 ms at d = 10^6). It never leaves select."""
    buf = _SCRATCH.get()
    if buf is None or buf.size != d:
        buf = np.empty(d, dtype=np.float64)
        _SCRATCH.set(buf)
    return buf


def _best_seen(compressor: str, mags: FloatArray, t_min: int, price: Price) -> tuple[int, float]:
    """Exact argmax of gain(T)/cost(T) over T in [t_min, len(mags)], ties to the smallest T.

    cost is nondecreasing in T, and so are A2 (topk's gain) and A1 (signtopk's gain is
    A1^2/T), so on a block [a, b] the ratio is at most A2(b)/cost(a), resp. A1(b)^2/(a cost(a)). Blocks whose bound is below a ratio already seen cannot hold the
    maximum and are never priced T by T; the values compared are computed exactly as the
    exhaustive search computes them, so the answer is identical.
    """
    k_seen = mags.size
    ts = np.arange(t_min, k_seen + 1, dtype=np.int64)
    prefix = _prefix(compressor, mags)
    gain = _gain_of(compressor, prefix, ts)
    if ts.size <= 4 * _BLOCK:
        ratio = gain / price(ts)
        k = _argmax(ratio)
        return int(ts[k]), float(ratio[k])
    first = np.arange(0, ts.size, _BLOCK)
    last = np.minimum(first + _BLOCK - 1, ts.size - 1)
    cost_first = price(ts[first])
    cost_last = price(ts[last])
    known = max(float((gain[first] / cost_first).max()), float((gain[last] / cost_last).max()))
    top = prefix[ts[last] - 1]
    bound = top / cost_first if compressor == "topk" else top * top / ts[first] / cost_first
    # the relative slack absorbs rounding in the bound's own arithmetic (never excludes
    # a block that could hold the maximum; at worst prices a few extra blocks)
    keep = np.flatnonzero(bound * (1 + 1e-9) >= known)
    pos = (first[keep][:, None] + np.arange(_BLOCK)[None, :]).ravel()
    pos = pos[pos < ts.size]  # the last block may be short; positions stay ascending
    ratio = gain[pos] / price(ts[pos])
    k = _argmax(ratio)
    return int(ts[pos[k]]), float(ratio[k])


def _sample(absg: FloatArray) -> tuple[FloatArray, int]:
    """A strided sample of |g|, sorted descending, and its stride (deterministic, no RNG)."""
    stride = max(1, absg.size // _SAMPLE)
    return np.sort(absg[::stride])[::-1], stride


@functools.lru_cache(maxsize=64)
def _guess_grid(size: int, stride: int, t_max: int) -> tuple[IntArray, IntArray]:
    """The sample positions k and the T = k * stride (capped) :func:`_guess_count` prices:
    a function of (d, t_max) alone, so built once (read-only arrays)."""
    # sorted and deduplicated as np.unique does, without np.unique's import of numpy.ma
    # (about 1.2 MB of a device's memory, used nowhere else)
    k = np.sort(np.geomspace(1, size, num=min(size, 128)).astype(np.int64))
    k = k[np.concatenate(([True], k[1:] != k[:-1]))]
    ts = (k * stride).clip(max=t_max)
    k.flags.writeable = False
    ts.flags.writeable = False
    return k, ts


def _guess_count(sample: FloatArray, stride: int, compressor: str, price: Price, t_max: int) -> int:
    """A cheap guess of how many top entries the answer needs, from the sample.

    The sample's k-th largest stands for the (k*stride)-th of g; the estimated ratio is
    evaluated on a geometric grid of about a hundred T, so pricing stays cheap.
    """
    k, ts = _guess_grid(sample.size, stride, t_max)
    if compressor == "topk":
        gain = np.cumsum(sample * sample)[k - 1] * stride
    else:
        gain = (np.cumsum(sample)[k - 1] * stride) ** 2 / ts
    best = int(np.argmax(gain / price(ts)))
    return max(64, 3 * int(ts[best]) + 8 * stride)


def _threshold(sample: FloatArray, stride: int, want: int) -> float:
    """A magnitude such that roughly ``want`` entries of g are >= it."""
    pos = min(sample.size - 1, max(0, want // stride))
    return float(sample[pos])


def _levels(
    absg: FloatArray, sample: FloatArray, stride: int, seen: int
) -> tuple[FloatArray, IntArray]:
    """Exact counts of |g| >= tau_k for a few lower thresholds tau_k (about 4, 16, 64 times
    the seen count, read off the sample): one comparison pass over g picks the entries
    above the lowest (when they are a small part of g), and the counts are taken on those,
    far less than a wider threshold pass with its sort and pricing."""
    taus: list[float] = []
    want = 4 * seen
    while want // stride < sample.size - 1 and len(taus) < 3:
        taus.append(float(sample[want // stride]))  # (descending)
        want *= 4
    counts: list[int] = []
    if taus and want // 4 <= absg.size // 16:
        below = absg[absg >= taus[-1]]  # one pass over g; the other counts are on these
        counts = [int(np.count_nonzero(below >= tau_k)) for tau_k in taus]
    else:  # (the lowest level holds much of g: copying it would cost more than counting)
        counts = [int(np.count_nonzero(absg >= tau_k)) for tau_k in taus]
    return np.array(taus, dtype=np.float64), np.array(counts, dtype=np.int64)


@functools.lru_cache(maxsize=8)
def _geometric_starts(t_max: int) -> IntArray:
    """1, 2, ... then ``int(s * _GRID)``: the interval starts of :func:`_beyond_grid` up to
    past t_max (a function of t_max alone, built once; read-only)."""
    starts = [1]
    while starts[-1] <= t_max:
        starts.append(max(starts[-1] + 1, int(starts[-1] * _GRID)))
    out = np.array(starts, dtype=np.int64)
    out.flags.writeable = False
    return out


def _beyond_grid(seen: int, t_max: int) -> tuple[IntArray, IntArray]:
    """Intervals [a, b] covering (seen, t_max]: the geometric starts beyond ``seen + 1``,
    each interval at most a factor ``_GRID`` wide (or one T)."""
    starts = _geometric_starts(t_max)
    rest = starts[np.searchsorted(starts, seen + 1, side="right") :]
    a = np.concatenate([[seen + 1], rest[rest <= t_max]])
    b = np.concatenate([a[1:] - 1, [t_max]])
    return a, b


def _beyond_bound(
    compressor: str,
    mags: FloatArray,
    seen: int,
    tau: float,
    total: float,
    price: Price,
    t_max: int,
    levels: tuple[FloatArray, IntArray] | None = None,
) -> float:
    """An upper bound on gain(T)/cost(T) for every T in (seen, t_max].

    Unseen entries are all < tau. On each interval [a, b] of a geometric grid the gain is
    at most its value at b under that bound (capped by the total) and the cost at least
    cost(a), since cost is nondecreasing in T. With ``levels`` (thresholds tau_k below tau
    and the exact counts of entries >= tau_k) the unseen entries are bounded band by band:
    the next (count_1 - seen) entries by tau, the following ones by tau_1, and so on.
    """
    a, b = _beyond_grid(seen, t_max)
    tops = np.array([tau], dtype=np.float64)
    sizes = np.zeros(0, dtype=np.int64)
    if levels is not None and levels[0].size:
        tops = np.concatenate([tops, levels[0]])
        sizes = np.diff(np.concatenate([[seen], levels[1]]))
    value = tops * tops if compressor == "topk" else tops
    # extra(j): the most the next j unseen entries can add; piecewise linear in j
    xs = np.concatenate([[0], np.cumsum(sizes), [max(t_max, 1) + int(sizes.sum()) + 1]])
    ys = np.concatenate([[0.0], np.cumsum(sizes * value[:-1]), [0.0]])
    ys[-1] = ys[-2] + (xs[-1] - xs[-2]) * value[-1]
    extra = np.interp((b - seen).astype(np.float64), xs.astype(np.float64), ys)
    if compressor == "topk":
        base = float(np.einsum("i,i->", mags, mags))
        gain = np.minimum(base + extra, total)
    else:
        base = float(mags.sum())
        gain = np.minimum(base + extra, total) ** 2 / a
    return float((gain / price(a)).max()) * (1 + 1e-12)


def dynamic_t(g: npt.ArrayLike, *, t_max: int | None = None) -> int:
    """T_dyn = min{T : A1(T) >= ||g||_2} (Alistarh et al., as in the paper's comparison)."""
    absg = np.abs(np.asarray(g, dtype=np.float64))
    d = absg.size
    norm = float(np.sqrt(np.einsum("i,i->", absg, absg)))
    cap = d if t_max is None else min(t_max, d)
    if norm == 0.0:
        return 1
    want = 64
    sample, stride = _sample(absg)
    while True:
        if 4 * want >= d:
            a1 = np.cumsum(np.sort(absg)[::-1])
        else:
            tau = _threshold(sample, stride, want)
            top = np.sort(absg[absg >= tau])[::-1]
            a1 = np.cumsum(top)
            if a1.size == 0 or a1[-1] < norm:
                want *= 4
                continue
        t = int(np.searchsorted(a1, norm, side="left")) + 1
        return max(1, min(t, cap, a1.size))


# ---------------------------------------------------------------- policies


@dataclass
class Policy:
    """How an agent picks T each round; ``choose`` sees the vector it is about to compress
    and, for a minibatch gradient, the noise variance of each of its entries (``variance``;
    None: an exact gradient). ``cat`` then prices the expected decrease
    (:func:`select_noisy`); ``cat:nominal`` ignores the variance (the deterministic gain)."""

    name: str = "cat"
    nominal: bool = field(default=False, kw_only=True)

    def choose(
        self,
        v: FloatArray,
        compressor: str,
        price: Price,
        round_index: int,
        variance: FloatArray | None = None,
    ) -> Selection:
        if variance is not None and not self.nominal:
            return select_noisy(v, variance, compressor, price)
        return select(v, compressor, price)

    @property
    def wants_variance(self) -> bool:
        """True when ``choose`` uses the variance (the agent estimates it only then)."""
        return self.name == "cat" and not self.nominal


@dataclass
class FixedPolicy(Policy):
    t: int = 1

    def choose(
        self,
        v: FloatArray,
        compressor: str,
        price: Price,
        round_index: int,
        variance: FloatArray | None = None,
    ) -> Selection:
        t = min(self.t, v.size)
        return Selection(t, float("nan"))


@dataclass
class DynamicPolicy(Policy):
    def choose(
        self,
        v: FloatArray,
        compressor: str,
        price: Price,
        round_index: int,
        variance: FloatArray | None = None,
    ) -> Selection:
        return Selection(dynamic_t(v), float("nan"))


@dataclass
class HybridPolicy(Policy):
    """The paper's heuristic: solve for T* every ``every`` rounds, keep T fixed between
    (the deterministic gain)."""

    every: int = 200
    _t: int | None = field(default=None, repr=False)
    _last: int = field(default=-(10**18), repr=False)

    def choose(
        self,
        v: FloatArray,
        compressor: str,
        price: Price,
        round_index: int,
        variance: FloatArray | None = None,
    ) -> Selection:
        if self._t is None or round_index - self._last >= self.every:
            sel = select(v, compressor, price)
            self._t, self._last = sel.t, round_index
            return sel
        return Selection(min(self._t, v.size), float("nan"))


def select_noisy(
    v: npt.ArrayLike,
    variance: npt.ArrayLike,
    compressor: str,
    price: Price,
    *,
    t_min: int = 1,
    t_max: int | None = None,
) -> Selection:
    """CAT on a noisy vector: ``T* = argmax E[gain(T)] / cost(T)`` with the expected gains of
    :func:`edge_agent.numerics.stochastic.noisy_gain` (topk, signtopk; entries in the order
    of ``|v|``, ties by index as :func:`top_indices` breaks them). randk's T is the
    deterministic one: the noise only lowers its gain by a factor independent of T (it
    shrinks the scale instead, compressors.compress_randk); dense has nothing to choose.
    Exhaustive (one sort of ``|v|``); zero variance gives :func:`select_exhaustive`'s T."""
    arr, t_max = _prepare(v, t_min, t_max)
    if compressor not in ("topk", "signtopk"):
        return select_exhaustive(arr, compressor, price, t_min=t_min, t_max=t_max)
    var = np.asarray(variance, dtype=np.float64)
    absg = np.abs(arr)
    order = np.argsort(-absg, kind="stable")[:t_max]
    ts = np.arange(t_min, t_max + 1, dtype=np.int64)
    ratio = noisy_gain(compressor, absg[order], var[order], ts) / price(ts)
    k = _argmax(ratio)
    t = int(ts[k])
    return Selection(t, float(ratio[k]), np.sort(order[:t]).astype(np.int64))


def _positive(text: str, what: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"policy {what!r}: expected a positive integer after ':', got {text!r}")
    return n


def _cat(arg: str) -> Policy:
    if arg not in ("", "nominal"):
        raise ValueError(f"policy 'cat': expected 'cat' or 'cat:nominal', got 'cat:{arg}'")
    return Policy("cat", nominal=arg == "nominal")


POLICIES: dict[str, Callable[[str], Policy]] = {
    "cat": _cat,
    "fixed": lambda arg: FixedPolicy("fixed", _positive(arg, "fixed:T")),
    "dynamic": lambda arg: DynamicPolicy("dynamic"),
    "hybrid": lambda arg: HybridPolicy("hybrid", _positive(arg or "200", "hybrid:S")),
}


def parse_policy(spec: str) -> Policy:
    """``cat`` | ``cat:nominal`` | ``fixed:T`` | ``dynamic`` | ``hybrid:S`` (S defaults to
    200). ``cat`` prices a minibatch gradient's expected decrease, ``cat:nominal`` the
    deterministic gain of the noisy vector (for exact gradients the two are the same)."""
    name, _, arg = spec.partition(":")
    return lookup(POLICIES, name, "policy")(arg)


def select_t(
    g: npt.ArrayLike,
    compressor: str,
    profile: SupportsObjectiveCost,
    *,
    job: str,
    agent: str,
    round: int = 0,
    seq: int = 0,
    t_min: int = 1,
    t_max: int | None = None,
    value_dtype: ValueDtype = "float32",
) -> int:
    """CAT's T* for gradient ``g`` on ``profile``, priced with the exact encoded size."""
    arr = np.asarray(g, dtype=np.float64)
    price = make_price(
        profile,
        compressor,
        d=arr.size,
        job=job,
        agent=agent,
        round=round,
        seq=seq,
        value_dtype=value_dtype,
    )
    return select(arr, compressor, price, t_min=t_min, t_max=t_max).t
