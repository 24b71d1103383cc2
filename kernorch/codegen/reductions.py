"""Reductions in generated C: the accumulator's identity and update, and the loop orders of a phase that
stores a reduction (`interchanged_lines`; gir/render_c.py emits everything else).

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
from typing import Any

import numpy as np

from kernorch.codegen.loops import C_TYPES, Phase, Tree
from kernorch.codegen.sharing import PARALLEL_MIN_ELEMENTS

INTERCHANGE_MIN_INNER = 8  # a reduction is vectorized across the output's innermost axis when it is this long
UNROLLED_TAPS = 16  # an interchanged reduction over at most this many taps has them written out
SPLIT_MAX_OUTPUTS = 1024  # running values of an interchanged reduction kept on the stack (split: one row per thread)


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


def interchanged_lines(prim: str, dtype: str, loops: tuple[tuple[str, int], ...],
                       condition: tuple[list[str], str] | None,
                       body: tuple[list[str], str], var: str, size: int, target: str,
                       split: bool) -> list[str]:  # fmt: skip
    """An interchanged reduction's C: taps `loops` outside, guarded by `condition` (the lines computing what
    it reads, and the condition), and inside them the output's
    innermost loop over `var` running `body` (its lines, and the value they leave) into each of the `size`
    results, stored at `target` (a C lvalue of `var`)."""
    init, update = reduction_identity(prim, dtype)
    ctype = C_TYPES[dtype]
    # the running values stay in a local array, stored once at the end: accumulated in the output buffer, every
    # tap loaded and stored them again (a 3x3 max-pool over 24 channels: 63 -> 42 us)
    local = not split and size <= SPLIT_MAX_OUTPUTS
    accumulator = f"ko_part[{var}]" if split else f"ko_acc[{var}]" if local else target
    taps = [f"for (int64_t {v} = 0; {v} < {n}; {v}++) {{" for v, n in loops]
    if not split and math.prod(n for _, n in loops) <= UNROLLED_TAPS:
        # a small window's taps written out: each tap's bounds test and addresses are constants apart, and the
        # running values need not go back to memory between taps (shufflenet's 3x3 max-pool: 31.5 -> 26.6 us)
        taps = [line for v, n in loops for line in (f"#pragma GCC unroll {n}",
                                                   f"for (int64_t {v} = 0; {v} < {n}; {v}++) {{")]  # fmt: skip
    if condition is not None:
        taps += [*condition[0], f"if ({condition[1]}) {{"]
    lines, x = body
    taps += ["#pragma omp simd", f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{", *lines,
             update.format(acc=accumulator, x=x), "}"]  # fmt: skip
    if condition is not None:
        taps.append("}")
    taps += ["}" for _ in loops]
    start = ["#pragma omp simd", f"for (int64_t {var} = 0; {var} < {size}; {var}++) {accumulator} = {init};"]
    if local:  # in braces: a row kernel may hold several such phases in one loop body
        store = ["#pragma omp simd", f"for (int64_t {var} = 0; {var} < {size}; {var}++) {target} = {accumulator};"]
        return ["{", f"{ctype} ko_acc[{size}];", *start, *taps, *store, "}"]
    if not split:
        return [*start, *taps]
    # each thread's partial results on cache lines of their own: a line two threads' parts shared bounced
    # between the cores on every tap (a [3136, 144] channel sum whose parts start 32 B off a line: 34 -> 17 µs)
    per_line = 64 // np.dtype(dtype).itemsize
    padded = -(-size // per_line) * per_line
    return ["{",
            "const int ko_team = omp_get_max_threads();",
            f"{ctype} ko_parts[ko_team][{padded}] __attribute__((aligned(64)));",
            "int ko_used = 1;",
            "#pragma omp parallel reduction(|:err)",
            "{",
            f"{ctype} *ko_part = ko_parts[omp_get_thread_num()];",
            "#pragma omp single",
            "ko_used = omp_get_num_threads();",
            *start,
            f"#pragma omp for collapse({len(loops)}) schedule(static)",
            *taps,
            "}",
            f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{",
            f"{ctype} ko_acc = ko_parts[0][{var}];",
            "for (int ko_t = 1; ko_t < ko_used; ko_t++) " + update.format(acc="ko_acc", x=f"ko_parts[ko_t][{var}]"),
            f"{target} = ko_acc;",
            "}",
            "}"]  # fmt: skip
