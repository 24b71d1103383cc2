"""Render `KernelLoops` as C with OpenMP: loops and pragmas around the C of each value (`c_expr.py`).

`render_kernel` is the one entry point: it lowers the loops to GIR and has `gir/render_c.py` render the
rewritten GIR when it covers the kernel; this module's tree renderer handles the rest (reductions, the row
schedule, tiled transposes, unrolled short loops, selects on indices) until the GIR renderer covers them.

Every kernel becomes `int NAME(void **buffers)`: buffers in the order of `KernelLoops.buffers` minus
scratch (inputs, then outputs). It returns 0, or 1 when a gathered index was out of range (the caller
raises). Shapes are compile-time constants; the runtime checks buffer shapes before any call.
"""

from __future__ import annotations

import numpy as np

from kernorch.codegen.c_expr import FLOAT_SUFFIX, c_binary, c_cond, c_index, c_literal, c_unary, c_value_type
from kernorch.codegen.gir.lower import lower
from kernorch.codegen.gir.render_c import render_phases
from kernorch.codegen.gir.rules import RULES, Rule, optimize
from kernorch.codegen.loops import C_TYPES, KernelLoops, Phase, Tree
from kernorch.codegen.reductions import (
    free_vars,
    interchanged_reduction,
    reduce_volume,
    reduction_identity,
    splits_among_threads,
)
from kernorch.codegen.sharing import (
    LANES,
    PARALLEL_MIN_ELEMENTS,
    PARALLEL_MIN_OUTER,
    Sharing,
    parallel_mode,
    short_innermost,
)
from kernorch.codegen.splitting import split_innermost
from kernorch.codegen.tiling import reads_transposed, tiled_loops, transposed_copy


