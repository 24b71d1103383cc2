"""Render a `LibraryCall` as C against oneDNN's C API, with the life cycle oneDNN intends.

`<name>_create(engine, stream, args)` runs once when a plan is loaded: it builds the primitive (weights
as `format_tag_any` when they are constant, so oneDNN picks its packed layout), packs the weights with
one reorder, allocates the scratchpad, and prepares the argument list. `<name>_run(state, stream, args)`
runs per inference: it points the memories at the plan's buffers and executes. Nothing is allocated or
created on the hot path. `<name>_destroy(state)` frees it all. State is per plan instance (no globals),
so two models built from the same library do not share weights.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path

from kernorch import machine
from kernorch.codegen.c import CWriter, c_literal
from kernorch.codegen.library.call import LibraryCall, Tensor
from kernorch.codegen.library.epilogue import Binary, Eltwise
from kernorch.ir.strided import row_major

ONEDNN_PRELUDE = """#include <stdio.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#define KO_CHECK(call) do { dnnl_status_t ko_status_ = (call); if (ko_status_ != dnnl_success) { \\
    snprintf(ko_error, sizeof ko_error, "%s: %s returned oneDNN status %d", ko_where, #call, (int)ko_status_); \\
    goto fail; } } while (0)
/* a memory descriptor from dims and element strides (the layout is in the strides) */
static dnnl_status_t ko_md(dnnl_memory_desc_t *md, int ndims, const dnnl_dim_t *dims, const dnnl_dim_t *strides) {
    return dnnl_memory_desc_create_with_strides(md, ndims, dims, dnnl_f32, strides);
}
"""

ELTWISE_ALG = {"relu": "dnnl_eltwise_relu", "clip": "dnnl_eltwise_clip", "hardswish": "dnnl_eltwise_hardswish",
                "hardsigmoid": "dnnl_eltwise_hardsigmoid", "logistic": "dnnl_eltwise_logistic",
                "swish": "dnnl_eltwise_swish", "gelu_erf": "dnnl_eltwise_gelu_erf",
                "gelu_tanh": "dnnl_eltwise_gelu_tanh", "tanh": "dnnl_eltwise_tanh", "exp": "dnnl_eltwise_exp",
                "abs": "dnnl_eltwise_abs", "square": "dnnl_eltwise_square", "elu": "dnnl_eltwise_elu",
                "soft_relu": "dnnl_eltwise_soft_relu", "mish": "dnnl_eltwise_mish",
                "linear": "dnnl_eltwise_linear", "pow": "dnnl_eltwise_pow"}  # fmt: skip
# swish's alpha is the sigmoid's slope (1 for SiLU); soft_relu's alpha too
DEFAULT_ALPHA = {"swish": 1.0, "soft_relu": 1.0}


# oneDNN's kernels clamp with max/min in these post-ops, which turns NaN into a number where onnxruntime's Clip,
# HardSigmoid and Sigmoid keep NaN (measured: clip and hardsigmoid on conv and matmul calls, logistic on an NCHW
# conv): such a call is declined and the BLP fuses the op elsewhere (kernorch's own convolutions apply it in C,
# NaN kept). epilogue_test.py runs every activation on NaN and infinities.
NAN_TO_BOUND = ("clip", "hardsigmoid", "logistic")


def onednn_rejection(call: LibraryCall) -> str | None:
    """Why oneDNN does not run `call` (None when it does): a post-op that would lose NaN, int8 sums it does not add
    exactly on this CPU, or a post-op operand only oneDNN's reference kernels take (asked of oneDNN: the probe
    below)."""
    for op, _ in call.post_ops:
        if isinstance(op, Eltwise) and op.alg in NAN_TO_BOUND:
            return f"oneDNN's {op.alg} post-op turns NaN into a bound (onnxruntime keeps NaN)"
    if call.precision == "int8" and not machine.int8_dot_products():
        inexact = inexact_without_vnni(call.src.dtype, call.widest_weight)
        if inexact:
            return f"{inexact} on a CPU without VNNI: oneDNN's int8 sums are not exact there"
    return reference_rejection(call)


def inexact_without_vnni(source: str, widest_weight: int) -> str:
    """Why oneDNN's int8 convolution of `source` bytes by weights up to `widest_weight` in magnitude is not exact on
    a CPU without VNNI ("" when it is): a signed source is shifted into unsigned bytes and its weights halved
    (rounded: an odd weight loses its last bit, seen on Zen 3); an unsigned one saturates a pair of products beyond
    7-bit weights."""
    if source != "uint8":
        return f"a {source} source (oneDNN halves its weights)"
    return f"weights up to {widest_weight} (a pair of products beyond int16)" \
        if widest_weight > machine.SATURATION_FREE_WEIGHT else ""  # fmt: skip


def as_onednn(op: Eltwise | Binary) -> list[Eltwise | Binary]:
    """The oneDNN post-ops computing `op` as onnxruntime does, NaN included. oneDNN's relu (slope 0) is a max,
    which turns NaN into 0; elu with α = 0 is the same function (its negative side is 0·(eˣ − 1) = −0) and keeps
    NaN (NaN·0), and adding +0 turns its −0 into relu's +0."""
    if isinstance(op, Eltwise) and op.alg == "relu" and op.alpha == 0.0:
        return [Eltwise("elu", 0.0), Eltwise("linear", 1.0, 0.0)]
    return [op]


