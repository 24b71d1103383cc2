"""What a kernel's activations cost in place beyond its isolated profile.

The profiler times a kernel alone, on its own buffers, again and again: what it reads and writes is in cache
(L2, or L3 when it does not fit). In a plan its inputs were written or last read several kernels before and its
outputs land on lines that are not in cache, so every activation byte (a value that is not a constant) costs
more in place: ResNet-50's add + relu over 56x56x256 (9.6 MB read and written) took 143 µs isolated and 410 in
place, its stem's relu (6.4 MB) 116 and 302-304, on Zen 3 in a slow minute (the model's kernels summed 1.4x their
quiet time; scaled, still 2x and 1.9x): 12-29 µs per MB more, a quarter to a half of the difference between
DRAM's and L3's time per byte there (bandwidth.py: 77 and 16 µs per MB). Priced hot, a separate pass looked as
cheap as the epilogue it replaces and fuse-or-separate followed the profile's noise; charged half the
difference, the zoo's real-size plans had up to 43 fewer kernels and, alternated in one process with the plans
priced hot, ran 1.5-3.3 % faster on the CNNs and 0-1 % on the transformers (one detector head 1.5 % slower;
bench/results/2026-12-01-activation-traffic-zen3.md; a flat 15 µs per MB was weaker on ResNet-50). Constants
(weights) are not charged: a kernel's own, isolated or not.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernorch.cost.bandwidth import MemoryLevels
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.types import TensorType

DRAM_SHARE = 0.5  # of a kernel's activation bytes, the part that comes from (or goes to) DRAM in place


def activation_bytes(candidate: CandidateKernel) -> int:
    """Bytes of the non-constant values the candidate reads and writes."""
    graph = candidate.graph
    values = (*candidate.inputs, *candidate.outputs)
    return sum(t.nbytes for v in values if v not in graph.constants and isinstance(t := graph.types.get(v), TensorType))


@dataclass(frozen=True)
class ActivationTraffic:
    """Seconds added to a profiled kernel for its activations (module doc), from this machine's memory levels."""

    levels: MemoryLevels
    dram_share: float = DRAM_SHARE

    def seconds(self, candidate: CandidateKernel) -> float:
        moved = activation_bytes(candidate)
        if not moved:
            return 0.0
        hot = self.levels.level_for(moved)  # where the isolated runs found them
        dram = self.levels.levels[-1]
        return self.dram_share * moved * max(0.0, 1 / dram.bandwidth - 1 / hot.bandwidth)
