"""Index-set splitting: the loops it emits, and the numbers they compute against the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.codegen.backends import GENERATED_C
from kernorch.devtools.mutate import here
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`


def _run(graph: Graph, feeds: dict[str, np.ndarray]) -> tuple[str, np.ndarray, np.ndarray]:
    kernel = make_kernel(graph, tuple(range(len(graph.nodes))), tuple(graph.outputs))
    got = PlanExecutor(graph, [kernel])(feeds)[graph.outputs[0]]
    return GENERATED_C.source("k", kernel), got, run_reference(graph, feeds)[graph.outputs[0]]


def test_a_concat_along_the_innermost_axis_is_one_branch_free_copy_per_piece() -> None:
    graph = Graph(inputs=["a", "b", "c"], outputs=[])
    widths = {"a": 24, "b": 40, "c": 8}
    for name, width in widths.items():
        graph.types[name] = TensorType((1, 33, 17, width), "float32")
    builder = PrimitiveBuilder(graph)
    (joined,) = builder.emit("concat", ["a", "b", "c"], {"axis": 3})
    (y,) = builder.emit("relu", [joined])
    graph.outputs = [y]
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((1, 33, 17, w)).astype(np.float32) for n, w in widths.items()}
    source, got, want = _run(graph, feeds)
    for begin, end in ((0, 24), (24, 64), (64, 72)):
        assert f"= {begin}; " in source and f"< {end}; " in source, source
    assert "if (" not in source.split("schedule(static)")[1], source  # no select left in the loops
    np.testing.assert_array_equal(got, want)


def test_a_constant_pad_of_the_innermost_axis_has_a_check_free_interior() -> None:
    graph = Graph(inputs=["x"], outputs=[])
    graph.types["x"] = TensorType((64, 100), "float32")
    builder = PrimitiveBuilder(graph)
    (padded,) = builder.emit("pad", ["x"], {"pads": (0, 3, 0, 5), "mode": "constant", "value": 1.5})
    (y,) = builder.emit("exp", [padded])
    graph.outputs = [y]
    feeds = {"x": np.random.default_rng(1).standard_normal((64, 100)).astype(np.float32)}
    source, got, want = _run(graph, feeds)
    assert "= 3; " in source and "< 103; " in source, source  # the interior loop
    np.testing.assert_allclose(got, want, rtol=2e-7)


def test_selects_on_an_outer_axis_are_left_alone() -> None:
    graph = Graph(inputs=["a", "b"], outputs=[])
    graph.types.update(a=TensorType((3, 64), "float32"), b=TensorType((5, 64), "float32"))
    builder = PrimitiveBuilder(graph)
    (joined,) = builder.emit("concat", ["a", "b"], {"axis": 0})
    (y,) = builder.emit("neg", [joined])
    graph.outputs = [y]
    rng = np.random.default_rng(2)
    feeds = {"a": rng.standard_normal((3, 64)).astype(np.float32), "b": rng.standard_normal((5, 64)).astype(np.float32)}
    source, got, want = _run(graph, feeds)
    np.testing.assert_array_equal(got, want)


def test_a_reflecting_pad_is_cut_into_mirrored_borders_and_a_unit_stride_interior() -> None:
    """candy's input: [1, 3, H, W] reflect-padded by 4 and laid out channels-last. The vectorized loop runs over
    the padded width around the unrolled channels; each border mirrors, the interior reads w - 4; the row's
    reflection is hoisted out of the loops."""
    graph = Graph(inputs=["x"], outputs=[])
    graph.types["x"] = TensorType((1, 3, 20, 37), "float32")
    builder = PrimitiveBuilder(graph)
    (padded,) = builder.emit("pad", ["x"], {"pads": (0, 0, 4, 4, 0, 0, 4, 4), "mode": "reflect"})
    (y,) = builder.emit("transpose", [padded], {"perm": (0, 2, 3, 1)})
    graph.outputs = [y]
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 3, 20, 37)).astype(np.float32)}
    source, got, want = _run(graph, feeds)
    loops = [line.strip() for line in source.splitlines() if line.strip().startswith("for (int64_t l2")]
    assert loops == ["for (int64_t l2 = 0; l2 < 4; l2++) {", "for (int64_t l2 = 4; l2 < 41; l2++) {",
                     "for (int64_t l2 = 41; l2 < 45; l2++) {"], source  # fmt: skip
    pieces = [source[source.index(a): source.index(b)] for a, b in (("l2 = 0;", "l2 = 4;"), ("l2 = 4;", "l2 = 41;"),
                                                                  ("l2 = 41;", "return err"))]  # fmt: skip
    assert "+ (l2 + -4))]" in pieces[1]  # no select left on the width: only the height's reflection, per row
    # the height's reflection is invariant along the vector loops: computed once per row before each piece's
    # loop, no select left inside the loop bodies
    selects = [line.strip() for line in source.splitlines() if "?" in line]
    assert len(selects) == 3 and all(line.startswith("const int64_t ko_i") for line in selects), source
    np.testing.assert_array_equal(got, want)
    kernel = make_kernel(graph, tuple(range(len(graph.nodes))), tuple(graph.outputs))
    as_tasks = PlanExecutor(graph, [kernel], runtime="rprogram")(feeds)[graph.outputs[0]]
    np.testing.assert_array_equal(as_tasks, want)  # the rTask variant of the same loops


def test_a_channels_last_reflecting_pad_keeps_its_width_inside_the_vector_loop() -> None:
    """The same pad on a channels-last [1, H, W, 3] input: the width (the vector loop around the unrolled
    channels) and the row's reflection sum into one address; only the row's part is hoisted (hoisting the
    width's term too read the vector loop's variable before its loop: a compile error)."""
    graph = Graph(inputs=["x"], outputs=[])
    graph.types["x"] = TensorType((1, 20, 37, 3), "float32")
    builder = PrimitiveBuilder(graph)
    (padded,) = builder.emit("pad", ["x"], {"pads": (0, 4, 4, 0, 0, 4, 4, 0), "mode": "reflect"})
    (y,) = builder.emit("relu", [padded])
    graph.outputs = [y]
    feeds = {"x": np.random.default_rng(4).standard_normal((1, 20, 37, 3)).astype(np.float32)}
    source, got, want = _run(graph, feeds)
    hoisted = [line.strip() for line in source.splitlines() if line.strip().startswith("const int64_t ko_i")]
    assert hoisted and not any("l2" in line for line in hoisted), source
    np.testing.assert_array_equal(got, want)


def test_a_row_hoisted_before_a_guarded_branch_is_still_declared() -> None:
    """reflect_pad(x) + constant_pad(z) along the rows: x's mirrored row is hoisted, then z's guarded load
    renders a branch of its own (a nested body); the row's constant must survive it (it was lost: an
    undeclared `ko_i` and a compile error)."""
    graph = Graph(inputs=["x", "z"], outputs=[])
    for name in ("x", "z"):
        graph.types[name] = TensorType((1, 22, 8, 16), "float32")
    builder = PrimitiveBuilder(graph)
    pads = (0, 1, 0, 0, 0, 1, 0, 0)
    (mirrored,) = builder.emit("pad", ["x"], {"pads": pads, "mode": "reflect"})
    (zeroed,) = builder.emit("pad", ["z"], {"pads": pads, "mode": "constant", "value": 0.0})
    graph.outputs = builder.emit("add", [mirrored, zeroed])
    rng = np.random.default_rng(5)
    feeds = {name: rng.standard_normal((1, 22, 8, 16)).astype(np.float32) for name in ("x", "z")}
    source, got, want = _run(graph, feeds)
    assert "const int64_t ko_i" in source and "if (" in source, source
    np.testing.assert_array_equal(got, want)


def test_a_concat_of_many_maps_is_still_one_copy_per_piece() -> None:
    """densenet121's third block: the channels-last concat of 25 maps of 32 channels, then its next layer's
    BatchNorm scale and ReLU. 25 pieces, each a loop of its own (through the nested selects the copy ran at
    ~3 GB/s); NaN, infinities and extremes pass through as the reference has them."""
    graph = Graph(inputs=[f"x{i}" for i in range(25)], outputs=[])
    for name in graph.inputs:
        graph.types[name] = TensorType((1, 4, 4, 32), "float32")
    graph.types["scale"] = TensorType((800,), "float32")
    graph.constants["scale"] = np.linspace(-2.0, 2.0, 800, dtype=np.float32)
    builder = PrimitiveBuilder(graph)
    (joined,) = builder.emit("concat", list(graph.inputs), {"axis": 3})
    (scaled,) = builder.emit("mul", [joined, "scale"])
    graph.outputs = builder.emit("relu", [scaled])
    rng = np.random.default_rng(6)
    feeds = {name: rng.standard_normal((1, 4, 4, 32)).astype(np.float32) for name in graph.inputs}
    feeds["x3"][0, 1, 2, :4] = np.array([np.nan, np.inf, -np.inf, np.finfo(np.float32).max], dtype=np.float32)
    source, got, want = _run(graph, feeds)
    for piece in range(25):
        assert f"= {32 * piece}; " in source and f"< {32 * piece + 32}; " in source, piece
    assert "(l3 < " not in source, source  # no select on the channel left in the loops
    np.testing.assert_array_equal(got, want)


def test_shifted_windows_read_the_channels_unit_stride() -> None:
    """swin's window reverse and cyclic shift: [1, 4 windows, 9, C] → [1, 2, 2, 3, 3, C] → transpose →
    [1, 6, 6, C], rolled by slices and concats along both spatial axes, plus the residual. Every branch's load
    divides only the pixel, never the channel (it ran at 1.5 GB/s with the channel inside each division)."""
    graph = Graph(inputs=["x", "r"], outputs=[])
    graph.types.update(x=TensorType((1, 4, 9, 8), "float32"), r=TensorType((1, 6, 6, 8), "float32"))
    builder = PrimitiveBuilder(graph)
    (windows,) = builder.emit("reshape", ["x"], {"shape": (1, 2, 2, 3, 3, 8)})
    (moved,) = builder.emit("transpose", [windows], {"perm": (0, 1, 3, 2, 4, 5)})
    (image,) = builder.emit("reshape", [moved], {"shape": (1, 6, 6, 8)})
    rolled = image
    for axis in (1, 2):
        whole = [(0, 1, 1), (0, 6, 1), (0, 6, 1), (0, 8, 1)]
        tail, head = list(whole), list(whole)
        tail[axis], head[axis] = (5, 6, 1), (0, 5, 1)
        (last,) = builder.emit("slice", [rolled], {"ranges": tuple(tail)})
        (first,) = builder.emit("slice", [rolled], {"ranges": tuple(head)})
        (rolled,) = builder.emit("concat", [last, first], {"axis": axis})
    graph.outputs = builder.emit("add", ["r", rolled])
    rng = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal((1, 4, 9, 8)).astype(np.float32),
             "r": rng.standard_normal((1, 6, 6, 8)).astype(np.float32)}  # fmt: skip
    feeds["x"][0, 3, 8, :3] = np.array([np.nan, np.inf, -np.inf], dtype=np.float32)
    source, got, want = _run(graph, feeds)
    loads = [line for line in source.splitlines() if "inp0[" in line]
    assert len(loads) == 4 and not any("l3) /" in line or "l3) %" in line for line in loads), source
    np.testing.assert_array_equal(got, want)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a split range decides a select one element off",
         'return (c * v + k < t) == (op == "<")',
         'return (c * v + k <= t) == (op == "<")',
         tests=("kernorch/codegen/loops/splitting_test.py",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference")),
    here("index-set splitting gives up on a concat of more than eight maps",
         "MAX_PIECES = 64",
         "MAX_PIECES = 8"),
]  # fmt: skip
