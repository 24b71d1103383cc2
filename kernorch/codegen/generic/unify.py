"""One kernel's code for a range of sizes: the code rendered at several probe sizes, unified into one source
whose size-dependent literals are expressions of the sizes, read at run time.

Every backend renders a kernel for concrete shapes, its extents, strides and offsets written as integer literals,
and that is where its speed comes from (a GIR's vectorised loops, a native template's blocking). Rendered at a
few probe sizes, a kernel whose code differs only in some of those literals is the same program of the sizes:
each differing literal becomes a polynomial of them (generic/polynomial.py), and the source takes the sizes as
an argument. Any other difference — a loop split differently, a remainder loop that appears at one size, a
parallel region opened at one size only, a differing floating-point literal or table — means the code's
structure depends on the size, and the kernel is refused with where it differs.

Literals that cannot become run-time expressions are refused too: in a preprocessor line (`#pragma omp ...
simd safelen(N)`), a `static` declaration, or an array's declared extent (a stack array sized by the call would
be a variable-length array, unbounded on the stack).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kernorch.codegen.generic.polynomial import Polynomial, fit
from kernorch.errors import KernorchError

# an integer literal of C: not part of an identifier (k12), a float (0.5f, 1e-05f), a hex number or a suffixed one
INTEGER = re.compile(r"(?<![\w.])\d+(?![\w.])")
# where a literal must stay a constant expression
_FIXED_LINE = re.compile(r"^\s*(#|static\b)")
_ARRAY_DECLARATION = re.compile(r"\b(?:float|double|char|u?int(?:8|16|32|64)_t|int|__m\w+)\s+\w+\s*\[[^\]]*$")
SIZE_SYMBOL = "ko_size_"  # C variable of a size: ko_size_<index>, declared by the caller from its argument


class NotGeneric(KernorchError):
    """The kernel's code depends on the sizes other than through its literals; the message says where."""


@dataclass(frozen=True)
class GenericSource:
    """The unified code, and which sizes it reads (their C variables SIZE_SYMBOL + index, in `sizes` order)."""

    text: str
    sizes: tuple[str, ...]  # every size the caller passes, in its order (SIZE_SYMBOL + the index in this)
    used: frozenset[str]  # the sizes its expressions read
    varying: int  # how many literals became expressions

    def declarations(self, pointer: str) -> str:
        """C declaring the variable of each size the code reads from `pointer`, the caller's int64_t array."""
        return " ".join(f"const int64_t {SIZE_SYMBOL}{index} = {pointer}[{index}];"
                        for index, name in enumerate(self.sizes) if name in self.used)  # fmt: skip

    @property
    def is_fixed(self) -> bool:
        """The same code at every size: nothing to pass."""
        return self.varying == 0


def unify(sources: Sequence[str], probes: Sequence[Mapping[str, int]], sizes: Sequence[str]) -> GenericSource:
    """One source from `sources` (the same kernel rendered at each probe, in order, the largest sizes first);
    `sizes` are the size names the generated expressions may use, in the order of the array the caller passes.
    Raises NotGeneric.

    Where the sources differ only in their OpenMP pragma lines besides literals (a loop shared out to the
    threads at the larger sizes, run on one thread at the smaller: parallel_mode's work threshold), the first
    source's pragmas are kept: they share out loops whose iterations are independent at every size, so the
    code computes the same at any size, with the parallel region the largest sizes want."""
    if len(sources) != len(probes) or len(sources) < 2:
        raise ValueError("one source per probe, at least two")
    try:
        return _unify(sources, probes, sizes)
    except _Structural as difference:
        split = [[line for line in source.split("\n") if not _PRAGMA.match(line)] for source in sources]
        if all(len(lines) == source.count("\n") + 1 for lines, source in zip(split, sources, strict=True)):
            raise NotGeneric(str(difference)) from None  # no pragma anywhere: the difference is elsewhere
        try:
            bare = _unify(["\n".join(lines) for lines in split], probes, sizes)
        except _Structural:
            raise NotGeneric(str(difference)) from None
    bare_lines = iter(bare.text.split("\n"))
    merged = [line if _PRAGMA.match(line) else next(bare_lines) for line in sources[0].split("\n")]
    return GenericSource("\n".join(merged), bare.sizes, bare.used, bare.varying)


class _Structural(NotGeneric):
    """The sources differ other than in integer literals."""


_PRAGMA = re.compile(r"^\s*#\s*pragma\s+omp\b")


def _unify(sources: Sequence[str], probes: Sequence[Mapping[str, int]], sizes: Sequence[str]) -> GenericSource:
    pieces = [INTEGER.split(source) for source in sources]
    literals = [INTEGER.findall(source) for source in sources]
    first = pieces[0]
    for probe, other in zip(probes[1:], pieces[1:], strict=True):
        if other != first:
            raise _Structural(f"its code differs between sizes {_sizes(probes[0])} and {_sizes(probe)} other than "
                             f"in integer literals (near: {_first_difference(first, other)!r})")  # fmt: skip
    symbol = {name: f"{SIZE_SYMBOL}{index}" for index, name in enumerate(sizes)}
    out: list[str] = [first[0]]
    line = first[0].rsplit("\n", 1)[-1]  # the text of the current line up to the literal
    used: set[str] = set()
    varying = 0
    for position in range(len(literals[0])):
        values = [int(found[position]) for found in literals]
        text = literals[0][position]
        if len(set(values)) > 1:
            polynomial = fit(probes, values)
            if polynomial is None:
                raise NotGeneric(f"a literal takes the values {values} at sizes "
                                 f"{', '.join(_sizes(p) for p in probes)}: no polynomial of the sizes (near: "
                                 f"{line.strip()[-60:]!r})")  # fmt: skip
            unknown = polynomial.sizes - set(symbol)
            if unknown:
                raise NotGeneric(f"a literal follows {sorted(unknown)[0]}, which the kernel is not given")
            if _FIXED_LINE.match(line) or _ARRAY_DECLARATION.search(line):
                raise NotGeneric(f"a size-dependent literal where C needs a constant: {line.strip()[-60:]!r}")
            text = polynomial.c(symbol)
            used |= polynomial.sizes
            varying += 1
        after = first[position + 1]
        out += [text, after]
        line = after.rsplit("\n", 1)[-1] if "\n" in after else line + text + after
    return GenericSource("".join(out), tuple(sizes), frozenset(used), varying)


def _first_difference(a: list[str], b: list[str]) -> str:
    for x, y in zip(a, b, strict=False):
        if x != y:
            for position, (p, q) in enumerate(zip(x, y, strict=False)):
                if p != q:
                    return x[max(0, position - 30): position + 30]
            return x[-60:]
    return ""


def _sizes(probe: Mapping[str, int]) -> str:
    return ",".join(f"{name}={value}" for name, value in sorted(probe.items()))


def polynomial_of(probes: Sequence[Mapping[str, int]], values: Sequence[int], what: str) -> Polynomial:
    """`fit`, or NotGeneric naming `what` (a value's dim, a view's offset, a scratch buffer's bytes)."""
    found = fit(probes, values)
    if found is None:
        raise NotGeneric(f"{what} takes the values {list(values)} at the probe sizes: no polynomial of the sizes")
    return found
