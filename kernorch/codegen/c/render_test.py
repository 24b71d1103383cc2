"""C rendered from the rewritten GIR: what the rules changed shows in the code, and the code computes what the
reference does (with and without the rules), kernel by kernel and as rTasks."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np
import pytest

from kernorch.codegen.c.kernel import render_kernel
from kernorch.codegen.c.prelude import PRELUDE
from kernorch.codegen.c.render import _err_only_where_set, table_formula
from kernorch.codegen.gir.lowering import lower
from kernorch.codegen.gir.rules import optimize
from kernorch.codegen.loops.description import KernelLoops, describe
from kernorch.codegen.program.compiler import compile_source, load_library
from kernorch.devtools.mutate import here
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference

Build = Callable[[PrimitiveBuilder, str, str], list[str]]


def _graph(build: Build, shapes: tuple[tuple[int, ...], tuple[int, ...]], dtype: str = "float32") -> Graph:
    graph = Graph(inputs=["x", "b"], outputs=[])
    for name, shape in zip(("x", "b"), shapes, strict=True):
        graph.types[name] = TensorType(shape, dtype)
    graph.outputs = build(PrimitiveBuilder(graph), "x", "b")
    return graph


def _kernel(graph: Graph) -> CandidateKernel:
    return make_kernel(graph, tuple(range(len(graph.nodes))), tuple(graph.outputs))


def _loops(graph: Graph) -> KernelLoops:
    return describe(_kernel(graph))


def _run(source: str, graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Compile one kernel function `k` and call it: the kernel's inputs (feeds and constants), then outputs."""
    kernel, loops = _kernel(graph), _loops(graph)
    library = load_library(compile_source(PRELUDE + source))
    values = feeds | graph.constants
    outputs = [np.empty(b.shape, b.dtype) for b in loops.outputs]
    arrays = [np.ascontiguousarray(values[name]) for name in kernel.inputs] + outputs
    assert len(arrays) == len(loops.inputs) + len(loops.outputs) and not any(b.role == "scratch" for b in loops.buffers)
    args = (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))
    assert library.k(args) == 0
    return outputs


def _inner_body(source: str) -> str:
    """The text of the innermost loop of a kernel rendered kernel by kernel (one parallel loop)."""
    body = source[source.rindex("for (int64_t"):]
    return body[: body.index("}")]


def _broadcast_gate(b: PrimitiveBuilder, x: str, g: str) -> list[str]:
    """(x + g) · sigmoid(2g), g broadcast along x's rows: the gate is invariant along the innermost loop."""
    (s,) = b.emit("add", [x, g])
    (gate,) = b.emit("sigmoid", [b.emit("mul", [g, b.constant(np.array(2.0, np.float32))])[0]])
    return b.emit("mul", [s, gate])


def test_the_swap_rule_moves_the_broadcast_work_before_the_innermost_loop() -> None:
    graph = _graph(_broadcast_gate, ((64, 512), (64, 1)))
    loops = _loops(graph)
    rewritten, plain = render_kernel("k", loops), render_kernel("k", loops, rules=())
    # rewritten: the gate's load, multiply and sigmoid run once per row; not rewritten: once per element
    assert "ko_sigmoidf" not in _inner_body(rewritten) and "inp1[" not in _inner_body(rewritten)
    assert "ko_sigmoidf" in _inner_body(plain) and "inp1[" in _inner_body(plain)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((64, 512)).astype(np.float32),
             "b": rng.standard_normal((64, 1)).astype(np.float32)}  # fmt: skip
    want = run_reference(graph, feeds)[graph.outputs[0]]
    for source in (rewritten, plain):
        np.testing.assert_allclose(_run(source, graph, feeds)[0], want, rtol=1e-6, atol=1e-6)


def _cube_plus(b: PrimitiveBuilder, x: str, g: str) -> list[str]:
    """x·x·x + x + g: four reads of the same x elements in one instruction block."""
    (square,) = b.emit("mul", [x, x])
    (cube,) = b.emit("mul", [square, x])
    (y,) = b.emit("add", [cube, x])
    return b.emit("add", [y, g])


