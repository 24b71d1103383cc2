"""Kernels that only re-label bytes: a reshape, a slice that is one contiguous block of its input, a split
along an axis with nothing but size-1 axes before it. Their outputs are views — aliases at an offset into the
input's buffer (row-major data keeps its order) — so they run no code and move no data.

A concat along such an axis is the same in reverse: its inputs are placed at offsets inside its output, so the
kernels producing them write there directly and the concat runs no code. Whether that is possible is a property
of the whole plan (an input must be written by a kernel, not be a graph input or output, and be placed in only
one concat), so `plan_views` (codegen/backends/registry.py) decides it per plan; a concat it cannot place runs as a
copy (generated C)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.primitives import slice_length


def _strides(shape: Sequence[int]) -> list[int]:
    return [int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape))]


def contiguous_block(shape: Sequence[int], ranges: Sequence[Sequence[int]]) -> int | None:
    """The element offset of a slice that is one contiguous run of its row-major input, else None: every axis
    after some axis j is taken whole, axis j with step 1, and every axis before j keeps one index."""
    extents = [slice_length(*r) for r in ranges]
    if 0 in extents:
        return None
    whole = [extent == dim and (step == 1 or dim == 1) for extent, dim, (_, _, step) in zip(extents, shape, ranges,
                                                                                         strict=True)]  # fmt: skip
    j = len(shape) - 1
    while j >= 0 and whole[j]:
        j -= 1
    if j >= 0 and (extents[j] > 1 and ranges[j][2] != 1 or any(extents[i] != 1 for i in range(j))):
        return None
    return sum(start * stride for (start, _, _), stride in zip(ranges, _strides(shape), strict=True))


def concat_pieces(kernel: CandidateKernel) -> dict[str, tuple[str, int]] | None:
    """input -> (the concat's output, element offset) for a lone concat whose inputs are contiguous blocks of its
    output, written by other kernels (no graph input or constant); None otherwise."""
    prims = kernel.primitives
    if len(prims) != 1 or prims[0].prim != "concat" or kernel.outputs != prims[0].outputs:
        return None
    node, graph = prims[0], kernel.graph
    output = node.outputs[0]
    shape = graph.types[output].shape
    axis = node.attr("axis")
    dedicated = set(graph.inputs) | set(graph.constants) | set(graph.outputs)
    if any(d != 1 for d in shape[:axis]) or len(set(node.inputs)) != len(node.inputs) or set(node.inputs) & dedicated:
        return None
    stride = _strides(shape)[axis]
    pieces, start = {}, 0
    for value in node.inputs:
        pieces[value] = (output, start * stride)
        start += graph.types[value].shape[axis]
    return pieces


def view_outputs(kernel: CandidateKernel) -> dict[str, tuple[str, int]] | None:
    """value -> (the value whose bytes it is, element offset) when `kernel` only re-labels contiguous bytes of its
    input; None otherwise."""
    prims = kernel.primitives
    if len(prims) != 1:
        return None
    node = prims[0]
    source = node.inputs[0] if node.inputs else ""
    if node.prim == "reshape" and kernel.outputs == node.outputs:
        return {node.outputs[0]: (source, 0)}
    if node.prim == "slice":
        offset = contiguous_block(kernel.graph.types[source].shape, node.attr("ranges"))
        return None if offset is None else {node.outputs[0]: (source, offset)}
    if node.prim == "split":
        shape = kernel.graph.types[source].shape
        axis = node.attr("axis")
        if any(d != 1 for d in shape[:axis]) or 0 in node.attr("sizes"):
            return None
        stride = _strides(shape)[axis]
        starts = np.cumsum([0, *node.attr("sizes")[:-1]])
        return {out: (source, int(start) * stride) for out, start in zip(node.outputs, starts, strict=True)
                if out in kernel.outputs}  # fmt: skip
    if node.prim == "concat" and concat_pieces(kernel) is not None:
        return {}  # the inputs are views of the output (concat_pieces), decided per plan by plan_views
    return None
