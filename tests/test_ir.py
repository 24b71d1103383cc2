"""The verifier rejects ill-formed graphs; fission output always verifies."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.ir.graph import Graph, GraphVerificationError, Node, verify
from kernorch.ir.types import TensorType
from kernorch.tools.demo_models import self_attention_block


def small_graph() -> Graph:
    graph = Graph(inputs=["x"], outputs=["z"])
    graph.types = {"x": TensorType((2, 3), "float32"), "y": TensorType((2, 3), "float32"),
                   "z": TensorType((2, 3), "float32")}  # fmt: skip
    graph.nodes = [Node("relu", ("x",), ("y",)), Node("exp", ("y",), ("z",))]
    return graph


def test_valid_graph_verifies() -> None:
    verify(small_graph())
    verify(fission(import_model(self_attention_block())))


def test_use_before_definition() -> None:
    graph = small_graph()
    graph.nodes.reverse()
    with pytest.raises(GraphVerificationError, match="before it is defined"):
        verify(graph)


def test_wrong_output_type() -> None:
    graph = small_graph()
    graph.types["z"] = TensorType((3, 2), "float32")
    with pytest.raises(GraphVerificationError, match="infers"):
        verify(graph)


def test_missing_output_and_bad_constant() -> None:
    graph = small_graph()
    graph.outputs = ["w"]
    with pytest.raises(GraphVerificationError, match="never produced"):
        verify(graph)
    graph = small_graph()
    graph.constants["c"] = np.zeros(3, np.float32)
    graph.types["c"] = TensorType((4,), "float32")
    with pytest.raises(GraphVerificationError, match="constant"):
        verify(graph)


def test_tensor_type_rejects_dynamic_shapes() -> None:
    with pytest.raises(ValueError):
        TensorType((-1, 3), "float32")
    with pytest.raises(ValueError):
        TensorType((2,), "complex64")
    assert TensorType((2,), "bfloat16").nbytes == 4  # storage only kernorch creates (bf16 mode's casts)
