"""QDQ patterns (qdq.py): dequantized products as integer products: QDQ MatMul and Gemm (transB, bias) become
matmul_integer, QDQ Conv (per-channel or per-tensor, grouped, with a bias) conv_integer, where the pattern holds,
and stay float where it does not (a runtime scale, weights too far from their zero point for int8, block
quantization), with the reason visible in the graph; the results agree with onnxruntime (which fuses the same
patterns into its own integer kernels) to float rounding, and with onnxruntime's unfused float run of the QDQ file
within the quantized tolerance."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch import machine
from kernorch.codegen.backends.library_calls import ONEDNN, library_call
from kernorch.cost.profile import isolate
from kernorch.devtools.mutate import here
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.ir.kernel import make_kernel
from kernorch.runtime import run_reference
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.feeds import seeded_feeds
from kernorch.testing import cpu_compile, exact_int8_outputs
from kernorch.tools.check import run_onnxruntime

RNG = np.random.default_rng(3)
# Without VNNI (AVX2: AMD Zen 3) oneDNN's int8 sums, and onnxruntime's, are exact for an unsigned source by 7-bit
# weights only: the convolutions' weights are drawn that wide there, full int8 where both are exact
WIDEST = 127 if machine.int8_dot_products() else 64


def _on_onednn_here(activations: str) -> bool:
    """Whether oneDNN's int8 convolution takes `activations` on this CPU (a signed source needs VNNI)."""
    return machine.int8_dot_products() or activations == "uint8"


def _qdq_model(op: str = "MatMul", *, rows: int = 6, depth: int = 40, columns: int = 24, trans_b: int = 0,
               per_column: bool = True, weights: str = "int8", weight_zero: int = 0, bias: bool = False,
               runtime_scale: bool = False, full_range: bool = False) -> onnx.ModelProto:  # fmt: skip
    """x (float) -> QuantizeLinear -> DequantizeLinear -> op(., DequantizeLinear(constant weights)) [+ bias]: what
    onnxruntime's quantize_static writes around a linear layer."""
    info = np.iinfo(np.dtype(weights))
    shape = (columns, depth) if trans_b else (depth, columns)
    low, high = (info.min, int(info.max)) if full_range else (max(info.min, weight_zero - 127),
                                                                min(int(info.max), weight_zero + 127))  # fmt: skip
    w = RNG.integers(low, high + 1, shape)
    scale = np.linspace(0.002, 0.02, columns).astype(np.float32) if per_column else np.asarray(0.01, np.float32)
    zero = np.full(scale.shape, weight_zero, weights)
    constants = {"w": w.astype(weights), "ws": scale, "wz": zero, "xs": np.asarray(0.05, np.float32),
                 "xz": np.asarray(3, np.int8), "bias": RNG.standard_normal(columns).astype(np.float32)}  # fmt: skip
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, depth])]
    if runtime_scale:
        del constants["xs"]
        inputs.append(helper.make_tensor_value_info("xs", TensorProto.FLOAT, []))
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0 if trans_b else 1)]  # fmt: skip
    if op == "MatMul":
        nodes.append(helper.make_node("MatMul", ["xd", "wd"], ["y"] if not bias else ["p"]))
        if bias:
            nodes.append(helper.make_node("Add", ["p", "bias"], ["y"]))
    else:
        nodes.append(helper.make_node("Gemm", ["xd", "wd", *(["bias"] if bias else [])], ["y"], transB=trans_b))
    graph = helper.make_graph(nodes, "qdq", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                   [rows, columns])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    x = RNG.standard_normal((6, 40)).astype(np.float32) * 3
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.025]  # NaN quantizes to the lowest value, a tie rounds to even
    feeds = {"x": x}
    if any(i.name == "xs" for i in model.graph.input):
        feeds["xs"] = np.asarray(0.05, np.float32)
    return feeds


CASES: dict[str, dict[str, Any]] = {
    "MatMul, per-column scales": dict(),
    "MatMul, per-tensor scale, then a bias": dict(per_column=False, bias=True),
    "Gemm transB with bias": dict(op="Gemm", trans_b=1, bias=True),
    "Gemm without transB": dict(op="Gemm"),
    "uint8 weights centred on 128": dict(weights="uint8", weight_zero=128),
}


