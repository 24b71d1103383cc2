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


def _chain(prims: list[str]) -> Graph:
    """x -> prims[0] -> prims[1] -> ... (unary elementwise steps; "reduce" sums the last axis)."""
    t = TensorType((3, 4), "float32")
    graph = Graph(inputs=["x"], types={"x": t}, name="chain")
    current = "x"
    for i, prim in enumerate(prims):
        value = f"v{i}"
        if prim == "reduce":
            graph.nodes.append(Node("reduce_sum", (current,), (value,), (("axes", (1,)),)))
            graph.types[value] = TensorType((3, 1), "float32")
        else:
            graph.nodes.append(Node(prim, (current,), (value,)))
            graph.types[value] = graph.types[current]
        current = value
    graph.outputs = [current]
    verify(graph)
    return graph


def test_elementwise_chains_may_fill_larger_kernels() -> None:
    """A chain of elementwise primitives only may fill max_elementwise_kernel_size; a set with another kind stops
    at max_kernel_size (a static-QDQ activation is a chain of 32: it fits two kernels, not three)."""
    limits = OrchestrationLimits(max_kernel_size=4, max_elementwise_kernel_size=7)
    for prims, largest in ((["exp", "neg"] * 5, 7), (["exp", "neg", "reduce", "exp", "neg"] * 2, 4)):
        graph = _chain(prims)
        (sub,) = build_subgraphs(graph, [(0, len(graph.nodes))])
        found = enumerate_candidates(sub, limits, LinearEpilogues(graph))
        assert max(len(k.nodes) for k in found.kernels) == largest, prims
    reasons = {r.reason for r in found.rejected if r.rule == "max-size"}
    assert "5 primitives exceed the max kernel size 4 (with a reduce/broadcast primitive)" in reasons
    assert OrchestrationLimits(max_kernel_size=30).elementwise_kernel_size == 30  # never below any kernel's


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("elementwise chains held to the general kernel size",
         "    if size > limits.elementwise_kernel_size:",
         "    if size > limits.max_kernel_size:", file="kernorch/orchestrate/pruning.py"),
    here("a chain with a reduction may fill an elementwise kernel's size",
         "    if other is None:\n        return None",
         "    if True:\n        return None", file="kernorch/orchestrate/pruning.py"),
    here("library calls may write intermediate values",
         "if linear and (len(mandatory) > 1 or optional):",
         "if False:",
         tests=("kernorch/orchestrate/candidates_test.py",
                "kernorch/runtime/executor_test.py",
                "kernorch/orchestrate/blp_test.py")),
]  # fmt: skip
