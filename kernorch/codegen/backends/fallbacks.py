"""Kernels no native backend runs: a view (an alias of its input's bytes, nothing runs), a primitive kernorch has
no rule for (run by onnxruntime, which says so), and a single primitive nothing generates (run by its reference
implementation, so every primitive stays executable)."""

from __future__ import annotations

from kernorch.codegen.backends.base import Backend, Verdict, declines, runs
from kernorch.codegen.views import view_outputs
from kernorch.ir.kernel import CandidateKernel


class View(Backend):
    name = "view"
    family = "view"
    runs_code = False
    signature_label = "view"

    def applies(self, kernel: CandidateKernel) -> Verdict:
        if view_outputs(kernel) is None:
            return declines("not a re-labelling of contiguous bytes")
        return runs(f"{kernel.primitives[0].prim} as a view of its input (no copy)")


class OnnxRuntime(Backend):
    name = "onnxruntime"
    family = "onnxruntime"
    native = False
    signature_label = "reference"  # its profile keys predate the split (it ran as a reference kernel)

    def applies(self, kernel: CandidateKernel) -> Verdict:
        if len(kernel.nodes) == 1 and kernel.primitives[0].prim == "onnx_node":
            return runs(f"onnxruntime fallback ({kernel.primitives[0].attr('op_type')}: no kernorch rule)")
        return declines("not an ONNX node without a kernorch rule")


class Reference(Backend):
    name = "reference"
    family = "reference"
    native = False
    signature_label = "reference"

    def applies(self, kernel: CandidateKernel) -> Verdict:
        if len(kernel.nodes) != 1:
            return declines("the reference implementation runs one primitive at a time")
        return runs("reference implementation")


VIEW = View()
ONNXRUNTIME = OnnxRuntime()
REFERENCE = Reference()
