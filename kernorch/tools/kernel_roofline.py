"""How far each generated memory-bound kernel of a plan is from its roofline, measured in place.

For every memory-bound kernel the C backend generates (fused elementwise/reduce/layout/pooling code; library
calls, views, the LSTM scan and generated depthwise convolutions are left out): its median time inside real
inferences (`PlanExecutor.kernel_times`), the bytes it must move (each input read once, each output written
once: `kernel_bytes`), the achieved GB/s, and its roofline time (those bytes at the measured bandwidth of the
memory level its working set fits in, plus one dispatch; `cost/bandwidth.py`). `ratio` = measured / roofline:
1.0 is as fast as this machine streams.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kernorch.cost.analytic import kernel_bytes
from kernorch.cost.bandwidth import MemoryLevels
from kernorch.ir.primitives import PRIMITIVES, Kind
from kernorch.runtime.executor import PlanExecutor


@dataclass(frozen=True)
class KernelRoofline:
    kernel: int  # position in the plan
    primitives: str  # e.g. "transpose+add+erf"
    seconds: float  # measured median in place
    bytes_moved: float
    level: str  # where its working set fits
    roofline_seconds: float

    @property
    def ratio(self) -> float:
        return self.seconds / self.roofline_seconds

    @property
    def gbs(self) -> float:
        return self.bytes_moved / self.seconds / 1e9


def memory_kernels(executor: PlanExecutor, feeds: Mapping[str, np.ndarray], levels: MemoryLevels,
                   repeats: int = 20) -> list[KernelRoofline]:  # fmt: skip
    """Every generated memory-bound kernel of the plan, slowest first."""
    times = executor.kernel_times(feeds, repeats)
    rows = []
    for k, (kernel, backend, seconds) in enumerate(zip(executor.kernels, executor.backends, times, strict=True)):
        if backend != "c" or any(PRIMITIVES[n.prim].kind in (Kind.LINEAR, Kind.OPAQUE) for n in kernel.primitives):
            continue  # library calls, and C that is not memory-bound (the LSTM scan, depthwise convolutions)
        moved = kernel_bytes(kernel)
        rows.append(KernelRoofline(k, "+".join(dict.fromkeys(n.prim for n in kernel.primitives)), seconds, moved,
                                   levels.level_for(moved).name, levels.roofline_seconds(moved)))  # fmt: skip
    return sorted(rows, key=lambda r: -r.seconds)


def table(rows: list[KernelRoofline], top: int = 20) -> list[str]:
    """Markdown rows of the `top` slowest kernels."""
    lines = ["| # | kernel | primitives | µs | MB moved | level | GB/s | roofline µs | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for i, r in enumerate(rows[:top], 1):
        prims = r.primitives if len(r.primitives) <= 60 else r.primitives[:57] + "..."
        lines.append(f"| {i} | {r.kernel} | {prims} | {r.seconds * 1e6:.1f} | {r.bytes_moved / 1e6:.2f} | {r.level} "
                     f"| {r.gbs:.1f} | {r.roofline_seconds * 1e6:.1f} | {r.ratio:.2f} |")  # fmt: skip
    return lines


def summary(rows: list[KernelRoofline], over_seconds: float = 20e-6, within: float = 1.5) -> str:
    slow = [r for r in rows if r.seconds > over_seconds]
    far = [r for r in slow if r.ratio > within]
    total = sum(r.seconds for r in rows)
    roof = sum(r.roofline_seconds for r in rows)
    return (f"{len(rows)} generated kernels, {total * 1e3:.3f} ms in place (roofline {roof * 1e3:.3f} ms); "
            f"{len(slow)} take more than {over_seconds * 1e6:.0f} µs, {len(far)} of them beyond {within}x roofline")
