"""Thread counts belong to a compiled model, not to the process: set around each call and restored.

The generated kernels and oneDNN run on the process's OpenMP runtime (libgomp), whose thread count is
per calling thread state; torch's intra-op pool (reference kernels, calibration) is process-global. A
model built with 1 thread must not change what another model, or the user's own code, runs with.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache


@cache
def _openmp() -> ctypes.CDLL | None:
    """The process's libgomp (the one already loaded if any: same soname), or None without one."""
    try:
        library = ctypes.CDLL("libgomp.so.1")
    except OSError:
        return None
    library.omp_get_max_threads.restype = ctypes.c_int
    library.omp_set_num_threads.argtypes = [ctypes.c_int]
    return library


@contextmanager
def thread_count(threads: int) -> Iterator[None]:
    """Run the body with `threads` OpenMP (and, if torch is in use, intra-op) threads, then restore."""
    openmp = _openmp()
    torch = sys.modules.get("torch")  # only if torch is in use: never import it for this
    previous_omp = openmp.omp_get_max_threads() if openmp is not None else None
    previous_torch = torch.get_num_threads() if torch is not None else None
    if torch is not None and previous_torch != threads:
        torch.set_num_threads(threads)
    if openmp is not None and previous_omp != threads:
        openmp.omp_set_num_threads(threads)
    try:
        yield
    finally:
        if torch is not None and previous_torch is not None and previous_torch != threads:
            torch.set_num_threads(previous_torch)
        if openmp is not None and previous_omp is not None and previous_omp != threads:
            openmp.omp_set_num_threads(previous_omp)
