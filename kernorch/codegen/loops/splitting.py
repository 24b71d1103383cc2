"""Index-set splitting: an innermost loop whose body selects on where its variable is becomes one loop per range.

A concat along the innermost axis is `x0 if c < 256 else x1 if c < 512 else ...` per element, a constant pad
checks `0 <= w - pad < W` per element, and a reflecting pad mirrors its index at both borders. The branches stop
vectorization (SegFormer's channels-last concat of four [128, 128, 256] maps copied at 15 GB/s). Between two
consecutive thresholds every such condition has one value, so the loop is cut at the thresholds into ranges, and
in each the selects are decided: a concat becomes one unit-stride copy per piece, a pad's interior loop has no
check left, a reflection's interior reads unit-stride.
"""

from __future__ import annotations

from typing import Any

from kernorch.codegen.loops.indexing import Digit, linearize

Tree = tuple[Any, ...]
# More ranges than this: the code grows more than the branches cost. A piece is one short loop; densenet's
# channels-last concats join up to 25 (densenet121) and 49 (densenet201) maps, copied at ~3 GB/s through the
# nested selects and at ~25 GB/s as one loop per piece (36-90 -> 7-10 us each in place at 64x64 input).
MAX_PIECES = 64
_CONDITIONS = ("<", ">=", "&&")


def _linear(cond: Tree, var: str, ranges: dict[str, int]) -> tuple[str, int, int, int] | None:
    """(op, c, k, t) for a condition `c·var + k OP t` (OP `<` or `>=`, c != 0) on var alone; else None."""
    if cond[0] not in ("<", ">=") or cond[2][0] != "lit":
        return None
    terms, constant = linearize(cond[1], ranges)
    if len(terms) != 1:
        return None
    ((term, c),) = terms.items()
    if term != Digit(var, 1, None) or not c:
        return None
    return str(cond[0]), c, constant, int(cond[2][1])


def _holds(condition: tuple[str, int, int, int], v: int) -> bool:
    op, c, k, t = condition
    return (c * v + k < t) == (op == "<")


def _breakpoints(tree: Any, var: str, ranges: dict[str, int], found: set[int]) -> None:
    """Where a condition on var alone changes value: the first v past its threshold."""
    if not isinstance(tree, tuple) or not tree or not isinstance(tree[0], str):
        return
    linear = _linear(tree, var, ranges)
    if linear is not None:
        _, c, k, t = linear
        found.add(-((k - t) // c) if c > 0 else (t - k) // c + 1)  # c>0: ceil((t-k)/c); c<0: floor((t-k)/c) + 1
        return
    for child in tree[1:]:
        _breakpoints(child, var, ranges, found)


def _decide(cond: Tree, var: str, lo: int, hi: int, ranges: dict[str, int]) -> bool | None:
    """The condition's value for every var in [lo, hi), or None when it is not decided by var alone."""
    if cond[0] == "&&":
        a, b = (_decide(c, var, lo, hi, ranges) for c in cond[1:])
        if a is False or b is False:
            return False
        return True if a is True and b is True else None
    linear = _linear(cond, var, ranges)
    if linear is None:
        return None
    first, last = _holds(linear, lo), _holds(linear, hi - 1)  # linear in var: the ends decide the range
    return first if first == last else None


def _specialised(tree: Any, var: str, lo: int, hi: int, ranges: dict[str, int]) -> Any:
    """The tree with every select decided on [lo, hi) replaced by the branch it takes: value selects (`where`)
    and index selects (`sel`: a reflecting pad's mirrored borders)."""
    if not isinstance(tree, tuple) or not tree or not isinstance(tree[0], str):
        return tree
    if tree[0] in ("where", "sel") and isinstance(tree[1], tuple) and tree[1][0] in _CONDITIONS:
        decided = _decide(tree[1], var, lo, hi, ranges)
        if decided is not None:
            return _specialised(tree[2] if decided else tree[3], var, lo, hi, ranges)
    return tuple(_specialised(child, var, lo, hi, ranges) for child in tree)


def _ranges(expr: Tree, var: str, lo: int, hi: int, ranges: dict[str, int], depth: int) -> list[tuple[int, int, Tree]]:
    """[lo, hi) cut where the selects of `expr` change, each range with its specialised expression; a range
    is cut again where the selects its specialisation uncovered change (a reflection's `|w - p| >= W` is
    linear only once `w - p < 0` is decided)."""
    found: set[int] = set()
    _breakpoints(expr, var, ranges, found)
    cuts = sorted(t for t in found if lo < t < hi)
    if not cuts or depth == 0:  # what is decided on the whole range still is
        return [(lo, hi, _specialised(expr, var, lo, hi, ranges))]
    bounds = [lo, *cuts, hi]
    pieces: list[tuple[int, int, Tree]] = []
    for begin, end in zip(bounds, bounds[1:], strict=False):
        piece = _specialised(expr, var, begin, end, ranges)
        pieces += [(begin, end, piece)] if piece == expr else _ranges(piece, var, begin, end, ranges, depth - 1)
    return pieces


def split_innermost(expr: Tree, var: str, size: int, ranges: dict[str, int]) -> list[tuple[int, int, Tree]] | None:
    """[(begin, end, the expression on that range)] covering [0, size), or None when nothing splits."""
    pieces = _ranges(expr, var, 0, size, ranges, depth=2)
    merged: list[tuple[int, int, Tree]] = []
    for begin, end, piece in pieces:  # neighbours the same after specialising: one loop
        if merged and merged[-1][2] == piece:
            begin = merged.pop()[0]
        merged.append((begin, end, piece))
    if len(merged) < 2 or len(merged) > MAX_PIECES or all(piece == expr for _, _, piece in merged):
        return None  # the thresholds sit in conditions no select uses
    return merged
