"""C for a phase's loop nests: how its parallel loop is shared out among threads (`Sharing`: an OpenMP
worksharing loop, or the iterations of an rTask), tiled transposes, and the loop orders of a phase that stores a
reduction (`interchanged_lines`). The choices were made when the kernel was lowered (codegen/gir/: a phase's
mode, its tiles, its interchanged or split reduction); this is only their C.

Kernel by kernel, a phase's parallel loop is an OpenMP worksharing loop in a parallel region of its own (a
fork and a join per phase). In an rProgram (schedule/) the threads of one persistent region run rTasks instead:
a task runs the iterations [ko_begin, ko_end) of one phase's parallel loop, so the loop nest is flattened into
one loop over those iterations and each loop variable is recovered from the flat index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kernorch.codegen.gir import SPLIT_MAX_OUTPUTS, STRIP_ROWS
from kernorch.codegen.loops import C_TYPES
from kernorch.ir.primitives import REDUCTIONS

UNROLLED_TAPS = 16  # an interchanged reduction over at most this many taps has them written out
TAP_BLOCK = 8  # at most this many consecutive taps are summed in a register before the running value is stored


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


def tiled_loops(loops: tuple[tuple[str, int], ...], sharing: Sharing | None, hoisted: list[str], inner: list[str],
                tile: int, blocks: tuple[str, int, str, int] | None = None,
                strips: bool = False) -> list[str]:  # fmt: skip
    """A phase's `loops` with the last two variables walked in `tile` × `tile` blocks; with `sharing`, the outer
    loops and both block loops are shared out to the threads. `hoisted` is computed per value of the
    second-to-last variable, `inner` is the body of the innermost loop. With `blocks` (source address, its
    stride along b, target address, its stride along a, as C expressions of the loop variables at a block's
    corner) a whole tile of a transposing copy is moved as 8 × 8 register blocks (`ko_transpose8`), or with
    `strips` 8 of the input's rows at a time (`transposed_rows`)."""
    *outer, (a, size_a), (b, size_b) = loops
    if blocks is not None and strips:
        return transposed_rows(loops, sharing, hoisted, inner, blocks)
    nest = [*((v, n, 1) for v, n in outer), (f"{a}_t", size_a, tile), (f"{b}_t", size_b, tile)]
    lines, closing = sharing.collapsed(nest) if sharing is not None else (loop_headers(nest), len(nest))
    lines += [f"const int64_t {a}_end = {a}_t + {tile} < {size_a} ? {a}_t + {tile} : {size_a};",
              f"const int64_t {b}_end = {b}_t + {tile} < {size_b} ? {b}_t + {tile} : {size_b};"]  # fmt: skip
    if blocks is None:
        lines += _elementwise(a, b, hoisted, inner)
    else:
        source, stride_in, target, stride_out = blocks
        lines += [f"if ({a}_end - {a}_t == {tile} && {b}_end - {b}_t == {tile}) {{",
                  f"for (int64_t {a}_o = 0; {a}_o < {tile}; {a}_o += 8) {{",
                  f"for (int64_t {b}_o = 0; {b}_o < {tile}; {b}_o += 8) {{",
                  f"const int64_t {a} = {a}_t + {a}_o, {b} = {b}_t + {b}_o;",
                  f"ko_transpose8({source}, {stride_in}, {target}, {stride_out});", "}", "}", "} else {",
                  *_elementwise(a, b, hoisted, inner), "}"]  # fmt: skip
    lines += ["}" for _ in range(closing)]
    return lines


def transposed_rows(loops: tuple[tuple[str, int], ...], sharing: Sharing | None, hoisted: list[str],
                    inner: list[str], blocks: tuple[str, int, str, int]) -> list[str]:  # fmt: skip
    """A transposing float copy: each parallel iteration takes 8 of the input's rows (8 values of b, the
    output's innermost variable) and moves them whole, along a, as 8 × 8 register blocks (`ko_transpose8`):
    the 8 input rows stream, each output row gets 32 contiguous bytes per block. For input rows that share
    an L1 set (`rows_share_a_set`): a 16 × 16 tile reads 16 of them, which evict each other. Segformer's
    [256, 16384] -> [16384, 256] copy (rows 64 KB apart) ran 1.45 ms in tiles and 0.83 ms in strips (23 ->
    40 GB/s on 2 cores; a plain copy of the same bytes 0.43 ms); in place 1.84-2.40 -> 1.19-1.33 ms. Where
    rows do not share a set, tiles write whole output lines and win ([16, 16, 1024] from rows 1 KB apart:
    50-60 µs in tiles, 75 in strips)."""
    *outer, (a, size_a), (b, size_b) = loops
    nest = [*((v, n, 1) for v, n in outer), (f"{b}_t", size_b, STRIP_ROWS)]
    lines, closing = sharing.collapsed(nest) if sharing is not None else (loop_headers(nest), len(nest))
    source, stride_in, target, stride_out = blocks
    lines += [f"const int64_t {b}_end = {b}_t + 8 < {size_b} ? {b}_t + 8 : {size_b};",
              f"for (int64_t {a}_t = 0; {a}_t < {size_a}; {a}_t += 8) {{",
              f"const int64_t {a}_end = {a}_t + 8 < {size_a} ? {a}_t + 8 : {size_a};",
              f"if ({a}_end - {a}_t == 8 && {b}_end - {b}_t == 8) {{",
              f"const int64_t {a} = {a}_t, {b} = {b}_t;",
              f"ko_transpose8({source}, {stride_in}, {target}, {stride_out});", "} else {",
              *_elementwise(a, b, hoisted, inner), "}", "}"]  # fmt: skip
    return [*lines, *("}" for _ in range(closing))]


