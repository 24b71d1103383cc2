"""What code is generated for: the parallel units, the vector width and tiles, and the memory levels.

Lowering (codegen/gir/) makes its choices against a Target — how many threads share a phase, how many lanes an
instruction block has, the side of a transpose's tiles — and a renderer (codegen/c/) writes the code for the
same Target. Nothing else in the GIR is specific to a CPU: a GPU Target (`GPU_TARGETS`) has program instances
(blocks) for threads, the lanes of a block for the vector width, and global memory, L2, shared memory and
registers for its levels; the Triton renderer (codegen/triton/) writes for it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class MemoryLevel:
    name: str
    bytes: int  # capacity (per core for private levels)
    bandwidth: float  # bytes per second it sustains (nominal; cost/bandwidth.py measures this machine's)


PARALLEL_MIN_ELEMENTS = 16384  # below this a parallel region costs more than it saves


@dataclass(frozen=True)
class Target:
    name: str
    lanes: int  # float32 lanes of one vector instruction block
    tile: int  # elements per side of a tiled transpose's block: a cache line of float32
    threads: int  # parallel units sharing a phase's parallel loop
    line_bytes: int
    memory: tuple[MemoryLevel, ...]  # fastest first
    kind: str = "cpu"  # "cpu" (C, oneDNN) or "gpu" (Triton, cuBLAS/cuDNN through torch)
    peak_flops: float = 0.0  # float32 multiply-adds x 2 per second without tensor cores (0: measured, the CPU)
    tf32_flops: float = 0.0  # with TF32 tensor cores (0: none)
    launch_overhead: float = 0.0  # seconds per kernel launch (inside a CUDA graph: its node's share)
    units: int = 0  # GPU: streaming multiprocessors (a program instance runs on one)
    # generated C for many sizes (a shape-generic plan's kernel, codegen/generic/): no structure chosen by a size's
    # value — every loop nest with work is shared out to the threads (not only from PARALLEL_MIN_ELEMENTS), a
    # block of rows has its remainder code whether or not the rows divide into blocks, a vector loop's tail is
    # a loop of its own — so the code at one size is the code at every other but for its literals
    generic: bool = False

    @property
    def parallel_min_elements(self) -> int:
        """Work (elements times the taps of each) from which generated C shares a loop nest out to the threads."""
        return 1 if self.generic else PARALLEL_MIN_ELEMENTS

    @property
    def global_bandwidth(self) -> float:
        return self.memory[-1].bandwidth

    def with_threads(self, threads: int) -> Target:
        return self if threads == self.threads else replace(self, threads=threads)


# The CPUs kernorch runs on: AVX-512 (16 float32 lanes; AVX2 machines run the same C, the compiler splits each
# vector in two), 64-byte lines, two cores.
CPU = Target("x86-64 CPU", lanes=16, tile=16, threads=2, line_bytes=64,
             memory=(MemoryLevel("L1", 48 << 10, 2.0e11), MemoryLevel("L2", 2 << 20, 1.0e11),
                     MemoryLevel("L3", 32 << 20, 5.0e10), MemoryLevel("DRAM", 1 << 40, 2.0e10)))  # fmt: skip


# GPUs (public datasheet figures; a device's own are measured when one is present, bench/gpu.sh). Levels fastest
# first: registers and shared memory per SM, L2 shared by all SMs, global memory (HBM). `threads` is the number
# of program instances resident at once (SMs x 4 blocks of 4 warps); `lanes` the elements of one block's
# instruction (128 threads); `tile` a transpose's tile side (32 floats: one 128-byte line).
def _gpu(name: str, sms: int, shared_kib: int, l2_mib: int, hbm_gib: int, hbm: float, l2: float,
         fp32: float, tf32: float) -> Target:  # fmt: skip
    return Target(name, lanes=128, tile=32, threads=4 * sms, line_bytes=128, kind="gpu", peak_flops=fp32,
                  tf32_flops=tf32, launch_overhead=3e-6, units=sms,
                  memory=(MemoryLevel("register", 256 << 10, 64 * hbm),
                          MemoryLevel("shared", shared_kib << 10, 16 * hbm),
                          MemoryLevel("L2", l2_mib << 20, l2), MemoryLevel("global", hbm_gib << 30, hbm)))


GPU_TARGETS = {
    "v100": _gpu("V100-SXM2", sms=80, shared_kib=96, l2_mib=6, hbm_gib=16, hbm=900e9, l2=2.5e12, fp32=15.7e12,
                 tf32=0.0),
    "a100": _gpu("A100-SXM4-40GB", sms=108, shared_kib=164, l2_mib=40, hbm_gib=40, hbm=1555e9, l2=5.0e12,
                 fp32=19.5e12, tf32=156e12),
    "h100": _gpu("H100-SXM5", sms=132, shared_kib=228, l2_mib=50, hbm_gib=80, hbm=3350e9, l2=10.0e12, fp32=67e12,
                 tf32=495e12),
}  # fmt: skip
