"""QDQ patterns on the ONNX graph, found before the fission rules run (the rules fold a constant's DequantizeLinear
into float weights, and see one node at a time). What onnxruntime's `quantize_static` writes around each operator
becomes what its quantization means, computed as onnxruntime and OpenVINO compute it:

1. A requantization that cannot change a value is dropped: DequantizeLinear(QuantizeLinear(m)) where m moves values
   of DequantizeLinear(q) (Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Identity, Slice, MaxPool: each output
   value is one of the input's) with the same constant scale and zero point per tensor: every value of m is
   already a step of that grid, x / scale rounds back to its integer, and the dequantized value is m's, bit for
   bit. Its float consumers read m (a product that becomes an integer product keeps its integer operand).
2. Dequantized products become integer products: MatMul or Gemm of DequantizeLinear(int8 activations) by
   DequantizeLinear(constant int8 weights) is MatMulInteger of the integers, scaled once:

    MatMul(DQ(a, sa, za), DQ(W, sw, zw))  ->  Cast(MatMulInteger(a, W, za, zw), float) * (sa * sw)
    Gemm(DQ(a), DQ(W), C)                 ->  the same (+ C), W transposed once where transB

   The sums are exact where the float product of dequantized values rounds each partial sum: the result differs
   from the ONNX reference's by float rounding, not by a quantization step. A product is left as it is (float,
   through the rules) unless: the activations' scale and zero point are constant and per tensor, the weights are a
   constant 2-D int8/uint8 matrix with constant scales per tensor or per output column, their distance from the
   zero point fits int8 (the int8 kernel's operand), and K keeps int32 sums exact.
3. Dequantized convolutions become integer convolutions the same way, their weights' zero points folded into them
   (centred int8) and their scales per tensor or per output channel:

    Conv(DQ(x, sx, zx), DQ(W, sw, zw), B)  ->  Cast(ConvInteger(x, W - zw, zx, 0), float) * (sx * sw) + B

   On a CPU without VNNI only an unsigned source by weights within 64 (oneDNN's int8 convolution is exact there
   for those alone: codegen/library/onednn.py); any other stays the float convolution of the dequantized values,
   which is what the model defines and faster than an exact integer one without VNNI (`integer_convolution_pays`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from kernorch.fission.rules.common import centred_int8, integer_convolution_pays
from kernorch.frontend.onnx_import import ImportedModel
from kernorch.ir.primitives import MAX_INTEGER_K


def _attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


class _Graph:
    """The model's producers and constants, and fresh names for what the fusion adds."""

    def __init__(self, model: ImportedModel) -> None:
        self.constants = model.constants
        self.producers = {out: node for node in model.graph.node for out in node.output if out}
        self.names = {*self.producers, *self.constants, *(i.name for i in model.graph.input)}
        self.added: dict[str, np.ndarray] = {}

    def fresh(self, base: str) -> str:
        name, n = base, 0
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        return name

    def constant(self, base: str, array: np.ndarray) -> str:
        name = self.fresh(base)
        self.added[name] = array
        return name

    def dequantized(self, value: str) -> onnx.NodeProto | None:
        node = self.producers.get(value)
        return node if node is not None and node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx") \
            else None  # fmt: skip


def _activation(graph: _Graph, value: str) -> tuple[str, np.ndarray, str] | None:
    """(integers, scale, zero point) of an activation dequantized per tensor with constant parameters."""
    node = graph.dequantized(value)
    if node is None or len(node.input) < 3 or not node.input[2]:
        return None
    scale, zero = graph.constants.get(node.input[1]), graph.constants.get(node.input[2])
    if scale is None or zero is None or scale.size != 1 or zero.size != 1 or scale.dtype != np.float32 \
            or zero.dtype not in (np.int8, np.uint8) or _attribute(node, "block_size", 0):  # fmt: skip
        return None
    return node.input[0], scale.reshape(()), node.input[2]


