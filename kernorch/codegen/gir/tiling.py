"""Whether a phase reads its input transposed, and is tiled (the tiled loops' C is c/loops.py's `tiled_loops`).

A phase storing along its innermost loop variable b while a load steps through memory with a large stride in b
and unit stride in the next loop variable a is a transpose (NCHW → NHWC, a head permutation). Untiled, every
element read touches its own cache line, and with a stride of 4 KB all of them fall into one L1 set: SegFormer's
640-channel transposes ran at 5 GB/s. Looping over tile × tile blocks of (a, b) instead (a tile side is a cache line
of floats: `Target.tile`), the block's input lines and output lines (a tile of each) stay in L1 until every
element of them is used.
"""

from __future__ import annotations

from typing import Any

from kernorch.codegen.loops import Digit, Phase, linearize

Tree = tuple[Any, ...]


def stride_along(index: Tree, var: str, ranges: dict[str, int]) -> int | None:
    """Elements the index moves when `var` grows by one; None when it is not affine in `var`."""
    terms, _ = linearize(index, ranges)
    stride = 0
    for term, coefficient in terms.items():
        if isinstance(term, Digit):
            if term.var == var:
                if term.divisor != 1 or term.radix is not None:
                    return None
                stride = coefficient
        elif mentions(term, var):
            return None
    return stride


def mentions(tree: Any, var: str) -> bool:
    if not isinstance(tree, tuple):
        return False
    if len(tree) == 2 and tree[0] == "var":
        return bool(tree[1] == var)
    return any(mentions(child, var) for child in tree[1:])


def _loads(tree: Any) -> list[Tree]:
    """Index trees of the loads of a value tree (outside reductions: those loop on their own)."""
    if not isinstance(tree, tuple) or not tree or tree[0] == "reduce":
        return []
    if tree[0] == "load":
        return [tree[2]]
    found: list[Tree] = []
    for child in tree[1:]:
        found += _loads(child)
    return found


def reads_transposed(phase: Phase, tile: int) -> bool:
    """The phase stores contiguously along its innermost variable and some load is contiguous along the
    variable outside it instead, with a stride of at least a cache line (`tile` elements) along the innermost."""
    if len(phase.loop_vars) < 2 or min(phase.loop_sizes[-2:]) < tile or phase.scalar:
        return False
    ranges = dict(zip(phase.loop_vars, phase.loop_sizes, strict=True))
    a, b = phase.loop_vars[-2:]
    if stride_along(phase.store_index, b, ranges) != 1:
        return False
    for index in _loads(phase.expr):
        along_b, along_a = stride_along(index, b, ranges), stride_along(index, a, ranges)
        if along_a == 1 and along_b is not None and abs(along_b) >= tile:
            return True
    return False


def transposed_copy(phase: Phase, dtypes: dict[str, str]) -> tuple[Tree, int, int] | None:
    """(load index, input stride along the innermost variable b, output stride along the variable a outside it)
    when the phase only copies float32 values read transposed: unit stride along a in, along b out."""
    expr = phase.expr
    if expr[0] != "load" or dtypes.get(expr[1]) != "float32" or dtypes.get(phase.target) != "float32":
        return None
    ranges = dict(zip(phase.loop_vars, phase.loop_sizes, strict=True))
    a, b = phase.loop_vars[-2:]
    for index in (expr[2], phase.store_index):
        if any(not isinstance(term, Digit) for term in linearize(index, ranges)[0]):
            return None  # a gathered or clamped index: element by element
    stride_in, stride_out = stride_along(expr[2], b, ranges), stride_along(phase.store_index, a, ranges)
    if stride_along(expr[2], a, ranges) != 1 or stride_in is None or stride_out is None:
        return None
    return expr[2], stride_in, stride_out


def rows_share_a_set(stride_in: int, itemsize: int = 4) -> bool:
    """The input rows of a tile (STRIDE_IN elements apart) fall into at most two L1 sets: 64 sets of 64-byte
    lines repeat every 4 KB, so rows a multiple of 2 KB apart put 8 or more of a tile's 16 rows into one
    8-way set, and they evict each other before the tile is done with them."""
    return (stride_in * itemsize) % 2048 == 0


