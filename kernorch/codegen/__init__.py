"""Codegen: turn planned kernels into code that runs, one subpackage per part of the way.

- `backends/`: the Backend interface (one object per way of running a kernel) and the registry that picks one;
- `loops/`: a fused memory-intensive kernel described as loops over expression trees, and the index algebra;
- `gir/`: the GIR (PowerFusion): lowering with the choices of how a kernel runs, rewrite rules, passes;
- `c/`: C rendered from the GIR, and the prelude of every translation unit;
- `library/`: a linear primitive with what it absorbs as one call, rendered against oneDNN's C API;
- `native/`: hand-written kernel families, one module each with its backend (direct, depthwise, pointwise,
  few-channel and Winograd convolutions, a product over few rows, the AMX matmul, the LSTM scan and stack,
  fused attention);
- `triton/`: Triton kernels for GPU plans, from the same loop descriptions (and a matmul with its epilogue);
- `program/`: the whole-plan program (create/run/destroy, the rProgram region runner) and its compiler; a GPU
  plan's Triton module;
- `target.py`: what code is generated for (parallel units, vector width and tiles, memory levels; GPU presets);
- `views.py`: which kernels only re-label bytes.
"""
