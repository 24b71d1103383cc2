"""Analytic cost of a GPU plan's kernels: the roofline of the GPU Target, per launch, with occupancy.

- A Triton kernel (fused memory-intensive, or the matmul template) is priced launch by launch from what its
  renderer chose: each launch pays the launch overhead (a CUDA graph node's share), and a launch with fewer
  programs than the GPU has SMs reaches only that share of the bandwidth (a row per program on 12 rows uses 12
  SMs). Its memory time is the GIR's, lowered for the GPU Target: cache lines moved at the bandwidth of the
  level its buffers fit in (L2 or global), at least its distinct bytes (plus scratch written and read back) at
  global memory's; flops are its primitives', at the float32 peak (or TF32 for the template when allowed).
- A library call (cuBLAS, cuDNN through torch) is the roofline of its one primitive at 80 % of the peak (the
  template is priced at 60 %: library kernels are tuned per shape, the template is not), plus a copy of the
  output for a channels-last convolution (torch gives a new tensor).
- A kernel run on the host (the reference, onnxruntime) pays the copies over PCIe both ways and the host's time,
  so a plan takes it only where nothing else runs the kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kernorch.codegen.backends import GpuBackend, choose_backend
from kernorch.codegen.gir import rewritten
from kernorch.codegen.loops import NotGeneratable
from kernorch.codegen.target import Target
from kernorch.cost.analytic import kernel_bytes, primitive_flops
from kernorch.cost.interface import CostModel, CostModelBase
from kernorch.ir.kernel import CandidateKernel

HOST_LINK = 25e9  # bytes / s between host and device (PCIe 4 x16, one direction)
HOST_FLOPS = 1e11  # the host CPU running a reference kernel
HOST_OVERHEAD = 30e-6  # a synchronisation and two copies' launches
LIBRARY_EFFICIENCY = 0.8
TEMPLATE_EFFICIENCY = 0.6


def gpu_cost_model(options: Any) -> CostModel:
    """A GPU plan's cost model: the Target's roofline per launch, or (`--cost profile`, `--device cuda`) each
    candidate timed on the GPU present (cost/gpu_profile.py)."""
    from kernorch.codegen.target import GPU_TARGETS
    from kernorch.runtime.gpu_plan import device_preset

    preset = device_preset() if options.device == "cuda" else options.device
    if options.cost == "profile":
        from kernorch.cost.gpu_profile import GpuProfiledCost

        return GpuProfiledCost(GPU_TARGETS[preset], options.tf32, options.cache)
    return GpuCostModel(GPU_TARGETS[preset], options.tf32)


@dataclass
class GpuCostModel(CostModelBase):
    target: Target
    tf32: bool = False
    name: str = "analytic"

    def cost(self, candidate: CandidateKernel) -> float:
        backend, _ = choose_backend(candidate, "gpu")
        if backend is None:
            return math.inf
        if not backend.runs_code:
            return 0.0
        flops = sum(primitive_flops(candidate.graph, node) for node in candidate.primitives)
        moved = kernel_bytes(candidate)
        bandwidth = self.target.global_bandwidth
        if not isinstance(backend, GpuBackend):  # on the host, its operands copied there and back
            return moved / HOST_LINK + flops / HOST_FLOPS + HOST_OVERHEAD
        peak = self.target.tf32_flops if self.tf32 and self.target.tf32_flops else self.target.peak_flops
        try:
            kernel = backend.triton("k", candidate, self.target, self.tf32)
        except NotGeneratable:
            return math.inf
        if kernel is None:  # a library call
            node = candidate.primitives[0]
            extra = 2 * candidate.graph.types[node.outputs[0]].nbytes if node.attr("channels_last", False) else 0
            return max((moved + extra) / bandwidth, flops / (peak * LIBRARY_EFFICIENCY)) + self.target.launch_overhead
        scratch = sum(math.prod(b.shape) * 8 for b in kernel.buffers if b.role == "scratch")
        memory = self._memory_seconds(candidate, moved + 2 * scratch) if backend.has_gir else \
            (moved + 2 * scratch) / bandwidth  # fmt: skip
        launches = kernel.launches
        total = 0.0
        for launch in launches:
            occupancy = min(1.0, launch.programs / max(self.target.units, 1))
            share = 1.0 / len(launches)  # the kernel's bytes and flops split evenly between its launches
            total += max(share * memory / occupancy,
                         share * flops / (peak * TEMPLATE_EFFICIENCY * occupancy)) + self.target.launch_overhead
        return total

    def _memory_seconds(self, candidate: CandidateKernel, moved: float) -> float:
        """The GIR lowered for this GPU Target (PowerFusion's model): the cache lines its loads and stores move
        (a window's taps, a transposed read) at the bandwidth of the level its buffers fit in (L2 or global
        memory), and never less than its distinct bytes from global memory."""
        try:
            gir = rewritten(candidate, self.target)
        except NotGeneratable:
            return moved / self.target.global_bandwidth
        lines = gir.traffic("load") + gir.traffic("store")
        working_set = sum(size for name, size in gir.buffer_bytes.items() if gir.roles.get(name) != "table")
        level = next((level for level in self.target.memory if level.name == "L2" and working_set <= level.bytes),
                     self.target.memory[-1])  # fmt: skip
        return max(moved / self.target.global_bandwidth, lines / level.bandwidth)
