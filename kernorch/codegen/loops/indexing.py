"""Range-aware simplification of index trees, so composed reshapes and transposes become plain strides.

Layout primitives only transform indices, so a reshape → transpose → reshape chain inlines into nested
`/` and `%` of flattened coordinates, which no compiler simplifies and which stop vectorization. Here an
index is rewritten as a linear combination of *digits* — `(v / d) % n` of a loop variable v with a known
extent — plus opaque terms:

- `(Σ cᵢ·tᵢ + k) / n` and `% n` split off the terms whose coefficient n divides; if what remains provably
  lies in [0, n) the division and the remainder are exact (`E / n` = the divided terms, `E % n` = the rest);
- a digit divided or reduced by a divisor of its radix is another digit;
- adjacent digits of one variable recombine: `((v/d) % a)·c + ((v/(d·a)) % b)·(c·a)` = `((v/d) % (a·b))·c`,
  and a digit spanning the variable's whole extent is the variable itself.

So the identity reshape chain collapses back to the loop variable (a unit-stride, vectorizable access), and a
channel shuffle becomes a few divisions by constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

Tree = tuple[Any, ...]


@dataclass(frozen=True)
class Digit:
    var: str
    divisor: int
    radix: int | None  # None: no modulo ((v / divisor) over the variable's whole extent)


Term = Digit | Tree  # a digit, or an opaque index subtree
Linear = tuple[dict[Term, int], int]  # coefficients per term, constant


def _extent(term: Term, ranges: dict[str, int]) -> int | None:
    """Exclusive upper bound of a non-negative term, None if unknown (its lower bound is 0)."""
    if isinstance(term, Digit):
        if term.var not in ranges:
            return None
        whole = -(-ranges[term.var] // term.divisor)
        return whole if term.radix is None else min(term.radix, whole)
    if term[0] == "index":
        return int(term[2])
    if term[0] in ("/", "%") and term[2][0] == "lit" and term[2][1] > 0:  # of a provably non-negative index
        bounds = _bounds(linearize(term[1], ranges), ranges)
        if bounds is None or bounds[0] < 0:
            return None
        return bounds[1] // term[2][1] + 1 if term[0] == "/" else min(term[2][1], bounds[1] + 1)
    return None


def _bounds(linear: Linear, ranges: dict[str, int]) -> tuple[int, int] | None:
    terms, constant = linear
    low = high = constant
    for term, coefficient in terms.items():
        extent = _extent(term, ranges)
        if extent is None:
            return None
        span = coefficient * (extent - 1)
        low, high = (low + span, high) if span < 0 else (low, high + span)
    return low, high


def _add(a: Linear, b: Linear, scale: int = 1) -> Linear:
    terms = dict(a[0])
    for term, coefficient in b[0].items():
        terms[term] = terms.get(term, 0) + scale * coefficient
    return {t: c for t, c in terms.items() if c}, a[1] + scale * b[1]


def _atom(term: Term) -> Linear:
    return {term: 1}, 0


def linearize(tree: Tree, ranges: dict[str, int]) -> Linear:
    kind = tree[0]
    if kind == "lit":
        return {}, int(tree[1])
    if kind == "var":
        return _atom(Digit(tree[1], 1, None))
    if kind == "part":  # coordinate k of a merged variable over `sizes`
        _, var, sizes, k = tree
        stride = 1
        for size in sizes[k + 1:]:
            stride *= size
        return _atom(Digit(var, stride, None if k == 0 else sizes[k]))
    if kind == "+":
        return _add(linearize(tree[1], ranges), linearize(tree[2], ranges))
    if kind == "-":
        return _add(linearize(tree[1], ranges), linearize(tree[2], ranges), -1)
    if kind == "*":
        a, b = linearize(tree[1], ranges), linearize(tree[2], ranges)
        if not a[0]:
            a, b = b, a
        if not b[0]:  # times a constant
            return {t: c * b[1] for t, c in a[0].items() if c * b[1]}, a[1] * b[1]
        return _atom(("*", simplify(tree[1], ranges), simplify(tree[2], ranges)))
    if kind in ("/", "%") and tree[2][0] == "lit" and tree[2][1] > 0:
        return _divide(linearize(tree[1], ranges), int(tree[2][1]), kind, ranges)
    # opaque: simplify inside, keep as one term
    return _atom(tuple(simplify(c, ranges) if isinstance(c, tuple) and c and isinstance(c[0], str) and c[0] in
                       _INDEX_KINDS else c for c in tree))  # fmt: skip


_INDEX_KINDS = {"var", "lit", "+", "-", "*", "/", "%", "min", "max", "sel", "part", "table"}


def _divide(linear: Linear, n: int, op: str, ranges: dict[str, int]) -> Linear:
    terms, constant = linear
    whole = _bounds(linear, ranges)
    if whole is None or whole[0] < 0:  # C truncates negative quotients: only non-negative indices are folded
        return _atom((op, to_tree(linear, ranges), ("lit", n)))
    divided = {t: c // n for t, c in terms.items() if c % n == 0}
    rest: Linear = ({t: c for t, c in terms.items() if c % n}, constant % n)
    whole_constant = constant - constant % n
    bounds = _bounds(rest, ranges)
    if bounds is not None and bounds[0] >= 0 and bounds[1] < n:
        if op == "/":
            return {t: c for t, c in divided.items() if c}, whole_constant // n
        return rest
    split = _factor_split(linear, n, ranges)
    if split is not None:  # E = g·H + L with L in [0, g): E / n = H / (n/g), E % n = g·(H % (n/g)) + L
        factor, high, low = split
        quotient = _divide(high, n // factor, op, ranges)
        return quotient if op == "/" else _add(low, quotient, factor)
    # a single digit with coefficient 1 and no constant: divide or reduce the digit itself
    if len(terms) == 1 and constant == 0:
        ((term, coefficient),) = terms.items()
        if coefficient == 1 and isinstance(term, Digit):
            if op == "/" and (term.radix is None or term.radix % n == 0):
                return _atom(Digit(term.var, term.divisor * n, None if term.radix is None else term.radix // n))
            if op == "%" and (term.radix is None or term.radix % n == 0):
                return _atom(Digit(term.var, term.divisor, n))
    return _atom((op, to_tree(linear, ranges), ("lit", n)))


def _factor_split(linear: Linear, n: int, ranges: dict[str, int]) -> tuple[int, Linear, Linear] | None:
    """(g, H, L) with E = g·H + L, g > 1 dividing n and L in [0, g): E's terms of smallest coefficients (and
    the constant's remainder) make L, g is the greatest common divisor of n and the others' coefficients. A
    reshape of a channels-last map through windows (swin's window partition, shifted by a slice and concat)
    divides `96·pixel + c` by multiples of 96: c, the vector loop's variable, is then no part of the division."""
    terms, constant = linear
    ordered = sorted(terms.items(), key=lambda item: abs(item[1]))
    for count in range(len(ordered)):
        factor = n
        for _, coefficient in ordered[count:]:
            factor = math.gcd(factor, coefficient)
        if factor <= 1 or factor == n:
            continue
        low: Linear = (dict(ordered[:count]), constant % factor)
        bounds = _bounds(low, ranges)
        if bounds is None or bounds[0] < 0 or bounds[1] >= factor:
            continue
        high: Linear = ({t: c // factor for t, c in ordered[count:]}, constant // factor)
        return factor, high, low
    return None


def _merge_digits(terms: dict[Term, int], ranges: dict[str, int]) -> dict[Term, int]:
    """Recombine adjacent digits of one variable; drop a modulo that cannot bite."""
    changed = True
    while changed:
        changed = False
        digits = [t for t in terms if isinstance(t, Digit)]
        for low in digits:
            if low.radix is None:
                continue
            for high in digits:
                if high is low or high.var != low.var or high.divisor != low.divisor * low.radix:
                    continue
                if terms[high] != terms[low] * low.radix:
                    continue
                merged = Digit(low.var, low.divisor, None if high.radix is None else low.radix * high.radix)
                coefficient = terms.pop(low)
                terms.pop(high)
                terms[merged] = terms.get(merged, 0) + coefficient
                changed = True
                break
            if changed:
                break
    normalized: dict[Term, int] = {}
    for term, coefficient in terms.items():
        if isinstance(term, Digit) and term.radix is not None and term.var in ranges and \
                term.divisor * term.radix >= ranges[term.var]:  # fmt: skip
            term = Digit(term.var, term.divisor, None)
        normalized[term] = normalized.get(term, 0) + coefficient
    return normalized


def _digit_tree(digit: Digit) -> Tree:
    tree: Tree = ("var", digit.var)
    if digit.divisor != 1:
        tree = ("/", tree, ("lit", digit.divisor))
    if digit.radix is not None:
        tree = ("%", tree, ("lit", digit.radix))
    return tree


def to_tree(linear: Linear, ranges: dict[str, int]) -> Tree:
    terms, constant = linear
    terms = _merge_digits(dict(terms), ranges)
    result: Tree | None = None
    # larger strides first: the order a reader expects (outer coordinates first)
    for term, coefficient in sorted(terms.items(), key=lambda item: -abs(item[1])):
        tree = _digit_tree(term) if isinstance(term, Digit) else term
        if coefficient != 1:
            tree = ("*", tree, ("lit", coefficient))
        result = tree if result is None else ("+", result, tree)
    if result is None:
        return ("lit", constant)
    return result if constant == 0 else ("+", result, ("lit", constant))


def simplify(tree: Tree, ranges: dict[str, int]) -> Tree:
    """An equivalent index tree with exact divisions, remainders and recombinable digits folded away."""
    if tree[0] in ("var", "lit"):
        return tree
    return to_tree(linearize(tree, ranges), ranges)


def simplify_indices(tree: Any, ranges: dict[str, int]) -> Any:
    """Simplify every index inside a value tree (loads, table lookups), with reduction loops' extents known
    inside their bodies."""
    if not isinstance(tree, tuple) or not tree or not isinstance(tree[0], str):
        return tree
    kind = tree[0]
    if kind == "where":
        return _narrowed_where(tree, ranges)
    if kind == "load":
        return ("load", tree[1], simplify(simplify_indices(tree[2], ranges), ranges))
    if kind == "table":
        return ("table", tree[1], simplify(simplify_indices(tree[2], ranges), ranges))
    if kind == "reduce":
        inner = {**ranges, **{var: size for var, size in tree[3]}}
        return (*tree[:4], simplify_indices(tree[4], inner))
    return tuple(simplify_indices(child, ranges) if isinstance(child, tuple) else child for child in tree)


def _threshold(cond: Any, ranges: dict[str, int]) -> tuple[str, int, bool] | None:
    """(v, t, below) for a condition `v + k < t'` (below: it holds for v < t) or `v + k >= t'` (it holds for
    v >= t) on one loop variable v, with 0 < t < v's extent; else None."""
    if not isinstance(cond, tuple) or cond[0] not in ("<", ">=") or not _integral(cond[1]) or \
            not _integral(cond[2]) or cond[2][0] != "lit":  # fmt: skip
        return None  # a comparison of values (floats, loads), not of a loop index
    terms, constant = linearize(cond[1], ranges)
    if len(terms) != 1:
        return None
    ((term, coefficient),) = terms.items()
    if coefficient != 1 or not isinstance(term, Digit) or term.divisor != 1 or term.radix is not None:
        return None
    threshold = int(cond[2][1]) - constant
    if term.var not in ranges or not 0 < threshold < ranges[term.var]:
        return None
    return term.var, threshold, cond[0] == "<"


def _integral(tree: Any) -> bool:
    """Whether `tree` is an index expression: loop variables and integer literals under index operators."""
    if not isinstance(tree, tuple) or not tree or tree[0] not in ("var", "lit", "+", "-", "*", "/", "%"):
        return False
    if tree[0] == "lit":
        return isinstance(tree[1], int) and not isinstance(tree[1], bool)
    return tree[0] == "var" or all(_integral(child) for child in tree[1:])


def _renamed(tree: Any, var: str, replacement: Tree) -> Any:
    if isinstance(tree, tuple) and len(tree) == 2 and tree[0] == "var" and tree[1] == var:
        return replacement
    if isinstance(tree, tuple):
        return tuple(_renamed(child, var, replacement) for child in tree)
    return tree


def _mentions_part(tree: Any, var: str) -> bool:
    if not isinstance(tree, tuple) or not tree:
        return False
    if tree[0] == "part" and tree[1] == var:
        return True
    return any(_mentions_part(child, var) for child in tree)


def _narrowed_where(tree: Tree, ranges: dict[str, int]) -> Tree:
    """A select on a loop variable (`v < t`: a concat's piece along an outer axis, swin's shifted windows) has
    v in [0, t) in one branch and in [t, extent) in the other; each branch's indices are simplified knowing
    it (`_within`). A concat's pieces nest as `v < t1 ? p1 : v < t2 ? p2 : ... pn`: the chain is walked once,
    each piece narrowed to its own [t(k-1), t(k)) — narrowing the rest at every level renamed it over again,
    quadratic in the pieces (densenet121's concats of up to 25 maps: 140 of its first 240 s of planning)."""
    _, cond, taken, other = tree
    found = _threshold(cond, ranges)
    if found is None or _mentions_part(tree, found[0]):
        return tuple(simplify_indices(child, ranges) if isinstance(child, tuple) else child for child in tree)
    var, threshold, below = found
    if not below:  # v >= t: the taken branch is the upper range
        return ("where", simplify_indices(cond, ranges), _within(taken, var, threshold, ranges[var], ranges),
                _within(other, var, 0, threshold, ranges))  # fmt: skip
    pieces: list[tuple[Tree, Tree]] = []
    low, rest = 0, tree
    while True:
        _, cond, taken, rest = rest
        pieces.append((simplify_indices(cond, ranges), _within(taken, var, low, threshold, ranges)))
        low = threshold
        following = _threshold(rest[1], ranges) if isinstance(rest, tuple) and rest[0] == "where" else None
        if following is None or following[0] != var or not following[2] or following[1] <= low:
            break
        threshold = following[1]
    narrowed = _within(rest, var, low, ranges[var], ranges)
    for cond, piece in reversed(pieces):
        narrowed = ("where", cond, piece, narrowed)
    return narrowed


def _within(tree: Any, var: str, low: int, high: int, ranges: dict[str, int]) -> Any:
    """`tree` with its indices simplified knowing low <= var < high. From a low above 0, var is renamed v' + low
    with v' in [0, high - low) for the simplification, then back: `(v - t) / 7` where v - t >= 0, which the whole
    range could not prove."""
    if low == 0:
        return simplify_indices(tree, {**ranges, var: high})
    shifted = f"{var}'{low}"  # no C identifier: it is renamed back before rendering
    upper = _renamed(tree, var, ("+", ("var", shifted), ("lit", low)))
    return _renamed(simplify_indices(upper, {**ranges, shifted: high - low}), shifted,
                    ("+", ("var", var), ("lit", -low)))  # fmt: skip
