"""Costs that hold in place: a profiled cost model corrected by what the plan's kernels took inside the program.

A candidate is profiled alone: run again and again on the same buffers, so its inputs and weights are hot in
cache. Inside a whole inference the kernels before it have evicted its weights and left its inputs wherever
they were written; efficientnet_b0's plan sums to 5.4 ms of isolated costs and runs in 8.9. `InPlanCost`
prices a kernel by its in-plan time (`PlanExecutor.kernel_times`: whole inferences, each kernel timed where
it runs) wherever a compiled plan measured one with the same profile signature, and by its isolated profile
otherwise. Kernels of one signature (a transformer's layers) share the median of their in-plan times, so twin
subgraphs stay one BLP instance.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from kernorch.cost.interface import CostModel, CostModelBase, Screen
from kernorch.ir.kernel import CandidateKernel


@dataclass
class InPlanCost(CostModelBase):
    """A measuring cost model (`has_signatures`) whose costs are the in-plan times where a plan measured one;
    every other hook is its base's."""

    base: CostModel
    samples: dict[str, list[float]] = field(default_factory=dict)  # signature -> seconds measured in place

    @property
    def name(self) -> str:
        return f"{self.base.name}, in place where measured"

    def record(self, kernels: list[CandidateKernel], seconds: list[float]) -> None:
        """Add one compiled plan's in-plan kernel times (views excluded: they run no code)."""
        for kernel, taken in zip(kernels, seconds, strict=True):
            signature = self.base.signature_of(kernel)
            if signature is not None and self.base.cost(kernel) > 0:
                self.samples.setdefault(signature, []).append(taken)

    def measured_in_plan(self, candidate: CandidateKernel) -> float | None:
        signature = self.base.signature_of(candidate)
        taken = self.samples.get(signature) if signature is not None else None
        return statistics.median(taken) if taken else None

    def cost(self, candidate: CandidateKernel) -> float:
        taken = self.measured_in_plan(candidate)
        return taken if taken is not None else self.base.cost(candidate)

    def pricing(self) -> AbstractContextManager[None]:
        return self.base.pricing()

    def prepare(self, candidates: list[CandidateKernel]) -> None:
        self.base.prepare(candidates)

    def measuring_together(self) -> AbstractContextManager[None]:
        return self.base.measuring_together()

    @property
    def screen(self) -> Screen | None:  # type: ignore[override]
        return self.base.screen

    def rejection(self, candidate: CandidateKernel) -> str | None:
        return self.base.rejection(candidate)

    @property
    def measures(self) -> bool:  # type: ignore[override]
        return self.base.measures

    def contended_in(self, kernels: Iterable[CandidateKernel]) -> int:
        return self.base.contended_in(kernels)

    def tuning_counts(self) -> dict[str, int]:
        return self.base.tuning_counts()

    @property
    def has_signatures(self) -> bool:  # type: ignore[override]
        return self.base.has_signatures

    def signature_of(self, candidate: CandidateKernel) -> str | None:
        return self.base.signature_of(candidate)
