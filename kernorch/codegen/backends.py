"""Which backend runs a kernel — decided here, so orchestration never needs to know C or torch.

- "c": fused memory-intensive kernels, generated as C (loops.py, then GIR: codegen/gir/), and opaque primitives with
  a hand-written C template (the LSTM scan, stacked LSTM layers: TEMPLATES);
- "library": a linear primitive with what it absorbs (strided operand views, bias, post-ops) as one oneDNN
  call, generated as C (library.py / library/onednn.py);
- "view": a kernel that only re-labels contiguous bytes of its input (a reshape, a contiguous slice or split,
  views.py): its outputs alias the input's buffer, so it costs nothing and runs no code;
- "reference": a single primitive nothing else generates (e.g. an opaque top_k), run by its
  reference implementation so every primitive stays executable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kernorch.codegen.c.kernel import render_kernel_tasks, scratch_bytes
from kernorch.codegen.c.render import render_function
from kernorch.codegen.gir.memo import described, rewritten
from kernorch.codegen.gir.sharing import Sharing
from kernorch.codegen.library.call import describe_library_call
from kernorch.codegen.loops.describe import NotGeneratable, is_depthwise
from kernorch.codegen.native.lstm import describe_lstm, lstm_scratch_bytes, lstm_supported, render_lstm
from kernorch.codegen.native.lstm_stack import (
    describe_lstm_stack,
    lstm_stack_scratch_bytes,
    lstm_stack_supported,
    render_lstm_stack,
)
from kernorch.codegen.views import view_outputs
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.primitives import PRIMITIVES, Kind


@dataclass(frozen=True)
class CTemplate:
    """A hand-written C template for an opaque primitive. It runs whole: it synchronises its own threads (the
    LSTM scan with a barrier per step, the stack with a step counter per layer)."""

    applies: Callable[[CandidateKernel], bool]
    what: str
    scratch_bytes: Callable[[CandidateKernel], list[int]]
    render: Callable[[str, CandidateKernel], str]
    describe: Callable[[CandidateKernel], str]  # its structure, for `kernorch explain`


TEMPLATES = (
    CTemplate(lstm_supported, "LSTM scan C template", lstm_scratch_bytes, render_lstm, describe_lstm),
    CTemplate(lstm_stack_supported, "stacked LSTM layers as waves, C template", lstm_stack_scratch_bytes,
              render_lstm_stack, describe_lstm_stack),
)


def _template(kernel: CandidateKernel) -> CTemplate | None:
    return next((template for template in TEMPLATES if template.applies(kernel)), None)


def template_summary(kernel: CandidateKernel) -> str | None:
    """"<template>: <its structure>" for a kernel a hand-written C template runs, else None."""
    template = _template(kernel)
    return None if template is None else f"{template.what}: {template.describe(kernel)}"


# Single primitives whose native code a library or the compiler refused on this machine (the profiler and the
# executor record them): run by their reference implementation instead, so a model never loses the only kernel
# that computes a primitive. Keyed by what the code depends on (the primitive, its attributes, its operand types
# and which operands are constants); a saved plan lists its refused kernels and a load records them again.
_REFUSED: dict[tuple[object, ...], str] = {}


def _node_key(kernel: CandidateKernel) -> tuple[object, ...]:
    (node,) = kernel.primitives
    graph = kernel.graph
    return (node.prim, node.attrs, tuple((str(graph.types[v]), v in graph.constants) for v in node.inputs),
            tuple(str(graph.types[v]) for v in node.outputs))  # fmt: skip


def refuse_native(kernel: CandidateKernel, reason: str) -> bool:
    """Run this single-primitive kernel (and every one like it) by its reference implementation from now on;
    False (nothing recorded) for a kernel of several primitives, which has no such fallback."""
    if len(kernel.nodes) != 1:
        return False
    _REFUSED[_node_key(kernel)] = reason
    return True


def refused_native(kernel: CandidateKernel) -> str | None:
    """Why this single-primitive kernel's native code was refused on this machine, or None."""
    return _REFUSED.get(_node_key(kernel)) if len(kernel.nodes) == 1 and _REFUSED else None


def choose_backend(kernel: CandidateKernel) -> tuple[str | None, str]:
    """(backend name, reason); backend is None when no backend can run the kernel."""
    prims = kernel.primitives
    if (refused := refused_native(kernel)) is not None:
        return "reference", f"reference implementation (its native code was refused here: {refused})"
    if view_outputs(kernel) is not None:
        return "view", f"{prims[0].prim} as a view of its input (no copy)"
    kinds = {PRIMITIVES[n.prim].kind for n in prims}
    if Kind.LINEAR in kinds:
        linear = next(n for n in prims if PRIMITIVES[n.prim].kind == Kind.LINEAR)
        if is_depthwise(kernel.graph, linear) and not linear.attr("channels_last", False):
            # on NCHW buffers oneDNN's depthwise conv is 2-3x slower than a generated per-channel window
            # reduction (1.0 vs 2.1 ms for 672 channels, 14x14, 5x5 here); channels-last it is the faster one
            try:
                described(kernel)
                return "c", "generated depthwise conv"
            except NotGeneratable:
                pass
        try:
            call = describe_library_call(kernel)
        except NotGeneratable as error:
            return (None, str(error)) if len(prims) > 1 else ("reference", f"reference implementation ({error})")
        return "library", f"oneDNN {call.op}" + (f" + {call.epilogue.describe()}" if call.epilogue else "")
    if (template := _template(kernel)) is not None:
        return "c", template.what
    try:
        described(kernel)
        return "c", "generated C"
    except NotGeneratable as error:
        if len(prims) == 1:
            return "reference", f"reference implementation ({error})"
        return None, str(error)


def c_scratch_bytes(kernel: CandidateKernel) -> list[int]:
    """Scratch buffers a "c" kernel takes after its outputs (the plan allocates them once)."""
    if (template := _template(kernel)) is not None:
        return template.scratch_bytes(kernel)
    return scratch_bytes(described(kernel))


def render_c(name: str, kernel: CandidateKernel) -> str:
    """The C function for a kernel whose backend is "c"."""
    if (template := _template(kernel)) is not None:
        return template.render(name, kernel)
    return render_function(name, rewritten(kernel), Sharing())  # as c_renderer.render_kernel


def render_c_tasks(name: str, kernel: CandidateKernel) -> tuple[str, tuple[int, ...]] | None:
    """The kernel's phases as rTask functions with their trip counts (c_renderer.render_kernel_tasks); None
    for a hand-written template (it synchronises its own threads: it runs whole)."""
    if _template(kernel) is not None:
        return None
    return render_kernel_tasks(name, described(kernel))


__all__ = ["NotGeneratable", "c_scratch_bytes", "choose_backend", "render_c", "render_c_tasks", "template_summary",
           "view_outputs"]
