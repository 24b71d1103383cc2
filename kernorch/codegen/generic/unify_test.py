"""Unifying a kernel's code across sizes: literals that are polynomials of the sizes become expressions, anything
else is refused with where; and the unified code of real kernels computes what the reference does at every size."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kernorch.codegen.backends import GENERATED_C
from kernorch.codegen.c import PRELUDE
from kernorch.codegen.generic import (
    PLACEHOLDER,
    GenericCode,
    GenericKernelBackend,
    NotGeneric,
    Polynomial,
    cross_monomials,
    fit,
    unify,
)
from kernorch.codegen.program import compile_source, load_library
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.reference import run_reference

# run again under AddressSanitizer and UBSan by `make sanitize`: the unified C at sizes it was not rendered at
pytestmark = pytest.mark.sanitize

PROBES = [{"s": s} for s in (64, 63, 32, 40, 48, 56)]


def test_fit_finds_the_polynomial_and_refuses_what_is_not_one() -> None:
    sizes = [p["s"] for p in PROBES]
    assert fit(PROBES, [s + 1 for s in sizes]) == Polynomial((((), 1), ((("s", 1),), 1)))
    quadratic = fit(PROBES, [4 * s * s - 3 * s for s in sizes])
    assert quadratic is not None and quadratic({"s": 7}) == 4 * 49 - 21
    assert fit(PROBES, [9] * 6) == Polynomial.constant(9)
    for not_one in ([s // 16 * 16 for s in sizes], [min(s, 48) for s in sizes], [s % 8 for s in sizes],
                    [(s + 15) // 16 for s in sizes], [s * s * s for s in sizes]):  # fmt: skip
        assert fit(PROBES, not_one) is None, not_one
    assert fit(PROBES[:3], [p["s"] ** 2 for p in PROBES[:3]]) is None  # three probes cannot show a quadratic
    diagonal = [{"b": k, "s": k} for k in range(1, 9)]  # b = s at every probe: b·b, b·s and s·s look the same
    assert fit(diagonal, [3 * k * k for k in range(1, 9)]) is None
    two = [{"b": b, "s": s} for b, s in ((4, 64), (3, 64), (4, 63), (2, 64), (4, 40), (1, 64), (4, 33), (3, 61))]
    product = fit(two, [64 * p["b"] * p["s"] + p["s"] for p in two])
    assert product is not None and product({"b": 5, "s": 9}) == 64 * 45 + 9


def test_a_product_of_three_sizes_is_fitted_only_where_the_probes_determine_it() -> None:
    """A batch of feature maps' rows, 16·b·h·w, found from a three-size range's probes. Those hold OFF_LINE_MARGIN
    more points off the lines through the largest sizes than there are monomials of two or more sizes, so a value
    that is a polynomial on the lines but not off them (a remainder times what vanishes on the lines) fits none;
    with fewer, the probes do not determine one (rank) and nothing is accepted."""
    from kernorch.shapes.generic import OFF_LINE_MARGIN, SizeRange, probe_sizes

    size_range = SizeRange.parse("batch=1..16,height=8..96:8,width=8..96:8")
    probes = [size_range.units(p) for p in probe_sizes(size_range)]

    def rows(p: dict[str, int]) -> int:
        return 16 * p["batch"] * p["height"] * p["width"]

    def off_by_a_remainder(p: dict[str, int]) -> int:
        return rows(p) + (p["batch"] - 16) * (p["height"] - 12) * (p["width"] - 12) * (p["batch"] * p["height"] % 5)

    found = fit(probes, [rows(p) for p in probes])
    assert found is not None and found({"batch": 3, "height": 1, "width": 7}) == 16 * 21, found
    assert fit(probes, [off_by_a_remainder(p) for p in probes]) is None
    lines = [p for p in probes if sum(p[n] != probes[0][n] for n in p) <= 1]
    off = [p for p in probes if p not in lines]
    assert len(off) >= cross_monomials(3) + OFF_LINE_MARGIN
    too_few = lines + off[:2]
    assert fit(too_few, [rows(p) for p in too_few]) is None


def test_polynomial_renders_as_c_of_int64() -> None:
    polynomial = fit(PROBES, [512 * p["s"] + 512 for p in PROBES])
    assert polynomial is not None and polynomial.c({"s": "n"}) == "(INT64_C(512) + 512 * n)"
    assert Polynomial.constant(0).c({}) == "0" and str(polynomial) == "512 + 512·s"


def _sources(template: str) -> list[str]:
    return [template.format(n=p["s"], n1=p["s"] + 1, nn=p["s"] * p["s"]) for p in PROBES]


def test_unify_turns_the_differing_literals_into_expressions() -> None:
    template = "int k(void **args) {{\n    for (int64_t i = 0; i < {n1}; i++) y[i * 64 + 3] = x[i + {nn}];\n}}\n"
    unified = unify(_sources(template), PROBES, ["s"])
    assert unified.varying == 2 and unified.used == {"s"}
    assert "i < (INT64_C(1) + ko_size_0)" in unified.text and "x[i + (ko_size_0 * ko_size_0)]" in unified.text
    assert "i * 64 + 3" in unified.text  # literals equal at every size stay literals
    fixed = unify([template.format(n=3, n1=4, nn=9)] * 6, PROBES, ["s"])
    assert fixed.is_fixed and fixed.text == template.format(n=3, n1=4, nn=9)


@pytest.mark.parametrize(("template", "why"), [
    ("int k(void **args) {{ for (i = 0; i < {n}; i += 16) {{}} }}", None),  # fine: a control case
    ("int k(void **args) {{ float t[{n}]; }}", "where C needs a constant"),
    ("static const int64_t off[2] = {{0, {n}}};", "where C needs a constant"),
    ("#define LK {n}\n", "where C needs a constant"),
    ("int k(void **args) {{\n    #pragma omp simd safelen({n})\n }}", "where C needs a constant"),
])  # fmt: skip
def test_a_size_where_c_needs_a_constant_is_refused(template: str, why: str | None) -> None:
    if why is None:
        assert unify(_sources(template), PROBES, ["s"]).varying == 1
        return
    with pytest.raises(NotGeneric, match=why):
        unify(_sources(template), PROBES, ["s"])


def test_a_loop_shared_out_at_the_larger_sizes_only_keeps_the_largest_sizes_pragma() -> None:
    """parallel_mode shares a loop out above a work threshold: the sources differ in a pragma line; the unified
    code is the largest sizes' (the loop's iterations are independent at every size)."""
    def source(s: int) -> str:
        pragma = "    #pragma omp parallel for collapse(2)\n" if s > 40 else ""
        return f"int k(void **args) {{\n{pragma}    for (i = 0; i < {s}; i++) y[i] = 0;\n}}"

    unified = unify([source(p["s"]) for p in PROBES], PROBES, ["s"])
    assert unified.text == source(64).replace("i < 64", "i < (ko_size_0)") and unified.varying == 1
    other = [source(p["s"]).replace("y[i] = 0", "y[i] = z" if p["s"] == 40 else "y[i] = 0") for p in PROBES]
    with pytest.raises(NotGeneric, match="other than in integer literals"):  # the pragma is not the only difference
        unify(other, PROBES, ["s"])


def test_code_that_differs_other_than_in_literals_is_refused() -> None:
    sources = [f"int k(void **args) {{ {'x = y;' if p['s'] > 40 else ''}\n }}" for p in PROBES]
    with pytest.raises(NotGeneric, match="other than in integer literals"):
        unify(sources, PROBES, ["s"])
    rounded = [f"int k(void **args) {{ for (i = 0; i < {p['s'] // 16 * 16}; i++) {{}} }}" for p in PROBES]
    with pytest.raises(NotGeneric, match="no polynomial of the sizes"):
        unify(rounded, PROBES, ["s"])
    with pytest.raises(NotGeneric, match="not given"):
        unify(_sources("int k(void **args) {{ n = {n}; }}"), PROBES, ["t"])
    outside = unify(_sources("int g = {n};\nint " + PLACEHOLDER + "(void **args) {{ }}"), PROBES, ["s"])
    with pytest.raises(NotGeneric, match="outside its entry point"):
        GenericCode(GENERATED_C, outside, 1, 1, ())
    with pytest.raises(NotGeneric, match="no entry point"):
        GenericCode(GENERATED_C, unify(_sources("int other(void **args) {{ n = {n}; }}"), PROBES, ["s"]), 1, 1, ())


def _softmax_concat(length: int) -> Graph:
    """softmax over a row of `length` + 1 keys, the new key concatenated to the cached ones: a decoder step's
    shape of work, [heads, 1, length + 1]."""
    heads = 3
    graph = Graph(inputs=["past", "new"], outputs=["y"])
    graph.types.update(past=TensorType((heads, 1, length), "float32"), new=TensorType((heads, 1, 1), "float32"))
    row = TensorType((heads, 1, length + 1), "float32")
    column = TensorType((heads, 1, 1), "float32")
    graph.nodes += [Node("concat", ("past", "new"), ("x",), (("axis", 2),)),
                    Node("reduce_max", ("x",), ("m",), (("axes", (2,)),)), Node("sub", ("x", "m"), ("d",), ()),
                    Node("exp", ("d",), ("e",), ()), Node("reduce_sum", ("e",), ("z",), (("axes", (2,)),)),
                    Node("div", ("e", "z"), ("y",), ())]  # fmt: skip
    graph.types.update(x=row, m=column, d=row, e=row, z=column, y=row)
    return graph


def test_a_unified_generated_kernel_computes_the_reference_at_every_size() -> None:
    """The kernel rendered at the probes (a parallel softmax over 33-65 keys), unified, compiled once and run at
    1, 2, 3, odd, prime and the largest lengths: equal to the reference interpreter's result at each."""
    sources, scratches = [], []
    for probe in PROBES:
        graph = _softmax_concat(probe["s"])
        kernel = make_kernel(graph, tuple(range(len(graph.nodes))), ("y",))
        sources.append(GENERATED_C.generic_source(PLACEHOLDER, kernel))
        scratches.append(GENERATED_C.scratch_bytes(kernel))
    code = GenericCode(GENERATED_C, unify(sources, PROBES, ["s"]), 2, 1, tuple(scratches[0]))
    assert code.source.varying > 0
    backend = GenericKernelBackend(code)
    source = PRELUDE + backend.source("generic_softmax", make_kernel(_softmax_concat(64), (0,), ("x",)))
    library = load_library(compile_source(source, None))
    function = library.generic_softmax
    function.restype, function.argtypes = ctypes.c_int, [ctypes.c_void_p]
    rng = np.random.default_rng(0)
    for length in (1, 2, 3, 7, 13, 31, 47, 64):
        graph = _softmax_concat(length)
        feeds = {"past": rng.standard_normal((3, 1, length)).astype(np.float32) * 4,
                 "new": rng.standard_normal((3, 1, 1)).astype(np.float32)}  # fmt: skip
        out = np.zeros((3, 1, length + 1), np.float32)
        sizes = np.array([length], np.int64)
        scratch = [np.zeros(b, np.uint8) for b in code.scratch]
        buffers: list[np.ndarray] = [feeds["past"], feeds["new"], sizes, out, *scratch]
        args = (ctypes.c_void_p * len(buffers))(*(b.ctypes.data for b in buffers))
        assert function(args) == 0
        np.testing.assert_allclose(out, run_reference(graph, feeds)["y"], rtol=2e-6, atol=1e-7)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# kill (kernorch/devtools/mutate.py collects them; `make mutate` runs them).
