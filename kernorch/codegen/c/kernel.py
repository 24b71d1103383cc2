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


def scratch_bytes(loops: KernelLoops) -> list[int]:
    """Bytes of each scratch buffer, in argument order (after the inputs and outputs)."""
    return [max(int(np.prod(b.shape, dtype=np.int64)), 1) * np.dtype(b.dtype).itemsize
            for b in loops.buffers if b.role == "scratch"]  # fmt: skip
