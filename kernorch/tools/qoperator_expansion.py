"""onnxruntime's QOperator nodes written out as what they mean, for the rounding arbiter's exact evaluation.

A QLinearConv, QLinearMatMul or com.microsoft QLinearAdd... is its float operator between the dequantization of its
inputs and the quantization of its output (onnx's and onnxruntime's operator documentation). The arbiter evaluates
the float operator in float64 and judges the quantization, so it needs that operator as a node: `expanded(proto)` is
the model with each such node replaced by DequantizeLinear nodes, the float operator and a QuantizeLinear writing
the node's own output name. The expansion only serves evaluation; onnxruntime and kernorch run the model as it is.

Each expansion is data: where each integer input's (value, scale, zero point) triple is, where the output's scale
and zero point are, the float operator and the attributes it keeps. QGemm (its alpha-scaled int32 bias) and the
pools of channels-last data are not expanded: a quantizer after them is left unjudged (the arbitration says so).
QGemm is written by hand (`_qgemm`): its int32 bias and its product are both scaled by alpha·sa·sb, and its output
is float where it has no output scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import helper

CONTRIB = "com.microsoft"


@dataclass(frozen=True)
class Expansion:
    """A QOperator node as DequantizeLinear(each triple) → `operator` → QuantizeLinear(output's scale, zero)."""

    operator: str  # the float operator (ONNX domain)
    triples: tuple[tuple[int, int, int], ...] | None  # (value, scale, zero point) input positions; None: from 2 on
    output: tuple[int, int]  # the output's (scale, zero point) input positions
    attributes: tuple[str, ...] = ()  # the node's attributes the float operator takes
    weights_axis: int | None = None  # which triple's scale runs along axis 0 (a convolution's weights: the second)
    bias: int | None = None  # an int32 bias input, scaled by the first two triples' scales


EXPANSIONS: dict[tuple[str, str], Expansion] = {
    ("", "QLinearConv"): Expansion("Conv", ((0, 1, 2), (3, 4, 5)), (6, 7),
                                   ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"),
                                   weights_axis=1, bias=8),
    ("", "QLinearMatMul"): Expansion("MatMul", ((0, 1, 2), (3, 4, 5)), (6, 7)),
    (CONTRIB, "QLinearAdd"): Expansion("Add", ((0, 1, 2), (3, 4, 5)), (6, 7)),
    (CONTRIB, "QLinearMul"): Expansion("Mul", ((0, 1, 2), (3, 4, 5)), (6, 7)),
    (CONTRIB, "QLinearSigmoid"): Expansion("Sigmoid", ((0, 1, 2),), (3, 4)),
    (CONTRIB, "QLinearLeakyRelu"): Expansion("LeakyRelu", ((0, 1, 2),), (3, 4), ("alpha",)),
    (CONTRIB, "QLinearConcat"): Expansion("Concat", None, (0, 1), ("axis",)),
    (CONTRIB, "QLinearSoftmax"): Expansion("Softmax", ((0, 1, 2),), (3, 4), ("axis",)),
}  # fmt: skip


def _softmax_of_opset_13(node: onnx.NodeProto) -> bool:
    """A QLinearSoftmax means onnx's Softmax of its `opset` attribute: the same as Softmax-13's along `axis` when that
    opset is 13 or later, or the axis is the last (before 13 Softmax flattens the dims from `axis` on); other cases
    are not expanded."""
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return int(attributes.get("opset", 13)) >= 13 or int(attributes.get("axis", -1)) == -1


def _bias(bias: str, x_scale: str, w_scale: str, fresh: str) -> list[onnx.NodeProto]:
    """An int32 bias in float, `fresh`/bias: its integers times the product of the operands' scales."""
    scales, floated = f"{fresh}/bias_scale", f"{fresh}/bias_float"
    return [helper.make_node("Mul", [x_scale, w_scale], [scales]),
            helper.make_node("Cast", [bias], [floated], to=onnx.TensorProto.FLOAT),
            helper.make_node("Mul", [floated, scales], [f"{fresh}/bias"])]  # fmt: skip


def _expand(node: onnx.NodeProto, expansion: Expansion, fresh: str) -> list[onnx.NodeProto] | None:
    inputs = list(node.input)
    triples = expansion.triples or tuple((i, i + 1, i + 2) for i in range(2, len(inputs), 3))
    if any(t[1] >= len(inputs) for t in triples):
        return None
    nodes, floats = [], []
    for k, (value, scale, zero) in enumerate(triples):
        dequantized = f"{fresh}/dequantized_{k}"
        present = [inputs[value], inputs[scale]] + ([inputs[zero]] if zero < len(inputs) and inputs[zero] else [])
        nodes.append(helper.make_node("DequantizeLinear", present, [dequantized]))
        if expansion.weights_axis == k:  # a scale per output channel
            nodes[-1].attribute.append(helper.make_attribute("axis", 0))
        floats.append(dequantized)
    if expansion.bias is not None and expansion.bias < len(inputs) and inputs[expansion.bias]:
        (_, x_scale, _), (_, w_scale, _) = triples[0], triples[1]
        nodes += _bias(inputs[expansion.bias], inputs[x_scale], inputs[w_scale], fresh)
        floats.append(f"{fresh}/bias")
    kept = [a for a in node.attribute if a.name in expansion.attributes]
    operator = helper.make_node(expansion.operator, floats, [f"{fresh}/float"])
    operator.attribute.extend(kept)
    scale, zero = expansion.output
    quantizer = helper.make_node("QuantizeLinear", [f"{fresh}/float", inputs[scale]]
                                 + ([inputs[zero]] if zero < len(inputs) and inputs[zero] else []),
                                 [node.output[0]], name=node.name or node.output[0])  # fmt: skip
    return [*nodes, operator, quantizer]


def _qgemm(node: onnx.NodeProto, fresh: str) -> list[onnx.NodeProto]:
    """QGemm(A, sa, za, B, sb, zb, C, sy, zy): alpha·(A - za)·(B - zb)·sa·sb + alpha·C·sa·sb, quantized by sy, zy
    where they are given (float otherwise). B's scale runs along its output columns: axis 0 when transposed."""
    inputs = list(node.input) + [""] * (9 - len(node.input))
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    alpha, trans_b = float(attributes.get("alpha", 1.0)), int(attributes.get("transB", 0))
    a, b = f"{fresh}/dequantized_0", f"{fresh}/dequantized_1"
    nodes = [helper.make_node("DequantizeLinear", [i for i in inputs[0:3] if i], [a]),
             helper.make_node("DequantizeLinear", [i for i in inputs[3:6] if i], [b], axis=0 if trans_b else 1)]
    operands = [a, b]
    if inputs[6]:
        nodes += _bias(inputs[6], inputs[1], inputs[4], fresh)
        operands.append(f"{fresh}/bias")
    result = f"{fresh}/float" if inputs[7] else node.output[0]
    nodes.append(helper.make_node("Gemm", operands, [result], alpha=alpha, beta=alpha,
                                  transA=int(attributes.get("transA", 0)), transB=trans_b))  # fmt: skip
    if inputs[7]:
        nodes.append(helper.make_node("QuantizeLinear", [result, inputs[7]] + ([inputs[8]] if inputs[8] else []),
                                      [node.output[0]], name=node.name or node.output[0]))  # fmt: skip
    return nodes


def expanded(proto: onnx.ModelProto) -> onnx.ModelProto:
    """`proto` with each QOperator node of EXPANSIONS written out (module docstring); others as they are."""
    result = onnx.ModelProto()
    result.CopyFrom(proto)
    nodes: list[onnx.NodeProto] = []
    for i, node in enumerate(proto.graph.node):
        key = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
        expansion = EXPANSIONS.get(key)
        if key == (CONTRIB, "QLinearSoftmax") and not _softmax_of_opset_13(node):
            expansion = None
        written = _expand(node, expansion, f"qoperator_{i}") if expansion is not None else \
            _qgemm(node, f"qoperator_{i}") if key == (CONTRIB, "QGemm") else None  # fmt: skip
        nodes.extend(written if written is not None else [node])
    del result.graph.node[:]
    result.graph.node.extend(nodes)
    return result
