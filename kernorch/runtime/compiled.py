"""CompiledModel: a plan with its executor, callable on numpy arrays or torch tensors."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel
from kernorch.machine import check_bf16_supported
from kernorch.runtime.artifact import read_plan, save_plan
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.feeds import ArrayModel
from kernorch.runtime.origin import PlanOrigin


@dataclass
class CompiledModel(ArrayModel):
    graph: Graph
    kernels: list[CandidateKernel]
    costs: list[float]
    threads: int = 2
    metadata: dict[str, Any] = field(default_factory=dict)
    cache_dir: Path | None = None  # compile cache; None: kernorch.options.cache_root()
    runtime: str = "kernels"  # "kernels" or "rprogram" (kernorch.options.Options.runtime)
    max_workspaces: int | None = None  # concurrent calls' workspaces at most (kernorch.options.Options)

    def __post_init__(self) -> None:
        if any(node.attr("precision") == "bf16" for node in self.graph.nodes):  # a bf16 plan, made or loaded here
            check_bf16_supported()
        self.executor = PlanExecutor(self.graph, self.kernels, self.threads, self.cache_dir, runtime=self.runtime,
                                     max_workspaces=self.max_workspaces)  # fmt: skip

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.executor(feeds)

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the plan as data (plan.json, weights.npz) plus its C source and library; see `kernorch.load`."""
        return save_plan(self, Path(directory))


def load_model(directory: str | os.PathLike[str], threads: int | None = None, cache_dir: Path | None = None,
               runtime: str = "kernels", interpret: bool = False,
               expected: PlanOrigin | None = None, max_workspaces: int | None = None) -> Any:  # fmt: skip
    """Load a saved plan without re-tuning (runtime/artifact.py refuses anything corrupted, tampered with or
    inconsistent); the library is built here from the verified source (cached by source, flags, compiler, ISA).
    A GPU plan loads as a GpuModel (runtime/gpu_plan.py): it runs on a CUDA device, or with `interpret` in Triton's
    interpreter; without either, its first call is refused in one line. `expected`: what the plan must have been
    made for (runtime/origin.py), else refused."""
    saved = read_plan(directory, threads, expected)
    if saved.device != "cpu":
        from kernorch.runtime.gpu_plan import GpuModel

        return GpuModel(saved.graph, saved.kernels, saved.costs, saved.device, saved.metadata, cache_dir, saved.tf32,
                        interpret, saved.threads)  # fmt: skip
    return CompiledModel(saved.graph, saved.kernels, saved.costs, saved.threads, saved.metadata, cache_dir, runtime,
                         max_workspaces)  # fmt: skip
