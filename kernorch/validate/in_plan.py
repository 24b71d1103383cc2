"""Planning on costs that hold in place (issue 43, item 1).

Round 0 compiles the plan the BLP chose on isolated profiles and times every kernel where it runs in a whole
inference (`PlanExecutor.kernel_times`). Those times replace the isolated profiles of the kernels measured
(`kernorch.cost.in_plan.InPlanCost`) and the graph is orchestrated again; a new plan is compiled and measured
in the next round, until the BLP returns a plan measured before or the rounds run out. Kernels never measured
in place keep their isolated (optimistic) costs, so the BLP tries them next: each round tests the cheapest
untested alternative the correction makes plausible. Every plan measured becomes an alternative for the
end-to-end validation (kernorch/validate), which keeps the fastest.

The report gives, per plan measured, its cost on isolated profiles, its cost on in-plan costs and its measured
end-to-end median: the prediction error before and after. A plan's kernels are measured one launch at a time,
so each carries a dispatch the program does not pay; the excess of their sum over the end-to-end time is
shared out before the times are recorded (`_without_dispatch`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernorch.cost.in_plan import InPlanCost
from kernorch.cost.interface import CostModel
from kernorch.ir.plan import Plan
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate import OrchestrationResult, orchestrate
from kernorch.runtime.compiled import CompiledModel
from kernorch.runtime.timing import time_call

KERNEL_REPEATS = 10  # whole inferences, each kernel timed in place (the median per kernel)


@dataclass(frozen=True)
class RoundTiming:
    round: int
    kernels: int
    isolated_ms: float  # the plan's cost on isolated profiles (what the BLP optimized before)
    in_plan_ms: float  # its cost on in-plan costs, after every round
    measured_ms: float  # end to end, median

    @property
    def error_before(self) -> float:
        return abs(self.isolated_ms - self.measured_ms) / self.measured_ms

    @property
    def error_after(self) -> float:
        return abs(self.in_plan_ms - self.measured_ms) / self.measured_ms

    def to_json(self) -> dict[str, Any]:
        return {**vars(self), "error_before": round(self.error_before, 4), "error_after": round(self.error_after, 4)}


@dataclass(frozen=True)
class InPlanReport:
    rounds: tuple[RoundTiming, ...]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"rounds": [r.to_json() for r in self.rounds], "seconds": round(self.seconds, 2)}

    def summary(self) -> str:
        rows = "; ".join(f"round {r.round}: {r.kernels} kernels, predicted {r.isolated_ms:.3f} ms isolated / "
                         f"{r.in_plan_ms:.3f} ms in place, measured {r.measured_ms:.3f} ms (error "
                         f"{r.error_before:.0%} → {r.error_after:.0%})" for r in self.rounds)  # fmt: skip
        return f"costs in place: {len(self.rounds)} plan(s) measured in {self.seconds:.1f} s; {rows}"


def refine_in_plan(result: OrchestrationResult, cost_model: CostModel, limits: OrchestrationLimits,
                    rounds: int, feeds: Mapping[str, np.ndarray], threads: int, cache_dir: Any = None,
                    runtime: str = "kernels") -> OrchestrationResult:  # fmt: skip
    """Measure `result.plan` in place, re-plan on the corrected costs up to `rounds` times (see the module
    docstring); every other plan measured is appended to `result.alternatives`, the report to `result.in_plan`."""
    started = time.perf_counter()
    graph = result.plan.graph
    corrected = InPlanCost(cost_model)
    measured: list[tuple[Plan, float]] = []  # each plan measured, with its end-to-end median
    plan = result.plan
    for round_index in range(rounds + 1):
        model = CompiledModel(graph, plan.kernels, plan.costs, threads, cache_dir=cache_dir, runtime=runtime)
        times = model.executor.kernel_times(feeds, KERNEL_REPEATS)
        end_to_end = time_call(lambda model=model: model.run(feeds), runs=20).median  # type: ignore[misc]
        corrected.record(plan.kernels, _without_dispatch(times, end_to_end))
        measured.append((plan, end_to_end))
        if round_index == rounds:
            break
        replanned = orchestrate(graph, corrected, limits).plan
        if any(p.kernel_keys == replanned.kernel_keys for p, _ in measured):
            break  # the corrected costs choose a plan measured already: nothing new to test
        plan = replanned
    report = InPlanReport(tuple(
        RoundTiming(i, len(p.kernels), sum(cost_model.cost(k) for k in p.kernels) * 1e3,
                    sum(corrected.cost(k) for k in p.kernels) * 1e3, seconds * 1e3)
        for i, (p, seconds) in enumerate(measured)), time.perf_counter() - started)  # fmt: skip
    result.alternatives = [*result.alternatives, *(p for p, _ in measured[1:])]
    result.alternative_sources = [*result.alternative_sources, *(f"in place {i}" for i in range(1, len(measured)))]
    result.in_plan = report
    return result


def _without_dispatch(times: list[float], end_to_end: float) -> list[float]:
    """Kernel times measured one launch at a time carry a dispatch the whole program does not pay (a foreign call
    and a clock read per kernel: efficientnet_b0's 211 kernels summed to 11.6 ms in a 9.6 ms inference). The
    excess over the end-to-end time is shared out per kernel that ran code, each keeping at least half its time."""
    running = [t for t in times if t > 0]
    excess = (sum(times) - end_to_end) / len(running) if running else 0.0
    if excess <= 0:
        return times
    return [max(t - excess, t / 2) if t > 0 else t for t in times]
