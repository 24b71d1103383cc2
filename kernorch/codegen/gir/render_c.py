"""Render a rewritten GIR as C with OpenMP (PowerFusion §7): the parallel structure first, from each phase's
parallel unit, then every gOperator in order as one statement.

- A phase's `mode` says which loops its threads share (`sharing.py` opens them: an OpenMP worksharing loop
  kernel by kernel, the iterations [ko_begin, ko_end) in an rTask). A phase after a device `sync` starts a
  parallel loop of its own, whose region ends with a barrier.
- A register slice is a C temporary; a constant is inlined as a literal, a table element where it is read.
- A `move` is a load into a temporary or a store from one, addressed by the index tree it carries.
- An elementwise gOperator is its primitive's C (`c_expr.py`, shared with the tree renderer).
- A gOperator the rewrite rules swapped before the broadcast (`outer`) is emitted before the innermost loop,
  so it runs once per iteration of the loops outside it; one `merge_read_after_read` removed is not emitted.
- `broadcast`, `sync` and address work (`index`) have no statement of their own here.

Nothing here decides anything: which loops are parallel, what is hoisted, what is loaded once, all come from
the GIR. What this renderer does not cover yet (reductions, selects on indices, tiled or unrolled loops, the
row schedule) is listed in `Gir.unrendered`, and those kernels go through the tree renderer.
"""

from __future__ import annotations

from kernorch.codegen.c_expr import c_binary, c_index, c_literal, c_unary, c_value_type
from kernorch.codegen.gir.graph import (
    CONSTANT,
    ELEMENTWISE,
    INNERMOST,
    MOVE,
    OUTER,
    Gir,
    GirPhase,
    GOperator,
)
from kernorch.codegen.loops import C_TYPES, Tree
from kernorch.codegen.sharing import Sharing

_SILENT = ("index",)  # elementwise gOperators that stand for address arithmetic inside an index tree


def render_phases(gir: Gir, prefix: str, sharing: Sharing) -> list[list[str]]:
    """Each phase's lines, in order (one list per parallel loop)."""
    if gir.unrendered:
        raise ValueError(f"the GIR renderer does not cover {gir.unrendered}")
    counter = [0]
    return [_Phase(gir, phase, prefix, counter).lines(sharing) for phase in gir.phases]


def _no_value(tree: Tree) -> str:
    raise ValueError("an index that reads a value is not rendered from GIR")  # excluded by Gir.unrendered


