"""Rules around linear primitives (Korch Fig. 2b): primitives left and numerical equality."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernorch.devtools.mutate import here
from kernorch.testing.rewrite import assert_equivalent, build, const, emit, prims, rewrite_with

SETTINGS = settings(max_examples=15, deadline=None, derandomize=True)
dims = st.integers(1, 6)
batches = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)


@SETTINGS
@given(batch=batches, m=dims, k=dims, n=dims, per_channel=st.booleans())
def test_output_scale_folds_into_a_matmul_weight(batch: tuple[int, ...], m: int, k: int, n: int,
                                                 per_channel: bool) -> None:  # fmt: skip
    rng = np.random.default_rng(k)

    def body(b):  # type: ignore[no-untyped-def]
        y = emit(b, "matmul", "x", const(b, rng.standard_normal((k, n))))
        return emit(b, "mul", const(b, rng.uniform(0.5, 2, (n,) if per_channel else ())), y)

    graph = build({"x": (*batch, m, k)}, body)
    rewritten, _ = rewrite_with(graph, "scale-into-weight")
    assert prims(rewritten) == ["matmul"]
    assert_equivalent(graph, rewritten)


@SETTINGS
@given(m=dims, k=dims, n=dims)
def test_input_scale_folds_into_a_matmul_weight(m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(n)

    def body(b):  # type: ignore[no-untyped-def]
        scaled = emit(b, "mul", "x", const(b, rng.uniform(0.5, 2, (k,))))
        return emit(b, "matmul", scaled, const(b, rng.standard_normal((k, n))))

    graph = build({"x": (m, k)}, body)
    rewritten, _ = rewrite_with(graph, "scale-into-weight")
    assert prims(rewritten) == ["matmul"]
    assert_equivalent(graph, rewritten)


def test_a_scale_along_another_axis_or_of_a_shared_product_stays() -> None:
    rng = np.random.default_rng(0)

    def row_scaled(b):  # type: ignore[no-untyped-def]
        product = emit(b, "matmul", "x", const(b, rng.standard_normal((3, 4))))
        return emit(b, "mul", product, const(b, np.ones((2, 1)) * 2))

    assert not rewrite_with(build({"x": (2, 3)}, row_scaled), "scale-into-weight")[1]

    def shared(b):  # type: ignore[no-untyped-def]
        y = emit(b, "matmul", "x", const(b, rng.standard_normal((3, 4))))
        return [emit(b, "mul", y, const(b, 2.0)), y]

    assert not rewrite_with(build({"x": (2, 3)}, shared), "scale-into-weight")[1]


@SETTINGS
@given(batch=batches, m=dims, k=dims, n=dims)
def test_transpose_of_a_product_swaps_the_operands(batch: tuple[int, ...], m: int, k: int, n: int) -> None:
    graph = build({"a": (*batch, m, k), "b": (*batch, k, n)},
                  lambda b: emit(b, "transpose", emit(b, "matmul", "a", "b"),
                                 perm=(*range(len(batch)), len(batch) + 1, len(batch))))  # fmt: skip
    rewritten, _ = rewrite_with(graph, "transpose-of-matmul")
    assert sorted(prims(rewritten)) == ["matmul", "transpose", "transpose"]
    assert_equivalent(graph, rewritten)


@SETTINGS
@given(sizes=st.lists(st.integers(1, 4), min_size=2, max_size=4), piece=st.integers(0, 3), cut=st.integers(1, 3))
def test_split_of_a_split_piece_is_one_split(sizes: list[int], piece: int, cut: int) -> None:
    piece %= len(sizes)
    sizes[piece] += cut  # the piece split again has at least cut + 1 columns
    inner_sizes = (cut, sizes[piece] - cut)

    def body(b):  # type: ignore[no-untyped-def]
        pieces = b.emit("split", ["x"], {"axis": 1, "sizes": tuple(sizes)})
        inner = b.emit("split", [pieces[piece]], {"axis": 1, "sizes": inner_sizes})
        return [emit(b, "exp", v) for v in (*inner, *pieces[:piece], *pieces[piece + 1 :])]

    graph = build({"x": (2, sum(sizes))}, body)
    rewritten, _ = rewrite_with(graph, "split-split")
    assert prims(rewritten) == ["split"] + ["exp"] * (len(sizes) + 1)
    assert rewritten.nodes[0].attr("sizes") == (*sizes[:piece], *inner_sizes, *sizes[piece + 1 :])
    assert_equivalent(graph, rewritten)


@SETTINGS
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), k=st.integers(2, 9))
def test_row_sum_becomes_a_product_with_ones(shape: tuple[int, ...], k: int) -> None:
    graph = build({"x": (*shape, k)}, lambda b: emit(b, "reduce_sum", "x", axes=(len(shape),)))
    rewritten, _ = rewrite_with(graph, "reduce-to-matmul")
    assert prims(rewritten) == ["matmul"]
    ones = rewritten.constants[rewritten.nodes[0].inputs[1]]
    assert ones.shape == (k, 1) and np.all(ones == 1)
    assert_equivalent(graph, rewritten)


@SETTINGS
@given(batch=batches, m=dims, k=dims, n=dims, prim=st.sampled_from(["mul", "div"]), side=st.sampled_from([0, 1]))
def test_row_and_column_scales_move_behind_the_product(batch: tuple[int, ...], m: int, k: int, n: int, prim: str,
                                                       side: int) -> None:  # fmt: skip
    scale_shape = (*batch, m, 1) if side == 0 else (1, n)

    def body(b):  # type: ignore[no-untyped-def]
        if side == 0:
            return emit(b, "matmul", emit(b, prim, "a", "s"), "b")
        return emit(b, "matmul", "a", emit(b, prim, "b", "s"))

    graph = build({"a": (*batch, m, k), "b": (k, n), "s": scale_shape}, body)
    rewritten, _ = rewrite_with(graph, "scale-across-matmul")
    assert prims(rewritten) == ["matmul", prim]
    assert_equivalent(graph, rewritten, away_from_zero=("s",))  # divisors drawn away from 0


def test_softmax_then_matmul_becomes_korch_figure_2b() -> None:
    """exp(s) / Σ exp(s) @ V: reduce→ones-matmul, division moved behind the product, the two products on
    exp(s) merged into one over [V | ones] and split (Korch Fig. 2b)."""

    def body(b):  # type: ignore[no-untyped-def]
        e = emit(b, "exp", "s")
        return emit(b, "matmul", emit(b, "div", e, emit(b, "reduce_sum", e, axes=(2,))), "v")

    graph = build({"s": (2, 5, 7), "v": (2, 7, 3)}, body)
    rewritten, fired = rewrite_with(graph, "reduce-to-matmul", "scale-across-matmul", "merge-matmuls")
    assert fired == ["reduce-to-matmul", "scale-across-matmul", "merge-matmuls"]
    assert prims(rewritten) == ["exp", "concat", "matmul", "split", "div"]
    assert_equivalent(graph, rewritten)


@SETTINGS
@given(batch=batches, m=dims, k=dims, n1=dims, n2=dims, with_bias=st.booleans())
def test_two_products_sharing_an_operand_merge(batch: tuple[int, ...], m: int, k: int, n1: int, n2: int,
                                               with_bias: bool) -> None:  # fmt: skip
    rng = np.random.default_rng(m + k)

    def body(b):  # type: ignore[no-untyped-def]
        outputs = []
        for n in (n1, n2):
            y = emit(b, "matmul", "a", const(b, rng.standard_normal((k, n))))
            outputs.append(emit(b, "add", y, const(b, rng.standard_normal(n))) if with_bias else y)
        return outputs

    graph = build({"a": (*batch, m, k)}, body)
    rewritten, _ = rewrite_with(graph, "merge-matmuls")
    assert prims(rewritten) == (["matmul", "add", "split"] if with_bias else ["matmul", "split"])
    assert_equivalent(graph, rewritten)


def test_three_projections_merge_into_one_product() -> None:
    rng = np.random.default_rng(3)

    def body(b):  # type: ignore[no-untyped-def]
        products = [emit(b, "matmul", "a", const(b, rng.standard_normal((4, 4)))) for _ in range(3)]
        return [emit(b, "add", y, const(b, rng.standard_normal(4))) for y in products]

    graph = build({"a": (2, 5, 4)}, body)
    rewritten, _ = rewrite_with(graph, "merge-matmuls", "split-split")
    assert prims(rewritten) == ["matmul", "add", "split"]
    assert rewritten.nodes[-1].attr("sizes") == (4, 4, 4)
    assert_equivalent(graph, rewritten)


def test_merging_products_that_depend_on_each_other_is_refused() -> None:
    """A @ B1 feeds B2: one product over [B1 | B2] would need its own output (a cycle)."""
    graph = build({"a": (3, 3)}, lambda b: emit(b, "matmul", "a", emit(b, "exp", emit(b, "matmul", "a", "a"))))
    _, fired = rewrite_with(graph, "merge-matmuls")
    assert not fired


@SETTINGS
@given(perm=st.sampled_from([(0, 2, 3, 1), (2, 0, 3, 1), (1, 2, 3, 0)]), side=st.sampled_from([0, 1]))
def test_a_matmul_operand_transpose_is_split_into_a_row_copy_and_a_free_swap(perm: tuple[int, ...], side: int) -> None:
    x_shape = (2, 3, 4, 5)
    operand_shape = tuple(x_shape[p] for p in perm)
    other_shape = (*operand_shape[:2], operand_shape[3], 3) if side == 0 else (*operand_shape[:2], 3, operand_shape[2])

    def body(b):  # type: ignore[no-untyped-def]
        t = emit(b, "transpose", "x", perm=perm)
        return emit(b, "matmul", t, "y") if side == 0 else emit(b, "matmul", "y", t)

    graph = build({"x": x_shape, "y": other_shape}, body)
    rewritten, _ = rewrite_with(graph, "transpose-into-matmul", "transpose-noop")
    first, swap, _ = rewritten.nodes
    assert prims(rewritten) == ["transpose", "transpose", "matmul"]
    assert first.attr("perm")[-1] == 3 and swap.attr("perm") == (0, 1, 3, 2)
    assert_equivalent(graph, rewritten)


@SETTINGS
@given(lead=st.lists(st.integers(1, 3), min_size=2, max_size=3).map(tuple), k=dims, n=dims, with_bias=st.booleans())
def test_flatten_project_unflatten_loses_both_reshapes(lead: tuple[int, ...], k: int, n: int, with_bias: bool) -> None:
    rng = np.random.default_rng(k * n)

    def body(b):  # type: ignore[no-untyped-def]
        rows = emit(b, "reshape", "x", shape=(int(np.prod(lead)), k))
        y = emit(b, "matmul", rows, const(b, rng.standard_normal((k, n))))
        if with_bias:
            y = emit(b, "add", y, const(b, rng.standard_normal(n)))
        return emit(b, "exp", emit(b, "reshape", y, shape=(*lead, n)))

    graph = build({"x": (*lead, k)}, body)
    rewritten, fired = rewrite_with(graph, "reshape-through-matmul", "reshape-through-bias", "reshape-noop")
    assert prims(rewritten) == (["matmul", "add", "exp"] if with_bias else ["matmul", "exp"]), fired
    assert_equivalent(graph, rewritten)


def test_a_per_channel_bias_of_an_unflattened_image_moves_before_the_reshape() -> None:
    """W @ x[N, C, H·W] reshaped to [N, O, H, W] + b[1, O, 1, 1]: the bias adds to the product's rows, so the
    matmul's epilogue can take it (a 1x1 conv run as a matmul writing NCHW, then its bias)."""
    rng = np.random.default_rng(6)

    def body(b):  # type: ignore[no-untyped-def]
        product = emit(b, "matmul", const(b, rng.standard_normal((5, 3))), "x")
        image = emit(b, "reshape", product, shape=(2, 5, 2, 3))
        return emit(b, "add", image, const(b, rng.standard_normal((1, 5, 1, 1))))

    graph = build({"x": (2, 3, 6)}, body)
    rewritten, fired = rewrite_with(graph, "reshape-through-bias")
    assert fired == ["reshape-through-bias"] and prims(rewritten) == ["matmul", "add", "reshape"]
    assert rewritten.types[rewritten.nodes[1].outputs[0]].shape == (2, 5, 6)
    assert_equivalent(graph, rewritten)


