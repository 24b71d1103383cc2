"""Lower a kernel's loop description (`KernelLoops`) to GIR: the choices of how it runs, made here, and what
a renderer needs to write it (c/render.py renders C from nothing else).

Each parallel loop becomes a `GirPhase` whose parallel unit says how many threads share it and which of its
loops they share (`sharing.parallel_mode`, the target's parallel_min_elements) and how many vector lanes an instruction
block has (the target's lanes when every access along the innermost loop is affine, else 1), and whose loop structure is
decided: an unrolled short innermost loop, tiles for a transposed read, pieces of an innermost loop cut where
its selects change, a reduction interchanged with the output's innermost loop, rows with their steps. Every
load becomes a `move` from a global slice to a register slice, every store a `move` back; the pattern of a
slice is the access's stride along the innermost loop (the reduction's innermost loop inside a reduction,
unless it is interchanged). A reduction's body, each side of a select on indices, a row step and a piece of a
split loop are scopes: their gOperators run in that loop body or branch. Nothing is optimised here: each
load reads global memory, even one another load or an earlier pass already brought into the thread's cache,
and a computation invariant along the innermost loop runs per element. The rewrite rules (`rules.py`) are
what raise, merge and swap.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import numpy as np

from kernorch.codegen.gir.graph import (
    BROADCAST,
    CONSTANT,
    ELEMENTWISE,
    GLOBAL,
    INNERMOST,
    MOVE,
    OUTER,
    REDUCE,
    REGISTER,
    SERIAL,
    SYNC,
    Constant,
    Gir,
    GirPhase,
    GOperator,
    MemorySlice,
    ParallelUnit,
    Reduction,
    RowStep,
    Select,
    bare_sum,
)
from kernorch.codegen.gir.reductions import (
    interchangeable,
    joined_taps,
    mentions_any,
    reduced_per_element,
    shared_extrema,
    splits_among_threads,
)
from kernorch.codegen.gir.row_permute import VECTOR, permutable, row_access, row_loops_of
from kernorch.codegen.gir.sharing import parallel_mode, short_innermost
from kernorch.codegen.gir.tee import tee_maps_into_reductions
from kernorch.codegen.gir.tiling import mentions, reads_transposed, rows_share_a_set, stride_along, transposed_copy
from kernorch.codegen.gir.variance import one_pass_columns, one_pass_variance
from kernorch.codegen.loops import (
    SUPPORTED_DTYPES,
    Digit,
    KernelLoops,
    Phase,
    Tree,
    count_kinds,
    linearize,
    split_innermost,
    substituted,
)
from kernorch.codegen.target import CPU, Target


class _Lowering:
    def __init__(self, loops: KernelLoops, target: Target) -> None:
        self.lanes, self.tile = target.lanes, target.tile
        self.dtypes = {b.name: b.dtype for b in loops.buffers}
        self.tables = loops.tables
        self.widths = _row_widths(loops)
        self.slices: list[MemorySlice] = []
        self.ops: list[GOperator] = []
        self.invariant: set[int] = set()  # register slices invariant along the innermost loop
        self.scope: tuple[int, ...] = ()  # the nest of loop bodies (row steps, reductions) ops go into
        self.scopes = 0
        # (guard, body) scopes the next reduction lowered puts its gOperators in: a sum joined with the one
        # before it (reductions.joined_taps) shares its loop body, so loads of the same slice there merge
        self.shared_scopes: tuple[int, int] | None = None

    def emit(self, op: GOperator) -> None:
        self.ops.append(replace(op, scope=self.scope))

    def new_scope(self) -> int:
        self.scopes += 1
        return self.scopes

    def slice(self, s: MemorySlice) -> int:
        self.slices.append(s)
        return len(self.slices) - 1

    def register(self, dtype: str, lanes: int, invariant: bool) -> int:
        # an invariant value is one scalar broadcast to the lanes: stride 0
        sid = self.slice(MemorySlice(f"r{len(self.slices)}", REGISTER, 1, 1 if invariant else lanes,
                                     0 if invariant else 1, int(np.dtype(dtype).itemsize)))  # fmt: skip
        if invariant:
            self.invariant.add(sid)
        return sid

    def access(self, buffer: str, index: Tree, inner: str | None, ranges: dict[str, int], lanes: int,
               tiled: bool, order: tuple[tuple[str, int], ...] = (),
               short: tuple[str, int] | None = None) -> MemorySlice:  # fmt: skip
        """The slice one block of `index` touches. Its `index` names the data: "iteration" when the access is
        the phase's row-major iteration number itself (whatever its loop variables are called), so phases with
        the same trip count that write and read that way touch the same elements in the same iterations.
        `short` is the unrolled innermost loop (var, size) of a `short_innermost` phase: an access strided by
        its size along `inner` and unit-stride along it is interleaved, the unrolled blocks sharing its lines."""
        itemsize = int(np.dtype(self.dtypes.get(buffer, "float32")).itemsize)
        stride = 0 if inner is None or not mentions(index, inner) else stride_along(index, inner, ranges)
        interleaved = short is not None and stride == short[1] and stride_along(index, short[0], ranges) == 1
        if stride == 0:
            count, width, step = 1, 1, 0
        elif stride == 1 or interleaved or (tiled and stride is not None):  # a tiled transpose reads whole lines
            count, width, step = 1, lanes, 1
        else:
            count, width, step = lanes, 1, -1 if stride is None else abs(stride)
        name = "iteration" if order and _in_iteration_order(index, order, ranges) else repr(index)
        return MemorySlice(buffer, GLOBAL, count, width, step, itemsize, name)

    def value(self, tree: Tree, ctx: dict[str, Any]) -> int:
        """Lower a value tree; returns the register slice holding it."""
        kind = tree[0]
        lanes, inner = ctx["lanes"], ctx["inner"]
        invariant = inner is None or not mentions(tree, inner)
        blocks = ctx["blocks"]
        # a value that changes along a loop the renderer keeps around the innermost one (an unrolled short
        # innermost loop, a row step's loops) cannot run before it
        outer = 0 if any(mentions(tree, var) for var in ctx["pinned"]) else ctx["outer"]
        if kind == "load" and ctx["permuted"]:
            permuted = self.permuted_row(tree, ctx, invariant, outer)
            if permuted is not None:
                return permuted
        if kind == "load":
            indices: list[int] = []
            address = self.gathered(tree[2], ctx, indices)
            source = self.slice(self.access(tree[1], tree[2], inner, ctx["ranges"], lanes, ctx["tiled"],
                                            ctx["order"], ctx.get("short")))  # fmt: skip
            self.index_work(tree[2], blocks)
            target = self.register(self.dtypes.get(tree[1], "float32"), lanes, invariant)
            taps = ctx.get("taps", (set(), 1))
            # the same elements at every tap of the reduction around it (a bias, a shift): moved once per output
            # block, its later loads hitting the cache (counted per tap, a bias added inside an instance norm's
            # sum weighed as much as the map)
            moved = blocks // taps[1] if taps[0] and not mentions_any(tree[2], taps[0]) else blocks
            self.emit(GOperator(MOVE, "load", (source, *indices), (target,), max(moved, 1), outer_executions=outer,
                                code=address))  # fmt: skip
            return target
        if kind == "table":
            indices = []
            address = self.gathered(tree[2], ctx, indices)
            source = self.slice(MemorySlice(tree[1], GLOBAL, 1, 1, 0, 4, repr(tree[2])))
            target = self.register("float32", lanes, invariant)
            self.emit(GOperator(MOVE, "load", (source, *indices), (target,), blocks, outer_executions=outer,
                                code=address))  # fmt: skip
            return target
        if kind == "const":
            target = self.register(tree[2], lanes, True)
            self.emit(GOperator(CONSTANT, "const", (), (target,), 0, code=Constant(tree[1], tree[2])))
            return target
        if kind == "scalar":  # a row statistic an earlier row step computed
            target = self.register("float32", lanes, True)
            self.emit(GOperator(CONSTANT, "slot", (), (target,), 0, code=tree[1]))
            return target
        if kind == "reduce":
            return self.reduction(tree, ctx)
        if kind == "tee":  # the value, also stored (a map phase moved into the reduction computing it: tee.py)
            result = self.value(tree[3], ctx)
            self.store_at(tree[1], tree[2], result, ctx)
            return result
        if kind == "where" and tree[1][0] not in _VALUE_KINDS:
            return self.guarded_select(tree, ctx)
        if kind == "op" and tree[1] == "div" and tree[2] in ("float32", "float64") and tree[4][0] == "scalar":
            # by a row statistic (softmax's sum): times its reciprocal, computed once per row (a division per
            # element cost 8 % of a [2048, 256] softmax; the product is within an ulp of the quotient unless
            # the statistic is below 2^-126, where its reciprocal overflows: never a softmax's sum, >= 1)
            return self.value(("op", "mul", tree[2], tree[3], ("op", "reciprocal", tree[2], tree[4])), ctx)
        if kind in ("op", "cast", "where"):
            # operands are value trees (an index condition of a select is address work, not a value)
            reads = tuple(self.value(c, ctx) for c in tree[1:] if isinstance(c, tuple) and c and c[0] in _VALUE_KINDS)
            dtype = tree[2] if kind == "op" else tree[1] if kind == "cast" else "float32"
            target = self.register(dtype if dtype in SUPPORTED_DTYPES else "float32", lanes,
                                   all(r in self.invariant for r in reads))  # fmt: skip
            name = tree[1] if kind == "op" else kind
            self.emit(GOperator(ELEMENTWISE, name, reads, (target,), blocks, outer_executions=outer,
                                      code=dtype if kind != "where" else None))  # fmt: skip
            return target
        raise ValueError(f"not a value tree: {kind}")

    def permuted_row(self, tree: Tree, ctx: dict[str, Any], invariant: bool, outer: int) -> int | None:
        """A load of a phase run by permuted output vectors (row_permute.py) that reads a whole input row:
        the row moves once per output row, contiguous, into registers; the renderer permutes it per block.
        None for a load along the output row."""
        row = row_loops_of(ctx["order"][-2:])
        access = row_access(tree[2], row, self.tables, self.widths.get(tree[1], 0))
        if access is None or access.along:
            return None
        itemsize = int(np.dtype(self.dtypes.get(tree[1], "float32")).itemsize)
        # named by the whole index: each tap's permutation is its own load (the merge rule must not make two
        # taps one), though both move the same row
        source = self.slice(MemorySlice(tree[1], GLOBAL, 1, access.width, 1, itemsize, repr(tree[2])))
        target = self.register(self.dtypes.get(tree[1], "float32"), ctx["lanes"], invariant)
        rows = max(ctx["elements"] // (row[2] * row[3]), 1)
        self.emit(GOperator(MOVE, "load", (source,), (target,), rows, outer_executions=outer, code=tree[2]))
        return target

    def guarded_select(self, tree: Tree, ctx: dict[str, Any]) -> int:
        """A select on indices (pad borders, concat pieces): each side may only be evaluated where its indices
        are valid, so each side's gOperators go into a scope of their own (a branch), and nothing in it, nor
        the select, runs before the innermost loop."""
        indices: list[int] = []
        condition = self.gathered(tree[1], dict(ctx, outer=0), indices, base=2)  # evaluated before the branches
        branches, reads = [], []
        for side in tree[2:]:
            branches.append(self.new_scope())
            around, self.scope = self.scope, (*self.scope, branches[-1])
            reads.append(self.value(side, dict(ctx, outer=0)))
            self.scope = around
        target = self.register(self.dtypes.get(tree[2][1], "float32") if tree[2][0] == "load" else "float32",
                               ctx["lanes"], False)  # fmt: skip
        self.emit(GOperator(ELEMENTWISE, "where", (*reads, *indices), (target,), ctx["blocks"],
                            code=Select(condition, *branches)))  # fmt: skip
        return target

    def reduction(self, tree: Tree, ctx: dict[str, Any]) -> int:
        """The body runs once per element and tap. Interchanged (the renderer puts the taps outside and the
        output's innermost loop inside), blocks step along that loop; otherwise along the reduction's own
        innermost loop, vectorized when it is long and affine."""
        _, prim, dtype, loops, body = tree
        guard = None
        if body[0] == "guard":
            guard, body = body[1], body[2]
        volume = int(np.prod([size for _, size in loops], dtype=np.int64))
        ranges = dict(ctx["ranges"])
        ranges.update(dict(loops))
        if ctx["interchanged"]:
            inner, lanes = ctx["inner"], ctx["lanes"]
        else:
            inner = loops[-1][0]
            lanes = self.lanes if loops[-1][1] >= self.lanes and _affine_along(body, inner, ranges) else 1
        blocks = max(ctx["elements"] * volume // lanes, 1)
        # the tap variables around the body and how many taps they run (a reduction nested in one: both's)
        outer_taps, outer_volume = ctx.get("taps", (set(), 1))
        inside = dict(ctx, inner=inner, lanes=lanes, ranges=ranges, blocks=blocks, tiled=False, outer=0, order=(),
                      taps=(outer_taps | {var for var, _ in loops}, outer_volume * volume))  # fmt: skip
        # per tap: the guard's values, then the body (a sum joined with the one before it: that one's scopes)
        scopes, self.shared_scopes = self.shared_scopes, None
        guard_scope, body_scope = scopes or (self.new_scope(), self.new_scope())
        around, indices = self.scope, list[int]()
        self.scope = (*around, guard_scope)
        guard = None if guard is None else self.gathered(guard, inside, indices)
        self.scope = (*around, body_scope)
        part = self.value(body, inside)
        self.scope = around
        target = self.register(dtype, ctx["lanes"], False)
        self.emit(GOperator(REDUCE, prim, (part, *indices), (target,), blocks,
                            code=Reduction(dtype, loops, guard, body_scope, guard_scope)))  # fmt: skip
        return target

    def gathered(self, index: Tree, ctx: dict[str, Any], indices: list[int], base: int = 1) -> Tree:
        """The index (or condition) with each value it reads (a gather's indices) lowered first, its register
        appended to `indices`, which the gOperator reads after its `base` other operands: ("index", value,
        size) becomes ("index", ("read", k), size), k the register's place among the gOperator's reads."""
        if not isinstance(index, tuple) or not index or not isinstance(index[0], str):
            return index
        if index[0] == "index":
            indices.append(self.value(index[1], ctx))
            return ("index", ("read", base + len(indices) - 1), index[2])
        return (index[0], *(self.gathered(child, ctx, indices, base) for child in index[1:]))

    def index_work(self, index: Tree, blocks: int) -> None:
        """Divisions and remainders left in an index after simplification: integer work per element (a
        channel shuffle's composed reshapes), as an elementwise gOperator producing the address."""
        divisions = count_kinds(index, ("/", "%"))
        if divisions:
            self.emit(GOperator(ELEMENTWISE, "index", (), (), blocks, divisions))

    def store(self, phase: Phase, result: int, ctx: dict[str, Any]) -> None:
        if not phase.scalar:
            self.store_at(phase.target, phase.store_index, result, ctx)

    def store_at(self, buffer: str, index: Tree, result: int, ctx: dict[str, Any]) -> None:
        self.index_work(index, ctx["blocks"])
        target = self.slice(self.access(buffer, index, ctx["inner"], ctx["ranges"], ctx["lanes"], ctx["tiled"],
                                        ctx["order"], ctx.get("short")))  # fmt: skip
        if self.slices[result].width != self.slices[target].width:  # an invariant value stored along the loop
            self.emit(GOperator(BROADCAST, "broadcast", (result,), (result,), ctx["blocks"]))
        indices: list[int] = []
        address = self.gathered(index, ctx, indices)
        self.emit(GOperator(MOVE, "store", (result, *indices), (target,), ctx["blocks"], code=address))

    def phase_ops(self, phase: Phase, outer: dict[str, int], repeats: int, phased: bool = True,
                  share: float = 1.0, vectorized: bool = False) -> int:  # fmt: skip
        """Lower one phase (a row step in the row schedule), whose loops run `repeats` times (once per row in
        the row schedule; `share`: the part of its innermost loop a piece of a split loop runs); returns the
        register holding its value."""
        ranges = dict(outer)
        ranges.update(dict(zip(phase.loop_vars, phase.loop_sizes, strict=True)))
        elements = int(repeats * int(np.prod(phase.loop_sizes, dtype=np.int64)) * share)
        inner = phase.loop_vars[-1] if phase.loop_vars else None
        # the renderer unrolls a short innermost loop of a phased kernel and vectorizes the one outside it
        short = (phase.loop_vars[-1], phase.loop_sizes[-1]) if phased and short_innermost(phase) else None
        if short is not None:
            inner = phase.loop_vars[-2]
        # the same test that gives the phase its loop structure (only phased kernels interchange)
        interchanged = phased and interchangeable(phase, self.dtypes.get(phase.target, "float32")) is not None
        # (`vectorized`: the renderer runs vector blocks whatever the accesses, row_permute.py)
        lanes = self.lanes if inner is not None and (vectorized or _affine_along(phase.expr, inner, ranges)) else 1
        # blocks per kernel call if run once per iteration of the loops outside the innermost (and the unrolled)
        around = int(np.prod(phase.loop_sizes[:-2 if short else -1], dtype=np.int64)) * repeats
        ctx: dict[str, Any] = {
            "ranges": ranges, "inner": inner, "lanes": lanes, "elements": elements,
            "blocks": max(elements // lanes, 1), "tiled": reads_transposed(phase, self.tile),
            "interchanged": interchanged,
            "outer": around if phase.loop_vars and not interchanged else 0, "short": short,
            "order": tuple(zip(phase.loop_vars, phase.loop_sizes, strict=True)) if not outer else (),
            "pinned": (short[0],) if short else (),  # loops a value varying along cannot run before
            "permuted": vectorized,  # whole input rows read into registers, permuted per output vector
        }  # fmt: skip
        if not phased:  # a row step: what the renderer runs before its loops runs once per row
            ctx.update(outer=repeats if phase.loop_vars else 0, pinned=phase.loop_vars[:-1])
        result = self.value(phase.expr, ctx)
        self.store(phase, result, ctx)
        return result


_VALUE_KINDS = {"load", "const", "op", "cast", "where", "reduce", "scalar", "table", "tee"}


def _affine_along(tree: Any, var: str, ranges: dict[str, int]) -> bool:
    """Every load outside nested reductions steps affinely along `var` (the loop vectorizes)."""
    if not isinstance(tree, tuple) or not tree:
        return True
    if tree[0] == "load":
        return not mentions(tree[2], var) or stride_along(tree[2], var, ranges) is not None
    if tree[0] == "reduce":
        return True
    return all(_affine_along(c, var, ranges) for c in tree[1:])


def _in_iteration_order(index: Tree, order: tuple[tuple[str, int], ...], ranges: dict[str, int]) -> bool:
    """The index is Σ var · (product of the sizes of the loops inside it): the flat iteration number."""
    terms, constant = linearize(index, ranges)
    terms = {t: c for t, c in terms.items() if not (isinstance(t, Digit) and ranges.get(t.var) == 1)}  # always 0
    expected: dict[object, int] = {}
    stride = 1
    for var, size in reversed(order):
        if size > 1:
            expected[Digit(var, 1, None)] = stride
        stride *= size
    return constant == 0 and terms == expected


def lower(loops: KernelLoops, target: Target = CPU) -> Gir:
    """The kernel's GIR before any rewrite, its choices made for `target` (threads, lanes, tiles)."""
    threads, lanes, enough = target.threads, target.lanes, target.parallel_min_elements
    if loops.schedule == "row" and int(np.prod(loops.row_shape, dtype=np.int64)) >= ROW_BLOCK:
        loops, _ = one_pass_variance(loops, ROW_BLOCK, SHORT_ROW_ELEMENTS)
    loops, _ = one_pass_columns(loops)
    loops = tee_maps_into_reductions(loops)
    lowering = _Lowering(loops, target)
    phases: list[GirPhase] = []
    buffer_bytes = {b.name: max(int(np.prod(b.shape, dtype=np.int64)), 1) * int(np.dtype(b.dtype).itemsize)
                    for b in loops.buffers}  # fmt: skip
    buffer_bytes.update({name: int(values.nbytes) for name, values in loops.tables.items()})
    roles = {b.name: b.role for b in loops.buffers} | {name: "table" for name in loops.tables}
    if loops.schedule == "row":
        rows = int(np.prod(loops.row_shape, dtype=np.int64))
        outer = dict(zip(loops.row_vars, loops.row_shape, strict=True))
        row_elements = max((int(np.prod(p.loop_sizes)) for p in loops.phases if p.loop_vars), default=1)
        steps = []
        for phase in loops.phases:
            lowering.scope = (lowering.new_scope(),)
            result = lowering.phase_ops(phase, outer, rows, phased=False)
            steps.append(RowStep(lowering.scope, tuple(zip(phase.loop_vars, phase.loop_sizes, strict=True)),
                                 phase.target if phase.scalar else "", result))  # fmt: skip
        steps, lowering.ops = _sums_of_stored(steps, lowering.ops, lowering.slices)
        tails = [lanes if not target.generic and _overlaps_its_tail(step, lowering.ops, lowering.slices, lanes) else 0
                 for step in steps]  # fmt: skip
        steps = [replace(step, overlapped_tail=tail, independent=_independent(step, lowering.ops, lowering.slices))
                 for step, tail in zip(steps, tails, strict=True)]  # fmt: skip
        across = _summed_across_rows(steps, lowering.ops, rows, row_elements)
        across = None if across is None else _joined(across, lowering.ops)
        block = ROW_BLOCK if across is not None else 0
        itemsize = max(int(np.dtype(b.dtype).itemsize) for b in loops.buffers)
        shared = rows > 1 and rows * row_elements >= enough
        # one row (a whole tensor's statistics): its long extrema shared out instead
        ops = shared_extrema(lowering.ops, {step.scope for step in steps}) if rows == 1 and not block and \
            threads > 1 else lowering.ops  # fmt: skip
        unit = ParallelUnit(threads if shared or ops != lowering.ops else 1, lanes,
                            -(-rows // block) if block else rows, OUTER if shared else SERIAL)  # fmt: skip
        phases.append(GirPhase(unit, tuple(ops), row_elements * itemsize,
                               tuple(zip(loops.row_vars, loops.row_shape, strict=True)),
                               steps=tuple(across or steps), row_block=block))  # fmt: skip
    else:
        joined: dict[int, Phase] = {}  # phase p -> the next phase, run in p's loops (reductions.joined_taps)
        for p, (first, second) in enumerate(itertools.pairwise(loops.phases)):
            partner = None if p - 1 in joined else joined_taps(first, second, lowering.dtypes.get(first.target, ""),
                                                               enough)  # fmt: skip
            if partner is not None and lowering.dtypes.get(second.target) == lowering.dtypes.get(first.target):
                joined[p] = partner
        for p, phase in enumerate(loops.phases):
            if p - 1 in joined:
                continue
            lowering.ops, split_loop = [], []
            if p:  # what earlier phases wrote is read only after every thread has written it
                lowering.ops.append(GOperator(SYNC, "device", (), (), 1))
            # an upsampling of short rows: output vectors permuted from input rows in registers, unsplit
            # (the permutation is written for registers of VECTOR lanes)
            permuted = lanes == VECTOR and not reads_transposed(phase, target.tile) and \
                _mode(phase, short_innermost(phase), False, enough) != INNERMOST and \
                permutable(phase, loops.tables, lowering.dtypes, _row_widths(loops))  # fmt: skip
            pieces = None if permuted else _pieces(phase, lowering.dtypes.get(phase.target, "float32"), target.tile,
                                                   enough)  # fmt: skip
            if pieces is None:
                lowering.phase_ops(phase, {}, 1, vectorized=permuted)
            if p in joined:
                reduce = next(op for op in lowering.ops if op.kind == REDUCE and op.scope == ())
                lowering.shared_scopes = (reduce.reduction.guard_scope, reduce.reduction.body)
                lowering.phase_ops(joined[p], {}, 1)
            for begin, end, expr in pieces or ():  # one scope of gOperators per piece of the split loop
                lowering.scope = (lowering.new_scope(),)
                share = (end - begin) / phase.loop_sizes[_vector_axis(phase)]
                lowering.phase_ops(replace(phase, expr=expr), {}, 1, share=share)
                split_loop.append((begin, end, lowering.scope))
            lowering.scope = ()
            elements = int(np.prod(phase.loop_sizes, dtype=np.int64))
            split = splits_among_threads(phase, lowering.dtypes.get(phase.target, "float32"), enough)
            parallel = threads if elements * reduced_per_element(phase.expr) >= enough or split else 1
            widest = max((lowering.slices[op.writes[0]].width for op in lowering.ops if op.writes), default=1)
            short = short_innermost(phase)
            reduction = "split" if split else "interchanged" if interchangeable(phase, lowering.dtypes.get(
                phase.target, "float32")) is not None else ""  # fmt: skip
            tiled, strides = "", (0, 0)
            # a float copy moves register blocks: in tiles, or strips of input rows
            if reads_transposed(phase, target.tile):
                copy = transposed_copy(phase, lowering.dtypes)
                strides = (0, 0) if copy is None else copy[1:]
                tiled = "elements" if copy is None else "strips" if rows_share_a_set(copy[1]) else "blocks"
            mode = (OUTER if elements >= enough else SERIAL) if tiled else \
                _mode(phase, short, reduction != "", enough)  # fmt: skip
            ops = shared_extrema(lowering.ops) if mode == SERIAL and parallel > 1 else lowering.ops
            phases.append(GirPhase(ParallelUnit(parallel, widest, elements, mode), tuple(ops),
                                   loops=tuple(zip(phase.loop_vars, phase.loop_sizes, strict=True)),
                                   unrolled=phase.loop_vars[-1] if short else "", reduction=reduction,
                                   tiled=tiled, strides=strides, pieces=tuple(split_loop),
                                   row_permuted=permuted))  # fmt: skip
    return Gir(tuple(lowering.slices), tuple(phases), buffer_bytes, roles, tuple(loops.buffers), dict(loops.tables))


def _sums_of_stored(steps: list[RowStep], ops: list[GOperator],
                    slices: list[MemorySlice]) -> tuple[list[RowStep], list[GOperator]]:  # fmt: skip
    """A row step summing what the loop step before it just stored, element by element in the same order
    (softmax's denominator over its exponentials), is fused into that loop: the loop sums as it stores, one
    pass over the row fewer. The sum's own gOperators are dropped."""
    fused: list[RowStep] = []
    dropped: set[int] = set()
    for step in steps:
        before = fused[-1] if fused else None
        stored = None if before is None else _stored_and_summed(before, step, ops, slices)
        if before is None or stored is None:
            fused.append(step)
            continue
        fused[-1] = replace(before, slot=step.slot, result=stored, summed=True)
        dropped |= {id(op) for op in ops if op.scope[: len(step.scope)] == step.scope}
    return fused, [op for op in ops if id(op) not in dropped]


# Rows up to SHORT_ROW_ELEMENTS long pay per row more than per element: a horizontal sum of the lane partials
# (eight dependent adds), a square root and a division per row of 32 floats. In blocks of ROW_BLOCK rows those
# sums are one transposing add of eight partial vectors and the work after them runs across the rows as
# vectors: segformer's [16384, 32] layer norm (variance and apply) ran 68 -> 49 us standalone, a [2048, 256]
# one 62 -> 39. Longer rows gain less, and the renderer's unrolled row loop would grow with them.
ROW_BLOCK = 8
SHORT_ROW_ELEMENTS = 256


def _summed_across_rows(steps: list[RowStep], ops: list[GOperator], rows: int,
                        row_elements: int) -> list[RowStep] | None:  # fmt: skip
    """The steps with those whose sum is kept as lane partials and summed across a block's rows marked, when
    the rows are short and at least one step is such a sum; else None (the rows run one at a time)."""
    if rows < ROW_BLOCK or row_elements > SHORT_ROW_ELEMENTS:
        return None
    marked = [replace(step, across=True) if _sum_across(step, ops) else step for step in steps]
    return marked if any(step.across for step in marked) else None


def _sum_across(step: RowStep, ops: list[GOperator]) -> bool:
    """A row statistic that is a float32 sum over one loop of at least ROW_BLOCK elements, unguarded, with no
    reduction inside its body and nothing computed before it in the step (the gOperators after the sum run in
    a loop across the block's rows of their own)."""
    if not step.slot or step.loops or step.summed:
        return False
    mine = [(position, op) for position, op in enumerate(ops) if op.scope[: len(step.scope)] == step.scope]
    sums = [(position, op) for position, op in mine if op.kind == REDUCE and op.scope == step.scope]
    if len(sums) != 1:
        return False
    at, reduce = sums[0]
    dtype, taps, guard, body_scope, *_ = reduce.reduction
    if reduce.name != "reduce_sum" or dtype != "float32" or guard is not None or len(taps) != 1 \
            or taps[0][1] < ROW_BLOCK:  # fmt: skip
        return False
    body = (*step.scope, body_scope)
    if any(op.kind == REDUCE for _, op in mine if op.scope[: len(body)] == body):
        return False
    # nothing but constants before it in its own scope: the rules merge equal loads and computations within
    # a scope, so a gOperator after the sum could otherwise come to read one from before it
    return not any(position < at and op.kind != CONSTANT and op.scope == step.scope for position, op in mine)


def _joined(steps: list[RowStep], ops: list[GOperator]) -> list[RowStep]:
    """The steps with each sum across rows marked `joined` when the step after it is one too, over as many
    elements, and neither reads the other's value: both sum in one loop over the row. Only sums that are the
    step's value itself (nothing computed after them), so the renderer has nothing to interleave."""
    marked = list(steps)
    k = 0
    while k + 1 < len(marked):
        first, second = marked[k], marked[k + 1]
        if first.across and second.across and bare_sum(first, ops) and bare_sum(second, ops) \
                and _taps(first, ops) == _taps(second, ops) and not _reads_slot(second, first.slot, ops):  # fmt: skip
            marked[k] = replace(first, joined=True)
            k += 2
        else:
            k += 1
    return marked


def _taps(step: RowStep, ops: list[GOperator]) -> int:
    reduce = next(op for op in ops if op.scope == step.scope and op.kind == REDUCE)
    return int(reduce.reduction.loops[0][1])


def _reads_slot(step: RowStep, slot: str, ops: list[GOperator]) -> bool:
    return any(op.kind == CONSTANT and op.name == "slot" and op.slot == slot
               for op in ops if op.scope[: len(step.scope)] == step.scope)  # fmt: skip


def _mapping_reads(step: RowStep, ops: list[GOperator],
                   slices: list[MemorySlice]) -> tuple[set[str], set[tuple[str, str]]] | None:  # fmt: skip
    """For a loop step over one loop that only maps (no reduction in it): the buffers it stores and the
    (buffer, level) slices it reads; None for any other step."""
    if step.slot or step.summed or len(step.loops) != 1:
        return None
    mine = [op for op in ops if op.scope[: len(step.scope)] == step.scope]
    if any(op.kind == REDUCE for op in mine):
        return None
    stored = {slices[op.writes[0]].buffer for op in mine if op.kind == MOVE and op.name == "store"}
    read = {(slices[r].buffer, slices[r].level) for op in mine if op.kind == MOVE for r in op.reads}
    return stored, read


def _overlaps_its_tail(step: RowStep, ops: list[GOperator], slices: list[MemorySlice], lanes: int) -> bool:
    """A loop step over one loop longer than a vector but not a multiple of it, that only maps (no reduction
    in it) and reads no buffer it stores, can end in a vector block overlapping the one before it: the
    remainder elements were a scalar loop of up to 15 exps per row (vit's softmax over rows of 197: 29 -> 26
    us). Recomputing an element from the same inputs stores the value it already holds."""
    mapping = _mapping_reads(step, ops, slices)
    if mapping is None or step.loops[0][1] < lanes or step.loops[0][1] % lanes == 0:
        return False
    stored, read = mapping
    return stored.isdisjoint(buffer for buffer, level in read if level == GLOBAL)


def _independent(step: RowStep, ops: list[GOperator], slices: list[MemorySlice]) -> bool:
    """A loop step over one loop that only maps and reads no buffer it stores, at any level: its iterations
    are independent, and the renderer makes it a simd loop (without the pragma GCC vectorized a [16384, 32]
    layer norm's apply loop less well: 42.8 vs 39.8 µs)."""
    mapping = _mapping_reads(step, ops, slices)
    return mapping is not None and mapping[0].isdisjoint(buffer for buffer, _ in mapping[1])


def _stored_and_summed(loop: RowStep, step: RowStep, ops: list[GOperator], slices: list[MemorySlice]) -> int | None:
    """The register `loop` stores when `step` is a float sum over exactly the elements `loop` stored, read
    back at the same indices in the same order; else None."""
    if loop.slot or loop.summed or len(loop.loops) != 1 or not step.slot or step.loops:
        return None
    stores = [op for op in ops if op.scope == loop.scope and op.kind == MOVE and op.name == "store"]
    own = [op for op in ops if op.scope == step.scope]
    if len(stores) != 1 or len(own) != 1 or own[0].kind != REDUCE or own[0].name != "reduce_sum":
        return None
    reduce = own[0]
    dtype, taps, guard, body_scope, *_ = reduce.reduction
    (var, size), store = loop.loops[0], stores[0]
    body = [op for op in ops if op.scope[: len(step.scope) + 1] == (*step.scope, body_scope)]
    if dtype not in ("float32", "float64") or guard is not None or len(taps) != 1 or taps[0][1] != size \
            or len(body) != 1 or body[0].kind != MOVE or body[0].name != "load":  # fmt: skip
        return None
    load = body[0]
    buffer = slices[store.writes[0]].buffer
    if reduce.reads[0] != load.writes[0] or slices[load.reads[0]].buffer != buffer or \
            substituted(load.index, {taps[0][0]: ("var", var)}) != store.index:  # fmt: skip
        return None
    return store.reads[0]


def _row_widths(loops: KernelLoops) -> dict[str, int]:
    """Each buffer's innermost extent (the rows an access may load whole)."""
    return {b.name: b.shape[-1] if b.shape else 1 for b in loops.buffers}


def _mode(phase: Phase, short: bool, interchanged: bool, enough: int) -> str:
    """How the threads share the phase's loops (what the renderer opens): an unrolled short innermost loop
    counts with the loop around it; an interchanged reduction shares only the loops outside the output's
    innermost axis, each of whose iterations runs all of the reduction's taps."""
    sizes = phase.loop_sizes
    if interchanged:
        outer = int(np.prod(sizes[:-1], dtype=np.int64))
        work = outer * sizes[-1] * reduced_per_element(phase.expr)
        return OUTER if outer > 1 and work >= enough else SERIAL
    return parallel_mode((*sizes[:-2], sizes[-2] * sizes[-1]) if short else sizes, reduced_per_element(phase.expr),
                         enough)


def _vector_axis(phase: Phase) -> int:
    """The loop the compiler vectorizes: the innermost, or the one around an unrolled short innermost loop."""
    return -2 if short_innermost(phase) else -1


def _pieces(phase: Phase, dtype: str, tile: int, enough: int) -> list[tuple[int, int, Tree]] | None:
    """A plain phase's vectorized loop cut where its selects on that loop's variable change (splitting.py):
    (begin, end, the expression on that range); None when it is not cut. Not a loop shared out itself."""
    if not phase.loop_vars or phase.scalar or reads_transposed(phase, tile) or \
            interchangeable(phase, dtype) is not None:  # fmt: skip
        return None
    short = short_innermost(phase)
    if _mode(phase, short, False, enough) == INNERMOST:
        return None
    axis = _vector_axis(phase)
    ranges = dict(zip(phase.loop_vars, phase.loop_sizes, strict=True))
    return split_innermost(phase.expr, phase.loop_vars[axis], phase.loop_sizes[axis], ranges)
