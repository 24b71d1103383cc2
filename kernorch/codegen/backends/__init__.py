"""Backends: one object per way of running a kernel (base.py's interface), and the registry that picks one.

- generated C (`GENERATED_C`): fused memory-intensive kernels, described as loops, lowered to GIR, rendered as C;
- library calls (`LibraryCallBackend`): a linear primitive with what it absorbs, run by oneDNN (`ONEDNN`) or by one
  of kernorch's own kernels for the shapes oneDNN handles worst, with the same create/run/destroy shape;
- C templates (`CTemplate`): hand-written C for opaque primitives (the LSTM scan, stacked LSTM layers) and for
  attention (two matmuls around a softmax);
- `VIEW`: a kernel that only re-labels contiguous bytes of its input (no code);
- `ONNXRUNTIME`: an ONNX node kernorch has no rule for; `REFERENCE`: a single primitive nothing else runs;
- for GPU plans (gpu_kernels.py): `TRITON` (fused kernels rendered as Triton), `TRITON_MATMUL` (a matmul with its
  epilogue), `TORCH_LIBRARY` (cuBLAS/cuDNN through torch), `GPU_VIEW`.

kernorch's own kernels are families of codegen/native/, each declaring its backend in its module (`BACKEND`); the
registry (registry.py) lists them in the order they are asked. It loads on first use: a native module imports its
backend's class from here, and the registry imports every native module.

Orchestration never needs to know C or oneDNN: it asks `choose_backend`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernorch.codegen.backends.base import Backend, PythonKernel, Verdict, declines, runs
from kernorch.codegen.backends.fallbacks import ONNXRUNTIME, REFERENCE, VIEW
from kernorch.codegen.backends.generated_c import GENERATED_C
from kernorch.codegen.backends.gpu_kernels import (
    GPU_VIEW,
    TORCH_LIBRARY,
    TRITON,
    TRITON_MATMUL,
    GpuBackend,
    TorchLibrary,
    torch_linear,
)
from kernorch.codegen.backends.library_calls import ONEDNN, LibraryCallBackend, library_call
from kernorch.codegen.backends.templates import CTemplate
from kernorch.codegen.loops import NotGeneratable

if TYPE_CHECKING:
    from kernorch.codegen.backends.registry import (
        DEVICE_KINDS,
        choose_backend,
        plan_views,
        refuse_native,
        refused_native,
        register,
        registered,
        unregister,
        withheld,
    )

_REGISTRY_NAMES = ("DEVICE_KINDS", "choose_backend", "plan_views", "refuse_native", "refused_native", "register",
                   "registered", "unregister", "withheld")  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _REGISTRY_NAMES:
        from kernorch.codegen.backends import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'kernorch.codegen.backends' has no attribute {name!r}")


__all__ = [
    "DEVICE_KINDS",
    "GENERATED_C",
    "GPU_VIEW",
    "ONEDNN",
    "ONNXRUNTIME",
    "REFERENCE",
    "TORCH_LIBRARY",
    "TRITON",
    "TRITON_MATMUL",
    "VIEW",
    "Backend",
    "CTemplate",
    "GpuBackend",
    "LibraryCallBackend",
    "NotGeneratable",
    "PythonKernel",
    "TorchLibrary",
    "Verdict",
    "choose_backend",
    "declines",
    "library_call",
    "plan_views",
    "refuse_native",
    "refused_native",
    "register",
    "registered",
    "runs",
    "torch_linear",
    "unregister",
    "withheld",
]
