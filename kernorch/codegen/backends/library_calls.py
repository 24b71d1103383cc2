"""Library calls: a linear primitive with what it absorbs (strided operand views, bias, post-ops) as one call
described by `LibraryCall` (codegen/library/call.py), with the life cycle oneDNN intends: created once when
the plan is loaded (weights packed), run per call, destroyed. oneDNN runs it, or one of kernorch's own
convolutions for the shapes oneDNN handles worst (codegen/native/); the choice between them is made by the order
of the registry (backends/registry.py) only. Each native convolution or product declares its `LibraryCallBackend`
in its own module (codegen/native/<family>.py, as `BACKEND`); oneDNN's is here."""

from __future__ import annotations

from collections.abc import Callable

from kernorch.codegen.backends.base import Backend, Verdict, declines, runs
from kernorch.codegen.gir import remembered
from kernorch.codegen.library import (
    LibraryCall,
    Tensor,
    describe_library_call,
    onednn_rejection,
    render_matmul_at_run_sizes,
    render_onednn_call,
    render_per_shape,
)
from kernorch.codegen.loops import NotGeneratable
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.primitives import PRIMITIVES, Kind


def library_call(kernel: CandidateKernel) -> LibraryCall:
    """The kernel as one library call (made once per kernel while remembering; raises NotGeneratable)."""
    return remembered(("library",), kernel, lambda: describe_library_call(kernel))


class LibraryCallBackend(Backend):
    stateful = True
    signature_label = "library"  # one label for all of them: the profile keys predate the split

    def __init__(self, name: str, family: str, what: str, rejection: Callable[[LibraryCall], str | None],
                 render: Callable[[str, LibraryCall], str], claims: bool = False,
                 precisions: tuple[str, ...] = ("f32",), runtime_weights: bool = False,
                 generic_render: Callable[[str, LibraryCall], str] | None = None) -> None:  # fmt: skip
        self.name, self.family, self.what = name, family, what
        self.rejection, self.render_call, self._claims = rejection, render, claims
        # the form a shape-generic plan unifies across sizes (Backend.generic_source): by default the call as is
        self.generic_render = generic_render or render
        # whether it reads weights computed at run time: kernorch's own kernels pack theirs once, at create (a
        # direct conv given a graph input's weights computed with whatever the buffer held then)
        self.runtime_weights = runtime_weights
        self.precisions = precisions  # what its arithmetic can be: kernorch's own convolutions are float32
        # what its operands and destination may be stored as (bf16 mode's bfloat16 values: oneDNN's)
        self.dtypes = ("float32", *(("bfloat16",) if "bf16" in precisions else ()),
                       *(("int8", "uint8", "int32") if "int8" in precisions else ()))  # fmt: skip

    def applies(self, kernel: CandidateKernel) -> Verdict:
        if not any(PRIMITIVES[n.prim].kind == Kind.LINEAR for n in kernel.primitives):
            return declines("no linear primitive")
        try:
            call = library_call(kernel)
        except NotGeneratable as error:
            return declines(str(error), claims=self._claims)
        if call.precision not in self.precisions:
            return declines(f"computes in {' or '.join(self.precisions)}; the {call.op} is {call.precision}")
        stored = next((t.dtype for t in _tensors(call) if t.dtype not in self.dtypes), None)
        if stored is not None:  # kernorch's own convolutions read and write float32 only
            return declines(f"reads and writes float32; the {call.op} has a {stored} operand or destination")
        if not call.weights.constant and not self.runtime_weights:
            return declines("weights are not constant (packed once, when the plan is created)")
        rejection = self.rejection(call)
        if rejection is not None:
            return declines(rejection)
        precision = f" in {call.precision}" if call.precision != "f32" else ""
        return runs(f"{self.what}: {call.op}{precision}" + (f" + {call.epilogue.describe()}" if call.epilogue else ""))

    def source(self, name: str, kernel: CandidateKernel) -> str:
        return self.render_call(name, library_call(kernel))

    def generic_source(self, name: str, kernel: CandidateKernel) -> str:
        call = library_call(kernel)
        if call.op in ("convolution", "deconvolution"):  # created per shape, run per image (library/run_sizes.py)
            return render_per_shape(name, call, self.render_call)
        return self.generic_render(name, call)

    def summary(self, kernel: CandidateKernel) -> str:
        return self.what

    def signature_text(self, kernel: CandidateKernel) -> str:
        return self.source("k", kernel)


def _tensors(call: LibraryCall) -> list[Tensor]:
    """Every buffer the call reads or writes."""
    post_op_operands = [tensor for _, tensor in call.post_ops if tensor is not None]
    return [call.src, call.weights, call.dst, *([call.bias] if call.bias is not None else []), *post_op_operands]


ONEDNN = LibraryCallBackend("onednn", "library call", "oneDNN", onednn_rejection, render_onednn_call, claims=True,
                            precisions=("f32", "bf16", "int8"), runtime_weights=True,
                            generic_render=render_matmul_at_run_sizes)  # fmt: skip
