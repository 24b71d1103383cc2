"""Upsamplings of rows of 16 or 32 floats along the innermost axis, computed by vector blocks of the output row
permuted from the input row in registers: how each access is classified, the rendered C, the reference's
numbers (with the compiler's shuffle and without it), and the phases that keep their residue loops."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kernorch.codegen.backends import GENERATED_C
from kernorch.codegen.c.prelude import PRELUDE
from kernorch.codegen.gir.graph import MOVE
from kernorch.codegen.gir.lowering import lower
from kernorch.codegen.gir.row_permute import row_access
from kernorch.codegen.gir.rules import optimize
from kernorch.codegen.loops.description import describe
from kernorch.codegen.loops.resize_taps_test import two_factor_upsampling, upsampling
from kernorch.codegen.program.compiler import compile_source, load_library
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import make_kernel
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference

ROW = ("q", "r", 8, 4)  # an output row of 32 positions: q in [0, 8), residue r in [0, 4)
CLAMPED = ("max", ("lit", 0), ("min", ("+", ("var", "q"), ("table", "t", ("var", "r"))), ("lit", 7)))


def test_accesses_along_the_output_row_and_permuted_rows() -> None:
    tables = {"t": np.array([-1, 0, 0, 1])}
    base = ("*", ("var", "l0"), ("lit", 8))
    along = row_access(("+", ("+", ("*", ("var", "l0"), ("lit", 32)), ("*", ("var", "q"), ("lit", 4))), ("var", "r")),
                       ROW, tables, 0)  # fmt: skip
    assert along is not None and along.along and along.base == ("*", ("var", "l0"), ("lit", 32))
    # a row of 8 is not a register's worth: refused, though its lanes are a clamped permutation
    assert row_access(("+", base, CLAMPED), ROW, tables, 8) is None
    wide = (*ROW[:2], 16, 2)  # 16 inputs doubled
    doubled = row_access(("+", ("*", ("var", "l0"), ("lit", 16)), ("+", ("var", "q"), ("table", "t", ("var", "r")))),
                         wide, {"t": np.array([0, 0])}, 16)  # fmt: skip
    assert doubled is not None and not doubled.along and doubled.width == 16
    assert doubled.lanes == tuple(p // 2 for p in range(32))
    # a row that does not start at a multiple of its length, or lanes past its end, could load past the buffer
    assert row_access(("+", ("*", ("var", "l0"), ("lit", 17)), ("var", "q")), wide, {}, 16) is None
    assert row_access(("+", ("*", ("var", "l0"), ("lit", 16)), ("+", ("var", "q"), ("lit", 1))), wide, {}, 16) is None
    # a block whose lanes spread over more than two adjacent registers of the row (64 floats, every 20th)
    spread = row_access(("+", ("*", ("var", "l0"), ("lit", 64)), ("*", ("var", "q"), ("lit", 20))), ("q", "r", 4, 4),
                        {}, 64)  # fmt: skip
    assert spread is None
    # an offset that also moves with another loop, or reads a gathered index, is neither
    assert row_access(("+", base, ("+", ("var", "q"), ("var", "l0"))), ROW, tables, 8) is None
    assert row_access(("+", base, ("index", ("load", "i", ("var", "q")), 8)), ROW, tables, 8) is None


def _kernel_source(graph: Graph) -> tuple[str, str]:
    kernel = make_kernel(graph, tuple(range(len(graph.nodes))), ("y",))
    return GENERATED_C.source("k", kernel), optimize(lower(describe(kernel))).describe()


@pytest.mark.parametrize(("width", "factor"), [(16, 2), (16, 8), (32, 4), (32, 8), (64, 2), (128, 2)])
@pytest.mark.parametrize(("mode", "then_add"), [("linear", False), ("linear", True), ("cubic", False),
                                                ("nearest", False)])  # fmt: skip
def test_permuted_rows_compute_the_reference(width: int, factor: int, mode: str, then_add: bool) -> None:
    graph = upsampling((2, 3, 5, width), factor, mode, then_add)
    source, gir = _kernel_source(graph)
    assert "input rows permuted in registers" in gir and "__builtin_shufflevector" in source, gir
    # what the performance model sees: each tap moves the input row once per output row, contiguous
    lowered = optimize(lower(describe(make_kernel(graph, tuple(range(len(graph.nodes))), ("y",)))))
    reads = [(op.executions, lowered.slices[op.reads[0]]) for phase in lowered.phases for op in phase.ops
             if op.kind == MOVE and op.name == "load" and lowered.slices[op.reads[0]].buffer == "inp0"]
    assert reads and all(executions == 2 * 3 * 5 and (s.count, s.width, s.stride) == (1, width, 1)
                         for executions, s in reads), reads  # fmt: skip
    assert "#pragma GCC unroll" not in source and source.count("#pragma omp simd") == width * factor // 16
    feeds = {name: np.random.default_rng(1).standard_normal(graph.types[name].shape).astype(np.float32)
             for name in graph.inputs}  # fmt: skip
    kernel = make_kernel(graph, tuple(range(len(graph.nodes))), ("y",))
    got = PlanExecutor(graph, [kernel])(feeds)["y"]
    np.testing.assert_allclose(got, run_reference(graph, feeds)["y"], rtol=1e-5, atol=1e-6)
    # the same without the compiler's shuffle (KO_VECTOR_SHUFFLE 0: each lane read from the row's array)
    scalar = source.replace("#if KO_VECTOR_SHUFFLE", "#if 0")
    assert scalar != source
    library = load_library(compile_source(PRELUDE + scalar))
    out = np.empty(graph.types["y"].shape, np.float32)
    arrays = [np.ascontiguousarray(feeds[name]) for name in kernel.inputs] + [out]
    assert library.k((ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))) == 0
    np.testing.assert_array_equal(out, got)


def test_two_factors_on_one_axis_permute_two_rows() -> None:
    """A [.., 16] map quadrupled plus a [.., 32] map doubled: each input row in registers, permuted per block."""
    graph = two_factor_upsampling(16)
    source, _ = _kernel_source(graph)
    assert source.count("const float *ko_x") == 2, source  # the two input rows, addressed once per output row
    assert "memcpy" not in source  # read in place: a 256-bit copy read back at 512 bits stalls (render_permuted)
    rng = np.random.default_rng(3)
    feeds = {name: rng.standard_normal(graph.types[name].shape).astype(np.float32) for name in graph.inputs}
    kernel = make_kernel(graph, (0, 1, 2), ("y",))
    np.testing.assert_allclose(PlanExecutor(graph, [kernel])(feeds)["y"], run_reference(graph, feeds)["y"],
                               rtol=1e-5, atol=1e-6)  # fmt: skip


@pytest.mark.parametrize(("width", "factor", "why"), [
    (24, 2, "a row of 24: not a whole number of registers"),
    (32, 16, "an output row of 512: too many blocks to unroll"),
])  # fmt: skip
def test_rows_that_keep_their_residue_loop(width: int, factor: int, why: str) -> None:
    source, gir = _kernel_source(upsampling((1, 2, 3, width), factor, "linear", False))
    assert "permuted" not in gir and "__builtin_shufflevector" not in source, why


@pytest.mark.parametrize("runtime", ["kernels", "rprogram"])
def test_permuted_rows_shared_among_threads(runtime: str) -> None:
    """A map large enough to share its rows out (collapsed parallel loops, or rTasks over ranges of them)."""
    graph = upsampling((1, 16, 32, 32), 4, "linear", True)
    source, gir = _kernel_source(graph)
    assert "input rows permuted in registers" in gir and "outer" in gir.split(";")[0], gir.split("\n")[0]
    feeds = {name: np.random.default_rng(4).standard_normal(graph.types[name].shape).astype(np.float32)
             for name in graph.inputs}  # fmt: skip
    kernel = make_kernel(graph, tuple(range(len(graph.nodes))), ("y",))
    got = PlanExecutor(graph, [kernel], runtime=runtime)(feeds)["y"]
    np.testing.assert_allclose(got, run_reference(graph, feeds)["y"], rtol=1e-5, atol=1e-6)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a permuted row's lane indices ignore which two registers they select from",
         'lanes = ", ".join(str(lane - at) for lane in block)',
         'lanes = ", ".join(str(lane % 32) for lane in block)',
         file="kernorch/codegen/c/render_permuted.py"),
]  # fmt: skip
