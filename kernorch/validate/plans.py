"""Whole-plan validation: the orchestrator's cheapest plans compiled and timed end to end, the fastest kept.

The BLP minimises the sum of kernel costs measured one kernel at a time. In the program a kernel finds its
inputs in cache or not and runs after a different neighbour, so the sum is off by up to 1.3-2x per kernel and
the optimum by that sum is not always the fastest plan (shufflenet's unfused plan once ran faster). So the k
cheapest distinct plans by that sum (`orchestrate(..., alternatives=k - 1)`) are compiled and run on the same
seeded inputs, interleaved round by round in this process (each round in a rotated order, so no plan always
runs first after another's caches), and the plan with the lowest median is kept: the optimum unless another
is faster by more than MARGIN. Every alternative's outputs are compared with the optimum's first; one that
differs is never kept. GPU plans are not validated (they are timed where their GPU is).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernorch.ir.plan import Plan
from kernorch.orchestrate import OrchestrationResult
from kernorch.runtime.compiled import CompiledModel
from kernorch.runtime.feeds import graph_feeds
from kernorch.runtime.timing import time_call

MARGIN = 0.02  # another plan is kept only if its median is this much below the optimum's (run-to-run noise)
ROUNDS = 15  # interleaved rounds; each plan's median is over all its runs
ROUND_SECONDS = 0.1  # each plan's share of a round, in runs of its first measured latency (3 to 20 runs)


@dataclass(frozen=True)
class PlanTiming:
    rank: int  # 0: the BLP optimum; then the alternatives in `OrchestrationResult.alternatives` order
    source: str  # "optimum", "next best 1", ..., "in place 1" (kernorch/validate/in_plan.py), ...
    predicted_ms: float  # the plan's cost (sum of its kernels' costs)
    measured_ms: float | None  # median end to end; None when its outputs differed from the optimum's
    kernels: int
    differing_kernels: int  # kernels in it or the optimum, not both

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class ValidationReport:
    plans: tuple[PlanTiming, ...]
    chosen: int  # rank of the plan kept
    seconds: float  # compiling and timing the plans
    rounds: int

    def to_json(self) -> dict[str, Any]:
        return {"plans": [p.to_json() for p in self.plans], "chosen": self.chosen,
                "seconds": round(self.seconds, 2), "rounds": self.rounds}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ValidationReport:
        return cls(tuple(PlanTiming(**p) for p in data["plans"]), int(data["chosen"]), float(data["seconds"]),
                   int(data["rounds"]))  # fmt: skip

    def summary(self) -> str:
        def described(p: PlanTiming) -> str:
            measured = "outputs differ" if p.measured_ms is None else f"{p.measured_ms:.3f} ms measured"
            return (f"#{p.rank} ({p.source}) {p.predicted_ms:.3f} ms predicted, {measured} ({p.differing_kernels} "
                    "kernels differ)")  # fmt: skip

        kept = "the BLP optimum" if self.chosen == 0 else f"#{self.chosen} ({self.plans[self.chosen].source})"
        return (f"validation: {len(self.plans)} plans timed end to end ({self.rounds} interleaved rounds, "
                f"{self.seconds:.1f} s): kept {kept}; " + "; ".join(described(p) for p in self.plans))  # fmt: skip


def validate_plans(result: OrchestrationResult, threads: int, cache_dir: Any = None,
                   runtime: str = "kernels") -> OrchestrationResult:  # fmt: skip
    """Time `result.plan` and `result.alternatives` end to end, keep the fastest in `result.plan` (see the module
    docstring) and record what was measured in `result.validation`. Without alternatives nothing is timed."""
    if not result.alternatives:
        return result
    started = time.perf_counter()
    plans = [result.plan, *result.alternatives]
    measured = measure_plans(plans, threads, cache_dir, runtime)
    medians = {i: seconds for i, seconds in enumerate(measured) if seconds is not None}
    fastest = min(medians, key=medians.__getitem__)
    chosen = fastest if medians[fastest] < medians[0] * (1 - MARGIN) else 0
    sources = ["optimum", *result.alternative_sources]
    report = ValidationReport(
        tuple(PlanTiming(i, sources[i], p.cost * 1e3, medians[i] * 1e3 if i in medians else None, len(p.kernels),
                         plan_differences(result.plan, p)) for i, p in enumerate(plans)),
        chosen, time.perf_counter() - started, ROUNDS)  # fmt: skip
    result.plan = plans[chosen]
    result.validation = report
    return result


def measure_plans(plans: list[Plan], threads: int, cache_dir: Any = None,
                  runtime: str = "kernels") -> list[float | None]:  # fmt: skip
    """Each plan's median seconds end to end (plans of one model: the same graph inputs and outputs), compiled and
    timed interleaved in this process as the module docstring says; None for a plan whose outputs differ from the
    first's (it is not timed)."""
    feeds = graph_feeds(plans[0].graph)
    models = [CompiledModel(p.graph, p.kernels, p.costs, threads, cache_dir=cache_dir, runtime=runtime) for p in plans]
    expected = models[0].run(feeds)
    bf16 = any(node.attr("precision") == "bf16" for p in plans for node in p.graph.nodes)
    agrees = [True] + [_same_outputs(expected, model.run(feeds), bf16) for model in models[1:]]
    timed = [i for i, ok in enumerate(agrees) if ok]
    first = time_call(lambda: models[0].run(feeds), runs=3).median
    runs = int(min(20, max(3, ROUND_SECONDS / max(first, 1e-6))))
    samples: dict[int, list[float]] = {i: [] for i in timed}
    for round_index in range(ROUNDS):
        shift = round_index % len(timed)
        for i in timed[shift:] + timed[:shift]:
            model = models[i]
            samples[i].extend(time_call(lambda model=model: model.run(feeds), runs=runs).samples)  # type: ignore[misc]
    return [float(np.median(samples[i])) if i in samples else None for i in range(len(plans))]


# Two bf16 plans round different values to bfloat16 (where each places its casts, a fused kernel multiplying in
# float32): each is within tools/check.BF16_RTOL (2e-2 of the output's magnitude) of float32, so they may be apart
# by twice that. A wrong plan is off by the output's magnitude itself.
BF16_AGREEMENT = 4e-2


def _same_outputs(expected: dict[str, np.ndarray], got: dict[str, np.ndarray], bf16: bool = False) -> bool:
    """Whether two plans of one graph computed the same outputs (float sums may associate differently; bf16
    plans may round different values)."""
    for name, want in expected.items():
        have = got[name]
        if have.shape != want.shape or have.dtype != want.dtype:
            return False
        if np.issubdtype(want.dtype, np.floating):
            scale = float(np.max(np.abs(want[np.isfinite(want)]), initial=1.0))
            rtol, atol = (0.0, BF16_AGREEMENT * scale) if bf16 else (1e-3, 1e-4 * scale)
            if not np.allclose(have, want, rtol=rtol, atol=atol, equal_nan=True):
                return False
        elif not np.array_equal(have, want):
            return False
    return True


def plan_differences(plan: Plan, other: Plan) -> int:
    """Kernels in one plan and not the other."""
    return len(plan.kernel_keys ^ other.kernel_keys)