def _post_op_positions(call: LibraryCall) -> list[int]:
    """For each of the call's post-ops, its position among the post-ops oneDNN runs (`as_onednn` may expand)."""
    positions, position = [], 0
    for op, _ in call.post_ops:
        positions.append(position)
        position += len(as_onednn(op))
    return positions


# oneDNN's data type and C's element type of each dtype a call's buffers may hold
DNNL_TYPES = {"float32": "dnnl_f32", "bfloat16": "dnnl_bf16", "int8": "dnnl_s8", "uint8": "dnnl_u8",
              "int32": "dnnl_s32"}  # fmt: skip
C_ELEMENTS = {"float32": "float", "bfloat16": "uint16_t", "int8": "int8_t", "uint8": "uint8_t", "int32": "int32_t"}


def pointer_of(tensor: Tensor) -> str:
    """The tensor's first element: its argument, or an offset into it (a strided view of a slice or split)."""
    element = C_ELEMENTS[tensor.dtype]
    return f"({element} *)a[{tensor.slot}] + {tensor.offset}" if tensor.offset else f"a[{tensor.slot}]"


def _array(name: str, values: tuple[int, ...]) -> str:
    return f"const dnnl_dim_t {name}[] = {{{', '.join(str(v) for v in values) or '0'}}};"


def padded_pitch(rows: int, columns: int) -> int | None:
    """The row pitch (elements) kernorch gives a constant matmul weight that oneDNN keeps in a plain layout, or
    None to keep it dense. oneDNN 3.2's plain-layout sgemm (what it runs without AVX-512) slows 1.5-2x when
    the weights' rows are a multiple of 64 bytes apart (measured on Zen 3, 2 threads: [128,384]x[384,1536]
    1355 -> 870 us, [128,256]x[256,1024] 831 -> 445 us with 16 more floats per row; no shape of the shared
    models got slower): rows 64 bytes further apart no longer collide in the same cache sets while it
    packs them. A matrix-vector product (few rows) reads each weight once either way: kept dense."""
    return columns + 16 if rows >= 32 and columns >= 128 and columns % 16 == 0 else None


def _padded_weights(w: CWriter, call: LibraryCall, pitch: int, bias_md: str) -> None:
    """C that re-creates the matmul primitive with weights rows `pitch` elements apart when oneDNN chose the
    dense plain layout for them (it packs them itself otherwise, e.g. blocked for brgemm on AVX-512); the
    reorder below then packs the weights into that padded layout once."""
    dims = call.weights.dims
    padded = row_major((*dims[:-1], pitch))  # rows `pitch` apart; a batch of K rows K * pitch apart
    w.line(_array("s_dense", row_major(dims)), _array("s_padded", padded),
           f"KO_CHECK(ko_md(&md_dense, {len(dims)}, d1, s_dense));")
    with w.block("if (dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), md_dense))"):
        w.line("dnnl_primitive_desc_t padded_pd = NULL;", f"KO_CHECK(ko_md(&md_padded, {len(dims)}, d1, s_padded));")
        with w.block(f"if (dnnl_matmul_primitive_desc_create(&padded_pd, engine, md[0], md_padded, {bias_md}, md[2], "
                     "attr) == dnnl_success)"):  # fmt: skip
            w.line("dnnl_primitive_desc_destroy(pd);", "pd = padded_pd;")


def _dense_like(tensor: Tensor) -> tuple[int, ...]:
    """Dense strides with the axes in the order `tensor`'s strides put them (a transposed or channels-last operand
    keeps its order, so converting it is one pass in memory order; a slice's gaps close)."""
    order = sorted(range(len(tensor.dims)), key=lambda axis: (-tensor.strides[axis], axis))
    strides = [0] * len(tensor.dims)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= max(tensor.dims[axis], 1)
    return tuple(strides)


def scales_mask(call: LibraryCall) -> int:
    """oneDNN's mask of the weights' scales: 0 per tensor; per output channel, the weights' channel dims (a grouped
    convolution's weights are (G, O/G, ...): both; a matmul's [..., K, N]: the last)."""
    assert call.scales is not None
    if call.scales.dims == (1,):
        return 0
    if call.op == "matmul":
        return 1 << (len(call.weights.dims) - 1)
    return 3 if len(call.weights.dims) == len(call.dst.dims) + 1 else 1


