"""Index-set splitting: an innermost loop whose body selects on where its variable is becomes one loop per range.

A concat along the innermost axis is `x0 if c < 256 else x1 if c < 512 else ...` per element, and a constant pad
checks `0 <= w - pad < W` per element. The branches stop vectorization (SegFormer's channels-last concat of four
[128, 128, 256] maps copied at 15 GB/s). Between two consecutive thresholds every such condition has one value,
so the loop is cut at the thresholds into ranges, and in each the selects are decided: a concat becomes one
unit-stride copy per piece, a pad's interior loop has no check left.
"""

from __future__ import annotations

from typing import Any

from kernorch.codegen.indexing import Digit, linearize

Tree = tuple[Any, ...]
MAX_PIECES = 8  # more ranges than this: the code grows more than the branches cost
_CONDITIONS = ("<", ">=", "&&")


def _threshold(cond: Tree, var: str, ranges: dict[str, int]) -> tuple[str, int] | None:
    """("<", t) for a condition `var < t`, (">=", t) for `var >= t`, written as `var + k OP c`; else None."""
    if cond[0] not in ("<", ">=") or cond[2][0] != "lit":
        return None
    terms, constant = linearize(cond[1], ranges)
    if terms != {Digit(var, 1, None): 1}:
        return None
    return str(cond[0]), int(cond[2][1]) - constant


def _breakpoints(tree: Any, var: str, ranges: dict[str, int], found: set[int]) -> None:
    if not isinstance(tree, tuple) or not tree or not isinstance(tree[0], str):
        return
    if tree[0] in ("<", ">="):
        decided = _threshold(tree, var, ranges)
        if decided is not None:
            found.add(decided[1])
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
    threshold = _threshold(cond, var, ranges)
    if threshold is None:
        return None
    op, t = threshold
    below = True if hi <= t else False if lo >= t else None
    return below if op == "<" or below is None else not below


def _specialised(tree: Any, var: str, lo: int, hi: int, ranges: dict[str, int]) -> Any:
    """The tree with every index select decided on [lo, hi) replaced by the branch it takes."""
    if not isinstance(tree, tuple) or not tree or not isinstance(tree[0], str):
        return tree
    if tree[0] == "where" and tree[1][0] in _CONDITIONS:
        decided = _decide(tree[1], var, lo, hi, ranges)
        if decided is not None:
            return _specialised(tree[2] if decided else tree[3], var, lo, hi, ranges)
    return tuple(_specialised(child, var, lo, hi, ranges) for child in tree)


def split_innermost(expr: Tree, var: str, size: int, ranges: dict[str, int]) -> list[tuple[int, int, Tree]] | None:
    """[(begin, end, the expression on that range)] covering [0, size), or None when nothing splits."""
    found: set[int] = set()
    _breakpoints(expr, var, ranges, found)
    cuts = sorted(t for t in found if 0 < t < size)
    if not cuts or len(cuts) + 1 > MAX_PIECES:
        return None
    bounds = [0, *cuts, size]
    pieces = [(lo, hi, _specialised(expr, var, lo, hi, ranges)) for lo, hi in zip(bounds, bounds[1:], strict=False)]
    if all(piece == expr for _, _, piece in pieces):  # the thresholds sit in conditions no select uses
        return None
    return pieces
