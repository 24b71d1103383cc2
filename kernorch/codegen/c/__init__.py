"""C from the GIR: a kernel's function (kernel.py) rendered from its rewritten GIR (render.py, with rows permuted
in registers by render_permuted.py and loop nests by loops.py), C expressions (expr.py), and the prelude every
generated translation unit starts with (prelude.py); every C emitter writes through one indenting buffer
(writer.py); how a shape-generic kernel's code receives its sizes (sizes.py)."""

from kernorch.codegen.c.expr import c_binary, c_cast, c_literal, c_quaternary, c_unary
from kernorch.codegen.c.kernel import render_kernel, scratch_bytes
from kernorch.codegen.c.loops import Sharing
from kernorch.codegen.c.prelude import PRELUDE, prelude_used_by
from kernorch.codegen.c.render import render
from kernorch.codegen.c.sizes import SIZES_PARAMETER, SIZES_POINTER
from kernorch.codegen.c.writer import CWriter

__all__ = [
    "PRELUDE",
    "SIZES_PARAMETER",
    "SIZES_POINTER",
    "CWriter",
    "Sharing",
    "c_binary",
    "c_cast",
    "c_literal",
    "c_quaternary",
    "c_unary",
    "prelude_used_by",
    "render",
    "render_kernel",
    "scratch_bytes",
]
