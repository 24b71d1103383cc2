"""sum-of-convs: the primitives left and numerical equality; the branches it must leave apart."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kernorch.devtools.mutate import here
from kernorch.testing.rewrite import assert_equivalent, build, const, emit, prims, rewrite_with


def conv(b: Any, x: str, weight: np.ndarray, pads: tuple[int, ...], strides: tuple[int, int] = (1, 1),
         group: int = 1, dilations: tuple[int, int] = (1, 1)) -> str:  # fmt: skip
    return emit(b, "conv", x, const(b, weight), group=group, strides=strides, dilations=dilations, pads=pads)


def weights(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("strides", [(1, 1), (2, 2)])
@pytest.mark.parametrize("group", [1, 4])
def test_a_3x3_and_a_1x1_branch_with_biases_are_one_conv(strides: tuple[int, int], group: int) -> None:
    # RepVGG's block: 3x3 (pad 1) + 1x1 (pad 0), each with its folded BatchNorm's bias
    def body(b):  # type: ignore[no-untyped-def]
        big = emit(b, "add", conv(b, "x", weights(8, 8 // group, 3, 3), (1, 1, 1, 1), strides, group),
                   const(b, weights(8, 1, 1, seed=1)))
        small = emit(b, "add", conv(b, "x", weights(8, 8 // group, 1, 1, seed=2), (0, 0, 0, 0), strides, group),
                     const(b, weights(8, 1, 1, seed=3)))
        return emit(b, "add", big, small)

    graph = build({"x": (1, 8, 9, 10)}, body)
    rewritten, fired = rewrite_with(graph, "sum-of-convs")
    assert fired == ["sum-of-convs"] and prims(rewritten) == ["conv", "add"]
    (merged,) = [n for n in rewritten.nodes if n.prim == "conv"]
    assert rewritten.constants[merged.inputs[1]].shape == (8, 8 // group, 3, 3) and merged.attr("pads") == (1, 1, 1, 1)
    assert_equivalent(graph, rewritten)


def test_over_parameterised_copies_and_a_window_inside_merge_into_the_largest() -> None:
    # MobileOne's k copies of a branch, summed in a chain; a 1x3 (pads 0, 1) lies in the 3x3's middle row
    def body(b):  # type: ignore[no-untyped-def]
        total = conv(b, "x", weights(6, 6, 3, 3), (1, 1, 1, 1))
        for seed in (1, 2, 3):
            total = emit(b, "add", total, conv(b, "x", weights(6, 6, 3, 3, seed=seed), (1, 1, 1, 1)))
        return emit(b, "add", total, conv(b, "x", weights(6, 6, 1, 3, seed=4), (0, 1, 0, 1)))

    graph = build({"x": (2, 6, 7, 5)}, body)
    rewritten, fired = rewrite_with(graph, "sum-of-convs")
    assert prims(rewritten) == ["conv"] and len(fired) == 4
    assert_equivalent(graph, rewritten)


def test_windows_that_no_kernel_spans_stay_apart() -> None:
    # a 1x3 and a 3x1 meet in a 3x3 whose corners neither reads: weight 0 there would turn an inf pixel into NaN
    def body(b):  # type: ignore[no-untyped-def]
        return emit(b, "add", conv(b, "x", weights(4, 4, 1, 3), (0, 1, 0, 1)),
                    conv(b, "x", weights(4, 4, 3, 1, seed=1), (1, 0, 1, 0)))

    graph = build({"x": (1, 4, 6, 6)}, body)
    rewritten, fired = rewrite_with(graph, "sum-of-convs")
    assert fired == [] and prims(rewritten) == ["conv", "conv", "add"]


# (the second branch's input, kernel, pads, strides, dilations) against a 3x3 of x padded 1 to 6x6 outputs
APART = {
    "another input": ("y", (3, 3), (1, 1, 1, 1), (1, 1), (1, 1)),
    "another stride": ("x", (1, 1), (0, 0, 5, 5), (2, 2), (1, 1)),
    "dilated": ("x", (3, 3), (2, 2, 2, 2), (1, 1), (2, 2)),
}


@pytest.mark.parametrize("case", list(APART))
def test_branches_that_are_not_one_map_stay_apart(case: str) -> None:
    source, kernel, pads, strides, dilations = APART[case]

    def body(b):  # type: ignore[no-untyped-def]
        first = conv(b, "x", weights(4, 4, 3, 3), (1, 1, 1, 1))
        second = conv(b, source, weights(4, 4, *kernel, seed=1), pads, strides, dilations=dilations)
        return emit(b, "add", first, second)

    graph = build({"x": (1, 4, 6, 6), "y": (1, 4, 6, 6)}, body)
    rewritten, fired = rewrite_with(graph, "sum-of-convs")
    assert fired == [] and prims(rewritten) == ["conv", "conv", "add"]


def test_a_branch_used_elsewhere_stays() -> None:
    def body(b):  # type: ignore[no-untyped-def]
        big = conv(b, "x", weights(4, 4, 3, 3), (1, 1, 1, 1))
        small = conv(b, "x", weights(4, 4, 1, 1, seed=1), (0, 0, 0, 0))
        return [emit(b, "add", big, small), small]

    graph = build({"x": (1, 4, 6, 6)}, body)
    rewritten, fired = rewrite_with(graph, "sum-of-convs")
    assert fired == [] and prims(rewritten) == ["conv", "conv", "add"]


def test_a_shifted_window_is_merged_at_its_offset() -> None:
    # a 2x2 kernel padded (0, 0, 1, 1) reads the pixels of taps (1..2, 1..2) of a 3x3 padded 1: same outputs
    def body(b):  # type: ignore[no-untyped-def]
        return emit(b, "add", conv(b, "x", weights(5, 3, 3, 3), (1, 1, 1, 1)),
                    conv(b, "x", weights(5, 3, 2, 2, seed=1), (0, 0, 1, 1)))

    graph = build({"x": (1, 3, 6, 7)}, body)
    rewritten, fired = rewrite_with(graph, "sum-of-convs")
    assert fired == ["sum-of-convs"] and prims(rewritten) == ["conv"]
    (merged,) = rewritten.nodes
    kernel = rewritten.constants[merged.inputs[1]]
    assert kernel.shape == (5, 3, 3, 3) and merged.attr("pads") == (1, 1, 1, 1)
    assert_equivalent(graph, rewritten)


def test_edge_values_pass_through_the_merged_conv_as_through_the_branches() -> None:
    # NaN and ±inf pixels: where every weight a pixel meets has one sign, the branches and the merged conv agree
    from kernorch.runtime import run_reference

    def body(b):  # type: ignore[no-untyped-def]
        return emit(b, "add", conv(b, "x", np.abs(weights(2, 2, 3, 3)), (1, 1, 1, 1)),
                    conv(b, "x", np.abs(weights(2, 2, 1, 1, seed=1)), (0, 0, 0, 0)))

    graph = build({"x": (1, 2, 5, 5)}, body)
    rewritten, _ = rewrite_with(graph, "sum-of-convs")
    x = np.ones((1, 2, 5, 5), np.float32)
    x[0, 0, 1, 1], x[0, 1, 3, 3], x[0, 0, 4, 0] = np.nan, np.inf, -np.inf
    expected, actual = (run_reference(g, {"x": x})[graph.outputs[0]] for g in (graph, rewritten))
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(actual), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-5)


@pytest.mark.parametrize("identity", ["x", "x·s", "x·s + t", "x + t"])
def test_a_repvgg_block_with_its_identity_branch_is_one_conv(identity: str) -> None:
    # 3x3 + 1x1 + BatchNorm(x), each with its bias: one 3x3 conv and one bias
    def body(b):  # type: ignore[no-untyped-def]
        big = emit(b, "add", conv(b, "x", weights(6, 6, 3, 3), (1, 1, 1, 1)), const(b, weights(6, 1, 1, seed=1)))
        small = emit(b, "add", conv(b, "x", weights(6, 6, 1, 1, seed=2), (0, 0, 0, 0)), const(b, weights(6, 1, 1)))
        branch = "x"
        if "s" in identity:
            branch = emit(b, "mul", const(b, weights(6, 1, 1, seed=3)), "x")
        if "t" in identity:
            branch = emit(b, "add", branch, const(b, weights(6, 1, 1, seed=4)))
        return emit(b, "relu", emit(b, "add", emit(b, "add", big, small), branch))

    graph = build({"x": (1, 6, 7, 8)}, body)
    rewritten, fired = rewrite_with(graph, "sum-of-convs", "identity-into-conv")
    assert sorted(set(fired)) == ["identity-into-conv", "sum-of-convs"]
    assert prims(rewritten) == ["conv", "add", "relu"]
    assert_equivalent(graph, rewritten)


def test_a_depthwise_conv_takes_the_identity_on_each_channels_own_kernel() -> None:
    def body(b):  # type: ignore[no-untyped-def]
        return emit(b, "add", "x", conv(b, "x", weights(8, 1, 3, 3), (1, 1, 1, 1), group=8))

    graph = build({"x": (2, 8, 5, 5)}, body)
    rewritten, fired = rewrite_with(graph, "identity-into-conv")
    assert fired == ["identity-into-conv"] and prims(rewritten) == ["conv"]
    assert_equivalent(graph, rewritten)


@pytest.mark.parametrize("case", ["another tensor", "scaled along a spatial axis", "dilated", "shared scaling"])
def test_an_identity_that_is_not_the_convs_input_stays(case: str) -> None:
    def body(b):  # type: ignore[no-untyped-def]
        dilations = (2, 2) if case == "dilated" else (1, 1)
        pads = (2, 2, 2, 2) if case == "dilated" else (1, 1, 1, 1)
        product = conv(b, "x", weights(4, 4, 3, 3), pads, dilations=dilations)
        branch = "y" if case == "another tensor" else "x"
        if case == "scaled along a spatial axis":
            branch = emit(b, "mul", "x", const(b, weights(5, 1, seed=1)))
        if case == "shared scaling":
            branch = emit(b, "mul", "x", const(b, weights(4, 1, 1, seed=1)))
            return [emit(b, "add", product, branch), branch]
        return emit(b, "add", product, branch)

    graph = build({"x": (1, 4, 5, 5), "y": (1, 4, 5, 5)}, body)
    rewritten, fired = rewrite_with(graph, "identity-into-conv")
    assert fired == [] and prims(rewritten) == prims(graph)


def test_the_identity_of_a_conv_that_is_itself_a_conv_output() -> None:
    # y = conv(x); y + conv(y): y is the second conv's identity (and, used twice, no branch of its own)
    def body(b):  # type: ignore[no-untyped-def]
        y = conv(b, "x", weights(4, 4, 3, 3), (1, 1, 1, 1))
        return emit(b, "add", y, conv(b, y, weights(4, 4, 3, 3, seed=1), (1, 1, 1, 1)))

    graph = build({"x": (1, 4, 5, 5)}, body)
    rewritten, fired = rewrite_with(graph, "identity-into-conv")
    assert fired == ["identity-into-conv"] and prims(rewritten) == ["conv", "conv"]
    assert_equivalent(graph, rewritten)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("sum-of-convs puts every kernel at the merged window's corner, not where its taps read",
         "*(slice(o, o + k) for o, k in",
         "*(slice(0, k) for o, k in"),
    here("sum-of-convs merges windows that neither kernel spans (zero-weight taps)",
         "    if all(k != window for k in kernels):",
         "    if False:"),
    here("identity-into-conv adds the identity at the window's first tap, not the centre one",
         "taps = tuple(pads[a] for a in range(spatial))",
         "taps = tuple(0 for a in range(spatial))"),
    here("identity-into-conv ignores the identity's shift t",
         "            value, shift = found[0]",
         "            value = found[0][0]"),
    here("sum-of-convs merges convs of different inputs",
         "if first.inputs[0] != second.inputs[0] or any(",
         "if any("),
]  # fmt: skip
