"""Which units must wait for which: read-after-write, write-after-read and write-after-write on bytes.

Dependencies come from the bytes each kernel reads and writes, not from value names: views alias their source,
and the static memory plan (runtime/memory.py) gives values with disjoint lifetimes the same arena bytes, so a
kernel may overwrite bytes an earlier, otherwise unrelated kernel still has to read. Kernels keep their plan
order wherever two of them touch the same bytes and one of them writes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kernorch.schedule.program import Unit

Interval = tuple[int, int]  # [start, end) byte addresses


def kernel_dependencies(reads: Sequence[Sequence[Interval]], writes: Sequence[Sequence[Interval]]) -> list[set[int]]:
    """For each kernel (in plan order), the earlier kernels it conflicts with."""
    preds: list[set[int]] = []
    starts = np.zeros(0, dtype=np.int64)
    ends = np.zeros(0, dtype=np.int64)
    owners = np.zeros(0, dtype=np.int64)
    written = np.zeros(0, dtype=bool)
    for k, (kernel_reads, kernel_writes) in enumerate(zip(reads, writes, strict=True)):
        found: set[int] = set()
        for (start, end), is_write in [*((i, False) for i in kernel_reads), *((i, True) for i in kernel_writes)]:
            overlap = (starts < end) & (start < ends)
            if not is_write:
                overlap &= written  # two reads never conflict
            found.update(int(o) for o in owners[overlap])
        preds.append(found)
        mine = [*kernel_reads, *kernel_writes]
        starts = np.concatenate([starts, np.array([s for s, _ in mine], dtype=np.int64)])
        ends = np.concatenate([ends, np.array([e for _, e in mine], dtype=np.int64)])
        owners = np.concatenate([owners, np.full(len(mine), k, dtype=np.int64)])
        kinds = [False] * len(kernel_reads) + [True] * len(kernel_writes)
        written = np.concatenate([written, np.array(kinds, dtype=bool)])
    return preds


def unit_dependencies(units: Sequence[Unit], kernel_preds: Sequence[set[int]]) -> list[set[int]]:
    """A unit waits for the last unit of every kernel its kernel conflicts with, and a phase for the phase
    before it (which already waited for the rest)."""
    last_unit: dict[int, int] = {}
    for u, unit in enumerate(units):
        last_unit[unit.kernel] = u
    preds: list[set[int]] = []
    for u, unit in enumerate(units):
        if u and units[u - 1].kernel == unit.kernel:
            preds.append({u - 1})
        else:
            preds.append({last_unit[k] for k in kernel_preds[unit.kernel] if k in last_unit})
    return preds
