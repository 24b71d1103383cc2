"""A GPU plan's program: the Triton module of its kernels (what a saved GPU plan ships as kernels.py and a load
regenerates and compares), and which kernels run Triton."""

from __future__ import annotations

from collections.abc import Sequence

from kernorch.codegen.backends import GpuBackend, choose_backend
from kernorch.codegen.target import Target
from kernorch.codegen.triton import TritonKernel, module_source
from kernorch.errors import KernorchError
from kernorch.ir.kernel import CandidateKernel


def gpu_sources(kernels: Sequence[CandidateKernel], target: Target,
                tf32: bool = False) -> tuple[str, list[TritonKernel | None]]:  # fmt: skip
    """The plan's Triton module text and, per kernel, its Triton kernel (None: a library call, a view, the host)."""
    rendered: list[TritonKernel | None] = []
    for k, kernel in enumerate(kernels):
        backend, reason = choose_backend(kernel, "gpu")
        if backend is None:
            raise KernorchError(f"kernel {k} ({kernel.describe()}) cannot run on a GPU: {reason}")
        rendered.append(backend.triton(f"k{k}", kernel, target, tf32) if isinstance(backend, GpuBackend) else None)
    return module_source([k for k in rendered if k is not None]), rendered
