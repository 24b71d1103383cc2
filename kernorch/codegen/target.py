"""What code is generated for: the parallel units, the vector width and tiles, and the memory levels.

Lowering (codegen/gir/) makes its choices against a Target — how many threads share a phase, how many lanes an
instruction block has, the side of a transpose's tiles — and a renderer (codegen/c/) writes the code for the
same Target. Nothing else in the GIR is specific to a CPU: a GPU Target has program instances for threads and
shared memory among its levels.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class MemoryLevel:
    name: str
    bytes: int  # capacity (per core for private levels)
    bandwidth: float  # bytes per second it sustains (nominal; cost/bandwidth.py measures this machine's)


@dataclass(frozen=True)
class Target:
    name: str
    lanes: int  # float32 lanes of one vector instruction block
    tile: int  # elements per side of a tiled transpose's block: a cache line of float32
    threads: int  # parallel units sharing a phase's parallel loop
    line_bytes: int
    memory: tuple[MemoryLevel, ...]  # fastest first

    def with_threads(self, threads: int) -> Target:
        return self if threads == self.threads else replace(self, threads=threads)


# The CPUs kernorch runs on: AVX-512 (16 float32 lanes; AVX2 machines run the same C, the compiler splits each
# vector in two), 64-byte lines, two cores.
CPU = Target("x86-64 CPU", lanes=16, tile=16, threads=2, line_bytes=64,
             memory=(MemoryLevel("L1", 48 << 10, 2.0e11), MemoryLevel("L2", 2 << 20, 1.0e11),
                     MemoryLevel("L3", 32 << 20, 5.0e10), MemoryLevel("DRAM", 1 << 40, 2.0e10)))  # fmt: skip
