"""Matmul operands that are strided views: a chain of layout primitives read through strides, never copied.

A matmul operand computed inside its kernel by layout primitives only — transposes, reshapes, slices with a
positive step, one output of a split — holds the elements of the buffer the chain starts from at
`offset + Σ index[i] * strides[i]`, as long as every reshape on the way only splits or merges axes whose
elements are evenly spaced. oneDNN reads such an operand through its strides and an offset pointer, so the
chain costs nothing: gpt2's `split → reshape → transpose` of the fused QKV projection (a copy per layer) becomes
the attention matmuls reading the projection's output directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernorch.ir.graph import Graph
from kernorch.ir.primitives import STRIDED_VIEW_PRIMS


@dataclass(frozen=True)
class StridedView:
    source: str  # the value whose buffer the operand is read from
    offset: int  # elements
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # elements, one per axis
    nodes: tuple[int, ...]  # the layout primitives absorbed, source side first


def swap_last_two(rank: int) -> tuple[int, ...]:
    """The permutation swapping the last two axes: what a matmul reads an operand through, or writes its
    product through ((A @ B)ᵀ = Bᵀ @ Aᵀ), without a copy."""
    return (*range(rank - 2), rank - 1, rank - 2)


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    return tuple(strides)


def reshaped_strides(shape: tuple[int, ...], strides: tuple[int, ...],
                     new_shape: tuple[int, ...]) -> tuple[int, ...] | None:  # fmt: skip
    """Strides of `new_shape` over the same elements, or None when the reshape would need a copy. The axes
    split into runs whose elements are evenly spaced (an axis continues the run before it when that axis'
    stride is its own stride times its size); each run must be exactly a product of consecutive new axes."""
    runs: list[tuple[int, int]] = []  # (elements, innermost stride), outermost run first
    for size, stride in zip(shape, strides, strict=True):
        if size == 1:
            continue
        if runs and runs[-1][1] == stride * size:
            runs[-1] = (runs[-1][0] * size, stride)
        else:
            runs.append((size, stride))
    new_strides = [0] * len(new_shape)
    axis = len(new_shape) - 1
    for elements, stride in reversed(runs):
        covered = 1
        while covered < elements:
            if axis < 0:
                return None
            new_strides[axis] = stride * covered
            covered *= new_shape[axis]
            axis -= 1
        if covered != elements:
            return None
    if any(new_shape[a] != 1 for a in range(axis + 1)):
        return None
    # a size-1 axis is never stepped along; give it the extent of the rest so the layout stays plain
    extent = max([s * n for s, n in zip(new_strides, new_shape, strict=True) if n != 1] or [1])
    return tuple(s if n != 1 else extent for s, n in zip(new_strides, new_shape, strict=True))


def strided_view(graph: Graph, kernel_nodes: set[int], value: str,
                 elementwise: frozenset[int] = frozenset()) -> StridedView | None:  # fmt: skip
    """`value` as a strided view of the buffer its chain of layout primitives inside the kernel starts from;
    None when its producer is not such a primitive in the kernel, or when some step needs a copy. Nodes in
    `elementwise` (shape-keeping, their first input the chain's) are stepped over: the reader applies them to
    each element it reads, and they are listed in the view's nodes."""
    producers = {out: i for i in kernel_nodes for out in graph.nodes[i].outputs}
    chain: list[tuple[int, str]] = []  # (node, the output of it the operand is read through), value side first
    current = value
    while current in producers and (graph.nodes[producers[current]].prim in STRIDED_VIEW_PRIMS
                                    or producers[current] in elementwise):  # fmt: skip
        chain.append((producers[current], current))
        current = graph.nodes[producers[current]].inputs[0]
    if not chain:
        return None
    shape = graph.types[current].shape
    strides = row_major(shape)
    offset = 0
    for node_id, output in reversed(chain):
        node = graph.nodes[node_id]
        if node_id in elementwise:
            continue
        if node.prim == "transpose":
            perm = tuple(node.attr("perm"))
            shape, strides = tuple(shape[p] for p in perm), tuple(strides[p] for p in perm)
        elif node.prim == "slice":
            ranges = node.attr("ranges")
            if any(step < 1 for _, _, step in ranges):
                return None
            offset += sum(start * stride for (start, _, _), stride in zip(ranges, strides, strict=True))
            shape = graph.types[output].shape
            strides = tuple(stride * step for (_, _, step), stride in zip(ranges, strides, strict=True))
        elif node.prim == "split":
            axis = node.attr("axis")
            sizes = node.attr("sizes")
            offset += sum(sizes[: node.outputs.index(output)]) * strides[axis]
            shape = graph.types[output].shape
        else:  # reshape
            new_shape = graph.types[output].shape
            new_strides = reshaped_strides(shape, strides, new_shape)
            if new_strides is None:
                return None
            shape, strides = new_shape, new_strides
    return StridedView(current, offset, shape, strides, tuple(node for node, _ in reversed(chain)))
