"""Layouts as permutations, and the algebra the layout stage needs.

A value of logical shape S stored in layout `p` is the tensor `transpose(value, p)`: its memory order is
S's axes in the order p lists them. Identity is row-major; channels-last of a rank-4 value is (0, 2, 3, 1).
Axes of size 1 do not affect the memory order, so two layouts are the same memory when they order the
non-1 axes alike; `canonical` picks one representative (size-1 axes stay where they are), so equal
canonical layouts mean equal bytes and a change between them is free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

Perm = tuple[int, ...]
T = TypeVar("T")


def identity(rank: int) -> Perm:
    return tuple(range(rank))


def channels_last(rank: int) -> Perm:
    return (0, *range(2, rank), 1)


def inverse(perm: Perm) -> Perm:
    result = [0] * len(perm)
    for position, axis in enumerate(perm):
        result[axis] = position
    return tuple(result)


def permute(items: Sequence[T], perm: Perm) -> tuple[T, ...]:
    """`items` (one per logical axis) in the order of `perm`: the stored shape of a shape, for instance."""
    return tuple(items[a] for a in perm)


def canonical(perm: Perm, shape: tuple[int, ...]) -> Perm:
    """The representative of `perm`'s memory order on `shape`: size-1 axes keep their positions, the others
    fill the remaining positions in `perm`'s order."""
    order = iter(a for a in perm if shape[a] != 1)
    return tuple(a if shape[a] == 1 else next(order) for a in range(len(shape)))


def between(source: Perm, target: Perm) -> Perm:
    """The transpose taking a value stored in `source` to the same value stored in `target`."""
    inv = inverse(source)
    return tuple(inv[a] for a in target)


def broadcast_operand(perm: Perm, operand_rank: int) -> Perm:
    """The layout an operand of lower rank (numpy-aligned to the right) needs so that it is stored in the
    same axis order as a result stored in `perm`."""
    offset = len(perm) - operand_rank
    return tuple(a - offset for a in perm if a >= offset)


def reshape_groups(source: tuple[int, ...], target: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """Split a reshape into groups of non-1 source axes and the non-1 target axes they become (equal products),
    e.g. [N, C, H, W] → [N, 2, C/2, H, W]: ([0], [0]), ([1], [1, 2]), ([2], [3]), ([3], [4])."""
    src = [a for a in range(len(source)) if source[a] != 1]
    dst = [b for b in range(len(target)) if target[b] != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i >= len(src) or j >= len(dst):
            return None
        group_src, group_dst = [src[i]], [dst[j]]
        size_src, size_dst = source[src[i]], target[dst[j]]
        i, j = i + 1, j + 1
        while size_src != size_dst:
            if size_src < size_dst:
                if i >= len(src):
                    return None
                group_src.append(src[i])
                size_src *= source[src[i]]
                i += 1
            else:
                if j >= len(dst):
                    return None
                group_dst.append(dst[j])
                size_dst *= target[dst[j]]
                j += 1
        groups.append((group_src, group_dst))
    return groups


def reshape_layout(source: tuple[int, ...], target: tuple[int, ...], perm: Perm) -> Perm | None:
    """If a value stored in `perm` can be reshaped to `target` without moving data, the layout of the
    result (canonical); None when the reshape mixes axes the layout separates."""
    groups = reshape_groups(source, target)
    if groups is None:
        return None
    stored = [a for a in perm if source[a] != 1]
    position = {a: k for k, a in enumerate(stored)}
    ordered: list[tuple[int, list[int]]] = []
    for group_src, group_dst in groups:
        places = [position[a] for a in group_src]
        if places != list(range(places[0], places[0] + len(places))):
            return None  # the group's axes are not adjacent and in order in memory
        ordered.append((places[0], group_dst))
    target_order = [b for _, group_dst in sorted(ordered) for b in group_dst]
    full = [b for b in range(len(target)) if target[b] == 1] + target_order
    return canonical(tuple(full), target)
