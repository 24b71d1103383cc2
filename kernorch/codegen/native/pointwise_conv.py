"""A 1x1 convolution over few input channels in generated C, its transcendental epilogue applied in cache.

oneDNN runs a 1x1 convolution's eltwise post-ops inside its kernel, but the transcendental ones slowly:
efficientnet_b0's 16 → 96 expansion at 112x112 with swish took 738 µs in place (52 GFLOP/s) where its 1x1
convolutions without post-ops run at 130-170 GFLOP/s — and the plan paid a separate sigmoid-and-multiply pass
(~130 µs each) after the other expansions rather than fuse swish there (issue 43: "its swish post-op measured
2-3x the conv it is attached to"). With few input channels the product is cheap and the epilogue is the work.

Channels-last, a 1x1 stride-1 convolution is a product [pixels, K] x [K, N]. Each parallel item is a run of
PIXELS output pixels and one chunk of at most six vectors of output channels, whose packed weights ([K][N], N a
multiple of 16) stay in L1 across the run. A register block of ROWS pixels x that chunk accumulates from the bias
(ROWS x 6 accumulators: 24 with AVX-512, 12 with AVX2); each input channel is broadcast once per pixel and each
weight vector loaded once per block. The block is stored, then the post-ops (library/post_ops.py) run over it
while it is in L1, in a loop over channels that vectorizes (ko_sigmoidf and friends are the prelude's). A run
allocates nothing.

A bf16 plan's call (`precision="bf16"`) runs here too, with the same exact relu and the same epilogue in cache: its
operands rounded to bfloat16 — the weights when they are packed, the source as it is read (a source stored
bfloat16, by the kernel before, is read as it is: half the bytes) — and multiplied in float32, where the product
of two bfloat16 values is exact, so the sums are those of oneDNN's bf16 kernels up to their order. oneDNN runs a
bf16 1x1 convolution's relu as elu(0) + linear, an exp per output, which over few input channels is most of its
work: RegNetY-400MF's 32 -> 48 at 112x112 took 241 µs in place against OpenVINO's 134 (AMD Zen 4). The
binary post-ops' operands stay float32; a destination stored bfloat16 (for the next bf16 product) is written from
a thread's tile of the run (on its stack, in L1) once the epilogue has run over it, rounded to nearest even.
"""

from __future__ import annotations

from kernorch.codegen.backends.library_calls import LibraryCallBackend
from kernorch.codegen.c import CWriter
from kernorch.codegen.library import (
    LibraryCall,
    binary_operands,
    post_op_loop,
    post_op_statements,
    post_ops_rejection,
)
from kernorch.codegen.native.skeleton import (
    VECTOR_TYPES,
    operand_rejection,
    packed_weights_state,
    run_function,
    slow_in_onednn,
    source_element,
    source_value,
    weight_value,
)

MAX_INPUT_CHANNELS = 64  # the chunk's weights (64 x 96 floats, 24 KB) and a run's source rows share L1
CHANNEL_MULTIPLE = 16  # output channels come in whole vectors of the widest ISA (AVX-512)
CHUNK_VECTORS = 6  # output-channel vectors per register block
PIXELS = 64  # output pixels per parallel item: a multiple of every ISA's ROWS (4 or 2)


def pointwise_rejection(call: LibraryCall) -> str | None:
    """Why the pointwise kernel does not run `call` (None when it does)."""
    if call.op != "convolution" or len(call.src.dims) != 4 or len(call.weights.dims) != 4:
        return "not a 2-d convolution without groups"
    out_channels, in_channels, kernel_h, kernel_w = call.weights.dims
    if (kernel_h, kernel_w) != (1, 1) or tuple(call.strides) != (1, 1) or any(call.pad_begin) or any(call.pad_end):
        return "not a 1x1 stride-1 convolution without padding"
    if not slow_in_onednn(call):
        return "no post-op oneDNN runs slowly: it runs the call at full speed"
    if any(t.dtype != "float32" for _, t in call.post_ops if t is not None):
        return "a bfloat16 post-op operand (this kernel adds float32)"
    if in_channels > MAX_INPUT_CHANNELS:
        return f"{in_channels} input channels: a chunk's weights would leave L1"
    if out_channels % CHANNEL_MULTIPLE:
        return f"{out_channels} output channels are no multiple of {CHANNEL_MULTIPLE}"
    operands = operand_rejection(call)
    if operands is not None:
        return operands
    _, _, _, width = call.src.dims
    if call.src.strides[2] != width * call.src.strides[3] or call.dst.strides[2] != width * call.dst.strides[3]:
        return "pixels are not evenly strided"
    return post_ops_rejection(call.post_ops)


