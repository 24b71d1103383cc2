"""Triton: the GPU renderer of fused memory-intensive kernels (render.py, expr.py), the matmul template with a
fused epilogue (matmul.py), and the module the generated kernels are imported from (module.py)."""

from kernorch.codegen.triton.matmul import matmul_rejection, render_matmul
from kernorch.codegen.triton.module import (
    choose_interpreter,
    launch,
    load_module,
    module_source,
    nvidia_device_present,
    use_interpreter_without_gpu,
)
from kernorch.codegen.triton.render import Launch, TritonKernel, render_triton

choose_interpreter()

__all__ = ["Launch", "TritonKernel", "choose_interpreter", "launch", "load_module", "matmul_rejection",
           "module_source", "nvidia_device_present", "render_matmul", "render_triton", "use_interpreter_without_gpu"]