def converted_operands(call: LibraryCall) -> tuple[int, ...]:
    """A bf16 call's float32 operands (0 source, 1 weights) converted to bfloat16 on every run, into buffers of
    its own: a source, and weights not known when the plan is created (constant ones are converted once, as
    they are packed). An operand its producer stored as bfloat16 is read as it is (kernorch/precision/)."""
    if call.precision != "bf16":
        return ()
    return tuple(i for i, tensor in enumerate((call.src, call.weights))
                 if tensor.dtype == "float32" and not (i == 1 and tensor.constant))  # fmt: skip


def repacked_weights(call: LibraryCall) -> bool:
    """Whether the call's weights, not known when the plan is created, are reordered into the layout oneDNN chooses
    on every run. A convolution given plain weights runs oneDNN 3.2's reference kernel (`ref:any`): a 144 -> 24 1x1
    convolution on 56x56 took 55 ms against 0.15 ms with packed weights; the reorder costs a pass over the weights.
    A matmul packs plain weights itself, at full speed (measured within 3 %)."""
    return call.op in ("convolution", "deconvolution") and not call.weights.constant


def render_onednn_call(name: str, call: LibraryCall) -> str:
    """C for one oneDNN call: a state struct and `<name>_create/_run/_destroy` (the shape every library-call
    backend renders: codegen/backends/library_calls.py)."""
    memories: list[tuple[str, Tensor, bool]] = [("DNNL_ARG_SRC", call.src, False),
                                                ("DNNL_ARG_WEIGHTS", call.weights, call.weights.constant),
                                                ("DNNL_ARG_DST", call.dst, False)]  # fmt: skip
    if call.bias is not None:
        memories.append(("DNNL_ARG_BIAS", call.bias, False))
    for position, (_, tensor) in zip(_post_op_positions(call), call.post_ops, strict=True):
        if tensor is not None:
            memories.append((f"DNNL_ARG_ATTR_MULTIPLE_POST_OP({position}) | DNNL_ARG_SRC_1", tensor, False))
    if call.scales is not None:
        memories.append(("DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS", call.scales, False))
    if call.dst_scale is not None:
        memories.append(("DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST", call.dst_scale, False))
    # oneDNN reads a zero point as an int32: the state's, set from the kernel's scalar on every run
    zeros: dict[int, tuple[str, Tensor]] = {}  # memory index -> (the state's field, the scalar it is set from)
    for field_name, argument, zero in (("zero", "DNNL_ARG_SRC", call.src_zero), ("dst_zero", "DNNL_ARG_DST",
                                                                                  call.dst_zero)):  # fmt: skip
        if zero is not None:
            zeros[len(memories)] = (field_name, zero)
            memories.append((f"DNNL_ARG_ATTR_ZERO_POINTS | {argument}", replace(zero, dtype="int32"), False))
    count = len(memories) + 1  # + scratchpad
    assert len(memories) <= 16, "more memories than the descriptor array holds"
    converted = converted_operands(call)
    repacked = repacked_weights(call)
    # reordered from the plan's buffer into memory of the call's own on every run: a bfloat16 conversion (md_bf),
    # or weights repacked into the layout the primitive chose
    per_run = tuple(sorted({*converted, *([1] if repacked else [])}))
    element = {"bf16": "dnnl_bf16", "int8": "dnnl_s8"}.get(call.precision, "dnnl_f32")  # what it multiplies
    # an operand reordered per run: cvt[j] reorders the plan's buffer (cvt_from[j]) into mem[i], owned
    w = CWriter()
    w.line(f"typedef struct {{ dnnl_primitive_t prim; dnnl_memory_t mem[{count}]; dnnl_exec_arg_t args[{count}]; "
           "dnnl_primitive_t cvt[2]; dnnl_memory_t cvt_from[2]; dnnl_exec_arg_t cvt_args[2][2]; "
           f"{''.join(f'int32_t {field_name}; ' for field_name, _ in zeros.values())}}} {name}_state;")  # fmt: skip
    with w.function(f"static void {name}_destroy(void *state)", returns=None):
        w.line(f"{name}_state *s = ({name}_state *)state;", "if (!s) return;",
               f"for (int i = 0; i < {count}; i++) if (s->mem[i]) dnnl_memory_destroy(s->mem[i]);")
        with w.block("for (int j = 0; j < 2; j++)"):
            w.line("if (s->cvt[j]) dnnl_primitive_destroy(s->cvt[j]);",
                   "if (s->cvt_from[j]) dnnl_memory_destroy(s->cvt_from[j]);")
        w.line("if (s->prim) dnnl_primitive_destroy(s->prim);", "free(s);")
    with w.function(f"static void *{name}_create(dnnl_engine_t engine, dnnl_stream_t stream, void **a)", returns="s"):
        _create_body(w, name, call, memories, converted, repacked, per_run, element, zeros)
    with w.function(f"static int {name}_run(void *state, dnnl_stream_t stream, void **a)", returns=None):
        w.line(f"{name}_state *s = ({name}_state *)state;")
        for field_name, zero in zeros.values():  # a float32 dst zero point holds an integer: converted exactly
            w.line(f"s->{field_name} = (int32_t)*(const {C_ELEMENTS[zero.dtype]} *)a[{zero.slot}];")
        for i, (_, tensor, packed) in enumerate(memories):
            if i in zeros:  # the state's int32, set above
                continue
            if i in per_run:
                j = per_run.index(i)
                w.line(f"if (dnnl_memory_set_data_handle(s->cvt_from[{j}], {pointer_of(tensor)}) != dnnl_success) "
                       "return 1;",
                       f"if (dnnl_primitive_execute(s->cvt[{j}], stream, 2, s->cvt_args[{j}]) != dnnl_success) "
                       "return 1;")  # fmt: skip
            elif not packed:
                w.line(f"if (dnnl_memory_set_data_handle(s->mem[{i}], {pointer_of(tensor)}) != dnnl_success) return 1;")
        w.line(f"return dnnl_primitive_execute(s->prim, stream, {count}, s->args) != dnnl_success;")
    return w.text(end="\n")


