"""An ONNX node kernorch has no rule for, kept whole and run by onnxruntime (the opaque `onnx_node` primitive).

The node travels as data: its NodeProto serialized (base64, inputs and outputs renamed to positions, so the text
does not depend on graph names), the opsets it needs and its static output types. Running it builds a
one-node onnxruntime session once per distinct node and input types (cached for the life of the process) and
feeds it the primitive's inputs.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from kernorch.errors import KernorchError
from kernorch.ir.types import TensorType

# names inside the one-node model: the node's inputs and outputs by position
INPUT_NAME, OUTPUT_NAME = "in{}", "out{}"


def encode_node(node: Any) -> tuple[str, int, int]:
    """(base64 NodeProto with positional value names, number of inputs present, number of outputs present).
    Absent optional inputs/outputs stay empty names."""
    import onnx

    renamed = onnx.NodeProto()
    renamed.CopyFrom(node)
    present_in = present_out = 0
    del renamed.input[:]
    for value in node.input:
        renamed.input.append(INPUT_NAME.format(present_in) if value else "")
        present_in += bool(value)
    del renamed.output[:]
    for value in node.output:
        renamed.output.append(OUTPUT_NAME.format(present_out) if value else "")
        present_out += bool(value)
    renamed.name = "fallback"
    return base64.b64encode(renamed.SerializeToString(deterministic=True)).decode(), present_in, present_out


def one_node_model(node_b64: str, opsets: Sequence[tuple[str, int]], input_types: Sequence[TensorType],
                   output_types: Sequence[TensorType] | None = None,
                   constants: dict[int, np.ndarray] | None = None) -> Any:  # fmt: skip
    """The one-node ModelProto; `constants` (by input position) become initializers, for shape inference."""
    import onnx
    from onnx import helper, numpy_helper

    node = onnx.NodeProto()
    node.ParseFromString(base64.b64decode(node_b64))

    def info(name: str, value_type: TensorType | None) -> onnx.ValueInfoProto:
        if value_type is None:
            return helper.make_empty_tensor_value_info(name)
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(value_type.dtype)),
                                             list(value_type.shape))  # fmt: skip

    constants = constants or {}
    inputs = [info(INPUT_NAME.format(i), t) for i, t in enumerate(input_types) if i not in constants]
    initializers = [numpy_helper.from_array(array, INPUT_NAME.format(i)) for i, array in constants.items()]
    outputs = [info(name, output_types[i] if output_types else None) for i, name in
               enumerate(v for v in node.output if v)]  # fmt: skip
    graph = helper.make_graph([node], "fallback", inputs, outputs, initializers)
    imports = [helper.make_opsetid(domain, version) for domain, version in opsets]
    return helper.make_model(graph, opset_imports=imports, ir_version=min(onnx.IR_VERSION, 10))


@functools.lru_cache(maxsize=256)
def _session(node_b64: str, opsets: tuple[tuple[str, int], ...], input_types: tuple[TensorType, ...],
             output_types: tuple[TensorType, ...]) -> Any:  # fmt: skip
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # its allocator logs through the default logger, beside the exception
    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: a failure reaches the user as one KernorchError line, not a log
    model = one_node_model(node_b64, opsets, input_types, output_types)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def prepare(attrs: dict[str, Any], input_types: Sequence[TensorType]) -> None:
    """Build the node's onnxruntime session now (at plan load) rather than on the first call."""
    _session(attrs["node"], attrs["opsets"], tuple(input_types), output_types(attrs))


def output_types(attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    return tuple(TensorType(tuple(shape), dtype) for shape, dtype in attrs["outputs"])


def run_onnx_node(inputs: Sequence[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    types = tuple(TensorType.of(np.asarray(a)) for a in inputs)
    session = _session(attrs["node"], attrs["opsets"], types, output_types(attrs))
    feeds = {INPUT_NAME.format(i): np.ascontiguousarray(a) for i, a in enumerate(inputs)}
    try:
        results = session.run(None, feeds)
    except Exception as error:  # onnxruntime's exceptions share no base class but Exception
        first = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
        raise KernorchError(f"onnxruntime failed on {attrs['op_type']}: {first}") from None
    planned = output_types(attrs)
    arrays = []
    for position, (result, expected) in enumerate(zip(results, planned, strict=True)):
        array = np.asarray(result)
        if array.dtype.name != expected.dtype or array.size != expected.numel:
            raise KernorchError(f"onnxruntime's {attrs['op_type']} returned {array.dtype.name}{list(array.shape)} for "
                                f"output {position}, planned {expected.dtype}{list(expected.shape)}")  # fmt: skip
        arrays.append(array.reshape(expected.shape))  # same data: onnxruntime may write a scalar as [1]
    return arrays