def test_a_reshape_that_changes_the_last_axis_stays_before_the_matmul() -> None:
    rng = np.random.default_rng(0)
    graph = build({"x": (2, 3, 4)}, lambda b: emit(b, "matmul", emit(b, "reshape", "x", shape=(2, 12)),
                                                   const(b, rng.standard_normal((12, 5)))))  # fmt: skip
    assert not rewrite_with(graph, "reshape-through-matmul")[1]


def _resize(b, x: str, sizes: tuple[int, ...], mode: str, coordinate_mode: str = "half_pixel") -> str:  # type: ignore[no-untyped-def]
    shape = b.graph.types[x].shape
    return emit(b, "resize", x, sizes=sizes, scales=tuple(s / d for s, d in zip(sizes, shape, strict=True)),
                mode=mode, coordinate_mode=coordinate_mode, nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75,
                exclude_outside=False)  # fmt: skip


@SETTINGS
@given(mode=st.sampled_from(["linear", "nearest", "cubic"]), plain_last=st.booleans())
def test_pointwise_conv_of_resized_maps_runs_before_the_resizes(mode: str, plain_last: bool) -> None:
    """SegFormer's decode head: 1x1 conv of concat(resize(a), resize(b), c) = Σ resize(conv_i(·)) (+ conv of c)."""
    rng = np.random.default_rng(1)
    conv = dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1)

    def body(b):  # type: ignore[no-untyped-def]
        maps = [_resize(b, "a", (1, 3, 8, 8), mode), _resize(b, "b", (1, 2, 8, 8), mode)]
        maps.append("c" if plain_last else _resize(b, "c", (1, 4, 8, 8), mode))
        joined = emit(b, "concat", *maps, axis=1)
        return emit(b, "conv", joined, const(b, rng.standard_normal((5, 9, 1, 1))), **conv)

    graph = build({"a": (1, 3, 2, 2), "b": (1, 2, 4, 4), "c": (1, 4, 8, 8) if plain_last else (1, 4, 3, 5)}, body)
    rewritten, fired = rewrite_with(graph, "pointwise-conv-before-resize")
    assert fired == ["pointwise-conv-before-resize"]
    expected = ["conv", "resize", "conv", "resize", "add", "conv"] if plain_last else \
        ["conv", "resize", "conv", "resize", "add", "conv", "resize"]  # fmt: skip
    assert sorted(prims(rewritten)) == sorted([*expected, "add"])
    assert all(node.attr("sizes")[1] == 5 for node in rewritten.nodes if node.prim == "resize")
    assert_equivalent(graph, rewritten, rtol=1e-4)