def _create_body(w: CWriter, name: str, call: LibraryCall, memories: list[tuple[str, Tensor, bool]],
                 converted: tuple[int, ...], repacked: bool, per_run: tuple[int, ...], element: str,
                 zeros: dict[int, tuple[str, Tensor]]) -> None:  # fmt: skip
    """`<name>_create`'s body up to `return s;`: the memory descriptors, the primitive with its post-ops, the weights
    packed once, the per-run conversions, the memories and arguments, and on any failure everything released."""
    w.line(f'static const char ko_where[] = "{name}";',
           f"{name}_state *s = ({name}_state *)calloc(1, sizeof({name}_state));",
           "dnnl_memory_desc_t md[16] = {0}, md_bf[2] = {0};",
           "dnnl_memory_desc_t md_any = NULL, md_dense = NULL, md_padded = NULL;",
           "dnnl_primitive_attr_t attr = NULL;",
           "dnnl_post_ops_t ops = NULL;",
           "dnnl_primitive_desc_t pd = NULL, reorder_pd = NULL;",
           "dnnl_primitive_t reorder = NULL;",
           "dnnl_memory_t user = NULL;",
           "int ok = 0;",
           'if (!s) { snprintf(ko_error, sizeof ko_error, "%s: out of memory", ko_where); return NULL; }')  # fmt: skip
    for i, (_, tensor, _) in enumerate(memories):
        w.line(_array(f"d{i}", tensor.dims), _array(f"s{i}", tensor.strides))
        if tensor.dtype != "float32":  # bfloat16 stored so by its producer, read as it is; an int8 call's integers
            w.line(f"KO_CHECK(dnnl_memory_desc_create_with_strides(&md[{i}], {len(tensor.dims)}, d{i}, "
                   f"{DNNL_TYPES[tensor.dtype]}, s{i}));")  # fmt: skip
        else:
            w.line(f"KO_CHECK(ko_md(&md[{i}], {len(tensor.dims)}, d{i}, s{i}));")
    for i in converted:
        if i == 1 and repacked:  # converted by the repacking reorder
            continue
        tensor = memories[i][1]
        w.line(_array(f"sb{i}", _dense_like(tensor)),
               f"KO_CHECK(dnnl_memory_desc_create_with_strides(&md_bf[{i}], {len(tensor.dims)}, d{i}, "
               f"dnnl_bf16, sb{i}));")  # fmt: skip
    src_md = "md_bf[0]" if 0 in converted else "md[0]"
    weights_md = "md_bf[1]" if 1 in converted else "md[1]"
    if call.weights.constant or repacked:  # oneDNN chooses the packed layout (and type), packed below
        w.line(f"KO_CHECK(dnnl_memory_desc_create_with_tag(&md_any, {len(call.weights.dims)}, d1, {element}, "
               "dnnl_format_tag_any));")
        weights_md = "md_any"
    w.line("KO_CHECK(dnnl_primitive_attr_create(&attr));",
           "KO_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));",
           "KO_CHECK(dnnl_post_ops_create(&ops));")  # fmt: skip
    if call.scales is not None:
        w.line(f"KO_CHECK(dnnl_primitive_attr_set_scales_mask(attr, DNNL_ARG_WEIGHTS, {scales_mask(call)}));")
    if call.src_zero is not None:
        w.line("KO_CHECK(dnnl_primitive_attr_set_zero_points_mask(attr, DNNL_ARG_SRC, 0));")
    if call.dst_scale is not None:
        w.line("KO_CHECK(dnnl_primitive_attr_set_scales_mask(attr, DNNL_ARG_DST, 0));")
    if call.dst_zero is not None:
        w.line("KO_CHECK(dnnl_primitive_attr_set_zero_points_mask(attr, DNNL_ARG_DST, 0));")
    binary_index = 3 + (call.bias is not None)
    for op in (expanded for given, _ in call.post_ops for expanded in as_onednn(given)):
        if isinstance(op, Eltwise):
            alpha = c_literal(op.alpha or DEFAULT_ALPHA.get(op.alg, 0.0), "float32")
            beta = c_literal(op.beta, "float32")
            w.line(f"KO_CHECK(dnnl_post_ops_append_eltwise(ops, {ELTWISE_ALG[op.alg]}, {alpha}, {beta}));")
        else:
            w.line(f"KO_CHECK(dnnl_post_ops_append_binary(ops, dnnl_binary_{op.alg}, md[{binary_index}]));")
            binary_index += 1
    w.line("KO_CHECK(dnnl_primitive_attr_set_post_ops(attr, ops));")
    bias_md = "md[3]" if call.bias is not None else "NULL"
    if call.op == "matmul":
        w.line(f"KO_CHECK(dnnl_matmul_primitive_desc_create(&pd, engine, {src_md}, {weights_md}, {bias_md}, "
               "md[2], attr));")  # fmt: skip
    else:
        w.line(_array("strides", call.strides), _array("dilates", call.dilates),
               _array("pad_l", call.pad_begin), _array("pad_r", call.pad_end))  # fmt: skip
        function = "dnnl_convolution_forward_primitive_desc_create" if call.op == "convolution" else \
            "dnnl_deconvolution_forward_primitive_desc_create"  # fmt: skip
        algorithm = "dnnl_convolution_direct" if call.op == "convolution" else "dnnl_deconvolution_direct"
        w.line(f"KO_CHECK({function}(&pd, engine, dnnl_forward_inference, {algorithm}, {src_md}, "
               f"{weights_md}, {bias_md}, md[2], strides, dilates, pad_l, pad_r, attr));")  # fmt: skip
    # the padded pitch is for float32 weights oneDNN keeps plain (no AVX-512); bf16 weights are always packed
    pitch = padded_pitch(call.src.dims[-2], call.weights.dims[-1]) \
        if call.op == "matmul" and call.precision == "f32" else None  # fmt: skip
    if call.weights.constant and pitch is not None:
        _padded_weights(w, call, pitch, bias_md)
    w.line("KO_CHECK(dnnl_primitive_create(&s->prim, pd));")
    # weights: constant ones are reordered once into the layout the primitive chose
    if call.weights.constant:
        with w.block(""):
            w.line("const_dnnl_memory_desc_t chosen = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);",
                   f"KO_CHECK(dnnl_memory_create(&user, md[1], engine, {pointer_of(call.weights)}));")
            with w.block("if (dnnl_memory_desc_equal(chosen, md[1]))", end="} else {"):
                w.line("s->mem[1] = user; user = NULL;")
            with w.indented():
                w.line("KO_CHECK(dnnl_memory_create(&s->mem[1], chosen, engine, DNNL_MEMORY_ALLOCATE));",
                       "KO_CHECK(dnnl_reorder_primitive_desc_create(&reorder_pd, md[1], engine, chosen, engine, "
                       "NULL));",
                       "KO_CHECK(dnnl_primitive_create(&reorder, reorder_pd));",
                       "dnnl_exec_arg_t pack[2] = {{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, s->mem[1]}};",
                       "KO_CHECK(dnnl_primitive_execute(reorder, stream, 2, pack));",
                       "KO_CHECK(dnnl_stream_wait(stream));")  # fmt: skip
            w.line("}")
    for i, (_, _, packed) in enumerate(memories):
        if i in per_run:  # its copy, owned; the plan's buffer is read by the reorder on every run
            j = per_run.index(i)
            target = "dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0)" if i == 1 and repacked \
                else f"md_bf[{i}]"  # fmt: skip
            w.line(f"KO_CHECK(dnnl_memory_create(&s->mem[{i}], {target}, engine, DNNL_MEMORY_ALLOCATE));",
                   f"KO_CHECK(dnnl_memory_create(&s->cvt_from[{j}], md[{i}], engine, DNNL_MEMORY_NONE));",
                   f"KO_CHECK(dnnl_reorder_primitive_desc_create(&reorder_pd, md[{i}], engine, {target}, "
                   "engine, NULL));",
                   f"KO_CHECK(dnnl_primitive_create(&s->cvt[{j}], reorder_pd));",
                   "dnnl_primitive_desc_destroy(reorder_pd); reorder_pd = NULL;",
                   f"s->cvt_args[{j}][0].arg = DNNL_ARG_FROM; s->cvt_args[{j}][0].memory = s->cvt_from[{j}];",
                   f"s->cvt_args[{j}][1].arg = DNNL_ARG_TO; s->cvt_args[{j}][1].memory = s->mem[{i}];")  # fmt: skip
        elif i in zeros:
            w.line(f"KO_CHECK(dnnl_memory_create(&s->mem[{i}], md[{i}], engine, &s->{zeros[i][0]}));")
        elif not packed:  # pointed at the plan's buffer on every run
            w.line(f"KO_CHECK(dnnl_memory_create(&s->mem[{i}], md[{i}], engine, DNNL_MEMORY_NONE));")
    scratch = len(memories)
    w.line(f"KO_CHECK(dnnl_memory_create(&s->mem[{scratch}], "
           "dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0), engine, DNNL_MEMORY_ALLOCATE));")
    for i, (argument, _, _) in enumerate(memories):
        w.line(f"s->args[{i}].arg = {argument}; s->args[{i}].memory = s->mem[{i}];")
    w.line(f"s->args[{scratch}].arg = DNNL_ARG_SCRATCHPAD; s->args[{scratch}].memory = s->mem[{scratch}];", "ok = 1;")
    w.verbatim("fail:")  # KO_CHECK jumps here
    w.line("for (int i = 0; i < 16; i++) if (md[i]) dnnl_memory_desc_destroy(md[i]);",
           "for (int i = 0; i < 2; i++) if (md_bf[i]) dnnl_memory_desc_destroy(md_bf[i]);",
           "if (md_any) dnnl_memory_desc_destroy(md_any);",
           "if (md_dense) dnnl_memory_desc_destroy(md_dense);",
           "if (md_padded) dnnl_memory_desc_destroy(md_padded);",
           "if (user) dnnl_memory_destroy(user);",
           "if (reorder) dnnl_primitive_destroy(reorder);",
           "if (reorder_pd) dnnl_primitive_desc_destroy(reorder_pd);",
           "if (pd) dnnl_primitive_desc_destroy(pd);",
           "if (ops) dnnl_post_ops_destroy(ops);",
           "if (attr) dnnl_primitive_attr_destroy(attr);",
           f"if (!ok) {{ {name}_destroy(s); return NULL; }}")  # fmt: skip

