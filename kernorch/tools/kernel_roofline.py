"""How far each generated memory-bound kernel of a plan is from its roofline, measured in place and hot.

For every memory-bound kernel the C backend generates (fused elementwise/reduce/layout/pooling code; library
calls, views, the LSTM scan and generated depthwise convolutions are left out): its median time inside real
inferences (`PlanExecutor.kernel_times`: its data where the kernels before it left it) and hot (the best of
the kernel repeated on its own: its data in the level its working set fits in, as the roofline assumes, and
timed like the bandwidths it is compared with; this host's timings vary 1.5x from minute to minute), the
bytes it must move (each input read once, each output written once: `kernel_bytes`), the achieved GB/s, and its
roofline time (those bytes at the measured bandwidth of the memory level its working set fits in, plus one
dispatch; `cost/bandwidth.py`). `ratio` = hot / roofline: 1.0 is as fast as this machine streams.

The bytes are not the only floor: a kernel computing exp, sigmoid, tanh or erf per element is bound by the
vector units first when its data sits in L2 or L3 (the polynomial of one exp costs more than moving its 8
bytes). `math_seconds` measures each function's cost per element as a generated kernel `y = f(x)` on all
threads with its data in L2 (the dispatch taken off, its own loads and stores kept: on this CPU they do not
hide behind the arithmetic); a kernel's *math floor* is one dispatch plus its evaluations (counted in its
rewritten GIR) at those costs, and `floor_ratio` = hot / max(roofline, math floor).

The roofline counts each byte once; the kernel as generated may move more (an instance norm larger than a
core's L2 reads its map once for the mean, once for the variance and once for the output; a transpose reads
whole lines to use half of each). `model_seconds` is the GIR performance model's time for the kernel as
generated (`cost/gir_model.py`: the bytes each of its phases moves at the level's bandwidth, or its
instructions, whichever is longer), so `hot / model` near 1 with a high `ratio` says the kernel's structure is
what costs (fewer passes would help, faster loops would not), and a high `hot / model` says its loops run
below what they move.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kernorch.codegen.gir import ELEMENTWISE, Gir
from kernorch.cost.analytic import kernel_bytes
from kernorch.cost.bandwidth import MemoryLevels
from kernorch.cost.gir_model import estimate, kernel_gir
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.primitives import PRIMITIVES, Kind
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.threads import thread_count
from kernorch.runtime.timing import time_call

MATH = ("exp", "sigmoid", "tanh", "erf")  # the float32 helpers of the prelude: polynomials, not libm calls


@dataclass(frozen=True)
class KernelRoofline:
    kernel: int  # position in the plan
    primitives: str  # e.g. "transpose+add+erf"
    seconds: float  # measured median in place
    bytes_moved: float
    level: str  # where its working set fits
    roofline_seconds: float
    math_seconds: float = 0.0  # a dispatch and its exp/sigmoid/tanh/erf evaluations at their measured cost
    hot_seconds: float = 0.0  # best of its runs repeated on its own, like the bandwidths (0: not measured)
    model_seconds: float = 0.0  # the GIR performance model's time of the kernel as generated (0: not computed)

    @property
    def measured(self) -> float:
        """Hot when measured: the roofline's assumption about where the data is."""
        return self.hot_seconds or self.seconds

    @property
    def ratio(self) -> float:
        return self.measured / self.roofline_seconds

    @property
    def floor_ratio(self) -> float:
        return self.measured / max(self.roofline_seconds, self.math_seconds)

    @property
    def in_plan_ratio(self) -> float:
        return self.seconds / max(self.roofline_seconds, self.math_seconds)

    @property
    def model_ratio(self) -> float:
        return self.measured / self.model_seconds if self.model_seconds else 0.0

    @property
    def gbs(self) -> float:
        return self.bytes_moved / self.measured / 1e9


def math_seconds(threads: int, elements: int = 1 << 16) -> dict[str, float]:
    """Seconds per element of each MATH function as a generated kernel `y = f(x)` on `threads` threads, its
    input and output in L2 (best of 30 calls, the dispatch of a 16-element kernel taken off)."""
    graph = Graph(inputs=[f"x{i}" for i in range(len(MATH) + 1)], outputs=[f"y{i}" for i in range(len(MATH) + 1)])
    for i, prim in enumerate(("relu", *MATH)):  # relu on 16 elements: the dispatch, to take off
        graph.types[f"x{i}"] = graph.types[f"y{i}"] = TensorType((16 if i == 0 else elements,), "float32")
        graph.nodes.append(Node(prim, (f"x{i}",), (f"y{i}",)))
    kernels = [make_kernel(graph, (i,), (f"y{i}",)) for i in range(len(graph.nodes))]
    executor = PlanExecutor(graph, kernels, threads, share_memory=False)
    best = []
    with thread_count(threads):
        for i in range(len(kernels)):
            x = executor.buffers[f"x{i}"]
            x[...] = np.linspace(-4, 4, x.size, dtype=np.float32)
            best.append(time_call(executor.kernel_launcher(i), runs=30, warmup=3).best)
    return {prim: max(took - best[0], took / 2) / elements for prim, took in zip(MATH, best[1:], strict=True)}


