"""The fallback for a node no fission rule takes: one opaque `onnx_node` primitive, run by onnxruntime.

A model with one exotic operator still compiles: every other node is fissioned and optimized as usual, and the
refused node runs whole through a one-node onnxruntime session (built when the plan is loaded). The fallback
is refused too — and the original refusal stands — when the node cannot run on its own: a subgraph attribute
(If/Loop/Scan bodies may read outer values), output shapes that are not static, a dtype kernorch cannot hold,
or an operator onnxruntime does not know.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx

from kernorch.errors import UnsupportedOperator
from kernorch.ir import foreign
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.types import SUPPORTED_DTYPES, TensorType


def fallback_node(node: onnx.NodeProto, node_name: str, inputs: Sequence[str | None],
                  opsets: Sequence[tuple[str, int]], builder: PrimitiveBuilder,
                  refusal: UnsupportedOperator) -> list[str]:  # fmt: skip
    """Emit `node` as an onnx_node primitive; the value names of its outputs, "" for an absent output."""

    def refuse(why: str) -> UnsupportedOperator:
        return UnsupportedOperator(node.op_type, node_name, f"{refusal.reason}; no onnxruntime fallback: {why}",
                                   refusal.attribute)  # fmt: skip

    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        raise refuse("it has a subgraph attribute")
    present = [v for v in inputs if v is not None]
    input_types = [builder.type_of(v) for v in present]
    constants = {i: c for i, v in enumerate(present) if (c := builder.constant_value(v)) is not None}
    encoded, _, output_count = foreign.encode_node(node)
    opsets = tuple((domain or "", int(version)) for domain, version in opsets)
    rule = CONTRIB_OUTPUT_TYPES.get((node.domain, node.op_type))
    if rule is not None:  # onnx's shape inference does not know the operator: its types by output position
        output_types = [t for t, name in zip(rule(node, input_types), node.output, strict=False) if name]
    else:
        output_types = _inferred_output_types(encoded, opsets, input_types, constants, output_count, refuse)
    reason = (f"attribute '{refusal.attribute}': " if refusal.attribute else "") + refusal.reason
    attrs = {
        "node": encoded, "opsets": opsets, "op_type": node.op_type, "reason": reason,
        "inputs": tuple((t.shape, t.dtype) for t in input_types),
        "outputs": tuple((t.shape, t.dtype) for t in output_types),
    }  # fmt: skip
    try:
        foreign.prepare(attrs, input_types)  # onnxruntime must be able to build the session
    except ImportError:
        raise refuse("onnxruntime is not installed (pip install 'kernorch[ort]')") from None
    except Exception as error:  # onnxruntime's own exceptions (unknown op, bad attribute) have no common base
        raise refuse(f"onnxruntime cannot run it: {str(error).strip().splitlines()[0][:200]}") from None
    outputs = iter(builder.emit("onnx_node", present, attrs))
    return [next(outputs) if name else "" for name in node.output]


def _quantized_lstm_outputs(node: onnx.NodeProto, input_types: list[TensorType]) -> list[TensorType]:
    """com.microsoft's DynamicQuantizeLSTM (quantize_dynamic's LSTM: int8 weights, activations quantized per step):
    an LSTM's outputs, Y [sequence, directions, batch, hidden] and Y_h, Y_c [directions, batch, hidden], float32."""
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    directions = 2 if attributes.get("direction", b"forward") == b"bidirectional" else 1
    sequence, batch, _ = input_types[0].shape
    hidden = int(attributes["hidden_size"])
    state = TensorType((directions, batch, hidden), "float32")
    return [TensorType((sequence, directions, batch, hidden), "float32"), state, state]


# Contrib operators onnxruntime's quantization tool writes and onnx's shape inference does not know: their output
# types from the inputs' and the node's attributes (the shapes depend on no value)
CONTRIB_OUTPUT_TYPES: dict[tuple[str, str], Callable[[onnx.NodeProto, list[TensorType]], list[TensorType]]] = {
    ("com.microsoft", "DynamicQuantizeLSTM"): _quantized_lstm_outputs,
}


def _inferred_output_types(encoded: str, opsets: tuple[tuple[str, int], ...], input_types: list[TensorType],
                           constants: dict[int, np.ndarray], count: int,
                           refuse: Callable[[str], UnsupportedOperator]) -> list[TensorType]:  # fmt: skip
    model = foreign.one_node_model(encoded, opsets, input_types, constants=constants)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError) as error:
        raise refuse(f"ONNX shape inference failed: {str(error).strip().splitlines()[0][:200]}") from None
    known = {v.name: v.type for v in [*inferred.graph.output, *inferred.graph.value_info]}
    types: list[TensorType] = []
    for position in range(count):
        name = foreign.OUTPUT_NAME.format(position)
        value = known.get(name)
        if value is None or not value.HasField("tensor_type") or not value.tensor_type.HasField("shape"):
            raise refuse(f"the shape of output {position} is not known before running it")
        tensor = value.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        if any(d is None for d in dims):
            raise refuse(f"output {position} has a data-dependent shape")
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
        except (KeyError, TypeError, ValueError):
            dtype = "undefined"
        if dtype not in SUPPORTED_DTYPES:
            raise refuse(f"output {position} has dtype {dtype}")
        types.append(TensorType(tuple(int(d) for d in dims if d is not None), dtype))
    return types
