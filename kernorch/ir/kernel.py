"""CandidateKernel: a convex set of primitives with the values it reads and writes (Korch §4.1)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kernorch.ir.graph import Graph, Node


@dataclass(frozen=True)
class CandidateKernel:
    """`nodes` are indices into `graph.nodes` in topological order; `inputs` are values the kernel reads
    from memory (graph inputs, constants, other kernels' outputs); `outputs` are the values it writes."""

    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    graph: Graph = field(compare=False, hash=False, repr=False)

    @property
    def key(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        return self.nodes, self.outputs

    @property
    def primitives(self) -> list[Node]:
        return [self.graph.nodes[i] for i in self.nodes]

    def describe(self) -> str:
        prims = " → ".join(node.prim for node in self.primitives)
        return f"[{prims}] outputs {len(self.outputs)}"


def kernel_inputs(graph: Graph, nodes: tuple[int, ...]) -> tuple[str, ...]:
    """Values read by `nodes` that none of them produces, in first-use order."""
    produced = {out for i in nodes for out in graph.nodes[i].outputs}
    seen: dict[str, None] = {}
    for i in nodes:
        for value in graph.nodes[i].inputs:
            if value not in produced:
                seen.setdefault(value, None)
    return tuple(seen)


def make_kernel(graph: Graph, nodes: tuple[int, ...], outputs: tuple[str, ...]) -> CandidateKernel:
    return CandidateKernel(tuple(sorted(nodes)), kernel_inputs(graph, tuple(sorted(nodes))), outputs, graph)
