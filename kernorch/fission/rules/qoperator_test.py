"""The com.microsoft QOperator rules against onnxruntime's own kernels, through the reference interpreter and
compiled: int8 and uint8 values at their extremes, scales that saturate, absent zero points, broadcasting, odd and
prime sizes, channels-last pools, QGemm's bias, alpha, transB and per-column scales. A quantized output may be one
step from onnxruntime's where its kernel rounds the same real number computed in another order (module docstring
of qoperator.py): at most one step, on few elements; QGemm's float output to float rounding."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from kernorch.devtools.mutate import here
from kernorch.errors import UnsupportedOperator
from kernorch.fission import fallback_nodes, fission
from kernorch.frontend import import_model
from kernorch.runtime import run_reference
from kernorch.testing import cpu_compile, exact_int8_outputs, integer_extremes

RNG = np.random.default_rng(5)
CONTRIB = "com.microsoft"


def _integers(dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    return integer_extremes(RNG, dtype, shape)


def _scalar(value: float | int, dtype: Any) -> np.ndarray:
    return np.asarray(value, dtype)


def _model(op_type: str, order: list[str], feeds: dict[str, np.ndarray], constants: dict[str, np.ndarray],
           out: tuple[tuple[int, ...], Any], **attrs: Any) -> onnx.ModelProto:  # fmt: skip
    """One com.microsoft node in an opset-17 model: `feeds` as graph inputs, `constants` as initializers ('' in
    `order`: absent)."""
    node = helper.make_node(op_type, order, ["out0"], domain=CONTRIB, **attrs)
    inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for name, a in feeds.items()]  # fmt: skip
    output = helper.make_tensor_value_info("out0", helper.np_dtype_to_tensor_dtype(np.dtype(out[1])), out[0])
    graph = helper.make_graph([node], f"{op_type}_test", inputs, [output],
                              [numpy_helper.from_array(a, name) for name, a in constants.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(CONTRIB, 1)],
                             ir_version=8)  # fmt: skip


def _binary(op_type: str, dtype: type, a_shape: tuple[int, ...], b_shape: tuple[int, ...],
            output_zero: bool = True) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:  # fmt: skip
    feeds = {"a": _integers(dtype, a_shape), "b": _integers(dtype, b_shape)}
    info = np.iinfo(dtype)
    constants = {"sa": _scalar(0.05, np.float32), "sb": _scalar(0.11, np.float32),
                 # an output grid narrower than the sums' range: both ends saturate
                 "sy": _scalar(0.07 if op_type == "QLinearAdd" else 0.9, np.float32),
                 "za": _scalar(info.min + 100, dtype), "zb": _scalar(info.max - 17, dtype)}  # fmt: skip
    order = ["a", "sa", "za", "b", "sb", "zb", "sy"]
    if output_zero:  # absent: 0 (onnxruntime requires the operands' zero points)
        constants["zy"] = _scalar(info.min + 61, dtype)
        order.append("zy")
    shape = np.broadcast_shapes(a_shape, b_shape)
    return _model(op_type, order, feeds, constants, (shape, dtype)), feeds


def _unary(op_type: str, dtype: type, shape: tuple[int, ...], out_shape: tuple[int, ...] | None = None,
           **attrs: Any) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:  # fmt: skip
    feeds = {"x": _integers(dtype, shape)}
    info = np.iinfo(dtype)
    constants = {"sx": _scalar(0.031, np.float32), "zx": _scalar(info.min + 90, dtype),
                 "sy": _scalar(0.0035 if op_type == "QLinearSigmoid" else 0.02, np.float32),
                 "zy": _scalar(info.min + 3, dtype)}  # fmt: skip
    return _model(op_type, ["x", "sx", "zx", "sy", "zy"], feeds, constants, (out_shape or shape, dtype), **attrs), \
        feeds


def _concat(dtype: type) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    shapes = [(2, 3, 5), (2, 1, 5), (2, 7, 5)]
    feeds = {f"x{i}": _integers(dtype, s) for i, s in enumerate(shapes)}
    info = np.iinfo(dtype)
    constants = {"sy": _scalar(0.05, np.float32), "zy": _scalar(info.min + 128, dtype)}
    order = ["sy", "zy"]
    for i, scale in enumerate((0.05, 0.013, 0.2)):  # the first on the output's grid: moved, the others rescaled
        constants |= {f"s{i}": _scalar(scale, np.float32), f"z{i}": _scalar(info.min + 128 - 40 * i, dtype)}
        order += [f"x{i}", f"s{i}", f"z{i}"]
    return _model("QLinearConcat", order, feeds, constants, ((2, 11, 5), dtype), axis=1), feeds


def _where(dtype: type) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    feeds = {"c": RNG.random((3, 1, 7)) < 0.5, "x": _integers(dtype, (3, 4, 7)), "y": _integers(dtype, (1, 4, 1))}
    info = np.iinfo(dtype)
    constants = {"sx": _scalar(0.1, np.float32), "zx": _scalar(info.min + 10, dtype),
                 "sy": _scalar(0.3, np.float32), "zy": _scalar(info.max - 10, dtype),
                 "sz": _scalar(0.17, np.float32), "zz": _scalar(info.min + 128, dtype)}  # fmt: skip
    return _model("QLinearWhere", ["c", "x", "sx", "zx", "y", "sy", "zy", "sz", "zz"], feeds, constants,
                  ((3, 4, 7), dtype)), feeds  # fmt: skip


def _qgemm(a_dtype: type, m: int, k: int, n: int, bias: bool, quantized: bool, per_column: bool,
           trans_b: bool, alpha: float = 1.0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:  # fmt: skip
    feeds = {"a": _integers(a_dtype, (m, k))}
    b = _integers(np.int8, (n, k) if trans_b else (k, n))
    b_scale = (RNG.random(n) * 0.02 + 0.001).astype(np.float32) if per_column else _scalar(0.01, np.float32)
    constants = {"sa": _scalar(0.03, np.float32), "za": _scalar(np.iinfo(a_dtype).min + 77, a_dtype), "b": b,
                 "sb": b_scale, "zb": np.zeros(n, np.int8) if per_column else _scalar(3, np.int8)}  # fmt: skip
    order = ["a", "sa", "za", "b", "sb", "zb"]
    if bias:
        constants["c"] = RNG.integers(-20000, 20000, n).astype(np.int32)
    order.append("c" if bias else "")
    if quantized:
        constants |= {"sy": _scalar(0.06, np.float32), "zy": _scalar(np.iinfo(a_dtype).min + 100, a_dtype)}
        order += ["sy", "zy"]
    out_dtype = a_dtype if quantized else np.float32
    return _model("QGemm", order, feeds, constants, ((m, n), out_dtype), transB=int(trans_b), alpha=alpha), feeds


CASES: dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]] = {
    "add uint8 broadcast": _binary("QLinearAdd", np.uint8, (2, 3, 5, 7), (1, 3, 1, 1)),
    "add uint8 without output zero point": _binary("QLinearAdd", np.uint8, (13,), (13,), output_zero=False),
    "mul int8": _binary("QLinearMul", np.int8, (4, 1, 11), (1, 6, 11)),
    "mul uint8": _binary("QLinearMul", np.uint8, (1,), (3, 5)),
    "sigmoid uint8": _unary("QLinearSigmoid", np.uint8, (3, 17)),
    "sigmoid int8": _unary("QLinearSigmoid", np.int8, (256,)),
    "leaky relu int8": _unary("QLinearLeakyRelu", np.int8, (5, 7), alpha=0.2),
    "softmax last axis": _unary("QLinearSoftmax", np.uint8, (2, 3, 13), axis=-1, opset=13),
    "softmax opset 11 coerced": _unary("QLinearSoftmax", np.uint8, (2, 3, 5), axis=1, opset=11),  # in an opset-17 model
    "global average pool": _unary("QLinearGlobalAveragePool", np.uint8, (2, 3, 7, 5), (2, 3, 1, 1)),
    "global average pool channels last": _unary("QLinearGlobalAveragePool", np.int8, (2, 7, 5, 3), (2, 1, 1, 3),
                                                channels_last=1),
    "average pool": _unary("QLinearAveragePool", np.uint8, (1, 2, 9, 7), (1, 2, 5, 4), kernel_shape=[3, 3],
                           pads=[1, 1, 1, 1], strides=[2, 2]),
    "average pool channels last": _unary("QLinearAveragePool", np.int8, (1, 6, 5, 3), (1, 6, 5, 3),
                                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1,
                                         channels_last=1),
    "concat uint8": _concat(np.uint8),
    "concat int8": _concat(np.int8),
    "where int8": _where(np.int8),
    "qgemm uint8 float out": _qgemm(np.uint8, 3, 37, 5, bias=False, quantized=False, per_column=False, trans_b=False),
    "qgemm bias alpha transB per column": _qgemm(np.uint8, 4, 64, 7, bias=True, quantized=True, per_column=True,
                                                 trans_b=True, alpha=0.5),
    "qgemm int8 m 1": _qgemm(np.int8, 1, 19, 3, bias=True, quantized=True, per_column=False, trans_b=False),
    "qgemm float with bias": _qgemm(np.uint8, 2, 8, 9, bias=True, quantized=False, per_column=True, trans_b=True,
                                    alpha=2.0),
}  # fmt: skip
SATURATING = {"add uint8 broadcast", "add uint8 without output zero point", "mul int8", "sigmoid uint8", "sigmoid int8",
              "qgemm bias alpha transB per column", "qgemm int8 m 1"}


def _assert_matches(how: str, got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape, (how, got.dtype, got.shape, expected.shape)
    if expected.dtype == np.float32:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=how)
        return
    steps = np.abs(got.astype(np.int32) - expected.astype(np.int32))
    assert steps.max() <= 1, f"{how}: {steps.max()} steps apart"
    assert (steps == 1).sum() <= max(1, steps.size // 50), f"{how}: {(steps == 1).sum()} of {steps.size} one step"


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_onnxruntime_reference_and_compiled(case: str) -> None:
    model, feeds = CASES[case]
    expected = exact_int8_outputs(model, feeds)["out0"]
    if case in SATURATING:  # the case reaches an end of the output's range
        info = np.iinfo(expected.dtype)
        assert expected.min() == info.min or expected.max() == info.max, case
    graph = fission(import_model(model))
    assert not fallback_nodes(graph), "the rule did not take the node"
    _assert_matches("reference", run_reference(graph, feeds)["out0"], expected)
    _assert_matches("compiled", cpu_compile(model, cost="analytic").run(feeds)["out0"], expected)


def test_qgemm_is_an_integer_product() -> None:
    model, _ = CASES["qgemm bias alpha transB per column"]
    assert "matmul_integer" in [node.prim for node in fission(import_model(model)).nodes]


@pytest.mark.parametrize(("model", "reason"), [
    (_model("QLinearAdd", ["a", "sa", "", "b", "sb", "", "sy"],
            {"a": np.zeros((2, 3), np.uint8), "b": np.zeros((2, 3), np.uint8)},
            {"sa": np.ones(3, np.float32), "sb": _scalar(1, np.float32), "sy": _scalar(1, np.float32)},
            ((2, 3), np.uint8)), "per tensor only"),
    (_model("QLinearAdd", ["a", "sa", "", "b", "sb", "", "sy"],
            {"a": np.zeros((2, 3), np.uint8), "b": np.zeros((2, 3), np.int8)},
            {"sa": _scalar(1, np.float32), "sb": _scalar(1, np.float32), "sy": _scalar(1, np.float32)},
            ((2, 3), np.uint8)), "one type for both"),
    (_model("QLinearSoftmax", ["x", "sx", "", "sy"], {"x": np.zeros((2, 3), np.uint8)},
            {"sx": _scalar(1, np.float32), "sy": _scalar(1, np.float32)}, ((2, 3), np.uint8)), "no opset"),
    (_model("QLinearAveragePool", ["x", "sx", "", "sy"], {"x": np.zeros((1, 1, 4, 4), np.uint8)},
            {"sx": _scalar(1, np.float32), "sy": _scalar(1, np.float32)}, ((1, 1, 4, 4), np.uint8),
            kernel_shape=[3, 3], auto_pad="SAME_LOWER", storage_order=1), "storage_order"),
    (_model("QAttention", ["x"], {"x": np.zeros((1, 1, 4), np.uint8)}, {}, ((1, 1, 4), np.float32)),
     "no fission rule for this operator of domain 'com.microsoft'"),
])  # fmt: skip
def test_refusals_say_why(model: onnx.ModelProto, reason: str) -> None:
    with pytest.raises(UnsupportedOperator, match=reason):
        fission(import_model(model))


MUTANTS = [
    here("QGemm's alpha ignored", 'ctx.scalar(float(ctx.attr("alpha", 1.0)), "float32")', 'ctx.scalar(1.0, "float32")'),
    here("QGemm's bias dropped", 'sums = ctx.emit("add", sums, ctx.input(6))', "sums = sums"),
    here("QGemm's transB ignored", 'b_transposed=bool(ctx.allow("transB", 0, 1, default=0))',
         'b_transposed=not ctx.allow("transB", 0, 1, default=0)'),
    here("an absent zero point of the other type", "return ctx.scalar(0, dtype), False",
         'return ctx.scalar(0, "int8"), False', file="kernorch/fission/rules/integer_linear.py"),
    here("channels-last pools transposed the wrong way",
         "perm = (0, *range(2, rank), 1) if back else (0, rank - 1, *range(1, rank - 1))",
         "perm = (0, rank - 1, *range(1, rank - 1)) if back else (0, *range(2, rank), 1)"),
    here("QLinearConcat's output quantized with an input's parameters",
         "return [_quantized(ctx, result, 0, 1, ctx.type(1).dtype",
         "return [_quantized(ctx, result, 6, 7, ctx.type(1).dtype"),
    here("the float operator run at the model's opset", "at_opset=int(opset)", "at_opset=None"),
]
