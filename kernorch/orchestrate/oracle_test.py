"""The orchestrator's optimum equals an oracle that shares nothing with candidates.py or blp.py.

The oracle enumerates kernels from the definitions (Korch §4.1) by brute force over node subsets: connected
convex node sets within the size limit, and for each every output set that holds the values needed
outside it (required outputs, values other nodes read) plus any subset of those also consumed inside; and
such a set without a matmul plus an elementwise node feeding it whose union is not convex, recomputed there
and never written (candidates.py's recomputed inputs). The
library-call rules come from their specification: one linear primitive per kernel, joined only by the layout
primitives an operand of a matmul is computed by (read through strides: their values are never written)
and elementwise primitives downstream of it that keep its shape, and then writing a single value. Each
kernel costs a pseudo-random function of (node set, output set), the same for both sides. Dijkstra over
sets of available values gives the cheapest executable selection.

The DAGs mix elementwise, reduction, layout and linear primitives on several shapes, with constants, and
are orchestrated whole and partitioned (the composed plan is the sum of the per-subgraph optima).
"""

from __future__ import annotations

import hashlib
import itertools
import random

import numpy as np
import pytest

from kernorch.cost.interface import CostModelBase
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node, verify
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.types import TensorType
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate import orchestrate
from kernorch.orchestrate.blp_test import oracle as shortest_selection
from kernorch.orchestrate.orchestrator import plan_subgraphs

ROWS, COLS = 4, 6
LIMITS = OrchestrationLimits(max_kernel_size=4, max_optional_outputs=10)


def random_mixed_dag(rng: random.Random, size: int) -> Graph:
    """Elementwise (exp, add with a constant or another value), a row reduction broadcast back, a
    transpose pair, and a matmul with a constant weight followed by elementwise epilogue candidates."""
    full = TensorType((ROWS, COLS), "float32")
    graph = Graph(inputs=["x"], types={"x": full}, name="mixed")
    graph.constants = {"c": np.ones((1, COLS), np.float32), "w": np.ones((COLS, COLS), np.float32)}
    graph.types.update({"c": TensorType((1, COLS), "float32"), "w": TensorType((COLS, COLS), "float32")})
    values = ["x"]
    for i in range(size):
        source = rng.choice(values)
        kind = rng.random()
        name = f"v{i}"
        if kind < 0.3:
            graph.nodes.append(Node("exp", (source,), (name,)))
        elif kind < 0.55:
            graph.nodes.append(Node("add", (source, rng.choice([*values, "c"])), (name,)))
        elif kind < 0.7:
            reduced = TensorType((ROWS, 1), "float32")
            graph.nodes.append(Node("reduce_sum", (source,), (name + "r",), (("axes", (1,)),)))
            graph.types[name + "r"] = reduced
            graph.nodes.append(Node("sub", (source, name + "r"), (name,)))
        elif kind < 0.85:
            graph.nodes.append(Node("matmul", (source, "w"), (name,)))
        else:
            graph.types[name + "t"] = TensorType((COLS, ROWS), "float32")
            graph.nodes.append(Node("transpose", (source,), (name + "t",), (("perm", (1, 0)),)))
            graph.nodes.append(Node("transpose", (name + "t",), (name,), (("perm", (1, 0)),)))
        graph.types[name] = full
        values.append(name)
    consumed = {v for n in graph.nodes for v in n.inputs}
    graph.outputs = sorted({n.outputs[0] for n in graph.nodes if n.outputs[0] not in consumed} |
                           {v for v in values[1:] if rng.random() < 0.1})  # fmt: skip
    verify(graph)
    return graph


