"""The cost-model interface the orchestrator optimizes against."""

from __future__ import annotations

from typing import Protocol

from kernorch.orchestrate.kernel import CandidateKernel


class CostModel(Protocol):
    @property
    def name(self) -> str: ...

    def cost(self, candidate: CandidateKernel) -> float:
        """Seconds to run `candidate` once; `math.inf` if it cannot be generated."""
        ...
