"""C for a phase whose output rows are computed by vector blocks permuted from input rows held in registers
(`GirPhase.row_permuted`, codegen/gir/row_permute.py).

Per output row: a pointer to each input row it reads (16 floats per vector register). Per block
of 16 output positions: each read of such a row is one `__builtin_shufflevector` of two adjacent registers with
constant lane indices (`vpermt2ps`; the clamps at the row's ends are in the indices), each table read a constant
array, and the rest of the body a vector loop over the block's positions, reading and storing along the row.
"""

from __future__ import annotations

from typing import Protocol

from kernorch.codegen.c.expr import c_literal
from kernorch.codegen.c.loops import Sharing, loop_headers
from kernorch.codegen.c.prelude import V16_TYPEDEF
from kernorch.codegen.gir import (
    MOVE,
    OUTER,
    VECTOR,
    Gir,
    GirPhase,
    GOperator,
    RowAccess,
    row_access,
    row_loops_of,
    table_lanes,
    window,
)
from kernorch.codegen.loops import Tree


class PhaseRenderer(Protocol):
    """What this module needs of the renderer of one phase (c/render.py's, which calls `permuted_lines`)."""

    gir: Gir
    phase: GirPhase
    counter: list[int]
    types: dict[str, str]  # buffer -> its C type
    names: dict[int, str]  # register slice -> the C temporary or literal holding it
    ctypes: dict[int, str]  # register slice -> its C type

    def index(self, tree: Tree, op: GOperator) -> str: ...

    def temp(self, register: int, ctype: str, expression: str) -> str: ...

    def statement(self, op: GOperator) -> list[str]: ...



def permuted_lines(renderer: PhaseRenderer, sharing: Sharing) -> list[str]:
    phase, gir = renderer.phase, renderer.gir
    *outer, _, _ = phase.loops
    row = row_loops_of(phase.loops)
    widths = {b.name: b.shape[-1] if b.shape else 1 for b in gir.buffers}
    accesses: dict[int, tuple[str, RowAccess]] = {}  # a load or store of a buffer -> (buffer, how it reads)
    rows: dict[str, str] = {}  # the C address of an input row's first element -> the array holding the row
    loaded: list[str] = []
    for op in phase.ops:  # one scope: no pieces, no reduction (row_permute.permutable)
        buffer = _buffer(renderer, op)
        if buffer is None or buffer in gir.tables:
            continue
        access = row_access(op.index, row, gir.tables, widths.get(buffer, 0))
        if access is None:
            raise AssertionError(f"{buffer}: read neither along the output row nor as a whole row")
        accesses[id(op)] = (buffer, access)
        start = f"&{buffer}[{renderer.index(access.base, op)}]"
        if not access.along and start not in rows:
            # read in place, not copied into an aligned array first: GCC copies with 256-bit stores where it
            # prefers 256-bit vectors, and each 512-bit read of the copy then spans two stores, which the core
            # cannot forward (it waits for both to retire). ko_v16 reads unaligned; the row is in the buffer.
            rows[start] = _fresh(renderer, "ko_x")
            loaded.append(f"const float *{rows[start]} = {start};")
    blocks: list[str] = []
    for first in range(0, row[2] * row[3], VECTOR):
        constants: list[str] = []
        body: list[str] = []
        for op in phase.ops:
            buffer = _buffer(renderer, op)
            if buffer is not None and buffer in gir.tables:
                constants += _table_block(renderer, op, buffer, row, first)
            elif id(op) in accesses and not accesses[id(op)][1].along:
                access = accesses[id(op)][1]
                constants += _permuted_block(renderer, op, rows[f"&{buffer}[{renderer.index(access.base, op)}]"],
                                             access, first)  # fmt: skip
            elif id(op) in accesses:
                at = f"{buffer}[{renderer.index(accesses[id(op)][1].base, op)} + {first} + ko_l]"
                ctype = renderer.types[accesses[id(op)][0]]
                body.append(renderer.temp(op.writes[0], ctype, at) if op.name == "load"
                            else f"{at} = ({ctype})({renderer.names[op.reads[0]]});")  # fmt: skip
            else:
                body += renderer.statement(op)
        blocks += ["{", *constants, "#pragma omp simd", f"for (int64_t ko_l = 0; ko_l < {VECTOR}; ko_l++) {{",
                   *body, "}", "}"]  # fmt: skip
    if phase.parallel.mode == OUTER:
        opened, closing = sharing.collapsed([(var, size, 1) for var, size in outer])
        return ["{", V16_TYPEDEF, *opened, *loaded, *blocks, *("}" for _ in range(closing)), "}"]
    sharing.serial()
    return ["{", V16_TYPEDEF, *loop_headers([(var, size, 1) for var, size in outer]), *loaded, *blocks,
            *("}" for _ in outer), "}"]  # fmt: skip


def _buffer(renderer: PhaseRenderer, op: GOperator) -> str | None:
    if op.kind != MOVE:
        return None
    return renderer.gir.slices[op.reads[0] if op.name == "load" else op.writes[0]].buffer


def _fresh(renderer: PhaseRenderer, prefix: str) -> str:
    renderer.counter[0] += 1
    return f"{prefix}{renderer.counter[0]}"


def _table_block(renderer: PhaseRenderer, op: GOperator, table_name: str, row: tuple[str, str, int, int],
                 first: int) -> list[str]:  # fmt: skip
    """A table read per output position (a resize's weights by residue) as the block's constant array."""
    table = renderer.gir.tables[table_name]
    values = table[list(table_lanes(op.index, row, renderer.gir.tables)[first : first + VECTOR])]
    ctype, dtype = ("int64_t", "int64") if table.dtype.kind == "i" else ("float", "float32")
    name = _fresh(renderer, "ko_w")
    renderer.names[op.writes[0]], renderer.ctypes[op.writes[0]] = f"{name}[ko_l]", ctype
    literals = ", ".join(c_literal(v.item(), dtype) for v in values)
    return [f"static const {ctype} {name}[{VECTOR}] __attribute__((aligned(64))) = {{{literals}}};"]


def _permuted_block(renderer: PhaseRenderer, op: GOperator, source: str, access: RowAccess, first: int) -> list[str]:
    """A read of an input row for the block's positions: one shuffle of the row's registers (or, without the
    compiler's shuffle, each lane read from the row's array)."""
    block = access.lanes[first : first + VECTOR]
    at = window(block, access.width)
    lanes = ", ".join(str(lane - at) for lane in block)
    low = f"({source} + {at})" if at else source
    second = f"({source} + {at + VECTOR})" if access.width > VECTOR else source
    name = _fresh(renderer, "ko_g")
    renderer.names[op.writes[0]], renderer.ctypes[op.writes[0]] = f"{name}[ko_l]", "float"
    return [f"float {name}[{VECTOR}] __attribute__((aligned(64)));", "#if KO_VECTOR_SHUFFLE",
            f"*(ko_v16 *){name} = __builtin_shufflevector(*(const ko_v16 *){low}, *(const ko_v16 *){second}, "
            f"{lanes});", "#else",
            f"for (int64_t ko_l = 0; ko_l < {VECTOR}; ko_l++) {name}[ko_l] = {low}[(int64_t[]){{{lanes}}}[ko_l]];",
            "#endif"]  # fmt: skip
