"""separate-resize-axes: one resize per interpolated axis, innermost first, computing the same."""

from __future__ import annotations

import pytest

from kernorch.testing.rewrite import assert_equivalent, build, emit, prims, rewrite_with


@pytest.mark.parametrize(("mode", "coordinate_mode", "source", "sizes", "exclude_outside"), [
    ("linear", "half_pixel", (1, 3, 4, 5), (1, 3, 16, 20), False),  # SegFormer's upsampling, x4
    ("linear", "align_corners", (2, 3, 6, 4), (2, 3, 3, 9), False),  # down along one axis, up along the other
    ("linear", "asymmetric", (1, 2, 3, 3, 4), (1, 2, 6, 5, 8), False),  # three axes
    ("cubic", "pytorch_half_pixel", (1, 2, 5, 6), (1, 2, 9, 11), True),
    ("cubic", "half_pixel", (1, 1, 4, 4), (1, 1, 8, 8), False),
])  # fmt: skip
def test_a_resize_of_several_axes_becomes_one_per_axis(
    mode: str, coordinate_mode: str, source: tuple[int, ...], sizes: tuple[int, ...], exclude_outside: bool
) -> None:
    scales = tuple(s / d for s, d in zip(sizes, source, strict=True))
    graph = build({"x": source}, lambda b: emit(
        b, "resize", "x", sizes=sizes, scales=scales, mode=mode, coordinate_mode=coordinate_mode,
        nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75, exclude_outside=exclude_outside))
    rewritten, fired = rewrite_with(graph, "separate-resize-axes")
    changed = [a for a in range(len(source)) if sizes[a] != source[a]]
    assert fired == ["separate-resize-axes"]
    assert prims(rewritten) == ["resize"] * len(changed)
    # innermost axis first: each resize changes exactly one axis, the last one first
    shapes = [rewritten.types[node.inputs[0]].shape for node in rewritten.nodes] + [tuple(sizes)]
    moved = [next(a for a in range(len(source)) if before[a] != after[a])
             for before, after in zip(shapes, shapes[1:], strict=False)]  # fmt: skip
    assert moved == changed[::-1]
    assert_equivalent(graph, rewritten, rtol=1e-5)
