"""An upsampling along the innermost axis computed from input rows held in vector registers.

A phase split as out[f·q + r] (`Phase.residues`) over a short input row (segformer_b0's width resizes: 32 -> 128
and 16 -> 128) left its vector loop over q 30 or 14 iterations long: 1.9x and 2.4x its roofline. When every
read of an input row reads within that row of 16 or 32 floats, the row fits in one or two vector registers and
each output vector of 16 positions is a permutation of them (one `vpermt2ps` per tap, the clamps at the row's
ends folded into the constant lane indices); the other reads and the store run along the output row. Longer
rows (up to MAX_ROW) work the same when each block's lanes fall within two adjacent registers of the row (a
doubling of 64: 103 µs in its residue loops).

`row_access` classifies one access of such a phase; `permutable` says whether a phase runs this way. The
lowering (gir/lowering.py) marks the phase `row_permuted`; the renderer evaluates the same classification per
output vector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kernorch.codegen.loops import Phase, Tree

VECTOR = 16  # output positions per vector block (float32 lanes of a 512-bit register)
MAX_ROW = 128  # longest input row held in registers (a multiple of VECTOR)
MAX_OUTPUT_ROW = 16 * VECTOR  # longest output row (its vector blocks are unrolled)


@dataclass(frozen=True)
class RowAccess:
    along: bool  # True: position p of the output row reads/writes base + p; False: a permuted input row
    base: Tree  # index of the first element (the row's, or the output row's), without the row's variables
    width: int = 0  # elements of the input row held in registers (a multiple of VECTOR)
    lanes: tuple[int, ...] = ()  # per output position, the element of the input row it reads


def row_loops_of(loops: tuple[tuple[str, int], ...]) -> tuple[str, str, int, int]:
    """(q, r, Q, f): the last two of `loops` (variable, size), the output row's f·Q positions."""
    (q, size_q), (r, factor) = loops[-2:]
    return q, r, size_q, factor


