"""A candidate kernel's structure: what a backend or a cost model can see of it, with values named by position.

Orchestrating prices every candidate of every subgraph, and a transformer's layers (or a subgraph orchestrated
again after a rewrite elsewhere) offer the same candidates again under other value names: describing, lowering
and rendering each anew was most of a quantized vit_tiny's 8 minutes of planning. Equal structures run the same
code on the same shapes and cost the same, so a cost model keys what it works out by structure.
"""

from __future__ import annotations

import hashlib

import numpy as np

from kernorch.ir.kernel import CandidateKernel

Structure = tuple[object, ...]


class Structures:
    """Kernels' structures, with each constant's digest computed once per array (a weight matrix is read once,
    not once per candidate that reads it)."""

    def __init__(self) -> None:
        self._digests: dict[int, tuple[np.ndarray, bytes]] = {}  # id(array) -> (the array, kept alive; digest)

    def digest(self, array: np.ndarray) -> bytes:
        entry = self._digests.get(id(array))
        if entry is None or entry[0] is not array:
            raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            entry = (array, hashlib.blake2b(raw.data, digest_size=16).digest())
            self._digests[id(array)] = entry
        return entry[1]

    def of(self, kernel: CandidateKernel) -> Structure:
        """Each primitive with its attributes, where each operand comes from (an earlier primitive's output, or
        the kernel's i-th input) and its outputs' types; each input's type, whether it is a graph input or output
        (a concat of a graph output is no view: codegen/views.py) or a constant (and then its values' digest);
        which outputs the kernel writes, and which of them the graph returns."""
        graph = kernel.graph
        inputs = {name: i for i, name in enumerate(kernel.inputs)}
        produced: dict[str, tuple[object, ...]] = {}
        primitives = []
        for position, node in enumerate(kernel.primitives):
            operands = tuple(produced[v] if v in produced else ("input", inputs[v]) for v in node.inputs)
            primitives.append((node.prim, node.attrs, operands, tuple(graph.types[v] for v in node.outputs)))
            produced.update((v, (position, j)) for j, v in enumerate(node.outputs))
        graph_inputs, graph_outputs = set(graph.inputs), set(graph.outputs)
        read = tuple((graph.types[v], v in graph_inputs, v in graph_outputs,
                      self.digest(graph.constants[v]) if v in graph.constants else None)
                     for v in kernel.inputs)  # fmt: skip
        written = tuple((produced[v], v in graph_outputs) for v in kernel.outputs)
        return tuple(primitives), read, written
