"""Helpers for tests: build one-operator ONNX models, fission them, compare with onnxruntime."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from kernorch import machine
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.ir.graph import Graph
from kernorch.runtime import run_reference
from kernorch.runtime.compiled import CompiledModel
from kernorch.tools.check import run_onnxruntime


def single_op_model(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any] | None = None,
    constants: Mapping[str, np.ndarray] | None = None,
    input_order: Sequence[str] | None = None,
    outputs: int = 1,
    opset: int = 17,
) -> onnx.ModelProto:
    """A model with one node; `inputs` become graph inputs (their arrays give shape and dtype),
    `constants` become initializers; `input_order` lists the node's inputs ('' for an absent one)."""
    constants = dict(constants or {})
    order = list(input_order) if input_order is not None else [*inputs, *constants]
    output_names = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op_type, order, output_names, **dict(attrs or {}))
    graph_inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                    for name, a in inputs.items()]  # fmt: skip
    graph_outputs = [helper.make_empty_tensor_value_info(name) for name in output_names]
    graph = helper.make_graph([node], f"{op_type}_test", graph_inputs, graph_outputs,
                              [numpy_helper.from_array(a, name) for name, a in constants.items()])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    if any(not o.type.HasField("tensor_type") for o in model.graph.output):
        # Shape inference does not type function ops (e.g. GroupNormalization): run the ONNX reference.
        from onnx.reference import ReferenceEvaluator

        results = ReferenceEvaluator(model).run(None, dict(inputs))
        del model.graph.output[:]
        model.graph.output.extend(
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(r.dtype), r.shape)
            for name, r in zip(output_names, results, strict=True)
        )
    return model


def fission_and_compare(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], rtol: float = 1e-5,
                        atol: float = 1e-6) -> Graph:  # fmt: skip
    """Fission `model`, run the primitive graph, assert it matches onnxruntime; return the graph."""
    graph = fission(import_model(model))
    actual = run_reference(graph, feeds)
    expected = run_onnxruntime(model, dict(feeds))
    for name, reference in expected.items():
        got = actual[name]
        assert got.shape == reference.shape, f"{name}: shape {got.shape} != {reference.shape}"
        assert got.dtype == reference.dtype, f"{name}: dtype {got.dtype} != {reference.dtype}"
        np.testing.assert_allclose(got, reference, rtol=rtol, atol=atol, err_msg=name)
    return graph


def primitive_names(graph: Graph) -> list[str]:
    return [node.prim for node in graph.nodes]


