"""Performance model over GIR (PowerFusion §6): a kernel's time from the bytes each memory level moves at its
measured bandwidth, the instruction blocks it computes, and the dispatch of its parallel loops.

Per phase: memory = global bytes at the bandwidth of the level the kernel's buffers fit in (L2, L3 or DRAM:
`bandwidth.py`) + cache-level bytes at the L2 bandwidth; compute = Σ blocks × cycles per block / (clock ×
threads), with vector blocks costing about what scalar ones do (so a scalar gather phase is 16x the work of a
vectorized one). Memory and compute overlap: the phase takes the larger, as in a roofline; a serial phase gets
one core's share of the bandwidth. It is used to rank a kernel's alternatives and to leave out of profiling
candidates it predicts far slower than running their parts separately (`GirScreen`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from kernorch.codegen.backends import choose_backend
from kernorch.codegen.gir import CACHE, ELEMENTWISE, GLOBAL, MOVE, REDUCE, Gir, rewritten
from kernorch.codegen.loops import NotGeneratable
from kernorch.codegen.target import CPU
from kernorch.codegen.views import view_outputs
from kernorch.cost.bandwidth import MemoryLevels
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.primitives import PRIMITIVES, Kind

CLOCK = 3.0e9  # cycles / s of one core (nominal: the ranking, not the absolute value, is what matters)
ONE_CORE_SHARE = 0.7  # fraction of the all-core bandwidth one core reaches on its own
# cycles per instruction block (vectorized helpers for transcendental functions are polynomials)
_CYCLES = {"div": 4, "sqrt": 4, "reciprocal": 4, "exp": 10, "log": 12, "log1p": 14, "tanh": 14, "sigmoid": 12,
           "erf": 14, "pow": 16, "sin": 14, "cos": 14, "softplus": 20, "mod": 8,
           "index": 5}  # an integer division or remainder by a constant in an address (multiply and shift)


def estimate(gir: Gir, levels: MemoryLevels, threads: int) -> float:
    """Predicted seconds of one call of the kernel."""
    working_set = sum(size for name, size in gir.buffer_bytes.items() if gir.roles.get(name) != "table")
    global_bw = levels.level_for(working_set).bandwidth
    cache_bw = levels.levels[0].bandwidth
    total = levels.dispatch
    for p, phase in enumerate(gir.phases):
        used = max(min(phase.parallel.threads, threads), 1)
        share = 1.0 if used >= threads else min(1.0, ONE_CORE_SHARE * used)  # a serial phase: one core's share
        memory = 0.0
        cycles = 0.0
        for op in phase.ops:
            if op.kind == MOVE:
                side = gir.slices[op.reads[0] if op.name == "load" else op.writes[0]]
                moved = op.executions * side.line_bytes
                if side.level in (GLOBAL, CACHE):
                    memory += moved / ((global_bw if side.level == GLOBAL else cache_bw) * share)
                if side.count > 1 and side.width == 1:  # a gather: one load instruction per element
                    cycles += op.executions * side.count
            elif op.kind in (ELEMENTWISE, REDUCE):
                cycles += op.executions * op.work * _CYCLES.get(op.name, 1)
        total += max(memory, cycles / (CLOCK * used)) + (levels.dispatch if p and used > 1 else 0.0)
    return total


def kernel_gir(candidate: CandidateKernel, threads: int) -> Gir | None:
    """The optimized GIR of a kernel the C backend generates, None for any other kernel."""
    backend, _ = choose_backend(candidate)
    if backend is None or not backend.has_gir:
        return None
    try:
        return rewritten(candidate, CPU.with_threads(threads))
    except NotGeneratable:
        return None


PRUNE_FACTOR = 2.0  # a fused candidate predicted this many times slower than its primitives one by one is left out


@dataclass
class GirScreen:
    """Leaves out of profiling a generated candidate of several primitives that the GIR model predicts more
    than PRUNE_FACTOR times slower than running each of its primitives as a kernel of its own. Such a fusion
    recomputes (a pooling or a resize inlining an expensive producer per tap) or loses vectorization, and the
    split alternative is always in the BLP, so the plan keeps its optimum unless the model misjudges by that
    factor. Call it with a candidate: the reason it is left out, or None."""

    levels_of_machine: Callable[[], MemoryLevels]  # measured on first use (plans without fusions never need it)
    threads: int
    factor: float = PRUNE_FACTOR
    _single: dict[int, float | None] = field(default_factory=dict)  # node -> alone, for the graph below
    _graph: Graph | None = None
    _levels: MemoryLevels | None = None

    @property
    def levels(self) -> MemoryLevels:
        if self._levels is None:
            self._levels = self.levels_of_machine()
        return self._levels

    def _seconds(self, kernel: CandidateKernel) -> float | None:
        """The estimate of a kernel the C backend would generate (one description, no backend dispatch), or
        None for anything else (library calls, opaque primitives, what codegen refuses)."""
        if any(PRIMITIVES[n.prim].kind in (Kind.LINEAR, Kind.OPAQUE) for n in kernel.primitives):
            return None
        try:
            gir = rewritten(kernel, CPU.with_threads(self.threads))
        except NotGeneratable:
            return None
        return estimate(gir, self.levels, self.threads)

    def _alone(self, candidate: CandidateKernel, node: int) -> float | None:
        if candidate.graph is not self._graph:  # node indices are per graph (rewrites build new ones)
            self._graph, self._single = candidate.graph, {}
        if node not in self._single:
            single = make_kernel(candidate.graph, (node,), tuple(candidate.graph.nodes[node].outputs))
            self._single[node] = 0.0 if view_outputs(single) is not None else self._seconds(single)
        return self._single[node]

    def __call__(self, candidate: CandidateKernel) -> str | None:
        kinds = {PRIMITIVES[n.prim].kind for n in candidate.primitives}
        if len(candidate.nodes) < 2 or kinds <= {Kind.ELEMENTWISE}:
            return None  # fusing elementwise primitives only removes traffic: never worth screening
        parts = [self._alone(candidate, node) for node in candidate.nodes]
        if any(p is None for p in parts):  # a part the model cannot price: no bound to compare with
            return None
        fused = self._seconds(candidate)
        if fused is None:
            return None
        apart = sum(p for p in parts if p is not None)
        if fused <= self.factor * apart:
            return None
        return (f"GIR model: {fused * 1e6:.1f} µs fused vs {apart * 1e6:.1f} µs for its {len(parts)} primitives "
                f"one by one (> {self.factor:g}x): not profiled")  # fmt: skip


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        result = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                result[order[k]] = (i + j) / 2
            i = j + 1
        return result

    if len(xs) < 2:
        return math.nan
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else math.nan
