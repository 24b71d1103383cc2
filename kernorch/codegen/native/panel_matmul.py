"""A float32 matmul with constant weights, [M, K] x [K, N], in generated C, its epilogue in registers, on CPUs
without AVX-512: a transformer's projections, its MLP and its vocabulary head.

oneDNN 3.2's AVX2 matmul keeps up with onnxruntime's (MLAS) on these shapes alone and hot (Qwen2's 128 x 896 x
4864: 9.2-10.0 ms against 9.1), but in place, where each product's weights (17 MB there) come from memory, it took
15.5-17.3 ms against onnxruntime's 11.0-12.7 (bench/per_node.py, Zen 3, 2 threads): its blocking reads them more
than once. Here each thread owns a contiguous range of the output columns and reads that range's weights once
per pass over the rows, in the order they are packed, and prefetches the next panel's while it computes one
(where the source rows outweigh the weights, N < M, the threads split the rows instead).

The product is the 1x1 convolution of native/panel_conv.py over an image of one row of M pixels (`as_convolution`),
and uses its packing (panels of 16 output columns, a last one of 8, each [K][16]) and its register blocks (6 rows x
2 vectors from the bias over all of K: two weight loads and a broadcast per row feed 12 FMAs, the epilogue applied
in registers before the store where each post-op has a vector form, else over the stored block in L1). Only the
schedule is its own: per thread, per pass of at most PASS_ROWS rows, panel after panel, each panel's rows in
blocks of nearly equal size; before each block a few lines of the next panel's weights are prefetched, so the
panel is in L2 when its first block starts. Threads split the columns where N >= M and there is a panel for
each, else the rows. A run allocates nothing. Hot, the same shapes ran at 1.02-1.4x oneDNN's speed; a K blocked
to keep a panel's block in L1 (128 to 512 values) was no faster.

On AVX-512 oneDNN's matmul was not measured against this one, so the call stays with oneDNN there."""

from __future__ import annotations

import dataclasses

from kernorch import machine
from kernorch.codegen.backends.library_calls import LibraryCallBackend
from kernorch.codegen.c import CWriter
from kernorch.codegen.library import LibraryCall, Tensor, post_ops_rejection
from kernorch.codegen.native.panel_conv import LANES, PANEL, ROWS, write_panels
from kernorch.codegen.native.skeleton import operand_rejection, run_function

PASS_ROWS = 240  # rows per pass over a thread's weights (a longer matmul streams them again)


def _rows(tensor: Tensor) -> tuple[int, int, int, int] | None:
    """(rows, columns, row stride, column stride) of a tensor whose leading dims fold into its rows (evenly
    strided: a [batch, tokens, hidden] activation), or None."""
    if len(tensor.dims) < 2:
        return None
    rows, row_stride = tensor.dims[-2], tensor.strides[-2]
    for dim, stride in zip(reversed(tensor.dims[:-2]), reversed(tensor.strides[:-2]), strict=True):
        if dim != 1 and stride != rows * row_stride:
            return None
        rows *= dim
    return rows, tensor.dims[-1], row_stride, tensor.strides[-1]


def as_convolution(call: LibraryCall) -> LibraryCall | str:
    """The matmul as the 1x1 convolution it is, over an image of one row of M pixels ([1, K, 1, M] channels-last:
    the post-ops' code indexes (n, c, y, x)), or why it cannot be seen so."""
    if min(len(call.src.dims), len(call.dst.dims)) < 2:
        return "a 1-d operand"
    src, dst = _rows(call.src), _rows(call.dst)
    if src is None or dst is None:
        return "rows that are not evenly strided"
    if len(call.weights.dims) < 2 or any(d != 1 for d in call.weights.dims[:-2]):
        return "weights with batch dims"
    rows, inputs, src_m, src_k = src
    _, outputs, dst_m, dst_n = dst
    w_k, w_n = call.weights.strides[-2:]
    operands: list[tuple[object, Tensor | None]] = []
    for op, tensor in call.post_ops:
        if tensor is None:
            operands.append((op, None))
            continue
        operand = _rows(tensor) if len(tensor.dims) == len(call.dst.dims) else None
        if operand is None or operand[0] not in (1, rows) or operand[1] not in (1, outputs):
            return "a post-op operand that is not rows x columns"
        o_rows, o_columns, o_m, o_n = operand
        operands.append((op, dataclasses.replace(tensor, dims=(1, o_columns, 1, o_rows),
                                                  strides=(0, o_n, o_rows * o_m, o_m))))
    return dataclasses.replace(
        call, op="convolution",
        src=dataclasses.replace(call.src, dims=(1, inputs, 1, rows), strides=(0, src_k, rows * src_m, src_m)),
        weights=dataclasses.replace(call.weights, dims=(outputs, inputs, 1, 1), strides=(w_n, w_k, 0, 0)),
        dst=dataclasses.replace(call.dst, dims=(1, outputs, 1, rows), strides=(0, dst_n, rows * dst_m, dst_m)),
        bias=dataclasses.replace(call.bias, dims=(outputs,), strides=(1,)) if call.bias is not None else None,
        strides=(1, 1), dilates=(0, 0), pad_begin=(0, 0), pad_end=(0, 0), post_ops=tuple(operands))  # type: ignore[arg-type]  # fmt: skip


