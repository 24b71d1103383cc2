"""Index simplification is exact: random index trees of `+ - * / %` over loop variables with known extents
evaluate to the same integer as their simplified form at every point of the iteration space."""

from __future__ import annotations

import itertools
import random

import pytest

from kernorch.codegen.loops.indexing import Tree, simplify, simplify_indices
from kernorch.devtools.mutate import here


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


def test_a_division_by_a_multiple_of_the_innermost_extent_leaves_the_innermost_variable_out() -> None:
    """A channels-last map of 96 channels through windows: (96·p + c) / 384 = p / 4 and (96·p + c) % 384 =
    96·(p % 4) + c for c in [0, 96), so the vector loop over c reads unit-stride."""
    ranges = {"p": 50, "c": 96}
    flat = ("+", ("+", ("*", ("var", "p"), ("lit", 96)), ("var", "c")), ("lit", 96 * 3))
    quotient, remainder = simplify(("/", flat, ("lit", 384)), ranges), simplify(("%", flat, ("lit", 384)), ranges)
    assert "c" not in repr(quotient) and remainder[0] == "+" and ("var", "c") in remainder[1:], (quotient, remainder)
    for p, c in itertools.product(range(50), range(96)):
        point = {"p": p, "c": c}
        assert evaluate(quotient, point) == (96 * p + c + 288) // 384
        assert evaluate(remainder, point) == (96 * p + c + 288) % 384
    wider = {"p": 50, "c": 97}  # c = 96 carries into p: no split
    quotient, remainder = simplify(("/", flat, ("lit", 384)), wider), simplify(("%", flat, ("lit", 384)), wider)
    for p, c in itertools.product(range(50), range(97)):
        point = {"p": p, "c": c}
        assert (evaluate(quotient, point), evaluate(remainder, point)) == divmod(96 * p + c + 288, 384)


def _taken_load(tree: Tree, point: dict[str, int]) -> tuple[str, int]:
    """The load a select tree reads at `point`: (input, index)."""
    if tree[0] == "load":
        return tree[1], evaluate(tree[2], point)
    _, (op, left, right), taken, other = tree
    holds = evaluate(left, point) < evaluate(right, point)
    return _taken_load(taken if holds == (op == "<") else other, point)


@pytest.mark.parametrize("seed", range(300))
def test_selects_on_a_loop_variable_simplify_each_branch_exactly(seed: int) -> None:
    """A concat along an outer axis (`i < t`) nests selects whose branches index with i shifted by the piece's
    start; each branch is simplified knowing i's side of t, and reads the same element as before."""
    rng = random.Random(seed)
    ranges = {name: rng.choice([2, 3, 4, 6, 8, 12]) for name in ("i", "j", "k")}
    names = list(ranges)

    def select(depth: int) -> Tree:
        if depth == 0:
            return ("load", rng.choice("ab"), random_index(rng, names, rng.randint(1, 4)))
        var = rng.choice(names)
        threshold = rng.randint(1, ranges[var] - 1) if ranges[var] > 1 else 1
        shifted = ("+", ("var", var), ("lit", rng.randint(-2, 2)))
        cond = (rng.choice(["<", ">="]), shifted, ("lit", threshold + shifted[2][1]))
        return ("where", cond, select(depth - 1), select(depth - 1))

    tree = select(rng.randint(1, 3))
    simplified = simplify_indices(tree, ranges)
    for values in itertools.product(*(range(extent) for extent in ranges.values())):
        point = dict(zip(ranges, values, strict=True))
        assert _taken_load(simplified, point) == _taken_load(tree, point), (tree, simplified, point)


@pytest.mark.parametrize("seed", range(40))
def test_a_concat_of_many_pieces_simplifies_each_piece_exactly(seed: int) -> None:
    """A concat of up to 12 pieces along i (`i < t1 ? p1 : i < t2 ? p2 : ...`, some thresholds written shifted),
    each piece reading its local index split into digits of its length less one (which fold only where the piece's
    own range is known): every piece reads the same element as before."""
    rng = random.Random(seed)
    extent = rng.randint(13, 40)
    ranges = {"i": extent, "j": rng.choice([2, 3, 5])}
    cuts = sorted(rng.sample(range(1, extent), rng.randint(2, 11)))
    starts = [0, *cuts]

    def piece(k: int) -> Tree:
        local: Tree = ("+", ("var", "i"), ("lit", -starts[k]))
        digit = ("lit", max(1, [*cuts, extent][k] - starts[k] - 1))
        return ("load", f"p{k}", ("+", ("*", ("/", local, digit), ("lit", 100)), ("%", local, digit)))

    tree: Tree = piece(len(cuts))
    for k in reversed(range(len(cuts))):
        shift = rng.randint(-2, 2)
        tree = ("where", ("<", ("+", ("var", "i"), ("lit", shift)), ("lit", cuts[k] + shift)), piece(k), tree)
    simplified = simplify_indices(tree, ranges)
    for values in itertools.product(*(range(size) for size in ranges.values())):
        point = dict(zip(ranges, values, strict=True))
        assert _taken_load(simplified, point) == _taken_load(tree, point), (tree, simplified, point)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("index remainder bound off by one",
         "if bounds is not None and bounds[0] >= 0 and bounds[1] < n:",
         "if bounds is not None and bounds[0] >= 0 and bounds[1] <= n:",
         tests=("kernorch/codegen/loops/indexing_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference",
                "kernorch/runtime/executor_test.py")),
    here("digits merge without checking strides",
         "if terms[high] != terms[low] * low.radix:",
         "if False:",
         tests=("kernorch/codegen/loops/indexing_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference",
                "kernorch/runtime/executor_test.py")),
    here("a select's lower branch is simplified as if its variable stopped one short of the threshold",
         "return simplify_indices(tree, {**ranges, var: high})",
         "return simplify_indices(tree, {**ranges, var: high - 1})"),
    here("a select's upper branch renames its variable back off by one",
         '("lit", -low)))',
         '("lit", 1 - low)))'),
    here("a concat's later piece narrowed one short of its end",
         "{**ranges, shifted: high - low}",
         "{**ranges, shifted: high - low - 1}"),
    here("a factor split lets the low part reach the factor",
         "bounds[1] >= factor:",
         "bounds[1] > factor:"),
]  # fmt: skip