def _weights(graph: _Graph, value: str, transposed: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """([K, N] integers, scale () or [N], zero point () or [N]) of constant weights dequantized per tensor or per
    output column (`transposed`: stored [N, K], as Gemm's transB reads them)."""
    node = graph.dequantized(value)
    if node is None:
        return None
    integers, scale = graph.constants.get(node.input[0]), graph.constants.get(node.input[1])
    zero = graph.constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if integers is None or scale is None or integers.ndim != 2 or integers.dtype not in (np.int8, np.uint8) \
            or scale.dtype != np.float32 or _attribute(node, "block_size", 0):  # fmt: skip
        return None
    if zero is None:
        zero = np.zeros((), integers.dtype)
    if zero.dtype != integers.dtype:
        return None
    columns_axis = 0 if transposed else 1
    per_column = scale.size != 1
    if per_column and (scale.shape != (integers.shape[columns_axis],)
                       or int(_attribute(node, "axis", 1)) % 2 != columns_axis):  # fmt: skip
        return None
    if zero.size != 1 and zero.shape != scale.shape:
        return None
    # a zero point per column, against the stored matrix
    if centred_int8(integers, zero, columns_axis) is None or integers.shape[1 - columns_axis] > MAX_INTEGER_K:
        return None
    return (integers.T.copy() if transposed else integers), scale.reshape(scale.shape if per_column else ()), \
        zero.reshape(zero.shape if zero.size != 1 else ())  # fmt: skip


def _integer_product(graph: _Graph, node: onnx.NodeProto, a: str, b: str,
                     transposed: bool) -> list[onnx.NodeProto] | None:  # fmt: skip
    """The nodes computing `node`'s product of a and b as an integer product, scaled (before any bias)."""
    activation = _activation(graph, a)
    weights = _weights(graph, b, transposed)
    if activation is None or weights is None:
        return None
    integers, zero_value = activation[0], activation[2]
    w, w_scale, w_zero = weights
    out = node.output[0]
    w_name = graph.constant(f"{out}_int8_weights", w)
    w_zero_name = graph.constant(f"{out}_int8_weights_zero", w_zero)
    scales = graph.constant(f"{out}_int8_scales", (activation[1] * w_scale).astype(np.float32))
    sums, floats = graph.fresh(f"{out}_int8_sums"), graph.fresh(f"{out}_int8_floats")
    return [helper.make_node("MatMulInteger", [integers, w_name, zero_value, w_zero_name], [sums],
                             name=f"{node.name}_int8"),
            helper.make_node("Cast", [sums], [floats], to=onnx.TensorProto.FLOAT, name=f"{node.name}_int8_cast"),
            helper.make_node("Mul", [floats, scales], [out], name=f"{node.name}_int8_scale")]  # fmt: skip


def _conv_weights(graph: _Graph, value: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(int8 weights with their zero points subtracted, scale () or [O]) of constant convolution weights dequantized
    per tensor or per output channel, when every centred weight fits int8."""
    node = graph.dequantized(value)
    if node is None:
        return None
    integers, scale = graph.constants.get(node.input[0]), graph.constants.get(node.input[1])
    zero = graph.constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if integers is None or scale is None or integers.ndim < 3 or integers.dtype not in (np.int8, np.uint8) \
            or scale.dtype != np.float32 or _attribute(node, "block_size", 0):  # fmt: skip
        return None
    zero = np.zeros((), integers.dtype) if zero is None else zero
    channels = integers.shape[0]
    per_channel = scale.size != 1
    if zero.dtype != integers.dtype or per_channel and (scale.shape != (channels,) or _attribute(node, "axis", 1)
                                                        % integers.ndim != 0) \
            or zero.size != 1 and zero.shape != (channels,):  # fmt: skip
        return None
    centred = centred_int8(integers, zero, 0)
    return None if centred is None else (centred, scale.reshape(scale.shape if per_channel else ()))


def _integer_convolution(graph: _Graph, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """The nodes computing Conv `node` of dequantized activations and weights as an integer convolution."""
    activation = _activation(graph, node.input[0])
    weights = _conv_weights(graph, node.input[1])
    if activation is None or weights is None:
        return None
    w, w_scale = weights
    widest = int(np.abs(w.astype(np.int32)).max(initial=0))
    if not integer_convolution_pays(graph.constants[activation[2]].dtype, widest):
        return None  # no int8 kernel here sums it both exactly and fast: the float convolution the model defines
    out = node.output[0]
    channels = (1, w.shape[0]) + (1,) * (w.ndim - 2)  # an operand broadcast along the output channels
    w_name = graph.constant(f"{out}_int8_weights", w)
    w_zero = graph.constant(f"{out}_int8_weights_zero", np.zeros((), np.int8))
    scales = graph.constant(f"{out}_int8_scales", (w_scale * activation[1]).astype(np.float32).reshape(
        channels if w_scale.size != 1 else ()))  # fmt: skip
    sums, floats = graph.fresh(f"{out}_int8_sums"), graph.fresh(f"{out}_int8_floats")
    scaled = graph.fresh(f"{out}_int8_scaled") if len(node.input) > 2 and node.input[2] else out
    nodes = [helper.make_node("ConvInteger", [activation[0], w_name, activation[2], w_zero], [sums],
                              name=f"{node.name}_int8"),
             helper.make_node("Cast", [sums], [floats], to=onnx.TensorProto.FLOAT, name=f"{node.name}_int8_cast"),
             helper.make_node("Mul", [floats, scales], [scaled], name=f"{node.name}_int8_scale")]  # fmt: skip
    nodes[0].attribute.extend(node.attribute)  # the geometry, as the Conv has it
    if scaled != out:
        shape = graph.constant(f"{out}_int8_bias_shape", np.asarray(channels, np.int64))
        bias = graph.fresh(f"{out}_int8_bias")
        nodes += [helper.make_node("Reshape", [node.input[2], shape], [bias], name=f"{node.name}_bias_shape"),
                  helper.make_node("Add", [scaled, bias], [out], name=f"{node.name}_bias")]  # fmt: skip
    return nodes


def _replacement(graph: _Graph, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Conv":
        return _integer_convolution(graph, node)
    if node.op_type == "MatMul":
        return _integer_product(graph, node, node.input[0], node.input[1], transposed=False)
    if node.op_type != "Gemm" or _attribute(node, "transA", 0) or _attribute(node, "alpha", 1.0) != 1.0 \
            or _attribute(node, "beta", 1.0) != 1.0:  # fmt: skip
        return None
    product = _integer_product(graph, node, node.input[0], node.input[1], bool(_attribute(node, "transB", 0)))
    if product is None or len(node.input) < 3 or not node.input[2]:
        return product
    scaled = graph.fresh(f"{node.output[0]}_int8_scaled")
    product[-1].output[0] = scaled
    return [*product, helper.make_node("Add", [scaled, node.input[2]], [node.output[0]], name=f"{node.name}_bias")]


# operators whose every output value is one of their (first) input's values: they commute with quantization
VALUE_MOVES = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "MaxPool"})
PRODUCTS = frozenset({"MatMul", "Gemm", "Conv"})


def _same_grid(graph: _Graph, first: onnx.NodeProto, second: onnx.NodeProto) -> bool:
    """Whether two quantizers' scales and zero points are the same constants per tensor (the same grid)."""
    parameters = []
    for node in (first, second):
        if len(node.input) < 3 or not node.input[2] or _attribute(node, "block_size", 0):
            return False
        scale, zero = graph.constants.get(node.input[1]), graph.constants.get(node.input[2])
        if scale is None or zero is None or scale.size != 1 or zero.size != 1:
            return False
        parameters.append((scale.dtype, scale.reshape(-1)[0].tobytes(), zero.dtype, zero.reshape(-1)[0].tobytes()))
    return parameters[0] == parameters[1]


def _unchanged_by_requantization(graph: _Graph, node: onnx.NodeProto) -> str | None:
    """For a DequantizeLinear of a QuantizeLinear of moved dequantized values on the same grid: the moved values
    (which it reproduces bit for bit), else None."""
    quantizer = graph.producers.get(node.input[0])
    if quantizer is None or quantizer.op_type != "QuantizeLinear" or not _same_grid(graph, quantizer, node):
        return None
    move = graph.producers.get(quantizer.input[0])
    if move is None or move.op_type not in VALUE_MOVES or move.domain not in ("", "ai.onnx"):
        return None
    source = graph.dequantized(move.input[0])
    return quantizer.input[0] if source is not None and _same_grid(graph, source, node) else None


def simplify_qdq(model: ImportedModel) -> tuple[Sequence[onnx.NodeProto], dict[str, np.ndarray]]:
    """The model's nodes with idle requantizations bypassed and dequantized products replaced (module docstring),
    and the constants the replacements add. Bypassed nodes stay, unused: fission drops them."""
    graph = _Graph(model)
    outputs = {o.name for o in model.graph.output}
    bypass = {node.output[0]: moved for node in model.graph.node
              if node.op_type == "DequantizeLinear" and node.output[0] not in outputs
              and (moved := _unchanged_by_requantization(graph, node)) is not None}  # fmt: skip
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        replaced = _replacement(graph, node)
        if replaced is not None:
            nodes.extend(replaced)
            continue
        if node.op_type not in PRODUCTS and any(i in bypass for i in node.input):
            rewired = onnx.NodeProto()
            rewired.CopyFrom(node)
            rewired.input[:] = [bypass.get(i, i) for i in node.input]
            node = rewired
        nodes.append(node)
    return nodes, graph.added