def panel_matmul_rejection(call: LibraryCall) -> str | None:
    """Why the panel matmul does not run `call` (None when it does)."""
    if call.op != "matmul":
        return "not a matmul"
    conv = as_convolution(call)
    if isinstance(conv, str):
        return conv
    if conv.dst.dims[1] % LANES:
        return f"{conv.dst.dims[1]} output columns are no multiple of {LANES}"
    if call.bias is not None and (call.bias.dims[-1] != conv.dst.dims[1] or call.bias.strides[-1] != 1):
        return "a bias that is not one per output column"
    if machine.avx512():
        return "AVX-512: oneDNN's matmul, not measured against this kernel there"
    operands = operand_rejection(conv)
    if operands is not None:
        return operands
    return post_ops_rejection(call.post_ops)


def render_panel_matmul(name: str, call: LibraryCall) -> str:
    """C for `call` (which `panel_matmul_rejection` accepted): state, create, run, destroy."""
    conv = as_convolution(call)
    assert not isinstance(conv, str), conv
    _, inputs, _, rows = conv.src.dims
    outputs = conv.dst.dims[1]
    panels = -(-outputs // PANEL)
    w = CWriter()
    product, pointers = write_panels(w, name, conv)
    with run_function(w, name, conv):
        w.line(*pointers, "#pragma omp parallel")
        with w.block(""):
            # the columns where the weights outweigh the source rows (each panel's weights then read by one thread,
            # every thread reading every row) and each thread has a panel of its own, else the rows (ConvNeXt's
            # MLP over 3136 tokens); a thread's panels one after the other, for each pass over its rows
            w.line("const long t = omp_get_thread_num(), threads = omp_get_num_threads();",
                   f"const int by_columns = {int(outputs >= rows)} && {panels} >= threads;",
                   f"const long q0 = by_columns ? {panels} * t / threads : 0;",
                   f"const long q1 = by_columns ? {panels} * (t + 1) / threads : {panels};",
                   f"const long m0 = by_columns ? 0 : {rows}L * t / threads;",
                   f"const long m1 = by_columns ? {rows} : {rows}L * (t + 1) / threads;",
                   "const long n = 0;  /* the one image of the operands' (n, c, y, x) */")  # fmt: skip
            with w.block(f"for (long pass = m0; pass < m1; pass += {PASS_ROWS})"):
                w.line(f"const long pass_end = pass + {PASS_ROWS} < m1 ? pass + {PASS_ROWS} : m1;",
                       f"const long ahead = {inputs} / ((pass_end - pass + {ROWS - 1}) / {ROWS}) + 1;")  # fmt: skip
                with w.block("for (long q = q0; q < q1; q++)"):
                    w.line(f"const int c0 = (int)q * {PANEL}, vectors = {outputs} - c0 < {PANEL} ? 1 : 2;",
                           f"const float *wp = s->w + (long)c0 * {inputs}, *bp = s->bias + c0;",
                           # the weights come from memory in place: the next panel's (K lines of 64 bytes), a few
                           # lines before each register block, are in L2 when it starts
                           f"const float *next = wp + {PANEL * inputs}L, *next_end = q + 1 < q1 ? next + "
                           f"({outputs} - c0 - {PANEL} < {PANEL} ? {LANES} : {PANEL}) * {inputs}L : next;")  # fmt: skip
                    prefetch = (f"for (long i = 0; i < ahead && next < next_end; i++, next += {PANEL}) "
                                "__builtin_prefetch(next, 0, 2);")  # fmt: skip
                    product.write_blocks(w, "pass", "pass_end", f"src + p * {conv.src.strides[3]}L", (prefetch,))
    return w.text(end="\n")


# oneDNN's AVX2 matmul reads weights that come from memory more than once
BACKEND = LibraryCallBackend("panel_matmul", "native C", "C matmul in panels, weights read once per pass",
                             panel_matmul_rejection, render_panel_matmul)  # fmt: skip