POINTWISE = dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1)


@SETTINGS
@given(mode=st.sampled_from(["linear", "nearest", "cubic"]), outputs=st.sampled_from([2, 3, 5]),
       size=st.sampled_from([(2, 2), (3, 5), (4, 4)]))  # fmt: skip
def test_a_pointwise_conv_after_an_upsample_runs_before_it(mode: str, outputs: int, size: tuple[int, int]) -> None:
    rng = np.random.default_rng(2)
    graph = build({"x": (1, 3, *size)}, lambda b: emit(b, "conv", _resize(b, "x", (1, 3, 4, 6), mode),
                                                        const(b, rng.standard_normal((outputs, 3, 1, 1))),
                                                        **POINTWISE))  # fmt: skip
    rewritten, fired = rewrite_with(graph, "pointwise-conv-before-upsample")
    assert fired == ["pointwise-conv-before-upsample"]
    assert prims(rewritten) == ["conv", "resize"] and rewritten.types[rewritten.nodes[0].outputs[0]].shape == \
        (1, outputs, *size)  # fmt: skip
    assert_equivalent(graph, rewritten, rtol=1e-4)


@SETTINGS
@given(batch=st.sampled_from([(), (1,), (2,)]), k=st.sampled_from([1, 3, 4]), outputs=st.sampled_from([2, 5]))
def test_a_pointwise_conv_of_a_projected_image_folds_into_the_projection(batch: tuple[int, ...], k: int,
                                                                         outputs: int) -> None:  # fmt: skip
    """SegFormer's decode head: conv1x1(reshape(A @ tokens, [N, C, H, W])) = reshape((W A) @ tokens)."""
    rng = np.random.default_rng(4)
    channels, (h, w) = 6, (2, 3)
    n = batch[0] if batch else 1

    def body(b):  # type: ignore[no-untyped-def]
        product = emit(b, "matmul", const(b, rng.standard_normal((channels, k))), "tokens")
        image = emit(b, "reshape", product, shape=(n, channels, h, w))
        return emit(b, "conv", image, const(b, rng.standard_normal((outputs, channels, 1, 1))), **POINTWISE)

    graph = build({"tokens": (*batch, k, h * w)}, body)
    rewritten, fired = rewrite_with(graph, "pointwise-conv-into-matmul")
    assert fired == ["pointwise-conv-into-matmul"]
    assert prims(rewritten) == ["matmul", "reshape"]
    assert_equivalent(graph, rewritten, rtol=1e-4)


