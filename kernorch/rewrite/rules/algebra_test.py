"""Algebraic simplification rules: the primitives left and numerical equality on random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernorch.testing.rewrite import assert_equivalent, build, const, emit, prims, rewrite_with

SETTINGS = settings(max_examples=15, deadline=None, derandomize=True)
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


@SETTINGS
@given(shape=shapes)
def test_double_negation_cancels(shape: tuple[int, ...]) -> None:
    graph = build({"x": shape}, lambda b: emit(b, "exp", emit(b, "neg", emit(b, "neg", "x"))))
    rewritten, fired = rewrite_with(graph, "neg-neg")
    assert prims(rewritten) == ["exp"] and fired == ["neg-neg"]
    assert_equivalent(graph, rewritten)


@SETTINGS
@given(shape=shapes, constant_exponent=st.booleans())
def test_power_of_exponential_is_one_exponential(shape: tuple[int, ...], constant_exponent: bool) -> None:
    def body(b):  # type: ignore[no-untyped-def]
        exponent = const(b, 0.5) if constant_exponent else "y"
        return emit(b, "pow", emit(b, "exp", "x"), exponent)

    graph = build({"x": shape, "y": shape}, body)
    rewritten, _ = rewrite_with(graph, "exp-pow")
    assert prims(rewritten) == ["mul", "exp"]
    assert_equivalent(graph, rewritten, rtol=1e-4)  # e^(ab) vs (e^a)^b: float32 exp's error, scaled


@SETTINGS
@given(reducer=st.sampled_from(["reduce_sum", "reduce_max", "reduce_min", "reduce_prod"]),
       axes=st.permutations(range(4)).map(lambda p: (tuple(sorted(p[:2])), tuple(sorted(p[2:3])))))  # fmt: skip
def test_nested_reductions_over_disjoint_axes_merge(reducer: str,
                                                    axes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:  # fmt: skip
    inner, outer = axes
    graph = build({"x": (2, 3, 4, 2)}, lambda b: emit(b, reducer, emit(b, reducer, "x", axes=inner), axes=outer))
    rewritten, _ = rewrite_with(graph, "reduce-reduce")
    assert prims(rewritten) == [reducer]
    assert rewritten.nodes[0].attr("axes") == tuple(sorted(inner + outer))
    assert_equivalent(graph, rewritten)


def test_different_reducers_do_not_merge() -> None:
    graph = build({"x": (2, 3)}, lambda b: emit(b, "reduce_sum", emit(b, "reduce_max", "x", axes=(0,)), axes=(1,)))
    assert not rewrite_with(graph, "reduce-reduce")[1]


@SETTINGS
@given(shape=shapes)
def test_division_by_a_constant_is_a_multiplication(shape: tuple[int, ...]) -> None:
    graph = build({"x": shape}, lambda b: emit(b, "div", "x", const(b, np.linspace(1, 3, shape[-1]))))
    rewritten, _ = rewrite_with(graph, "div-by-constant")
    assert prims(rewritten) == ["mul"]
    assert_equivalent(graph, rewritten)


def test_integer_division_is_left_alone() -> None:
    graph = build({"x": (3,)}, lambda b: emit(b, "div", "x", b.constant(np.array([2, 3, 4], np.int32))),
                  dtype="int32")  # fmt: skip
    assert not rewrite_with(graph, "div-by-constant")[1]


@SETTINGS
@given(shape=shapes, prim=st.sampled_from(["add", "mul"]))
def test_chained_constants_fold_into_one(shape: tuple[int, ...], prim: str) -> None:
    def body(b):  # type: ignore[no-untyped-def]
        inner = emit(b, prim, const(b, np.linspace(0.5, 2, shape[-1])), "x")
        return emit(b, prim, inner, const(b, 1.5))

    graph = build({"x": shape}, body)
    rewritten, _ = rewrite_with(graph, "merge-constants")
    assert prims(rewritten) == [prim]
    assert_equivalent(graph, rewritten)


@SETTINGS
@given(shape=shapes)
def test_subtraction_of_a_constant_merges_with_an_addition(shape: tuple[int, ...]) -> None:
    def body(b):  # type: ignore[no-untyped-def]
        return emit(b, "add", emit(b, "sub", "x", const(b, np.linspace(-1, 2, shape[-1]))), const(b, 0.5))

    graph = build({"x": shape}, body)
    rewritten, fired = rewrite_with(graph, "sub-constant", "merge-constants")
    assert prims(rewritten) == ["add"] and fired == ["sub-constant", "merge-constants"]
    assert_equivalent(graph, rewritten)


@SETTINGS
@given(batch=st.integers(1, 3), channels=st.integers(1, 6), size=st.integers(3, 6))
def test_batchnorm_folds_into_the_preceding_conv(batch: int, channels: int, size: int) -> None:
    """conv → sub(mean) → mul(factor) → add(bias), as BatchNormalization fissions, becomes conv' + bias."""
    rng = np.random.default_rng(channels)

    def body(b):  # type: ignore[no-untyped-def]
        weight = const(b, rng.standard_normal((channels, 2, 3, 3)))
        y = emit(b, "conv", "x", weight, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1)
        y = emit(b, "sub", y, const(b, rng.standard_normal((channels, 1, 1))))
        y = emit(b, "mul", y, const(b, rng.uniform(0.5, 2, (channels, 1, 1))))
        return emit(b, "add", y, const(b, rng.standard_normal((channels, 1, 1))))

    graph = build({"x": (batch, 2, size, size)}, body)
    rewritten, fired = rewrite_with(graph, "sub-constant", "merge-constants", "mul-over-add", "scale-into-weight")
    assert prims(rewritten) == ["conv", "add"], fired
    assert_equivalent(graph, rewritten, rtol=1e-4)


