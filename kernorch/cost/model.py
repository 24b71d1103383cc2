"""The wrapper that keeps kernels no backend can generate out of the BLP (the interface itself: cost/interface.py,
re-exported here)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from kernorch.codegen.backends import choose_backend
from kernorch.codegen.gir import remembering
from kernorch.cost.interface import CostModel, CostModelBase
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.structure import Structure, Structures

__all__ = ["CostModel", "CostModelBase", "GeneratableCost", "rejection"]


@dataclass
class GeneratableCost(CostModelBase):
    """Wrap a cost model: kernels no backend can run cost infinity and never enter the BLP. The base must price
    a kernel by its structure alone (ir/structure.py; the roofline models do): each structure is priced once."""

    base: CostModel
    device: str = "cpu"  # the plan's device kind: whose backends may run a kernel ("cpu" or "gpu")
    _structures: Structures = field(default_factory=Structures, repr=False)
    _priced: dict[Structure, tuple[float, str | None]] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.base.name

    def cost(self, candidate: CandidateKernel) -> float:
        return self._price(candidate)[0]

    def rejection(self, candidate: CandidateKernel) -> str | None:
        return self._price(candidate)[1]

    def _price(self, candidate: CandidateKernel) -> tuple[float, str | None]:
        """(seconds, why no backend runs it), worked out once per structure."""
        structure = self._structures.of(candidate)
        priced = self._priced.get(structure)
        if priced is None:
            backend, reason = choose_backend(candidate, self.device)
            if backend is None:
                priced = (math.inf, reason)
            else:  # an alias runs no code
                priced = (self.base.cost(candidate) if backend.runs_code else 0.0, None)
            self._priced[structure] = priced
        return priced

    @contextmanager
    def pricing(self) -> Iterator[None]:
        """A block pricing a graph's candidates: each candidate described (and rendered) once in it, inside
        the base's own block."""
        with remembering(), self.base.pricing():
            yield


def rejection(candidate: CandidateKernel, device: str = "cpu") -> str | None:
    """Why no backend can generate `candidate` (what `kernorch explain --rejected` prints), or None."""
    backend, reason = choose_backend(candidate, device)
    return reason if backend is None else None