def _elementwise(a: str, b: str, hoisted: list[str], inner: list[str]) -> list[str]:
    """The block [a_t, a_end) × [b_t, b_end) element by element."""
    return [f"for (int64_t {a} = {a}_t; {a} < {a}_end; {a}++) {{", *hoisted,
            f"for (int64_t {b} = {b}_t; {b} < {b}_end; {b}++) {{", *inner, "}", "}"]  # fmt: skip


def reduction_identity(prim: str, dtype: str) -> tuple[str, str]:
    """(the accumulator's initial value, its update as a format string with {acc} and {x}): the identity is
    ir/primitives.py's, spelt as C does (math.h's infinities, stdint.h's limits); max and min update through
    KO_MAX_INTO / KO_MIN_INTO, which propagate a NaN (REDUCTIONS says they must)."""
    identity = REDUCTIONS[prim].identity
    update = {"reduce_sum": "{acc} += {x};", "reduce_prod": "{acc} *= {x};", "reduce_max": "KO_MAX_INTO({acc}, {x});",
              "reduce_min": "KO_MIN_INTO({acc}, {x});"}[prim]  # fmt: skip
    if identity in ("zero", "one"):
        return str(int(identity == "one")), update
    low = identity == "lowest"
    if dtype.startswith("float"):
        return "-INFINITY" if low else "INFINITY", update
    if dtype == "bool":
        return str(int(not low)), update
    if dtype.startswith("uint"):
        return "0" if low else f"{dtype.upper()}_MAX", update
    return f"{dtype.upper()}_{'MIN' if low else 'MAX'}", update


def _tap_block(loops: tuple[tuple[str, int], ...], condition: tuple[list[str], str] | None) -> int:
    """How many consecutive taps of the innermost tap loop an interchanged reduction sums in a register: the
    largest divisor of its length up to TAP_BLOCK (so the block needs no remainder), 1 when a guard would have to
    be tested per tap inside the vector loop."""
    if condition is not None or not loops:
        return 1
    count = loops[-1][1]
    return next((b for b in range(min(TAP_BLOCK, count), 1, -1) if count % b == 0), 1)


@dataclass(frozen=True)
class TapRange:
    """One end of the range of the output's innermost variable a tap reaches (gir's `TapBound` in C):
    `var >= ceil(numerator / divisor)` (`lower`) or `var < ceil(numerator / divisor)`."""

    lower: bool
    numerator: str
    divisor: int


def _range_lines(bounds: tuple[TapRange, ...], size: int) -> list[str]:
    """`ko_lo`, `ko_hi`: the part of [0, size) every bound admits (empty when ko_lo >= ko_hi)."""
    lines = [f"int64_t ko_lo = 0, ko_hi = {size};"]
    for bound in bounds:
        value = bound.numerator if bound.divisor == 1 else f"ko_ceil_div({bound.numerator}, {bound.divisor})"
        end, keep = ("ko_lo", ">") if bound.lower else ("ko_hi", "<")
        lines.append(f"{{ const int64_t ko_b = {value}; if (ko_b {keep} {end}) {end} = ko_b; }}")
    return lines


@dataclass(frozen=True)
class TapSum:
    """One reduction of an interchanged phase: its primitive, the C lines computing one tap's value (`value`
    names it), and the C lvalue of the output's innermost variable its results are stored at."""

    prim: str
    lines: tuple[str, ...]
    value: str
    target: str


