"""A kernel's structure names values by position: twins (a transformer's layers) are equal, and anything a backend
or a cost model reads — an attribute, a constant's values, a type, a graph output — tells kernels apart. The
roofline cost model then prices each structure once."""

from __future__ import annotations

import math

import numpy as np

from kernorch.cost.interface import CostModelBase
from kernorch.cost.model import GeneratableCost
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.structure import Structures
from kernorch.ir.types import TensorType
from kernorch.testing.blocks import block_kernel as block
from kernorch.testing.blocks import chain_of_blocks as chain

T = TensorType((2, 8), "float32")


def test_twins_are_equal_and_their_context_tells_them_apart() -> None:
    structures = Structures()
    graph = chain()
    assert structures.of(block(graph, 1)) == structures.of(block(graph, 2))
    assert structures.of(block(graph, 0)) != structures.of(block(graph, 1))  # it reads the graph's input
    assert structures.of(block(graph, 3)) != structures.of(block(graph, 1))  # it writes the graph's output
    graph.outputs = ["b3", "b0"]  # block 1 reads a graph output, block 2 does not (a concat of one is no view)
    assert structures.of(block(graph, 1)) != structures.of(block(graph, 2))


def test_what_tells_kernels_apart() -> None:
    structures = Structures()
    assert structures.of(block(chain(second_scale=0.25), 1)) != structures.of(block(chain(second_scale=0.25), 2))
    assert structures.of(block(chain(alpha=0.2), 1)) != structures.of(block(chain(alpha=0.2), 2))
    swapped = chain()  # an operand's position: block 2's add reads (b1, l2), block 1's (l1, b0)
    swapped.nodes[8] = Node("add", ("b1", "l2"), ("b2",))
    assert structures.of(block(swapped, 1)) != structures.of(block(swapped, 2))


def test_a_digest_is_of_the_values() -> None:
    structures = Structures()
    a, b = np.arange(6, dtype=np.float32), np.arange(6, dtype=np.float32)
    assert structures.digest(a) == structures.digest(b)
    assert structures.digest(a) != structures.digest(a.astype(np.float64))  # bytes, not values compared loosely
    c = a.copy()
    c[5] = 7
    assert structures.digest(a) != structures.digest(c)


class _Counting(CostModelBase):
    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def cost(self, candidate: CandidateKernel) -> float:
        self.calls += 1
        return 1e-6 * len(candidate.nodes)


def test_each_structure_is_priced_once() -> None:
    graph = chain()
    first, second = block(graph, 1), block(graph, 2)
    base = _Counting()
    model = GeneratableCost(base)
    assert model.cost(first) == model.cost(second) == 3e-6
    assert base.calls == 1
    assert model.rejection(first) is None


def test_a_rejection_is_remembered_with_its_reason() -> None:
    """Two matrix products in one kernel: no backend runs that (a library call takes one)."""
    square = TensorType((8, 8), "float32")
    graph = Graph(inputs=["x"], outputs=["z"], types={"x": T, "w": square, "y": T, "z": T})
    graph.constants["w"] = np.eye(8, dtype=np.float32)
    graph.nodes += [Node("matmul", ("x", "w"), ("y",)), Node("matmul", ("y", "w"), ("z",))]
    base = _Counting()
    model = GeneratableCost(base)
    kernel = make_kernel(graph, (0, 1), ("z",))
    assert model.cost(kernel) == math.inf and model.rejection(kernel)
    assert model.cost(make_kernel(graph, (0, 1), ("z",))) == math.inf and base.calls == 0


MUTANTS = [
    here("a constant's values left out of the structure",
         "self.digest(graph.constants[v]) if v in graph.constants else None", "v in graph.constants"),
    here("graph outputs left out of the structure", "written = tuple((produced[v], v in graph_outputs)",
         "written = tuple((produced[v], False)"),
    here("a graph output read by a kernel left out of the structure", "v in graph_inputs, v in graph_outputs,",
         "v in graph_inputs, False,"),
    here("operands by name, not position",
         "operands = tuple(produced[v] if v in produced else (\"input\", inputs[v]) for v in node.inputs)",
         "operands = tuple(sorted(produced[v] if v in produced else (\"input\", inputs[v]) for v in node.inputs))"),
    here("every candidate priced anew", "        priced = self._priced.get(structure)", "        priced = None",
         file="kernorch/cost/model.py"),
]  # fmt: skip