def _reachable(graph: Graph, start: int, forward: bool) -> set[int]:
    producers = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs}
    edges: dict[int, set[int]] = {i: set() for i in range(len(graph.nodes))}
    for i, node in enumerate(graph.nodes):
        for value in node.inputs:
            if value in producers:
                edges[producers[value]].add(i) if forward else edges[i].add(producers[value])
    seen, stack = set(), [start]
    while stack:
        for nxt in edges[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


Kernel = tuple[frozenset[int], tuple[str, ...]]


def oracle_kernels(graph: Graph, node_ids: list[int], required: set[str]) -> list[Kernel]:
    """Every (node set, output set) the definitions allow, by brute force over subsets of `node_ids`."""
    descendants = {i: _reachable(graph, i, True) for i in node_ids}
    ancestors = {i: _reachable(graph, i, False) for i in node_ids}
    direct = {i: {j for j in node_ids if set(graph.nodes[j].outputs) & set(graph.nodes[i].inputs) or
                  set(graph.nodes[i].outputs) & set(graph.nodes[j].inputs)} for i in node_ids}  # fmt: skip
    kernels = []
    for size in range(1, LIMITS.max_kernel_size + 1):
        for subset in itertools.combinations(node_ids, size):
            chosen = set(subset)
            # convex: no path leaves the set and comes back
            outside_between = {k for i in chosen for j in chosen for k in descendants[i] & ancestors[j]} - chosen
            if outside_between:
                continue
            # connected through data edges
            seen, stack = {subset[0]}, [subset[0]]
            while stack:
                for nxt in direct[stack.pop()] & chosen:
                    if nxt not in seen:
                        seen.add(nxt)
                        stack.append(nxt)
            if seen != chosen:
                continue
            linear = [i for i in chosen if graph.nodes[i].prim == "matmul"]
            if len(linear) > 1:
                continue
            if linear:
                root = linear[0]
                out_shape = graph.types[graph.nodes[root].outputs[0]].shape
                allowed = {i for i in descendants[root] if graph.nodes[i].prim in ("exp", "add", "sub") and
                           graph.types[graph.nodes[i].outputs[0]].shape == out_shape and
                           _elementwise_path(graph, root, i, out_shape)}  # fmt: skip
                operand_views = _layout_chains(graph, root)
                allowed |= operand_views & chosen
                if not (chosen - {root}) <= allowed:
                    continue
            read_through = operand_views if linear else set()  # read through strides, never written
            produced = [o for i in sorted(chosen) if i not in read_through for o in graph.nodes[i].outputs]
            inside = {v for i in chosen for v in graph.nodes[i].inputs}
            outside = {v for j in node_ids if j not in chosen for v in graph.nodes[j].inputs}
            boundary = [v for v in produced if v in required or v in outside]
            mandatory = [v for v in boundary if v not in inside]
            optional = [v for v in boundary if v in inside]
            if not mandatory:
                continue
            for r in range(len(optional) + 1):
                for extra in itertools.combinations(optional, r):
                    outputs = tuple(mandatory) + extra
                    if linear and len(outputs) > 1:
                        continue  # a library call writes only its final value
                    kernels.append((frozenset(chosen), outputs))
    return kernels + _recomputing(graph, node_ids, required, {nodes for nodes, _ in kernels}, descendants, ancestors)


def _recomputing(graph: Graph, node_ids: list[int], required: set[str], convex: set[frozenset[int]],
                 descendants: dict[int, set[int]], ancestors: dict[int, set[int]]) -> list[Kernel]:  # fmt: skip
    """A kernel without a matmul plus an elementwise node p feeding it, p not downstream of it, where the union
    is not convex (p's value also reaches the kernel through a node outside) and p's value is used only there
    and on the way back into the kernel (not a required output): p is recomputed, its value never written;
    every output set of the union otherwise."""
    found: dict[frozenset[int], list[tuple[str, ...]]] = {}
    for nodes in convex:
        if any(graph.nodes[i].prim == "matmul" for i in nodes):
            continue
        reads = {v for i in nodes for v in graph.nodes[i].inputs}
        for p in node_ids:
            node = graph.nodes[p]
            if p in nodes or node.prim not in ("exp", "add", "sub") or not set(node.outputs) & reads or \
                    ancestors[p] & nodes or len(nodes) + 1 > LIMITS.max_kernel_size:  # fmt: skip
                continue
            chosen = nodes | {p}
            if not {k for i in chosen for j in chosen for k in descendants[i] & ancestors[j]} - chosen:
                continue  # convex: an ordinary kernel
            users = [j for j in node_ids if set(node.outputs) & set(graph.nodes[j].inputs) and j not in chosen]
            if set(node.outputs) & required or any(not descendants[j] & nodes for j in users):
                continue  # p's value is needed elsewhere than on the way back into the set: written anyway
            produced = [o for i in sorted(chosen) if i != p for o in graph.nodes[i].outputs]
            inside = {v for i in chosen for v in graph.nodes[i].inputs}
            outside = {v for j in node_ids if j not in chosen for v in graph.nodes[j].inputs}
            boundary = [v for v in produced if v in required or v in outside]
            mandatory = [v for v in boundary if v not in inside]
            optional = [v for v in boundary if v in inside]
            if mandatory:
                found[chosen] = [tuple(mandatory) + extra for r in range(len(optional) + 1)
                                 for extra in itertools.combinations(optional, r)]  # fmt: skip
    return [(nodes, outputs) for nodes, sets in found.items() for outputs in sets]


def _layout_chains(graph: Graph, root: int) -> set[int]:
    """Layout primitives from which the matmul `root` reads an operand through layout primitives only."""
    producers = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs}
    found: set[int] = set()
    stack = [producers[v] for v in graph.nodes[root].inputs if v in producers]
    while stack:
        node = stack.pop()
        if node in found or graph.nodes[node].prim not in ("transpose", "reshape", "slice", "split"):
            continue
        found.add(node)
        stack.extend(producers[v] for v in graph.nodes[node].inputs if v in producers)
    return found


