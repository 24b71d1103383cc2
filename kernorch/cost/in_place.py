"""Costs that hold in place: a profiled cost model corrected by what the plan's kernels took inside the program.

A candidate is profiled alone: run again and again on the same buffers, so its inputs and weights are hot in
cache. Inside a whole inference the kernels before it have evicted its weights and left its inputs wherever
they were written; efficientnet_b0's plan sums to 5.4 ms of isolated costs and runs in 8.9. `InPlaceCost`
prices a kernel by its in-place time (`PlanExecutor.kernel_times`: whole inferences, each kernel timed where
it runs) wherever a compiled plan measured one with the same profile signature, and by its isolated profile
otherwise. Kernels of one signature (a transformer's layers) share the median of their in-place times, so twin
subgraphs stay one BLP instance.
"""

from __future__ import annotations

import statistics
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernorch.codegen.gir import remembering
from kernorch.ir.kernel import CandidateKernel


class SignedCostModel(Protocol):
    """A cost model whose kernels have profile signatures (`ProfiledCostModel`)."""

    @property
    def name(self) -> str: ...

    def cost(self, candidate: CandidateKernel) -> float: ...

    def signature_of(self, candidate: CandidateKernel) -> str | None: ...


@dataclass
class InPlaceCost:
    base: SignedCostModel
    samples: dict[str, list[float]] = field(default_factory=dict)  # signature -> seconds measured in place

    @property
    def name(self) -> str:
        return f"{self.base.name}, in place where measured"

    def record(self, kernels: list[CandidateKernel], seconds: list[float]) -> None:
        """Add one compiled plan's in-place kernel times (views excluded: they run no code)."""
        for kernel, taken in zip(kernels, seconds, strict=True):
            signature = self.base.signature_of(kernel)
            if signature is not None and self.base.cost(kernel) > 0:
                self.samples.setdefault(signature, []).append(taken)

    def measured(self, candidate: CandidateKernel) -> float | None:
        signature = self.base.signature_of(candidate)
        taken = self.samples.get(signature) if signature is not None else None
        return statistics.median(taken) if taken else None

    def cost(self, candidate: CandidateKernel) -> float:
        taken = self.measured(candidate)
        return taken if taken is not None else self.base.cost(candidate)

    def pricing(self) -> AbstractContextManager[None]:
        inner = getattr(self.base, "pricing", None)
        return inner() if inner is not None else remembering()

    def __getattr__(self, name: str) -> Any:  # prepare, screen, rejection, contended_in: the profile's own
        if name.startswith("__") or name in ("base", "samples"):
            raise AttributeError(name)
        return getattr(self.base, name)
