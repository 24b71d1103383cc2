"""Reductions in generated C: the accumulator's identity and update, and the loop orders of a phase that
stores a reduction (`interchanged_lines`; c/render.py emits everything else).

- *Interchanged*: the reduction loops outside and the output's innermost axis inside, accumulating in the
  target buffer. The inner loop is unit-stride on channels-last data and vectorizes (pooling; a reduction
  over outer axes), and a padding check that does not depend on it is evaluated once per tap.
- *Split*: the same, when the loops around the innermost axis have a single iteration (an instance norm's
  per-channel mean of a [1, H, W, C] map, a global pooling with batch 1), so no thread would be left to share
  them: the reduction loops are shared out instead. Each thread accumulates its part into partial results
  of its own (on the stack: at most SPLIT_MAX_OUTPUTS of them), which are then combined in thread order,
  so a run with the same thread count always sums in the same order. candy's instance-norm means ran on
  one thread at ~18 GB/s before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kernorch.codegen.gir.sharing import PARALLEL_MIN_ELEMENTS
from kernorch.codegen.loops.describe import C_TYPES, Phase, Tree, substituted

INTERCHANGE_MIN_INNER = 8  # a reduction is vectorized across the output's innermost axis when it is this long
UNROLLED_TAPS = 16  # an interchanged reduction over at most this many taps has them written out
SPLIT_MAX_OUTPUTS = 1024  # running values of an interchanged reduction kept on the stack (split: one row per thread)
TAP_BLOCK = 8  # at most this many consecutive taps are summed in a register before the running value is stored


def reduction_identity(prim: str, dtype: str) -> tuple[str, str]:
    """(the accumulator's initial value, its update as a format string with {acc} and {x})."""
    is_float = dtype.startswith("float")
    if prim == "reduce_sum":
        return "0", "{acc} += {x};"
    if prim == "reduce_prod":
        return "1", "{acc} *= {x};"
    if prim == "reduce_max":
        init = "-INFINITY" if is_float else {"int64": "INT64_MIN", "int32": "INT32_MIN", "bool": "0"}[dtype]
        return init, "KO_MAX_INTO({acc}, {x});"
    init = "INFINITY" if is_float else {"int64": "INT64_MAX", "int32": "INT32_MAX", "bool": "1"}[dtype]
    return init, "KO_MIN_INTO({acc}, {x});"


def free_vars(tree: Any) -> set[str]:
    if not isinstance(tree, tuple):
        return set()
    if tree[0] == "var":
        return {tree[1]}
    if tree[0] == "reduce":
        return free_vars(tree[4]) - {var for var, _ in tree[3]}
    found: set[str] = set()
    for child in tree[1:]:
        found |= free_vars(child)
    return found


def buffers_used(tree: Any) -> set[str]:
    """Buffers the tree loads, and those a tee in it stores (a conflict either way)."""
    if not isinstance(tree, tuple) or not tree:
        return set()
    found = {tree[1]} if tree[0] in ("load", "tee") and isinstance(tree[1], str) else set()
    for child in tree[1:]:
        found |= buffers_used(child)
    return found


def mentions_any(tree: Any, names: set[str]) -> bool:
    """The tree uses one of the variables `names`, or a part of one (a merged variable's coordinate)."""
    if not isinstance(tree, tuple) or not tree:
        return False
    if tree[0] in ("var", "part") and tree[1] in names:
        return True
    return any(mentions_any(child, names) for child in tree[1:])


def bare_reduction(tree: Tree, dtype: str) -> Tree | None:
    if tree[0] == "cast" and tree[1] == dtype:
        tree = tree[2]
    return tree if tree[0] == "reduce" and tree[2] == dtype else None


def reduced_per_element(tree: Any) -> int:
    """Elements one evaluation of `tree` runs its reductions over (a reduction inside another counts once per
    outer tap); 1 when it has none."""

    def taps(node: Any) -> int:
        if not isinstance(node, tuple) or not node:
            return 0
        if node[0] == "reduce":
            return int(np.prod([size for _, size in node[3]], dtype=np.int64)) * max(1, taps(node[4]))
        return sum(taps(child) for child in node[1:])

    return max(1, taps(tree))


def interchangeable(phase: Phase, dtype: str) -> tuple[str, tuple[tuple[str, int], ...], Tree | None, Tree] | None:
    """(prim, reduction loops, guard, body) of a phase storing a reduction that can run interchanged: its
    innermost output axis long enough to vectorize, used by the body and not by the guard."""
    if not phase.loop_vars or phase.scalar:
        return None
    reduction = bare_reduction(phase.expr, dtype)
    var = phase.loop_vars[-1]
    if reduction is None or phase.loop_sizes[-1] < INTERCHANGE_MIN_INNER or var not in free_vars(reduction):
        return None
    _, prim, _, loops, body = reduction
    guard = None
    if body[0] == "guard":
        guard, body = body[1], body[2]
    if guard is not None and var in free_vars(guard):
        return None
    return prim, loops, guard, body


def splits_among_threads(phase: Phase, dtype: str) -> bool:
    """The phase's reduction runs split among threads: interchangeable, nothing outside the innermost output
    axis to share, few enough outputs for partials on the stack, enough work for a parallel region."""
    if interchangeable(phase, dtype) is None:
        return False
    size = phase.loop_sizes[-1]
    return int(np.prod(phase.loop_sizes[:-1], dtype=np.int64)) == 1 and size <= SPLIT_MAX_OUTPUTS and \
        size * reduced_per_element(phase.expr) >= PARALLEL_MIN_ELEMENTS  # fmt: skip


def _tap_block(loops: tuple[tuple[str, int], ...], condition: tuple[list[str], str] | None) -> int:
    """How many consecutive taps of the innermost tap loop an interchanged reduction sums in a register: the
    largest divisor of its length up to TAP_BLOCK (so the block needs no remainder), 1 when a guard would have to
    be tested per tap inside the vector loop."""
    if condition is not None or not loops:
        return 1
    count = loops[-1][1]
    return next((b for b in range(min(TAP_BLOCK, count), 1, -1) if count % b == 0), 1)


@dataclass(frozen=True)
class TapSum:
    """One reduction of an interchanged phase: its primitive, the C lines computing one tap's value (`value`
    names it), and the C lvalue of the output's innermost variable its results are stored at."""

    prim: str
    lines: tuple[str, ...]
    value: str
    target: str


def joined_taps(first: Phase, second: Phase, dtype: str) -> Phase | None:
    """`second` with its tap variables renamed to `first`'s when both are interchanged reductions of one
    dtype over the same output loops and the same taps, unguarded, split the same way, neither reading what
    the other stores: the renderer then runs them in one loop nest (`TapSum`s), one pass over what they read
    (an instance norm's one-pass mean and variance, variance.py). Else None."""
    if second.target == first.target or first.residues or second.residues or \
            not all(b.loop_vars for b in (first, second)) or \
            (first.loop_vars, first.loop_sizes) != (second.loop_vars, second.loop_sizes):  # fmt: skip
        return None
    found = [interchangeable(b, dtype) for b in (first, second)]
    if found[0] is None or found[1] is None or found[0][2] is not None or found[1][2] is not None:
        return None
    taps, other = found[0][1], found[1][1]
    if [n for _, n in taps] != [n for _, n in other] or splits_among_threads(first, dtype) != \
            splits_among_threads(second, dtype):  # fmt: skip
        return None
    if first.target in buffers_used(second.expr) or second.target in buffers_used(first.expr) or \
            second.expr[0] != "reduce":  # fmt: skip
        return None
    renamed = {var: ("var", mine) for (var, _), (mine, _) in zip(other, taps, strict=True)}
    return replace(second, expr=(*second.expr[:3], taps, substituted(second.expr[4], renamed)))


def interchanged_lines(sums: tuple[TapSum, ...], dtype: str, loops: tuple[tuple[str, int], ...],
                       condition: tuple[list[str], str] | None, var: str, size: int,
                       split: bool) -> list[str]:  # fmt: skip
    """An interchanged phase's C: taps `loops` outside, guarded by `condition` (the lines computing what it
    reads, and the condition), and inside them the output's innermost loop over `var` running each of `sums`
    (several: reductions over the same taps, one pass over what they read) into its `size` results."""
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
    block = 1 if unrolled else _tap_block(loops, condition)
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
        taps += ["#pragma omp simd", f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{",
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