# ---- the probe: which implementation oneDNN picks for a matmul or convolution call ----
# Which implementation oneDNN picks for a matmul or convolution call, asked in this process through its C API
# before the call is planned. oneDNN 3.2 falls back to its reference kernels — correct, but 100-10000x slower —
# for some broadcasts of a binary post-op's operand: a value per row on a 2-D matmul (mask 1), [1, H, W, 1] on a
# 4-D one (mask 6), a relative-position bias [1, heads, 49, 49] added to swin's [windows, heads, 49, 49] scores
# (mask 14: 100 ms per call where the product alone takes ~0.1 ms); and for any tensor operand on a convolution
# in the plain NCHW layout (poolformer's 1x1 convs with their residual add: ~250 ms per call against ~0.05 ms).
# Profile costs measure that and avoid it; analytic costs cannot see it. A call oneDNN would run by its reference
# implementation is declined with that reason (onednn_rejection), so the orchestrator keeps the post-op out of the
# call, where a kernel of its own applies it.
#
# The probe builds the descriptors the rendered call builds (onednn.py: render_onednn_call) — memory descriptors
# with the call's dims, strides and types, constant weights in the layout oneDNN chooses, the post-ops — and asks
# the primitive descriptor's implementation name. Enum values are read from oneDNN's own headers. Where oneDNN is
# missing or a descriptor cannot be created, the probe says nothing (the call is then refused or kept as before).

