"""Index simplification is exact: random index trees of `+ - * / %` over loop variables with known extents
evaluate to the same integer as their simplified form at every point of the iteration space."""

from __future__ import annotations

import itertools
import random

import pytest

from kernorch.codegen.loops.indexing import Tree, simplify


def _c_divide(a: int, b: int) -> int:
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b > 0) else -quotient  # C truncates toward zero


def evaluate(tree: Tree, point: dict[str, int]) -> int:
    kind = tree[0]
    if kind == "var":
        return point[tree[1]]
    if kind == "lit":
        return int(tree[1])
    a, b = evaluate(tree[1], point), evaluate(tree[2], point)
    if kind == "+":
        return a + b
    if kind == "-":
        return a - b
    if kind == "*":
        return a * b
    if kind == "/":
        return _c_divide(a, b)
    if kind == "%":
        return a - _c_divide(a, b) * b
    raise AssertionError(kind)


def random_index(rng: random.Random, names: list[str], depth: int) -> Tree:
    """Flattened coordinates as reshapes and transposes compose them: sums of scaled variables, divided and
    reduced by constants, sometimes exactly at the bound where a remainder stops being a no-op."""
    if depth == 0 or rng.random() < 0.25:
        return ("var", rng.choice(names)) if rng.random() < 0.85 else ("lit", rng.randint(0, 7))
    kind = rng.choice(["+", "+", "*", "/", "%", "-"])
    left = random_index(rng, names, depth - 1)
    if kind == "+":
        return ("+", left, random_index(rng, names, depth - 1))
    if kind == "-":  # may go negative: C's truncating division must then be left alone
        return ("-", left, ("lit", rng.randint(0, 3)))
    return (kind, left, ("lit", rng.choice([1, 2, 3, 4, 6, 8, 12])))


@pytest.mark.parametrize("seed", range(400))
def test_simplified_index_equals_original_everywhere(seed: int) -> None:
    rng = random.Random(seed)
    ranges = {name: rng.choice([1, 2, 3, 4, 6, 8, 12]) for name in ("i", "j", "k")}
    tree = random_index(rng, list(ranges), rng.randint(1, 5))
    simplified = simplify(tree, ranges)
    for values in itertools.product(*(range(extent) for extent in ranges.values())):
        point = dict(zip(ranges, values, strict=True))
        assert evaluate(simplified, point) == evaluate(tree, point), (tree, simplified, point)


def test_exact_bound_keeps_the_remainder() -> None:
    """i in [0, 4]: i % 4 is not i (i = 4 wraps); i in [0, 3]: it is."""
    assert simplify(("%", ("var", "i"), ("lit", 4)), {"i": 5}) != ("var", "i")
    assert simplify(("%", ("var", "i"), ("lit", 4)), {"i": 4}) == ("var", "i")
    assert simplify(("/", ("+", ("*", ("var", "i"), ("lit", 4)), ("var", "j")), ("lit", 4)), {"i": 3, "j": 4}) \
        == ("var", "i")  # fmt: skip


def test_reshape_transpose_reshape_identity_collapses_to_the_variable() -> None:
    # v over [0, 24) viewed as [2, 3, 4] and flattened again
    v = ("var", "v")
    a, b, c = ("/", v, ("lit", 12)), ("%", ("/", v, ("lit", 4)), ("lit", 3)), ("%", v, ("lit", 4))
    flat = ("+", ("+", ("*", a, ("lit", 12)), ("*", b, ("lit", 4))), c)
    assert simplify(flat, {"v": 24}) == v


@pytest.mark.parametrize("seed", range(200))
def test_digit_sums_equal_original_everywhere(seed: int) -> None:
    """Σ ((v / d) % r) · c over digits of one variable: adjacent digits recombine only when their
    coefficients line up as strides of one coordinate."""
    rng = random.Random(seed)
    extent = rng.choice([6, 12, 24, 36])
    tree: Tree = ("lit", 0)
    divisor = 1
    while divisor < extent:
        radix = rng.choice([2, 3, 4])
        digit: Tree = ("%", ("/", ("var", "v"), ("lit", divisor)), ("lit", radix))
        coefficient = rng.choice([divisor, divisor, 1, 2, 5])  # mostly its stride: recombinable
        tree = ("+", tree, ("*", digit, ("lit", coefficient)))
        divisor *= radix
    simplified = simplify(tree, {"v": extent})
    for v in range(extent):
        assert evaluate(simplified, {"v": v}) == evaluate(tree, {"v": v}), (tree, simplified, v)
