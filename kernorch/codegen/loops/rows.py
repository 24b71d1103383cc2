"""Which fused kernels run as rows (softmax, layer/instance norm), and what a row keeps in cache.

The row schedule is one parallel loop over rows; per row, reductions go into scalars and outputs are written,
so the row stays in the thread's cache between passes. `row_schedule` decides whether a kernel fits it;
`kept_in_row` finds a value worth computing once per element and reading back rather than recomputing.
"""

from __future__ import annotations

from kernorch.ir.graph import Graph, Node
from kernorch.ir.primitives import PRIMITIVES, Kind

_EXPENSIVE = {"exp", "log", "log1p", "tanh", "erf", "sigmoid", "pow", "sin", "cos", "softplus"}


def ancestors(graph: Graph, nodes: list[Node], node: Node) -> set[str]:
    """Values computed inside the kernel that `node` depends on."""
    producer = {o: n for n in nodes for o in n.outputs}
    found: set[str] = set()
    pending = list(node.inputs)
    while pending:
        value = pending.pop()
        if value in producer and value not in found:
            found.add(value)
            pending += producer[value].inputs
    return found


def kept_in_row(graph: Graph, nodes: list[Node], reductions: list[Node], outputs: tuple[str, ...],
                 full_shape: tuple[int, ...]) -> tuple[str, str] | None:  # fmt: skip
    """(value, output it is kept in) when a row value with a transcendental in it is reduced and also used by
    the outputs (softmax's exp(x - max): summed, then divided by the sum). Inlined, it would be computed once
    per reduction and once per output (two exps per element); kept in the row of an output buffer — which the
    output overwrites in place, element by element — it is computed once and read back from the cache."""
    producer = {o: n for n in nodes for o in n.outputs}
    consumers: dict[str, list[Node]] = {}
    for n in nodes:
        for value in n.inputs:
            consumers.setdefault(value, []).append(n)
    for n in reductions:
        value = n.inputs[0]
        if value not in producer or graph.types[value].shape != full_shape or len(consumers.get(value, [])) < 2:
            continue
        if not ({value} | ancestors(graph, nodes, producer[value])) & \
                {o for m in nodes if m.prim in _EXPENSIVE for o in m.outputs}:  # fmt: skip
            continue  # cheap to compute again (layer norm's x - mean)
        if value in outputs:
            return value, value
        dtype = graph.types[value].dtype
        target = next((o for o in outputs if graph.types[o].shape == full_shape and graph.types[o].dtype == dtype
                       and value in ancestors(graph, nodes, producer[o])), None)  # fmt: skip
        if target is not None:
            return value, target
    return None


def row_schedule(graph: Graph, nodes: list[Node], reductions: list[Node],
                  outputs: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:  # fmt: skip
    """(full shape, reduced axes) when the kernel fits the row schedule, else None."""
    if not reductions or any(not n.prim.startswith("reduce_") for n in reductions):
        return None
    full = graph.types[reductions[0].inputs[0]].shape
    axes = tuple(reductions[0].attr("axes"))
    if axes[-1] != len(full) - 1 and any(full[a] != 1 for a in range(axes[-1] + 1, len(full))):
        # the innermost axis is not reduced (e.g. a channels-last instance norm): per row, the reduction would
        # stride through memory; the phased schedule sums across rows with the innermost axis vectorized
        return None
    if any(graph.types[n.inputs[0]].shape != full or tuple(n.attr("axes")) != axes for n in reductions):
        return None
    reduced = tuple(1 if a in axes else s for a, s in enumerate(full))
    for n in nodes:
        if PRIMITIVES[n.prim].kind not in (Kind.ELEMENTWISE, Kind.REDUCE) or n.prim == "expand":
            return None
        if graph.types[n.outputs[0]].shape not in (full, reduced):
            return None
    return full, axes