def interchanged_lines(sums: tuple[TapSum, ...], dtype: str, loops: tuple[tuple[str, int], ...],
                       condition: tuple[list[str], str] | None, var: str, size: int,
                       split: bool, bounds: tuple[TapRange, ...] = ()) -> list[str]:  # fmt: skip
    """An interchanged phase's C: taps `loops` outside, guarded by `condition` (the lines computing what it
    reads, and the condition), and inside them the output's innermost loop over `var` running each of `sums`
    (several: reductions over the same taps, one pass over what they read) into its `size` results; with
    `bounds`, over the part of them each tap reaches."""
    ctype = C_TYPES[dtype]
    updates = [reduction_identity(s.prim, dtype) for s in sums]
    suffixes = [str(k) if k else "" for k in range(len(sums))]
    # the running values stay in a local array, stored once at the end: accumulated in the output buffer, every
    # tap loaded and stored them again (a 3x3 max-pool over 24 channels: 63 -> 42 us)
    local = not split and size <= SPLIT_MAX_OUTPUTS
    accumulators = [f"ko_part{k}[{var}]" if split else f"ko_acc{k}[{var}]" if local else s.target
                    for k, s in zip(suffixes, sums, strict=True)]  # fmt: skip
    taps = [f"for (int64_t {v} = 0; {v} < {n}; {v}++) {{" for v, n in loops]
    unrolled = not split and math.prod(n for _, n in loops) <= UNROLLED_TAPS
    if unrolled:
        # a small window's taps written out: each tap's bounds test and addresses are constants apart, and the
        # running values need not go back to memory between taps (shufflenet's 3x3 max-pool: 31.5 -> 26.6 us)
        taps = [line for v, n in loops for line in (f"#pragma GCC unroll {n}",
                                                   f"for (int64_t {v} = 0; {v} < {n}; {v}++) {{")]  # fmt: skip
    block = 1 if unrolled or bounds else _tap_block(loops, condition)
    if block > 1:
        # `block` consecutive taps of the innermost tap loop are summed in a register, then the running value
        # is loaded and stored once: per tap, a load and a store of it took the load/store ports from the data
        # (candy's [3136, 128] instance-norm mean: 10.4 -> 8.9 µs)
        tap, count = loops[-1]
        runs = [f"ko_run{k}" for k in suffixes]
        taps[-1] = f"for (int64_t ko_{tap} = 0; ko_{tap} < {count}; ko_{tap} += {block}) {{"
        taps += ["#pragma omp simd", f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{",
                 *(f"{ctype} {run} = {acc};" for run, acc in zip(runs, accumulators, strict=True)),
                 f"#pragma GCC unroll {block}",
                 f"for (int64_t {tap} = ko_{tap}; {tap} < ko_{tap} + {block}; {tap}++) {{",
                 *(line for s, run, (_, update) in zip(sums, runs, updates, strict=True)
                   for line in (*s.lines, update.format(acc=run, x=s.value))),
                 "}", *(f"{acc} = {run};" for run, acc in zip(runs, accumulators, strict=True)), "}"]  # fmt: skip
    else:
        if condition is not None:
            taps += [*condition[0], f"if ({condition[1]}) {{"]
        first, end = ("ko_lo", "ko_hi") if bounds else ("0", str(size))
        taps += [*(_range_lines(bounds, size) if bounds else []), "#pragma omp simd",
                 f"for (int64_t {var} = {first}; {var} < {end}; {var}++) {{",
                 *(line for s, acc, (_, update) in zip(sums, accumulators, updates, strict=True)
                   for line in (*s.lines, update.format(acc=acc, x=s.value))), "}"]  # fmt: skip
    if condition is not None and block == 1:
        taps.append("}")
    taps += ["}" for _ in loops]
    start = [line for acc, (init, _) in zip(accumulators, updates, strict=True)
             for line in ("#pragma omp simd", f"for (int64_t {var} = 0; {var} < {size}; {var}++) {acc} = {init};")]
    if local:  # in braces: a row kernel may hold several such phases in one loop body
        store = [line for s, acc in zip(sums, accumulators, strict=True) for line in
                 ("#pragma omp simd", f"for (int64_t {var} = 0; {var} < {size}; {var}++) {s.target} = {acc};")]
        return ["{", *(f"{ctype} ko_acc{k}[{size}];" for k in suffixes), *start, *taps, *store, "}"]
    if not split:
        return [*start, *taps]
    # each thread's partial results on cache lines of their own: a line two threads' parts shared bounced
    # between the cores on every tap (a [3136, 144] channel sum whose parts start 32 B off a line: 34 -> 17 µs)
    per_line = 64 // np.dtype(dtype).itemsize
    padded = -(-size // per_line) * per_line
    combine = [line for s, k, (_, update) in zip(sums, suffixes, updates, strict=True) for line in (
        f"{ctype} ko_acc{k} = ko_parts{k}[0][{var}];",
        "for (int ko_t = 1; ko_t < ko_used; ko_t++) " + update.format(acc=f"ko_acc{k}", x=f"ko_parts{k}[ko_t][{var}]"),
        f"{s.target} = ko_acc{k};")]  # fmt: skip
    return ["{",
            "const int ko_team = omp_get_max_threads();",
            *(f"{ctype} ko_parts{k}[ko_team][{padded}] __attribute__((aligned(64)));" for k in suffixes),
            "int ko_used = 1;",
            "#pragma omp parallel reduction(|:err)",
            "{",
            *(f"{ctype} *ko_part{k} = ko_parts{k}[omp_get_thread_num()];" for k in suffixes),
            "#pragma omp single",
            "ko_used = omp_get_num_threads();",
            *start,
            f"#pragma omp for collapse({len(loops)}) schedule(static)",
            *taps,
            "}",
            f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{",
            *combine,
            "}",
            "}"]  # fmt: skip
