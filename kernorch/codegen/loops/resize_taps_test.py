"""Resize taps: the periodic form of an integer-factor upsampling reproduces the reference map, and a kernel
upsampling its innermost axis runs residue by residue with unit-stride reads, computing the reference's
numbers."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kernorch
from kernorch.codegen.backends import GENERATED_C
from kernorch.codegen.loops.resize_taps import periodic_taps, resize_taps
from kernorch.devtools.mutate import here
from kernorch.ir import reference_kernels as K
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference
from kernorch.tools.check import run_onnxruntime

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`


def _rules(size_in: int, factor: int, mode: str = "linear", coordinates: str = "half_pixel") -> tuple:
    return size_in, size_in * factor, float(factor), mode, coordinates, "round_prefer_floor", -0.75, False


@pytest.mark.parametrize("factor", [2, 3, 4, 8])
@pytest.mark.parametrize(("mode", "coordinates"), [("linear", "half_pixel"), ("cubic", "half_pixel"),
                                                   ("linear", "asymmetric"), ("nearest", "asymmetric"),
                                                   ("linear", "pytorch_half_pixel")])  # fmt: skip
def test_the_periodic_taps_reproduce_the_reference_resize(factor: int, mode: str, coordinates: str) -> None:
    """Inside [low, size - high) every output's row of the table is the pattern's, shifted by q, no tap off
    the axis; with the table's rows at the borders the resize is the reference's."""
    rules = _rules(11, factor, mode, coordinates)
    periodic, table = periodic_taps(*rules), resize_taps(*rules)
    assert periodic is not None and table is not None
    found, offsets, weights, low, high = periodic
    assert found == factor and offsets.shape == weights.shape and offsets.shape[0] == factor
    assert low + high < 11
    out = np.arange(11 * factor)
    q, r = out // factor, out % factor
    inside = (q >= low) & (q < 11 - high)
    np.testing.assert_array_equal(table[0][inside], q[inside, None] + offsets[r[inside]])
    np.testing.assert_allclose(table[1][inside], weights[r[inside]], rtol=0, atol=1e-6)
    assert (table[0] >= 0).all() and (table[0] < 11).all()
    x = np.random.default_rng(0).standard_normal(11)
    taps = np.where(inside[:, None], q[:, None] + offsets[r], table[0])
    rebuilt = (np.where(inside[:, None], weights[r], table[1]) * x[taps]).sum(axis=1)
    np.testing.assert_allclose(rebuilt, K.resize_axis(x, 0, *rules[1:]), rtol=1e-6, atol=1e-6)


def test_align_corners_and_downsampling_have_no_periodic_taps() -> None:
    assert periodic_taps(*_rules(11, 2, "linear", "align_corners")) is None  # the pattern drifts along the axis
    assert periodic_taps(16, 8, 0.5, "linear", "half_pixel", "round_prefer_floor", -0.75, False) is None
    assert resize_taps(*_rules(11, 2)) is not None


def upsampling(shape: tuple[int, ...], factor: int, mode: str, then_add: bool) -> Graph:
    """x [.., W] resized to [.., factor·W] along its innermost axis (and optionally + z)."""
    out = (*shape[:-1], shape[-1] * factor)
    graph = Graph(inputs=["x", "z"] if then_add else ["x"], outputs=["y"])
    graph.types["x"] = TensorType(shape, "float32")
    attrs = (("sizes", out), ("scales", (1.0,) * (len(shape) - 1) + (float(factor),)), ("mode", mode),
             ("coordinate_mode", "half_pixel"), ("nearest_mode", "round_prefer_floor"), ("cubic_coeff_a", -0.75),
             ("exclude_outside", False))  # fmt: skip
    graph.nodes.append(Node("resize", ("x",), ("r" if then_add else "y",), attrs))
    graph.types["r" if then_add else "y"] = TensorType(out, "float32")
    if then_add:
        graph.types["z"] = graph.types["y"] = TensorType(out, "float32")
        graph.nodes.append(Node("add", ("r", "z"), ("y",), ()))
    return graph


@pytest.mark.parametrize(("factor", "mode", "then_add"), [(2, "linear", False), (4, "linear", True),
                                                          (8, "linear", False), (2, "cubic", False)])  # fmt: skip
def test_an_innermost_upsampling_runs_residue_by_residue(factor: int, mode: str, then_add: bool) -> None:
    """Rows of 24 inputs: too long for one register, too short for two (rows of 16 and 32 are permuted in
    registers instead: row_permute_test.py)."""
    graph = upsampling((2, 3, 5, 24), factor, mode, then_add)
    kernel = make_kernel(graph, tuple(range(len(graph.nodes))), ("y",))
    source = GENERATED_C.source("k", kernel)
    assert f"#pragma GCC unroll {factor}" in source, source  # the residues, around a loop over 24 inputs
    assert f"[{24 * factor * (4 if mode == 'cubic' else 2)}]" not in source, source  # no table of taps per output
    assert "simd reduction" not in source, source  # nothing in the loops sets err
    feeds = {name: np.random.default_rng(1).standard_normal(graph.types[name].shape).astype(np.float32)
             for name in graph.inputs}  # fmt: skip
    got = PlanExecutor(graph, [kernel])(feeds)["y"]
    np.testing.assert_allclose(got, run_reference(graph, feeds)["y"], rtol=1e-5, atol=1e-6)


def test_a_short_axis_keeps_its_table() -> None:
    """Three inputs along the axis leave too short a loop to vectorize: the taps stay a lookup table."""
    graph = upsampling((2, 3, 5, 3), 2, "linear", False)
    kernel = make_kernel(graph, (0,), ("y",))
    source = GENERATED_C.source("k", kernel)
    assert "#pragma GCC unroll" not in source and "[12]" in source, source
    x = np.random.default_rng(2).standard_normal((2, 3, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(PlanExecutor(graph, [kernel])({"x": x})["y"], run_reference(graph, {"x": x})["y"],
                               rtol=1e-5, atol=1e-6)  # fmt: skip


def two_factor_upsampling(width: int) -> Graph:
    """A [.., width] map quadrupled plus a [.., 2·width] map doubled along the innermost axis."""
    out = (1, 2, 4, 4 * width)
    graph = Graph(inputs=["a", "b"], outputs=["y"])
    graph.types.update(a=TensorType((1, 2, 4, width), "float32"), b=TensorType((1, 2, 4, 2 * width), "float32"))
    for source, factor, resized in (("a", 4, "ra"), ("b", 2, "rb")):
        attrs = (("sizes", out), ("scales", (1.0, 1.0, 1.0, float(factor))), ("mode", "linear"),
                 ("coordinate_mode", "half_pixel"), ("nearest_mode", "round_prefer_floor"), ("cubic_coeff_a", -0.75),
                 ("exclude_outside", False))  # fmt: skip
        graph.nodes.append(Node("resize", (source,), (resized,), attrs))
        graph.types[resized] = TensorType(out, "float32")
    graph.nodes.append(Node("add", ("ra", "rb"), ("y",), ()))
    graph.types["y"] = TensorType(out, "float32")
    return graph


def test_two_factors_on_one_axis_split_it_by_their_least_common_multiple() -> None:
    """A [.., 12] map quadrupled plus a [.., 24] map doubled: the width loop runs 4 residues, the doubling
    reading input 2q + r // 2 for residue r."""
    graph = two_factor_upsampling(12)
    kernel = make_kernel(graph, (0, 1, 2), ("y",))
    assert "#pragma GCC unroll 4" in GENERATED_C.source("k", kernel)
    rng = np.random.default_rng(3)
    feeds = {name: rng.standard_normal(graph.types[name].shape).astype(np.float32) for name in graph.inputs}
    np.testing.assert_allclose(PlanExecutor(graph, [kernel])(feeds)["y"], run_reference(graph, feeds)["y"],
                               rtol=1e-5, atol=1e-6)  # fmt: skip


