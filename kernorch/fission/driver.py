"""Fission driver: walk the ONNX graph in order, apply each operator's rule, verify the result."""

from __future__ import annotations

from collections import Counter

import onnx

from kernorch.errors import UnsupportedOperator
from kernorch.fission.fallback import fallback_node
from kernorch.fission.qdq import simplify_qdq
from kernorch.fission.registry import RuleContext, find_rule
from kernorch.frontend.onnx_import import ImportedModel
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph, Node, eliminate_dead_nodes, verify
from kernorch.ir.types import TensorType


def fission(model: ImportedModel, strict: bool = True) -> Graph:
    """Decompose every operator of `model` into primitives; all-constant work is folded away.

    A node no rule takes raises UnsupportedOperator when `strict`; otherwise it becomes one opaque onnx_node
    primitive run by onnxruntime (see fallback.py; `fallback_nodes` lists them)."""

    graph = Graph(name=model.graph.name or "model")
    graph.inputs = list(model.input_types)
    graph.types.update(model.input_types)
    # a QDQ model's patterns (idle requantizations, dequantized products), found while its weights are integers
    nodes, added = simplify_qdq(model)
    for name, array in {**model.constants, **added}.items():
        graph.constants[name] = array
        graph.types[name] = TensorType.of(array)
    builder = PrimitiveBuilder(graph)
    # ONNX value name -> primitive-graph value name (rules create fresh names for what they emit).
    alias: dict[str, str] = {name: name for name in [*graph.inputs, *graph.constants]}

    opsets = [(entry.domain, entry.version) for entry in model.proto.opset_import]
    for index, node in enumerate(nodes):
        node_name = node.name or f"{node.op_type}_{index}"
        inputs: list[str | None] = []
        for value in node.input:
            if not value:
                inputs.append(None)
            elif value not in alias:
                raise UnsupportedOperator(node.op_type, node_name, f"input '{value}' is not defined before use")
            else:
                inputs.append(alias[value])
        builder.origin = node_name
        mark = len(graph.nodes)
        try:
            outputs = _apply_rule(node, node_name, inputs, model.opset, builder)
        except UnsupportedOperator as refusal:
            if strict:
                raise
            del graph.nodes[mark:]  # what the rule emitted before refusing (constants it made stay, unused)
            outputs = fallback_node(node, node_name, inputs, opsets, builder, refusal)
        for onnx_name, value in zip(node.output, outputs, strict=False):
            if onnx_name:
                alias[onnx_name] = value

    for name in model.output_names:
        if name not in alias:
            raise UnsupportedOperator("<graph>", name, "graph output is never produced")
    graph.outputs = _name_outputs(graph, [alias[name] for name in model.output_names], model.output_names)
    graph = eliminate_dead_nodes(graph)
    verify(graph)
    return graph


def _apply_rule(node: onnx.NodeProto, node_name: str, inputs: list[str | None], opset: int,
                builder: PrimitiveBuilder) -> list[str]:  # fmt: skip
    """The node's rule applied: its output values, or UnsupportedOperator naming what the rule cannot take."""
    fission_rule = find_rule(node.domain, node.op_type, opset, node_name)
    context = RuleContext(node, inputs, opset, builder)
    try:
        outputs = list(fission_rule.fn(context))
    except ValueError as error:  # a primitive's shape/type check: the operands do not fit the operator
        context.refuse(f"operands do not fit: {error}")
    unread = context.unread_attributes()
    if unread:
        context.refuse("attribute not supported by kernorch's rule", unread[0])
    if len(outputs) < len([o for o in node.output if o]):
        context.refuse(f"only the first {len(outputs)} output(s) are supported")
    return outputs


def fallback_nodes(graph: Graph) -> list[Node]:
    """The nodes that run through onnxruntime (the fallback), in graph order."""
    return [node for node in graph.nodes if node.prim == "onnx_node"]


def _name_outputs(graph: Graph, values: list[str], names: list[str]) -> list[str]:
    """Give graph outputs their ONNX names: rename the producing node's output, or copy when shared."""
    producers = {out: i for i, node in enumerate(graph.nodes) for out in node.outputs}
    uses = Counter(values)
    for value, name in zip(values, names, strict=True):
        if value == name:
            continue
        if value in producers and uses[value] == 1 and name not in graph.types:
            i = producers[value]
            node = graph.nodes[i]
            graph.nodes[i] = Node(node.prim, node.inputs, tuple(name if o == value else o for o in node.outputs),
                                  node.attrs, node.origin)  # fmt: skip
            graph.types[name] = graph.types.pop(value)
            for j in range(i + 1, len(graph.nodes)):
                later = graph.nodes[j]
                if value in later.inputs:
                    graph.nodes[j] = Node(later.prim, tuple(name if v == value else v for v in later.inputs),
                                          later.outputs, later.attrs, later.origin)  # fmt: skip
        else:
            graph.types[name] = graph.types[value]
            graph.nodes.append(Node("identity", (value,), (name,), (), "output"))
    return list(names)

