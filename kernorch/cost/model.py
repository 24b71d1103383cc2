"""The wrapper that keeps kernels no backend can generate out of the BLP (the interface itself: cost/interface.py,
re-exported here)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kernorch.codegen.backends import choose_backend
from kernorch.codegen.gir import remembering
from kernorch.cost.interface import CostModel, CostModelBase
from kernorch.ir.kernel import CandidateKernel

__all__ = ["CostModel", "CostModelBase", "GeneratableCost", "rejection"]


@dataclass
class GeneratableCost(CostModelBase):
    """Wrap a cost model: kernels no backend can run cost infinity and never enter the BLP."""

    base: CostModel
    device: str = "cpu"  # the plan's device kind: whose backends may run a kernel ("cpu" or "gpu")

    @property
    def name(self) -> str:
        return self.base.name

    def cost(self, candidate: CandidateKernel) -> float:
        backend, _ = choose_backend(candidate, self.device)
        if backend is not None and not backend.runs_code:  # an alias: no code runs
            return 0.0
        return math.inf if backend is None else self.base.cost(candidate)

    def rejection(self, candidate: CandidateKernel) -> str | None:
        return rejection(candidate, self.device)

    @contextmanager
    def pricing(self) -> Iterator[None]:
        """A block pricing one subgraph's candidates: each candidate described (and rendered) once in it, inside
        the base's own block."""
        with remembering(), self.base.pricing():
            yield


def rejection(candidate: CandidateKernel, device: str = "cpu") -> str | None:
    """Why no backend can generate `candidate` (what `kernorch explain --rejected` prints), or None."""
    backend, reason = choose_backend(candidate, device)
    return reason if backend is None else None
