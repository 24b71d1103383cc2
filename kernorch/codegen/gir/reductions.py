"""How a phase that stores a reduction runs: interchanged, split among threads, joined with another over the same
taps (the C of these loop orders is c/loops.py's `interchanged_lines`; c/render.py emits everything else).

- *Interchanged*: the reduction loops outside and the output's innermost axis inside, accumulating in the
  target buffer. The inner loop is unit-stride on channels-last data and vectorizes (pooling; a reduction
  over outer axes), and a padding check that does not depend on it is evaluated once per tap. A padding
  check on that axis itself (NCHW pooling: `0 <= 2*w - 1 + kw < W`) becomes, per tap, the range of it the tap
  reaches (`tap_ranges`): the inner loop runs over that range with no check (cspresnet50's LeakyReLU +
  3x3 max-pool on a [1, 64, 32, 32] map ran 700 µs as a branch per tap and element, 50 µs this way).
- *Split*: the same, when the loops around the innermost axis have a single iteration (an instance norm's
  per-channel mean of a [1, H, W, C] map, a global pooling with batch 1), so no thread would be left to share
  them: the reduction loops are shared out instead. Each thread accumulates its part into partial results
  of its own (on the stack: at most SPLIT_MAX_OUTPUTS of them), which are then combined in thread order,
  so a run with the same thread count always sums in the same order. candy's instance-norm means ran on
  one thread at ~18 GB/s before.
- *Shared extrema*: a float max or min over a whole tensor (or a few outputs, each over many taps) in a phase
  that runs serial for want of outputs to share out — a dynamic quantization's range, min and max of the whole
  activation — has its taps shared out among the threads instead (`Reduction.shared`). A max or min is exact in
  any order, so the result does not depend on how the taps were shared.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kernorch.codegen.gir.graph import REDUCE, GOperator
from kernorch.codegen.gir.sharing import PARALLEL_MIN_ELEMENTS
from kernorch.codegen.loops import Digit, Phase, Tree, linearize, substituted, to_tree
from kernorch.ir.types import FLOAT_DTYPES

INTERCHANGE_MIN_INNER = 8  # a reduction is vectorized across the output's innermost axis when it is this long
SPLIT_MAX_OUTPUTS = 1024  # running values of an interchanged reduction kept on the stack (split: one row per thread)
# taps of a float max/min for a parallel region of its own to pay (shared_extrema). Measured on Zen 3, 2 threads,
# bert_mini.dynamic's range kernels alternated with the serial ones: 131072 taps 0.91x the serial time; 32768
# taps no gain out of the noise (0.997-1.107x) - a fork and join costs about what a thread saves there.
SHARED_EXTREMUM_MIN_TAPS = 4 * PARALLEL_MIN_ELEMENTS


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


@dataclass(frozen=True)
class TapBound:
    """One end of the range of the output's innermost variable a tap reaches: `var >= ceil(numerator / divisor)`
    (`lower`) or `var < ceil(numerator / divisor)`; the numerator an index tree over the taps and outer loops."""

    lower: bool
    numerator: Tree
    divisor: int  # > 0


_INDEX_ONLY = frozenset({"var", "lit", "part", "+", "-", "*", "/", "%"})


def _index_only(tree: Any) -> bool:
    """An integer expression of loop variables alone (no read of a value, no table)."""
    if not isinstance(tree, tuple) or not tree or tree[0] not in _INDEX_ONLY:
        return False
    return tree[0] in ("var", "lit", "part") or all(_index_only(child) for child in tree[1:])


def _conjuncts(tree: Tree) -> list[Tree]:
    return [*_conjuncts(tree[1]), *_conjuncts(tree[2])] if tree[0] == "&&" else [tree]


def tap_ranges(guard: Tree, var: str, ranges: dict[str, int]) -> tuple[Tree | None, tuple[TapBound, ...]] | None:
    """The guard split into its conditions free of `var` (joined again; None when there are none) and the
    bounds the others put on `var`: each `c*var + rest < 0` or `>= 0` with `rest` free of `var` and c != 0.
    None when a condition on `var` is not of that form."""
    kept: list[Tree] = []
    bounds: list[TapBound] = []
    me = Digit(var, 1, None)
    for condition in _conjuncts(guard):
        if not mentions_any(condition, {var}):
            kept.append(condition)
            continue
        if condition[0] not in ("<", ">=") or not _index_only(condition[1]) or not _index_only(condition[2]):
            return None
        linear, constant = linearize(("-", condition[1], condition[2]), ranges)  # c*var + rest, compared with 0
        c = linear.get(me, 0)
        terms = {term: k for term, k in linear.items() if term != me}
        if not c or any(term.var == var if isinstance(term, Digit) else mentions_any(term, {var}) for term in terms):
            return None
        if c > 0:  # var >= ceil(-rest / c), or var < ceil(-rest / c)
            negated = {term: -k for term, k in terms.items()}
            bounds.append(TapBound(condition[0] == ">=", to_tree((negated, -constant), ranges), c))
        else:  # -|c|*var + rest >= 0: var <= floor(rest / |c|), i.e. var < ceil((rest + 1) / |c|); and `<` mirrored
            bounds.append(TapBound(condition[0] == "<", to_tree((terms, constant + 1), ranges), -c))
    joined = None
    for condition in kept:
        joined = condition if joined is None else ("&&", joined, condition)
    return joined, tuple(bounds)


def interchangeable(phase: Phase, dtype: str) -> tuple[str, tuple[tuple[str, int], ...], Tree | None, Tree] | None:
    """(prim, reduction loops, guard, body) of a phase storing a reduction that can run interchanged: its
    innermost output axis long enough to vectorize, used by the body, and the guard either free of it or
    putting a range on it per tap (`tap_ranges`)."""
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
        ranges = dict(zip(phase.loop_vars, phase.loop_sizes, strict=True)) | dict(loops)
        if tap_ranges(guard, var, ranges) is None:
            return None
    return prim, loops, guard, body


def splits_among_threads(phase: Phase, dtype: str, min_elements: int = PARALLEL_MIN_ELEMENTS) -> bool:
    """The phase's reduction runs split among threads: interchangeable, nothing outside the innermost output
    axis to share, few enough outputs for partials on the stack, enough work for a parallel region."""
    if interchangeable(phase, dtype) is None:
        return False
    size = phase.loop_sizes[-1]
    return int(np.prod(phase.loop_sizes[:-1], dtype=np.int64)) == 1 and size <= SPLIT_MAX_OUTPUTS and \
        size * reduced_per_element(phase.expr) >= min_elements  # fmt: skip


def shared_extrema(ops: Sequence[GOperator], scopes: Collection[tuple[int, ...]] = ((),)) -> list[GOperator]:
    """`ops` (a phase running serial: too few outputs or rows to share out) with each float max/min in one of
    `scopes` (the phase's body, or its row steps': not one nested in another reduction) whose taps are many
    enough marked to share them out among the threads (`Reduction.shared`)."""
    marked = []
    for op in ops:
        if op.kind == REDUCE and op.scope in scopes and op.name in ("reduce_max", "reduce_min"):
            reduction = op.reduction
            taps = int(np.prod([size for _, size in reduction.loops], dtype=np.int64))
            if reduction.dtype in FLOAT_DTYPES and reduction.guard is None and taps >= SHARED_EXTREMUM_MIN_TAPS:
                op = replace(op, code=reduction._replace(shared=True))
        marked.append(op)
    return marked


def joined_taps(first: Phase, second: Phase, dtype: str, min_elements: int = PARALLEL_MIN_ELEMENTS) -> Phase | None:
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
    if [n for _, n in taps] != [n for _, n in other] or splits_among_threads(first, dtype, min_elements) != \
            splits_among_threads(second, dtype, min_elements):  # fmt: skip
        return None
    if first.target in buffers_used(second.expr) or second.target in buffers_used(first.expr) or \
            second.expr[0] != "reduce":  # fmt: skip
        return None
    renamed = {var: ("var", mine) for (var, _), (mine, _) in zip(other, taps, strict=True)}
    return replace(second, expr=(*second.expr[:3], taps, substituted(second.expr[4], renamed)))