ONEDNN_HEADER = "oneapi/dnnl/dnnl.h"


@cache
def onednn_root() -> tuple[Path, Path] | None:
    """(include dir, lib dir) of oneDNN: $KERNORCH_ONEDNN_ROOT, else the onednn-*-cpu-gomp wheels' prefix; None
    when it is not installed."""
    roots = [Path(os.environ["KERNORCH_ONEDNN_ROOT"])] if os.environ.get("KERNORCH_ONEDNN_ROOT") else []
    roots += [Path(sys.prefix), Path(sys.base_prefix), Path("/usr/local"), Path("/usr")]
    for root in roots:
        include, lib = root / "include", root / "lib"
        if (include / ONEDNN_HEADER).is_file() and any(lib.glob("libdnnl.so*")):
            return include, lib
    return None


_HEADERS = ("oneapi/dnnl/dnnl_common_types.h", "oneapi/dnnl/dnnl_types.h")
_ENUM = re.compile(r"typedef enum\s*(?:\w+\s*)?\{(.*?)\}\s*\w+\s*;", re.S)
_ENUMERATOR = re.compile(r"^\s*(dnnl_\w+)\s*(?:=\s*([^,/\n]+?))?\s*,?\s*(?://.*)?$")


@cache
def _enums(include: Path) -> dict[str, int]:
    """Every dnnl_* enumerator of oneDNN's C headers and its value (implicit ones counted on from the last)."""
    values: dict[str, int] = {}
    for header in _HEADERS:
        text = re.sub(r"/\*.*?\*/", "", (include / header).read_text(), flags=re.S)
        for body in _ENUM.findall(text):
            following: int | None = 0
            for line in body.splitlines():
                found = _ENUMERATOR.match(line.split("///")[0])
                if not found:
                    continue
                name, given = found.groups()
                if given is not None:
                    given = given.strip()
                    try:
                        following = values[given] if given in values else int(given, 0)
                    except ValueError:  # an expression: this one and those counted from it stay unknown
                        following = None
                if following is not None:
                    values[name] = following
                    following += 1
    return values