class _Phase:
    def __init__(self, gir: Gir, phase: GirPhase, prefix: str, counter: list[int]) -> None:
        self.gir, self.phase, self.prefix, self.counter = gir, phase, prefix, counter
        self.types = {b.name: C_TYPES[b.dtype] for b in gir.buffers}
        self.names: dict[int, str] = {}  # register slice -> the C temporary or literal holding it
        self.ctypes: dict[int, str] = {}  # register slice -> its C type

    def lines(self, sharing: Sharing) -> list[str]:
        # what runs once per iteration of the loops outside the innermost reads only its own kind: it is
        # emitted (and its temporaries numbered) first
        ops = self.phase.ops
        for op in ops:
            if op.kind == CONSTANT:
                self.statement(op)
        outside = [s for s in (self.statement(op) for op in ops if op.outer) if s is not None]
        inside = [s for s in (self.statement(op) for op in ops if not op.outer) if s is not None]
        loops = self.phase.loops
        if not loops:
            sharing.serial()
            return ["{", *outside, *inside, "}"]
        (var, size), outer = loops[-1], loops[:-1]
        mode = self.phase.parallel.mode
        if self.phase.unrolled:
            return self.unrolled(sharing, outside, inside)
        if mode == INNERMOST:
            innermost = [*sharing.innermost(var, size), *inside, "}"]
            return [*_serial(outer), *outside, *innermost, *("}" for _ in outer)]
        innermost = [f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{", *inside, "}"]
        if mode == OUTER:
            opened, closing = sharing.collapsed([(v, n, 1) for v, n in outer])
            return [*opened, *outside, *innermost, *("}" for _ in range(closing))]
        sharing.serial()
        return [*_serial(outer), *outside, *innermost, *("}" for _ in outer)]

    def unrolled(self, sharing: Sharing, outside: list[str], inside: list[str]) -> list[str]:
        """Each value of the short innermost loop a unit-stride stream of the vectorized loop around it, which
        the compiler interleaves (a scalar loop of two or three iterations, inside a collapsed parallel loop,
        recovered every variable with a division per iteration: the [1, 3, 224, 224] input transpose ran
        38 -> 6 µs, shufflenet's [28, 28, 58, 2] shuffle 24 -> 4)."""
        *outer, (vector, vector_size), (short, short_size) = self.phase.loops
        body = [f"#pragma GCC unroll {short_size}", f"for (int64_t {short} = 0; {short} < {short_size}; {short}++) {{",
                *inside, "}"]  # fmt: skip
        mode = self.phase.parallel.mode
        if mode == INNERMOST:
            return [*_serial(tuple(outer)), *outside, *sharing.innermost(vector, vector_size), *body, "}",
                    *("}" for _ in outer)]  # fmt: skip
        vectorized = ["#pragma omp simd reduction(|:err)",
                      f"for (int64_t {vector} = 0; {vector} < {vector_size}; {vector}++) {{", *body, "}"]  # fmt: skip
        if mode == OUTER:
            opened, closing = sharing.collapsed([(v, n, 1) for v, n in outer])
            return [*opened, *outside, *vectorized, *("}" for _ in range(closing))]
        sharing.serial()
        return [*_serial(tuple(outer)), *outside, *vectorized, *("}" for _ in outer)]

    def temp(self, register: int, ctype: str, expression: str) -> str:
        self.counter[0] += 1
        name = f"v{self.counter[0]}"
        self.names[register], self.ctypes[register] = name, ctype
        return f"const {ctype} {name} = {expression};"

    def address(self, buffer: str, index: Tree) -> str:
        if self.gir.roles.get(buffer) == "table":
            return f"{self.prefix}_{buffer}[{c_index(index, _no_value, self.prefix)}]"
        return f"{buffer}[{c_index(index, _no_value, self.prefix)}]"

    def statement(self, op: GOperator) -> str | None:
        if op.kind == CONSTANT:  # a literal wherever it is read
            value, dtype = op.code
            self.names[op.writes[0]], self.ctypes[op.writes[0]] = c_literal(value, dtype), C_TYPES[dtype]
            return None
        if op.kind == MOVE:
            side = self.gir.slices[op.reads[0] if op.name == "load" else op.writes[0]]
            if op.name == "load" and side.buffer in self.gir.tables:  # a constant array: read where it is used
                table = self.gir.tables[side.buffer]
                self.names[op.writes[0]] = self.address(side.buffer, op.code)
                self.ctypes[op.writes[0]] = "int64_t" if table.dtype.kind == "i" else "float"
                return None
            if op.name == "load":
                return self.temp(op.writes[0], self.types[side.buffer], self.address(side.buffer, op.code))
            target_type = self.types[side.buffer]
            return f"{self.address(side.buffer, op.code)} = ({target_type})({self.names[op.reads[0]]});"
        if op.kind != ELEMENTWISE or op.name in _SILENT:
            return None  # broadcast and sync: no statement on a CPU thread
        args = [self.names[r] for r in op.reads]
        if op.name == "cast":
            ctype = C_TYPES[op.code]
            return self.temp(op.writes[0], ctype, f"({ctype})({args[0]})")
        if op.name == "where":  # a value condition: both sides are safe to compute, and a select vectorizes
            return self.temp(op.writes[0], self.ctypes[op.reads[1]], f"({args[0]} ? {args[1]} : {args[2]})")
        expression = c_unary(op.name, op.code, args[0]) if len(args) == 1 else \
            c_binary(op.name, op.code, args[0], args[1])  # fmt: skip
        return self.temp(op.writes[0], c_value_type(op.name, op.code), expression)


def _serial(loops: tuple[tuple[str, int], ...]) -> list[str]:
    return [f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{" for var, size in loops]
