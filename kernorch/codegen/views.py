"""Kernels that only re-label bytes: a reshape, a slice that is one contiguous block of its input, a split
along an axis with nothing but size-1 axes before it. Their outputs are views — aliases at an offset into the
input's buffer (row-major data keeps its order) — so they run no code and move no data."""

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
    return None
