"""The quantization rules against onnxruntime, through the reference interpreter and compiled: per tensor, per
axis and blocked scales, with and without zero points, int8 and uint8, values exactly halfway between two steps
(round half to even), beyond the range (saturation), ±0, ±inf; DynamicQuantizeLinear on mixed, one-signed and
all-zero inputs. Every element must equal onnxruntime's: a quantized value has no tolerance."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

from kernorch.devtools.mutate import here
from kernorch.errors import UnsupportedOperator
from kernorch.fission import fallback_nodes, fission
from kernorch.frontend import import_model
from kernorch.runtime import run_reference
from kernorch.testing import cpu_compile, single_op_model
from kernorch.tools.check import run_onnxruntime

RNG = np.random.default_rng(7)


def _edge_values(shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Random values with the edges planted: exact halves of a step (ties), far beyond the range, ±0, ±inf, NaN."""
    x = (RNG.standard_normal(shape) * 60 * scale).astype(np.float32)
    flat = x.reshape(-1)
    planted = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -128.5, 1e6, -1e6, 0.0, -0.0, np.inf, -np.inf,
                        np.nan], np.float32) * np.float32(scale)  # fmt: skip
    flat[: min(len(planted), flat.size)] = planted[: flat.size]
    return x


def _assert_exact(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    expected = run_onnxruntime(model, feeds)
    graph = fission(import_model(model))
    assert not fallback_nodes(graph), "the rule did not take the node"
    compiled = cpu_compile(model, cost="analytic").run(feeds)
    for name, got in (("reference", run_reference(graph, feeds)), ("compiled", compiled)):
        for output, value in expected.items():
            assert got[output].dtype == value.dtype and got[output].shape == value.shape, (name, output)
            np.testing.assert_array_equal(got[output], value, err_msg=f"{name} {output}")


CASES: dict[str, dict[str, Any]] = {
    "per tensor, int8 zero point": dict(shape=(2, 3, 5), scale=np.float32(0.05), zero=np.int8(-3)),
    "per tensor, uint8 zero point": dict(shape=(7, 11), scale=np.float32(0.1), zero=np.uint8(128)),
    "per tensor, no zero point (uint8)": dict(shape=(13,), scale=np.float32(0.02), zero=None),
    "per tensor, scale of shape [1]": dict(shape=(3, 4), scale=np.array([0.25], np.float32),
                                           zero=np.array([5], np.int8)),
    "per axis 1 (channels)": dict(shape=(2, 4, 3, 3), scale=np.array([0.1, 0.02, 0.5, 1.0], np.float32),
                                  zero=np.array([0, -5, 7, 127], np.int8), axis=1),
    "per axis 0, uint8": dict(shape=(3, 6), scale=np.array([0.1, 0.2, 0.3], np.float32),
                              zero=np.array([0, 128, 255], np.uint8), axis=0),
    "per axis -1": dict(shape=(4, 5), scale=np.linspace(0.01, 0.5, 5).astype(np.float32),
                        zero=np.arange(-2, 3).astype(np.int8), axis=-1),
    "per tensor, int16 (opset 21)": dict(shape=(3, 7), scale=np.float32(0.001), zero=np.int16(-300), opset=21),
    "per axis, uint16 (opset 21)": dict(shape=(2, 3), scale=np.array([0.01, 0.1, 1.0], np.float32),
                                        zero=np.array([0, 30000, 65535], np.uint16), axis=1, opset=21),
    "blocked along axis 1 (opset 21)": dict(shape=(3, 8),
                                            scale=(np.arange(1, 7).reshape(3, 2) * 0.05).astype(np.float32),
                                            zero=np.arange(6).reshape(3, 2).astype(np.int8), axis=1, block_size=4,
                                            opset=21),
}  # fmt: skip


def _model(op: str, case: dict[str, Any], x: np.ndarray) -> onnx.ModelProto:
    attrs: dict[str, Any] = {k: case[k] for k in ("axis", "block_size") if k in case}
    constants = {"scale": np.asarray(case["scale"])}
    order = ["x", "scale"]
    if case["zero"] is not None:
        constants["zero"] = np.asarray(case["zero"])
        order.append("zero")
    return single_op_model(op, {"x": x}, attrs, constants, input_order=order, opset=case.get("opset", 17))


@pytest.mark.parametrize("case", list(CASES))
def test_quantize_linear_equals_onnxruntime(case: str) -> None:
    arguments = CASES[case]
    smallest = float(np.min(arguments["scale"]))
    x = _edge_values(arguments["shape"], smallest)
    _assert_exact(_model("QuantizeLinear", arguments, x), {"x": x})


@pytest.mark.parametrize("case", list(CASES))
def test_dequantize_linear_equals_onnxruntime(case: str) -> None:
    arguments = CASES[case]
    dtype = np.asarray(arguments["zero"]).dtype if arguments["zero"] is not None else np.dtype(np.uint8)
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, arguments["shape"]).astype(dtype)
    x.reshape(-1)[:2] = (info.min, info.max)
    _assert_exact(_model("DequantizeLinear", arguments, x), {"x": x})


def test_dequantize_linear_of_int32_without_zero_point() -> None:
    x = np.array([[-2**31, -1, 0, 1, 2**31 - 1, 123456789]], np.int32)
    model = single_op_model("DequantizeLinear", {"x": x}, constants={"scale": np.array(0.001, np.float32)},
                            input_order=["x", "scale"])  # fmt: skip
    _assert_exact(model, {"x": x})


