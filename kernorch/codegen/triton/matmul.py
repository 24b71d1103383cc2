"""A matmul with its elementwise epilogue as one Triton template: the competitor of cuBLAS plus a separate epilogue.

A program computes a [BM, BN] tile of one batch's product with `tl.dot` over K in BK steps (IEEE float32, or
TF32 when the plan allows it), then applies the epilogue to the tile in registers — every primitive of the
kernel after the matmul, described as value trees over the output index (codegen/loops/: the matmul's result
is a register slot, "acc_mm") and rendered by the same writer as the memory-intensive kernels — and stores each
kernel output. The BLP chooses between this fused kernel and the library matmul with the epilogue apart.
"""

from __future__ import annotations

import math

from kernorch.codegen.loops import Buffer, Describer, KernelLoops, NotGeneratable, flatten
from kernorch.codegen.target import Target
from kernorch.codegen.triton.render import Context, Launch, TritonKernel, Writer, pow2
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.primitives import PRIMITIVES, Kind

SLOT = "acc_mm"


def matmul_rejection(kernel: CandidateKernel) -> str | None:
    """Why the template does not take `kernel`, or None."""
    graph = kernel.graph
    prims = kernel.primitives
    matmuls = [n for n in prims if n.prim == "matmul"]
    if len(matmuls) != 1:
        return "the Triton matmul template takes one matmul"
    (node,) = matmuls
    others = [n for n in prims if n is not node]
    if any(PRIMITIVES[n.prim].kind != Kind.ELEMENTWISE for n in others):
        return "the Triton matmul template fuses elementwise epilogues only"
    if any(v not in kernel.inputs for v in node.inputs):
        return "the matmul's operands must be the kernel's inputs (no views fused before it)"
    a, b, out = (graph.types[v] for v in (*node.inputs, node.outputs[0]))
    if a.rank < 2 or b.rank < 2:
        return "a matrix-vector product is not taken by the template"
    if {a.dtype, b.dtype, out.dtype} != {"float32"}:
        return "the Triton matmul template takes float32"
    if any(graph.types[v].shape != out.shape for v in kernel.outputs):
        return "every output of the template has the matmul's shape"
    if not others:
        return "a lone matmul runs through cuBLAS"
    return None


def render_matmul(name: str, kernel: CandidateKernel, target: Target, tf32: bool = False) -> TritonKernel:
    rejection = matmul_rejection(kernel)
    if rejection is not None:
        raise NotGeneratable(rejection)
    graph = kernel.graph
    (node,) = [n for n in kernel.primitives if n.prim == "matmul"]
    d = Describer(kernel)
    for value in kernel.inputs:
        d.add_buffer(value, "input")
    for value in kernel.outputs:
        d.add_buffer(value, "output")
    d.materialized[node.outputs[0]] = SLOT
    a, b, out = (graph.types[v] for v in (*node.inputs, node.outputs[0]))
    *batch, rows, cols = out.shape
    depth = a.shape[-1]
    index = [("var", f"b{j}") for j in range(len(batch))] + [("var", "m"), ("var", "n")]
    loops = KernelLoops(d.buffers, [], "phased", tables=d.tables)
    writer = Writer(loops)
    block_m, block_n = (min(max(pow2(size), 16), 64) for size in (rows, cols))
    block_k = min(max(pow2(depth), 16), 32)
    tiles_n = -(-cols // block_n)
    tiles = -(-rows // block_m) * tiles_n
    batches = math.prod(batch)
    emit = writer.emit
    emit("ko_pid = tl.program_id(0).to(tl.int64)")
    emit(f"ko_batch = ko_pid // {tiles}")
    emit(f"ko_tile = ko_pid % {tiles}")
    emit(f"m = (ko_tile // {tiles_n}) * {block_m} + tl.arange(0, {block_m})[:, None].to(tl.int64)")
    emit(f"n = (ko_tile % {tiles_n}) * {block_n} + tl.arange(0, {block_n})[None, :].to(tl.int64)")
    emit(f"ko_k = tl.arange(0, {block_k}).to(tl.int64)")
    stride = batches
    for j, size in enumerate(batch):
        stride //= size
        emit(f"b{j} = (ko_batch // {stride}) % {size}")
    operand_base = []
    for operand in (a, b):  # its batch dims broadcast against the output's (aligned to the right)
        terms, step = [], operand.shape[-1] * operand.shape[-2]
        for j in reversed(range(operand.rank - 2)):
            position = len(batch) - (operand.rank - 2) + j
            if operand.shape[j] != 1:
                terms.append(f"b{position} * {step}")
            step *= operand.shape[j]
        operand_base.append(" + ".join(terms) or "0")
    in_a, in_b = (d.buffer_of[v] for v in node.inputs)
    emit(f"ko_acc = tl.zeros([{block_m}, {block_n}], tl.float32)")
    emit(f"for ko_k0 in range(0, {depth}, {block_k}):")
    emit("    kk = ko_k0 + ko_k")
    emit(f"    ko_a = tl.load({in_a} + ({operand_base[0]}) + m * {depth} + kk[None, :], "
         f"mask=(m < {rows}) & (kk[None, :] < {depth}), other=0.0)")  # fmt: skip
    emit(f"    ko_b = tl.load({in_b} + ({operand_base[1]}) + kk[:, None] * {cols} + n, "
         f"mask=(kk[:, None] < {depth}) & (n < {cols}), other=0.0)")  # fmt: skip
    emit(f"    ko_acc += tl.dot(ko_a, ko_b, input_precision=\"{'tf32' if tf32 else 'ieee'}\")")
    emit(f"ko_mask = (m < {rows}) & (n < {cols})")
    emit(f"ko_zero = tl.zeros([{block_m}, {block_n}], tl.int64)")
    writer.slots[SLOT] = ("ko_acc", "float32")
    context = Context("ko_mask", "ko_zero")
    for value in kernel.outputs:
        expr = d.value(value, index)
        buffer = d.buffer_of[value]
        result, _ = writer.value(expr, context)
        store = flatten(index, out.shape)
        emit(f"tl.store({buffer} + ({writer.index(store, context)} + ko_zero), {result}, mask=ko_mask)")
    function = f"{name}_p0"
    arguments = [buf.name for buf in d.buffers] + list(d.tables) + ["ko_err"]
    source = "\n".join([f"@triton.jit\ndef {function}({', '.join(arguments)}):", *writer.lines])
    buffers: tuple[Buffer, ...] = tuple(d.buffers)
    return TritonKernel(name, source + "\n", (Launch(function, tiles * batches, "matmul", (block_m, block_n)),),
                        buffers, dict(d.tables))  # fmt: skip
