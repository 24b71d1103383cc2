"""Measured memory bandwidth per level of this CPU, and the roofline time of a memory-bound kernel.

A memory-bound kernel's data lives where its working set fits: a kernel reading and writing 3 MB in a real
inference finds its inputs in L3 (the kernels before it just wrote them), one streaming 60 MB goes to DRAM.
So the roofline of a kernel is its bytes at the bandwidth *of the level its working set fits in*, plus the
dispatch cost of one kernel. Bandwidths are measured, not taken from a datasheet: a generated streaming
kernel (`y = relu(x)`, the simplest C kernorch emits, vectorized and split over the threads) on working sets
sized for each level, best of several runs, cached per machine fingerprint and thread count.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from kernorch.machine import fingerprint
from kernorch.options import DEFAULT_THREADS, cache_root
from kernorch.runtime.threads import thread_count
from kernorch.runtime.timing import time_call

VERSION = 3  # 2: several working sets per level, dispatch taken off; 3: L3 holds what its bandwidth was measured on
_MEASURED: dict[tuple[str, int], MemoryLevels] = {}  # per process: a few seconds of compiling and timing, once


@dataclass(frozen=True)
class MemoryLevel:
    name: str  # "L2", "L3", "DRAM"
    capacity: int  # bytes of working set that still fit (all threads together); DRAM: unbounded
    bandwidth: float  # bytes / s, read + written, all threads


@dataclass(frozen=True)
class MemoryLevels:
    levels: tuple[MemoryLevel, ...]  # fastest first
    dispatch: float  # seconds of one kernel call that does nothing

    def level_for(self, working_set: float) -> MemoryLevel:
        """The fastest level the working set (bytes read + written) fits in."""
        return next((lv for lv in self.levels if working_set <= lv.capacity), self.levels[-1])

    def roofline_seconds(self, bytes_moved: float) -> float:
        """Bytes moved at the bandwidth of the level they fit in, plus one dispatch."""
        return bytes_moved / self.level_for(bytes_moved).bandwidth + self.dispatch


def _cache_bytes(index: int, default: int) -> int:
    """Size of cache level `index` of cpu0 from sysfs (per core for L2, shared for L3)."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for entry in sorted(base.glob("index*")):
            if int((entry / "level").read_text()) == index and (entry / "type").read_text().strip() != "Instruction":
                text = (entry / "size").read_text().strip().upper()
                scale = {"K": 1024, "M": 1024**2}.get(text[-1], 1)
                return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return default


def measure_levels(cache_dir: Path | None = None, threads: int = DEFAULT_THREADS) -> MemoryLevels:
    """Bandwidth of L2, L3 and DRAM as a generated kernel sees it, cached (takes a few seconds)."""
    path = cache_root(cache_dir) / "memory_levels.json"
    machine = fingerprint()
    try:
        cached = json.loads(path.read_text())
        if cached["fingerprint"] == machine and cached["threads"] == threads and cached["version"] == VERSION:
            return MemoryLevels(tuple(MemoryLevel(**lv) for lv in cached["levels"]), float(cached["dispatch"]))
    except (OSError, ValueError, TypeError, KeyError):
        pass  # missing or corrupt: measure again (or take what this process measured already)
    if (machine, threads) not in _MEASURED:  # another cache directory on the same machine: the same bandwidths
        _MEASURED[(machine, threads)] = _measure(cache_dir, threads)
    result = _MEASURED[(machine, threads)]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"fingerprint": machine, "threads": threads, "version": VERSION,
                                    "levels": [asdict(lv) for lv in result.levels],
                                    "dispatch": result.dispatch}))  # fmt: skip
    except OSError:
        pass  # a cache: measure again next time
    return result


def _measure(cache_dir: Path | None, threads: int) -> MemoryLevels:
    from kernorch.ir.graph import Graph, Node
    from kernorch.ir.kernel import make_kernel
    from kernorch.ir.types import TensorType
    from kernorch.runtime.executor import PlanExecutor

    cores = min(threads, os.cpu_count() or 1)
    l2, l3 = _cache_bytes(2, 1 << 20) * cores, _cache_bytes(3, 32 << 20)
    # each level: the best the kernel reaches on working sets (input + output) that fit it (small ones are
    # dominated by the call, so several sizes); one plan of streaming kernels, compiled once
    sets = {"dispatch": [128], "L2": [l2 // f for f in (1, 2, 4)], "L3": [l3 // f for f in (2, 4, 8)],
            "DRAM": [max(4 * l3, 128 << 20)]}  # fmt: skip
    sizes = [max(ws // 8, 16) for level in sets.values() for ws in level]
    graph = Graph(inputs=[f"x{i}" for i in range(len(sizes))], outputs=[f"y{i}" for i in range(len(sizes))])
    for i, n in enumerate(sizes):
        graph.types[f"x{i}"] = graph.types[f"y{i}"] = TensorType((n,), "float32")
        graph.nodes.append(Node("relu", (f"x{i}",), (f"y{i}",)))
    executor = PlanExecutor(graph, [make_kernel(graph, (i,), (f"y{i}",)) for i in range(len(sizes))], threads,
                            cache_dir, share_memory=False)  # fmt: skip
    labels = [level for level, working_sets in sets.items() for _ in working_sets]
    seconds = []
    with thread_count(threads):
        for i in range(len(sizes)):
            launch = executor.kernel_launcher(i)
            executor.buffers[f"x{i}"][...] = 1.0
            runs = 1000 if i == 0 else 5 if sizes[i] * 8 > l3 else 30
            timing = time_call(launch, runs=runs, warmup=3)
            seconds.append(timing.median if i == 0 else timing.best)
    dispatch = seconds[0]
    rate: dict[str, float] = {}  # per level: the best bytes / s of its working sets, the dispatch taken off
    for label, floats, took in zip(labels[1:], sizes[1:], seconds[1:], strict=True):
        rate[label] = max(rate.get(label, 0.0), 8 * floats / max(took - dispatch, took / 2))
    dram, cached, private = rate["DRAM"], rate["L3"], rate["L2"]
    # L3 holds working sets up to the largest its bandwidth was measured on (half of it): streaming 24-32 MB
    # ran at half the bandwidth of 4-16 MB here (the L3 is shared with code, tables and other tenants)
    levels = [MemoryLevel("L2", l2, max(private, cached, dram)), MemoryLevel("L3", max(sets["L3"]), max(cached, dram)),
              MemoryLevel("DRAM", 1 << 62, dram)]  # a level is never priced slower than the one below it
    return MemoryLevels(tuple(levels), max(dispatch, 1e-7))