def test_distributing_a_scale_needs_a_linear_producer() -> None:
    graph = build({"x": (4, 3)}, lambda b: emit(b, "mul", emit(b, "add", "x", const(b, 1.0)), const(b, 2.0)))
    assert not rewrite_with(graph, "mul-over-add")[1]


@pytest.mark.parametrize("power", [2.0, 3.0, 4.0])
def test_small_integer_powers_become_products(power: float) -> None:
    graph = build({"x": (3, 5)}, lambda b: emit(b, "pow", "x", const(b, power)))
    rewritten, fired = rewrite_with(graph, "small-power")
    assert fired == ["small-power"]
    assert prims(rewritten) == ["mul"] * {2.0: 1, 3.0: 2, 4.0: 2}[power]
    assert_equivalent(graph, rewritten)


@SETTINGS
@given(shape=shapes, constant_first=st.booleans())
def test_one_plus_tanh_is_twice_a_sigmoid(shape: tuple[int, ...], constant_first: bool) -> None:
    def body(b):  # type: ignore[no-untyped-def]
        t = emit(b, "tanh", "x")
        return emit(b, "add", *((const(b, 1.0), t) if constant_first else (t, const(b, 1.0))))

    graph = build({"x": shape}, body)
    rewritten, fired = rewrite_with(graph, "tanh-plus-one")
    assert sorted(prims(rewritten)) == ["mul", "mul", "sigmoid"] and fired == ["tanh-plus-one"]
    assert_equivalent(graph, rewritten)


@SETTINGS
@given(shape=shapes, constant_first=st.booleans())
def test_gelu_tanhs_halves_and_doubles_cancel(shape: tuple[int, ...], constant_first: bool) -> None:
    """(x · 0.5) · (sigmoid(x) · 2), GELU-tanh after tanh-plus-one, is x · sigmoid(x), to the bit (its consumer
    here an exp: a graph output keeps its own node)."""

    def body(b):  # type: ignore[no-untyped-def]
        half = emit(b, "mul", *((const(b, 0.5), "x") if constant_first else ("x", const(b, 0.5))))
        return emit(b, "exp", emit(b, "mul", half, emit(b, "mul", emit(b, "sigmoid", "x"), const(b, 2.0))))

    graph = build({"x": shape}, body)
    rewritten, fired = rewrite_with(graph, "scales-out-of-product", "constant-fold", "neutral-operand")
    assert sorted(prims(rewritten)) == ["exp", "mul", "sigmoid"] and fired[0] == "scales-out-of-product"
    assert_equivalent(graph, rewritten, rtol=0.0)


def test_other_scales_out_of_a_product_fold_into_one() -> None:
    graph = build({"x": (4, 6), "y": (4, 6)},
                  lambda b: emit(b, "mul", emit(b, "mul", "x", const(b, 3.0)), emit(b, "mul", const(b, 0.7), "y")))
    rewritten, _ = rewrite_with(graph, "scales-out-of-product", "constant-fold")
    assert prims(rewritten) == ["mul", "mul"] and rewritten.constants  # (x · y) · 2.1
    assert_equivalent(graph, rewritten, rtol=1e-6)


@pytest.mark.parametrize("case", ["shared", "broadcasting", "tensor constant"])
def test_scales_stay_where_they_are(case: str) -> None:
    """A scaled operand used elsewhere too, a constant that broadcasts the operand up, or a constant that is not
    one scalar: left alone."""

    def body(b):  # type: ignore[no-untyped-def]
        scale = const(b, np.array([[2.0]]) if case == "broadcasting" else
                      np.linspace(1, 2, 6) if case == "tensor constant" else 2.0)  # fmt: skip
        scaled = emit(b, "mul", "x", scale)
        product = emit(b, "mul", scaled, emit(b, "mul", "y", const(b, 0.5)))
        return [product, scaled] if case == "shared" else product

    graph = build({"x": (6,), "y": (6,)}, body)
    assert rewrite_with(graph, "scales-out-of-product")[1] == []