def test_a_qkv_split_along_the_last_axis_becomes_one_slice_per_piece() -> None:
    rng = np.random.default_rng(0)

    def attention(b):  # type: ignore[no-untyped-def]
        projection = emit(b, "matmul", "x", const(b, rng.standard_normal((8, 12))))
        q, k, v = b.emit("split", (projection,), {"axis": 1, "sizes": (4, 4, 4)})
        heads = [emit(b, "transpose", emit(b, "reshape", piece, shape=(5, 2, 2)), perm=(1, 0, 2))
                 for piece in (q, k, v)]
        scores = emit(b, "matmul", heads[0], emit(b, "transpose", heads[1], perm=(0, 2, 1)))
        return emit(b, "matmul", scores, heads[2])

    graph = build({"x": (5, 8)}, attention)
    rewritten, fired = rewrite_with(graph, "split-to-slices")
    assert fired == ["split-to-slices"]
    assert prims(rewritten).count("slice") == 3 and "split" not in prims(rewritten)
    assert_equivalent(graph, rewritten)



def _gated_conv(b, gate: str, kernel: np.ndarray, **attrs: object) -> str:  # type: ignore[no-untyped-def]
    """conv(x · gate, kernel): squeeze-and-excitation's gate on the map before the block's projection."""
    return emit(b, "conv", emit(b, "mul", "x", gate), const(b, kernel), **{**POINTWISE, **attrs})


