"""Which of a phase's loops its threads share: enough work to pay for the threads, split outside or along a
long innermost loop (the C that opens them is c/loops.py's `Sharing`)."""

from __future__ import annotations

import numpy as np

from kernorch.codegen.loops import SHORT_INNER, Phase, count_kinds
from kernorch.codegen.target import PARALLEL_MIN_ELEMENTS

PARALLEL_MIN_OUTER = 8  # fewer outer iterations than this (with a long innermost loop): split the innermost


def parallel_mode(sizes: tuple[int, ...], per_element: int = 1, min_elements: int = PARALLEL_MIN_ELEMENTS) -> str:
    """How a plain phase's loops (trip counts, outermost first) are shared out: "innermost" when the loops
    around a long innermost loop are too few to share out evenly (a [1, 16384, 128] GELU has one outer
    iteration: split outside, it ran on one thread), "outer" when the loops outside it carry enough work to
    pay for the threads, else "serial". `per_element`: elements each iteration reads (its reductions' taps):
    8192 row sums of 256 floats are 2M elements of work, not 8192."""
    if not sizes:
        return "serial"
    outer = int(np.prod(sizes[:-1], dtype=np.int64))
    if outer < PARALLEL_MIN_OUTER and sizes[-1] >= min_elements:
        return "innermost"
    return "outer" if outer > 1 and outer * sizes[-1] * per_element >= min_elements else "serial"


def short_innermost(phase: Phase) -> bool:
    """The phase's innermost loop has a few iterations (at most SHORT_INNER, or an upsampling's residues)
    inside a longer loop, and no reduction: an NCHW -> NHWC transpose of 3 channels, a channel shuffle's
    pairs, the two residues of a width doubled."""
    return len(phase.loop_vars) >= 2 and (phase.loop_sizes[-1] <= SHORT_INNER or phase.residues) and \
        phase.loop_sizes[-2] >= 2 * SHORT_INNER and not count_kinds(phase.expr, ("reduce",))  # fmt: skip


