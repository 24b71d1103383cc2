"""`--cost profile` on a GPU: each candidate kernel timed on the device with CUDA events, into the same profile
database as the CPU's measurements, keyed by the kernel's signature and the device's fingerprint (its name,
SM count and the CUDA and Triton versions), so a plan re-tuned on the same GPU reuses every measurement.

A candidate runs alone: on a graph of its own (profile.isolate) with random inputs, as a one-kernel GPU program
(runtime/gpu_plan.py) — its Triton launches or library call exactly as a plan runs them — warmed up, then timed as the
median of CUDA-event intervals. A candidate that fails to compile or run is priced at infinity with its reason
kept (`kernorch explain --rejected`), as on the CPU. Without a GPU this is refused before anything is planned.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernorch.codegen.backends import choose_backend
from kernorch.codegen.target import Target
from kernorch.cost.interface import CostModelBase
from kernorch.cost.profile import isolate
from kernorch.cost.profile_db import Measurement, ProfileDatabase
from kernorch.ir.kernel import CandidateKernel

RUNS = 20


def device_fingerprint() -> str:
    import torch
    import triton

    properties = torch.cuda.get_device_properties(0)
    return (f"{properties.name}|{properties.multi_processor_count} SMs|cuda {torch.version.cuda}|"
            f"triton {triton.__version__}")


@dataclass
class GpuProfiledCost(CostModelBase):
    target: Target
    tf32: bool
    cache_dir: Path | None
    name: str = "profile"
    rejected: dict[str, str] = field(default_factory=dict)
    measured: int = 0
    from_database: int = 0

    def __post_init__(self) -> None:
        self.database = ProfileDatabase.open(self.cache_dir)
        self.machine = device_fingerprint()

    def _key(self, candidate: CandidateKernel) -> str:
        backend, _ = choose_backend(candidate, "gpu")
        assert backend is not None
        text = f"{backend.signature_label}\ntf32={self.tf32}\n{backend.signature_text(candidate)}"
        return hashlib.sha256(text.encode()).hexdigest()

    def cost(self, candidate: CandidateKernel) -> float:
        """A kernel some GPU backend runs with code (GeneratableCost prices views and what nothing runs)."""
        key = self._key(candidate)
        if key in self.rejected:
            return math.inf
        known = self.database.lookup([key], self.machine)
        if key in known:
            self.from_database += 1
            return known[key].seconds
        try:
            seconds, spread = _time(isolate(candidate), self.target, self.tf32, self.cache_dir)
        except Exception as error:  # noqa: BLE001 - a candidate that fails is dropped with its reason
            self.rejected[key] = f"failed on the GPU: {str(error).splitlines()[0][:200] if str(error) else error!r}"
            return math.inf
        self.measured += 1
        self.database.store(key, self.machine, Measurement(seconds, RUNS, spread, False))
        return seconds

    def rejection(self, candidate: CandidateKernel) -> str | None:
        return self.rejected.get(self._key(candidate))


def _time(kernel: CandidateKernel, target: Target, tf32: bool, cache_dir: Path | None) -> tuple[float, float]:
    import torch

    from kernorch.runtime.gpu_plan import GpuProgram

    program = GpuProgram(kernel.graph, [kernel], target, tf32, cache_dir, streams=1)
    rng = np.random.default_rng(0)
    for name in kernel.graph.inputs:
        t = kernel.graph.types[name]
        data: Any = rng.standard_normal(t.shape) if t.dtype.startswith("float") else rng.integers(0, 2, t.shape)
        stored = np.asarray(data).astype(t.dtype if t.dtype != "bool" else "uint8")
        program.tensors[name].copy_(torch.from_numpy(stored))
    program.run_steps()  # compiles, warms the caches
    torch.cuda.synchronize()
    times = []
    for _ in range(RUNS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        program.run_steps()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    median = statistics.median(times)
    quartiles = np.percentile(times, [25, 75])
    return median, float((quartiles[1] - quartiles[0]) / median) if median else 0.0
