"""Run OpenBLAS on one thread while the simulator works (best effort, Linux only).

The simulator's vectors are small (d ~ 5e4): a multithreaded level-1 BLAS call (``np.dot``)
then costs about 1 ms on a busy 2-core machine instead of about 5 us single-threaded, which
made the simulator 5-10x slower. The thread count is a process-wide setting of the BLAS
library numpy loaded; numpy has no API for it, so we find the library the way threadpoolctl
does (``/proc/self/maps``) and call its ``set_num_threads`` through ctypes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

_BLAS_PREFIXES: Final = ("scipy_openblas_", "openblas_")
_BLAS_SUFFIXES: Final = ("64_", "")

#: (set_num_threads, get_num_threads)
BlasThreads = tuple[Callable[[int], None], Callable[[], int]]


def _loaded_openblas_paths() -> list[str]:
    """Paths of the OpenBLAS shared objects mapped into this process (empty off Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted(
                {
                    line.split()[-1]
                    for line in maps
                    if "openblas" in line.lower() and line.split()[-1].startswith("/")
                }
            )
    except OSError:
        return []


def _openblas() -> BlasThreads | None:
    """(set_num_threads, get_num_threads) of the OpenBLAS numpy loaded, if we can find it."""
    import ctypes

    for path in _loaded_openblas_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _BLAS_PREFIXES:
            for suffix in _BLAS_SUFFIXES:
                setter = getattr(lib, f"{prefix}set_num_threads{suffix}", None)
                getter = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
                if setter is not None and getter is not None:
                    getter.restype = ctypes.c_int
                    return (lambda n, f=setter: f(int(n))), (lambda f=getter: int(f()))
    return None


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """OpenBLAS runs on one thread inside the block, on as many as before after it.

    A no-op where the library cannot be found (not Linux, another BLAS): results are the
    same either way, only the speed differs.
    """
    api = _openblas()
    before = api[1]() if api is not None else 0
    if api is not None:
        api[0](1)
    try:
        yield
    finally:
        if api is not None and before > 0:
            api[0](before)


__all__ = ["single_threaded_blas"]