def test_merged_reads_are_one_load_in_the_code() -> None:
    graph = _graph(_cube_plus, ((32, 1024), (32, 1024)))
    loops = _loops(graph)
    merged, unmerged = render_kernel("k", loops), render_kernel("k", loops, rules=())
    assert _inner_body(merged).count("inp0[") == 1
    assert _inner_body(unmerged).count("inp0[") == 4
    rng = np.random.default_rng(1)
    feeds = {name: rng.standard_normal((32, 1024)).astype(np.float32) for name in ("x", "b")}
    want = run_reference(graph, feeds)[graph.outputs[0]]
    for source in (merged, unmerged):
        np.testing.assert_allclose(_run(source, graph, feeds)[0], want, rtol=1e-6, atol=1e-6)


def _compare_cast_select(b: PrimitiveBuilder, x: str, g: str) -> list[str]:
    """where(x < g, x, g · 0.5), its comparison as a bool output, and x cast to int32: selects, bool and
    integer types from one kernel."""
    (less,) = b.emit("less", [x, g])
    (half,) = b.emit("mul", [g, b.constant(np.array(0.5, np.float32))])
    (picked,) = b.emit("where", [less, x, half])
    (whole,) = b.emit("cast", [x], {"to": "int32"})
    return [picked, less, whole]


@pytest.mark.parametrize("shape", [(3, 5), (8, 4096), (2, 3, 20000)])
def test_gir_rendered_kernels_match_the_reference(shape: tuple[int, ...]) -> None:
    """Serial, collapsed-parallel and innermost-parallel loop structures, kernel by kernel and as rTasks."""
    graph = _graph(_compare_cast_select, (shape, shape))
    kernel = _kernel(graph)
    rng = np.random.default_rng(2)
    feeds = {name: (rng.standard_normal(shape) * 4).astype(np.float32) for name in ("x", "b")}
    want = run_reference(graph, feeds)
    for runtime in ("kernels", "rprogram"):
        got = PlanExecutor(graph, [kernel], runtime=runtime)(feeds)
        for name in graph.outputs:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} ({runtime})")


def _hard_swish(b: PrimitiveBuilder, x: str, g: str) -> list[str]:
    """x · min(max(x/6 + 1/2, 0), 1), the clip itself and max(g, NaN): one-element constants, the last NaN."""
    def one(value: float) -> str:
        return b.constant(np.array([value], np.float32))

    (scaled,) = b.emit("add", [b.emit("mul", [x, one(1 / 6)])[0], one(0.5)])
    (clipped,) = b.emit("min", [one(1.0), b.emit("max", [scaled, one(0.0)])[0]])
    (swish,) = b.emit("mul", [x, clipped])
    return [swish, clipped, *b.emit("max", [g, one(float("nan"))])]


def test_one_element_constants_are_literals_and_bound_a_max_in_one_select() -> None:
    graph = _graph(_hard_swish, ((16, 1000), (16, 1000)))
    source = render_kernel("k", _loops(graph))
    body = source[source.index("for (int64_t"):]
    # the constants are literals (no loads), max/min by a number is one select; by NaN it keeps KO_MAX
    assert body.count("inp") == 3 and "0.1666666716337204f" in body and "0.5f" in body
    assert "(0.0f > " in body and "(1.0f < " in body and body.count("KO_MAX(") == 1 and "KO_MIN(" not in body
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16, 1000)) * 4).astype(np.float32)
    x[0, :6] = [np.nan, np.inf, -np.inf, -0.0, 3.0, -3.0]
    feeds = {"x": x, "b": rng.standard_normal((16, 1000)).astype(np.float32)}
    want = run_reference(graph, feeds)
    got = _run(source, graph, feeds)
    # a NaN passes through the clip; -inf · 0 is NaN
    assert np.isnan(got[1][0, 0]) and np.isnan(got[0][0, 2]) and np.isnan(got[2]).all()
    for name, value in zip(graph.outputs, got, strict=True):
        np.testing.assert_allclose(value, want[name], rtol=1e-6, atol=1e-6)


def _softmax(b: PrimitiveBuilder, x: str, g: str) -> list[str]:
    """softmax(x + g) over the last axis, in the row schedule: the exponentials are kept in the output."""
    (s,) = b.emit("add", [x, g])
    (m,) = b.emit("reduce_max", [s], {"axes": (1,)})
    (e,) = b.emit("exp", [b.emit("sub", [s, m])[0]])
    (total,) = b.emit("reduce_sum", [e], {"axes": (1,)})
    return b.emit("div", [e, total])