# DNNL_ARG_SRC, DNNL_ARG_DST and DNNL_ARG_WEIGHTS: #defines of dnnl_types.h (not enumerators the header reader
# finds), part of oneDNN's stable C ABI
ARG_SRC, ARG_DST, ARG_WEIGHTS = 1, 17, 33


class _Api:
    """libdnnl through ctypes: one CPU engine, the enum values."""

    def __init__(self) -> None:
        found = onednn_root()
        if found is None:
            raise OSError("oneDNN is not installed")
        include, lib = found
        self.enum = _enums(include)
        self.dnnl = ctypes.CDLL(str(sorted(lib.glob("libdnnl.so*"))[0]))
        # the arguments ctypes would not pass right by default: floats, and an int before a pointer
        self.dnnl.dnnl_post_ops_append_eltwise.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_float,
                                                            ctypes.c_float]  # fmt: skip
        self.dnnl.dnnl_primitive_desc_query.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        self.engine = ctypes.c_void_p()
        self.check(self.dnnl.dnnl_engine_create(ctypes.byref(self.engine), self.enum["dnnl_cpu"], 0))

    @staticmethod
    def check(status: int) -> None:
        if status != 0:
            raise OSError(f"oneDNN status {status}")

    def memory(self, dims: tuple[int, ...], dtype: str, strides: tuple[int, ...] | None) -> ctypes.c_void_p:
        md = ctypes.c_void_p()
        array = ctypes.c_int64 * 12
        kind = self.enum[DNNL_TYPES[dtype]]
        if strides is None:  # the layout oneDNN chooses (constant weights)
            self.check(self.dnnl.dnnl_memory_desc_create_with_tag(ctypes.byref(md), len(dims), array(*dims), kind,
                                                                  self.enum["dnnl_format_tag_any"]))  # fmt: skip
        else:
            self.check(self.dnnl.dnnl_memory_desc_create_with_strides(ctypes.byref(md), len(dims), array(*dims), kind,
                                                                      array(*strides)))  # fmt: skip
        return md


@cache
def _api() -> _Api | None:
    try:
        return _Api()
    except (OSError, IndexError, KeyError):
        return None


def onednn_probe_available() -> bool:
    """Whether this process can ask oneDNN which implementation it picks."""
    return _api() is not None


def library_implementation(call: LibraryCall) -> str | None:
    """The name of the implementation oneDNN chooses for the matmul or convolution `call`, or None when it cannot be
    asked."""
    api = _api()
    if api is None or call.op not in ("matmul", "convolution"):
        return None

    def described(tensor: Tensor) -> Tensor:  # where the buffer is does not choose the implementation
        return replace(tensor, slot=0, offset=0)

    return _implementation(api, replace(call, src=described(call.src), weights=described(call.weights),
                                        dst=described(call.dst), epilogue=None,
                                        scales=None if call.scales is None else described(call.scales),
                                        src_zero=None if call.src_zero is None else described(call.src_zero),
                                        dst_scale=None if call.dst_scale is None else described(call.dst_scale),
                                        dst_zero=None if call.dst_zero is None else described(call.dst_zero),
                                        bias=None if call.bias is None else described(call.bias),
                                        post_ops=tuple((op, None if t is None else described(t))
                                                       for op, t in call.post_ops)))  # fmt: skip


