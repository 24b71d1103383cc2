"""Thread counts belong to a compiled model, not to the process: set around each call and restored.

The generated kernels and oneDNN run on the process's OpenMP runtime (libgomp), whose thread count is
per calling thread state; torch's intra-op pool (reference kernels, calibration) is process-global. A
model built with 1 thread must not change what another model, or the user's own code, runs with.

OpenMP's count is the calling thread's own, so concurrent calls set it independently. torch's is one for
the process: the first scope to enter records the user's value and the last to leave restores it (a
counter under a lock), so calls that overlap in time — from many threads, with different counts — never
leave a count of theirs behind. While they overlap, torch runs with the count set last.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from functools import cache
from types import ModuleType


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


class _TorchThreads:
    """torch's process-wide intra-op count, set by overlapping scopes and restored when the last one ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._saved: int | None = None

    def enter(self, torch: ModuleType, threads: int) -> None:
        with self._lock:
            if self._active == 0:
                self._saved = torch.get_num_threads()
            self._active += 1
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)

    def leave(self, torch: ModuleType) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0 and self._saved is not None and torch.get_num_threads() != self._saved:
                torch.set_num_threads(self._saved)


_TORCH = _TorchThreads()


class _ThreadScope:
    """`thread_count`'s scope: a class, not a generator, since it wraps every call of a plan (a generator-based
    context manager costs several µs there, right after kernels have cooled the interpreter's caches)."""

    __slots__ = ("threads", "_openmp", "_torch", "_previous")

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def __enter__(self) -> None:
        self._openmp = openmp = _openmp()
        self._torch = torch = sys.modules.get("torch")  # only if torch is in use: never import it for this
        self._previous = openmp.omp_get_max_threads() if openmp is not None else None
        if torch is not None:
            _TORCH.enter(torch, self.threads)
        if openmp is not None and self._previous != self.threads:
            openmp.omp_set_num_threads(self.threads)

    def __exit__(self, *_: object) -> None:
        if self._torch is not None:
            _TORCH.leave(self._torch)
        if self._openmp is not None and self._previous is not None and self._previous != self.threads:
            self._openmp.omp_set_num_threads(self._previous)


def thread_count(threads: int) -> _ThreadScope:
    """Run the body with `threads` OpenMP (and, if torch is in use, intra-op) threads, then restore."""
    return _ThreadScope(threads)
