"""How the C renderer shares loops out to threads and vectorizes reductions: checked in the source it emits
and in the numbers the compiled kernel computes."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.codegen.backends import GENERATED_C
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference


def _gelu_graph(shape: tuple[int, ...]) -> Graph:
    """x · (erf(x · s) + 1) with s and 1 as [1, 1, 1] constants: the loops keep a size-1 outer axis for them."""
    graph = Graph(inputs=["x"], outputs=["y"])
    graph.types["x"] = TensorType(shape, "float32")
    for name, value in (("s", 0.7071), ("one", 1.0)):
        graph.constants[name] = np.full((1,) * len(shape), value, np.float32)
        graph.types[name] = TensorType((1,) * len(shape), "float32")
    chain = [("mul", ("x", "s"), "a"), ("erf", ("a",), "b"), ("add", ("b", "one"), "c"), ("mul", ("x", "c"), "y")]
    for prim, inputs, out in chain:
        graph.nodes.append(Node(prim, inputs, (out,), ()))
        graph.types[out] = TensorType(shape, "float32")
    return graph


def _parallel_lines(source: str) -> list[tuple[str, str]]:
    """(pragma, the loop it opens) for every parallel region of the source."""
    lines = [line.strip() for line in source.splitlines()]
    return [(line, lines[i + 1]) for i, line in enumerate(lines) if "omp parallel" in line]


def test_a_long_innermost_loop_under_one_outer_iteration_is_shared_out() -> None:
    graph = _gelu_graph((1, 512, 128))
    kernel = make_kernel(graph, (0, 1, 2, 3), ("y",))
    regions = _parallel_lines(GENERATED_C.source("k", kernel))
    assert len(regions) == 1, regions
    pragma, loop = regions[0]
    assert "simd" in pragma and "65536" in loop, regions  # the flattened [512, 128] loop, not the outer [1]
    x = np.random.default_rng(0).standard_normal((1, 512, 128)).astype(np.float32)
    got = PlanExecutor(graph, [kernel])({"x": x})["y"]
    np.testing.assert_allclose(got, run_reference(graph, {"x": x})["y"], rtol=2e-6, atol=1e-6)


def _softmax_max_graph(rows: int, width: int, prim: str) -> Graph:
    """exp(x − reduce(x)) along the last axis: the reduction and its use fused as in softmax."""
    graph = Graph(inputs=["x"], outputs=["y"])
    graph.types["x"] = TensorType((rows, width), "float32")
    graph.nodes += [Node(prim, ("x",), ("m",), (("axes", (1,)),)), Node("sub", ("x", "m"), ("d",), ()),
                    Node("exp", ("d",), ("y",), ())]  # fmt: skip
    graph.types.update(m=TensorType((rows, 1), "float32"), d=TensorType((rows, width), "float32"),
                       y=TensorType((rows, width), "float32"))  # fmt: skip
    return graph


@pytest.mark.parametrize("prim", ["reduce_max", "reduce_min"])
@pytest.mark.parametrize("width", [256, 100, 37])
def test_float_max_and_min_are_simd_reductions_that_propagate_nan(prim: str, width: int) -> None:
    graph = _softmax_max_graph(64, width, prim)
    kernel = make_kernel(graph, (0, 1, 2), ("y",))
    source = GENERATED_C.source("k", kernel)
    assert f"#pragma omp simd reduction({prim[7:]}:" in source, source
    x = np.random.default_rng(1).standard_normal((64, width)).astype(np.float32)
    x[3, width - 1] = np.nan  # the last element (the vector loop's tail when the width is not a multiple of 16)
    x[5, 7] = np.nan  # in a lane
    x[7, 0] = np.nan  # the first element
    x[9, :] = -np.inf if prim == "reduce_max" else np.inf
    # a NaN enters the reduction as the extreme: a true extreme (row 11: exp(x - inf) is 0, and NaN only where
    # x is inf) is the result unless a NaN is there too (row 15, the NaN first in the row, the extreme later)
    extreme = np.inf if prim == "reduce_max" else -np.inf
    x[11, width // 2] = extreme
    x[15, 1], x[15, width - 2] = np.nan, extreme
    got = PlanExecutor(graph, [kernel])({"x": x})["y"]
    expected = run_reference(graph, {"x": x})["y"]
    assert np.isnan(got[3]).all() and np.isnan(got[5]).all() and np.isnan(got[7]).all()
    assert np.isnan(got[15]).all() and np.isnan(got[11]).sum() == 1
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=0)


@pytest.mark.parametrize(("shape", "perm"), [((1, 64, 8, 40), (0, 2, 3, 1)), ((3, 37, 20), (0, 2, 1)),
                                             ((2, 48, 33), (0, 2, 1))])  # fmt: skip
def test_a_transposing_read_is_walked_in_tiles(shape: tuple[int, ...], perm: tuple[int, ...]) -> None:
    graph = Graph(inputs=["x"], outputs=["y"])
    graph.types["x"] = TensorType(shape, "float32")
    graph.nodes.append(Node("transpose", ("x",), ("t",), (("perm", perm),)))
    graph.nodes.append(Node("relu", ("t",), ("y",), ()))
    out_shape = tuple(shape[p] for p in perm)
    graph.types.update(t=TensorType(out_shape, "float32"), y=TensorType(out_shape, "float32"))
    kernel = make_kernel(graph, (0, 1), ("y",))
    assert "_t += 16" in GENERATED_C.source("k", kernel)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(PlanExecutor(graph, [kernel])({"x": x})["y"], np.maximum(x.transpose(perm), 0))


def test_a_contiguous_read_is_not_tiled() -> None:
    kernel = make_kernel(_gelu_graph((2, 64, 64)), (0, 1, 2, 3), ("y",))
    assert "_t += 16" not in GENERATED_C.source("k", kernel)


def _reduce_then_subtract_graph(shape: tuple[int, int, int]) -> Graph:
    """y = x − sum(x, axis 1): two phases (the reduction into scratch, interchanged; then the elementwise)."""
    graph = Graph(inputs=["x"], outputs=["y"])
    a, b, c = shape
    graph.types.update(x=TensorType(shape, "float32"), m=TensorType((a, 1, c), "float32"),
                       y=TensorType(shape, "float32"))  # fmt: skip
    graph.nodes += [Node("reduce_sum", ("x",), ("m",), (("axes", (1,)),)), Node("sub", ("x", "m"), ("y",), ())]
    return graph


TASK_CASES = {
    "innermost split": (_gelu_graph((1, 512, 128)), (0, 1, 2, 3), (1, 512, 128)),
    "rows": (_softmax_max_graph(64, 256, "reduce_max"), (0, 1, 2), (64, 256)),
    "tiles": (None, (0, 1), (1, 64, 8, 40)),
    "ragged tiles": (None, (0, 1), (5, 301, 20)),
    "two phases": (_reduce_then_subtract_graph((8, 64, 512)), (0, 1), (8, 64, 512)),
}


@pytest.mark.parametrize("case", list(TASK_CASES))
def test_rtask_ranges_compute_what_the_whole_kernel_computes(case: str) -> None:
    """Each phase's parallel loop cut into uneven rTasks placed on both vEUs (and one range of a single
    iteration) computes what the kernel's own OpenMP loops compute."""
    from kernorch.schedule.program import RProgram
    from kernorch.schedule.simulate import UnitTimes
    from kernorch.schedule.wavefront import _Builder

    graph, nodes, shape = TASK_CASES[case]
    if graph is None:
        perm = (0, 2, 3, 1) if len(shape) == 4 else (0, 2, 1)
        graph = Graph(inputs=["x"], outputs=["y"])
        graph.types["x"] = TensorType(shape, "float32")
        graph.nodes += [Node("transpose", ("x",), ("t",), (("perm", perm),)), Node("relu", ("t",), ("y",), ())]
        out_shape = tuple(shape[p] for p in perm)
        graph.types.update(t=TensorType(out_shape, "float32"), y=TensorType(out_shape, "float32"))
    kernel = make_kernel(graph, nodes, ("y",))
    executor = PlanExecutor(graph, [kernel])
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    expected = executor({"x": x})["y"].copy()
    runner = executor._rprogram_runner()
    assert any(u.iterations > 2 for u in runner.units), runner.units  # the kernel has a parallel loop
    builder = _Builder(runner.units, 2, [UnitTimes(1e-6, 1e-6, 1e-6)] * len(runner.units))
    for u, unit in enumerate(runner.units):
        n = unit.iterations
        cuts = sorted({0, n, min(1, n), n // 3, n - n // 5})
        pieces = list(zip(cuts, cuts[1:], strict=False))
        builder.place(u, runner.predecessors[u], pieces, [i % 2 for i in range(len(pieces))])
    builder.close()
    runner.use(RProgram(2, runner.units, tuple(builder.segments)))
    executor.buffers["x"][...] = x  # the call above read x in place; the runner reads the executor's buffer
    executor.buffers["y"][...] = np.nan
    runner.run()
    np.testing.assert_array_equal(executor.buffers["y"], expected)


@pytest.mark.parametrize(("shape", "perm", "shared"), [
    # (the batch loop of one iteration is a constant, not collapsed)
    ((1, 3, 224, 224), (0, 2, 3, 1), "collapse(1)"),  # NCHW -> NHWC of an RGB image: 3-channel pixels
    ((1, 2, 58, 28, 28), (0, 3, 4, 2, 1), "collapse(2)"),  # shufflenet's shuffle, channels-last: [.., 58, 2] pairs
    ((3, 8192), (1, 0), "parallel for simd"),  # no loop outside the pair: the vectorized loop is shared out
])  # fmt: skip
def test_a_short_innermost_loop_is_unrolled_and_the_loop_outside_it_vectorized(
        shape: tuple[int, ...], perm: tuple[int, ...], shared: str) -> None:  # fmt: skip
    graph = Graph(inputs=["x"], outputs=["y"])
    graph.types["x"] = TensorType(shape, "float32")
    graph.types["y"] = TensorType(tuple(shape[p] for p in perm), "float32")
    graph.nodes.append(Node("transpose", ("x",), ("y",), (("perm", perm),)))
    kernel = make_kernel(graph, (0,), ("y",))
    source = GENERATED_C.source("k", kernel)
    short = graph.types["y"].shape[-1]
    assert f"#pragma GCC unroll {short}" in source, source
    lines = [line.strip() for line in source.splitlines()]
    vectorized = lines[lines.index(f"#pragma GCC unroll {short}") - 2]
    assert "omp" in vectorized and "simd" in vectorized, source  # the loop outside the short one
    assert [shared in pragma for pragma, _ in _parallel_lines(source)] == [True], source  # the loops outside it
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(PlanExecutor(graph, [kernel])({"x": x})["y"], np.transpose(x, perm))


@pytest.mark.parametrize("prim", ["window_max", "window_sum"])
def test_a_pool_along_one_axis_reads_whole_rows_of_the_others(prim: str) -> None:
    """A channels-last pool over H only (separate-window-axes' first pass): W and C are the output's own axes,
    merged into one vectorized loop of W·C with no tap loop and no bounds check along them."""
    shape = (1, 20, 12, 24)
    graph = Graph(inputs=["x"], outputs=["y"])
    graph.types["x"] = TensorType(shape, "float32")
    attrs = (("kernel", (3, 1, 1)), ("strides", (2, 1, 1)), ("pads", (1, 0, 0, 1, 0, 0)), ("dilations", (1, 1, 1)),
             ("ceil_mode", False))  # fmt: skip
    graph.nodes.append(Node(prim, ("x",), ("y",), attrs))
    graph.types["y"] = TensorType((1, 10, 12, 24), "float32")
    kernel = make_kernel(graph, (0,), ("y",))
    source = GENERATED_C.source("k", kernel)
    assert f"< {12 * 24}; m++)" in source, source  # one loop over the merged row
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(PlanExecutor(graph, [kernel])({"x": x})["y"], run_reference(graph, {"x": x})["y"],
                               rtol=1e-6, atol=1e-6)  # fmt: skip


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a pool's axis of one tap keeps a tap loop",
         "pads[j], pads[spatial + j]) == (1, 1, 1, 0, 0):",
         "pads[j], pads[spatial + j]) == (0, 0, 0, 0, 0):",
         file="kernorch/codegen/loops/description.py"),
    here("a collapsed nest keeps its one-iteration loops",
         "kept = [(var, bound, step) for var, bound, step in loops if bound > step] or loops[-1:]",
         "kept = list(loops)",
         file="kernorch/codegen/c/loops.py"),
    here("simd max forgets a NaN",
         'f"{nan} |= {x} != {x};"',
         'f"{nan} |= 0;"',
         file="kernorch/codegen/c/render.py",
         tests=("kernorch/codegen/c/kernel_test.py::test_float_max_and_min_are_simd_reductions_that_propagate_nan",)),
]  # fmt: skip
