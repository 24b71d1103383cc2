"""Triton: the GPU renderer of fused memory-intensive kernels (render.py, expr.py), the matmul template with a
fused epilogue (matmul.py), and the module the generated kernels are imported from (module.py)."""

from kernorch.codegen.triton.module import launch, load_module, module_source, use_interpreter_without_gpu
from kernorch.codegen.triton.render import Launch, TritonKernel, render_triton

__all__ = ["Launch", "TritonKernel", "launch", "load_module", "module_source", "render_triton",
           "use_interpreter_without_gpu"]