def render_pointwise_conv(name: str, call: LibraryCall) -> str:
    """C for `call` (which `pointwise_rejection` accepted): state, create, run, destroy."""
    batch, in_channels, height, width = call.src.dims
    out_channels = call.weights.dims[0]
    src_n, _, _, src_x = call.src.strides
    dst_n, _, _, dst_x = call.dst.strides
    w_o, w_i, _, _ = call.weights.strides
    pixels = height * width
    runs = -(-pixels // PIXELS)
    pointers, operands = binary_operands(call.post_ops)
    epilogue = post_op_statements(call.post_ops, operands)
    block = f"{name}_block"
    element = source_element(call)
    # a bfloat16 destination: the blocks and the epilogue work on the run's float32 tile, then it is rounded out
    tiled = call.dst.dtype == "bfloat16"
    out_x = f"{name}_CHUNK" if tiled else f"{dst_x}L"

    def blocks(condition: str, rows: str) -> None:
        """Register blocks of `rows` pixels while `condition` holds, each dispatched on the chunk's vector count
        (a constant in every inlined call)."""
        with w.block(f"for (; {condition}; p += {rows})"):
            w.line(f"const {element} *in = src + n * {src_n}L + p * {src_x}L;",
                   f"float *out = tile + (p - p0) * {name}_CHUNK;" if tiled else
                   f"float *out = dst + n * {dst_n}L + p * {dst_x}L + c0;")  # fmt: skip
            with w.block("switch (vectors)"):
                w.extend(f"case {v}: {block}(in, wc, bc, out, {rows}, {v}); break;"
                         for v in range(1, CHUNK_VECTORS + 1))

    w = CWriter()
    w.line(VECTOR_TYPES,
           f"#define {name}_ROWS (KO_VC_ACCUMULATORS / {CHUNK_VECTORS})",
           f"#define {name}_CHUNK ({CHUNK_VECTORS} * KO_VC_LANES)  /* output channels per item */")
    with packed_weights_state(w, name, call, in_channels * out_channels):
        w.nest(f"for (int k = 0; k < {in_channels}; k++) for (int o = 0; o < {out_channels}; o++)",
               f"s->w[k * {out_channels} + o] = {weight_value(call, f'w[(long)o * {w_o} + (long)k * {w_i}]')};")
    # rows x vectors of one chunk; `rows` and `vectors` are constants at every call (always inlined)
    with w.function(f"static inline __attribute__((always_inline)) void {block}(const {element} *restrict in, "
                    "const float *restrict w, const float *restrict bias, float *restrict out, int rows, int vectors)",
                    returns=None):  # fmt: skip
        w.line(f"ko_vc acc[{name}_ROWS][{CHUNK_VECTORS}];")
        w.nest("for (int r = 0; r < rows; r++)",
               "for (int v = 0; v < vectors; v++) acc[r][v] = *(const ko_vc *)(bias + v * KO_VC_LANES);")
        with w.block(f"for (int k = 0; k < {in_channels}; k++)"):
            w.line(f"ko_vc wv[{CHUNK_VECTORS}];",
                   f"for (int v = 0; v < vectors; v++) wv[v] = *(const ko_vc *)(w + k * {out_channels} + "
                   "v * KO_VC_LANES);")  # fmt: skip
            with w.block("for (int r = 0; r < rows; r++)"):
                w.line(f"const float x = {source_value(call, f'in[r * {src_x}L + k]')};",
                       "for (int v = 0; v < vectors; v++) acc[r][v] += x * wv[v];")
        w.nest("for (int r = 0; r < rows; r++)", "for (int v = 0; v < vectors; v++)",
               f"*(ko_vcu *)(out + r * {out_x} + v * KO_VC_LANES) = acc[r][v];")
    with run_function(w, name, call):
        w.line(*pointers,
               f"const int chunks = ({out_channels} + {name}_CHUNK - 1) / {name}_CHUNK;",
               "#pragma omp parallel for schedule(static)")
        with w.block(f"for (long item = 0; item < {batch * runs}L * chunks; item++)"):
            w.line(f"const long n = item / ({runs}L * chunks), run = item / chunks % {runs};",
                   f"const int c0 = (int)(item % chunks) * {name}_CHUNK;",
                   f"const int vectors = ({out_channels} - c0 < {name}_CHUNK ? {out_channels} - c0 : {name}_CHUNK) "
                   "/ KO_VC_LANES;",
                   f"const long p0 = run * {PIXELS}, p1 = p0 + {PIXELS} < {pixels} ? p0 + {PIXELS} : {pixels};",
                   "const float *wc = s->w + c0, *bc = s->bias + c0;",
                   "long p = p0;")  # fmt: skip
            if tiled:
                w.line(f"float tile[{PIXELS} * {name}_CHUNK] __attribute__((aligned(64)));")
            blocks(f"p + {name}_ROWS <= p1", f"{name}_ROWS")  # whole register blocks
            blocks("p < p1", "1")  # then the run's last pixels one by one
            if epilogue or tiled:  # over the run's outputs of this chunk, still in L1
                with w.block("for (p = p0; p < p1; p++)"):
                    w.line(f"const long y = p / {width}, x = p % {width};",
                           "(void)y; (void)x;  /* read by binary post-ops' operands only */")
                    if tiled:  # o[c] is channel c's sum in the tile; d[c] its bfloat16 in the destination
                        w.line(f"float *o = tile + (p - p0) * {name}_CHUNK - c0;",
                               f"uint16_t *d = dst + n * {dst_n}L + p * {dst_x}L;")
                    else:
                        w.line(f"float *o = dst + n * {dst_n}L + p * {dst_x}L;")
                    post_op_loop(w, "o", "c0", "c0 + vectors * KO_VC_LANES",
                                 [*epilogue, *(["d[c] = ko_bf16_bits(v);"] if tiled else [])], simd=True)
    return w.text(end="\n")


# oneDNN runs a swish (or another transcendental) post-op at a fraction of its 1x1 convolution's speed
BACKEND = LibraryCallBackend("pointwise_conv", "native C", "1x1 C convolution with its epilogue in cache",
                             pointwise_rejection, render_pointwise_conv, precisions=("f32", "bf16"))  # fmt: skip