def test_a_row_sums_what_it_stores_in_the_same_loop_and_divides_by_a_reciprocal() -> None:
    graph = _graph(_softmax, ((300, 256), (300, 256)))
    loops = _loops(graph)
    assert loops.schedule == "row"
    source = render_kernel("k", loops)
    summing = source[source.index("#pragma omp simd reduction(+:"):]
    summing = summing[: summing.index("const float acc")]
    # the exponentials are stored and summed in one loop; no loop reads them back to sum them
    assert "ko_expf" in summing and "out0[" in summing and source.count("#pragma omp simd reduction(+:") == 1
    assert "((float)1 / acc" in source and " / acc" not in source.replace("((float)1 / acc", "")
    rng = np.random.default_rng(4)
    feeds = {name: (rng.standard_normal((300, 256)) * 3).astype(np.float32) for name in ("x", "b")}
    feeds["x"][7, 5] = np.inf  # a row whose max is infinite: NaN where numpy's softmax is NaN
    want = run_reference(graph, feeds)[graph.outputs[0]]
    got = _run(source, graph, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9)
    np.testing.assert_allclose(got.sum(axis=1)[np.isfinite(got.sum(axis=1))], 1.0, rtol=1e-5)


def _layer_norm(b: PrimitiveBuilder, x: str, g: str) -> list[str]:
    """(x - mean) / sqrt(mean((x - mean)²) + eps) · g over the last axis: short rows in the row schedule."""
    width = b.graph.types[x].shape[-1]
    axis = len(b.graph.types[x].shape) - 1

    def mean(value: str) -> str:
        (total,) = b.emit("reduce_sum", [value], {"axes": (axis,)})
        return b.emit("mul", [total, b.constant(np.array(1 / width, np.float32))])[0]

    (centred,) = b.emit("sub", [x, mean(x)])
    (variance,) = b.emit("add", [mean(b.emit("mul", [centred, centred])[0]), b.constant(np.array(1e-5, np.float32))])
    (scale,) = b.emit("reciprocal", [b.emit("sqrt", [variance])[0]])
    return b.emit("mul", [b.emit("mul", [centred, scale])[0], g])


