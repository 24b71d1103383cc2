"""Attention node sets: the one kind of candidate kernel holding two linear primitives.

Candidate growth (candidates.py) keeps one linear primitive per kernel — a library call runs one. An attention
— S = matmul(Q, Kᵀ), elementwise steps on S, softmax over its rows, ·V — can run as one kernel that keeps the
scores in cache (codegen/native/attention.py decides whether it runs a given set). This finds each such set
around an `exp` in the subgraph: the core primitives, plus the layout primitives, bf16 casts and scalar scalings
computing the matmul operands (read through strides), upstream nodes dropped until the set is convex. Whether a
backend runs it and what it costs are asked as for any candidate.
"""

from __future__ import annotations

from kernorch.ir.graph import Graph
from kernorch.ir.primitives import STRIDED_VIEW_PRIMS
from kernorch.orchestrate.subgraph import Subgraph, is_convex

_SCORE_STEPS = frozenset({"mul", "add", "sub", "div"})
# what may stand between the softmax and ·V (codegen/native/attention.py's _WEIGHT_PRIMS: the kernel's side)
_WEIGHT_STEPS = frozenset({"cast", "equal", "not", "where", "mul", "add", "sub", "div", "max", "min"})


def _users(graph: Graph, members: list[int]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for i in members:
        for value in graph.nodes[i].inputs:
            found.setdefault(value, []).append(i)
    return found


def _core(sub: Subgraph, exp: int, users: dict[str, list[int]]) -> tuple[set[int], int, int] | None:
    """(the core nodes, the first matmul, the second) of the attention around `exp`, or None."""
    graph, producer = sub.graph, {v: sub.node_ids[i] for v, i in sub.producer.items()}

    def made_by(value: str, prim: str) -> int | None:
        node = producer.get(value)
        return node if node is not None and graph.nodes[node].prim == prim else None

    def used_by(value: str, prim: str) -> list[int]:
        return [u for u in users.get(value, []) if graph.nodes[u].prim == prim]

    difference = made_by(graph.nodes[exp].inputs[0], "sub")
    if difference is None:
        return None
    scores, row_max = graph.nodes[difference].inputs
    if made_by(row_max, "reduce_max") is None:
        return None
    core = {exp, difference, producer[row_max]}

    def from_matmul(value: str, depth: int = 8) -> bool:
        """Whether `value` is a matmul's product after at most `depth` steps (not, say, a mask computed here)."""
        node = producer.get(value)
        if node is None or depth == 0:
            return False
        prim = graph.nodes[node].prim
        return prim == "matmul" or (prim in _SCORE_STEPS and any(from_matmul(v, depth - 1)
                                                                 for v in graph.nodes[node].inputs))  # fmt: skip

    while scores in producer and graph.nodes[producer[scores]].prim in _SCORE_STEPS:  # scale, mask
        step = producer[scores]
        core.add(step)
        a, b = graph.nodes[step].inputs
        scores = a if from_matmul(a) else b
    first = made_by(scores, "matmul")
    if first is None:
        return None
    core.add(first)
    weights = graph.nodes[exp].outputs[0]
    core.update(used_by(weights, "reduce_sum"))
    if len(found := used_by(weights, "div")) == 1:  # E / l (unless the rewrites moved it past the matmul)
        core.add(found[0])
        weights = graph.nodes[found[0]].outputs[0]
    # then elementwise steps with scalar constants (a bf16 cast; torch's where(isnan(P), 0, P)) to the matmul
    reached, frontier, seconds = {weights}, [weights], set()
    while frontier:
        for user in users.get(frontier.pop(), []):
            node = graph.nodes[user]
            if node.prim == "matmul" and node.inputs[0] in reached:
                seconds.add(user)
            elif node.prim in _WEIGHT_STEPS and user not in core and all(
                    v in reached or v in graph.constants for v in node.inputs):  # fmt: skip
                core.add(user)
                reached.update(node.outputs)
                frontier += node.outputs
    if len(seconds) != 1:
        return None
    (second,) = seconds
    core.add(second)
    core.update(used_by(graph.nodes[second].outputs[0], "div")[:1])  # matmul(E, V) / l
    return core, first, second


def _operand_chain(sub: Subgraph, value: str) -> list[int]:
    """Nodes computing a matmul operand from a buffer: layout primitives, casts and scalar scalings."""
    graph, producer = sub.graph, {v: sub.node_ids[i] for v, i in sub.producer.items()}
    chain: list[int] = []
    while value in producer:
        node = graph.nodes[producer[value]]
        scaled = node.prim in ("mul", "div") and node.inputs[1] in graph.constants
        if node.prim not in STRIDED_VIEW_PRIMS and node.prim != "cast" and not scaled:
            break
        chain.append(producer[value])
        value = node.inputs[0]
    return chain


def attention_sets(sub: Subgraph) -> list[tuple[int, int]]:
    """(the set, its core) as bitmasks over the subgraph's local indices, for each attention found; the core's
    nodes are the attention's own (the rest compute its operands)."""
    graph = sub.graph
    users = _users(graph, sub.node_ids)
    masks: list[tuple[int, int]] = []
    for exp in (n for n in sub.node_ids if graph.nodes[n].prim == "exp"):
        found = _core(sub, exp, users)
        if found is None:
            continue
        core, first, second = found
        operands = [*graph.nodes[first].inputs, graph.nodes[second].inputs[1]]
        chains = sorted({n for value in operands for n in _operand_chain(sub, value)} - core)
        members = core | set(chains)
        mask = sum(1 << sub.local[n] for n in members)
        while not is_convex(sub, mask) and chains:  # the most upstream operand node computed elsewhere
            mask &= ~(1 << sub.local[chains.pop(0)])
        if is_convex(sub, mask):
            masks.append((mask, sum(1 << sub.local[n] for n in core)))
    return masks