@pytest.mark.parametrize("case", list(CASES))
def test_integer_products_agree_with_onnxruntime(case: str) -> None:
    model = _qdq_model(**CASES[case])
    graph = fission(import_model(model))
    assert [n.prim for n in graph.nodes].count("matmul_integer") == 1
    assert "matmul" not in [n.prim for n in graph.nodes]
    feeds = _feeds(model)
    expected = exact_int8_outputs(model, feeds)["y"]
    float_run = run_onnxruntime(model, feeds, optimized=False)["y"]
    scale = float(np.abs(expected).max())
    for got in (run_reference(graph, feeds)["y"], cpu_compile(model, cost="analytic").run(feeds)["y"]):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * scale)
        np.testing.assert_allclose(got, float_run, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("change", [
    dict(runtime_scale=True),  # the activations' scale is a graph input
    dict(weights="uint8", weight_zero=0, full_range=True),  # 0..255 from a zero point of 0: beyond int8
])  # fmt: skip
def test_left_float_where_the_pattern_does_not_hold(change: dict[str, Any]) -> None:
    model = _qdq_model(**change)
    graph = fission(import_model(model))
    prims = [n.prim for n in graph.nodes]
    assert "matmul_integer" not in prims and "matmul" in prims
    feeds = _feeds(model)
    np.testing.assert_allclose(run_reference(graph, feeds)["y"], run_onnxruntime(model, feeds, optimized=False)["y"],
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def _qdq_conv_model(*, channels: int = 8, out_channels: int = 12, group: int = 1, per_channel: bool = True,
                    bias: bool = True, activations: str = "uint8", runtime_scale: bool = False,
                    requantized: bool = False) -> onnx.ModelProto:  # fmt: skip
    """x [1, C, 10, 10] (float) -> Q -> DQ -> Conv 3x3 padded (DQ of constant int8 weights, per output channel or
    per tensor; a bias) -> Relu -> GlobalAveragePool: a quantize_static convolution, and a classifier's pooling
    (whose [1, O, 1, 1] output is the same bytes in either layout, so the relu stays with the convolution).
    `requantized`: the relu's output quantized again (Q, on a scale the largest values saturate) for a second,
    1x1 QDQ convolution to 6 channels, whose output is the model's (as quantize_static writes a layer feeding
    another)."""
    w = RNG.integers(-WIDEST, WIDEST + 1, (out_channels, channels // group, 3, 3)).astype(np.int8)
    w.reshape(-1)[:2] = -WIDEST, WIDEST  # the widest weights drawn, at both ends
    scale = np.linspace(0.002, 0.02, out_channels).astype(np.float32) if per_channel else np.asarray(0.01, np.float32)
    zero = 3 if activations == "uint8" else -5
    constants = {"w": w, "ws": scale, "wz": np.zeros(scale.shape, np.int8), "xs": np.asarray(0.05, np.float32),
                 "xz": np.asarray(zero, activations), "bias": RNG.standard_normal(out_channels).astype(np.float32)}
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 10, 10])]
    if runtime_scale:
        del constants["xs"]
        inputs.append(helper.make_tensor_value_info("xs", TensorProto.FLOAT, []))
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", *(["bias"] if bias else [])], ["c"], group=group,
                              pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["y"])]  # fmt: skip
    output_shape = [1, out_channels, 1, 1]
    if requantized:
        constants.update(rs=np.asarray(0.013, np.float32), rz=np.asarray(-9 if activations == "int8" else 7,
                                                                          activations),
                         w2=RNG.integers(-WIDEST, WIDEST + 1, (6, out_channels, 1, 1)).astype(np.int8),
                         ws2=np.asarray(0.01, np.float32), wz2=np.asarray(0, np.int8))  # fmt: skip
        nodes[-1:] = [helper.make_node("QuantizeLinear", ["r", "rs", "rz"], ["rq"]),
                      helper.make_node("DequantizeLinear", ["rq", "rs", "rz"], ["rd"]),
                      helper.make_node("DequantizeLinear", ["w2", "ws2", "wz2"], ["wd2"]),
                      helper.make_node("Conv", ["rd", "wd2"], ["y"], kernel_shape=[1, 1])]  # fmt: skip
        output_shape = [1, 6, 10, 10]
    graph = helper.make_graph(nodes, "qdq_conv", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                        output_shape)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