@cache
def _implementation(api: _Api, call: LibraryCall) -> str | None:
    converted = converted_operands(call)
    multiplied = {"bf16": "bfloat16", "int8": "int8"}.get(call.precision, "float32")
    created: list[ctypes.c_void_p] = []
    attr, ops, pd = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    dnnl = api.dnnl
    try:
        def memory(tensor: Tensor, index: int) -> ctypes.c_void_p:
            if index == 1 and (tensor.constant or repacked_weights(call)):
                md = api.memory(tensor.dims, multiplied, None)
            elif index in converted:
                md = api.memory(tensor.dims, "bfloat16", _dense_like(tensor))
            else:
                md = api.memory(tensor.dims, tensor.dtype, tensor.strides)
            created.append(md)
            return md

        src, weights, dst = memory(call.src, 0), memory(call.weights, 1), memory(call.dst, 2)
        bias = memory(call.bias, 3) if call.bias is not None else ctypes.c_void_p()
        api.check(dnnl.dnnl_primitive_attr_create(ctypes.byref(attr)))
        api.check(dnnl.dnnl_post_ops_create(ctypes.byref(ops)))
        for given, operand in call.post_ops:
            for op in as_onednn(given):
                if isinstance(op, Eltwise):
                    alpha = op.alpha or DEFAULT_ALPHA.get(op.alg, 0.0)
                    api.check(dnnl.dnnl_post_ops_append_eltwise(ops, api.enum[ELTWISE_ALG[op.alg]], alpha, op.beta))
                else:
                    assert isinstance(op, Binary) and operand is not None
                    api.check(dnnl.dnnl_post_ops_append_binary(ops, api.enum[f"dnnl_binary_{op.alg}"],
                                                               memory(operand, 4)))  # fmt: skip
        api.check(dnnl.dnnl_primitive_attr_set_post_ops(attr, ops))
        if call.scales is not None:
            api.check(dnnl.dnnl_primitive_attr_set_scales_mask(attr, ARG_WEIGHTS,
                                                               scales_mask(call)))  # fmt: skip
        if call.src_zero is not None:
            api.check(dnnl.dnnl_primitive_attr_set_zero_points_mask(attr, ARG_SRC, 0))
        if call.dst_scale is not None:
            api.check(dnnl.dnnl_primitive_attr_set_scales_mask(attr, ARG_DST, 0))
        if call.dst_zero is not None:
            api.check(dnnl.dnnl_primitive_attr_set_zero_points_mask(attr, ARG_DST, 0))
        if call.op == "matmul":
            status = dnnl.dnnl_matmul_primitive_desc_create(ctypes.byref(pd), api.engine, src, weights, bias, dst,
                                                            attr)  # fmt: skip
        else:
            geometry = [(ctypes.c_int64 * 12)(*values) for values in (call.strides, call.dilates, call.pad_begin,
                                                                      call.pad_end)]  # fmt: skip
            status = dnnl.dnnl_convolution_forward_primitive_desc_create(
                ctypes.byref(pd), api.engine, api.enum["dnnl_forward_inference"], api.enum["dnnl_convolution_direct"],
                src, weights, bias, dst, *geometry, attr)  # fmt: skip
        if status != 0:
            return None
        name = ctypes.c_char_p()
        api.check(dnnl.dnnl_primitive_desc_query(pd, api.enum["dnnl_query_impl_info_str"], 0, ctypes.byref(name)))
        return (name.value or b"").decode()
    except (OSError, KeyError):
        return None
    finally:
        if pd:
            dnnl.dnnl_primitive_desc_destroy(pd)
        if ops:
            dnnl.dnnl_post_ops_destroy(ops)
        if attr:
            dnnl.dnnl_primitive_attr_destroy(attr)
        for md in created:
            dnnl.dnnl_memory_desc_destroy(md)


def reference_rejection(call: LibraryCall) -> str | None:
    """Why a matmul or convolution call with a binary post-op, or an int8 one, is declined: oneDNN would run it by
    its reference implementation."""
    if call.op not in ("matmul", "convolution") or \
            call.precision != "int8" and not any(operand is not None for _, operand in call.post_ops):  # fmt: skip
        return None
    implementation = library_implementation(call)
    if implementation is None or not implementation.startswith("ref"):
        return None
    if call.precision == "int8":
        return f"oneDNN runs this int8 {call.op} only by its reference implementation ({implementation})"
    masks = [t.dims for _, t in call.post_ops if t is not None]
    return (f"oneDNN runs this {call.op} ({'x'.join(map(str, call.src.dims))}) with post-op operands {masks} only "
            f"by its reference implementation ({implementation})")