@pytest.mark.parametrize("shape", [(2, 8, 32), (3, 7, 36), (2, 8, 72), (3, 5, 100), (2, 8, 128)])
def test_short_rows_sum_across_a_block_of_rows(shape: tuple[int, ...]) -> None:
    """Rows of 32 and 36 floats run 8 at a time: each row's sums as lane partials, the block's partials summed
    together; 21 rows leave a last block of 5, 36 floats a last vector of 4. Rows of 72, 100 and 128 sum 16 at
    a time, then 8 (72), then a last 4 (100). A whole block of rows under 128 floats sums unrolled. Against
    float64 numpy, kernel by kernel and as rTasks (each task a range of blocks)."""
    graph = _graph(_layer_norm, (shape, shape))
    loops = _loops(graph)
    assert loops.schedule == "row"
    gir = optimize(lower(loops))
    assert "in blocks of 8 rows" in gir.describe() and gir.describe().count("summed across rows") == 2
    source = render_kernel("k", loops)
    assert source.count("ko_sum8x8(") == 2 and ("ko_rows" in source) == (shape[0] * shape[1] % 8 != 0)
    assert ("#pragma GCC unroll 8" in source) == (shape[0] * shape[1] % 8 == 0 and shape[2] < 128), source
    rng = np.random.default_rng(5)
    feeds = {"x": (rng.standard_normal(shape) * 2 + 50).astype(np.float32),  # a mean far from 0
             "b": rng.standard_normal(shape).astype(np.float32)}  # fmt: skip
    feeds["x"][1, 2, 3] = np.nan  # a NaN spoils its own row only
    x = feeds["x"].astype(np.float64)
    centred = x - x.mean(axis=-1, keepdims=True)
    want = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + 1e-5) * feeds["b"]
    got = _run(source, graph, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    assert np.isnan(got[1, 2]).all() and np.isfinite(np.delete(got.reshape(-1, shape[-1]), shape[1] + 2, 0)).all()
    tasks = PlanExecutor(graph, [_kernel(graph)], runtime="rprogram")(feeds)[graph.outputs[0]]
    np.testing.assert_allclose(tasks, want, rtol=2e-5, atol=2e-5)


def _scaled_exp(b: PrimitiveBuilder, x: str, g: str) -> list[str]:
    """exp(x·s - max(x·s)) · g over the last axis: softmax's numerator, a max step then a mapping loop step."""
    axis = len(b.graph.types[x].shape) - 1
    (scaled,) = b.emit("mul", [x, b.constant(np.array(0.35, np.float32))])
    (top,) = b.emit("reduce_max", [scaled], {"axes": (axis,)})
    (e,) = b.emit("exp", [b.emit("sub", [scaled, top])[0]])
    return b.emit("mul", [e, g])


@pytest.mark.parametrize(("shape", "overlapped"), [((40, 197), True), ((6, 37), True), ((40, 192), False),
                                                   ((40, 11), False)])  # fmt: skip
def test_a_mapping_row_step_ends_in_an_overlapping_vector_block(shape: tuple[int, ...], overlapped: bool) -> None:
    """A row of 197 (37) elements maps 192 (32) in whole vector blocks and its last 16 as one more block over
    [181, 197) ([21, 37)), rewriting the overlapped elements with the values they hold; rows of a whole number
    of vectors, or shorter than one, have no such block. Against float64 numpy, kernel by kernel and as rTasks."""
    graph = _graph(_scaled_exp, (shape, shape))
    loops = _loops(graph)
    assert loops.schedule == "row"
    text = optimize(lower(loops)).describe()
    assert ("ends in an overlapping block of 16" in text) == overlapped
    source = render_kernel("k", loops)
    width = shape[-1]
    assert (f"= {width - 16}; " in source and f"< {width - width % 16}; " in source) == overlapped
    rng = np.random.default_rng(7)
    feeds = {"x": (rng.standard_normal(shape) * 4).astype(np.float32),
             "b": rng.standard_normal(shape).astype(np.float32)}
    feeds["x"][1, -1] = np.nan  # in the overlapped block: spoils its own row only
    scaled = feeds["x"].astype(np.float64) * np.float64(np.float32(0.35))
    want = np.exp(scaled - scaled.max(axis=-1, keepdims=True)) * feeds["b"]
    got = _run(source, graph, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.isnan(got[1]).all() and np.isfinite(np.delete(got, 1, 0)).all()
    tasks = PlanExecutor(graph, [_kernel(graph)], runtime="rprogram")(feeds)[graph.outputs[0]]
    np.testing.assert_allclose(tasks, want, rtol=1e-5, atol=1e-6)


def test_a_row_step_reading_what_it_stores_has_no_overlapping_block() -> None:
    """softmax(x + g)'s division reads the exponentials from the output it overwrites: dividing [181, 192)
    twice would be wrong, so that step keeps its scalar remainder."""
    shape = (12, 197)
    graph = _graph(_softmax, (shape, shape))
    loops = _loops(graph)
    gir = optimize(lower(loops))
    assert loops.schedule == "row" and "ends in an overlapping block" not in gir.describe()
    assert not any(step.independent for phase in gir.phases for step in phase.steps)  # no simd loop either
    rng = np.random.default_rng(8)
    x, g = (rng.standard_normal(shape).astype(np.float32) * 3 for _ in range(2))
    s = x.astype(np.float64) + g
    want = np.exp(s - s.max(axis=-1, keepdims=True))
    want /= want.sum(axis=-1, keepdims=True)
    got = _run(render_kernel("k", loops), graph, {"x": x, "b": g})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def _normalized_transpose(b: PrimitiveBuilder, x: str, g: str) -> list[str]:
    """transpose(g / sum(x over its last axis)): 8192 row sums of 64, then a transposed division."""
    (total,) = b.emit("reduce_sum", [x], {"axes": (2,)})
    return b.emit("transpose", [b.emit("div", [g, total])[0]], {"perm": (1, 0, 2)})


def test_a_phase_of_few_outputs_with_long_reductions_is_shared_out() -> None:
    """8192 sums are fewer outputs than a parallel region pays for, but 524 288 elements of work: the sum
    phase runs on both threads (segformer's [8192, 256] sums ahead of a transpose: 113 -> 66 us)."""
    graph = _graph(_normalized_transpose, ((2, 4096, 64), (2, 4096, 8)))
    loops = _loops(graph)
    assert loops.schedule == "phased" and len(loops.phases) == 2
    first = optimize(lower(loops)).describe().splitlines()[0]
    assert first.startswith("phase 0") and "on 2 thread(s)" in first, first
    source = render_kernel("k", loops)
    assert source.count("#pragma omp parallel for") == 2
    rng = np.random.default_rng(9)
    feeds = {"x": rng.random((2, 4096, 64), np.float32) + 0.5, "b": rng.standard_normal((2, 4096, 8), np.float32)}
    want = np.transpose(feeds["b"] / feeds["x"].astype(np.float64).sum(axis=2, keepdims=True), (1, 0, 2))
    got = PlanExecutor(graph, [_kernel(graph)], threads=2)(feeds)[graph.outputs[0]]  # the sums go to scratch
    np.testing.assert_allclose(got, want, rtol=2e-6)


def test_a_value_varying_along_the_unrolled_loop_stays_inside_it() -> None:
    """x · sigmoid(g) with g along the 3 channels of a channels-last map: the short channel loop is unrolled
    inside the vector loop over the width, so sigmoid(g) is invariant along the vector loop yet differs per
    channel; it must not run once before the loops like a truly loop-invariant value."""
    shapes = ((16, 128, 3), (1, 1, 3))
    graph = _graph(_broadcast_gate, shapes)
    source = render_kernel("k", _loops(graph))
    assert "#pragma GCC unroll" in source  # the case the test is about: the short innermost loop is unrolled
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal(shapes[0]).astype(np.float32),
             "b": rng.standard_normal(shapes[1]).astype(np.float32)}  # fmt: skip
    want = run_reference(graph, feeds)[graph.outputs[0]]
    np.testing.assert_allclose(_run(source, graph, feeds)[0], want, rtol=1e-5, atol=1e-6)


def test_a_simd_loop_reduces_err_only_where_its_body_sets_it() -> None:
    """Only a checked gather sets `err`; any other simd loop drops the clause (a copy of err per lane)."""
    plain = ["#pragma omp simd reduction(|:err)", "for (int64_t i = 0; i < 64; i++) {", "y[i] = x[i];", "}"]
    gather = ["#pragma omp parallel for simd reduction(|:err) schedule(static)", "for (int64_t i = 0; i < 64; i++) {",
              "if (i > 1) {", "y[i] = x[ko_index(ix[i], 8, &err)];", "}", "}"]  # fmt: skip
    parallel = ["#pragma omp parallel for collapse(1) reduction(|:err) schedule(static)"]
    lines = _err_only_where_set([*parallel, *plain, *gather])
    assert lines[1] == "#pragma omp simd" and lines[2:5] == plain[1:], lines
    assert lines[5:] == gather, lines  # its body sets err, two levels down
    assert lines[0] == parallel[0]  # not a simd loop: the threads' copies are combined once


def test_a_row_step_that_only_maps_is_a_simd_loop() -> None:
    """exp(x·s − max) · b over rows of 192: the mapping step reads nothing it stores, so its loop is marked
    simd (GCC vectorized a layer norm's apply loop less well without: 42.8 vs 39.8 µs)."""
    shape = (40, 192)
    graph = _graph(_scaled_exp, (shape, shape))
    loops = _loops(graph)
    gir = optimize(lower(loops))
    assert [step.independent for phase in gir.phases for step in phase.steps if step.loops] == [True]
    lines = [line.strip() for line in render_kernel("k", loops).splitlines()]
    loop = next(i for i, line in enumerate(lines)
                if line.startswith("for (") and "< 192;" in line and "ko_" not in line)  # fmt: skip
    assert lines[loop - 1].startswith("#pragma omp simd"), lines[loop - 3: loop + 1]



def test_a_table_of_one_value_or_of_the_index_divided_is_computed() -> None:
    """What a shape-generic kernel computes instead of reading a table (its length follows the sizes): a
    nearest resize's taps (i // f) and weights (all one); any other table has no formula."""
    taps = table_formula(np.arange(48) // 2)
    assert taps is not None and taps("i") == "((i) / 2)"
    same = table_formula(np.arange(7))
    assert same is not None and same("i") == "(i)"
    ones = table_formula(np.ones(48, np.float32))
    assert ones is not None and ones("i") == "1.0f"
    for other in (np.array([0, 0, 1, 2]), np.array([0, 1, 1, 2]), np.array([1, 1, 2, 2]), np.array([0.5, 1.0]),
                  np.arange(6).reshape(2, 3), np.zeros(0, np.int64)):  # fmt: skip
        assert table_formula(other) is None, other

# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a row sum fused into the loop keeps only the last value",
         'f"{acc} += ({ctype})({self.names[step.result]});"',
         'f"{acc} = ({ctype})({self.names[step.result]});"',
         tests=("kernorch/codegen/c/render_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference")),
    here("a short row's last partial vector is not summed",
         'lines += lanes(str(full), size % 8, "_acc")',
         'lines += lanes(str(full), 0, "_acc")',
         tests=("kernorch/codegen/c/render_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference")),
    here("a long row's sixteen partials folded to eight lose their upper half",
         '"}", *(f"{part}_acc += {part}_acc16a + {part}_acc16b;" for part in parts)]',
         '"}", *(f"{part}_acc += {part}_acc16a;" for part in parts)]'),
    here("a long row's upper eight partials sum its lower eight values again",
         'f"{part}_acc16b += *(const ko_v8 *)({part}_t16 + 8);"',
         'f"{part}_acc16b += *(const ko_v8 *){part}_t16;"'),
    here("a row's summed vectors are not added to its partials",
         'f"{part}_acc += *(const ko_v8 *){part}_t;"',
         'f"{part}_acc = *(const ko_v8 *){part}_t;"',
         tests=("kernorch/codegen/c/render_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference")),
    here("a block's row sums take a lane of the next row",
         "__builtin_shufflevector(p[4], p[5], 1, 3, 9, 11, 5, 7, 13, 15)",
         "__builtin_shufflevector(p[4], p[5], 1, 3, 9, 11, 5, 7, 13, 14)",
         file="kernorch/codegen/c/prelude.py",
         tests=("kernorch/codegen/c/render_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference")),
    here("a row's overlapping last vector block starts one element early",
         'f"for (int64_t {var} = {size - width}; {var} < {size}; {var}++) {{"',
         'f"for (int64_t {var} = {size - width - 1}; {var} < {size - 1}; {var}++) {{"',
         tests=("kernorch/codegen/c/render_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference")),
    here("a simd loop setting err drops its reduction",
         "            if _ERR.search(out[j]):\n                break",
         "            pass"),
    here("a row step reading what it stores is a simd loop",
         "return mapping is not None and mapping[0].isdisjoint(buffer for buffer, _ in mapping[1])",
         "return mapping is not None",
         file="kernorch/codegen/gir/lowering.py"),
    here("a row step reading what it stores overlaps its tail",
         "    return stored.isdisjoint(buffer for buffer, level in read if level == GLOBAL)",
         "    return True",
         file="kernorch/codegen/gir/lowering.py",
         tests=("kernorch/codegen/c/render_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference")),
    here("a phase's reductions do not count as work when sharing it out",
         "    return max(1, taps(tree))",
         "    return 1",
         file="kernorch/codegen/gir/reductions.py"),
    here("an address part reading the vector loop's variable is hoisted",
         "and not _loop_vars(tree) & inner:  # fmt: skip",
         ":  # fmt: skip",
         tests=("kernorch/codegen/c/render_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference",
                "kernorch/codegen/loops/splitting_test.py")),
    here("around an unrolled short loop, the vector loop's part of an address is hoisted",
         "self.phase.loops[-2 if self.phase.unrolled else -1:]",
         "self.phase.loops[-1:]",
         tests=("kernorch/codegen/c/render_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference",
                "kernorch/codegen/loops/splitting_test.py")),
    here("a nested body drops the hoisted constants of the body around it",
         "mine, self.hoisted = self.hoisted, enclosing",
         "mine, self.hoisted = self.hoisted, None",
         tests=("kernorch/codegen/c/render_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference",
                "kernorch/codegen/loops/splitting_test.py")),
    here("max by a literal lets a NaN through",
         'return f"({number} > {a} ? {number} : {a})" if prim == "max"',
         'return f"({a} > {number} ? {a} : {number})" if prim == "max"',
         file="kernorch/codegen/c/expr.py",
         tests=("kernorch/codegen/c/render_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference")),
    here("GIR-rendered where swaps its branches",
         'f"({args[0]} ? {args[1]} : {args[2]})"',
         'f"({args[0]} ? {args[2]} : {args[1]})"',
         tests=("kernorch/codegen/c/render_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference")),
    here("GIR hoists what varies along an unrolled or row loop",
         'outer = 0 if any(mentions(tree, var) for var in ctx["pinned"]) else ctx["outer"]',
         'outer = ctx["outer"]',
         file="kernorch/codegen/gir/lowering.py",
         tests=("kernorch/codegen/c/render_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference",
                "kernorch/runtime/executor_test.py")),
]  # fmt: skip
