"""Candidate generation: what a kernel may write."""

from __future__ import annotations

import numpy as np

from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node, verify
from kernorch.ir.primitives import PRIMITIVES, Kind
from kernorch.ir.types import TensorType
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate.candidates import enumerate_candidates
from kernorch.orchestrate.pruning import LinearEpilogues
from kernorch.orchestrate.subgraph import build_subgraphs


def test_a_library_call_writes_only_its_final_value() -> None:
    """matmul → add → relu with the sum needed outside too (a graph output, and read by exp): no candidate
    with the matmul writes the sum beside the relu; the rejection says why."""
    t = TensorType((3, 4), "float32")
    graph = Graph(inputs=["x"], types={"x": t, "m": t, "s": t, "r": t, "e": t}, name="mm-add-relu")
    graph.constants = {"w": np.ones((4, 4), np.float32), "b": np.ones((1, 4), np.float32)}
    graph.types.update({"w": TensorType((4, 4), "float32"), "b": TensorType((1, 4), "float32")})
    graph.nodes = [Node("matmul", ("x", "w"), ("m",)), Node("add", ("m", "b"), ("s",)), Node("relu", ("s",), ("r",)),
                   Node("exp", ("s",), ("e",))]  # fmt: skip
    graph.outputs = ["r", "e", "s"]
    verify(graph)
    (sub,) = build_subgraphs(graph, [(0, len(graph.nodes))])
    found = enumerate_candidates(sub, OrchestrationLimits(), LinearEpilogues(graph))
    with_linear = [k for k in found.kernels if any(PRIMITIVES[graph.nodes[i].prim].kind == Kind.LINEAR
                                                     for i in k.nodes)]  # fmt: skip
    assert with_linear, "the matmul must be coverable"
    assert all(len(k.outputs) == 1 for k in with_linear), [(k.nodes, k.outputs) for k in with_linear]
    assert any("exists only inside the library call" in r.reason for r in found.rejected)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("library calls may write intermediate values",
         "if linear and (len(mandatory) > 1 or optional):",
         "if False:",
         tests=("kernorch/orchestrate/candidates_test.py",
                "kernorch/runtime/executor_test.py",
                "kernorch/orchestrate/blp_test.py")),
]  # fmt: skip
