"""Split reductions (reductions.py): a long reduction with nothing around it to share out is split among
threads, combined in thread order; an NCHW window's padding check becomes a range of columns per tap. Checked
in the emitted source and in the numbers the kernel computes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kernorch.codegen.backends import GENERATED_C
from kernorch.codegen.gir import tap_ranges
from kernorch.codegen.loops import Tree, lit
from kernorch.codegen.loops.indexing_test import evaluate
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`


def _centred_graph(shape: tuple[int, ...], prim: str) -> Graph:
    """x − reduce(x) over the spatial axes of a channels-last map: an instance norm's first step."""
    graph = Graph(inputs=["x"], outputs=["y"])
    reduced = (shape[0], 1, 1, shape[3])
    graph.types.update(x=TensorType(shape, "float32"), m=TensorType(reduced, "float32"),
                       y=TensorType(shape, "float32"))  # fmt: skip
    graph.nodes += [Node(prim, ("x",), ("m",), (("axes", (1, 2)),)), Node("sub", ("x", "m"), ("y",), ())]
    return graph


@pytest.mark.parametrize(("prim", "width", "block"), [("reduce_sum", 80, 8), ("reduce_max", 80, 8),
                                                     ("reduce_sum", 77, 7), ("reduce_max", 79, 1)])
def test_a_reduction_with_nothing_around_it_is_split_among_threads(prim: str, width: int, block: int) -> None:
    """... and sums `block` consecutive taps of its innermost tap loop (the largest divisor of its length up to 8;
    none for a prime) in a register before the running value goes back to memory."""
    graph = _centred_graph((1, 96, width, 40), prim)
    kernel = make_kernel(graph, (0, 1), ("y",))
    source = GENERATED_C.source("k", kernel)
    # each thread's 40 results padded to 48 floats (whole cache lines): no line shared between two threads
    assert "ko_parts[ko_team][48] __attribute__((aligned(64)))" in source, source
    assert "#pragma omp for collapse(2) schedule(static)" in source, source
    assert (f"ko_r2 += {block}) {{" in source) == (block > 1), source
    assert ("float ko_run = ko_part[l3];" in source) == (block > 1), source
    x = np.random.default_rng(0).standard_normal((1, 96, width, 40)).astype(np.float32)
    x[0, 95, width - 1, 3] = 50.0  # the maximum of channel 3 in the last thread's part, the last tap of a block
    executor = PlanExecutor(graph, [kernel], threads=2)
    got = executor({"x": x})["y"].copy()
    expected = run_reference(graph, {"x": x})["y"]
    atol = 1e-6 * float(np.abs(expected).max())  # a sum of 7680 values: float32 rounding of the sum
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=atol)
    np.testing.assert_array_equal(executor({"x": x})["y"], got)  # same threads, same order of summation
    single = PlanExecutor(graph, [kernel], threads=1)({"x": x})["y"]
    np.testing.assert_allclose(single, got, rtol=1e-5, atol=atol)