class _Emitter:
    def __init__(self, loops: KernelLoops, prefix: str, counter: list[int],
                 scalar_types: dict[str, str] | None = None) -> None:  # fmt: skip
        self.loops = loops
        self.scalar_types = scalar_types if scalar_types is not None else {}  # row statistics: slot -> C type
        self.prefix = prefix
        self.types = {b.name: b.dtype for b in loops.buffers}
        self.lines: list[str] = []
        self.counter = counter  # shared by all emitters of a kernel: temporaries get unique names
        # Each distinct value subtree is computed once into a temporary (SSA); the memo is scoped by loop
        # nesting because a temporary defined inside a reduction loop is not visible after it.
        self.memo: dict[Tree, str] = {}

    def temp(self, ctype: str, expression: str, tree: Tree) -> str:
        self.counter[0] += 1
        name = f"v{self.counter[0]}"
        self.lines.append(f"const {ctype} {name} = {expression};")
        self.memo[tree] = name
        return name

    def index(self, tree: Tree) -> str:
        return c_index(tree, self.value, self.prefix)

    def ctype_of(self, tree: Tree) -> str:
        kind = tree[0]
        if kind == "load":
            return C_TYPES[self.types[tree[1]]]
        if kind in ("const",):
            return C_TYPES[tree[2]]
        if kind == "cast":
            return C_TYPES[tree[1]]
        if kind == "op":
            return c_value_type(tree[1], tree[2])
        if kind in ("where",):
            return self.ctype_of(tree[2])
        if kind == "reduce":
            return C_TYPES[tree[2]]
        if kind == "scalar":
            return self.scalar_types[tree[1]]
        if kind == "table":
            return "float"
        raise ValueError(kind)

    def cond(self, tree: Tree) -> str:
        return c_cond(tree, self.value, self.prefix)

    def value(self, tree: Tree) -> str:
        if tree in self.memo:
            return self.memo[tree]
        kind = tree[0]
        if kind == "load":
            ctype = C_TYPES[self.types[tree[1]]]
            return self.temp(ctype, f"{tree[1]}[{self.index(tree[2])}]", tree)
        if kind == "const":
            return c_literal(tree[1], tree[2])
        if kind == "scalar":
            return str(tree[1])
        if kind == "cast":
            return self.temp(C_TYPES[tree[1]], f"({C_TYPES[tree[1]]})({self.value(tree[2])})", tree)
        if kind == "table":
            return self.index(tree)
        if kind == "where":
            if tree[1][0] in ("<", ">=", "==", "&&"):
                return self.guarded_select(tree)
            # a value condition (ONNX Where): both sides are safe to compute; a select vectorizes
            condition, a, b = self.value(tree[1]), self.value(tree[2]), self.value(tree[3])
            return self.temp(self.ctype_of(tree[2]), f"({condition} ? {a} : {b})", tree)
        if kind == "op":
            prim, dtype, args = tree[1], tree[2], [self.value(a) for a in tree[3:]]
            expression = c_unary(prim, dtype, args[0]) if len(args) == 1 else c_binary(prim, dtype, args[0], args[1])
            return self.temp(self.ctype_of(tree), expression, tree)
        if kind == "reduce":
            return self.reduction(tree)
        raise ValueError(f"not a value tree: {kind}")

    def hoist(self, tree: Tree, inner: set[str]) -> None:
        """Emit every maximal value subtree that does not depend on the `inner` loop variables, so the
        loops below reuse it (per-row statistics such as 1/sqrt(var + eps) are computed once per row)."""
        if not isinstance(tree, tuple) or tree in self.memo:
            return
        if tree[0] in ("load", "op", "cast") and not (free_vars(tree) & inner):
            self.value(tree)
            return
        if tree[0] in ("op", "cast"):
            for child in tree[1:]:
                self.hoist(child, inner)
        elif tree[0] == "where" and tree[1][0] not in ("<", ">=", "==", "&&"):
            for child in tree[1:]:
                self.hoist(child, inner)

    def guarded_select(self, tree: Tree) -> str:
        """An index condition (pad borders, concat pieces): each side may only be evaluated where its
        indices are valid, so the sides go in branches, each with its own temporaries."""
        self.counter[0] += 1
        name = f"v{self.counter[0]}"
        self.lines.append(f"{self.ctype_of(tree[2])} {name};")
        self.lines.append(f"if ({self.cond(tree[1])}) {{")
        for branch, opener in ((tree[2], None), (tree[3], "} else {")):
            if opener:
                self.lines.append(opener)
            outer_memo = self.memo
            self.memo = dict(outer_memo)
            self.lines.append(f"{name} = {self.value(branch)};")
            self.memo = outer_memo
        self.lines.append("}")
        self.memo[tree] = name
        return name

    def reduction(self, tree: Tree) -> str:
        """Emit the loop nest into `self.lines` and return the accumulator's name."""
        _, prim, dtype, loops, body = tree
        self.counter[0] += 1
        acc = f"t{self.counter[0]}"
        is_float = dtype in FLOAT_SUFFIX
        # float sums accumulate in float: the SIMD reduction keeps one partial sum per lane, which bounds the
        # error like a pairwise sum, and double would halve the vector width and convert every element
        acc_type = C_TYPES[dtype]
        init, update = reduction_identity(prim, dtype)
        self.lines.append(f"{acc_type} {acc} = {init};")
        guard = None
        if body[0] == "guard":
            guard, body = body[1], body[2]
        if prim in ("reduce_max", "reduce_min") and is_float and guard is None and loops[-1][1] >= 2 * LANES:
            self._simd_extremum(acc, prim, loops, body)
            return self.temp(C_TYPES[dtype], f"({C_TYPES[dtype]}){acc}", tree)
        for position, (var, size) in enumerate(loops):
            if position == len(loops) - 1 and prim in ("reduce_sum", "reduce_prod") and guard is None:
                # allow the sum to be reassociated across SIMD lanes (one partial sum per lane)
                self.lines.append(f"#pragma omp simd reduction({'+' if prim == 'reduce_sum' else '*'}:{acc})")
            self.lines.append(f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{")
        outer_memo = self.memo
        self.memo = dict(outer_memo)  # temporaries made inside the loop die with it
        if guard is not None:
            # the guarded body may read out of bounds: evaluate it only inside the guard
            self.lines.append(f"if ({self.cond(guard)}) {{")
        x = self.value(body)
        self.lines.append(update.format(acc=acc, x=x))
        if guard is not None:
            self.lines.append("}")
        self.memo = outer_memo
        self.lines.extend("}" for _ in loops)
        return self.temp(C_TYPES[dtype], f"({C_TYPES[dtype]}){acc}", tree)

    def _simd_extremum(self, acc: str, prim: str, loops: tuple[tuple[str, int], ...], body: Tree) -> None:
        """A float max/min as OpenMP's simd max/min reduction (a partial result per vector lane, in a register),
        with a flag for NaN beside it: the compare-select drops a NaN, so one seen anywhere makes the result NaN
        at the end, as in numpy. max/min are exact in any order, so the result is the same as a scalar loop's.
        (Per-lane partials kept in an array carried a store and a load from one vector to the next: segformer's
        [16384, 256] row max ran 250 us that way, 123 us this way.)"""
        op, compare = ("max", ">") if prim == "reduce_max" else ("min", "<")
        *outer, (var, size) = loops
        nan = f"{acc}_nan"
        self.lines.append(f"int {nan} = 0;")
        self.lines.extend(f"for (int64_t {v} = 0; {v} < {n}; {v}++) {{" for v, n in outer)
        self.lines += [f"#pragma omp simd reduction({op}:{acc}) reduction(|:{nan})",
                       f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{"]  # fmt: skip
        outer_memo = self.memo
        self.memo = dict(outer_memo)  # temporaries made inside the loop die with it
        x = self.value(body)
        self.memo = outer_memo
        self.lines += [f"{acc} = {x} {compare} {acc} ? {x} : {acc};", f"{nan} |= {x} != {x};", "}"]
        self.lines.extend("}" for _ in outer)
        self.lines.append(f"if ({nan}) {acc} = NAN;")

    def store(self, phase: Phase) -> None:
        target_type = C_TYPES[self.types[phase.target]]
        value = self.value(phase.expr)
        self.lines.append(f"{phase.target}[{self.index(phase.store_index)}] = ({target_type})({value});")


def render_kernel(name: str, loops: KernelLoops, sharing: Sharing | None = None,
                  rules: tuple[Rule, ...] = RULES) -> str:  # fmt: skip
    """The kernel's C function. Its loops are lowered to GIR and rewritten by `rules`; the GIR renderer
    (gir/render_c.py) renders what it covers, the tree renderer here the rest (`Gir.unrendered` says why)."""
    out: list[str] = []
    for table, values in loops.tables.items():
        ctype = "int64_t" if values.dtype.kind == "i" else "float"
        body = ", ".join(str(int(v)) if ctype == "int64_t" else repr(float(v)) + "f" for v in values)
        out.append(f"static const {ctype} {name}_{table}[{max(len(values), 1)}] = {{{body or '0'}}};")
    tasks = sharing is not None and sharing.tasks
    arguments = "void **args, int ko_phase, int64_t ko_begin, int64_t ko_end" if tasks else "void **args"
    out.append(f"int {name}({arguments}) {{")
    out.append("    int err = 0;")
    # arguments: inputs, outputs, then scratch (allocated once when the plan is created: none per call)
    ordered = [b for role in ("input", "output", "scratch") for b in loops.buffers if b.role == role]
    for position, buffer in enumerate(ordered):
        ctype = C_TYPES[buffer.dtype]
        qualifier = "const " if buffer.role == "input" else ""
        out.append(f"    {qualifier}{ctype} *restrict {buffer.name} = ({qualifier}{ctype} *)args[{position}];")
    sharing = sharing or Sharing()
    gir = optimize(lower(loops), rules)
    phases = _render_phases(loops, name, sharing) if gir.unrendered else render_phases(gir, name, sharing)
    if sharing is not None and sharing.tasks:  # one case per phase, running the task's share of its loop
        if len(sharing.iterations) != len(phases):  # each phase must have said how it is shared out
            raise AssertionError(f"{name}: {len(phases)} phases but {len(sharing.iterations)} trip counts")
        cases = [f"case {p}: {{\n{_indent(lines)}\n    break; }}" for p, lines in enumerate(phases)]
        out.append("    switch (ko_phase) {\n" + "\n".join(cases) + "\n    default: return 1;\n    }")
    else:
        out.extend(_indent(lines) for lines in phases)
    out.append("    return err;\n}\n")
    return "\n".join(out)


def render_kernel_tasks(name: str, loops: KernelLoops) -> tuple[str, tuple[int, ...]]:
    """The kernel as `int NAME(void **buffers, int ko_phase, int64_t ko_begin, int64_t ko_end)`, running
    iterations [ko_begin, ko_end) of phase ko_phase's parallel loop on the calling thread (an rTask), and each
    phase's trip count."""
    sharing = Sharing(tasks=True)
    return render_kernel(name, loops, sharing), tuple(sharing.iterations)


def _indent(lines: list[str]) -> str:
    return "\n".join("    " + line for line in lines)


def scratch_bytes(loops: KernelLoops) -> list[int]:
    """Bytes of each scratch buffer, in argument order (after the inputs and outputs)."""
    return [max(int(np.prod(b.shape, dtype=np.int64)), 1) * np.dtype(b.dtype).itemsize
            for b in loops.buffers if b.role == "scratch"]  # fmt: skip


def _loop_nest(vars_: tuple[str, ...], shape: tuple[int, ...], sharing: Sharing | None, inner: list[str],
               parallel_inner: int = 1) -> list[str]:  # fmt: skip
    """Loops over `vars_`. A phase's outermost nest passes its `sharing`: all of the loops are then collapsed
    into one parallel loop when the work (their iterations times `parallel_inner` elements each) is large
    enough to pay for the threads."""
    iterations = int(np.prod(shape, dtype=np.int64))
    if sharing is not None and vars_ and iterations > 1 and iterations * parallel_inner >= PARALLEL_MIN_ELEMENTS:
        opened, closing = sharing.collapsed([(v, n, 1) for v, n in zip(vars_, shape, strict=True)])
        return [*opened, *inner, *("}" for _ in range(closing))]
    if sharing is not None:
        sharing.serial()
    lines = [f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{" for var, size in zip(vars_, shape, strict=True)]
    return [*lines, *inner, *("}" for _ in vars_)]


def _render_phases(loops: KernelLoops, prefix: str, sharing: Sharing) -> list[list[str]]:
    """Each phase's lines (one list per parallel loop: the row schedule has one)."""
    counter = [0]
    if loops.schedule == "phased":
        return [_render_phase(loops, phase, _Emitter(loops, prefix, counter), sharing) for phase in loops.phases]
    # Row schedule: a parallel loop over rows (the non-reduced axes); per row, reductions into scalars,
    # then the outputs. Reduced axes have a row variable fixed at 0.
    row_vars = loops.row_vars
    body: list[str] = [f"const int64_t {v} = 0;" for a, v in enumerate(row_vars) if loops.row_shape[a] == 1]
    scalar_types: dict[str, str] = {}
    for phase in loops.phases:
        emitter = _Emitter(loops, prefix, counter, scalar_types)
        if phase.scalar:
            value = emitter.value(phase.expr)
            body.extend(emitter.lines)
            scalar_types[phase.target] = emitter.ctype_of(phase.expr)
            body.append(f"const {scalar_types[phase.target]} {phase.target} = {value};")
        elif phase.loop_vars:  # full-shape output: inner loops over the reduced axes
            emitter.hoist(phase.expr, set(phase.loop_vars))
            body.extend(emitter.lines)
            emitter.lines = []
            emitter.store(phase)
            body.extend(_loop_nest(phase.loop_vars, phase.loop_sizes, None, emitter.lines))
        else:  # reduced-shape output: one value per row
            emitter.store(phase)
            body.extend(emitter.lines)
    outer = [(v, loops.row_shape[a]) for a, v in enumerate(row_vars) if loops.row_shape[a] != 1]
    row_elements = max((int(np.prod(p.loop_sizes)) for p in loops.phases if p.loop_vars), default=1)
    if not outer:
        sharing.serial()
        return [["{", *body, "}"]]
    return [_loop_nest(tuple(v for v, _ in outer), tuple(n for _, n in outer), sharing, body, row_elements)]


def _render_phase(loops: KernelLoops, phase: Phase, emitter: _Emitter, sharing: Sharing) -> list[str]:
    # a long reduction with nothing around it to share out among threads is split among them (reductions.py);
    # not as rTasks, whose iterations must be independent
    split = not sharing.tasks and splits_among_threads(phase, emitter.types[phase.target])
    interchanged = interchanged_reduction(emitter, phase, split)
    if interchanged is not None:
        return _loop_nest(phase.loop_vars[:-1], phase.loop_sizes[:-1], None if split else sharing, interchanged,
                          parallel_inner=phase.loop_sizes[-1] * reduce_volume(phase.expr))  # fmt: skip
    if not phase.loop_vars:
        emitter.store(phase)
        sharing.serial()
        return ["{", *emitter.lines, "}"]
    if short_innermost(phase):
        return _unrolled_innermost(phase, emitter, sharing)
    # what does not depend on the innermost loop is computed once before it
    emitter.hoist(phase.expr, {phase.loop_vars[-1]})
    hoisted, emitter.lines = emitter.lines, []
    memo = dict(emitter.memo)  # what the loops below may use: the hoisted values
    emitter.store(phase)
    if reads_transposed(phase):
        parallel = int(np.prod(phase.loop_sizes, dtype=np.int64)) >= PARALLEL_MIN_ELEMENTS
        if not parallel:
            sharing.serial()
        copy = transposed_copy(phase, emitter.types)
        blocks = None if copy is None else (f"{phase.expr[1]} + {emitter.index(copy[0])}", copy[1],
                                            f"{phase.target} + {emitter.index(phase.store_index)}", copy[2])
        nest = tuple(zip(phase.loop_vars, phase.loop_sizes, strict=True))
        return tiled_loops(nest, sharing if parallel else None, hoisted, emitter.lines, blocks)
    var, size = phase.loop_vars[-1], phase.loop_sizes[-1]
    if parallel_mode(phase.loop_sizes) == "innermost":
        innermost = [*sharing.innermost(var, size), *emitter.lines, "}"]
        return _loop_nest(phase.loop_vars[:-1], phase.loop_sizes[:-1], None, [*hoisted, *innermost])
    innermost = [f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{", *emitter.lines, "}"]
    pieces = split_innermost(phase.expr, var, size, dict(zip(phase.loop_vars, phase.loop_sizes, strict=True)))
    if pieces is not None:  # one branch-free loop per range of the innermost variable (splitting.py)
        innermost = []
        for begin, end, expr in pieces:
            emitter.memo, emitter.lines = dict(memo), []  # temporaries of one loop are not visible in the next
            emitter.store(Phase(phase.target, phase.loop_vars, phase.loop_sizes, expr, phase.store_index))
            innermost += [f"for (int64_t {var} = {begin}; {var} < {end}; {var}++) {{", *emitter.lines, "}"]
    return _loop_nest(phase.loop_vars[:-1], phase.loop_sizes[:-1], sharing, [*hoisted, *innermost],
                      parallel_inner=size)


def _unrolled_innermost(phase: Phase, emitter: _Emitter, sharing: Sharing) -> list[str]:
    """A `short_innermost` phase with its innermost loop unrolled and the loop outside it vectorized: each value
    of the short axis becomes a unit-stride stream, which the vectorizer interleaves, instead of a scalar loop of
    two or three iterations inside a collapsed parallel loop that recovers every variable with a division per
    iteration. The [1, 3, 224, 224] input transpose: 38 -> 6 µs; shufflenet's [28, 28, 58, 2] shuffle: 24 -> 4."""
    (a, size_a), (b, size_b) = zip(phase.loop_vars[-2:], phase.loop_sizes[-2:], strict=True)
    emitter.hoist(phase.expr, {a, b})
    hoisted, emitter.lines = emitter.lines, []
    emitter.store(phase)
    short = [f"#pragma GCC unroll {size_b}", f"for (int64_t {b} = 0; {b} < {size_b}; {b}++) {{", *emitter.lines, "}"]
    outer_vars, outer_sizes = phase.loop_vars[:-2], phase.loop_sizes[:-2]
    if int(np.prod(outer_sizes, dtype=np.int64)) < PARALLEL_MIN_OUTER and size_a * size_b >= PARALLEL_MIN_ELEMENTS:
        return _loop_nest(outer_vars, outer_sizes, None, [*hoisted, *sharing.innermost(a, size_a), *short, "}"])
    vectorized = ["#pragma omp simd reduction(|:err)", f"for (int64_t {a} = 0; {a} < {size_a}; {a}++) {{", *short, "}"]
    return _loop_nest(outer_vars, outer_sizes, sharing, [*hoisted, *vectorized], parallel_inner=size_a * size_b)
