"""Primitive graphs of repeated blocks, for tests of what is shared between equal kernels (ir/structure.py, the
cost models that key by it)."""

from __future__ import annotations

import numpy as np

from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.types import TensorType

T = TensorType((2, 8), "float32")


def chain_of_blocks(second_scale: float = 0.5, alpha: float = 0.1) -> Graph:
    """Four blocks, v → mul(scale) → relu → add(v), each reading the one before; the last is the graph's output.
    Blocks 1 and 2 (both reading and writing intermediate values) are twins unless block 2's scale or slope
    differs."""
    graph = Graph(inputs=["x"], outputs=["b3"], types={"x": T})
    for block, (scale, slope) in enumerate([(0.5, 0.1), (0.5, 0.1), (second_scale, alpha), (0.5, 0.1)]):
        source = "x" if block == 0 else f"b{block - 1}"
        graph.constants[f"s{block}"] = np.full((2, 8), scale, np.float32)
        graph.types.update({f"s{block}": T, f"m{block}": T, f"l{block}": T, f"b{block}": T})
        graph.nodes += [Node("mul", (source, f"s{block}"), (f"m{block}",)),
                        Node("relu", (f"m{block}",), (f"l{block}",), (("alpha", slope),)),
                        Node("add", (f"l{block}", source), (f"b{block}",))]  # fmt: skip
    return graph


def block_kernel(graph: Graph, block: int) -> CandidateKernel:
    return make_kernel(graph, (3 * block, 3 * block + 1, 3 * block + 2), (f"b{block}",))
