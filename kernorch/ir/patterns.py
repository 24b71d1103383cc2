"""Graph patterns more than one stage looks for: the attentions (two matmuls around a softmax's exp), which the
partition keeps whole (orchestrate/subgraph.py) and the precision stage prices together (precision/)."""

from __future__ import annotations

from kernorch.ir.graph import Graph


def attention_spans(graph: Graph, depth: int = 8) -> list[tuple[int, int]]:
    """(first, second): the positions of the two matmuls around each exp (the product the exp's input comes from,
    the product its value reaches, each within `depth` steps): an attention, as the candidates find it."""
    producer = {out: i for i, node in enumerate(graph.nodes) for out in node.outputs}
    users: dict[str, list[int]] = {}
    for i, node in enumerate(graph.nodes):
        for value in node.inputs:
            users.setdefault(value, []).append(i)

    def nearest(start: int, up: bool) -> int | None:
        frontier, seen = [start], {start}
        for _ in range(depth):
            following = []
            for i in frontier:
                node = graph.nodes[i]
                steps = [producer[v] for v in node.inputs if v in producer] if up else \
                    [u for v in node.outputs for u in users.get(v, [])]  # fmt: skip
                for j in steps:
                    if graph.nodes[j].prim == "matmul":
                        return j
                    if j not in seen:
                        seen.add(j)
                        following.append(j)
            frontier = following
        return None

    spans = []
    for i, node in enumerate(graph.nodes):
        if node.prim == "exp":
            first, second = nearest(i, up=True), nearest(i, up=False)
            if first is not None and second is not None:
                spans.append((first, second))
    return spans
