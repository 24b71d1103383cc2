"""An ONNX node kernorch has no rule for, kept whole and run by onnxruntime (the opaque `onnx_node` primitive).

The node travels as data: its NodeProto serialized (base64, inputs and outputs renamed to positions, so the text
does not depend on graph names), the opsets it needs and its static output types. Running it builds a
one-node onnxruntime session once per distinct node and input types (cached for the life of the process), run on
the calling thread, and feeds it the primitive's inputs.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class NodeRunner:
    """One node's onnxruntime session with what a call needs worked out once: the feed names and the planned
    outputs (dtype, element count, shape) each result is checked against."""

    session: Any
    op_type: str
    feed_names: tuple[str, ...]
    planned: tuple[tuple[str, int, tuple[int, ...]], ...]

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds = {name: np.asarray(a, order="C") for name, a in zip(self.feed_names, inputs, strict=True)}
        try:
            results = self.session.run(None, feeds)
        except Exception as error:  # onnxruntime's exceptions share no base class but Exception
            first = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
            raise KernorchError(f"onnxruntime failed on {self.op_type}: {first}") from None
        arrays = []
        for position, (result, (dtype, size, shape)) in enumerate(zip(results, self.planned, strict=True)):
            array = np.asarray(result)
            if array.dtype.name != dtype or array.size != size:
                raise KernorchError(f"onnxruntime's {self.op_type} returned {array.dtype.name}{list(array.shape)} for "
                                    f"output {position}, planned {dtype}{list(shape)}")  # fmt: skip
            arrays.append(array.reshape(shape))  # same data: onnxruntime may write a scalar as [1]
        return arrays


@functools.lru_cache(maxsize=256)
def _runner(node_b64: str, opsets: tuple[tuple[str, int], ...], input_types: tuple[TensorType, ...],
            output_types: tuple[TensorType, ...], op_type: str) -> NodeRunner:  # fmt: skip
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # its allocator logs through the default logger, beside the exception
    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: a failure reaches the user as one KernorchError line, not a log
    # The node runs on the calling thread. With a pool of its own, onnxruntime's workers wait for the cores that
    # the plan's OpenMP workers still spin on after the kernel before: a dynamically quantized bert_mini (41
    # fallback nodes, 2 threads) took 340 ms against onnxruntime's 5 ms, 4.9 ms on the calling thread
    # (bench/fallback_overhead.py, bench/results/2026-11-29-session25.md). Each node is one operator: its own
    # parallelism is small.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    model = one_node_model(node_b64, opsets, input_types, output_types)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    planned = tuple((t.dtype, t.numel, t.shape) for t in output_types)
    return NodeRunner(session, op_type, tuple(INPUT_NAME.format(i) for i in range(len(input_types))), planned)


def prepare(attrs: dict[str, Any], input_types: Sequence[TensorType]) -> NodeRunner:
    """The node's runner for these input types, its onnxruntime session built now (at plan load) rather than on
    the first call."""
    return _runner(attrs["node"], attrs["opsets"], tuple(input_types), output_types(attrs), attrs["op_type"])


def output_types(attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    return tuple(TensorType(tuple(shape), dtype) for shape, dtype in attrs["outputs"])


def run_onnx_node(inputs: Sequence[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """The node on these inputs (the reference interpreter's way: a runner per distinct input types; a plan's
    executor prepares its runner once, at load)."""
    return prepare(attrs, [TensorType.of(np.asarray(a)) for a in inputs])(inputs)
