"""How a generated kernel's parallel loop is shared out among threads.

Kernel by kernel, a phase's parallel loop is an OpenMP worksharing loop in a parallel region of its own (a
fork and a join per phase). In an rProgram (schedule/) the threads of one persistent region run rTasks instead:
a task runs the iterations [ko_begin, ko_end) of one phase's parallel loop, so the loop nest is flattened into
one loop over those iterations and each loop variable is recovered from the flat index. Which tasks exist and
where they run is decided by the scheduler; the kernel only needs to know each phase's trip count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernorch.codegen.loops.describe import SHORT_INNER, Phase, count_kinds

PARALLEL_MIN_ELEMENTS = 16384  # below this a parallel region costs more than it saves
PARALLEL_MIN_OUTER = 8  # fewer outer iterations than this (with a long innermost loop): split the innermost
LANES = 16  # float32 lanes of an AVX-512 vector (a float max/min reduction is vectorized over two or more)


def parallel_mode(sizes: tuple[int, ...], per_element: int = 1) -> str:
    """How a plain phase's loops (trip counts, outermost first) are shared out: "innermost" when the loops
    around a long innermost loop are too few to share out evenly (a [1, 16384, 128] GELU has one outer
    iteration: split outside, it ran on one thread), "outer" when the loops outside it carry enough work to
    pay for the threads, else "serial". `per_element`: elements each iteration reads (its reductions' taps):
    8192 row sums of 256 floats are 2M elements of work, not 8192."""
    if not sizes:
        return "serial"
    outer = int(np.prod(sizes[:-1], dtype=np.int64))
    if outer < PARALLEL_MIN_OUTER and sizes[-1] >= PARALLEL_MIN_ELEMENTS:
        return "innermost"
    return "outer" if outer > 1 and outer * sizes[-1] * per_element >= PARALLEL_MIN_ELEMENTS else "serial"


def short_innermost(phase: Phase) -> bool:
    """The phase's innermost loop has a few iterations (at most SHORT_INNER, or an upsampling's residues)
    inside a longer loop, and no reduction: an NCHW -> NHWC transpose of 3 channels, a channel shuffle's
    pairs, the two residues of a width doubled."""
    return len(phase.loop_vars) >= 2 and (phase.loop_sizes[-1] <= SHORT_INNER or phase.residues) and \
        phase.loop_sizes[-2] >= 2 * SHORT_INNER and not count_kinds(phase.expr, ("reduce",))  # fmt: skip


@dataclass
class Sharing:
    tasks: bool = False
    # tasks: per phase of the kernel, in order, its parallel loop's trip count (1 for a serial phase)
    iterations: list[int] = field(default_factory=list)

    def collapsed(self, loops: list[tuple[str, int, int]]) -> tuple[list[str], int]:
        """Lines opening the nest `loops` (var, bound, step: var runs 0, step, ... while below bound), shared
        out, and how many braces close it."""
        if not self.tasks:
            # a loop of one iteration is a constant, not a collapsed loop: with it the collapsed nest recovers
            # one more index per iteration (a [1, 256, 64] nest around a width doubling ran 118 µs, 103 without)
            kept = [(var, bound, step) for var, bound, step in loops if bound > step] or loops[-1:]
            constants = [f"const int64_t {var} = 0;" for var, bound, step in loops if (var, bound, step) not in kept]
            pragma = f"#pragma omp parallel for collapse({len(kept)}) reduction(|:err) schedule(static)"
            if not constants:
                return [pragma, *loop_headers(kept)], len(kept)
            return ["{", *constants, pragma, *loop_headers(kept)], len(kept) + 1  # a scope for the constants
        counts = [-(-bound // step) for _, bound, step in loops]
        total = 1
        for trips in counts:
            total *= trips
        self.iterations.append(total)
        # the loop variables' counters are computed from ko_begin once (one division each per rTask), then
        # advanced like an odometer in the loop's increment: no division per iteration
        lines = ["{"]
        inner = total
        for position, ((var, _, _), trips) in enumerate(zip(loops, counts, strict=True)):
            inner //= trips
            index = f"ko_begin / {inner}" if inner > 1 else "ko_begin"
            lines.append(f"int64_t {var}_c = {f'({index}) % {trips}' if position else index};")
        advance = ""
        for (var, _, _), trips in zip(loops, counts, strict=True):  # outermost first: it nests innermost
            advance = f"(++{var}_c == {trips} ? ({var}_c = 0, {advance}) : 0)" if advance else f"++{var}_c"
        lines.append(f"for (int64_t ko_t = ko_begin; ko_t < ko_end; ko_t++, {advance}) {{")
        for var, bound, step in loops:
            lines.append(f"const int64_t {var} = {var}_c{f' * {step}' if step != 1 else ''};")
            # the range the loop bounds gave the compiler: without it GCC cannot prove an index affine in the
            # inner loop (candy's reflect-pad kernels fell back to scalar code, 20x slower)
            lines.append(f"if ({var} < 0 || {var} >= {bound}) __builtin_unreachable();")
        return lines, 2

    def innermost(self, var: str, size: int) -> list[str]:
        """Lines opening a parallel innermost loop (one closing brace)."""
        if not self.tasks:
            return ["#pragma omp parallel for simd reduction(|:err) schedule(static)",
                    f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{"]  # fmt: skip
        self.iterations.append(size)
        return [f"if (ko_begin < 0 || ko_end > {size}) __builtin_unreachable();", "#pragma omp simd reduction(|:err)",
                f"for (int64_t {var} = ko_begin; {var} < ko_end; {var}++) {{"]  # fmt: skip

    def serial(self) -> None:
        """The phase runs on one thread: one task covers it."""
        if self.tasks:
            self.iterations.append(1)


def loop_headers(loops: list[tuple[str, int, int]]) -> list[str]:
    """Plain nested loops (var, bound, step), outermost first; each needs one closing brace."""
    return [f"for (int64_t {v} = 0; {v} < {bound}; {v} += {step}) {{" if step != 1
            else f"for (int64_t {v} = 0; {v} < {bound}; {v}++) {{" for v, bound, step in loops]  # fmt: skip
