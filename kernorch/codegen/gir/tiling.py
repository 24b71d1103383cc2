"""Tiled loops for a phase that reads its input transposed.

A phase storing along its innermost loop variable b while a load steps through memory with a large stride in b
and unit stride in the next loop variable a is a transpose (NCHW → NHWC, a head permutation). Untiled, every
element read touches its own cache line, and with a stride of 4 KB all of them fall into one L1 set: SegFormer's
640-channel transposes ran at 5 GB/s. Looping over TILE × TILE blocks of (a, b) instead, the block's input lines
and output lines (TILE of each) stay in L1 until every element of them is used.
"""

from __future__ import annotations

from typing import Any

from kernorch.codegen.gir.sharing import Sharing, loop_headers
from kernorch.codegen.loops.describe import Phase
from kernorch.codegen.loops.indexing import Digit, linearize

Tree = tuple[Any, ...]
TILE = 16  # floats per 64-byte line


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


def reads_transposed(phase: Phase) -> bool:
    """The phase stores contiguously along its innermost variable and some load is contiguous along the
    variable outside it instead, with a stride of at least a cache line along the innermost."""
    if len(phase.loop_vars) < 2 or min(phase.loop_sizes[-2:]) < TILE or phase.scalar:
        return False
    ranges = dict(zip(phase.loop_vars, phase.loop_sizes, strict=True))
    a, b = phase.loop_vars[-2:]
    if stride_along(phase.store_index, b, ranges) != 1:
        return False
    for index in _loads(phase.expr):
        along_b, along_a = stride_along(index, b, ranges), stride_along(index, a, ranges)
        if along_a == 1 and along_b is not None and abs(along_b) >= TILE:
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


def tiled_loops(loops: tuple[tuple[str, int], ...], sharing: Sharing | None, hoisted: list[str], inner: list[str],
                blocks: tuple[str, int, str, int] | None = None, strips: bool = False) -> list[str]:  # fmt: skip
    """A phase's `loops` with the last two variables walked in TILE × TILE blocks; with `sharing`, the outer
    loops and both block loops are shared out to the threads. `hoisted` is computed per value of the
    second-to-last variable, `inner` is the body of the innermost loop. With `blocks` (source address, its
    stride along b, target address, its stride along a, as C expressions of the loop variables at a block's
    corner) a whole tile of a transposing copy is moved as 8 × 8 register blocks (`ko_transpose8`), or with
    `strips` 8 of the input's rows at a time (`transposed_rows`)."""
    *outer, (a, size_a), (b, size_b) = loops
    if blocks is not None and strips:
        return transposed_rows(loops, sharing, hoisted, inner, blocks)
    nest = [*((v, n, 1) for v, n in outer), (f"{a}_t", size_a, TILE), (f"{b}_t", size_b, TILE)]
    lines, closing = sharing.collapsed(nest) if sharing is not None else (loop_headers(nest), len(nest))
    lines += [f"const int64_t {a}_end = {a}_t + {TILE} < {size_a} ? {a}_t + {TILE} : {size_a};",
              f"const int64_t {b}_end = {b}_t + {TILE} < {size_b} ? {b}_t + {TILE} : {size_b};"]  # fmt: skip
    if blocks is None:
        lines += _elementwise(a, b, hoisted, inner)
    else:
        source, stride_in, target, stride_out = blocks
        lines += [f"if ({a}_end - {a}_t == {TILE} && {b}_end - {b}_t == {TILE}) {{",
                  f"for (int64_t {a}_o = 0; {a}_o < {TILE}; {a}_o += 8) {{",
                  f"for (int64_t {b}_o = 0; {b}_o < {TILE}; {b}_o += 8) {{",
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
    an L1 set (`rows_share_a_set`): a TILE × TILE tile reads 16 of them, which evict each other. Segformer's
    [256, 16384] -> [16384, 256] copy (rows 64 KB apart) ran 1.45 ms in tiles and 0.83 ms in strips (23 ->
    40 GB/s on 2 cores; a plain copy of the same bytes 0.43 ms); in place 1.84-2.40 -> 1.19-1.33 ms. Where
    rows do not share a set, tiles write whole output lines and win ([16, 16, 1024] from rows 1 KB apart:
    50-60 µs in tiles, 75 in strips)."""
    *outer, (a, size_a), (b, size_b) = loops
    nest = [*((v, n, 1) for v, n in outer), (f"{b}_t", size_b, 8)]
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