def _elementwise_path(graph: Graph, root: int, target: int, shape: tuple[int, ...]) -> bool:
    """target is reached from root through elementwise nodes of `shape` only."""
    producers = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs}
    stack, seen = [target], set()
    while stack:
        node = stack.pop()
        if node == root:
            return True
        if node in seen or graph.nodes[node].prim not in ("exp", "add", "sub") or \
                graph.types[graph.nodes[node].outputs[0]].shape != shape:  # fmt: skip
            continue
        seen.add(node)
        stack.extend(producers[v] for v in graph.nodes[node].inputs if v in producers)
    return False


def kernel_cost(nodes: frozenset[int] | tuple[int, ...], outputs: tuple[str, ...]) -> float:
    key = f"{sorted(nodes)}|{sorted(outputs)}".encode()
    fraction = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64
    # fused kernels tend to be cheaper per primitive, so fusion and redundancy both get tried
    return (1.0 + 9.0 * fraction) * (0.45 ** (len(nodes) - 1)) * len(nodes)


class HashCost(CostModelBase):
    name = "oracle-hash"

    def cost(self, candidate: CandidateKernel) -> float:
        return kernel_cost(candidate.nodes, candidate.outputs)


def dijkstra(kernels: list[Kernel], graph: Graph, required: set[str],
             available: set[str]) -> float:  # fmt: skip
    """Cheapest executable selection: shortest path over sets of available values (blp_test's oracle)."""
    runnable = [make_kernel(graph, tuple(sorted(nodes)), outputs) for nodes, outputs in kernels]
    return shortest_selection(runnable, [kernel_cost(n, o) for n, o in kernels], required, available)


@pytest.mark.parametrize("seed", range(40))
def test_orchestrator_matches_an_independent_oracle(seed: int) -> None:
    rng = random.Random(seed)
    graph = random_mixed_dag(rng, rng.randint(3, 6))
    result = orchestrate(graph, HashCost(), LIMITS)
    assert result.all_optimal
    everything = list(range(len(graph.nodes)))
    expected = dijkstra(oracle_kernels(graph, everything, set(graph.outputs)), graph, set(graph.outputs),
                        set(graph.inputs) | set(graph.constants))  # fmt: skip
    assert result.plan.cost == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("seed", range(15))
def test_partitioned_plans_compose_the_subgraph_optima(seed: int) -> None:
    rng = random.Random(100 + seed)
    graph = random_mixed_dag(rng, rng.randint(6, 9))
    limits = OrchestrationLimits(max_kernel_size=4, max_optional_outputs=10, max_subgraph_size=4)
    result = orchestrate(graph, HashCost(), limits)
    available = set(graph.inputs) | set(graph.constants)
    total = 0.0
    for sub, _ in plan_subgraphs(graph, limits):
        total += dijkstra(oracle_kernels(graph, sub.node_ids, sub.required_outputs), graph, sub.required_outputs,
                          available)  # fmt: skip
        available |= sub.required_outputs
    assert len(result.subgraphs) > 1
    assert result.plan.cost == pytest.approx(total, rel=1e-9)


def _without_strict_subsets(kernels: list[Kernel]) -> list[Kernel]:
    """Per node set, only the fewest and the most outputs it can write."""
    sizes: dict[frozenset[int], list[int]] = {}
    for nodes, outputs in kernels:
        sizes.setdefault(nodes, []).append(len(outputs))
    return [(n, o) for n, o in kernels if len(o) in (min(sizes[n]), max(sizes[n]))]


@pytest.mark.parametrize("seed", [16, 38, 58])
def test_kernels_writing_some_of_their_optional_outputs_are_candidates(seed: int) -> None:
    """DAGs (found by search) whose optimum needs a kernel that writes a strict subset of the values it could
    write: with only none-or-all candidates the optimum is worse (checked here, so the case stays sharp)."""
    rng = random.Random(seed)
    graph = random_mixed_dag(rng, rng.randint(4, 7))
    result = orchestrate(graph, HashCost(), LIMITS)
    kernels = oracle_kernels(graph, list(range(len(graph.nodes))), set(graph.outputs))
    start = set(graph.inputs) | set(graph.constants)
    expected = dijkstra(kernels, graph, set(graph.outputs), start)
    assert dijkstra(_without_strict_subsets(kernels), graph, set(graph.outputs), start) > expected + 1e-6
    assert result.plan.cost == pytest.approx(expected, rel=1e-9)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("optional-output subsets collapse to none/all",
         "extra = [c for r in range(len(optional) + 1) for c in combinations(optional, r)]",
         "extra = [(), tuple(optional)]",
         file="kernorch/orchestrate/candidates.py",
         tests=("kernorch/orchestrate/oracle_test.py", "kernorch/orchestrate/blp_test.py")),
    here("no kernel recomputes an elementwise input",
         "        found.append((extended, p))",
         "        continue",
         file="kernorch/orchestrate/candidates.py"),
]  # fmt: skip