@pytest.mark.parametrize("values", ["mixed", "positive", "negative", "zeros", "one value", "huge", "NaN and inf",
                                    "NaN only"])
def test_dynamic_quantize_linear_equals_onnxruntime(values: str) -> None:
    x = {"mixed": RNG.standard_normal((4, 9)) * 3, "positive": np.abs(RNG.standard_normal((5, 7))) + 0.1,
         "negative": -np.abs(RNG.standard_normal((3, 3))) - 1, "zeros": np.zeros((2, 6)),
         "one value": np.full((3, 4), 0.7), "huge": RNG.standard_normal((2, 8)) * 1e30,
         "NaN and inf": np.array([[1.0, np.nan, -2.0, np.inf], [0.5, -0.25, np.nan, 3.0]]),
         "NaN only": np.full((2, 3), np.nan)}[values].astype(np.float32)
    model = single_op_model("DynamicQuantizeLinear", {"x": x}, outputs=3, opset=17)
    _assert_exact(model, {"x": x})


@pytest.mark.parametrize(("op", "inputs", "attrs", "reason"), [
    ("QuantizeLinear", {"x": np.zeros((2, 2), np.float16), "scale": np.array(0.1, np.float16)}, {}, "float16"),
    ("QuantizeLinear", {"x": np.zeros((2, 3), np.float32), "scale": np.ones(2, np.float32)}, {"axis": 1}, "axis"),
    ("DequantizeLinear", {"x": np.zeros((2, 2), np.int8), "scale": np.array(0.1, np.float16)}, {}, "float16 scale"),
])  # fmt: skip
def test_what_the_rules_do_not_take_runs_through_the_fallback(op: str, inputs: dict[str, np.ndarray],
                                                              attrs: dict[str, Any], reason: str) -> None:
    model = single_op_model(op, {"x": inputs["x"]}, attrs, {"scale": inputs["scale"]}, input_order=["x", "scale"],
                            opset=21) if reason != "axis" else None  # fmt: skip
    if model is None:  # shape inference refuses a scale that does not fit the axis: build it unchecked
        from onnx import TensorProto, helper, numpy_helper

        node = helper.make_node(op, ["x", "scale"], ["out0"], axis=1)
        graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))],
                                  [helper.make_tensor_value_info("out0", TensorProto.UINT8, (2, 3))],
                                  [numpy_helper.from_array(inputs["scale"], "scale")])  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOperator, match=reason):  # strict: the reason, named
        fission(import_model(model))
    (fallback,) = fallback_nodes(fission(import_model(model), strict=False))
    assert fallback.attr("op_type") == op and reason in fallback.attr("reason"), fallback.attr("reason")


MUTANTS = [
    here("QuantizeLinear multiplies by the reciprocal of the scale",
         'return saturate(ctx, ctx.emit("div", x, scale), zero_point, target)',
         'return saturate(ctx, ctx.emit("mul", x, ctx.emit("reciprocal", scale)), zero_point, target)'),
    here("QuantizeLinear does not saturate at the top of the range (reference)",
         "return [np.asarray(np.where(above < high, above, high), np.float32)]", "return [above]",
         file="kernorch/ir/primitives.py"),
    here("QuantizeLinear keeps a NaN through its saturation (reference)",
         "above = np.where(shifted > low, shifted, low)", "above = np.maximum(shifted, low)",
         file="kernorch/ir/primitives.py"),
    here("QuantizeLinear does not saturate at the top of the range (C)", "return above < high ? above : high;",
         "return above;", file="kernorch/codegen/c/prelude.py"),
    here("QuantizeLinear keeps a NaN through its saturation (C)", "const float above = shifted > low ? shifted : low;",
         "const float above = shifted < low ? low : shifted;", file="kernorch/codegen/c/prelude.py"),
    here("DynamicQuantizeLinear's range takes NaN in",
         'numbers = ctx.emit("where", ctx.emit("equal", x, x), x, zero)',
         "numbers = x"),
    here("QuantizeLinear drops its zero point",
         'offset = ctx.emit("cast", zero_point, to="float32") if zero_point is not None',
         'offset = ctx.scalar(0.0, "float32") if zero_point is not None'),
    here("a per-axis scale is laid along the last axis",
         "return reshape(ctx, value, tuple(x_shape[axis] if a == axis else 1 for a in range(rank)))",
         "return reshape(ctx, value, tuple(x_shape[axis] if a == rank - 1 else 1 for a in range(rank)))"),
    here("DequantizeLinear adds its zero point",
         'value = ctx.emit("sub", value, ctx.emit("cast", scale_operand(ctx, 2, rank), to="float32"))',
         'value = ctx.emit("add", value, ctx.emit("cast", scale_operand(ctx, 2, rank), to="float32"))'),
    here("x / c becomes x · (1/c) where the quotient is rounded or divides (a quantization's scale)",
         "    if any(_needs_exact(consumer, quotient) for consumer in ctx.consumers(quotient)):\n        return None",
         "    if False:\n        return None",
         file="kernorch/rewrite/rules/algebra.py"),
    here("DynamicQuantizeLinear's scale of an all-zero input is 0",
         'scale = ctx.emit("div", ctx.emit("where", ctx.emit("equal", spread, zero), range_255, spread), range_255)',
         'scale = ctx.emit("div", spread, range_255)'),
    here("DynamicQuantizeLinear's range leaves out zero",
         'low = reshape(ctx, ctx.emit("min", ctx.emit("reduce_min", numbers, axes=axes), zero), ())',
         'low = reshape(ctx, ctx.emit("reduce_min", numbers, axes=axes), ())'),
]  # fmt: skip
