"""Backends: one object per way of running a kernel (base.py's interface), and the registry that picks one.

- generated C (`GENERATED_C`): fused memory-intensive kernels, described as loops, lowered to GIR, rendered as C;
- C templates (`LSTM_SCAN`, `LSTM_STACK`, `FUSED_ATTENTION`): hand-written C for opaque primitives and for
  attention (two matmuls around a softmax);
- library calls: a linear primitive with what it absorbs, run by oneDNN (`ONEDNN`) or kernorch's own
  convolutions (`DIRECT_CONV`, `DEPTHWISE_CONV`, `POINTWISE_CONV`, `WINOGRAD_CONV`, `FEW_CHANNEL_CONV`) and products
  over few rows (`STREAMING_PRODUCT`), with the same create/run/destroy shape;
- `VIEW`: a kernel that only re-labels contiguous bytes of its input (no code);
- `ONNXRUNTIME`: an ONNX node kernorch has no rule for; `REFERENCE`: a single primitive nothing else runs;
- for GPU plans (gpu.py): `TRITON` (fused kernels rendered as Triton), `TRITON_MATMUL` (a matmul with its epilogue),
  `TORCH_LIBRARY` (cuBLAS/cuDNN through torch), `GPU_VIEW`.

Orchestration never needs to know C or oneDNN: it asks `choose_backend`.
"""

from kernorch.codegen.backends.base import Backend, PythonKernel, Verdict, declines, runs
from kernorch.codegen.backends.fallbacks import ONNXRUNTIME, REFERENCE, VIEW
from kernorch.codegen.backends.generated_c import GENERATED_C
from kernorch.codegen.backends.gpu import (
    GPU_VIEW,
    TORCH_LIBRARY,
    TRITON,
    TRITON_MATMUL,
    GpuBackend,
    TorchLibrary,
    torch_linear,
)
from kernorch.codegen.backends.library_calls import (
    AMX_MATMUL,
    DEPTHWISE_CONV,
    DIRECT_CONV,
    FEW_CHANNEL_CONV,
    ONEDNN,
    POINTWISE_CONV,
    STREAMING_PRODUCT,
    WINOGRAD_CONV,
    LibraryCallBackend,
    library_call,
)
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
from kernorch.codegen.backends.templates import FUSED_ATTENTION, LSTM_SCAN, LSTM_STACK
from kernorch.codegen.loops import NotGeneratable

__all__ = [
    "AMX_MATMUL",
    "DEVICE_KINDS",
    "GPU_VIEW",
    "TORCH_LIBRARY",
    "TRITON",
    "TRITON_MATMUL",
    "GpuBackend",
    "TorchLibrary",
    "torch_linear",
    "DEPTHWISE_CONV",
    "DIRECT_CONV",
    "FEW_CHANNEL_CONV",
    "FUSED_ATTENTION",
    "GENERATED_C",
    "LSTM_SCAN",
    "LSTM_STACK",
    "ONEDNN",
    "POINTWISE_CONV",
    "STREAMING_PRODUCT",
    "ONNXRUNTIME",
    "REFERENCE",
    "VIEW",
    "WINOGRAD_CONV",
    "Backend",
    "LibraryCallBackend",
    "NotGeneratable",
    "PythonKernel",
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
    "unregister",
    "withheld",
]
