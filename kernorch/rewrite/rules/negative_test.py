"""Negative cases: for every rewrite rule, graphs that look like its pattern but where rewriting would be
wrong (or pointless) — the rule must not fire. A rule without a negative case fails the completeness test."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph, Node, verify
from kernorch.rewrite import REWRITE_RULES
from kernorch.testing.rewrite import build, const, emit, rewrite_with

Case = Callable[[], Graph]


def _int_const(b: PrimitiveBuilder, value: int) -> str:
    return b.constant(np.array(value, np.int32))


_CONV = dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1)


def _resize_channels(b: PrimitiveBuilder, x: str) -> str:
    return emit(b, "resize", x, sizes=(1, 4, 2, 2), scales=(1.0, 2.0, 1.0, 1.0), mode="nearest",
                coordinate_mode="asymmetric", nearest_mode="floor", cubic_coeff_a=-0.75, exclude_outside=False)


def _resize_to(b: PrimitiveBuilder, x: str, size: int, coordinate_mode: str = "half_pixel") -> str:
    shape = b.graph.types[x].shape
    sizes = (*shape[:2], size, size)
    return emit(b, "resize", x, sizes=sizes, scales=tuple(s / d for s, d in zip(sizes, shape, strict=True)),
                mode="linear", coordinate_mode=coordinate_mode, nearest_mode="round_prefer_floor",
                cubic_coeff_a=-0.75, exclude_outside=False)  # fmt: skip


def _lstm_pair(hidden: int = 16, lower_h_used: bool = False) -> Graph:
    """Two stacked LSTM layers after fission and the safe rules; optionally the lower layer's final h is a
    graph output too."""
    from onnx import TensorProto, helper

    from kernorch.pipeline import import_graph
    from kernorch.rewrite import rewrite
    from kernorch.tools.demo_models import stacked_lstm

    model = stacked_lstm(2, hidden, 5, 1, features=4)
    if lower_h_used:
        model.graph.node[0].output.append("y_h0")
        model.graph.output.append(helper.make_tensor_value_info("y_h0", TensorProto.FLOAT, [1, 1, hidden]))
    return rewrite(import_graph(model))[0]


NEGATIVE: dict[str, list[tuple[str, Case]]] = {
    "lstm-layers-as-waves": [("4H = 24 columns do not fill panels of 16", lambda: _lstm_pair(hidden=6)),
                             ("the lower layer's final h is used", lambda: _lstm_pair(lower_h_used=True))],
    "cast-same-type": [("cast to another dtype", lambda: build({"x": (4,)}, lambda b: emit(b, "cast", "x",
                                                                                           to="int32")))],
    "constant-fold": [("an input is not constant", lambda: build({"x": (4,)}, lambda b: emit(b, "exp", "x")))],
    "cse": [("same primitive, other attributes",
             lambda: build({"x": (2, 3)}, lambda b: [emit(b, "reduce_sum", "x", axes=(0,)),
                                                     emit(b, "reduce_sum", "x", axes=(1,))])),
            ("same primitive, other inputs", lambda: build({"x": (4,), "y": (4,)},
                                                           lambda b: [emit(b, "exp", "x"), emit(b, "exp", "y")]))],
    "div-by-constant": [("divisor is a value", lambda: build({"x": (4,), "y": (4,)}, lambda b: emit(
                            b, "div", "x", "y"))),
                        ("integer division truncates", lambda: build({"x": (4,)}, lambda b: emit(
                            b, "div", "x", _int_const(b, 3)), dtype="int32"))],
    "exp-pow": [("base is not an exponential", lambda: build({"x": (4,)}, lambda b: emit(
        b, "pow", emit(b, "tanh", "x"), const(b, 2.0))))],
    "identity": [("not an identity", lambda: build({"x": (4,)}, lambda b: emit(b, "neg", "x")))],
    "layout-noop": [("a real pad", lambda: build({"x": (2, 3)}, lambda b: emit(b, "pad", "x", pads=(0, 1, 0, 0),
                                                                               mode="constant", value=0.0))),
                    ("a partial slice", lambda: build({"x": (2, 3)}, lambda b: emit(
                        b, "slice", "x", ranges=((0, 2, 1), (0, 2, 1))))),
                    ("a reversed full slice", lambda: build({"x": (2, 3)}, lambda b: emit(
                        b, "slice", "x", ranges=((0, 2, 1), (2, -1, -1))))),
                    ("concat of two pieces", lambda: build({"x": (2, 3)}, lambda b: emit(
                        b, "concat", "x", "x", axis=0)))],
    "scales-out-of-product": [("one factor is not scaled", lambda: build({"x": (4,), "y": (4,)}, lambda b: emit(
                                  b, "mul", emit(b, "mul", "x", const(b, 2.0)), "y"))),
                              ("a scale by a value", lambda: build({"x": (4,), "y": (4,), "z": (4,)}, lambda b: emit(
                                  b, "mul", emit(b, "mul", "x", "z"), emit(b, "mul", "y", const(b, 2.0)))))],
    "merge-constants": [("the second operand is a value", lambda: build({"x": (4,), "y": (4,)}, lambda b: emit(
                            b, "add", emit(b, "add", "x", const(b, 1.0)), "y"))),
                        ("add then mul", lambda: build({"x": (4,)}, lambda b: emit(
                            b, "mul", emit(b, "add", "x", const(b, 1.0)), const(b, 2.0))))],
    "pointwise-conv-before-resize": [
        ("a 3x3 conv mixes neighbours", lambda: build({"a": (1, 2, 2, 2)}, lambda b: emit(
            b, "conv", emit(b, "concat", _resize_to(b, "a", 4), _resize_to(b, "a", 4), axis=1),
            const(b, np.ones((3, 4, 3, 3))), **_CONV))),
        ("concat along width", lambda: build({"a": (1, 2, 2, 2)}, lambda b: emit(
            b, "conv", emit(b, "concat", _resize_to(b, "a", 4), _resize_to(b, "a", 4), axis=3),
            const(b, np.ones((3, 2, 1, 1))), **_CONV))),
        ("the resize stretches the channel axis", lambda: build({"a": (1, 2, 2, 2)}, lambda b: emit(
            b, "conv", emit(b, "concat", _resize_channels(b, "a"), _resize_channels(b, "a"), axis=1),
            const(b, np.ones((3, 8, 1, 1))), **_CONV))),
        ("the resized map is also an output", lambda: build({"a": (1, 2, 2, 2)}, lambda b: (lambda r: [r, emit(
            b, "conv", emit(b, "concat", r, r, axis=1), const(b, np.ones((3, 4, 1, 1))), **_CONV)])(
            _resize_to(b, "a", 4))))],
    "pointwise-conv-before-upsample": [
        ("a downsample: fewer pixels after it", lambda: build({"a": (1, 2, 4, 4)}, lambda b: emit(
            b, "conv", _resize_to(b, "a", 2), const(b, np.ones((3, 2, 1, 1))), **_CONV))),
        ("a strided conv", lambda: build({"a": (1, 2, 2, 2)}, lambda b: emit(
            b, "conv", _resize_to(b, "a", 4), const(b, np.ones((3, 2, 1, 1))), **{**_CONV, "strides": (2, 2)}))),
        ("the resize stretches the channel axis", lambda: build({"a": (1, 2, 2, 2)}, lambda b: emit(
            b, "conv", _resize_channels(b, "a"), const(b, np.ones((3, 4, 1, 1))), **_CONV))),
        ("the resized map is also an output", lambda: build({"a": (1, 2, 2, 2)}, lambda b: (lambda r: [r, emit(
            b, "conv", r, const(b, np.ones((3, 2, 1, 1))), **_CONV)])(_resize_to(b, "a", 4))))],
    "pointwise-conv-into-matmul": [
        ("folded would cost more: 64 x 64 against 64 x 2 + 2 x 64", lambda: build({"t": (1, 64, 4)}, lambda b: emit(
            b, "conv", emit(b, "reshape", emit(b, "matmul", const(b, np.ones((2, 64))), "t"), shape=(1, 2, 2, 2)),
            const(b, np.ones((64, 2, 1, 1))), **_CONV))),
        ("the product is also an output", lambda: build({"t": (1, 3, 4)}, lambda b: (lambda p: [p, emit(
            b, "conv", emit(b, "reshape", p, shape=(1, 4, 2, 2)), const(b, np.ones((5, 4, 1, 1))), **_CONV)])(
            emit(b, "matmul", const(b, np.ones((4, 3))), "t")))),
        ("the projection's weight is computed", lambda: build({"t": (1, 3, 4), "w": (4, 3)}, lambda b: emit(
            b, "conv", emit(b, "reshape", emit(b, "matmul", "w", "t"), shape=(1, 4, 2, 2)),
            const(b, np.ones((5, 4, 1, 1))), **_CONV))),
        ("the reshape mixes channels into the image", lambda: build({"t": (1, 3, 4)}, lambda b: emit(
            b, "conv", emit(b, "reshape", emit(b, "matmul", const(b, np.ones((4, 3))), "t"), shape=(1, 2, 2, 4)),
            const(b, np.ones((5, 2, 1, 1))), **_CONV)))],
    "merge-matmuls": [("different left operands", lambda: build({"a": (3, 4), "c": (3, 4)}, lambda b: [
        emit(b, "matmul", "a", const(b, np.ones((4, 2)))), emit(b, "matmul", "c", const(b, np.ones((4, 2))))]))],
    "mul-over-add": [("the sum does not come from a linear primitive", lambda: build({"x": (4,)}, lambda b: emit(
        b, "mul", emit(b, "add", emit(b, "exp", "x"), const(b, 1.0)), const(b, 2.0))))],
    "neg-neg": [("a single negation", lambda: build({"x": (4,)}, lambda b: emit(b, "neg", emit(b, "exp", "x"))))],
    "neutral-operand": [("0 − x is not x", lambda: build({"x": (4,)}, lambda b: emit(b, "sub", const(b, 0.0), "x"))),
                        ("1 / x is not x", lambda: build({"x": (4,)}, lambda b: emit(b, "div", const(b, 1.0), "x"))),
                        ("x · 1 that broadcasts x larger", lambda: build({"x": (4,)}, lambda b: emit(
                            b, "mul", "x", const(b, np.ones((3, 4)))))),
                        ("x · 2", lambda: build({"x": (4,)}, lambda b: emit(b, "mul", "x", const(b, 2.0))))],
    "reduce-noop": [("a reduced axis longer than 1", lambda: build({"x": (1, 3)}, lambda b: emit(
        b, "reduce_sum", "x", axes=(1,))))],
    "reduce-reduce": [("different reducers", lambda: build({"x": (2, 3)}, lambda b: emit(
                          b, "reduce_max", emit(b, "reduce_sum", "x", axes=(0,)), axes=(1,)))),
                      ("the same axis twice", lambda: build({"x": (2, 3)}, lambda b: emit(
                          b, "reduce_sum", emit(b, "reduce_sum", "x", axes=(1,)), axes=(1,))))],
    "reduce-to-matmul": [("not the last axis", lambda: build({"x": (2, 3)}, lambda b: emit(
        b, "reduce_sum", "x", axes=(0,))))],
    "reshape-noop": [("a real reshape", lambda: build({"x": (2, 3)}, lambda b: emit(b, "reshape", "x", shape=(3, 2)))),
                     ("expand that broadcasts", lambda: build({"x": (1, 3)}, lambda b: emit(
                         b, "expand", "x", shape=(2, 3))))],
    "reshape-through-bias": [("the reshape changes the last axis", lambda: build({"x": (2, 6)}, lambda b: emit(
        b, "add", emit(b, "reshape", "x", shape=(2, 3, 2)), const(b, np.ones((2,)))))),
                             ("the bias runs along an axis the reshape splits", lambda: build({"x": (2, 6)},
                              lambda b: emit(b, "add", emit(b, "reshape", "x", shape=(2, 3, 2)),
                                             const(b, np.arange(3.0).reshape(3, 1)))))],
    "reshape-through-matmul": [("the reshape changes the last axis", lambda: build({"x": (2, 6)}, lambda b: emit(
        b, "matmul", emit(b, "reshape", "x", shape=(4, 3)), const(b, np.ones((3, 5))))))],
    "scale-across-matmul": [("a scale along K, not a row", lambda: build({"a": (3, 4), "bm": (4, 5)}, lambda b: emit(
        b, "matmul", emit(b, "mul", "a", const(b, np.arange(1, 5, dtype=np.float32))), "bm")))],
    "scale-into-weight": [("the weight is not constant", lambda: build({"x": (3, 4), "w": (4, 5)}, lambda b: emit(
                              b, "mul", emit(b, "matmul", "x", "w"), const(b, np.arange(1, 6, dtype=np.float32))))),
                          ("the scale varies along rows", lambda: build({"x": (3, 4)}, lambda b: emit(
                              b, "mul", emit(b, "matmul", "x", const(b, np.ones((4, 5)))),
                              const(b, np.arange(1, 4, dtype=np.float32).reshape(3, 1)))))],
    "small-power": [("a fractional exponent", lambda: build({"x": (4,)}, lambda b: emit(b, "pow", "x", const(b, 2.5)))),
                    ("an exponent that is a value", lambda: build({"x": (4,), "y": (4,)}, lambda b: emit(
                        b, "pow", "x", "y"))),
                    ("an exponent that broadcasts", lambda: build({"x": (4,)}, lambda b: emit(
                        b, "pow", "x", const(b, np.full((3, 4), 2.0)))))],
    "tanh-plus-one": [("another constant", lambda: build({"x": (4,)}, lambda b: emit(
                          b, "add", emit(b, "tanh", "x"), const(b, 2.0)))),
                      ("a tanh used elsewhere too", lambda: build({"x": (4,)}, lambda b: (lambda t: emit(
                          b, "mul", emit(b, "add", t, const(b, 1.0)), t))(emit(b, "tanh", "x")))),
                      ("a one that broadcasts", lambda: build({"x": (4,)}, lambda b: emit(
                          b, "add", emit(b, "tanh", "x"), const(b, np.ones((3, 4))))))],
    "separate-resize-axes": [
        ("one axis only", lambda: build({"a": (1, 2, 3, 4)}, lambda b: emit(
            b, "resize", "a", sizes=(1, 2, 3, 8), scales=(1.0, 1.0, 1.0, 2.0), mode="linear",
            coordinate_mode="half_pixel", nearest_mode="floor", cubic_coeff_a=-0.75, exclude_outside=False))),
        ("nearest gathers once either way", lambda: build({"a": (1, 2, 3, 4)}, lambda b: emit(
            b, "resize", "a", sizes=(1, 2, 6, 8), scales=(1.0, 1.0, 2.0, 2.0), mode="nearest",
            coordinate_mode="asymmetric", nearest_mode="floor", cubic_coeff_a=-0.75, exclude_outside=False)))],
    # (tf_crop_and_resize, which these rules also leave alone, is refused by the resize primitive itself)
    "separate-window-axes": [
        ("one windowed axis only", lambda: build({"a": (1, 2, 8, 8)}, lambda b: emit(
            b, "window_max", "a", kernel=(1, 3), strides=(1, 2), pads=(0, 1, 0, 1), dilations=(1, 1),
            ceil_mode=False))),
        ("channels-last, over H alone", lambda: build({"a": (1, 8, 8, 3)}, lambda b: emit(
            b, "window_sum", "a", kernel=(3, 1, 1), strides=(2, 1, 1), pads=(1, 0, 0, 1, 0, 0), dilations=(1, 1, 1),
            ceil_mode=False)))],
    "pool-before-clamp": [
        ("a sigmoid: monotone, but rounded differently before and after the max", lambda: build(
            {"a": (1, 2, 8, 8)}, lambda b: emit(b, "window_max", emit(b, "sigmoid", "a"), kernel=(2, 2), strides=(2, 2),
                                                pads=(0, 0, 0, 0), dilations=(1, 1), ceil_mode=False))),
        ("a pool with as many outputs as inputs", lambda: build({"a": (1, 2, 8, 8)}, lambda b: emit(
            b, "window_max", emit(b, "relu", "a"), kernel=(1, 3), strides=(1, 1), pads=(0, 1, 0, 1),
            dilations=(1, 1), ceil_mode=False)))],
    "split-split": [("split along another axis", lambda: build({"x": (4, 6)}, lambda b: b.emit(
        "split", [b.emit("split", ["x"], {"axis": 0, "sizes": (2, 2)})[0]], {"axis": 1, "sizes": (3, 3)})))],
    "split-to-slices": [
        ("pieces that are contiguous blocks (views)", lambda: build({"x": (1, 4, 3)}, lambda b: (lambda p: emit(
            b, "matmul", p[0], emit(b, "transpose", p[1], perm=(0, 2, 1))))(
            b.emit("split", ("x",), {"axis": 1, "sizes": (2, 2)})))),
        ("no matmul reads a piece", lambda: build({"x": (3, 4)}, lambda b: emit(
            b, "add", *b.emit("split", ("x",), {"axis": 1, "sizes": (2, 2)}))))],
    "sub-constant": [("the constant is on the left", lambda: build({"x": (4,)}, lambda b: emit(
                         b, "sub", const(b, 1.0), "x"))),
                     ("integers", lambda: build({"x": (4,)}, lambda b: emit(b, "sub", "x", _int_const(b, 1)),
                                                dtype="int32"))],
    "channel-scale-into-conv": [
        ("a gate per pixel, not per channel", lambda: build({"x": (1, 2, 8, 8), "g": (1, 1, 8, 8)}, lambda b: emit(
            b, "conv", emit(b, "mul", "x", "g"), const(b, np.ones((2, 2, 1, 1))), **_CONV))),
        ("a padded conv", lambda: build({"x": (1, 2, 16, 16), "g": (1, 2, 1, 1)}, lambda b: emit(
            b, "conv", emit(b, "mul", "x", "g"), const(b, np.ones((2, 2, 3, 3))), **{**_CONV,
                                                                                    "pads": (1, 1, 1, 1)}))),
        ("a kernel that is an input", lambda: build({"x": (1, 2, 8, 8), "g": (1, 2, 1, 1), "w": (2, 2, 1, 1)},
                                                    lambda b: emit(b, "conv", emit(b, "mul", "x", "g"), "w",
                                                                   **_CONV)))],
    "identity-into-conv": [
        ("the identity of another tensor", lambda: build({"x": (1, 2, 4, 4), "y": (1, 2, 4, 4)}, lambda b: emit(
            b, "add", emit(b, "conv", "x", const(b, np.ones((2, 2, 1, 1))), **_CONV), "y"))),
        ("two convs and no identity", lambda: build({"x": (1, 2, 4, 4)}, lambda b: emit(
            b, "add", emit(b, "conv", "x", const(b, np.ones((2, 2, 1, 1))), **_CONV),
            emit(b, "conv", "x", const(b, np.ones((2, 2, 1, 1))), **_CONV)))),
        ("a dilated conv", lambda: build({"x": (1, 2, 6, 6)}, lambda b: emit(
            b, "add", emit(b, "conv", "x", const(b, np.ones((2, 2, 3, 3))), **{**_CONV, "pads": (2, 2, 2, 2),
                                                                              "dilations": (2, 2)}), "x")))],
    "sum-of-convs": [
        ("convs of different inputs", lambda: build({"x": (1, 2, 4, 4), "y": (1, 2, 4, 4)}, lambda b: emit(
            b, "add", emit(b, "conv", "x", const(b, np.ones((2, 2, 1, 1))), **_CONV),
            emit(b, "conv", "y", const(b, np.ones((2, 2, 1, 1))), **_CONV)))),
        ("a kernel that is an input", lambda: build({"x": (1, 2, 4, 4), "w": (2, 2, 1, 1)}, lambda b: emit(
            b, "add", emit(b, "conv", "x", "w", **_CONV), emit(b, "conv", "x", const(b, np.ones((2, 2, 1, 1))),
                                                               **_CONV)))),
        ("a dilated branch", lambda: build({"x": (1, 2, 6, 6)}, lambda b: emit(
            b, "add", emit(b, "conv", "x", const(b, np.ones((2, 2, 3, 3))), **{**_CONV, "pads": (1, 1, 1, 1)}),
            emit(b, "conv", "x", const(b, np.ones((2, 2, 3, 3))), **{**_CONV, "pads": (2, 2, 2, 2),
                                                                    "dilations": (2, 2)}))))],
    "transpose-into-matmul": [("the transpose keeps the last axis", lambda: build({"x": (2, 3, 4)}, lambda b: emit(
        b, "matmul", emit(b, "transpose", "x", perm=(1, 0, 2)), const(b, np.ones((4, 5))))))],
    "transpose-noop": [("a single real transpose", lambda: build({"x": (2, 3)}, lambda b: emit(
        b, "transpose", "x", perm=(1, 0))))],
    "quantization-round-trip": [
        ("a plain float through int8: truncated", lambda: build({"x": (7,)}, lambda b: emit(
            b, "cast", emit(b, "cast", "x", to="int8"), to="float32"))),
        ("a fractional offset: the cast truncates it", lambda: build({"x": (7,)}, lambda b: emit(
            b, "cast", emit(b, "cast", emit(b, "saturating_round", "x", const(b, 0.5), const(b, -128), const(b, 127)),
                            to="int8"), to="float32"))),
        ("bounds beyond the integer type: the cast wraps", lambda: build({"x": (7,)}, lambda b: emit(
            b, "cast", emit(b, "cast", emit(b, "saturating_round", "x", const(b, 0), const(b, 0), const(b, 300)),
                            to="uint8"), to="float32"))),
    ],
    "requantization-same-grid": [
        ("a plain value quantized twice: the first is not a rounding", lambda: build({"x": (7,)}, lambda b: emit(
            b, "saturating_round", emit(b, "div", emit(b, "mul", emit(b, "add", "x", const(b, -4)), const(b, 0.5)),
                                        const(b, 0.5)), const(b, 4), const(b, -128), const(b, 127)))),
        ("another scale for the quotient", lambda: build({"x": (7,)}, lambda b: emit(
            b, "saturating_round", emit(b, "div", emit(b, "mul", emit(b, "add", emit(
                b, "saturating_round", "x", const(b, 4), const(b, -128), const(b, 127)), const(b, -4)),
                const(b, 0.5)), const(b, 0.25)), const(b, 4), const(b, -128), const(b, 127)))),
    ],
    "transpose-of-matmul": [("not the last two axes", lambda: build({"a": (2, 3, 4)}, lambda b: emit(
        b, "transpose", emit(b, "matmul", "a", const(b, np.ones((4, 5)))), perm=(1, 0, 2))))],
}  # fmt: skip


def _between_negations(graph: Graph) -> Graph:
    """The case with its inputs and outputs negated: a pattern sitting right on a graph input or output can
    then still be rewritten (the rewriter keeps graph inputs and outputs), so a wrong firing shows."""
    inputs = [f"{name}/in" for name in graph.inputs]
    outputs = [f"{name}/out" for name in graph.outputs]
    nodes = [Node("neg", (outer,), (name,)) for outer, name in zip(inputs, graph.inputs, strict=True)]
    nodes += graph.nodes
    nodes += [Node("neg", (name,), (outer,)) for name, outer in zip(graph.outputs, outputs, strict=True)]
    types = dict(graph.types)
    types.update({outer: graph.types[name] for outer, name in zip(inputs, graph.inputs, strict=True)})
    types.update({outer: graph.types[name] for outer, name in zip(outputs, graph.outputs, strict=True)})
    sharpened = Graph(inputs=inputs, outputs=outputs, types=types, constants=dict(graph.constants), nodes=nodes,
                      name=graph.name)  # fmt: skip
    verify(sharpened)
    return sharpened


def test_every_rule_has_negative_cases() -> None:
    assert set(NEGATIVE) == set(REWRITE_RULES), set(REWRITE_RULES) ^ set(NEGATIVE)


@pytest.mark.parametrize(("rule", "case"), [(rule, case) for rule, cases in NEGATIVE.items() for case in cases],
                         ids=[f"{rule}: {name}" for rule, cases in NEGATIVE.items() for name, _ in cases])  # fmt: skip
def test_rule_does_not_fire(rule: str, case: tuple[str, Case]) -> None:
    _, make = case
    graph = _between_negations(make())
    rewritten, fired = rewrite_with(graph, rule)
    assert fired == [], fired
    assert [n.prim for n in rewritten.nodes] == [n.prim for n in graph.nodes]
