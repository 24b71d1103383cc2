"""Thread counts belong to a compiled model, not to the process: set around each call and restored.

torch's intra-op pool (library kernels) is process-global state; a model built with 1 thread must not
change what another model, or the user's own torch code, runs with.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def thread_count(threads: int) -> Iterator[None]:
    """Run the body with `threads` intra-op threads, then restore the previous count."""
    torch = sys.modules.get("torch")  # only if torch is in use: never import it for this
    previous = torch.get_num_threads() if torch is not None else None
    if torch is not None and previous != threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch is not None and previous is not None and previous != threads:
            torch.set_num_threads(previous)
