"""Integer polynomials of a model's symbolic sizes: how a literal of a kernel's code, a dim of a value's shape or a
byte count follows the sizes, found from its values at a few probe sizes and checked at all of them.

A kernel rendered at several sizes writes every extent, stride and offset as a literal; where the code is the same
but for those literals, each literal is some function of the sizes. Strides and extents of tensors are products of
dims, so that function is a polynomial with integer coefficients (a cache's [layers, heads, past + 1, 64] stride
512·past + 512; a score matrix's S² elements), of a low degree. `fit` solves for one of degree at most
MAX_DEGREE through the probes and accepts it only if it reproduces every probe exactly: with more probes than
coefficients, and probes of different residues modulo small powers of two and three, a literal that is not such
a polynomial (a remainder, a rounding down to a vector width, a clamp) fails to fit, and the kernel is refused
rather than generalised wrongly.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

MAX_DEGREE = 2  # a score matrix's S·S elements; nothing in a tensor program's strides needs more


@dataclass(frozen=True)
class Polynomial:
    """Σ coefficient · Π size^exponent over named sizes; `terms` sorted, no zero coefficients."""

    terms: tuple[tuple[tuple[tuple[str, int], ...], int], ...]  # ((size, exponent)...), coefficient

    @staticmethod
    def constant(value: int) -> Polynomial:
        return Polynomial((((), int(value)),) if value else ())

    @property
    def is_constant(self) -> bool:
        return all(not monomial for monomial, _ in self.terms)

    @property
    def sizes(self) -> frozenset[str]:
        return frozenset(name for monomial, _ in self.terms for name, _ in monomial)

    def __call__(self, sizes: Mapping[str, int]) -> int:
        total = 0
        for monomial, coefficient in self.terms:
            product = coefficient
            for name, exponent in monomial:
                product *= sizes[name] ** exponent
            total += product
        return total

    def c(self, symbol: Mapping[str, str]) -> str:
        """A C expression of int64_t, the sizes named by `symbol` (size -> a C variable)."""
        if not self.terms:
            return "0"
        parts = []
        for monomial, coefficient in self.terms:
            factors = [symbol[name] for name, exponent in monomial for _ in range(exponent)]
            if coefficient != 1 or not factors:
                factors.insert(0, f"INT64_C({coefficient})" if not factors else str(coefficient))
            parts.append(" * ".join(factors))
        return "(" + " + ".join(parts) + ")"

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        return " + ".join("·".join([str(c)] * (c != 1 or not m) + [n + (f"^{e}" if e > 1 else "") for n, e in m])
                          for m, c in self.terms)  # fmt: skip


def monomials(names: Sequence[str], degree: int = MAX_DEGREE) -> list[tuple[tuple[str, int], ...]]:
    """Every monomial of the sizes up to `degree`, the constant first."""
    result: list[tuple[tuple[str, int], ...]] = [()]
    for total in range(1, degree + 1):
        for combination in itertools.combinations_with_replacement(sorted(names), total):
            result.append(tuple((name, combination.count(name)) for name in dict.fromkeys(combination)))
    return result


def fit(probes: Sequence[Mapping[str, int]], values: Sequence[int]) -> Polynomial | None:
    """The polynomial of degree at most MAX_DEGREE with integer coefficients through (probe, value) for every probe,
    of the lowest degree that fits; None if there is none (or the probes cannot tell it: fewer probes than its
    coefficients)."""
    if len(probes) != len(values) or not probes:
        raise ValueError("one value per probe")
    if len(set(values)) == 1:
        return Polynomial.constant(values[0])
    names = sorted({name for probe in probes for name in probe if len({p[name] for p in probes}) > 1})
    for degree in range(1, MAX_DEGREE + 1):
        basis = monomials(names, degree)
        if len(basis) >= len(probes):  # as many unknowns as probes: any values fit, nothing is shown
            return None
        found = _solve(basis, probes, values)
        if found is not None:
            return found
    return None


def _solve(basis: list[tuple[tuple[str, int], ...]], probes: Sequence[Mapping[str, int]],
           values: Sequence[int]) -> Polynomial | None:  # fmt: skip
    matrix = np.array([[float(np.prod([p[n] ** e for n, e in m])) for m in basis] for p in probes])
    solution, *_ = np.linalg.lstsq(matrix, np.array(values, dtype=np.float64), rcond=None)
    coefficients = [Fraction(float(c)).limit_denominator(1) for c in solution]  # integers, or no fit
    candidate = Polynomial(tuple(sorted((m, int(c)) for m, c in zip(basis, coefficients, strict=True) if c)))
    if all(candidate(p) == v for p, v in zip(probes, values, strict=True)):  # exact, in integers
        return candidate
    return None