CONV_CASES: dict[str, dict[str, Any]] = {
    "per-channel scales, a bias": dict(),
    "per-tensor scale, no bias": dict(per_channel=False, bias=False),
    "depthwise, per-channel": dict(group=8, out_channels=8),
    "int8 activations, two groups": dict(activations="int8", group=2),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_integer_convolutions_agree_with_onnxruntime(case: str) -> None:
    """Conv of dequantized values: an int8 convolution (oneDNN's, its scales and the source's zero point as its
    attributes, the bias and relu as post-ops), as onnxruntime's own QDQ fusion computes it."""
    model = _qdq_conv_model(**CONV_CASES[case])
    graph = fission(import_model(model))
    integer = _on_onednn_here(CONV_CASES[case].get("activations", "uint8"))  # else the float convolution stays
    assert ("conv_integer" in [n.prim for n in graph.nodes]) == integer != ("conv" in [n.prim for n in graph.nodes])
    x = (RNG.standard_normal((1, model.graph.input[0].type.tensor_type.shape.dim[1].dim_value, 10, 10)) * 3)
    x = x.astype(np.float32)
    x[0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    feeds = {"x": x}
    expected = exact_int8_outputs(model, feeds)["y"]
    float_run = run_onnxruntime(model, feeds, optimized=False)["y"]
    scale = float(np.abs(expected).max())
    compiled = cpu_compile(model, cost="analytic")
    assert (("conv_integer", "onednn") in [(n.prim, b.name) for k, b in zip(compiled.kernels,
            compiled.executor.backends, strict=True) for n in k.primitives]) == _on_onednn_here(
        CONV_CASES[case].get("activations", "uint8"))  # fmt: skip
    for got in (run_reference(graph, feeds)["y"], compiled.run(feeds)["y"]):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * scale)
        np.testing.assert_allclose(got, float_run, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_the_dequantization_bias_and_relu_run_inside_the_int8_convolution(case: str, tmp_path: Path) -> None:
    """The whole epilogue of a QDQ convolution as one oneDNN call — the dequantization as its output scales (per
    output channel of a grouped convolution too), the bias, the relu — against the reference, whatever the plan
    chooses to fuse."""
    if not _on_onednn_here(CONV_CASES[case].get("activations", "uint8")):
        pytest.skip("oneDNN's int8 convolution of a signed source is not exact without VNNI (it halves the weights)")
    graph = cpu_compile(_qdq_conv_model(**CONV_CASES[case]), cost="analytic").kernels[0].graph
    chain = [next(i for i, n in enumerate(graph.nodes) if n.prim == "conv_integer")]
    while graph.nodes[chain[-1]].prim != "relu":
        chain.append(next(i for i, n in enumerate(graph.nodes) if graph.nodes[chain[-1]].outputs[0] in n.inputs))
    assert [graph.nodes[i].prim for i in chain] in (["conv_integer", "cast", "mul", "add", "relu"],
                                                    ["conv_integer", "cast", "mul", "relu"])  # fmt: skip
    kernel = isolate(make_kernel(graph, tuple(chain), (graph.nodes[chain[-1]].outputs[0],)))
    assert ONEDNN.applies(kernel).runs and library_call(kernel).scales is not None
    feeds = seeded_feeds({v: kernel.graph.types[v] for v in kernel.graph.inputs}, seed=4)
    got = PlanExecutor(kernel.graph, [kernel], 2, tmp_path)(feeds)
    for name, want in run_reference(kernel.graph, feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.sanitize  # its oneDNN call's dst scale and zero point under the sanitizers in `make sanitize`
@pytest.mark.parametrize("activations", ["uint8", "int8"])
def test_a_requantized_convolution_writes_its_integers_itself(activations: str) -> None:
    """Conv -> Relu -> Q of the next layer: one oneDNN call writing the quantizer's integers (its dst scale and zero
    point; saturated at the top, zero points of 7 and -9), equal to kernorch's exact quantizer where no sum lies
    within a rounding of a tie."""
    if not _on_onednn_here(activations):
        pytest.skip("oneDNN's int8 convolution of a signed source is not exact without VNNI (it halves the weights)")
    model = _qdq_conv_model(activations=activations, requantized=True)
    compiled = cpu_compile(model, cost="analytic")
    calls = [(library_call(k), b) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
             if any(n.prim == "conv_integer" for n in k.primitives)]  # fmt: skip
    requantizing = [call for call, backend in calls if call.dst.dtype == activations and backend is ONEDNN]
    assert len(calls) == 2 and len(requantizing) == 1, calls
    assert requantizing[0].dst_scale is not None and requantizing[0].dst_zero is not None
    graph = fission(import_model(model))
    step = 0.013 * 0.01 * 127  # one requantized value one step off moves each output it reaches by at most this
    for seed in range(3):
        feeds = {"x": (np.random.default_rng(seed).standard_normal((1, 8, 10, 10)) * 3).astype(np.float32)}
        exact = run_reference(graph, feeds)["y"]
        got = compiled.run(feeds)["y"]
        np.testing.assert_allclose(got, exact, rtol=0, atol=1.01 * step)
        assert np.count_nonzero(np.abs(got - exact) > 1e-5) <= 6, np.abs(got - exact).max()  # one value's outputs
        saturated = run_reference(graph, {"x": feeds["x"] * 50})["y"]
        np.testing.assert_allclose(compiled.run({"x": feeds["x"] * 50})["y"], saturated, rtol=0, atol=1.01 * step)


@pytest.mark.parametrize("change", [
    dict(runtime_scale=True),  # the activations' scale is a graph input
])  # fmt: skip
def test_a_convolution_stays_float_where_the_pattern_does_not_pay(change: dict[str, Any]) -> None:
    model = _qdq_conv_model(**change)
    prims = [n.prim for n in fission(import_model(model)).nodes]
    assert "conv_integer" not in prims and "conv" in prims


@pytest.mark.parametrize(("activations", "widest", "integer"), [("uint8", 64, True), ("uint8", 127, False),
                                                                ("int8", 64, False)])  # fmt: skip
def test_without_vnni_a_convolution_is_integer_only_where_onednn_sums_it_exactly(  # type: ignore[no-untyped-def]
        monkeypatch, activations: str, widest: int, integer: bool) -> None:
    """On a CPU without VNNI an int8 convolution would run exactly only on the reference: the float convolution
    the model defines stays, but for an unsigned source by 7-bit weights (oneDNN's exact case); numbers unchanged."""
    monkeypatch.setattr(machine, "int8_dot_products", lambda: False)
    monkeypatch.setattr(sys.modules[__name__], "WIDEST", widest)
    model = _qdq_conv_model(activations=activations)
    prims = [n.prim for n in fission(import_model(model)).nodes]
    assert ("conv_integer" in prims) == integer and ("conv" in prims) != integer
    feeds = {"x": (np.random.default_rng(2).standard_normal((1, 8, 10, 10)) * 3).astype(np.float32)}
    expected = run_onnxruntime(model, feeds, optimized=False)["y"]
    np.testing.assert_allclose(cpu_compile(model, cost="analytic").run(feeds)["y"], expected, rtol=1e-4,
                               atol=1e-4 * float(np.abs(expected).max()))  # fmt: skip


def _moves_model(second_scale: float = 0.05, consumer: str = "Add") -> onnx.ModelProto:
    """x -> Q -> DQ -> Reshape -> Q -> DQ -> Transpose -> Q -> DQ -> consumer: the requantizations around moves that
    quantize_static writes (the second one on `second_scale`'s grid)."""
    constants: dict[str, np.ndarray] = {"s": np.asarray(0.05, np.float32), "s2": np.asarray(second_scale, np.float32),
                 "z": np.asarray(-7, np.int8), "shape": np.asarray([4, 6], np.int64),
                 "other": RNG.standard_normal((6, 4)).astype(np.float32)}  # fmt: skip
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s", "z"], ["d1"]),
             helper.make_node("Reshape", ["d1", "shape"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s2", "z"], ["q2"]),
             helper.make_node("DequantizeLinear", ["q2", "s2", "z"], ["d2"]),
             helper.make_node("Transpose", ["d2"], ["t"], perm=[1, 0]),
             helper.make_node("QuantizeLinear", ["t", "s2", "z"], ["q3"]),
             helper.make_node("DequantizeLinear", ["q3", "s2", "z"], ["d3"]),
             helper.make_node(consumer, ["d3", "other"] if consumer == "Add" else ["d3"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "moves", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 4])],
                              [numpy_helper.from_array(v, k) for k, v in constants.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("second_scale, bypassed", [(0.05, 2), (0.07, 1)])
def test_requantizing_moved_values_on_the_same_grid_is_dropped(second_scale: float, bypassed: int) -> None:
    """Each Q -> DQ after a move on its source's grid reproduces the moved values: dropped (its quantizers' work
    leaves the graph), bit for bit the same result; on another grid it quantizes for real and stays (the one after
    it, on its grid, goes)."""
    model = _moves_model(second_scale)
    graph = fission(import_model(model))
    assert [n.prim for n in graph.nodes].count("saturating_round") == 3 - bypassed
    x = (RNG.standard_normal((2, 12)) * 4).astype(np.float32)
    x[0, :3] = [np.nan, 1e9, 0.075]  # NaN to the lowest step, saturation, a tie
    feeds = {"x": x}
    expected = run_onnxruntime(model, feeds, optimized=False)["y"]
    np.testing.assert_array_equal(run_reference(graph, feeds)["y"], expected)
    # compiled, the dequantization's product and the sum after it may contract into one rounding (an ulp)
    np.testing.assert_allclose(cpu_compile(model, cost="analytic").run(feeds)["y"], expected, rtol=2e-7, atol=1e-6)


def test_a_requantization_after_arithmetic_stays() -> None:
    """Q -> DQ after a square root of dequantized values, on the same grid: the roots are off the grid, so it
    quantizes for real."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s", "z"], ["d1"]),
             helper.make_node("Sqrt", ["d1"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q2"]),
             helper.make_node("DequantizeLinear", ["q2", "s", "z"], ["d2"]),
             helper.make_node("Neg", ["d2"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "root", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
                              [numpy_helper.from_array(np.asarray(0.05, np.float32), "s"),
                               numpy_helper.from_array(np.asarray(0, np.uint8), "z")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    graph_ = fission(import_model(model))
    assert [n.prim for n in graph_.nodes].count("saturating_round") == 2
    feeds = {"x": (RNG.random((3, 5)) * 5).astype(np.float32)}
    expected = run_onnxruntime(model, feeds, optimized=False)["y"]
    np.testing.assert_array_equal(run_reference(graph_, feeds)["y"], expected)


MUTANTS = [
    here("a QDQ convolution made integer without VNNI whatever its source and weights",
         "return machine.int8_dot_products() or (source == np.uint8",
         "return True or (source == np.uint8", file="kernorch/fission/rules/common.py"),
    here("a QDQ convolution by weights at the saturation edge kept float without VNNI",
         "widest_weight <= machine.SATURATION_FREE_WEIGHT)", "widest_weight < machine.SATURATION_FREE_WEIGHT)",
         file="kernorch/fission/rules/common.py"),
    here("requantization dropped on another grid", "return parameters[0] == parameters[1]", "return True"),
    here("requantization dropped after any operator", "if move is None or move.op_type not in VALUE_MOVES",
         "if move is None"),
    here("the activations' scale left out of the product's scale", "(activation[1] * w_scale).astype(np.float32)",
         "w_scale.astype(np.float32)"),
    here("Gemm's transposed weights not transposed", "(integers.T.copy() if transposed else integers)",
         "integers"),
    here("the per-column zero points' range checked along rows", "centred_int8(integers, zero, columns_axis)",
         "centred_int8(integers, zero, 1 - columns_axis)"),
    here("a convolution's per-channel scales laid along the wrong axis",
         "channels = (1, w.shape[0]) + (1,) * (w.ndim - 2)", "channels = (w.shape[0],) + (1,) * (w.ndim - 1)"),
    here("a convolution's bias added before its scale", 'helper.make_node("Mul", [floats, scales], [scaled]',
         'helper.make_node("Mul", [floats, scales], [scaled + "_unused"]'),
    here("a requantized convolution's dst zero point left out",
         "dst_zero=Tensor(slots[requantized.zero], *scalar, requantized.zero in graph.constants))",
         "dst_zero=None)", file="kernorch/codegen/library/call.py"),
    here("a requantized convolution's dst scale not declared to oneDNN",
         'w.line("KO_CHECK(dnnl_primitive_attr_set_scales_mask(attr, DNNL_ARG_DST, 0));")',
         "pass", file="kernorch/codegen/library/onednn.py"),
    here("a uint8 requantization's range taken for int8's",
         '_DST_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}',
         '_DST_RANGES = {"int8": (-128, 127), "uint8": (-128, 127)}', file="kernorch/codegen/library/call.py"),
    here("a runtime scale taken",
         "if scale is None or zero is None or scale.size != 1 or zero.size != 1 or scale.dtype",
         "if zero is None or zero.size != 1 or scale is not None and scale.dtype"),
]  # fmt: skip
