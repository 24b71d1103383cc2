"""Plans: kernels in an executable order, and the validator every plan must pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel


class PlanError(AssertionError):
    """A plan that cannot run: an input used before it is produced, or a graph output never produced."""


@dataclass
class Plan:
    graph: Graph
    kernels: list[CandidateKernel]
    costs: list[float]

    @property
    def cost(self) -> float:
        return sum(self.costs)

    @property
    def kernel_keys(self) -> frozenset[object]:
        """What tells two plans of one graph apart: their kernels' node sets and outputs."""
        return frozenset(k.key for k in self.kernels)


def storing(plan: Plan, values: Sequence[str]) -> Plan:
    """`plan` with `values` among its graph's outputs, each written by the kernel that computes it: the same
    kernels, so the same arithmetic in the same order, with extra stores (a check reading a plan's intermediate
    values). PlanError names a value no kernel computes."""
    wanted = list(dict.fromkeys(values))
    graph = plan.graph.copy()
    graph.outputs = list(dict.fromkeys([*graph.outputs, *wanted]))
    computed_anywhere: set[str] = set()
    kernels = []
    for kernel in plan.kernels:
        computed = {out for node in kernel.primitives for out in node.outputs}
        computed_anywhere |= computed
        extra = tuple(v for v in wanted if v in computed and v not in kernel.outputs)
        kernels.append(replace(kernel, outputs=kernel.outputs + extra, graph=graph))
    missing = [value for value in wanted if value not in computed_anywhere and value not in graph.inputs]
    if missing:
        raise PlanError(f"no kernel of the plan computes {missing[:3]}")
    return Plan(graph, kernels, list(plan.costs))


def validate_plan(graph: Graph, kernels: list[CandidateKernel]) -> None:
    """Run the plan symbolically; raise PlanError naming the first kernel that cannot run."""
    available = set(graph.inputs) | set(graph.constants)
    for index, kernel in enumerate(kernels):
        label = f"kernel {index} ({kernel.describe()})"
        for value in kernel.inputs:
            if value not in available:
                raise PlanError(f"{label} reads '{value}' before any kernel produces it")
        computed = set(kernel.inputs)
        for node_index in kernel.nodes:
            node = graph.nodes[node_index]
            for value in node.inputs:
                if value not in computed:
                    raise PlanError(f"{label}: primitive {node.prim} needs '{value}', not an input of the kernel")
            computed.update(node.outputs)
        for value in kernel.outputs:
            if value not in computed:
                raise PlanError(f"{label} claims output '{value}' that it does not compute")
        available.update(kernel.outputs)
    missing = [value for value in graph.outputs if value not in available]
    if missing:
        raise PlanError(f"graph outputs never produced: {missing}")


def executable_order(kernels: list[CandidateKernel], available: set[str]) -> tuple[list[int], list[int]]:
    """Order kernels so each runs once its inputs exist. Returns (order, stuck kernel indices)."""
    ready = set(available)
    pending = list(range(len(kernels)))
    order: list[int] = []
    progress = True
    while pending and progress:
        progress = False
        for k in list(pending):
            if all(v in ready for v in kernels[k].inputs):
                order.append(k)
                ready.update(kernels[k].outputs)
                pending.remove(k)
                progress = True
    return order, pending
