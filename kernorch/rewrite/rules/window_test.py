"""separate-window-axes: one pool per windowed axis, outermost first, computing the same."""

from __future__ import annotations

import pytest

from kernorch.devtools.mutate import here
from kernorch.testing.rewrite import assert_equivalent, build, emit, prims, rewrite_with


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


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a pool separated per axis swaps its begin and end pads",
         '"pads": _along(pads[:spatial], axis, 0) + _along(pads[spatial:], axis, 0)}',
         '"pads": _along(pads[spatial:], axis, 0) + _along(pads[:spatial], axis, 0)}'),
    here("a small unstrided window is separated into one pass per axis (its intermediate cold in place)",
         "SMALL_WINDOW = 3",
         "SMALL_WINDOW = 0"),
]  # fmt: skip
