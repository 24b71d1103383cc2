"""Render a fused memory-intensive kernel as Triton: the second language beside C (codegen/c/).

It reads the kernel's loop description (codegen/loops/: phases of loops over expression trees, the level the GIR
is lowered from) and writes one `@triton.jit` function per launch, choosing a template per phase (PowerFusion's
GPU templates, as Triton expresses them):

- `elements`: one program per block of a phase's flat index space, every element of the block a lane; a
  reduction's taps (a pooling window, a depthwise filter) run as a loop around the vectorized body.
- `rows`: one program per block of rows (the row schedule: softmax, layer and instance norms; or a phase that
  stores a reduction over many taps): the taps are vector lanes reduced across the block, the row's statistics
  stay in registers and its outputs are written in blocks of lanes. `ROWS` rows share a program when rows are
  short, one row takes a program when they are long (a row per program), so a block is a few thousand lanes.
- `tiles`: a phase that reads its input transposed (a transpose, a layout change): one program per square tile
  of its last two loops, loaded along one axis and stored along the other, Triton moving the tile between the two
  layouts through shared memory (PowerFusion's tiled transpose).
- phases that read what an earlier phase of the same program wrote are separated by a barrier; phases of the
  phased schedule (scratch between them) are separate launches, ordered by the stream.

Sizes are literals in the source (the plan is for one shape). Integer division by zero and a gather index out of
range set the kernel's error flag (`ko_err`), as the C kernels' `err`; the runtime refuses the call. Buffers of
booleans are bytes (uint8), as in C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernorch.codegen.gir import reads_transposed
from kernorch.codegen.loops import Buffer, KernelLoops, NotGeneratable, Phase, Tree
from kernorch.codegen.target import Target
from kernorch.codegen.triton.expr import (
    FLOATS,
    INT_LIMITS,
    TL_TYPES,
    binary,
    cast,
    combine,
    combined_along,
    literal,
    quaternary,
    reduction_identity,
    unary,
    value_dtype,
)

ROW_TAPS = 32  # a phase storing a reduction over at least this many taps runs as rows (its taps in lanes)
BLOCK_LANES = 1024  # lanes of one program's block at most
INDEX_CONDITIONS = ("<", ">=", "==", "&&", ">", "<=")


@dataclass(frozen=True)
class Launch:
    function: str  # the @triton.jit function's name in the module
    programs: int  # the grid: program instances
    template: str  # "elements", "rows", "tiles" or "matmul"
    block: tuple[int, ...]  # lanes per program: (BLOCK,) or (ROWS, BLOCK)


@dataclass(frozen=True)
class TritonKernel:
    """A kernel as Triton: its functions (`source`), launched in order, each with every argument."""

    name: str
    source: str
    launches: tuple[Launch, ...]
    buffers: tuple[Buffer, ...]  # the arguments: inputs, outputs, scratch
    tables: dict[str, np.ndarray] = field(default_factory=dict)  # then these constant tables, in this order

    @property
    def arguments(self) -> tuple[str, ...]:
        return (*(b.name for b in self.buffers), *self.tables, "ko_err")


def pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def element_block(count: int, target: Target) -> int:
    """Lanes per program of an `elements` phase: enough programs to fill the device's resident slots
    (`target.threads`), no fewer than a block's lanes, at most BLOCK_LANES."""
    per_program = pow2(-(-count // max(target.threads, 1)))
    return max(min(per_program, BLOCK_LANES), min(pow2(count), target.lanes))


def row_block(rows: int, length: int) -> tuple[int, int]:
    """(ROWS, BLOCK) of a `rows` phase: a row's elements in blocks of up to BLOCK_LANES lanes, and as many rows
    per program as make about BLOCK_LANES lanes (one for long rows)."""
    block = min(pow2(length), BLOCK_LANES)
    return min(max(BLOCK_LANES // block, 1), pow2(rows)), block


def both(mask: str, condition: str) -> str:
    """A mask of the lanes where both hold (`!= 0`: Triton's interpreter gives int64 for a scalar condition and
    a block mask, which a load or store refuses as a mask)."""
    return f"((({mask}) & ({condition})) != 0)"


@dataclass(frozen=True)
class Context:
    mask: str  # the lanes that run (a boolean block)
    zero: str  # int64 zeros of the block's shape: added to an address, it gives the pointer block that shape
    blocked: bool = False  # a reduction here has its taps in lanes (axis 1 of a rows block)
    taps_block: int = 0  # lanes of such a tap block
    rows: int = 0


class Writer:
    def __init__(self, loops: KernelLoops) -> None:
        self.dtypes = {b.name: b.dtype for b in loops.buffers}
        self.dtypes.update({name: ("int64" if values.dtype.kind == "i" else "float32")
                            for name, values in loops.tables.items()})  # fmt: skip
        self.lines: list[str] = []
        self.depth = 1
        self.scopes: list[dict[Any, tuple[str, str]]] = [{}]
        self.count = 0
        self.slots: dict[str, tuple[str, str]] = {}

    # ---- statements
    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def temp(self, expression: str, dtype: str, key: Any = None) -> tuple[str, str]:
        name = f"t{self.count}"
        self.count += 1
        self.emit(f"{name} = {expression}")
        if key is not None:
            self.scopes[-1][key] = (name, dtype)
        return name, dtype

    def known(self, key: Any) -> tuple[str, str] | None:
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    def open(self, header: str) -> None:
        self.emit(header)
        self.depth += 1
        self.scopes.append({})

    def close(self) -> None:
        self.depth -= 1
        self.scopes.pop()

    def error_if(self, condition: str, ctx: Context) -> None:
        self.emit(f"tl.store(ko_err + {ctx.zero} * 0, tl.full([], 1, tl.int32), mask={both(ctx.mask, condition)})")

    # ---- indices (int64)
    def index(self, tree: Tree, ctx: Context) -> str:
        kind = tree[0]
        if kind == "var":
            return str(tree[1])
        if kind == "lit":
            return str(int(tree[1]))
        key = ("i", tree, ctx.mask)
        found = self.known(key)
        if found is not None:
            return found[0]
        if kind in ("+", "-", "*"):
            text = f"({self.index(tree[1], ctx)} {kind} {self.index(tree[2], ctx)})"
        elif kind in ("/", "%"):
            text = f"({self.index(tree[1], ctx)} {'//' if kind == '/' else '%'} {self.index(tree[2], ctx)})"
        elif kind in ("min", "max"):
            text = f"tl.{kind}imum({self.index(tree[1], ctx)}, {self.index(tree[2], ctx)})"
        elif kind == "sel":
            text = f"tl.where({self.condition(tree[1], ctx)}, {self.index(tree[2], ctx)}, {self.index(tree[3], ctx)})"
        elif kind == "index":  # a value read as an index: negative counts from the end; outside is an error
            value, dtype = self.value(tree[1], ctx)
            size = int(tree[2])
            raw, _ = self.temp(f"{value}.to(tl.int64)", "int64")
            wrapped, _ = self.temp(f"tl.where({raw} < 0, {raw} + {size}, {raw})", "int64")
            self.error_if(f"(({wrapped} < 0) | ({wrapped} >= {size}))", ctx)
            text = f"tl.where(({wrapped} < 0) | ({wrapped} >= {size}), 0, {wrapped})"
        elif kind == "table":
            text = f"tl.load({tree[1]} + ({self.index(tree[2], ctx)} + {ctx.zero}), mask={ctx.mask}, other=0)"
        elif kind == "part":
            stride = int(np.prod(tree[2][tree[3] + 1:]))
            text = f"(({tree[1]} // {stride}) % {tree[2][tree[3]]})"
        else:
            raise NotGeneratable(f"index {kind} is not generated in Triton")
        return self.temp(text, "int64", key)[0]

    def condition(self, tree: Tree, ctx: Context) -> str:
        if tree[0] == "&&":
            return f"({self.condition(tree[1], ctx)} & {self.condition(tree[2], ctx)})"
        return f"({self.index(tree[1], ctx)} {tree[0]} {self.index(tree[2], ctx)})"

    # ---- values
    def value(self, tree: Tree, ctx: Context) -> tuple[str, str]:
        kind = tree[0]
        if kind == "const":
            return literal(tree[1], tree[2]), tree[2]
        if kind == "scalar":
            return self.slots[tree[1]]
        key = ("v", tree, ctx.mask)
        found = self.known(key)
        if found is not None:
            return found
        if kind in ("load", "table"):
            buffer, index = tree[1], tree[2]
            dtype = self.dtypes[buffer]
            loaded = f"tl.load({buffer} + ({self.index(index, ctx)} + {ctx.zero}), mask={ctx.mask}, other=0)"
            return self.temp(f"({loaded} != 0)" if dtype == "bool" else loaded, dtype, key)
        if kind == "op":
            prim, dtype, *args = tree[1], tree[2], *tree[3:]
            operands = [self.value(a, ctx)[0] for a in args]
            if len(operands) == 1:
                return self.temp(unary(prim, dtype, operands[0]), value_dtype(prim, dtype), key)
            if len(operands) == 4:
                return self.temp(quaternary(prim, *operands), dtype, key)
            errors: list[str] = []
            text = binary(prim, dtype, operands[0], operands[1], errors)
            for condition in errors:
                self.error_if(condition, ctx)
            return self.temp(text, value_dtype(prim, dtype), key)
        if kind == "cast":
            value, source = self.value(tree[2], ctx)
            return self.temp(cast(value, source, tree[1]), tree[1], key)
        if kind == "where":
            return self.where(tree, ctx, key)
        if kind == "reduce":
            return self.reduction(tree, ctx, key)
        raise NotGeneratable(f"value {kind} is not generated in Triton")

    def where(self, tree: Tree, ctx: Context, key: Any) -> tuple[str, str]:
        _, condition, then, otherwise = tree
        if condition[0] in INDEX_CONDITIONS:
            # a select on indices (a pad's border, a concat's pieces): each side is read only where it holds
            chosen, _ = self.temp(self.condition(condition, ctx), "bool")
            inside, _ = self.temp(both(ctx.mask, chosen), "bool")
            outside, _ = self.temp(both(ctx.mask, f"~{chosen}"), "bool")
            a, dtype = self.value(then, Context(inside, ctx.zero, ctx.blocked, ctx.taps_block, ctx.rows))
            b, _ = self.value(otherwise, Context(outside, ctx.zero, ctx.blocked, ctx.taps_block, ctx.rows))
            return self.temp(f"tl.where({chosen}, {a}, {b})", dtype, key)
        c, c_dtype = self.value(condition, ctx)
        a, dtype = self.value(then, ctx)
        b, _ = self.value(otherwise, ctx)
        chosen = c if c_dtype == "bool" else f"({c} != 0)"
        return self.temp(f"tl.where({chosen}, {a}, {b})", dtype, key)

    def reduction(self, tree: Tree, ctx: Context, key: Any) -> tuple[str, str]:
        _, prim, dtype, loops, body = tree
        identity = reduction_identity(prim, dtype)
        guard = None
        if body[0] == "guard":
            guard, body = body[1], body[2]
        if ctx.blocked:
            return self.blocked_reduction(prim, dtype, loops, guard, body, identity, ctx, key)
        acc, _ = self.temp(f"tl.where({ctx.mask}, {identity}, {identity})", dtype)
        for var, size in loops:
            self.open(f"for {var} in range({int(size)}):")
        inner = ctx
        if guard is not None:
            held, _ = self.temp(both(ctx.mask, self.condition(guard, ctx)), "bool")
            inner = Context(held, ctx.zero)
        value, _ = self.value(body, inner)
        if guard is not None:
            value = f"tl.where({inner.mask}, {value}, {identity})"
        self.emit(f"{acc} = {combine(prim, dtype, acc, value)}")
        for _ in loops:
            self.close()
        self.scopes[-1][key] = (acc, dtype)
        return acc, dtype

    def blocked_reduction(self, prim: str, dtype: str, loops: tuple[tuple[str, int], ...], guard: Tree | None,
                          body: Tree, identity: str, ctx: Context, key: Any) -> tuple[str, str]:  # fmt: skip
        """Taps in lanes: a [ROWS, TAPS] block per step, reduced across at the end (ctx.mask is [ROWS, 1])."""
        taps = math.prod(size for _, size in loops)
        lanes = ctx.taps_block
        acc, _ = self.temp(f"tl.zeros([{ctx.rows}, {lanes}], {TL_TYPES[dtype]}) + {identity}", dtype)
        start = f"s{self.count}"
        self.count += 1
        self.open(f"for {start} in range(0, {taps}, {lanes}):")
        flat, _ = self.temp(f"{start} + tl.arange(0, {lanes})[None, :].to(tl.int64)", "int64")
        held, _ = self.temp(both(ctx.mask, f"({flat} < {taps})"), "bool")
        stride = taps
        for var, size in loops:
            stride //= size
            self.emit(f"{var} = ({flat} // {stride}) % {size}" if stride > 1 else f"{var} = {flat} % {size}")
        zero = f"ko_z{ctx.rows}x{lanes}"
        inner = Context(held, zero)
        if guard is not None:
            inner = Context(self.temp(both(held, self.condition(guard, inner)), "bool")[0], zero)
        value, _ = self.value(body, inner)
        self.emit(f"{acc} = {combine(prim, dtype, acc, f'tl.where({inner.mask}, {value}, {identity})')}")
        self.close()
        return self.temp(combined_along(prim, dtype, acc, 1), dtype, key)

    def store(self, phase: Phase, ctx: Context) -> None:
        value, dtype = self.value(phase.expr, ctx)
        target = self.dtypes[phase.target]
        if dtype != target:
            value = cast(value, dtype, target)
        if target == "bool":
            value = f"{value}.to(tl.uint8)"
        self.emit(f"tl.store({phase.target} + ({self.index(phase.store_index, ctx)} + {ctx.zero}), {value}, "
                  f"mask={ctx.mask})")  # fmt: skip


def _decompose(writer: Writer, flat: str, variables: tuple[str, ...], sizes: tuple[int, ...]) -> None:
    """Loop variables from a flat index over their loops (row-major)."""
    stride = math.prod(sizes)
    for var, size in zip(variables, sizes, strict=True):
        stride //= max(size, 1)
        if size == 1:
            writer.emit(f"{var} = {flat} * 0")
        else:
            writer.emit(f"{var} = ({flat} // {stride}) % {size}" if stride > 1 else f"{var} = {flat} % {size}")


def _signature(name: str, loops: KernelLoops) -> str:
    arguments = [b.name for b in loops.buffers] + list(loops.tables) + ["ko_err"]
    return f"@triton.jit\ndef {name}({', '.join(arguments)}):"


def _elements(name: str, loops: KernelLoops, phase: Phase, target: Target) -> tuple[str, Launch]:
    count = math.prod(phase.loop_sizes)
    block = element_block(count, target)
    writer = Writer(loops)
    writer.emit(f"ko_flat = tl.program_id(0).to(tl.int64) * {block} + tl.arange(0, {block}).to(tl.int64)")
    writer.emit(f"ko_mask = ko_flat < {count}")
    writer.emit(f"ko_zero = tl.zeros([{block}], tl.int64)")
    _decompose(writer, "tl.where(ko_mask, ko_flat, 0)", phase.loop_vars, phase.loop_sizes)
    writer.store(phase, Context("ko_mask", "ko_zero"))
    source = "\n".join([_signature(name, loops), *writer.lines])
    return source, Launch(name, -(-count // block), "elements", (block,))


def _tiles(name: str, loops: KernelLoops, phase: Phase, target: Target) -> tuple[str, Launch]:
    """A phase that reads its input transposed: one program per [TA, TB] tile of its last two loops (the loops
    outside them one program each). Loads walk the tile along a, stores along b; Triton moves the tile between
    the two layouts through shared memory (PowerFusion's tiled transpose), so both sides are coalesced."""
    *outer, size_a, size_b = phase.loop_sizes
    *outer_vars, var_a, var_b = phase.loop_vars
    tile = target.tile
    tiles_a, tiles_b = -(-size_a // tile), -(-size_b // tile)
    writer = Writer(loops)
    emit = writer.emit
    emit("ko_pid = tl.program_id(0).to(tl.int64)")
    emit(f"ko_outer = ko_pid // {tiles_a * tiles_b}")
    emit(f"ko_tile = ko_pid % {tiles_a * tiles_b}")
    emit(f"{var_a} = (ko_tile // {tiles_b}) * {tile} + tl.arange(0, {tile})[:, None].to(tl.int64)")
    emit(f"{var_b} = (ko_tile % {tiles_b}) * {tile} + tl.arange(0, {tile})[None, :].to(tl.int64)")
    emit(f"ko_mask = ({var_a} < {size_a}) & ({var_b} < {size_b})")
    emit(f"ko_zero = tl.zeros([{tile}, {tile}], tl.int64)")
    _decompose(writer, "ko_outer", tuple(outer_vars), tuple(outer))
    writer.store(phase, Context("ko_mask", "ko_zero"))
    source = "\n".join([_signature(name, loops), *writer.lines])
    return source, Launch(name, math.prod(outer) * tiles_a * tiles_b, "tiles", (tile, tile))


def _rows(name: str, loops: KernelLoops, row_vars: tuple[str, ...], row_shape: tuple[int, ...],
          phases: list[Phase]) -> tuple[str, Launch]:  # fmt: skip
    """One program per ROWS rows of `row_shape`; `phases` run per row in order (statistics, then stores)."""
    rows = math.prod(row_shape)
    length = max([math.prod(p.loop_sizes) for p in phases if p.loop_vars] +
                 [math.prod(size for _, size in _taps(p.expr)) for p in phases if not p.loop_vars] + [1])
    per_program, block = row_block(rows, length)
    writer = Writer(loops)
    writer.emit(f"ko_row = tl.program_id(0).to(tl.int64) * {per_program} + "
                f"tl.arange(0, {per_program})[:, None].to(tl.int64)")  # fmt: skip
    writer.emit(f"ko_rows = ko_row < {rows}")
    writer.emit(f"ko_z{per_program}x1 = tl.zeros([{per_program}, 1], tl.int64)")
    writer.emit(f"ko_z{per_program}x{block} = tl.zeros([{per_program}, {block}], tl.int64)")
    _decompose(writer, "tl.where(ko_rows, ko_row, 0)", row_vars, row_shape)
    row = Context("ko_rows", f"ko_z{per_program}x1", blocked=True, taps_block=block, rows=per_program)
    for position, phase in enumerate(phases):
        if phase.scalar:
            writer.slots[phase.target] = writer.value(phase.expr, row)
            continue
        if not phase.loop_vars:  # one value per row
            writer.store(phase, row)
            continue
        length = math.prod(phase.loop_sizes)
        start = f"s{writer.count}"
        writer.count += 1
        writer.open(f"for {start} in range(0, {length}, {block}):")
        flat, _ = writer.temp(f"{start} + tl.arange(0, {block})[None, :].to(tl.int64)", "int64")
        held, _ = writer.temp(both("ko_rows", f"({flat} < {length})"), "bool")
        _decompose(writer, f"tl.where({held}, {flat}, 0)", phase.loop_vars, phase.loop_sizes)
        writer.store(phase, Context(held, f"ko_z{per_program}x{block}"))
        writer.close()
        if position + 1 < len(phases):
            writer.emit("tl.debug_barrier()")  # a later phase may read what this one stored (another lane's)
    source = "\n".join([_signature(name, loops), *writer.lines])
    return source, Launch(name, -(-rows // per_program), "rows", (per_program, block))


def _taps(tree: Tree) -> tuple[tuple[str, int], ...]:
    """The tap loops of the outermost reduction in `tree` (() if none)."""
    if not isinstance(tree, tuple) or not tree:
        return ()
    if tree[0] == "reduce":
        return tuple(tree[3])
    for child in tree[1:]:
        found = _taps(child) if isinstance(child, tuple) else ()
        if found:
            return found
    return ()


def render_triton(name: str, loops: KernelLoops, target: Target) -> TritonKernel:
    """The kernel as Triton functions `NAME_p0`, `NAME_p1`... (raises NotGeneratable for what Triton here does not
    spell exactly). Deterministic: the same kernel and target give the same text (saved plans are compared)."""
    for buffer in loops.buffers:
        if buffer.dtype not in TL_TYPES:
            raise NotGeneratable(f"dtype {buffer.dtype} is not generated in Triton")
    sources, launches = [], []
    if loops.schedule == "row":
        source, launch = _rows(f"{name}_p0", loops, loops.row_vars, loops.row_shape, list(loops.phases))
        sources.append(source)
        launches.append(launch)
    else:
        for position, phase in enumerate(loops.phases):
            function = f"{name}_p{position}"
            taps = math.prod(size for _, size in phase.expr[3]) if phase.expr[0] == "reduce" else 0
            if taps >= ROW_TAPS:  # a split reduction: the outputs are rows, the taps their lanes
                single = Phase(phase.target, (), (), phase.expr, phase.store_index)
                source, launch = _rows(function, loops, phase.loop_vars, phase.loop_sizes, [single])
            elif not phase.residues and reads_transposed(phase, target.tile):
                source, launch = _tiles(function, loops, phase, target)
            else:
                source, launch = _elements(function, loops, phase, target)
            sources.append(source)
            launches.append(launch)
    return TritonKernel(name, "\n\n\n".join(sources) + "\n", tuple(launches), tuple(loops.buffers),
                        dict(loops.tables))  # fmt: skip


__all__ = ["FLOATS", "INT_LIMITS", "Launch", "TritonKernel", "element_block", "render_triton", "row_block"]
