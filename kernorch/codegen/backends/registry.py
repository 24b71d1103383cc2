"""The registry: which backend runs a kernel, asked in one order, and the per-process record of native code a
library refused. A new backend (a GPU renderer, a test's toy) registers itself here; nothing else changes. A native
kernel family is one module of codegen/native/ that declares its `BACKEND`, and one line in the order below."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kernorch.codegen.backends.base import Backend
from kernorch.codegen.backends.fallbacks import ONNXRUNTIME, REFERENCE, VIEW
from kernorch.codegen.backends.generated_c import GENERATED_C
from kernorch.codegen.backends.gpu_kernels import GPU_VIEW, TORCH_LIBRARY, TRITON, TRITON_MATMUL
from kernorch.codegen.backends.library_calls import ONEDNN
from kernorch.codegen.native import (
    amx_matmul,
    attention,
    depthwise_conv,
    direct_conv,
    few_channel_conv,
    grouped_conv,
    int8_matmul,
    int8_pixel_conv,
    lstm,
    lstm_stack,
    panel_conv,
    panel_matmul,
    pointwise_conv,
    streaming_product,
    winograd_conv,
)
from kernorch.codegen.views import concat_pieces, view_outputs
from kernorch.ir.kernel import CandidateKernel

# Asked in this order; the first that runs a kernel runs it. The reference implementation is the last resort of a
# single primitive (choose_backend), not a member: it runs anything of one primitive.
# Per device kind: a CPU plan's program (C, oneDNN) or a GPU plan's launches (Triton, torch's cuBLAS/cuDNN); the
# onnxruntime fallback and the reference run on the host for either.
_ORDERS: dict[str, list[Backend]] = {
    "cpu": [
        VIEW,
        ONNXRUNTIME,
        # whole patterns first: a template takes its kernel before generated C or a library call could
        lstm.BACKEND,
        lstm_stack.BACKEND,
        attention.BACKEND,
        GENERATED_C,
        # kernorch's own library calls, each for the shapes oneDNN handles worst, before oneDNN (which takes the rest)
        direct_conv.BACKEND,
        depthwise_conv.BACKEND,
        streaming_product.BACKEND,
        few_channel_conv.BACKEND,
        panel_conv.BACKEND,
        panel_matmul.BACKEND,
        pointwise_conv.BACKEND,
        winograd_conv.BACKEND,
        grouped_conv.BACKEND,  # after Winograd: its dense panels take a 3x3 convolution Winograd does not
        amx_matmul.BACKEND,
        int8_matmul.BACKEND,
        int8_pixel_conv.BACKEND,
        ONEDNN,
    ],
    "gpu": [GPU_VIEW, ONNXRUNTIME, TRITON, TRITON_MATMUL, TORCH_LIBRARY],
}
DEVICE_KINDS = tuple(_ORDERS)


def _order(device: str) -> list[Backend]:
    if device not in _ORDERS:
        raise ValueError(f"unknown device kind {device!r} (choose {' or '.join(_ORDERS)})")
    return _ORDERS[device]


def registered(device: str = "cpu") -> tuple[Backend, ...]:
    """Every backend of a device kind, in the order they are asked, then the reference implementation."""
    return (*_order(device), REFERENCE)


def register(backend: Backend, before: Backend | None = None) -> None:
    """Ask `backend` (for plans of its `device` kind) before `before` (by default after every registered one)."""
    order = _order(backend.device)
    if any(b.name == backend.name for b in registered(backend.device)):
        raise ValueError(f"a backend named {backend.name!r} is registered already")
    order.insert(order.index(before) if before is not None else len(order), backend)


def unregister(backend: Backend) -> None:
    _order(backend.device).remove(backend)


@contextmanager
def withheld(backend: Backend) -> Iterator[None]:
    """`backend` out of the order inside the block (the backends after it run its kernels), back in its place
    after: to test the next one on kernels it would take (oneDNN's bf16 matmul where the AMX matmul is)."""
    order = _order(backend.device)
    position = order.index(backend)
    order.remove(backend)
    try:
        yield
    finally:
        order.insert(position, backend)


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


def choose_backend(kernel: CandidateKernel, device: str = "cpu") -> tuple[Backend | None, str]:
    """(backend, how it runs the kernel in a plan for `device` kind, "cpu" or "gpu"); backend None, with the
    reason, when nothing can run it. The reason of a kernel nothing runs is that of the backend whose kind it is
    (a fusion generated C cannot describe, a linear primitive no library call can take)."""
    if device == "cpu" and (refused := refused_native(kernel)) is not None:
        return REFERENCE, f"reference implementation (its native code was refused here: {refused})"
    claimed: str | None = None
    for backend in _order(device):
        verdict = backend.applies(kernel)
        if verdict.runs:
            return backend, verdict.reason
        if verdict.claims and claimed is None:
            claimed = verdict.reason
    reason = claimed or "no backend runs it"
    if REFERENCE.applies(kernel).runs:
        return REFERENCE, f"reference implementation ({reason})"
    return None, reason


def plan_views(kernels: Sequence[CandidateKernel],
               backends: Sequence[Backend]) -> tuple[list[Backend], dict[str, tuple[str, int]]]:  # fmt: skip
    """The plan's backends with every concat that cannot be placed turned into a copy (generated C), and its
    views: value -> (the value whose bytes it is, element offset)."""
    chosen = list(backends)
    views: dict[str, tuple[str, int]] = {}
    for kernel, backend in zip(kernels, chosen, strict=True):
        if backend.runs_code is False and kernel.primitives[0].prim != "concat":
            views.update(view_outputs(kernel) or {})
    placed: set[str] = set()
    for k, (kernel, backend) in enumerate(zip(kernels, chosen, strict=True)):
        if backend.runs_code or kernel.primitives[0].prim != "concat":
            continue
        pieces = concat_pieces(kernel) or {}
        # a piece that is itself a view, or already placed in another concat, keeps its own bytes: copy
        if not pieces or any(value in views or value in placed for value in pieces):
            chosen[k] = GENERATED_C
            continue
        views.update(pieces)
        placed.update(pieces)
    return chosen, views
