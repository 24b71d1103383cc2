"""Greedy fusion baseline, TVM FuseOps-like, on the same candidate machinery and cost model.

Walking in topological order, a primitive joins its producers' kernel when: it is elementwise, layout or
reduce; all its in-subgraph producers are in one kernel; that kernel holds no linear/opaque primitive
and, for a reduce, no other reduce; every value it reads from that kernel has it as the only consumer;
and the kernel stays within the size limit. Linear and opaque primitives stay alone.
"""

from __future__ import annotations

from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.primitives import PRIMITIVES, Kind
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate.subgraph import Subgraph, iter_bits


def greedy_kernels(sub: Subgraph, limits: OrchestrationLimits) -> list[CandidateKernel]:
    graph = sub.graph
    kinds = [PRIMITIVES[graph.nodes[node].prim].kind for node in sub.node_ids]
    group_of = list(range(sub.size))
    members: dict[int, list[int]] = {i: [i] for i in range(sub.size)}
    consumers: dict[str, set[int]] = {}
    for i, node in enumerate(sub.node_ids):
        for value in graph.nodes[node].inputs:
            consumers.setdefault(value, set()).add(i)

    for i, node in enumerate(sub.node_ids):
        if kinds[i] in (Kind.LINEAR, Kind.OPAQUE):
            continue
        producer_groups = {group_of[p] for p in iter_bits(sub.pred_masks[i])}
        if len(producer_groups) != 1:
            continue
        group = producer_groups.pop()
        group_kinds = [kinds[m] for m in members[group]]
        if Kind.LINEAR in group_kinds or Kind.OPAQUE in group_kinds:
            continue
        if kinds[i] == Kind.REDUCE and Kind.REDUCE in group_kinds:
            continue
        if len(members[group]) + 1 > limits.max_kernel_size:
            continue
        read = [v for v in graph.nodes[node].inputs if v in sub.producer and group_of[sub.producer[v]] == group]
        if any(consumers[v] != {i} or v in sub.required_outputs for v in read):
            continue
        members[group].append(i)
        group_of[i] = group
        del members[i]

    kernels = []
    for group_members in members.values():
        nodes = tuple(sub.node_ids[m] for m in sorted(group_members))
        inside = set(group_members)
        outputs = tuple(
            value for m in sorted(group_members) for value in graph.nodes[sub.node_ids[m]].outputs
            if value in sub.required_outputs or any(c not in inside for c in consumers.get(value, ()))
        )  # fmt: skip
        kernels.append(make_kernel(graph, nodes, outputs))
    return kernels