def row_access(index: Tree, row: tuple[str, str, int, int], tables: dict[str, np.ndarray],
               row_width: int) -> RowAccess | None:  # fmt: skip
    """How an access at `index` of a buffer whose innermost axis is `row_width` long reads along the output
    row, or None when it does neither way."""
    q, r, size_q, factor = row
    base: list[Tree] = []
    offset: list[Tree] = []
    for term in _addends(index):
        (offset if _mentions(term, (q, r)) else base).append(term)
    if any(_mentions(term, ("",), other_than=(q, r)) for term in offset):
        return None  # the offset within the row depends on another loop or a gather
    positions = [(p // factor, p % factor) for p in range(size_q * factor)]
    try:
        lanes = tuple(sum(_evaluate(term, {q: at_q, r: at_r}, tables) for term in offset) for at_q, at_r in positions)
    except (KeyError, IndexError, ValueError):
        return None
    start = _sum(base)
    if lanes == tuple(range(len(positions))):
        return RowAccess(True, start)
    # a whole row of the buffer (its start a multiple of the row's length), every lane inside it: loading the
    # row into registers reads only the buffer
    if row_width % VECTOR or row_width > MAX_ROW or not all(_multiple_of(term, row_width) for term in base) \
            or min(lanes) < 0 or max(lanes) >= row_width:  # fmt: skip
        return None
    # each block's lanes within two adjacent registers of the row (one two-source shuffle)
    if any(max(block) - window(block, row_width) >= 2 * VECTOR for block in _blocks(lanes)):
        return None
    return RowAccess(False, start, row_width, lanes)


def window(block: tuple[int, ...], row_width: int) -> int:
    """The first element of the two adjacent registers of a row of `row_width` floats that a block's lanes
    are taken from (a row of one register: 0, that register twice)."""
    if row_width == VECTOR:
        return 0
    return min(min(block) // VECTOR * VECTOR, row_width - 2 * VECTOR)


def _blocks(lanes: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [lanes[first : first + VECTOR] for first in range(0, len(lanes), VECTOR)]


def permutable(phase: Phase, tables: dict[str, np.ndarray], dtypes: dict[str, str], widths: dict[str, int]) -> bool:
    """Whether the phase runs by vector blocks of its output row, its input rows permuted in registers."""
    if not phase.residues or phase.scalar or len(phase.loop_vars) < 2 or dtypes.get(phase.target) != "float32":
        return False
    row = row_loops_of(tuple(zip(phase.loop_vars, phase.loop_sizes, strict=True)))
    length = row[2] * row[3]
    if length % VECTOR or length > MAX_OUTPUT_ROW:
        return False
    store = row_access(phase.store_index, row, tables, 0)
    if store is None or not store.along:
        return False
    loads: list[tuple[str, Tree]] = []
    if not _loads(phase.expr, loads) or not loads:
        return False
    permuted = False
    for buffer, index in loads:
        if buffer in tables:
            if _mentions(index, ("",), other_than=row[:2]):
                return False  # a table read per row, not per output position
            continue
        access = row_access(index, row, tables, widths.get(buffer, 0))
        if access is None or (not access.along and dtypes.get(buffer) != "float32"):
            return False
        permuted |= not access.along
    return permuted


def table_lanes(index: Tree, row: tuple[str, str, int, int], tables: dict[str, np.ndarray]) -> tuple[int, ...]:
    """Per output position, the element of a table a read at `index` takes (an index of q and r only)."""
    q, r, size_q, factor = row
    return tuple(_evaluate(index, {q: p // factor, r: p % factor}, tables) for p in range(size_q * factor))


def _loads(tree: Any, found: list[tuple[str, Tree]]) -> bool:
    """Collect the (buffer, index) of every load and table read into `found`; False when the value is not a
    plain map (a reduction, a store, a row statistic, a gather, a select on indices)."""
    if not isinstance(tree, tuple) or not tree or not isinstance(tree[0], str):
        return True
    if tree[0] in ("load", "table"):
        found.append((tree[1], tree[2]))
        return not _mentions(tree[2], ("",), other_than=None)
    if tree[0] in ("reduce", "tee", "scalar", "guard") or (tree[0] == "where" and tree[1][0] not in _VALUES):
        return False
    return all(_loads(child, found) for child in tree[1:])


_VALUES = {"load", "const", "op", "cast", "where", "table"}


def _multiple_of(tree: Tree, n: int) -> bool:
    """Whether an index term is a multiple of n for every value of its variables."""
    if tree[0] == "lit":
        return int(tree[1]) % n == 0
    if tree[0] == "*":
        return _multiple_of(tree[1], n) or _multiple_of(tree[2], n)
    if tree[0] == "+":
        return _multiple_of(tree[1], n) and _multiple_of(tree[2], n)
    return False


def _addends(tree: Tree) -> list[Tree]:
    if tree[0] == "+":
        return [*_addends(tree[1]), *_addends(tree[2])]
    return [tree]


def _sum(terms: list[Tree]) -> Tree:
    if not terms:
        return ("lit", 0)
    total = terms[0]
    for term in terms[1:]:
        total = ("+", total, term)
    return total


def _mentions(tree: Any, names: tuple[str, ...], other_than: tuple[str, ...] | None = ()) -> bool:
    """Whether `tree` reads a variable in `names` ("" in names: any variable not in `other_than`, or a
    gather's read; `other_than` None: only a gather's read)."""
    if not isinstance(tree, tuple) or not tree:
        return False
    if tree[0] in ("var", "part"):
        return tree[1] in names or ("" in names and other_than is not None and tree[1] not in other_than)
    if tree[0] in ("index", "read"):
        return "" in names
    return any(_mentions(child, names, other_than) for child in tree[1:])


def _evaluate(tree: Tree, point: dict[str, int], tables: dict[str, np.ndarray]) -> int:
    """An index tree's value (C semantics) at `point`; KeyError for a variable not in it."""
    kind = tree[0]
    if kind == "var":
        return point[tree[1]]
    if kind == "lit":
        return int(tree[1])
    if kind == "table":
        return int(tables[tree[1]][_evaluate(tree[2], point, tables)])
    if kind == "sel":
        return _evaluate(tree[2] if _holds(tree[1], point, tables) else tree[3], point, tables)
    if kind not in ("+", "-", "*", "/", "%", "min", "max"):
        raise ValueError(kind)
    a, b = _evaluate(tree[1], point, tables), _evaluate(tree[2], point, tables)
    if kind in ("/", "%"):
        if b == 0:
            raise ValueError("division by zero")
        quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1)  # C truncates toward zero
        return quotient if kind == "/" else a - quotient * b
    return {"+": a + b, "-": a - b, "*": a * b, "min": min(a, b), "max": max(a, b)}[kind]


def _holds(condition: Tree, point: dict[str, int], tables: dict[str, np.ndarray]) -> bool:
    if condition[0] == "&&":
        return _holds(condition[1], point, tables) and _holds(condition[2], point, tables)
    a, b = _evaluate(condition[1], point, tables), _evaluate(condition[2], point, tables)
    compare = {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}
    if condition[0] not in compare:
        raise ValueError(condition[0])
    return compare[condition[0]]