def math_floor(gir: Gir, costs: Mapping[str, float]) -> float:
    """Seconds of the kernel's MATH evaluations (instruction blocks x lanes of each such gOperator)."""
    return sum(op.executions * gir.slices[op.writes[0]].width * costs[op.name] for phase in gir.phases
               for op in phase.ops if op.kind == ELEMENTWISE and op.name in costs)  # fmt: skip


def memory_kernels(executor: PlanExecutor, feeds: Mapping[str, np.ndarray], levels: MemoryLevels,
                   repeats: int = 20, math: Mapping[str, float] | None = None) -> list[KernelRoofline]:  # fmt: skip
    """Every generated memory-bound kernel of the plan, slowest first (with `math`, seconds per element of
    the MATH functions, each with its math floor)."""
    times = executor.kernel_times(feeds, repeats)
    rows = []
    for k, (kernel, backend, seconds) in enumerate(zip(executor.kernels, executor.backends, times, strict=True)):
        if not backend.has_gir or any(PRIMITIVES[n.prim].kind in (Kind.LINEAR, Kind.OPAQUE) for n in kernel.primitives):
            continue  # library calls, and C that is not memory-bound (the LSTM scan, depthwise convolutions)
        moved = kernel_bytes(kernel)
        gir = kernel_gir(kernel, executor.threads) if math else None
        evaluations = 0.0 if gir is None or math is None else math_floor(gir, math)
        floor = levels.dispatch + evaluations if evaluations else 0.0
        model = 0.0 if gir is None else estimate(gir, levels, executor.threads)
        # hot: after the inferences (every buffer holds a value), the best run, as the bandwidths are timed
        with thread_count(executor.threads):
            hot = time_call(executor.kernel_launcher(k), runs=max(repeats, 3), warmup=2).best
        rows.append(KernelRoofline(k, "+".join(dict.fromkeys(n.prim for n in kernel.primitives)), seconds, moved,
                                   levels.level_for(moved).name, levels.roofline_seconds(moved), floor, hot,
                                   model))  # fmt: skip
    return sorted(rows, key=lambda r: -r.measured)


def table(rows: list[KernelRoofline], top: int = 20) -> list[str]:
    """Markdown rows of the `top` slowest kernels (hot)."""
    lines = ["| # | kernel | primitives | µs hot | µs in place | MB moved | level | GB/s hot | roofline µs | ratio "
             "| math floor µs | hot / higher floor | in place / higher floor | model µs | hot / model |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for i, r in enumerate(rows[:top], 1):
        prims = r.primitives if len(r.primitives) <= 60 else r.primitives[:57] + "..."
        lines.append(f"| {i} | {r.kernel} | {prims} | {r.measured * 1e6:.1f} | {r.seconds * 1e6:.1f} "
                     f"| {r.bytes_moved / 1e6:.2f} | {r.level} | {r.gbs:.1f} | {r.roofline_seconds * 1e6:.1f} "
                     f"| {r.ratio:.2f} | {r.math_seconds * 1e6:.1f} | {r.floor_ratio:.2f} | {r.in_plan_ratio:.2f} "
                     f"| {r.model_seconds * 1e6:.1f} | {r.model_ratio:.2f} |")
    return lines


def summary(rows: list[KernelRoofline], over_seconds: float = 20e-6, within: float = 1.5) -> str:
    slow = [r for r in rows if r.measured > over_seconds]
    far = [r for r in slow if r.ratio > within]
    beyond_floor = [r for r in slow if r.floor_ratio > within]
    slow_in_plan = [r for r in rows if r.seconds > over_seconds]
    beyond_in_plan = [r for r in slow_in_plan if r.in_plan_ratio > within]
    total = sum(r.seconds for r in rows)
    hot = sum(r.measured for r in rows)
    roof = sum(r.roofline_seconds for r in rows)
    return (f"{len(rows)} generated kernels, {hot * 1e3:.3f} ms hot, {total * 1e3:.3f} ms in place (roofline "
            f"{roof * 1e3:.3f} ms); hot: {len(slow)} take more than {over_seconds * 1e6:.0f} µs, {len(far)} of them "
            f"beyond {within}x roofline, {len(beyond_floor)} beyond {within}x the higher of roofline and math floor; "
            f"in place: {len(slow_in_plan)} take more than {over_seconds * 1e6:.0f} µs, {len(beyond_in_plan)} "
            f"beyond {within}x the higher floor")