def test_tables_grow_linearly_with_the_sizes() -> None:
    """A 20 000 -> 40 000 linear upsampling: its taps without a [size_out, size_in] matrix (6.4 GB in float64;
    ~17 MiB traced here, and five times that at five times the sizes), equal to the dense definition on a small
    case."""
    import tracemalloc

    tracemalloc.start()
    table = resize_taps(20_000, 40_000, 2.0, "linear", "half_pixel", "round_prefer_floor", -0.75, False)
    periodic = periodic_taps(20_000, 40_000, 2.0, "linear", "half_pixel", "round_prefer_floor", -0.75, False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert table is not None and table[0].shape == (40_000, 2) and periodic is not None and periodic[0] == 2
    assert peak < 40 * 2**20
    for mode, size_in, size_out, scale in (("cubic", 7, 12, 12 / 7), ("linear", 9, 4, 4 / 9), ("nearest", 5, 11, 2.2)):
        table = resize_taps(size_in, size_out, scale, mode, "half_pixel", "round_prefer_floor", -0.75, True)
        assert table is not None
        taps, weights = table
        dense = K.resize_axis(np.eye(size_in), 0, size_out, scale, mode, "half_pixel", "round_prefer_floor", -0.75,
                              True)  # fmt: skip
        rebuilt = np.zeros((size_out, size_in))
        np.add.at(rebuilt, (np.repeat(np.arange(size_out), taps.shape[1]), taps.reshape(-1)), weights.reshape(-1))
        np.testing.assert_allclose(rebuilt, dense, atol=1e-7)


def test_a_table_holds_every_tap_onnxruntime_reads() -> None:
    """asymmetric x2 over 3 inputs: a grid point reads its right neighbour at weight 0 (0 · NaN is NaN), and
    the pairs clamped to the last input weigh it 0.5 and 0.5 (an inf there stays inf); a nearest resize reads
    one tap."""
    table = resize_taps(3, 6, 2.0, "linear", "asymmetric", "round_prefer_floor", -0.75, False)
    assert table is not None
    np.testing.assert_array_equal(table[0], [[0, 1], [0, 1], [1, 2], [1, 2], [2, 2], [2, 2]])
    np.testing.assert_array_equal(table[1], [[1, 0], [0.5, 0.5], [1, 0], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    table = resize_taps(1, 2, 2.0, "linear", "half_pixel", "round_prefer_floor", -0.75, False)
    assert table is not None
    np.testing.assert_array_equal(table[1], [[0.5, 0.5], [0.5, 0.5]])  # an axis of one input
    table = resize_taps(3, 6, 2.0, "nearest", "asymmetric", "floor", -0.75, False)
    assert table is not None and table[0].shape == (6, 1)


def _align_corners_upsampling() -> Graph:
    """[1, 2, 5, 6] -> [1, 2, 9, 11], align_corners: no periodic taps, every row a table lookup, and the grid
    points (weight 1 on one input) reading their next input at weight 0."""
    graph = Graph(inputs=["x"], outputs=["y"])
    graph.types.update(x=TensorType((1, 2, 5, 6), "float32"), y=TensorType((1, 2, 9, 11), "float32"))
    attrs = (("sizes", (1, 2, 9, 11)), ("scales", (1.0, 1.0, 9 / 5, 11 / 6)), ("mode", "linear"),
             ("coordinate_mode", "align_corners"), ("nearest_mode", "round_prefer_floor"), ("cubic_coeff_a", -0.75),
             ("exclude_outside", False))  # fmt: skip
    graph.nodes.append(Node("resize", ("x",), ("y",), attrs))
    return graph


def test_a_nan_reaches_the_outputs_whose_taps_read_it() -> None:
    graph = _align_corners_upsampling()
    kernel = make_kernel(graph, (0,), ("y",))
    x = np.random.default_rng(6).standard_normal((1, 2, 5, 6)).astype(np.float32)
    x[0, 0, 0, 0] = x[0, 1, 4, 5] = np.nan  # the first and the last element
    x[0, 0, 2, 3] = np.inf  # a grid point's: its zero-weight neighbours' outputs are NaN (0 · inf)
    got = PlanExecutor(graph, [kernel])({"x": x})["y"]
    expected = run_reference(graph, {"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-5, atol=1e-6)


# (input shape, scales, mode, coordinates): a table per output (short rows, align_corners, downsampling), the
# residue loops (rows of 16, 24 and 32: unrolled residues in the compiled source; rows of 16 and 32 are also the
# lengths gir/row_permute.py holds in registers, whose own tests are row_permute_test.py), cubic taps
SPREADS = [((1, 2, 4, 4), (1, 1, 8, 8), "linear", "half_pixel"),
           ((1, 2, 5, 6), (1, 1, 9 / 5, 11 / 6), "linear", "align_corners"),
           ((1, 2, 8, 8), (1, 1, 0.5, 0.5), "linear", "half_pixel"),
           ((1, 2, 3, 24), (1, 1, 2, 2), "linear", "half_pixel"),
           ((1, 2, 3, 24), (1, 1, 2, 4), "linear", "asymmetric"),
           ((1, 2, 4, 16), (1, 1, 2, 8), "linear", "half_pixel"),
           ((1, 2, 2, 32), (1, 1, 4, 4), "linear", "pytorch_half_pixel"),
           ((1, 2, 4, 24), (1, 1, 2, 2), "cubic", "half_pixel")]  # fmt: skip


@pytest.mark.parametrize(("shape", "scales", "mode", "coordinates"), SPREADS)
def test_nan_and_inf_in_a_resize_spread_as_in_onnxruntime(shape: tuple[int, ...], scales: tuple[float, ...],
                                                          mode: str, coordinates: str) -> None:  # fmt: skip
    """NaN and ±inf at the corners, on the borders and inside reach exactly the outputs onnxruntime's do: it
    reads every tap, a zero weight's too, and weighs a clamped linear pair half and half."""
    out = tuple(int(np.floor(s * d)) for s, d in zip(scales, shape, strict=True))
    scale_tensor = numpy_helper.from_array(np.array(scales, np.float32), "scales")
    roi = numpy_helper.from_array(np.array([], np.float32), "roi")
    nodes = [helper.make_node("Add", ["x", "x"], ["d"]),  # something to fuse the resize with
             helper.make_node("Resize", ["d", "roi", "scales"], ["y"], mode=mode,
                              coordinate_transformation_mode=coordinates)]  # fmt: skip
    graph = helper.make_graph(nodes, "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                              [scale_tensor, roi])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    compiled = kernorch.compile(model, threads=1, cost="analytic")
    rng = np.random.default_rng(7)
    for _ in range(4):
        x = rng.standard_normal(shape).astype(np.float32)
        h, w = shape[2:]
        for at, special in zip(((0, 0), (h - 1, w - 1), (0, w - 1), (h // 2, w // 2), (h - 1, 0)),
                               rng.choice([np.nan, np.inf, -np.inf], 5), strict=True):  # fmt: skip
            x[0, int(rng.integers(2)), *at] = special
        x[0, 1, int(rng.integers(h)), int(rng.integers(w))] = rng.choice([np.nan, np.inf])
        got = compiled.run({"x": x})["y"]
        expected = run_onnxruntime(model, {"x": x})["y"]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        np.testing.assert_array_equal(np.isposinf(got), np.isposinf(expected))
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected))
        finite = np.isfinite(expected)
        np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-5, atol=1e-5)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("an upsampling's border at the axis end starts one input late",
         'lit(size_in - high)), tail, head)',
         'lit(size_in - high + 1)), tail, head)',
         file="kernorch/codegen/loops/description.py"),
    here("an upsampling's periodic taps are not checked against the reference map",
         "    if not matches:\n        return None",
         "    if False:\n        return None"),
    here("a clamped linear pair weighs its position 1 and 0 (an inf there becomes NaN)",
         "weights[taps[:, 0] == taps[:, 1]] = 0.5",
         "weights[taps[:, 0] == taps[:, 1]] = weights[taps[:, 0] == taps[:, 1]]",
         file="kernorch/ir/reference_kernels.py"),
    here("align_corners divides by a length off the output size by float32 rounding (grid points move a tap)",
         "            length = out_size\n",
         "            length = length\n",
         file="kernorch/ir/reference_kernels.py"),
    here("an upsampling's borders read the pattern's weights",
         'position = ("sel", border, add(in_border, lit(weights.size)), position)',
         "pass",
         file="kernorch/codegen/loops/description.py"),
]  # fmt: skip