def test_a_reduction_with_a_batch_to_share_out_is_not_split() -> None:
    """The batch is shared out; each image's sums run in a local array, 8 taps at a time in a register."""
    graph = _centred_graph((4, 48, 40, 40), "reduce_sum")
    kernel = make_kernel(graph, (0, 1), ("y",))
    source = GENERATED_C.source("k", kernel)
    assert "ko_parts" not in source and "float ko_run = ko_acc[l3];" in source and "ko_r2 += 8) {" in source, source
    x = np.random.default_rng(1).standard_normal((4, 48, 40, 40)).astype(np.float32)
    got = PlanExecutor(graph, [kernel], threads=2)({"x": x})["y"]
    expected = run_reference(graph, {"x": x})["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6 * float(np.abs(expected).max()))


def test_rtasks_keep_the_reduction_whole() -> None:
    """An rTask runs a share of a phase's iterations on its own: a split would need a combining step."""
    graph = _centred_graph((1, 96, 80, 40), "reduce_sum")
    tasked = GENERATED_C.task_source("k_task", make_kernel(graph, (0, 1), ("y",)))
    assert tasked is not None and "ko_parts" not in tasked[0]


def _range_graph(shape: tuple[int, ...]) -> Graph:
    """The min and the max over a whole tensor (a dynamic quantization's range): two scalars."""
    graph = Graph(inputs=["x"], outputs=["lo", "hi"])
    axes, ones = (("axes", tuple(range(len(shape)))),), (1,) * len(shape)
    graph.types.update(x=TensorType(shape, "float32"), lo=TensorType(ones, "float32"), hi=TensorType(ones, "float32"))
    graph.nodes += [Node("reduce_min", ("x",), ("lo",), axes), Node("reduce_max", ("x",), ("hi",), axes)]
    return graph


@pytest.mark.parametrize(("shape", "at"), [((1, 128, 1024), (0, 127, 1023)), ((131071,), (65536,)),
                                           ((3, 7, 4099), (1, 3, 0))])  # fmt: skip
@pytest.mark.parametrize("edge", ["finite", "nan", "inf"])
def test_a_whole_tensors_extremum_shares_its_taps_among_threads(shape: tuple[int, ...], at: tuple[int, ...],
                                                                edge: str) -> None:  # fmt: skip
    """A float min/max with no outputs to share out splits its taps; exact in any order, so the result is
    numpy's on any thread count (NaN anywhere gives NaN; an infinity at one thread's end is found)."""
    graph = _range_graph(shape)
    kernel = make_kernel(graph, (0, 1), ("lo", "hi"))
    source = GENERATED_C.source("k", kernel)
    assert source.count("#pragma omp parallel for") == 2 and "reduction(min:" in source, source
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    x[at] = {"finite": 9.0, "nan": np.nan, "inf": -np.inf}[edge]
    for threads in (1, 2, 3):
        got = PlanExecutor(graph, [kernel], threads=threads)({"x": x})
        np.testing.assert_array_equal(got["lo"].reshape(()), np.min(x))
        np.testing.assert_array_equal(got["hi"].reshape(()), np.max(x))


def test_a_short_extremum_and_an_rtask_stay_on_one_thread() -> None:
    """Below SHARED_EXTREMUM_MIN_TAPS a parallel region costs more than it saves; an rTask's phase is one task."""
    assert "omp parallel" not in GENERATED_C.source("k", make_kernel(_range_graph((128, 256)), (0, 1), ("lo", "hi")))
    tasked = GENERATED_C.task_source("k_task", make_kernel(_range_graph((1, 128, 1024)), (0, 1), ("lo", "hi")))
    assert tasked is not None and "omp parallel" not in tasked[0]


@pytest.mark.parametrize(("prim", "channels"), [("window_max", 24), ("window_max", 37), ("window_sum", 24)])
def test_a_channels_last_pool_accumulates_in_a_local_array_and_keeps_nan(prim: str, channels: int) -> None:
    """A channels-last 3x3 stride-2 pool runs interchanged: the taps outside (written out), the channels inside,
    the running values in `ko_acc` (stored once). A NaN in the window's first tap, in a later one, or in the
    channel tail reaches the output; -inf and the padding do not."""
    graph = Graph(inputs=["x"], outputs=["y"])
    graph.types.update(x=TensorType((1, 15, 13, channels), "float32"), y=TensorType((1, 8, 7, channels), "float32"))
    attrs = (("kernel", (3, 3, 1)), ("strides", (2, 2, 1)), ("dilations", (1, 1, 1)), ("pads", (1, 1, 0, 1, 1, 0)),
             ("ceil_mode", False))  # fmt: skip
    graph.nodes.append(Node(prim, ("x",), ("y",), attrs))
    kernel = make_kernel(graph, (0,), ("y",))
    source = GENERATED_C.source("k", kernel)
    assert f"ko_acc[{channels}];" in source, source
    assert source.count("#pragma GCC unroll 3") == 2  # the 3 x 3 taps written out
    x = np.random.default_rng(2).standard_normal((1, 15, 13, channels)).astype(np.float32)
    x[0, 0, 0, 3] = np.nan  # the first tap of output (0, 0), a padded window
    x[0, 6, 6, 5] = np.nan  # the last tap of output (3, 3) (and the first of (3, 3)'s neighbours)
    x[0, 9, 4, channels - 1] = np.nan  # the last channel
    x[0, 2:5, 2:5, 7] = -np.inf  # a whole window of -inf: its max is -inf
    got = PlanExecutor(graph, [kernel], threads=2)({"x": x})["y"]
    expected = run_reference(graph, {"x": x})["y"]
    assert np.isnan(got[0, 0, 0, 3]) and np.isnan(got[0, 3, 3, 5]) and np.isnan(got[0, 4, 2, channels - 1])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _holds(condition: Tree, point: dict[str, int]) -> bool:
    if condition[0] == "&&":
        return _holds(condition[1], point) and _holds(condition[2], point)
    a, b = evaluate(condition[1], point), evaluate(condition[2], point)
    return a < b if condition[0] == "<" else a >= b


@pytest.mark.parametrize("seed", range(40))
def test_tap_ranges_admit_exactly_the_outputs_each_tap_reaches(seed: int) -> None:
    """Padding checks `0 <= c*w + s*r + k < n` (strides, dilations, both signs of c: a reversed axis), with a
    check free of w beside them: per tap, [ko_lo, ko_hi) is exactly the set of w the guard admits, and the
    check free of w is kept."""
    rng = random.Random(seed)
    width, taps, rows = rng.randint(1, 12), rng.randint(1, 4), rng.randint(1, 3)
    ranges = {"w": width, "r": taps, "h": rows}
    conditions: list[Tree] = [(">=", ("var", "h"), lit(1))]  # free of w
    for _ in range(rng.randint(1, 3)):
        c, s, k, n = rng.choice([-3, -2, -1, 1, 2, 3]), rng.randint(0, 3), rng.randint(-4, 4), rng.randint(1, 20)
        position = ("+", ("+", ("*", ("var", "w"), lit(c)), ("*", ("var", "r"), lit(s))), lit(k))
        conditions += [(">=", position, lit(0)), ("<", position, lit(n))]
    rng.shuffle(conditions)
    guard = conditions[0]
    for condition in conditions[1:]:
        guard = ("&&", guard, condition)
    found = tap_ranges(guard, "w", ranges)
    assert found is not None
    kept, bounds = found
    assert kept == (">=", ("var", "h"), lit(1))
    for r in range(taps):
        lo, hi = 0, width
        for bound in bounds:
            value = _ceil_div(evaluate(bound.numerator, {"r": r}), bound.divisor)
            lo, hi = (max(lo, value), hi) if bound.lower else (lo, min(hi, value))
        for w in range(width):
            assert (lo <= w < hi) == _holds(guard, {"w": w, "r": r, "h": 1}), (r, w, bounds)


def test_a_condition_not_linear_in_the_inner_variable_keeps_the_reduction_in_place() -> None:
    ranges = {"w": 8, "r": 3}
    for condition in [("<", ("*", ("var", "w"), ("var", "r")), lit(5)),  # w times a tap
                      ("<", ("/", ("var", "w"), lit(2)), lit(3)),  # w halved
                      ("<", ("+", ("var", "w"), ("read", 0)), lit(3))]:  # a value read
        assert tap_ranges(("&&", (">=", ("var", "w"), lit(1)), condition), "w", ranges) is None


def _window_graph(prim: str, shape: tuple[int, int, int, int], kernel: int, stride: int, dilation: int,
                  pads: tuple[int, int, int, int]) -> Graph:  # fmt: skip
    """One NCHW pooling window or depthwise conv ("conv": a constant filter per channel) over x."""
    n, c, h, w = shape
    out = [(size + pads[a] + pads[a + 2] - (kernel - 1) * dilation - 1) // stride + 1 for a, size in enumerate((h, w))]
    graph = Graph(inputs=["x"], outputs=["y"])
    graph.types.update(x=TensorType(shape, "float32"), y=TensorType((n, c, *out), "float32"))
    geometry = (("dilations", (dilation, dilation)), ("pads", pads), ("strides", (stride, stride)))
    if prim == "conv":
        graph.constants["f"] = np.random.default_rng(3).standard_normal((c, 1, kernel, kernel)).astype(np.float32)
        graph.types["f"] = TensorType((c, 1, kernel, kernel), "float32")
        graph.nodes.append(Node("conv", ("x", "f"), ("y",), (*geometry, ("group", c))))
    else:
        graph.nodes.append(Node(prim, ("x",), ("y",), (*geometry, ("kernel", (kernel, kernel)), ("ceil_mode", False))))
    return graph


@pytest.mark.parametrize(("prim", "kernel", "stride", "dilation", "pads"), [
    ("window_max", 3, 2, 1, (1, 1, 1, 1)),  # cspresnet50's stem pool
    ("window_max", 3, 1, 2, (2, 2, 2, 2)),
    ("window_max", 2, 3, 1, (0, 0, 2, 2)),  # padded at the end only, wider than the stride reaches
    ("window_sum", 3, 1, 1, (1, 0, 0, 1)),
    ("window_sum", 5, 2, 1, (2, 2, 2, 2)),
    ("conv", 3, 1, 1, (1, 1, 1, 1)),  # a depthwise conv
    ("conv", 5, 2, 2, (4, 3, 4, 3)),
])  # fmt: skip
def test_an_nchw_window_runs_each_tap_over_the_columns_it_reaches(prim: str, kernel: int, stride: int,
                                                                   dilation: int, pads: tuple[int, int, int, int],
                                                                   ) -> None:  # fmt: skip
    """NCHW: the padding check on the row's axis becomes per tap a range of output columns, the columns inside
    (no check per element, where a branch per tap and element ran cspresnet50's pool at 700 µs). NaN and -inf on
    the borders, the first and the last column reach exactly the outputs whose windows hold them."""
    graph = _window_graph(prim, (1, 6, 15, 25), kernel, stride, dilation, pads)
    kernel_ = make_kernel(graph, (0,), ("y",))
    source = GENERATED_C.source("k", kernel_)
    assert "ko_lo; l3 < ko_hi; l3++) {" in source, source
    assert ("ko_ceil_div(" in source) == (stride > 1), source
    x = np.random.default_rng(4).standard_normal((1, 6, 15, 25)).astype(np.float32)
    x[0, 1, :, 0] = np.nan  # the first column
    x[0, 2, 7, 24] = np.nan  # the last column
    x[0, 3, 0, :] = -np.inf  # the first row
    x[0, 4, 14, 9] = np.inf
    got = PlanExecutor(graph, [kernel_], threads=2)({"x": x})["y"]
    expected = run_reference(graph, {"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("running max drops a new NaN",
         "(acc) = ((ko_x_ > (acc)) | (ko_x_ != ko_x_)) ? ko_x_ : (acc); })",
         "(acc) = (ko_x_ > (acc)) ? ko_x_ : (acc); })",
         file="kernorch/codegen/c/prelude.py"),
    here("a tap block skips its last tap",
         "{tap} < ko_{tap} + {block}; {tap}++",
         "{tap} < ko_{tap} + {block} - 1; {tap}++",
         file="kernorch/codegen/c/loops.py"),
    here("a tap's range along a reversed axis ends one column short",
         "to_tree((terms, constant + 1), ranges), -c))",
         "to_tree((terms, constant), ranges), -c))"),
    here("an NCHW window's taps start at column 0 whatever their lower bound",
         "if (ko_b {keep} {end}) {end} = ko_b;",
         "if (ko_b {keep} {end} && {int(not bound.lower)}) {end} = ko_b;",
         file="kernorch/codegen/c/loops.py"),
    here("the ceiling division rounds a positive quotient down",
         "return a > 0 ? (a + b - 1) / b : -((-a) / b); }",
         "return a > 0 ? a / b : -((-a) / b); }",
         file="kernorch/codegen/c/prelude.py"),
    here("an rTask's extremum opens a parallel region inside its task",
         "if op.reduction.shared and not self.tasks:", "if op.reduction.shared:",
         file="kernorch/codegen/c/render.py"),
    here("a short extremum is shared out too",
         "taps >= SHARED_EXTREMUM_MIN_TAPS:", "taps >= 0:"),
]  # fmt: skip
