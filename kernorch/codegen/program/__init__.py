"""The whole-plan program: one C translation unit per plan with create/run/destroy and the rProgram region
runner (plan.py, rprogram.py), and its compiler with the private, digest-checked cache (compiler.py); a GPU
plan's Triton module (triton_module.py)."""

from kernorch.codegen.program.compiler import (
    CFLAGS,
    CompileError,
    compile_source,
    compiler_identity,
    load_library,
    onednn_paths,
)
from kernorch.codegen.program.plan import ERROR_BUFFER, NativePlan, render_plan, translation_unit
from kernorch.codegen.program.rprogram import CALL, ENTRY_FIELDS, MAX_VEUS, REGION, SEGMENT_FIELDS, TASK, WAIT
from kernorch.codegen.program.triton_module import gpu_sources

__all__ = [
    "CALL",
    "CFLAGS",
    "CompileError",
    "ERROR_BUFFER",
    "ENTRY_FIELDS",
    "MAX_VEUS",
    "NativePlan",
    "REGION",
    "SEGMENT_FIELDS",
    "TASK",
    "WAIT",
    "compile_source",
    "compiler_identity",
    "gpu_sources",
    "load_library",
    "onednn_paths",
    "render_plan",
    "translation_unit",
]
