"""A direct convolution in generated C for the shape oneDNN handles worst: few output channels.

oneDNN vectorizes a convolution over output channels (16 per AVX-512 register). With 1–4 of them most of each
register is idle: candy's last conv (32 → 3 channels, 9x9, 224x224) runs at ~43 GFLOP/s in oneDNN's brgconv,
18.2 ms. Vectorized over input channels instead — a channels-last source holds them contiguously — a register
block of output pixels × output channels accumulates 16-lane partial sums, reduced once per output: 4.4 ms for
the same conv (both measured in one process here, 2 threads). Same `<name>_create/_run/_destroy` interface as
the oneDNN calls (library/onednn.py): the weights are repacked once at create into [OC][KH][KW][IC] and the bias is
copied; a run allocates nothing.
"""

from __future__ import annotations

from kernorch.codegen.backends.library_calls import LibraryCallBackend
from kernorch.codegen.c import CWriter
from kernorch.codegen.library import LibraryCall
from kernorch.codegen.native.skeleton import (
    VECTOR_TYPES,
    aligned_size,
    create_function,
    run_function,
    weights_pointer,
)

VECTOR = 16  # input channels must come in multiples of this: an AVX-512 register, two AVX2 ones
MAX_OUTPUT_CHANNELS = 4
# The vector width and the register budget are the compiler's (-march=native): the same source, so a plan saved
# on one CPU regenerates identically on another. AVX-512 has 32 registers (24 accumulators, the rest hold the
# weights and the loaded source); AVX2 has 16 of half the width (12 accumulators). With AVX-512's blocking on
# AVX2, every 16-lane accumulator took two registers and spilled: candy's last conv ran in 61 ms.


def direct_conv_rejection(call: LibraryCall) -> str | None:
    """Why the direct kernel does not run `call` (None when it does)."""
    if call.op != "convolution" or len(call.src.dims) != 4 or len(call.weights.dims) != 4:
        return "not a 2-d convolution without groups"
    if call.post_ops:
        return "post-ops run in oneDNN"
    out_channels, in_channels = call.weights.dims[0], call.weights.dims[1]
    if out_channels > MAX_OUTPUT_CHANNELS:
        return f"{out_channels} output channels fill oneDNN's vectors"
    if in_channels % VECTOR or call.src.strides[1] != 1:
        return "input channels are not contiguous in multiples of 16"
    if any(call.pad_begin) or any(call.pad_end):
        return "padded"  # candy pads explicitly (reflection), so its convs have none
    return None


def render_direct_conv(name: str, call: LibraryCall) -> str:
    """C for `call` (which `direct_conv_rejection` accepted): state, create, run, destroy."""
    _, in_channels, _, _ = call.src.dims
    out_channels, _, kernel_h, kernel_w = call.weights.dims
    _, _, out_h, out_w = call.dst.dims
    src_n, _, src_y, src_x = call.src.strides
    dst_n, dst_c, dst_y, dst_x = call.dst.strides
    w_o, w_i, w_y, w_x = call.weights.strides
    stride_y, stride_x = call.strides
    dilate_y, dilate_x = (d + 1 for d in call.dilates)
    block = f"{name}_block"  # output pixels per register block: a C constant, from the register budget
    packed = out_channels * kernel_h * kernel_w * in_channels
    bias = f"(const float *)a[{call.bias.slot}]" if call.bias is not None else "NULL"

    def body(pixels: int | str) -> None:
        """Accumulate `pixels` (a count or a C constant) outputs from x0 on, all output channels, then reduce and
        store them."""
        w.line(f"ko_vc acc[{pixels}][{out_channels}];",
               f"for (int i = 0; i < {pixels}; i++) for (int o = 0; o < {out_channels}; o++) acc[i][o] = (ko_vc){{0}};")
        with w.block(f"for (int ky = 0; ky < {kernel_h}; ky++) for (int kx = 0; kx < {kernel_w}; kx++)"):
            w.line(f"const float *at = in + (long)(y * {stride_y} + ky * {dilate_y}) * {src_y} + "
                   f"(long)(x0 * {stride_x} + kx * {dilate_x}) * {src_x};",
                   f"const float *tap = s->w + (ky * {kernel_w} + kx) * {in_channels};")  # fmt: skip
            with w.block(f"for (int c = 0; c < {in_channels}; c += KO_VC_LANES)"):
                w.line(f"ko_vc w[{out_channels}];",
                       f"for (int o = 0; o < {out_channels}; o++) "
                       f"w[o] = *(const ko_vc *)(tap + o * {kernel_h * kernel_w * in_channels} + c);")  # fmt: skip
                with w.block(f"for (int i = 0; i < {pixels}; i++)"):
                    w.line(f"ko_vc v = *(const ko_vcu *)(at + (long)i * {stride_x * src_x} + c);",
                           f"for (int o = 0; o < {out_channels}; o++) acc[i][o] += v * w[o];")  # fmt: skip
        with w.block(f"for (int i = 0; i < {pixels}; i++) for (int o = 0; o < {out_channels}; o++)"):
            w.line("float sum = s->bias[o];",
                   "for (int l = 0; l < KO_VC_LANES; l++) sum += acc[i][o][l];",
                   f"out[(long)o * {dst_c} + (long)(x0 + i) * {dst_x}] = sum;")  # fmt: skip

    w = CWriter()
    w.line(VECTOR_TYPES,
           f"enum {{ {block} = KO_VC_ACCUMULATORS / {out_channels} < 8 ? KO_VC_ACCUMULATORS / {out_channels} : 8 }};")
    with create_function(w, name, f"float *w; float bias[{out_channels}];", ["w"],
                         [f"s->w = (float *)aligned_alloc(64, {aligned_size(packed * 4)});"]):  # fmt: skip
        w.line(f"const float *w = {weights_pointer(call)};")
        w.nest(f"for (int o = 0; o < {out_channels}; o++) for (int ky = 0; ky < {kernel_h}; ky++)",
               f"for (int kx = 0; kx < {kernel_w}; kx++) for (int c = 0; c < {in_channels}; c++)",
               f"s->w[((o * {kernel_h} + ky) * {kernel_w} + kx) * {in_channels} + c] = "
               f"w[(long)o * {w_o} + (long)c * {w_i} + (long)ky * {w_y} + (long)kx * {w_x}];")
        w.line(f"const float *bias = {bias};",
               f"for (int o = 0; o < {out_channels}; o++) s->bias[o] = bias ? bias[o] : 0.0f;")
    with run_function(w, name, call):
        w.line("#pragma omp parallel for schedule(static)")
        with w.block(f"for (long row = 0; row < {call.dst.dims[0] * out_h}L; row++)"):
            w.line(f"const long n = row / {out_h}, y = row % {out_h};", f"const float *in = src + n * {src_n};",
                   f"float *out = dst + n * {dst_n} + y * {dst_y};", "int x0 = 0;")
            with w.block(f"for (; x0 + {block} <= {out_w}; x0 += {block})"):
                body(block)
            with w.block(f"for (; x0 < {out_w}; x0++)"):
                body(1)
    return w.text(end="\n")


# few output channels: oneDNN's vectors would sit mostly idle
BACKEND = LibraryCallBackend("direct_conv", "native C", "direct C convolution (few output channels)",
                             direct_conv_rejection, render_direct_conv)  # fmt: skip
