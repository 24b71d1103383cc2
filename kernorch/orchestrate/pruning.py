"""Pruning rules for candidate kernels, as data: each has a name, a reason, and whether it is monotone.

A monotone rule, once violated by a node set, is violated by every superset, so the enumeration stops
growing that set (all rules below are monotone; a non-monotone rule would only reject the set itself).
Kernels are connected by construction: the enumeration grows sets through data edges only.

The rules encode what the backends can generate: a library call (matmul/conv) takes operands read
through strides and an epilogue; opaque primitives run alone; kernels have a maximum size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from kernorch.ir.graph import Graph
from kernorch.ir.primitives import PRIMITIVES, STRIDED_VIEW_PRIMS, Kind
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate.subgraph import Subgraph, iter_bits


class LinearEpilogues:
    """What each linear primitive may absorb into its library call (Korch §5: compute-intensive kernels go to
    vendor libraries with what they can fuse):

    - matmul operands computed by layout primitives (transposes, reshapes, slices, splits): read through
      strides, no copy;
    - a bf16 primitive's operand conversion to bfloat16 (kernorch/precision/): the call converts its float32
      source itself, on every run (or the conversion fuses into the operand's producer instead);
    - an epilogue: elementwise primitives downstream of the linear output that keep its shape (bias,
      per-channel scale and shift, activations, a residual add), which become post-ops of the call.
      Whether a particular set compiles to post-ops is the backend's decision (codegen/library/epilogue.py); a set
      it cannot express costs infinity and never enters the BLP.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._companions: dict[int, frozenset[int]] = {}
        self._operand_views: dict[int, frozenset[int]] = {}

    @cached_property
    def _consumers(self) -> dict[str, list[int]]:
        users: dict[str, list[int]] = {}
        for i, node in enumerate(self.graph.nodes):
            for value in node.inputs:
                users.setdefault(value, []).append(i)
        return users

    @cached_property
    def _producers(self) -> dict[str, int]:
        return {out: i for i, node in enumerate(self.graph.nodes) for out in node.outputs}

    def operand_views(self, linear: int) -> frozenset[int]:
        """Layout primitives (transpose, reshape, slice, split) computing a matmul operand from a buffer: read
        through strides, no copy, when the chain is a strided view (ir/strided.py decides; a chain that
        is not costs infinity with the reason); and a bf16 operand's cast, which the call may run itself.
        Asked for every candidate node set: computed once."""
        if linear in self._operand_views:
            return self._operand_views[linear]
        node = self.graph.nodes[linear]
        found: set[int] = set()
        frontier = list(node.inputs) if node.prim == "matmul" else []
        for value in dict.fromkeys(node.inputs):  # a bf16 operand's conversion: the call converts it itself
            cast = self.graph.nodes[self._producers[value]] if value in self._producers else None
            if cast is not None and cast.prim == "cast" and cast.attr("to") == "bfloat16":
                found.add(self._producers[value])
                frontier = [cast.inputs[0] if v == value else v for v in frontier]
        while frontier:
            producer = self._producers.get(frontier.pop())
            if producer is None or producer in found or self.graph.nodes[producer].prim not in STRIDED_VIEW_PRIMS:
                continue
            found.add(producer)
            frontier.append(self.graph.nodes[producer].inputs[0])
        self._operand_views[linear] = frozenset(found)
        return self._operand_views[linear]

    def epilogue_reach(self, linear: int) -> set[int]:
        """Elementwise primitives reachable from the linear output through elementwise primitives that keep
        its shape: every epilogue the call could absorb lies in this set."""
        out_shape = self.graph.types[self.graph.nodes[linear].outputs[0]].shape
        reach: set[int] = set()
        frontier = [self.graph.nodes[linear].outputs[0]]
        while frontier:
            value = frontier.pop()
            for user in self._consumers.get(value, []):
                node = self.graph.nodes[user]
                if user in reach or PRIMITIVES[node.prim].kind != Kind.ELEMENTWISE or len(node.outputs) != 1:
                    continue
                if self.graph.types[node.outputs[0]].shape != out_shape:
                    continue
                reach.add(user)
                frontier.append(node.outputs[0])
        return reach

    def companions(self, linear: int) -> frozenset[int]:
        if linear not in self._companions:
            self._companions[linear] = frozenset(self.operand_views(linear) | self.epilogue_reach(linear))
        return self._companions[linear]


@dataclass(frozen=True)
class PruningRule:
    name: str
    monotone: bool
    check: Callable[[Subgraph, int, OrchestrationLimits, LinearEpilogues], str | None]


def node_kinds(sub: Subgraph, mask: int) -> list[tuple[int, Kind]]:
    """(graph node, primitive kind) of each node in the set."""
    return [(sub.node_ids[i], PRIMITIVES[sub.graph.nodes[sub.node_ids[i]].prim].kind) for i in iter_bits(mask)]


def _max_size(sub: Subgraph, mask: int, limits: OrchestrationLimits, _: LinearEpilogues) -> str | None:
    """At most max_kernel_size primitives, or max_elementwise_kernel_size when all are elementwise; a scalar region
    counts as one (subgraph.scalar_regions). Monotone: a set over the first limit with another kind keeps it in every
    superset, and every superset is larger."""
    size = (mask & sub.unit_leaders).bit_count()
    if size <= limits.max_kernel_size:
        return None
    if size > limits.elementwise_kernel_size:
        return f"{size} primitives exceed the max kernel size {limits.elementwise_kernel_size} (elementwise only)"
    other = next((kind for _, kind in node_kinds(sub, mask) if kind != Kind.ELEMENTWISE), None)
    if other is None:
        return None
    return f"{size} primitives exceed the max kernel size {limits.max_kernel_size} (with a {other.value} primitive)"


def _one_linear(sub: Subgraph, mask: int, limits: OrchestrationLimits, _: LinearEpilogues) -> str | None:
    linear = [n for n, kind in node_kinds(sub, mask) if kind == Kind.LINEAR]
    return "two linear primitives: each library call is a kernel of its own" if len(linear) > 1 else None


def _opaque_alone(sub: Subgraph, mask: int, limits: OrchestrationLimits, _: LinearEpilogues) -> str | None:
    kinds = node_kinds(sub, mask)
    opaque = [n for n, kind in kinds if kind == Kind.OPAQUE]
    if opaque and len(kinds) > 1:
        return f"opaque primitive {sub.graph.nodes[opaque[0]].prim} runs alone"
    return None


def _linear_epilogue(sub: Subgraph, mask: int, limits: OrchestrationLimits, epilogues: LinearEpilogues) -> str | None:
    kinds = node_kinds(sub, mask)
    linear = [n for n, kind in kinds if kind == Kind.LINEAR]
    if not linear:
        return None
    allowed = epilogues.companions(linear[0]) | {linear[0]}
    for node, _kind in kinds:
        if node not in allowed:
            name = sub.graph.nodes[linear[0]].prim
            return (f"{name} fused with {sub.graph.nodes[node].prim}: a library call absorbs only operand "
                    "views and elementwise primitives after it that keep its output shape")  # fmt: skip
    return None


PRUNING_RULES: tuple[PruningRule, ...] = (
    PruningRule("max-size", True, _max_size),
    PruningRule("one-linear", True, _one_linear),
    PruningRule("opaque-alone", True, _opaque_alone),
    PruningRule("linear-epilogue", True, _linear_epilogue),
)
