"""A static memory plan: intermediate values whose lifetimes do not overlap share memory.

Giving every value its own buffer for the whole run makes an inference's working set the sum of all its
activations (efficientnet_b0: tens of MB, beyond this machine's L3), so every kernel writes to memory that
has long left the caches. Here each intermediate value lives from the first kernel that writes it to the
last kernel that reads or writes it (inclusive: a kernel never reads and writes the same bytes), and values
are placed in one arena, largest first, each at the lowest offset that no value alive at the same time
occupies (the greedy-by-size heuristic of TFLite's and onnxruntime's planners). Graph inputs, outputs and
constants keep buffers of their own: the caller copies into and out of them.

A view (`aliases`: value -> the value whose bytes it is: the output of a reshape, contiguous slice or split, or
an input of a concat placed inside the concat's output) takes no place of its own: the root's life covers every
kernel touching any of its views, to the end of the run when a view is a graph output.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kernorch.errors import KernorchError
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel

ALIGNMENT = 64  # bytes: a cache line, and what AVX-512 loads prefer


@dataclass(frozen=True)
class Placement:
    offset: int
    nbytes: int
    first: int  # first kernel touching the value
    last: int  # last kernel touching it


@dataclass(frozen=True)
class MemoryPlan:
    placements: dict[str, Placement]
    arena_bytes: int
    unshared_bytes: int  # what one buffer per value would take


def _aligned(nbytes: int) -> int:
    return -(-max(nbytes, 1) // ALIGNMENT) * ALIGNMENT


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | str) -> np.ndarray:
    """An uninitialised C-contiguous array starting on a cache line. numpy aligns to 16 bytes only, and a weight
    whose rows start mid-line makes every 64-byte vector load of a kernel span two lines: lstm_tc's ten identical
    recurrences ran 0.62 ms where R started on a line and 1.01 ms where it started 32 bytes past one."""
    return aligned_buffer(shape, dtype)[0]


def aligned_buffer(shape: tuple[int, ...], dtype: np.dtype | str) -> tuple[np.ndarray, int]:
    """`aligned_empty` and the address of its first byte. Both are per-inference costs for each output (the
    executor binds the output's address into the kernels' table): math.prod and one read of the address, not
    np.prod (3 us) and a second `.ctypes.data` (1 us); gpt2_kv_cache's inference takes ~0.1 ms for five outputs."""
    kind = np.dtype(dtype)
    nbytes = math.prod(shape) * kind.itemsize
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = raw.ctypes.data
    shift = (-start) % ALIGNMENT
    return raw[shift: shift + nbytes].view(kind).reshape(shape), start + shift


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """`array` copied into `aligned_empty` memory (C order)."""
    copy = aligned_empty(array.shape, array.dtype)
    np.copyto(copy, array)
    return copy


def root_of(value: str, aliases: dict[str, str]) -> str:
    """The value whose bytes `value` is (itself unless it is a view)."""
    while value in aliases:
        value = aliases[value]
    return value


def plan_memory(graph: Graph, kernels: list[CandidateKernel], aliases: dict[str, str] | None = None) -> MemoryPlan:
    """Offsets in one arena for every value the kernels write that is not a graph output or a view."""
    aliases = aliases or {}
    dedicated = set(graph.inputs) | set(graph.outputs) | set(graph.constants)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for k, kernel in enumerate(kernels):
        for value in kernel.outputs:
            root = root_of(value, aliases)
            if root in dedicated:
                continue
            # a view lives in its root's bytes: the root lives from the first kernel writing any of them (a
            # concat's inputs are written before the concat) to the last touching any (a graph output: the end)
            first.setdefault(root, k)
            last[root] = len(kernels) if value in dedicated else max(last.get(root, k), k)
        for value in kernel.inputs:
            root = root_of(value, aliases)
            if root in first:
                last[root] = max(last[root], k)
    sizes = {v: _aligned(graph.types[v].nbytes) for v in first}
    placed: list[tuple[str, Placement]] = []
    for value in sorted(first, key=lambda v: (-sizes[v], first[v], v)):
        busy = sorted((p.offset, p.offset + p.nbytes) for _, p in placed
                      if p.first <= last[value] and first[value] <= p.last)  # fmt: skip
        offset = 0
        for begin, end in busy:
            if offset + sizes[value] <= begin:
                break
            offset = max(offset, end)
        placed.append((value, Placement(offset, sizes[value], first[value], last[value])))
    placements = dict(placed)
    arena = max((p.offset + p.nbytes for p in placements.values()), default=0)
    return MemoryPlan(placements, arena, sum(sizes.values()))


def allocate(graph: Graph, plan: MemoryPlan) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The arena and, per planned value, an array of its type viewing its place in the arena."""
    arena = np.empty(max(plan.arena_bytes, 1), dtype=np.uint8)
    views: dict[str, np.ndarray] = {}
    base = arena.ctypes.data
    shift = (-base) % ALIGNMENT  # numpy aligns to 16 bytes; keep every value on a cache line
    if shift:
        arena = np.empty(plan.arena_bytes + ALIGNMENT, dtype=np.uint8)
        shift = (-arena.ctypes.data) % ALIGNMENT
    for value, placement in plan.placements.items():
        t = graph.types[value]
        raw = arena[shift + placement.offset: shift + placement.offset + t.nbytes]
        views[value] = raw.view(np.dtype(t.dtype)).reshape(t.shape)
    return arena, views


class OutOfMemory(KernorchError):
    """A plan needs more memory than this machine has available (refused before anything is allocated)."""


def available_bytes() -> int | None:
    """Memory the kernel says can be allocated without swapping (MemAvailable), or None where it is not known."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits(parts: dict[str, int], what: str) -> None:
    """Refuse in one line when the parts (name -> bytes) together exceed the available memory."""
    available = available_bytes()
    needed = sum(parts.values())
    if available is not None and needed > available:
        detail = ", ".join(f"{name} {_gib(size)}" for name, size in parts.items() if size)
        raise OutOfMemory(f"{what} needs {_gib(needed)} ({detail}); this machine has {_gib(available)} available")


def check_values_fit(graph: Graph, what: str) -> None:
    """Refuse in one line, before planning, a graph one of whose values alone exceeds the available memory (an
    input shape too large for this machine): planning it would take minutes and running it could never fit."""
    values = [*graph.inputs, *(v for node in graph.nodes for v in node.outputs)]
    if values:
        largest = max(values, key=lambda v: graph.types[v].nbytes)
        check_fits({f"its value '{largest}' {'x'.join(map(str, graph.types[largest].shape))}":
                    graph.types[largest].nbytes}, what)  # fmt: skip


def workspace_bytes(graph: Graph, plan: MemoryPlan | None, views: Iterable[str]) -> int:
    """What one workspace allocates: the arena, and a buffer per graph input and per value outside it."""
    placed = set(plan.placements) if plan is not None else set()
    skipped = placed | set(views) | set(graph.constants)
    values = set(graph.inputs) | set(graph.outputs) | {v for n in graph.nodes for v in n.outputs}
    own = sum(graph.types[v].nbytes for v in values - skipped)
    return own + (plan.arena_bytes + ALIGNMENT if plan is not None else 0)


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**28 else f"{size / 2**20:.1f} MiB"
