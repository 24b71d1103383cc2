"""separate-window-axes: one pool per windowed axis, outermost first, computing the same. pool-before-clamp: a
clamp before a max pool moves after it, NaN and infinities included."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.devtools.mutate import here
from kernorch.options import Options
from kernorch.pipeline import compile_plan, import_graph, plan_graph
from kernorch.runtime import run_reference
from kernorch.testing.models import random_array
from kernorch.testing.rewrite import assert_equivalent, build, const, emit, prims, rewrite_with
from kernorch.tools.check import run_onnxruntime


@pytest.mark.parametrize("prim", ["window_max", "window_sum"])
@pytest.mark.parametrize(("source", "kernel", "strides", "pads", "dilations", "ceil_mode"), [
    ((1, 3, 12, 12), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),  # a ResNet/ShuffleNet stem pool
    ((2, 2, 9, 11), (2, 3), (2, 1), (0, 1, 1, 0), (1, 1), True),  # uneven pads, a window past the end
    ((1, 2, 10, 7), (3, 2), (1, 2), (0, 0, 0, 0), (2, 1), False),  # dilated
    ((1, 1, 5, 6, 7), (2, 3, 2), (1, 2, 2), (1, 1, 0, 0, 1, 1), (1, 1, 1), True),  # three axes
    ((1, 12, 12, 3), (3, 3, 1), (2, 2, 1), (1, 1, 0, 1, 1, 0), (1, 1, 1), False),  # channels-last: C untouched
])  # fmt: skip
def test_a_pool_over_several_axes_becomes_one_per_axis(
        prim: str, source: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...], pads: tuple[int, ...],
        dilations: tuple[int, ...], ceil_mode: bool) -> None:  # fmt: skip
    graph = build({"x": source}, lambda b: emit(b, prim, "x", kernel=kernel, strides=strides, pads=pads,
                                                dilations=dilations, ceil_mode=ceil_mode))  # fmt: skip
    rewritten, fired = rewrite_with(graph, "separate-window-axes")
    windowed = [i for i, k in enumerate(kernel) if k > 1]
    assert fired == ["separate-window-axes"] and prims(rewritten) == [prim] * len(windowed)
    # outermost windowed axis first, each pass windowing exactly one axis
    assert [[i for i, k in enumerate(node.attr("kernel")) if k > 1] for node in rewritten.nodes] == \
        [[i] for i in windowed]  # fmt: skip
    assert_equivalent(graph, rewritten, rtol=1e-5)



@pytest.mark.parametrize("prim", ["window_max", "window_sum"])
@pytest.mark.parametrize(("kernel", "strides", "fires"), [
    ((3, 3), (1, 1), False),  # a token mixer's 3x3/1 pool: one pass
    ((3, 2), (1, 1), False),
    ((5, 5), (1, 1), True),  # wider: 10 of 25 taps per output
    ((3, 3), (2, 1), True),  # strided along one axis
])  # fmt: skip
def test_a_small_unstrided_window_stays_one_pass(prim: str, kernel: tuple[int, int], strides: tuple[int, int],
                                                 fires: bool) -> None:  # fmt: skip
    graph = build({"x": (1, 4, 10, 9)}, lambda b: emit(b, prim, "x", kernel=kernel, strides=strides,
                                                        pads=(1, 1, 1, 1), dilations=(1, 1), ceil_mode=False))
    rewritten, fired = rewrite_with(graph, "separate-window-axes")
    assert fired == (["separate-window-axes"] if fires else [])
    assert prims(rewritten) == [prim] * (2 if fires else 1)
    assert_equivalent(graph, rewritten, rtol=1e-5)


STEM_POOL = {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "dilations": (1, 1), "ceil_mode": False}


def _edge_values(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Normal values with NaN, ±inf, -0.0 and a run of negatives (a window whose clamp is its bound)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=4 * max(1, flat.size // 40), replace=False)
    for i, value in zip(picks, [np.nan, np.inf, -np.inf, -0.0] * len(picks), strict=False):
        flat[i] = value
    flat[: flat.size // 8] = -np.abs(flat[: flat.size // 8]) - 1  # whole windows below zero
    return x


@pytest.mark.parametrize(("clamp", "bound"), [("relu", None), ("max", 0.0), ("min", 6.0), ("max", -0.5)])
@pytest.mark.parametrize(("source", "pool"), [
    ((1, 4, 12, 12), STEM_POOL),  # ResNet's stem: 3x3/2, pads 1
    ((2, 3, 9, 11), {"kernel": (2, 3), "strides": (2, 3), "pads": (0, 1, 1, 0), "dilations": (1, 1),
                     "ceil_mode": True}),  # uneven pads, a window past the end
    ((1, 9, 9, 5), {"kernel": (3, 3, 1), "strides": (2, 2, 1), "pads": (1, 1, 0, 1, 1, 0), "dilations": (1, 1, 1),
                    "ceil_mode": False}),  # channels-last
])  # fmt: skip
def test_a_clamp_before_a_strided_max_pool_moves_after_it(clamp: str, bound: float | None, source: tuple[int, ...],
                                                           pool: dict) -> None:  # fmt: skip
    def body(b):  # type: ignore[no-untyped-def]
        operands = ["x"] if bound is None else ["x", const(b, bound)]
        return emit(b, "window_max", emit(b, clamp, *operands), **pool)

    graph = build({"x": source}, body)
    rewritten, fired = rewrite_with(graph, "pool-before-clamp")
    assert fired == ["pool-before-clamp"] and prims(rewritten) == ["window_max", clamp]
    for seed in range(3):
        x = _edge_values(source, seed)
        (expected,), (actual,) = (run_reference(g, {"x": x}).values() for g in (graph, rewritten))
        np.testing.assert_array_equal(actual, expected)  # NaN where NaN, the same infinities, bit for bit else


def test_a_clamp_stays_where_moving_it_saves_nothing_or_changes_a_value() -> None:
    unstrided = {**STEM_POOL, "strides": (1, 1)}  # as many outputs as inputs
    # along the last axis (one element) the one window's taps are -1 and 1: padding alone; the first axis halves
    padding_alone = {"kernel": (2, 2), "strides": (2, 1), "pads": (0, 1, 0, 1), "dilations": (1, 2),
                     "ceil_mode": False}  # fmt: skip
    cases = [
        build({"x": (1, 2, 8, 8)}, lambda b: emit(b, "window_max", emit(b, "relu", "x"), **unstrided)),
        # a window reading only padding pools to -inf; relu after it would make 0
        build({"x": (1, 2, 4, 1)}, lambda b: emit(b, "window_max", emit(b, "relu", "x"), **padding_alone)),
        # a clamp by a tensor, not a scalar: computed, or a constant that varies over the pooled pixels
        build({"x": (1, 2, 8, 8), "y": (1, 2, 8, 8)},
              lambda b: emit(b, "window_max", emit(b, "max", "x", "y"), **STEM_POOL)),
        build({"x": (1, 2, 8, 8)}, lambda b: emit(b, "window_max", emit(
            b, "min", "x", const(b, np.linspace(-1, 1, 128).reshape(1, 2, 8, 8))), **STEM_POOL)),
        # the clamped value is used twice: both would be computed
        build({"x": (1, 2, 8, 8)}, lambda b: (lambda r: [emit(b, "window_max", r, **STEM_POOL), r])(
            emit(b, "relu", "x"))),
    ]  # fmt: skip
    for graph in cases:
        rewritten, fired = rewrite_with(graph, "pool-before-clamp")
        assert fired == [] and prims(rewritten) == prims(graph)


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
def test_the_compiled_plan_of_a_clamp_moved_past_a_conv_stem_pool_matches(layout: str) -> None:
    """Conv -> Clip(0, 6) -> MaxPool 3x3/2 rewritten, then planned and compiled to C: the reference's values (NaN in
    a window is NaN, kernorch's documented choice; an infinity makes NaN in the conv), and onnxruntime's where
    every value is finite (its MaxPool skips NaN)."""
    weights = numpy_helper.from_array(random_array((8, 3, 3, 3), seed=3), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "low", "high"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])]
    bounds = [numpy_helper.from_array(np.array(v, np.float32), n) for v, n in ((0.0, "low"), (6.0, "high"))]
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 13, 13])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 7, 7])],
                              [weights, *bounds])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    imported = import_graph(model)
    rewritten, fired = rewrite_with(imported, "pool-before-clamp")
    assert fired == ["pool-before-clamp"] * 2 and prims(rewritten)[-3:] == ["window_max", "max", "min"]
    options = Options(cost="analytic", rewrite=False, layout=layout)
    compiled = compile_plan(plan_graph(rewritten, options), options)
    for seed, finite in ((0, True), (1, False)):
        x = _edge_values((1, 3, 13, 13), seed) * 4
        if finite:
            x[~np.isfinite(x)] = 1.5
        actual = compiled.run({"x": x})["y"]
        np.testing.assert_allclose(actual, run_reference(imported, {"x": x})["y"], rtol=1e-5, atol=1e-5)
        assert np.isnan(actual).any() != finite and (actual == 6).any() and (actual == 0).any()  # every edge met
        if finite:
            np.testing.assert_allclose(actual, run_onnxruntime(model, {"x": x})["y"], rtol=1e-5, atol=1e-5)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a pool separated per axis swaps its begin and end pads",
         '"pads": _along(pads[:spatial], axis, 0) + _along(pads[spatial:], axis, 0)}',
         '"pads": _along(pads[spatial:], axis, 0) + _along(pads[:spatial], axis, 0)}'),
    here("a small unstrided window is separated into one pass per axis (its intermediate cold in place)",
         "SMALL_WINDOW = 3",
         "SMALL_WINDOW = 0"),
    here("a clamp moves past a pool whose window reads padding alone (-inf clamped)",
         "if not any(0 <= start + tap * dilations[axis] < size for tap in range(kernel[axis])):",
         "if not any(-size <= start + tap * dilations[axis] < 2 * size for tap in range(kernel[axis])):"),
    here("a clamp by a constant tensor moves past the pool (its bound varies over the pooled pixels)",
         "if len(bounds) != 1 or len(data) != 1 or bounds[0].size != 1:",
         "if len(bounds) != 1 or len(data) != 1:"),
    here("a clamp whose value is used elsewhere moves (both computed)",
         "if clamp is None or clamp.prim not in CLAMPS or not ctx.single_use(source)",
         "if clamp is None or clamp.prim not in CLAMPS"),
]  # fmt: skip
