"""Helpers for tests: build one-operator ONNX models, fission them, compare with onnxruntime."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.ir.graph import Graph
from kernorch.runtime import run_reference
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
