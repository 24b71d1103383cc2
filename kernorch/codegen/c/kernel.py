"""A generated memory-intensive kernel as one C function: its loops (`KernelLoops`) are lowered to GIR, the
GIR rewritten (gir/rules.py), and the rewritten GIR rendered (c/render.py); this module adds the function
around it.

Every kernel becomes `int NAME(void **buffers)`: buffers in the order of `KernelLoops.buffers` minus
scratch (inputs, then outputs). It returns 0, or 1 when a gathered index was out of range (the caller
raises). Shapes are compile-time constants; the runtime checks buffer shapes before any call.
"""

from __future__ import annotations

import numpy as np

from kernorch.codegen.c.render import render
from kernorch.codegen.gir import RULES, Rule, lower, optimize
from kernorch.codegen.loops import KernelLoops
from kernorch.codegen.target import CPU, Target


def render_kernel(name: str, loops: KernelLoops, target: Target = CPU, rules: tuple[Rule, ...] = RULES) -> str:
    """The kernel's C function: its loops lowered to GIR for `target`, rewritten by `rules`, rendered by
    c/render.py."""
    return render(name, optimize(lower(loops, target), rules), target)


def render_kernel_tasks(name: str, loops: KernelLoops, target: Target = CPU) -> tuple[str, tuple[int, ...]]:
    """The kernel as `int NAME(void **buffers, int ko_phase, int64_t ko_begin, int64_t ko_end)`, running
    iterations [ko_begin, ko_end) of phase ko_phase's parallel loop on the calling thread (an rTask), and each
    phase's trip count (recorded in the GIR: `Gir.task_units`)."""
    gir = optimize(lower(loops, target))
    return render(name, gir, target, tasks=True), gir.task_units(target.tile)


def scratch_bytes(loops: KernelLoops) -> list[int]:
    """Bytes of each scratch buffer, in argument order (after the inputs and outputs)."""
    return [max(int(np.prod(b.shape, dtype=np.int64)), 1) * np.dtype(b.dtype).itemsize
            for b in loops.buffers if b.role == "scratch"]  # fmt: skip