MUTANTS = [
    here("generic: a fit accepted without reproducing every probe",
         "if all(candidate(p) == v for p, v in zip(probes, values, strict=True)):  # exact, in integers",
         "if True:", file="kernorch/codegen/generic/polynomial.py"),
    here("generic: a fit accepted from probes that do not determine it",
         "if np.linalg.matrix_rank(matrix) < len(basis):  # the probes do not tell these monomials apart",
         "if False:", file="kernorch/codegen/generic/polynomial.py"),
    here("generic: as many coefficients as probes accepted",
         "if len(basis) >= len(probes):  # as many unknowns as probes: any values fit, nothing is shown",
         "if len(basis) > len(probes):", file="kernorch/codegen/generic/polynomial.py"),
    here("generic: a size-dependent literal allowed in a preprocessor or static line",
         "if _FIXED_LINE.match(line) or _ARRAY_DECLARATION.search(line):",
         "if _ARRAY_DECLARATION.search(line):", file="kernorch/codegen/generic/unify.py"),
    here("generic: the size array passed in the wrong place",
         'f"moved[{buffers}] = {arguments}[{self.inputs}];"]', 'f"moved[{buffers}] = {arguments}[0];"]',
         file="kernorch/codegen/generic/backend.py"),
]  # fmt: skip
