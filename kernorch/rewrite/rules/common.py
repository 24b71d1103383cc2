"""Helpers shared by rewrite rules."""

from __future__ import annotations

import numpy as np

from kernorch.ir.graph import Node
from kernorch.ir.strided import swap_last_two
from kernorch.rewrite.engine import RewriteContext

__all__ = ["channel_vector", "free_swap", "swap_last_two"]


def free_swap(ctx: RewriteContext, transpose: Node) -> bool:
    """A swap of the last two axes read only by matmuls costs nothing: the library call takes strides."""
    rank = ctx.type(transpose.outputs[0]).rank
    users = ctx.consumers(transpose.outputs[0])
    return rank >= 2 and tuple(transpose.attr("perm")) == swap_last_two(rank) and bool(users) \
        and all(u.prim == "matmul" for u in users) and not ctx.is_output(transpose.outputs[0])  # fmt: skip


def channel_vector(ctx: RewriteContext, scale: str, out: str, axis: int) -> np.ndarray | None:
    """A constant broadcasting into `out` along `axis` only (or a scalar): its values as a 1-D vector."""
    array = ctx.const(scale)
    out_shape = ctx.type(out).shape
    if array is None or array.ndim > len(out_shape):
        return None
    offset = len(out_shape) - array.ndim
    for i, size in enumerate(array.shape):
        if size != 1 and not (i + offset == axis and size == out_shape[axis]):
            return None
    return array.reshape(-1)
