"""Render a rewritten GIR as C with OpenMP (PowerFusion §7): the parallel structure first, from each phase's
parallel unit and loops, then every gOperator in order as one statement. This is the only way generated
memory-intensive kernels become C; a Triton renderer would read the same GIR.

- A phase's `mode` says which loops its threads share (`sharing.py` opens them: an OpenMP worksharing loop
  kernel by kernel, the iterations [ko_begin, ko_end) in an rTask). Every phase is a parallel loop of its
  own, whose region ends with a barrier: that is the device `sync`. (A phase whose sync the rules dropped
  could share its predecessor's loop; joining such phases is not done yet: few shared-model kernels have one
  with the same loops.)
- The loop structure is the phase's: plain; an unrolled short innermost loop (`unrolled`); tiles over the
  last two loops (`tiled`); the vectorized loop cut into pieces (`pieces`); a reduction interchanged with
  the output's innermost loop (`reduction`); or rows, each running its steps (`steps`, the row schedule).
- A register slice is a C temporary; a constant is a literal, a table element is read where it is used.
- A `move` is a load into a temporary or a store from one, addressed by the index tree it carries.
- An elementwise gOperator is its primitive's C (`c/expr.py`); a select on indices branches, each side's
  gOperators (a scope of their own) inside its branch; a reduction loops around its body's scope.
- A gOperator the rewrite rules swapped before the broadcast (`outer`) is emitted before the innermost loop
  (per value of the loop around it when tiled, per row in a row step), so it runs once per iteration of
  the loops outside it; a load `merge_read_after_read` removed is not emitted.
- `broadcast`, `sync` and address work (`index`) have no statement of their own here.

Nothing here decides which loops are parallel, what is hoisted or what is loaded once: the GIR says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np

from kernorch.codegen.c.expr import (
    FLOAT_SUFFIX,
    c_binary,
    c_bound,
    c_cast,
    c_cond,
    c_index,
    c_literal,
    c_quaternary,
    c_unary,
    c_value_type,
)
from kernorch.codegen.c.loops import (
    Sharing,
    TapRange,
    TapSum,
    interchanged_lines,
    loop_headers,
    reduction_identity,
    tiled_loops,
)
from kernorch.codegen.c.render_permuted import permuted_lines
from kernorch.codegen.c.writer import CWriter
from kernorch.codegen.gir import (
    CONSTANT,
    ELEMENTWISE,
    INNERMOST,
    MOVE,
    OUTER,
    REDUCE,
    Gir,
    GirPhase,
    GOperator,
    RowStep,
    Select,
    bare_sum,
    tap_ranges,
)
from kernorch.codegen.loops import C_TYPES, Tree, count_kinds
from kernorch.codegen.target import Target

_SILENT = ("index",)  # elementwise gOperators that stand for address arithmetic inside an index tree
SUM_UNROLL = 4  # vectors of a row added per unrolled iteration when rows are summed across a block (sum_across)


def table_formula(values: np.ndarray) -> Callable[[str], str] | None:
    """A table as C computing its element from the index, where it has such a form: one value everywhere (a
    nearest resize's weights), or the index divided by a whole factor (its taps: output i reads input i // f).
    A shape-generic kernel (Target.generic) computes them: a table's length and contents follow the sizes, and a
    `static` array cannot (codegen/generic/unify.py)."""
    if values.size == 0 or values.ndim != 1:
        return None
    first = values[0]
    if np.all(values == first):
        literal = c_literal(first.item(), "int64" if values.dtype.kind == "i" else "float32")
        return lambda index: literal
    if values.dtype.kind != "i" or values.size < 2:
        return None
    factor = int(np.argmax(values > 0)) if np.any(values > 0) else 0
    if factor < 1 or not np.array_equal(values, np.arange(values.size) // factor):
        return None
    return lambda index: f"(({index}) / {factor})" if factor > 1 else f"({index})"


def render(name: str, gir: Gir, target: Target, tasks: bool = False) -> str:
    """The kernel, lowered for `target`, as `int NAME(void **args)`, or with `tasks` as `int NAME(void **args, int
    ko_phase, int64_t ko_begin, int64_t ko_end)`, running iterations [ko_begin, ko_end) of phase ko_phase's
    parallel loop on the calling thread (an rTask; the GIR says how many there are: `Gir.task_units`)."""
    sharing = Sharing(tasks=tasks)
    w = CWriter()
    # tables computed where they are read: a shape-generic kernel's (table_formula)
    formulas = {table: formula for table, values in gir.tables.items()
                if target.generic and (formula := table_formula(values)) is not None}  # fmt: skip
    for table, values in gir.tables.items():
        if table in formulas:
            continue
        ctype = "int64_t" if values.dtype.kind == "i" else "float"
        body = ", ".join(str(int(v)) if ctype == "int64_t" else repr(float(v)) + "f" for v in values)
        w.line(f"static const {ctype} {name}_{table}[{max(len(values), 1)}] = {{{body or '0'}}};")
    arguments = "void **args, int ko_phase, int64_t ko_begin, int64_t ko_end" if sharing.tasks else "void **args"
    with w.function(f"int {name}({arguments})", returns="err"):
        w.line("int err = 0;")
        # arguments: inputs, outputs, then scratch (allocated once when the plan is created: none per call)
        ordered = [b for role in ("input", "output", "scratch") for b in gir.buffers if b.role == role]
        for position, buffer in enumerate(ordered):
            ctype, qualifier = C_TYPES[buffer.dtype], "const " if buffer.role == "input" else ""
            w.line(f"{qualifier}{ctype} *restrict {buffer.name} = ({qualifier}{ctype} *)args[{position}];")
        counter = [0]  # temporaries are numbered across the kernel
        phases = [_err_only_where_set(_Phase(gir, phase, name, counter, target, formulas, tasks).lines(sharing))
                  for phase in gir.phases]
        if not tasks:
            for lines in phases:
                w.line(*lines)
        else:  # one case per phase, running the task's share of its loop
            if tuple(sharing.iterations) != gir.task_units(target.tile):  # the loops opened are the GIR's units
                raise AssertionError(f"{name}: the rTask loops opened run {sharing.iterations} iterations, the GIR's "
                                     f"phases {gir.task_units(target.tile)}")  # fmt: skip
            with w.flat_block("switch (ko_phase)"):
                for p, lines in enumerate(phases):
                    w.verbatim(f"case {p}: {{")  # a case at column 0, its phase at the function's depth
                    w.line(*lines, "break; }")
                w.line("default: return 1;")
    return w.text(end="\n")


_ERR_CLAUSE = " reduction(|:err)"
_ERR = re.compile(r"\berr\b")


def _err_only_where_set(lines: list[str]) -> list[str]:
    """The lines with `reduction(|:err)` dropped from each simd loop whose body never sets `err` (only a
    checked gather's index does). GCC gives a simd reduction variable a copy per lane, and that alone cost
    the unrolled residue loops of a [256, 64, 64 -> 128] width doubling 131 µs against 103 without it."""
    out = list(lines)
    for i, line in enumerate(out):
        if "simd" not in line or _ERR_CLAUSE not in line or not line.lstrip().startswith("#pragma omp"):
            continue
        depth, j = 0, i + 1
        while j < len(out):  # the loop the pragma opens, to its closing brace
            depth += out[j].count("{") - out[j].count("}")
            if _ERR.search(out[j]):
                break
            j += 1
            if depth <= 0:
                out[i] = line.replace(_ERR_CLAUSE, "")
                break
    return out


class _Phase:
    def __init__(self, gir: Gir, phase: GirPhase, prefix: str, counter: list[int], target: Target,
                 formulas: dict[str, Callable[[str], str]], tasks: bool = False) -> None:  # fmt: skip
        self.gir, self.phase, self.prefix, self.counter, self.target = gir, phase, prefix, counter, target
        self.tasks = tasks  # an rTask runs a serial phase on its own thread: nothing in it is shared out
        self.formulas = formulas  # tables computed where they are read (table_formula)
        self.types = {b.name: C_TYPES[b.dtype] for b in gir.buffers}
        self.bf16_buffers = {b.name for b in gir.buffers if b.dtype == "bfloat16"}
        self.names: dict[int, str] = {}  # register slice -> the C temporary or literal holding it
        self.ctypes: dict[int, str] = {}  # register slice -> its C type
        self.numbers: set[int] = set()  # register slices holding a float literal that is not NaN
        self.slot_types: dict[str, str] = {}  # row statistic -> its C type
        self.hoisted: dict[str, str] | None = None  # hoisting in a block: hoisted index's C -> its constant

    def block(self, scope: tuple[int, ...], hoist: bool = False) -> tuple[list[str], list[str]]:
        """The lines of the gOperators of one loop body: those swapped before the innermost loop (`outer`),
        which read only their own kind and constants, then the rest; each in order, numbered in that order.
        `hoist` (a plain phase's body, or a piece of it): the parts of its addresses that hold a select but
        none of the vector loops' variables are computed before those loops (`hoisted_index`)."""
        ops = [op for op in self.phase.ops if op.scope == scope]
        for op in ops:
            if op.kind == CONSTANT:
                self.statement(op)
        # a nested body (a reduction's, a guarded branch's) hoists nothing; the enclosing body's constants
        # are kept across it and go on collecting after it
        enclosing, self.hoisted = self.hoisted, {} if hoist else None
        outside = [line for op in ops if op.outer for line in self.statement(op)]
        inside = [line for op in ops if not op.outer for line in self.statement(op)]
        mine, self.hoisted = self.hoisted, enclosing
        hoisted = [f"const int64_t {name} = {value};" for value, name in (mine or {}).items()]
        return [*hoisted, *outside], inside

    def hoisted_index(self, tree: Tree) -> Tree:
        """`tree` with each largest part holding a select (`sel`, `min`, `max`: a reflecting pad's mirrored row)
        but neither a vector loop's variable, a gather's read nor a table replaced by a constant computed
        before the loops. GCC left candy's padded input transpose with its row's selects inside the vector
        loop (33 -> 8.4 us with them hoisted)."""
        if self.hoisted is None or tree[0] in ("var", "lit", "part"):
            return tree
        # the innermost loop's variable and, around an unrolled short innermost loop, the vector loop's
        inner = {var for var, _ in self.phase.loops[-2 if self.phase.unrolled else -1:]}
        if count_kinds(tree, ("sel", "min", "max")) and not count_kinds(tree, ("index", "table")) \
                and not _loop_vars(tree) & inner:  # fmt: skip
            text = c_index(tree, lambda read: "", self.prefix, self.formulas)
            if text not in self.hoisted:
                self.counter[0] += 1
                self.hoisted[text] = f"ko_i{self.counter[0]}"
            return ("var", self.hoisted[text])
        if tree[0] in ("+", "-", "*", "/", "%"):
            return (tree[0], self.hoisted_index(tree[1]), self.hoisted_index(tree[2]))
        return tree

    def lines(self, sharing: Sharing) -> list[str]:
        if self.phase.steps:
            return self.rows(sharing)
        if self.phase.reduction:
            return self.interchanged(sharing)
        if self.phase.row_permuted:
            return permuted_lines(self, sharing)
        outside, inside = self.block((), hoist=not self.phase.tiled)
        if self.phase.tiled:
            return self.tiles(sharing, outside, inside)
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
        if self.phase.pieces:  # one branch-free loop per range of the innermost variable
            innermost = []
            for begin, end, scope in self.phase.pieces:
                before, body = self.block(scope, hoist=True)
                innermost += [*before, f"for (int64_t {var} = {begin}; {var} < {end}; {var}++) {{", *body, "}"]
        if mode == OUTER:
            opened, closing = sharing.collapsed([(v, n, 1) for v, n in outer])
            return [*opened, *outside, *innermost, *("}" for _ in range(closing))]
        sharing.serial()
        return [*_serial(outer), *outside, *innermost, *("}" for _ in outer)]

    def rows(self, sharing: Sharing) -> list[str]:
        """The row schedule: one loop over the rows (row variables of size 1 are constants); per row, the
        steps in order: row statistics, loops over the row's elements, stores of one value per row."""
        if self.phase.row_block:
            return self.row_blocks(sharing)
        body = [f"const int64_t {var} = 0;" for var, size in self.phase.loops if size == 1]
        for step in self.phase.steps:
            body += self.step(step)
        rows = [(var, size) for var, size in self.phase.loops if size != 1]
        if not rows:
            sharing.serial()
            return ["{", *body, "}"]
        if self.phase.parallel.mode == OUTER:
            opened, closing = sharing.collapsed([(v, n, 1) for v, n in rows])
            return [*opened, *body, *("}" for _ in range(closing))]
        sharing.serial()
        return [*_serial(tuple(rows)), *body, *("}" for _ in rows)]

    def step(self, step: RowStep) -> list[str]:
        """One row step's lines, for one row."""
        outside, inside = self.block(step.scope)
        if step.summed:  # loops storing and summing what they store (as stored: in the buffer's type)
            store = next(op for op in self.phase.ops if op.scope == step.scope and op.kind == MOVE
                         and op.name == "store")  # fmt: skip
            self.slot_types[step.slot] = ctype = self.types[self.gir.slices[store.writes[0]].buffer]
            self.counter[0] += 1
            acc, ((var, size),) = f"t{self.counter[0]}", step.loops
            return [*outside, f"{ctype} {acc} = 0;", f"#pragma omp simd reduction(+:{acc})",
                    f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{", *inside,
                    f"{acc} += ({ctype})({self.names[step.result]});", "}", f"const {ctype} {step.slot} = {acc};"]
        if step.slot:
            self.slot_types[step.slot] = ctype = self.ctypes[step.result]
            return [*outside, *inside, f"const {ctype} {step.slot} = {self.names[step.result]};"]
        return [*outside, *self.step_loops(step, inside)]

    def step_loops(self, step: RowStep, inside: list[str]) -> list[str]:
        """A loop step's loops around its body: with an overlapping tail, a vector loop over the whole vector
        blocks and one more over the last `overlapped_tail` elements (a loop of exactly one vector block)."""
        if not step.overlapped_tail:
            simd = ["#pragma omp simd reduction(|:err)"] if step.independent else []
            return [*simd, *_serial(step.loops), *inside, *("}" for _ in step.loops)]
        ((var, size),), width = step.loops, step.overlapped_tail
        pragma = "#pragma omp simd reduction(|:err)"
        return [pragma, f"for (int64_t {var} = 0; {var} < {size - size % width}; {var}++) {{", *inside, "}",
                pragma, f"for (int64_t {var} = {size - width}; {var} < {size}; {var}++) {{", *inside, "}"]

    def row_blocks(self, sharing: Sharing) -> list[str]:
        """The row schedule in blocks of `row_block` rows: each step is a loop over the block's rows (a vector
        loop when it is one value per row); a row statistic is an array of the block's values. A sum marked
        `across` keeps a vector of lane partials per row, and the block's partials are summed together."""
        block = self.phase.row_block
        rows = [(var, size) for var, size in self.phase.loops if size != 1]
        total = math.prod(size for _, size in rows)
        recover, inner = [], total
        for position, (var, size) in enumerate(rows):  # the row variables from the row's flat number ko_r
            inner //= size
            flat = f"ko_r / {inner}" if inner > 1 else "ko_r"
            recover.append(f"const int64_t {var} = {f'({flat}) % {size}' if position else flat};")
        constant = [f"const int64_t {var} = 0;" for var, size in self.phase.loops if size == 1]
        defined: list[str] = []  # the row statistics so far

        # the block's row count: a constant unless the rows do not divide into blocks (a loop copying a
        # variable count became `rep movs` in GCC, 20% of a [16384, 32] layer norm)
        remainder = bool(total % block) or self.target.generic
        count = "ko_rows" if remainder else str(block)

        def each_row(vector: bool) -> list[str]:
            pragma = ["#pragma omp simd reduction(|:err)"] if vector else []
            slots = [f"const {self.slot_types[slot]} {slot} = {slot}_rows[ko_j];" for slot in defined]
            return [*pragma, f"for (int64_t ko_j = 0; ko_j < {count}; ko_j++) {{",
                    "const int64_t ko_r = ko_r0 + ko_j;", *recover, *constant, *slots]  # fmt: skip

        body = [f"const int64_t ko_rows = {total} - ko_r0 < {block} ? {total} - ko_r0 : {block};"] if remainder \
            else []  # fmt: skip
        joined: list[RowStep] = []  # sums waiting for the step whose loop they share
        for step in self.phase.steps:
            if step.joined:
                joined.append(step)
                continue
            if step.across:
                body += self.sum_across((*joined, step), count, each_row)
                defined += [s.slot for s in joined]
                joined = []
            elif step.loops and not step.summed and any(op.outer and op.scope == step.scope for op in self.phase.ops):
                body += self.hoisted_across(step, block, each_row)
            else:  # a vector loop across the rows only when the step has no loop (nor a reduction) of its own
                nested = step.loops or any(op.kind == REDUCE and op.scope[: len(step.scope)] == step.scope
                                           for op in self.phase.ops)  # fmt: skip
                lines = self.step(step)
                declared = [f"{self.slot_types[step.slot]} {step.slot}_rows[{block}];"] if step.slot else []
                kept = [f"{step.slot}_rows[ko_j] = {step.slot};"] if step.slot else []
                body += [*declared, *each_row(not nested), *lines, *kept, "}"]
            if step.slot:
                defined.append(step.slot)
        if self.phase.parallel.mode == OUTER:
            opened, closing = sharing.collapsed([("ko_r0", total, block)])
            return [*opened, *body, *("}" for _ in range(closing))]
        sharing.serial()
        return [*loop_headers([("ko_r0", total, block)]), *body, "}"]

    def hoisted_across(self, step: RowStep, block: int, each_row: Callable[[bool], list[str]]) -> list[str]:
        """A loop step whose per-row gOperators (those swapped before its loops: a layer norm's square root and
        division) run first in a vector loop across the block's rows, the values its loops read kept in arrays."""
        outside, inside = self.block(step.scope)
        hoisted = {w for op in self.phase.ops if op.outer and op.scope == step.scope for w in op.writes}
        read = {r for op in self.phase.ops if op.scope[: len(step.scope)] == step.scope
                and not (op.outer and op.scope == step.scope) for r in op.reads}  # fmt: skip
        # a temporary is carried; a table element or a literal is an expression, evaluated where it is read
        kept = sorted(r for r in hoisted & read if re.fullmatch(r"v\d+", self.names[r]))
        declared = [f"{self.ctypes[r]} {self.names[r]}_rows[{block}];" for r in kept]
        stored = [f"{self.names[r]}_rows[ko_j] = {self.names[r]};" for r in kept]
        loaded = [f"const {self.ctypes[r]} {self.names[r]} = {self.names[r]}_rows[ko_j];" for r in kept]
        return [*declared, *each_row(True), *outside, *stored, "}", *each_row(False), *loaded,
                *self.step_loops(step, inside), "}"]  # fmt: skip

    def sum_across(self, steps: tuple[RowStep, ...], count: str, each_row: Callable[[bool], list[str]]) -> list[str]:
        """Row statistics whose float sums keep eight lane partials per row (the summed values computed eight
        at a time by a vector loop), the block's partials summed row by row at once (ko_sum8x8), then the
        gOperators after a sum in a vector loop across the rows. Several steps (`RowStep.joined`, each its bare
        sum) sum in one loop over the row."""
        if self.phase.row_block != 8:  # ko_sum8x8 sums 8 rows of 8 partials
            raise AssertionError(f"rows summed across in blocks of {self.phase.row_block}, not 8")
        sums = []  # (step, its gOperators, the sum's place among them, its loop variable, body scope, partials)
        for step in steps:
            ops = [op for op in self.phase.ops if op.scope == step.scope]
            at = next(position for position, op in enumerate(ops) if op.kind == REDUCE)
            _, ((var, size),), _, body_scope, *_ = ops[at].reduction
            for op in ops[:at]:  # constants only (lower._sum_across)
                self.statement(op)
            self.counter[0] += 1
            sums.append((step, ops, at, var, body_scope, f"ko_part{self.counter[0]}"))

        def lanes(first: str, width: int, into: str) -> list[str]:  # `width` summed values from `first` on
            body = []  # each into the array {part}{into}, or added to the partials themselves (into "_acc")
            for step, ops, at, var, body_scope, part in sums:
                summed = [line for lines in self.block((*step.scope, body_scope)) for line in lines]
                assign = "+=" if into == "_acc" else "="
                body += [f"const int64_t {var} = {first} + ko_l;", *summed,
                         f"{part}{into}[ko_l] {assign} (float)({self.names[ops[at].reads[0]]});"]  # fmt: skip
            return ["#pragma omp simd reduction(|:err)", f"for (int64_t ko_l = 0; ko_l < {width}; ko_l++) {{",
                    *body, "}"]  # fmt: skip

        size = sums[0][1][sums[0][2]].reduction.loops[0][1]
        # rows of 64 and more sum 16 values at a time, the 16 partials folded to 8 after the loop: a [2048, 256]
        # layer norm ran 36.8 -> 28.4 µs, [1024, 160] 11.0 -> 8.8, [4096, 64] 20.0 -> 18.7 ([16384, 32]: 39.8 ->
        # 41.0, so rows of 32 keep 8 at a time)
        wide = size // 16 * 16 if size >= 64 else 0
        full = size // 8 * 8
        parts = [part for *_, part in sums]
        lines = [f"float {part}[8][8] __attribute__((aligned(32)));" for part in parts]
        if count == "ko_rows":  # a last block's missing rows sum zeros
            lines += ["for (int64_t ko_j = ko_rows; ko_j < 8; ko_j++) {",
                      *(f"for (int64_t ko_l = 0; ko_l < 8; ko_l++) {part}[ko_j][ko_l] = 0;" for part in parts),
                      "}"]  # fmt: skip
        # the row's partials in a vector variable, each vector of values stored to a temporary and added to
        # it: GCC keeps both in registers in a loop it does not unroll. Added straight into the block's array
        # instead, the partials stayed in memory unless the loop was unrolled whole (2x slower otherwise at
        # 256 per row), and a whole unrolled row of 256 cost 0.4 s of compiling per candidate: 45.8 vs 44.6
        # µs for a [2048, 256] layer norm this way at an unroll of 4, compiled in under half the time.
        # a block of rows under 128 long summed unrolled: each row's sums are short, and rolled up the next row's
        # work waited on the loop's bookkeeping. Layer norms in the harness: [16384, 32] 39.6 -> 36.1 µs,
        # [4096, 48] 15.8 -> 13.8, [2048, 72] 11.0 -> 9.9, [2048, 100] 24.3 -> 15.5, [4096, 64] 18.6 -> 17.8,
        # [16384, 16] and [8192, 24] unchanged; longer rows gain nothing ([1024, 160] 9.2 -> 9.0, [2048, 256]
        # 28.5 -> 29.3)
        unrolled = [f"#pragma GCC unroll {self.phase.row_block}"] if count != "ko_rows" and size < 128 else []
        lines += [*unrolled, *each_row(False), *(f"ko_v8 {part}_acc = {{0, 0, 0, 0, 0, 0, 0, 0}};" for part in parts)]
        if wide:
            # the 16 values read back as two 8-float halves: GCC may store the simd loop's values a 256-bit
            # vector at a time (a CPU it tunes for 256 bits), and a 512-bit load of two such stores cannot be
            # forwarded from them: it waited for both to retire, 83 % of a [128, 256] row sum's time (9.2 -> 3.4
            # us; a whole layer norm of bert_mini 17.2 -> 3.5 us)
            lines += [*(f"ko_v8 {part}_acc16a = {{0}}, {part}_acc16b = {{0}};" for part in parts),
                      *(f"float {part}_t16[16] __attribute__((aligned(64)));" for part in parts),
                      f"#pragma GCC unroll {min(wide // 16, SUM_UNROLL)}",
                      f"for (int64_t ko_k = 0; ko_k < {wide}; ko_k += 16) {{", *lanes("ko_k", 16, "_t16"),
                      *(line for part in parts for line in (f"{part}_acc16a += *(const ko_v8 *){part}_t16;",
                                                            f"{part}_acc16b += *(const ko_v8 *)({part}_t16 + 8);")),
                      "}", *(f"{part}_acc += {part}_acc16a + {part}_acc16b;" for part in parts)]  # fmt: skip
        if full > wide:
            lines += [f"#pragma GCC unroll {min((full - wide) // 8, SUM_UNROLL)}",
                      f"for (int64_t ko_k = {wide}; ko_k < {full}; ko_k += 8) {{",
                      *(f"float {part}_t[8] __attribute__((aligned(32)));" for part in parts),
                      *lanes("ko_k", 8, "_t"), *(f"{part}_acc += *(const ko_v8 *){part}_t;" for part in parts),
                      "}"]  # fmt: skip
        if size % 8:
            lines += lanes(str(full), size % 8, "_acc")
        lines += [*(f"*(ko_v8 *){part}[ko_j] = {part}_acc;" for part in parts), "}"]
        for step, ops, at, _, _, part in sums:
            reduce = ops[at]
            if bare_sum(step, ops):
                self.slot_types[step.slot] = "float"
                lines += [f"float {step.slot}_rows[8] __attribute__((aligned(32)));",
                          f"ko_sum8x8(&{part}[0][0], {step.slot}_rows);"]  # fmt: skip
                continue
            block_sums = part.replace("ko_part", "ko_sums")
            self.names[reduce.writes[0]], self.ctypes[reduce.writes[0]] = f"{block_sums}[ko_j]", "float"
            after = [line for op in ops[at + 1 :] for line in self.statement(op)]
            self.slot_types[step.slot] = ctype = self.ctypes[step.result]
            lines += [f"float {block_sums}[8] __attribute__((aligned(32)));",
                      f"ko_sum8x8(&{part}[0][0], {block_sums});", f"{ctype} {step.slot}_rows[8];", *each_row(True),
                      *after, f"{step.slot}_rows[ko_j] = {self.names[step.result]};", "}"]  # fmt: skip
        return lines

    def tiles(self, sharing: Sharing, outside: list[str], inside: list[str]) -> list[str]:
        """A phase reading its input transposed, its last two loops walked in tiles (tiling.py): what runs once
        per iteration outside the innermost loop runs per value of the loop around it."""
        blocks = None
        if self.phase.tiled != "elements":  # a float copy: the block's corner in and out, and the strides
            load = next(op for op in self.phase.ops if op.kind == MOVE and op.name == "load")
            store = next(op for op in self.phase.ops if op.kind == MOVE and op.name == "store")
            source, target = self.gir.slices[load.reads[0]].buffer, self.gir.slices[store.writes[0]].buffer
            stride_in, stride_out = self.phase.strides
            blocks = (f"{source} + {self.index(load.index, load)}", stride_in,
                      f"{target} + {self.index(store.index, store)}", stride_out)  # fmt: skip
        parallel = self.phase.parallel.mode == OUTER
        if not parallel:
            sharing.serial()
        return tiled_loops(self.phase.loops, sharing if parallel else None, outside, inside, self.target.tile, blocks,
                           self.phase.tiled == "strips")  # fmt: skip

    def interchanged(self, sharing: Sharing) -> list[str]:
        """A phase storing a reduction, its taps outside the output's innermost loop (reductions.py)."""
        ops = [op for op in self.phase.ops if op.scope == ()]
        reduces = [op for op in ops if op.kind == REDUCE]  # several: sums over the same taps, joined (gir/lowering.py)
        stores = {op.reads[0]: op for op in ops if op.kind == MOVE and op.name == "store"}
        dtype, loops, guard, _, guard_scope, _ = reduces[0].reduction
        (var, size), outer = self.phase.loops[-1], self.phase.loops[:-1]
        for op in ops:
            if op.kind == CONSTANT:
                self.statement(op)
        condition, bounds = None, tuple[TapRange, ...]()
        if guard is not None and var in _loop_vars(guard):  # a padding check on the inner axis: its range per tap
            ranges = dict(self.phase.loops) | dict(loops)
            decomposed = tap_ranges(guard, var, ranges)
            assert decomposed is not None  # interchangeable
            guard, found = decomposed
            bounds = tuple(TapRange(b.lower, self.index(b.numerator, reduces[0]), b.divisor) for b in found)
        if guard is not None:  # the guard's values, per tap, then the guard
            condition = ([line for part in self.block((guard_scope,)) for line in part],
                         self.condition(guard, reduces[0]))  # fmt: skip
        sums, rendered = [], set()
        for reduce in reduces:  # joined sums share one loop body (gir/lowering.py): its lines come before both updates
            scope = reduce.reduction.body
            body = () if scope in rendered else tuple(line for part in self.block((scope,)) for line in part)
            rendered.add(scope)
            store = stores[reduce.writes[0]]
            target = self.address(self.gir.slices[store.writes[0]].buffer, store)
            sums.append(TapSum(reduce.name, body, self.names[reduce.reads[0]], target))
        split = self.phase.reduction == "split" and not sharing.tasks  # rTasks' iterations must be independent
        lines = interchanged_lines(tuple(sums), dtype, loops, condition, var, size, split, bounds)
        if self.phase.parallel.mode == OUTER and not split:
            opened, closing = sharing.collapsed([(v, n, 1) for v, n in outer])
            return [*opened, *lines, *("}" for _ in range(closing))]
        if not split:
            sharing.serial()
        return [*_serial(outer), *lines, *("}" for _ in outer)]

    def guarded_select(self, op: GOperator) -> list[str]:
        """A select on indices: each side's gOperators in its own branch, where its indices are valid."""
        condition, *branches = op.select
        self.counter[0] += 1
        name = f"v{self.counter[0]}"
        sides = [[line for part in self.block((*op.scope, branch)) for line in part] for branch in branches]
        (then, otherwise), (a, b) = sides, op.reads[:2]
        self.names[op.writes[0]], self.ctypes[op.writes[0]] = name, self.ctypes[a]
        return [f"{self.ctypes[a]} {name};", f"if ({self.condition(condition, op)}) {{", *then,
                f"{name} = {self.names[a]};", "} else {", *otherwise, f"{name} = {self.names[b]};", "}"]  # fmt: skip

    def reduction(self, op: GOperator) -> list[str]:
        """The reduction's loops around its body's gOperators, accumulating in a local. Float sums accumulate in
        float: the SIMD reduction keeps one partial sum per lane, which bounds the error like a pairwise sum,
        and double would halve the vector width and convert every element."""
        dtype, loops, guard, body_scope, guard_scope, _ = op.reduction
        self.counter[0] += 1
        acc = f"t{self.counter[0]}"
        init, update = reduction_identity(op.name, dtype)
        lines = [f"{C_TYPES[dtype]} {acc} = {init};"]
        inner_scope = (*op.scope, body_scope)
        if op.name in ("reduce_max", "reduce_min") and dtype in FLOAT_SUFFIX and guard is None \
                and loops[-1][1] >= 2 * self.target.lanes:  # fmt: skip
            lines += self.extremum(op, acc, loops, inner_scope)
        else:
            for position, (var, size) in enumerate(loops):
                if position == len(loops) - 1 and op.name in ("reduce_sum", "reduce_prod") and guard is None:
                    # the sum may be reassociated across SIMD lanes (one partial sum per lane)
                    lines.append(f"#pragma omp simd reduction({'+' if op.name == 'reduce_sum' else '*'}:{acc})")
                lines.append(f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{")
            if guard is not None:  # the guarded body may read out of bounds: evaluated only inside the guard
                lines += [line for part in self.block((*op.scope, guard_scope)) for line in part]
                lines.append(f"if ({self.condition(guard, op)}) {{")
            lines += [line for part in self.block(inner_scope) for line in part]
            lines.append(update.format(acc=acc, x=self.names[op.reads[0]]))
            lines += ["}"] * (len(loops) + (guard is not None))
        return [*lines, self.temp(op.writes[0], C_TYPES[dtype], f"({C_TYPES[dtype]}){acc}")]

    def extremum(self, op: GOperator, acc: str, loops: tuple[tuple[str, int], ...],
                 scope: tuple[int, ...]) -> list[str]:  # fmt: skip
        """A float max/min as OpenMP's simd max/min reduction (a partial result per vector lane, in a register),
        with a flag for NaN beside it: the compare-select drops a NaN, so one seen anywhere makes the result NaN
        at the end, as in numpy. max/min are exact in any order, so the result is the same as a scalar loop's.
        (Per-lane partials kept in an array carried a store and a load from one vector to the next: segformer's
        [16384, 256] row max ran 250 us that way, 123 us this way.)"""
        kind, compare = ("max", ">") if op.name == "reduce_max" else ("min", "<")
        *outer, (var, size) = loops
        nan = f"{acc}_nan"
        clauses = f"reduction({kind}:{acc}) reduction(|:{nan})"
        lines = [f"int {nan} = 0;"]
        if op.reduction.shared and not self.tasks:  # the taps shared out (reductions.shared_extrema)
            if outer:
                lines += [f"#pragma omp parallel for collapse({len(outer)}) {clauses} reduction(|:err) "
                          "schedule(static)", *_serial(tuple(outer)), f"#pragma omp simd {clauses}"]  # fmt: skip
            else:
                lines.append(f"#pragma omp parallel for simd {clauses} reduction(|:err) schedule(static)")
        else:
            lines += [*_serial(tuple(outer)), f"#pragma omp simd {clauses}"]
        lines.append(f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{")
        lines += [line for part in self.block(scope) for line in part]
        x = self.names[op.reads[0]]
        lines += [f"{acc} = {x} {compare} {acc} ? {x} : {acc};", f"{nan} |= {x} != {x};", "}"]
        return [*lines, *("}" for _ in outer), f"if ({nan}) {acc} = NAN;"]

    def unrolled(self, sharing: Sharing, outside: list[str], inside: list[str]) -> list[str]:
        """Each value of the short innermost loop a unit-stride stream of the vectorized loop around it, which
        the compiler interleaves (a scalar loop of two or three iterations, inside a collapsed parallel loop,
        recovered every variable with a division per iteration: the [1, 3, 224, 224] input transpose ran
        38 -> 6 µs, shufflenet's [28, 28, 58, 2] shuffle 24 -> 4)."""
        *outer, (vector, vector_size), (short, short_size) = self.phase.loops

        def unrolled(body: list[str]) -> list[str]:
            return [f"#pragma GCC unroll {short_size}",
                    f"for (int64_t {short} = 0; {short} < {short_size}; {short}++) {{", *body, "}"]  # fmt: skip

        mode = self.phase.parallel.mode
        if mode == INNERMOST:
            return [*_serial(tuple(outer)), *outside, *sharing.innermost(vector, vector_size), *unrolled(inside),
                    "}", *("}" for _ in outer)]  # fmt: skip
        vectorized = []  # one branch-free vector loop per range of its variable (a reflection's borders and interior)
        for begin, end, scope in self.phase.pieces or ((0, vector_size, None),):
            before, body = self.block(scope, hoist=True) if scope is not None else ([], inside)
            vectorized += [*before, "#pragma omp simd reduction(|:err)",
                           f"for (int64_t {vector} = {begin}; {vector} < {end}; {vector}++) {{", *unrolled(body), "}"]
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

    def index(self, tree: Tree, op: GOperator) -> str:
        """An index tree in C; ("read", k) in it is the value of `op`'s k-th read (a gather's indices)."""
        return c_index(tree, lambda read: self.names[op.reads[read[1]]], self.prefix, self.formulas)

    def condition(self, tree: Tree, op: GOperator) -> str:
        """A guard or a select's condition; ("read", k) in it is the value of `op`'s k-th read."""
        return c_cond(tree, lambda read: self.names[op.reads[read[1]]], self.prefix, self.formulas)

    def address(self, buffer: str, op: GOperator) -> str:
        if self.gir.roles.get(buffer) == "table":
            if buffer in self.formulas:
                return self.formulas[buffer](self.index(op.index, op))
            return f"{self.prefix}_{buffer}[{self.index(op.index, op)}]"
        return f"{buffer}[{self.index(self.hoisted_index(op.index), op)}]"

    def statement(self, op: GOperator) -> list[str]:
        if op.kind == CONSTANT:  # a literal (or a row statistic's name) wherever it is read
            register = op.writes[0]
            if op.name == "slot":
                self.names[register], self.ctypes[register] = op.slot, self.slot_types[op.slot]
            else:
                value, dtype = op.constant
                self.names[register], self.ctypes[register] = c_literal(value, dtype), C_TYPES[dtype]
                if dtype in FLOAT_SUFFIX and not math.isnan(value):
                    self.numbers.add(register)
            return []
        if op.kind == REDUCE:
            return self.reduction(op)
        if op.kind == MOVE:
            side = self.gir.slices[op.reads[0] if op.name == "load" else op.writes[0]]
            if op.name == "load" and side.buffer in self.gir.tables:  # a constant array: read where it is used
                table = self.gir.tables[side.buffer]
                self.names[op.writes[0]] = self.address(side.buffer, op)
                self.ctypes[op.writes[0]] = "int64_t" if table.dtype.kind == "i" else "float"
                return []
            if op.name == "load" and self.bf16_buffers and side.buffer in self.bf16_buffers:  # widened, exactly
                return [self.temp(op.writes[0], "float", f"ko_bf16_float({self.address(side.buffer, op)})")]
            if op.name == "load":
                return [self.temp(op.writes[0], self.types[side.buffer], self.address(side.buffer, op))]
            target_type = self.types[side.buffer]
            if self.bf16_buffers and side.buffer in self.bf16_buffers:  # a bfloat16 value: its top 16 bits
                return [f"{self.address(side.buffer, op)} = ko_bf16_bits({self.names[op.reads[0]]});"]
            return [f"{self.address(side.buffer, op)} = ({target_type})({self.names[op.reads[0]]});"]
        if op.kind != ELEMENTWISE or op.name in _SILENT:
            return []  # broadcast and sync: no statement on a CPU thread
        if op.name == "where" and isinstance(op.code, Select):
            return self.guarded_select(op)
        args = [self.names[r] for r in op.reads]
        if op.name == "where":  # a value condition: both sides are safe to compute, and a select vectorizes
            return [self.temp(op.writes[0], self.ctypes[op.reads[1]], f"({args[0]} ? {args[1]} : {args[2]})")]
        operands = op.dtype
        assert operands is not None, f"{op.name} without its dtype"
        dtype = operands
        if op.name == "cast" and dtype == "bfloat16":  # computed on as float, rounded as bfloat16 holds it
            return [self.temp(op.writes[0], "float", f"ko_bf16_round({args[0]})")]
        if op.name == "cast":
            source = next((d for d, c in C_TYPES.items() if c == self.ctypes.get(op.reads[0])), dtype)
            return [self.temp(op.writes[0], C_TYPES[dtype], c_cast(args[0], source, dtype))]
        if op.name in ("max", "min") and dtype in FLOAT_SUFFIX and any(r in self.numbers for r in op.reads):
            number = 0 if op.reads[0] in self.numbers else 1
            return [self.temp(op.writes[0], C_TYPES[dtype], c_bound(op.name, args[1 - number], args[number]))]
        expression = c_unary(op.name, dtype, args[0]) if len(args) == 1 else \
            c_binary(op.name, dtype, args[0], args[1]) if len(args) == 2 else c_quaternary(op.name, *args)  # fmt: skip
        return [self.temp(op.writes[0], c_value_type(op.name, dtype), expression)]


def _loop_vars(tree: Tree) -> set[str]:
    """The loop variables an index tree reads (a merged variable's coordinate, `part`, reads that variable)."""
    if tree[0] in ("var", "part"):
        return {tree[1]}
    return {name for child in tree[1:] if isinstance(child, tuple) and child and isinstance(child[0], str)
            for name in _loop_vars(child)}  # fmt: skip


def _serial(loops: tuple[tuple[str, int], ...]) -> list[str]:
    return [f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{" for var, size in loops]
