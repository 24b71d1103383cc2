"""Integer polynomials of a model's symbolic sizes: how a literal of a kernel's code, a dim of a value's shape or a
byte count follows the sizes, found from its values at a few probe sizes and checked at all of them.

A kernel rendered at several sizes writes every extent, stride and offset as a literal; where the code is the same
but for those literals, each literal is some function of the sizes. Strides and extents of tensors are products of
dims, so that function is a polynomial with integer coefficients (a cache's [layers, heads, past + 1, 64] stride
512·past + 512; a score matrix's S² elements; a batch of feature maps' rows b·h·w), of a low degree. `fit` solves
for one through the probes — each size to at most MAX_EXPONENT, of total degree at most MAX_DEGREE — and accepts it
only if the probes determine it (their matrix of monomials has full rank) and it reproduces every probe exactly:
with more probes than coefficients, probes of different residues modulo small powers of two and three, and more
probes off the lines through the largest sizes than monomials of two sizes (shapes/generic.py: probe_sizes), a
literal that is not such a polynomial (a remainder, a rounding down to a vector width, a clamp, a product of three
sizes where the basis had only two) fails to fit, and the kernel is refused rather than generalised wrongly.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

MAX_EXPONENT = 2  # of one size: a score matrix's S·S elements; nothing in a tensor program's strides needs more
MAX_DEGREE = 3  # of a monomial: a batch of feature maps' b·h·w elements, a batch of score matrices' b·S·S


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
    """Every monomial of the sizes up to `degree` (each size to at most MAX_EXPONENT), the constant first."""
    result: list[tuple[tuple[str, int], ...]] = [()]
    for total in range(1, degree + 1):
        for combination in itertools.combinations_with_replacement(sorted(names), total):
            if max(combination.count(name) for name in combination) <= MAX_EXPONENT:
                result.append(tuple((name, combination.count(name)) for name in dict.fromkeys(combination)))
    return result


def cross_monomials(count: int) -> int:
    """How many monomials of `count` sizes hold two or more of them: the coefficients only probes off the lines
    through the largest sizes determine."""
    return sum(len(m) > 1 for m in monomials([f"s{i}" for i in range(count)]))


def fit(probes: Sequence[Mapping[str, int]], values: Sequence[int]) -> Polynomial | None:
    """The polynomial of the module's form with integer coefficients through (probe, value) for every probe, of
    the lowest degree that fits; None if there is none (or the probes cannot tell it: fewer probes than its
    coefficients, or probes that do not determine them)."""
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
    if np.linalg.matrix_rank(matrix) < len(basis):  # the probes do not tell these monomials apart
        return None
    solution, *_ = np.linalg.lstsq(matrix, np.array(values, dtype=np.float64), rcond=None)
    coefficients = [Fraction(float(c)).limit_denominator(1) for c in solution]  # integers, or no fit
    candidate = Polynomial(tuple(sorted((m, int(c)) for m, c in zip(basis, coefficients, strict=True) if c)))
    if all(candidate(p) == v for p, v in zip(probes, values, strict=True)):  # exact, in integers
        return candidate
    return None