@pytest.mark.parametrize(("gate_shape", "kernel_shape", "strides"), [
    ((1, 6, 1, 1), (4, 6, 1, 1), (1, 1)),  # the SE gate [N, C, 1, 1] and a 1x1 projection
    ((6, 1, 1), (4, 6, 3, 3), (2, 1)),  # a gate without the batch axis, an unpadded strided 3x3
    ((1,), (4, 6, 1, 1), (1, 1)),  # one value for every channel
])  # fmt: skip
def test_a_channel_gate_moves_onto_the_conv_kernel(gate_shape: tuple[int, ...], kernel_shape: tuple[int, ...],
                                                  strides: tuple[int, int]) -> None:  # fmt: skip
    kernel = np.random.default_rng(1).standard_normal(kernel_shape)

    def body(b):  # type: ignore[no-untyped-def]
        return _gated_conv(b, emit(b, "sigmoid", "g"), kernel, strides=strides)

    graph = build({"x": (1, 6, 30, 20), "g": gate_shape}, body)
    rewritten, fired = rewrite_with(graph, "channel-scale-into-conv")
    assert fired == ["channel-scale-into-conv"] and prims(rewritten) == ["sigmoid", "reshape", "mul", "conv"]
    (conv,) = [n for n in rewritten.nodes if n.prim == "conv"]
    assert conv.inputs[0] == "x" and rewritten.types[conv.inputs[1]].shape == kernel_shape
    assert_equivalent(graph, rewritten)


