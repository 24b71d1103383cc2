"""A row's mean and variance in one pass over the row instead of two (layer norm over short rows).

The fission of a norm computes, per row of n elements, S = Σx and then V = Σ(x - S/n)²: two passes, each
summing across lanes and rows (`ko_sum8x8`). Over short rows that second pass, not the bytes, sets the time
(segformer_b0's [4096, 64] layer norm: 25.3 µs, 17.8 in one pass; a copy of its bytes takes 11.7). Here both
sums come from one loop over the row, shifted by the row's first element k (Chan, Golub and LeVeque's shifted
data algorithm):

    S' = Σ(x - k),  Q = Σ(x - k)²,  S = S' + n·k,  V = Q - S'·(S'/n)   (clamped at 0)

Unshifted (Q = Σx²) the subtraction cancels catastrophically when the mean is large against the spread. With
k an element of the row, n·(mean - k)² ≤ (n - 1)·V (Samuelson's inequality: no element is further than
√(n-1) standard deviations from the mean), so Q ≤ n·V and the subtraction loses at most log2(n) bits, however
the data look; typically (k about one standard deviation from the mean) one bit. A row of equal values gives
exactly 0. Rows up to `max_row` elements only: they are the ones whose two sums the renderer runs in one loop
(gir/lowering.py `_joined`), and longer rows would lose more bits.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from kernorch.codegen.gir.reductions import buffers_used, mentions_any
from kernorch.codegen.loops import KernelLoops, Phase, Tree, linearize, simplify_indices, substituted

_F32 = "float32"


def one_pass_variance(loops: KernelLoops, min_row: int, max_row: int) -> tuple[KernelLoops, bool]:
    """`loops` with each (sum, sum of squared deviations from its mean) pair of row statistics over rows of
    `min_row` to `max_row` elements computed from one shifted pass over the row; and whether anything
    changed."""
    if loops.schedule != "row":
        return loops, False
    phases = list(loops.phases)
    changed = False
    for j, phase in enumerate(phases):
        match = _squared_deviations(phases, j, min_row, max_row)
        if match is None:
            continue
        i, value, var, n, var_squares = match
        total = phases[i].target
        shift, shifted, squares = f"{total}k", f"{total}s", f"{total}q"
        centred = ("op", "sub", _F32, value, ("scalar", shift))
        phases[j] = _scalar(phase.target, ("op", "max", _F32, ("const", 0.0, _F32), ("op", "sub", _F32,
            ("scalar", squares), ("op", "mul", _F32, ("scalar", shifted),
                                  ("op", "mul", _F32, ("scalar", shifted), ("const", 1.0 / n, _F32))))))  # fmt: skip
        phases[i : i + 1] = [
            _scalar(shift, substituted(value, {var: ("lit", 0)})),  # the row's first element
            _scalar(shifted, ("reduce", "reduce_sum", _F32, ((var, n),), centred)),
            # its own loop variable: the renderer runs both sums in one loop body
            _scalar(squares, ("reduce", "reduce_sum", _F32, ((var_squares, n),),
                              substituted(("op", "mul", _F32, centred, centred), {var: ("var", var_squares)}))),
            _scalar(total, ("op", "add", _F32, ("scalar", shifted),
                            ("op", "mul", _F32, ("scalar", shift), ("const", float(n), _F32)))),
        ]  # fmt: skip
        changed = True
        break  # indices moved: look again from the start
    if not changed:
        return loops, False
    again, _ = one_pass_variance(replace(loops, phases=phases), min_row, max_row)
    return again, True


def _squared_deviations(phases: list[Phase], j: int, min_row: int,
                        max_row: int) -> tuple[int, Tree, str, int, str] | None:  # fmt: skip
    """(i, x, S's loop variable, n, phase j's loop variable) when phase j sums (x - S/n)² over a row of
    `min_row` <= n <= `max_row` elements and the earlier phase i is S = Σx over the same elements (x read in
    the same way, its loop variable renamed)."""
    phase = phases[j]
    if not phase.scalar or not _is_float_sum(phase.expr):
        return None
    _, _, _, ((var_j, n),), body = phase.expr
    if not min_row <= n <= max_row or body[:3] != ("op", "mul", _F32) or body[3] != body[4]:
        return None  # not a square
    if body[3][:3] != ("op", "sub", _F32):
        return None
    deviation, mean = body[3][3], body[3][4]
    total = _mean_of(mean, n)
    if total is None:
        return None
    i = next((k for k in range(j) if phases[k].target == total), None)
    if i is None or not phases[i].scalar or not _is_float_sum(phases[i].expr):
        return None
    _, _, _, ((var_i, n_i),), value = phases[i].expr
    if n_i != n or var_i == var_j or substituted(value, {var_i: ("var", var_j)}) != deviation or not _plain(value):
        return None
    return i, value, var_i, n, var_j


def _is_float_sum(tree: Tree) -> bool:
    return tree[:3] == ("reduce", "reduce_sum", _F32) and len(tree[3]) == 1 and tree[4][0] != "guard"


def _mean_of(tree: Tree, n: int) -> str | None:
    """The slot S when `tree` is S/n (as S·(1/n) in float32 or S/n), else None."""
    if tree[:3] == ("op", "mul", _F32):
        for scalar, const in ((tree[3], tree[4]), (tree[4], tree[3])):
            if scalar[0] == "scalar" and const[0] == "const" and np.float32(const[1]) == np.float32(1.0 / n):
                return str(scalar[1])
    if tree[:3] == ("op", "div", _F32) and tree[3][0] == "scalar" and tree[4][0] == "const" \
            and float(tree[4][1]) == float(n):  # fmt: skip
        return str(tree[3][1])
    return None


def _plain(tree: Any) -> bool:
    """No reduction, store or row statistic inside: the value is the same wherever it is evaluated."""
    if not isinstance(tree, tuple) or not tree or not isinstance(tree[0], str):
        return True
    return tree[0] not in ("reduce", "tee", "scalar", "guard") and all(_plain(child) for child in tree[1:])


def _scalar(slot: str, expr: Tree) -> Phase:
    return Phase(slot, (), (), expr, scalar=True)


def one_pass_columns(loops: KernelLoops) -> tuple[KernelLoops, bool]:
    """The phased counterpart: an instance norm's per-channel S = Σx and V = Σ(x - S/n)², each a reduction over
    the same taps (the map's positions), become S' = Σ(x - k) and Q = Σ(x - k)² with k the channel's value at
    the centre of the map, next to each other so the lowering runs them in one pass over the map (gir/lowering.py
    joins them), then V = max(Q - S'·(S'/n), 0) and S = S' + n·k in place, per channel.

    The same bound holds (k is one of the n values: at most log2(n) bits lost, 11.6 for a 56 x 56 map, when k
    is the channel's most extreme value; typically one). The centre, not the first position: a convolution's
    output differs most at the map's borders, where its padding is. Only when nothing else in the kernel reads
    what x reads: a kernel that also stores the deviations reads the map again anyway, and its variance is
    already teed with them (tee.py)."""
    if loops.schedule != "phased":
        return loops, False
    phases = list(loops.phases)
    for j in range(len(phases)):
        match = _column_deviations(phases, j)
        if match is None:
            continue
        i, value, taps, n = match
        first, squares = phases[i], phases[j]
        ranges = dict(zip(first.loop_vars, first.loop_sizes, strict=True))
        shift = simplify_indices(substituted(value, {var: ("lit", size // 2) for var, size in taps}), ranges)
        if mentions_any(shift, {var for var, _ in taps}):  # a merged tap variable's part: not one value
            continue
        centred = ("op", "sub", _F32, value, shift)
        total, deviations = ("load", first.target, first.store_index), ("load", squares.target, first.store_index)
        phases[j : j + 1] = []
        phases[i : i + 1] = [
            replace(first, expr=("reduce", "reduce_sum", _F32, taps, centred)),  # S' in S's buffer
            replace(squares, expr=("reduce", "reduce_sum", _F32, taps, ("op", "mul", _F32, centred, centred)),
                    store_index=first.store_index),  # Q, over the same taps: joined into S''s pass
            replace(squares, expr=("op", "max", _F32, ("const", 0.0, _F32), ("op", "sub", _F32, deviations,
                    ("op", "mul", _F32, total, ("op", "mul", _F32, total, ("const", 1.0 / n, _F32))))),
                    store_index=first.store_index),  # V, while S' is still in S's buffer
            replace(first, expr=("op", "add", _F32, total, ("op", "mul", _F32, shift, ("const", float(n), _F32)))),
        ]  # fmt: skip
        return replace(loops, phases=phases), True
    return loops, False


def _column_deviations(phases: list[Phase], j: int) -> tuple[int, Tree, tuple[tuple[str, int], ...], int] | None:
    """(i, x, the taps, n) when phase j sums (x - S/n)² over n taps at each output element, the earlier phase i
    is S = Σx over the same taps and output elements (variables renamed), and no other phase reads what x
    reads."""
    phase = phases[j]
    if phase.scalar or not phase.loop_vars or not _is_column_sum(phase.expr):
        return None
    _, _, _, taps_j, body = phase.expr
    if body[:3] != ("op", "mul", _F32) or body[3] != body[4] or body[3][:3] != ("op", "sub", _F32):
        return None  # not a square of a difference
    deviation, mean = body[3][3], body[3][4]
    n = int(np.prod([size for _, size in taps_j], dtype=np.int64))
    read = _mean_read(mean, n)
    if read is None:
        return None
    i = next((k for k in range(j) if phases[k].target == read[0]), None)
    if i is None or phases[i].scalar or not _is_column_sum(phases[i].expr):
        return None
    first = phases[i]
    _, _, _, taps_i, value = first.expr
    if (first.loop_vars, first.loop_sizes) != (phase.loop_vars, phase.loop_sizes) or \
            [size for _, size in taps_i] != [size for _, size in taps_j]:  # fmt: skip
        return None
    ranges = dict(zip(phase.loop_vars, phase.loop_sizes, strict=True))
    if not _same_element(read[1], first.store_index, ranges) or \
            not _same_element(phase.store_index, first.store_index, ranges):  # fmt: skip
        return None
    renamed = {var_i: ("var", var_j) for (var_i, _), (var_j, _) in zip(taps_i, taps_j, strict=True)}
    if substituted(value, renamed) != deviation or not _plain(value):
        return None
    sources = buffers_used(value)
    others = [p for k, p in enumerate(phases) if k not in (i, j)]
    if not sources or any(sources & (buffers_used(p.expr) | {p.target}) for p in others):
        return None
    return i, value, taps_i, n


def _is_column_sum(tree: Tree) -> bool:
    return tree[:3] == ("reduce", "reduce_sum", _F32) and tree[4][0] != "guard"


def _mean_read(tree: Tree, n: int) -> tuple[str, Tree] | None:
    """(buffer, index) when `tree` is buffer[index]/n (as a product with 1/n in float32, or a quotient)."""
    if tree[:3] == ("op", "mul", _F32):
        for load, const in ((tree[3], tree[4]), (tree[4], tree[3])):
            if load[0] == "load" and const[0] == "const" and np.float32(const[1]) == np.float32(1.0 / n):
                return str(load[1]), load[2]
    if tree[:3] == ("op", "div", _F32) and tree[3][0] == "load" and tree[4][0] == "const" \
            and float(tree[4][1]) == float(n):  # fmt: skip
        return str(tree[3][1]), tree[3][2]
    return None


def _same_element(a: Tree, b: Tree, ranges: dict[str, int]) -> bool:
    """Two indices over the same loops address the same element in every iteration (loops of one iteration
    are 0)."""
    zero = {var: ("lit", 0) for var, size in ranges.items() if size == 1}
    return linearize(substituted(a, zero), ranges) == linearize(substituted(b, zero), ranges)
