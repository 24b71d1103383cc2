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

VERSION = 2  # 2: several working sets per level, dispatch taken off


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
        pass  # missing or corrupt: measure again
    from kernorch.cost.analytic import _single_kernel  # the one-kernel plan builder calibration already uses

    cores = min(threads, os.cpu_count() or 1)
    l2, l3 = _cache_bytes(2, 1 << 20) * cores, _cache_bytes(3, 32 << 20)
    with thread_count(threads):
        dispatch = time_call(_single_kernel("relu", (16,), cache_dir=cache_dir, threads=threads), runs=1000).median

    def streamed(working_set: int, runs: int) -> float:
        """Bytes / s of the streaming kernel on this working set (input + output), its dispatch taken off."""
        floats = max(working_set // 8, 1024)
        launch = _single_kernel("relu", (floats,), cache_dir=cache_dir, threads=threads)
        with thread_count(threads):
            best = time_call(launch, runs=runs, warmup=3).best
        return 8 * floats / max(best - dispatch, best / 2)

    # each level: the best the kernel reaches on working sets that fit it (small ones are dominated by the call,
    # so several sizes); a level is never priced slower than the one below it
    dram = streamed(max(4 * l3, 128 << 20), 5)
    cached = max(streamed(l3 // f, 20) for f in (2, 4, 8))
    private = max(streamed(l2 // f, 50) for f in (1, 2, 4))
    levels = [MemoryLevel("L2", l2, max(private, cached, dram)), MemoryLevel("L3", l3, max(cached, dram)),
              MemoryLevel("DRAM", 1 << 62, dram)]  # fmt: skip
    result = MemoryLevels(tuple(levels), max(dispatch, 1e-7))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"fingerprint": machine, "threads": threads, "version": VERSION,
                                    "levels": [asdict(lv) for lv in levels], "dispatch": result.dispatch}))  # fmt: skip
    except OSError:
        pass  # a cache: measure again next time
    return result