def test_edge_values_meet_the_gate_on_the_kernel_as_on_the_map() -> None:
    # NaN and ±inf pixels, gates of 0 and inf: a term is NaN where a NaN, or a 0 and an inf, are among its factors
    from kernorch.runtime import run_reference

    kernel = np.random.default_rng(2).standard_normal((3, 4, 1, 1))
    graph = build({"x": (1, 4, 8, 8), "g": (1, 4, 1, 1)}, lambda b: _gated_conv(b, "g", kernel))
    rewritten, _ = rewrite_with(graph, "channel-scale-into-conv")
    assert "mul" in prims(rewritten) and rewritten.nodes[-1].inputs[0] == "x"
    x = np.random.default_rng(3).standard_normal((1, 4, 8, 8)).astype(np.float32)
    x[0, 0, 0, 0], x[0, 1, 1, 1], x[0, 2, 2, 2], x[0, 3, 0, 2] = np.nan, np.inf, -np.inf, 0.0
    gate = np.array([1.5, 0.0, 2.0, np.inf], np.float32).reshape(1, 4, 1, 1)  # inf · 0 at [3, 0, 2], 0 · inf at 1
    expected, actual = (run_reference(g, {"x": x, "g": gate})[graph.outputs[0]] for g in (graph, rewritten))
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(actual), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-5)


@pytest.mark.parametrize(("inputs", "attrs", "why"), [
    ({"x": (1, 6, 40, 40), "g": (1, 6, 1, 1)}, {"pads": (1, 1, 1, 1)}, "padded: a padding tap would meet the gate"),
    ({"x": (1, 6, 40, 40), "g": (1, 6, 1, 1)}, {"group": 2}, "grouped"),
    ({"x": (2, 6, 40, 40), "g": (2, 6, 1, 1)}, {}, "a gate per image: one kernel cannot carry both"),
    ({"x": (1, 6, 40, 40), "g": (1, 6, 40, 1)}, {}, "a gate per row, not per channel"),
    ({"x": (1, 6, 8, 8), "g": (1, 6, 1, 1)}, {}, "a map under 16 times the kernel: its repacking costs more"),
    ({"x": (1, 6, 40, 40), "g": (1, 6, 1, 1)}, {}, None),  # the control: the same gate on a large map moves
])  # fmt: skip
def test_gates_the_kernel_cannot_carry_stay_on_the_map(inputs: dict[str, tuple[int, ...]], attrs: dict[str, object],
                                                       why: str | None) -> None:  # fmt: skip
    channels = 6 // int(attrs.get("group", 1))  # type: ignore[call-overload]
    kernel = np.random.default_rng(4).standard_normal((8, channels, 3 if "pads" in attrs else 1,
                                                       3 if "pads" in attrs else 1))  # fmt: skip
    graph = build(inputs, lambda b: _gated_conv(b, "g", kernel, **attrs))
    _, fired = rewrite_with(graph, "channel-scale-into-conv")
    assert fired == ([] if why else ["channel-scale-into-conv"]), why


def test_a_gated_map_read_elsewhere_stays() -> None:
    kernel = np.random.default_rng(5).standard_normal((4, 6, 1, 1))

    def body(b):  # type: ignore[no-untyped-def]
        gated = emit(b, "mul", "x", "g")
        return [emit(b, "conv", gated, const(b, kernel), **POINTWISE), emit(b, "relu", gated)]

    graph = build({"x": (1, 6, 30, 20), "g": (1, 6, 1, 1)}, body)
    assert rewrite_with(graph, "channel-scale-into-conv")[1] == []


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("channel-scale-into-conv moves a gate onto a padded conv's kernel",
         'node.attr("group") != 1 or any(node.attr("pads")) or',
         'node.attr("group") != 1 or'),
    here("channel-scale-into-conv puts the gate on the kernel's output-channel axis",
         "per_channel = (1, channels, *(1,) * (weight.ndim - 2))",
         "per_channel = (channels, 1, *(1,) * (weight.ndim - 2))"),
]  # fmt: skip