def random_array(shape: Sequence[int], dtype: str = "float32", seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def integer_extremes(rng: np.random.Generator, dtype: Any, shape: Sequence[int]) -> np.ndarray:
    """Random values of an integer `dtype` with its extremes (and 0, 1) planted at the front: quantized operands."""
    info = np.iinfo(dtype)
    x: np.ndarray = rng.integers(info.min, int(info.max) + 1, tuple(shape)).astype(dtype)
    flat = x.reshape(-1)
    planted: np.ndarray = np.array([info.min, info.max, 0, info.max, info.min, 1], dtype)
    flat[: min(len(planted), flat.size)] = planted[: flat.size]
    return x


def branchy_model(cells: int = 3, branches: int = 8, channels: int = 16, size: int = 14,
                  seed: int = 0) -> onnx.ModelProto:  # fmt: skip
    """An irregular, NAS-cell-like model: each cell applies `branches` small independent operator chains to
    its input (pooling, depthwise and 1x1 convs, activations, gating) and sums them, so most kernels are small
    and many of them are independent of each other. Input `input` [1, channels, size, size]."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    weights: list[onnx.TensorProto] = []
    count = [0]

    def fresh(prefix: str) -> str:
        count[0] += 1
        return f"{prefix}{count[0]}"

    def node(op: str, inputs: list[str], **attrs: Any) -> str:
        out = fresh(op.lower())
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def weight(shape: tuple[int, ...], scale: float = 0.3) -> str:
        name = fresh("w")
        weights.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def branch(x: str, kind: int) -> str:
        same = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
        if kind == 0:
            return node("AveragePool", [node("Relu", [x])], **same)
        if kind == 1:
            return node("MaxPool", [x], **same)
        if kind == 2:
            return node("Conv", [x, weight((channels, 1, 3, 3))], group=channels, **{"pads": [1, 1, 1, 1]})
        if kind == 3:
            return node("Conv", [node("Sigmoid", [x]), weight((channels, channels, 1, 1))])
        if kind == 4:
            return node("Mul", [x, node("Tanh", [x])])
        if kind == 5:
            return node("Mul", [x, node("Sigmoid", [node("ReduceMean", [x], axes=[2, 3], keepdims=1)])])
        if kind == 6:
            return node("Relu", [node("Add", [node("Conv", [x, weight((channels, channels, 1, 1))]), x])])
        return node("Abs", [node("Sub", [x, node("ReduceMean", [x], axes=[1], keepdims=1)])])

    x = "input"
    for _ in range(cells):
        outs = [branch(x, (b * 5 + cells) % 8 if b >= 8 else b) for b in range(branches)]
        total = outs[0]
        for out in outs[1:]:
            total = node("Add", [total, out])
        x = node("Mul", [total, weight((1, channels, 1, 1), 1.0 / branches)])
    nodes[-1].output[0] = "output"
    shape = [1, channels, size, size]
    values = [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape) for name in ("input", "output")]
    graph = helper.make_graph(nodes, "branchy", values[:1], values[1:], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def cpu_compile(model: Any, **options: Any) -> CompiledModel:
    """`kernorch.compile` of a model with static shapes for the CPU: a CompiledModel (typed as one)."""
    from kernorch.api import compile

    compiled = compile(model, **options)
    assert isinstance(compiled, CompiledModel), type(compiled)
    return compiled


def dynamically_quantized_convolution() -> onnx.ModelProto:
    """x → DynamicQuantizeLinear → a 3x3 ConvInteger of int8 weights → scaled to float, biased, relu: one layer as
    onnxruntime's quantize_dynamic writes it."""
    rng = np.random.default_rng(11)
    constants: dict[str, np.ndarray] = {"w": rng.integers(-127, 127, (6, 5, 3, 3)).astype(np.int8),
                                        "wz": np.zeros((), np.int8),
                                        "ws": np.asarray(0.01, np.float32),
                                        "b": rng.normal(0, 1, (1, 6, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["acc"], pads=[1, 1, 1, 1]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]), helper.make_node("Mul", ["accf", "s"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "dq-conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 7, 7])],
                              [numpy_helper.from_array(v, k) for k, v in constants.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def keep_integer_convolutions(monkeypatch: Any) -> None:
    """Fission makes every integer convolution the int8 primitive, as on a CPU with VNNI, for tests of the int8
    kernels and of what int8 plans show, on any CPU (without VNNI a QDQ convolution stays float and a ConvInteger
    runs in float32 where that is exact: fission/rules/common.integer_convolution_pays)."""
    from kernorch.fission import qdq
    from kernorch.fission.rules import integer_linear

    for module in (qdq, integer_linear):
        monkeypatch.setattr(module, "integer_convolution_pays", lambda source, widest_weight: True)


# onnxruntime's operators multiplying bytes on its own int8 kernels: (the source's input, the weights') (ConvInteger
# was not seen saturating; counted anyway, onnx.reference's sums being exact either way)
_BYTE_PRODUCTS = {"MatMulInteger": (0, 1), "QLinearMatMul": (0, 3), "QLinearConv": (0, 3), "ConvInteger": (0, 1),
                  "QGemm": (0, 3)}


def onnxruntime_saturates(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> bool:
    """Whether onnxruntime's sums of `model`'s byte products may saturate on this CPU: without VNNI its AVX2 kernels
    add each pair of unsigned-by-signed byte products in an int16 (a limitation its quantization guide states; its
    remedy is 7-bit weights), where ONNX's sums are exact. Seen on AMD Zen 3 for MatMulInteger, QLinearMatMul and
    QLinearConv (and QDQ models it fuses into them)."""
    if machine.int8_dot_products():
        return False
    values = {**{i.name: numpy_helper.to_array(i) for i in model.graph.initializer}, **feeds}
    for node in model.graph.node:
        operands = [values.get(node.input[i]) for i in _BYTE_PRODUCTS.get(node.op_type, ())]
        if len(operands) == 2 and all(v is not None for v in operands):
            dtypes = [np.asarray(v).dtype for v in operands]
            if dtypes == [np.dtype(np.uint8), np.dtype(np.int8)] or np.dtype(np.int8) in dtypes:
                return True
        if node.op_type == "DequantizeLinear" and values.get(node.input[0]) is not None \
                and np.asarray(values[node.input[0]]).dtype == np.int8:  # fmt: skip
            return True  # int8 weights onnxruntime may fuse into one of its int8 products
    return False


def exact_int8_outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What a test of integer products compares with: onnxruntime's outputs, or where its sums saturate on this CPU
    (`onnxruntime_saturates`), those of the model unfused (a QDQ or QOperator model's products in float), or
    onnx.reference's, whose integer sums are exact."""
    if not onnxruntime_saturates(model, feeds):
        return run_onnxruntime(model, dict(feeds))
    from kernorch.tools.qoperator_expansion import expanded

    written = expanded(model)  # com.microsoft's QOperator nodes as DequantizeLinear → float operator → QuantizeLinear
    if not any(node.op_type in ("MatMulInteger", "ConvInteger") for node in written.graph.node):
        return run_onnxruntime(written, dict(feeds), optimized=False)  # unfused: the products in float
    from onnx.reference import ReferenceEvaluator

    names = [o.name for o in model.graph.output]
    return dict(zip(names, (np.asarray(v) for v in ReferenceEvaluator(model).run(names, dict(feeds))), strict=True))
