"""A grouped convolution in generated C: channels-last, groups of 4, 8 or 16 output channels (RegNet's and
ResNeXt's group widths; a wider group as groups of 16 reading the same inputs), its epilogue in registers, on CPUs
without AVX-512.

oneDNN 3.2 runs such a conv on AVX2 as `jit:avx2` at 14-35 GFLOP/s, a tenth to a quarter of the FMA peak:
regnety_400mf's 3x3 conv of 6 groups of 8 channels at 112x112 -> 56x56 took 1.0-1.5 ms where onnxruntime's
NCHWc kernel takes 0.42 ms; its 55 groups at 7x7 ~0.12 ms each (Zen 3, 2 threads; bench/results, session 36). Each
group is a small dense conv whose weights (taps x input channels x output channels, 2.3 KB for 3x3 and 8 x 8)
stay in L1: an output pixel's group is one or two vectors of output channels, summed over the taps and the
group's input channels as broadcast input value times a vector of weights.

The kernel: each parallel item is one output row (n, y) and a chunk of groups (rows alone would leave a thread
idle on a 7x7 map). Inside the image, a block of output pixels accumulates in registers (`_block_size`: the
accumulators, a weight vector and the broadcast value within AVX2's 16), per tap and input channel one weight
load per output vector and one broadcast per pixel; the columns left after the full blocks are one shorter
block; pixels whose taps leave the image (padding) take a bounds-checked loop. The bias starts the sums; the
post-ops (library/post_ops.py) are applied to the accumulators before the store where each has a vector form
(relu, clip, a residual add), else run over the item's outputs while they are in L1 (swish) — relu among them,
which a oneDNN conv runs as a separate pass (native/skeleton.py's SLOW_POST_OPS). Weights are repacked once at create,
[group][tap][input channel][output channel]. A run allocates nothing.

A group of 32 (ResNeXt-50's last stage) is computed as two of 16, each half's weights (3x3 x 32 x 16, 18 KB) in L1:
its 7x7 conv with relu 271-331 µs against oneDNN's 278-367, the 14x14 -> 7x7 stride-2 one 270 against 293-361
(isolated; in place, two alternating rounds of bench/per_node.py were too noisy to separate the two).

A dense convolution is the same computation with every group reading every input channel: its output channels in
panels of 16 (or 8), taken where oneDNN would run its epilogue slowly (relu: elu(0) + linear, or a pass of its own)
and a panel's weights stay in L1 (MobileNetV4's 3x3 stride-2 32 -> 96 at 56x56 with relu: 340-362 µs, oneDNN's conv
+ relu 382-398, its conv alone 348-365). 1x1 stride-1 convolutions are the pointwise and panel kernels'.

On AVX-512 oneDNN's grouped kernel was not measured against this one, so the call stays with oneDNN there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernorch import machine
from kernorch.codegen.backends.library_calls import LibraryCallBackend
from kernorch.codegen.c import CWriter
from kernorch.codegen.library import (
    LibraryCall,
    binary_operands,
    post_op_loop,
    post_op_statements,
    post_ops_rejection,
    vector_epilogue,
)
from kernorch.codegen.native.skeleton import (
    AVX2_VECTOR_TYPES,
    ConvGeometry,
    operand_rejection,
    packed_weights_state,
    run_function,
    slow_in_onednn,
)

LANES = 8  # output channels per vector: an AVX2 register (half of one for groups of 4)
MAX_GROUP_VECTORS = 2  # vectors of output channels per group, at most: 16 channels
ACCUMULATORS = 12  # of AVX2's 16 registers; the rest hold a weight vector and the broadcast input
MIN_ITEMS = 32  # parallel items a call is cut into when rows allow
# A dense conv's panel reads its weights once per block of pixels: from L1 they keep up with the FMAs, from L2 not
# (3x3 over 128 channels, 144 KB a panel: 1.9 ms with relu where oneDNN's conv + relu took 1.4)
MAX_PANEL_BYTES = 24 << 10
WIDEST = LANES * MAX_GROUP_VECTORS  # output channels a group is computed in at most: wider groups are split


@dataclass(frozen=True)
class Grouping:
    """A convolution's output channels as groups this kernel computes one at a time: a grouped conv's own groups
    (a group wider than 16 channels as `splits` groups of 16 reading the same inputs: ResNeXt-50's last stage, 32
    channels a group), or a dense conv's panels of 16 (or 8) output channels, each of which reads every input
    channel."""

    groups: int  # as computed: the conv's groups times `splits`
    group_out: int
    group_in: int
    weight_strides: tuple[int, int, int, int, int]  # (the conv's group, output channel, input channel, row, column)
    input_step: int  # input channels from one of the conv's groups' first to the next one's: 0 in a dense conv
    splits: int = 1  # computed groups per group of the conv

    @staticmethod
    def of(call: LibraryCall) -> Grouping:
        if len(call.weights.dims) == 5:
            groups, group_out, group_in = call.weights.dims[:3]
            splits = group_out // WIDEST if group_out > WIDEST else 1
            return Grouping(groups * splits, group_out // splits, group_in, call.weights.strides,  # type: ignore[arg-type]
                            group_in, splits)  # fmt: skip
        out_channels, in_channels = call.weights.dims[:2]
        panel = LANES * MAX_GROUP_VECTORS if out_channels % (LANES * MAX_GROUP_VECTORS) == 0 else LANES
        w_o, w_i, w_y, w_x = call.weights.strides
        return Grouping(out_channels // panel, panel, in_channels, (panel * w_o, w_o, w_i, w_y, w_x), 0)


def grouped_rejection(call: LibraryCall) -> str | None:
    """Why the grouped kernel does not run `call` (None when it does)."""
    if call.op != "convolution" or len(call.src.dims) != 4 or len(call.weights.dims) not in (4, 5):
        return "not a 2-d convolution"
    if len(call.weights.dims) == 4:
        dense = _dense_rejection(call)
        if dense is not None:
            return dense
    else:
        groups, group_out, group_in, kernel_h, kernel_w = call.weights.dims
        if groups == 1:
            return "one group"
        if group_out == 1 and group_in == 1:
            return "depthwise"
        if group_out not in (4, LANES) and group_out % WIDEST:
            return f"{group_out} output channels per group (this kernel takes 4, 8 or a multiple of 16)"
        if group_out > WIDEST and kernel_h * kernel_w * group_in * WIDEST * 4 > MAX_PANEL_BYTES:
            return f"a split group's weights ({kernel_h}x{kernel_w} x {group_in} x 16 floats) would leave L1"
    if machine.avx512():
        return "AVX-512: oneDNN's grouped convolution, not measured against this kernel there"
    operands = operand_rejection(call)
    if operands is not None:
        return operands
    return post_ops_rejection(call.post_ops)


def _dense_rejection(call: LibraryCall) -> str | None:
    """Why a dense convolution does not run here in panels: only where oneDNN would run its epilogue slowly (the
    plan still prices the convolution alone on oneDNN, then the epilogue), and not where another of kernorch's
    kernels is meant for it."""
    out_channels, in_channels, kernel_h, kernel_w = call.weights.dims
    if not slow_in_onednn(call):
        return "a dense convolution without a post-op oneDNN runs slowly: oneDNN's"
    if (kernel_h, kernel_w) == (1, 1) and tuple(call.strides) == (1, 1) and not any(call.pad_begin + call.pad_end):
        return "a 1x1 stride-1 convolution: the pointwise and panel kernels'"
    if in_channels < LANES:  # an RGB stem, 3 -> 32 3x3/2 with relu: 229 µs here, oneDNN's conv + a relu pass 228
        return f"{in_channels} input channels: an image's, the few-channel kernel's or oneDNN's"
    if kernel_h * kernel_w * in_channels * LANES * MAX_GROUP_VECTORS * 4 > MAX_PANEL_BYTES:
        return f"a panel's weights ({kernel_h}x{kernel_w} x {in_channels} x 16 floats) would leave L1"
    if out_channels % LANES:
        return f"{out_channels} output channels are no multiple of {LANES}"
    return None


def _block_size(group_vectors: int, width: int) -> int:
    return max(1, min(ACCUMULATORS // group_vectors, width))


@dataclass(frozen=True)
class _Geometry(ConvGeometry):
    """The conv's sizes and element strides, as the C below uses them; whether the epilogue is applied to the
    accumulators before they are stored (library/post_ops.vector_epilogue)."""

    epilogue_in_registers: bool = False

    def store(self, pixel: str, vector: int, accumulator: str) -> str:
        """C storing `accumulator`, the `vector`th of group g's output channels at output column `pixel`."""
        channel = f"g * {self.group_out} + {vector * self.lanes}"
        at = f"*(ko_v8u *)(out + (long)({pixel}) * {self.call.dst.strides[3]} + {channel})"
        statements = vector_epilogue(self.call.post_ops, "n", channel, "y", pixel) if self.epilogue_in_registers \
            else None  # fmt: skip
        if not statements:
            return f"{at} = {accumulator};"
        return f"{{ ko_v8 v = {accumulator}; {' '.join(statements)} {at} = v; }}"

    @property
    def group_in(self) -> int:
        return Grouping.of(self.call).group_in

    @property
    def group_out(self) -> int:
        return Grouping.of(self.call).group_out

    @property
    def input_offset(self) -> str:
        """C of the first input channel computed group g reads."""
        grouping = Grouping.of(self.call)
        group = f"g / {grouping.splits}" if grouping.splits > 1 else "g"
        return f"({group}) * {grouping.input_step}"

    @property
    def lanes(self) -> int:
        """Output channels per vector: a group of 4 takes half an AVX2 vector (ResNeXt-50 32x4d's first stage)."""
        return min(LANES, self.group_out)

    def vectorized(self, lines: list[str]) -> list[str]:
        """Lines written for 8-float vectors, on this call's vectors."""
        return [re.sub(r"\b(ko_v|ko_i|KO_BROADCAST|KO_SELECT)8", rf"\g<1>{self.lanes}", line) for line in lines]

    def weights(self, tap_y: str, tap_x: str) -> str:
        """The packed weights of group g at a tap: [input channel][output channel]."""
        return f"wg + ({tap_y} * {self.kernel_w} + {tap_x}) * {self.group_in * self.group_out}L"

    def interior(self, into: CWriter, block: int) -> None:
        """`block` pixels from x on whose taps are all inside the image."""
        w, lanes = CWriter(), self.lanes
        vectors, src_x = self.group_out // lanes, self.call.src.strides[3]
        (_, stride_x) = self.call.strides
        accumulators = [(i, v) for i in range(block) for v in range(vectors)]
        w.line(*(f"ko_v8 acc{i}_{v} = *(const ko_v8u *)(s->bias + g * {self.group_out} + {v * lanes});"
                 for i, v in accumulators))  # fmt: skip
        with w.block(f"for (int ky = ky0; ky < ky1; ky++) for (int kx = 0; kx < {self.kernel_w}; kx++)"):
            w.line(f"const float *r = in + {self.source_row('ky')} + {self.source_column('x', 'kx')} * {src_x}"
                   f" + {self.input_offset};", f"const float *wt = {self.weights('ky', 'kx')};")  # fmt: skip
            w.line(f"#pragma GCC unroll {min(self.group_in, 8)}")
            with w.block(f"for (int ic = 0; ic < {self.group_in}; ic++)"):
                w.line(*(f"const ko_v8 w{v} = *(const ko_v8u *)(wt + ic * {self.group_out} + {v * lanes});"
                         for v in range(vectors)))  # fmt: skip
                for i in range(block):
                    fmas = " ".join(f"acc{i}_{v} += b * w{v};" for v in range(vectors))
                    w.line(f"{{ const ko_v8 b = KO_BROADCAST8(r + {i * stride_x * src_x}L + ic); {fmas} }}")
        w.line(*(self.store(f"x + {i}", v, f"acc{i}_{v}") for i, v in accumulators))
        into.line(*self.vectorized(w.lines))

    def edge(self, into: CWriter, begin: str, end: str) -> None:
        """Pixels [begin, end) with taps outside the image (padding), one at a time, bounds checked per tap (on a
        7x7 map two of seven columns: as scalar code they took longer than the other five)."""
        w, lanes = CWriter(), self.lanes
        vectors, src_x = self.group_out // lanes, self.call.src.strides[3]
        with w.block(f"for (int x = {begin}; x < {end}; x++)"):
            w.line(*(f"ko_v8 acc{v} = *(const ko_v8u *)(s->bias + g * {self.group_out} + {v * lanes});"
                     for v in range(vectors)))  # fmt: skip
            with w.block(f"for (int ky = ky0; ky < ky1; ky++) for (int kx = 0; kx < {self.kernel_w}; kx++)"):
                w.line(f"const long ix = {self.source_column('x', 'kx')};",
                       f"if (ix < 0 || ix >= {self.call.src.dims[3]}) continue;",
                       f"const float *r = in + {self.source_row('ky')} + ix * {src_x} + {self.input_offset};",
                       f"const float *wt = {self.weights('ky', 'kx')};")  # fmt: skip
                with w.block(f"for (int ic = 0; ic < {self.group_in}; ic++)"):
                    w.line("const ko_v8 b = KO_BROADCAST8(r + ic);",
                           *(f"acc{v} += b * *(const ko_v8u *)(wt + ic * {self.group_out} + {v * lanes});"
                             for v in range(vectors)))  # fmt: skip
            w.line(*(self.store("x", v, f"acc{v}") for v in range(vectors)))
        into.line(*self.vectorized(w.lines))


def _prefetch_next_group(w: CWriter, geometry: _Geometry, grouping: Grouping) -> None:
    """C prefetching the input lines group g + 1 reads for this output row while group g is computed. A group's
    channels are a line or two of every pixel, the pixels a whole channel count apart (2 KB at 512 channels): a
    stride that leaves its 4 KB page every other pixel, where the hardware prefetchers stop. In place, its input
    written by the kernel before, ResNeXt-50's 28x28 -> 14x14 stride-2 conv of 32 groups took 0.88 ms (onnxruntime's
    node 0.39), isolated and hot 0.28. Alternated with the same kernel without it, after a 64 MB flush: 1.49 ->
    1.16 ms, 56x56x256 -> 28x28 1.91 -> 1.56, RegNetY's 28x28x208 (26 groups) 0.83 -> 0.59, 14x14x440 -> 7x7 (55
    groups) 0.30 -> 0.18; hot the same or faster. Whole plans, alternated in one process: RegNetY-400MF 11.80 ->
    10.88 ms, ResNeXt-50 the same (its grouped convs are a tenth of it). Prefetching the next group's weights or
    output lines as well measured no faster."""
    call = geometry.call
    width, src_x = call.src.dims[3], call.src.strides[3]
    lines = -(-grouping.group_in * 4 // 64)
    following = "(g + 1) / " + str(grouping.splits) if grouping.splits > 1 else "(g + 1)"
    with w.block(f"if (g + 1 < {grouping.groups})"):
        w.line(f"const float *next = in + {following} * {grouping.input_step};")
        w.nest("for (int ky = ky0; ky < ky1; ky++)",
               f"for (int ix = 0; ix < {width}; ix++)",
               f"for (int l = 0; l < {lines}; l++)",
               f"__builtin_prefetch(next + {geometry.source_row('ky')} + (long)ix * {src_x} + l * 16, 0, 3);")


def _chunking(rows: int, groups: int) -> tuple[int, int]:
    """(groups per item, items per row): rows alone when there are enough of them."""
    if rows >= MIN_ITEMS:
        return groups, 1
    chunk = -(-groups // min(-(-MIN_ITEMS // rows), groups))
    return chunk, -(-groups // chunk)


def render_grouped_conv(name: str, call: LibraryCall) -> str:
    """C for `call` (which `grouped_rejection` accepted): state, create, run, destroy."""
    batch = call.src.dims[0]
    grouping = Grouping.of(call)
    groups, group_out, group_in = grouping.groups, grouping.group_out, grouping.group_in
    kernel_h, kernel_w = call.weights.dims[-2:]
    _, out_channels, out_h, out_w = call.dst.dims
    src_n = call.src.strides[0]
    dst_n, _, dst_y, dst_x = call.dst.strides
    w_g, w_o, w_i, w_y, w_x = grouping.weight_strides
    # the epilogue on the accumulators where each post-op and operand has a vector form (relu: regnety's 28x28
    # 104-channel conv took 146 µs alone, 193-200 with relu as a loop over the stored row), else over each row
    in_registers = vector_epilogue(call.post_ops, "n", "0", "y", "0") is not None
    geometry = _Geometry(call, in_registers)
    group_size = kernel_h * kernel_w * group_in * group_out
    chunk, chunks = _chunking(batch * out_h, groups)
    first, last = geometry.inside_columns()
    block = _block_size(group_out // geometry.lanes, max(last - first, 1))
    pointers, operands = binary_operands(call.post_ops)
    epilogue = [] if in_registers else post_op_statements(call.post_ops, operands)

    w = CWriter()
    w.line(AVX2_VECTOR_TYPES)
    with packed_weights_state(w, name, call, groups * group_size):
        w.nest(f"for (int g = 0; g < {groups}; g++) for (int o = 0; o < {group_out}; o++)",
               f"for (int i = 0; i < {group_in}; i++)",
               f"for (int ky = 0; ky < {kernel_h}; ky++) for (int kx = 0; kx < {kernel_w}; kx++)",
               f"s->w[(long)g * {group_size} + ((ky * {kernel_w} + kx) * {group_in} + i) * {group_out} + o] = "
               f"w[(long)(g / {grouping.splits}) * {w_g} + (long)(g % {grouping.splits} * {group_out} + o) * {w_o} + "
               f"(long)i * {w_i} + (long)ky * {w_y} + (long)kx * {w_x}];")
    with run_function(w, name, call):
        w.line(*pointers, "#pragma omp parallel for schedule(static)")
        with w.block(f"for (long item = 0; item < {batch * out_h * chunks}L; item++)"):
            w.line(f"const long row = item / {chunks}, n = row / {out_h}, y = row % {out_h};",
                   f"const int g0 = (int)(item % {chunks}) * {chunk};",
                   f"const int g1 = g0 + {chunk} < {groups} ? g0 + {chunk} : {groups};",
                   f"const float *in = src + n * {src_n}L;",
                   f"float *out = dst + n * {dst_n}L + y * {dst_y}L;",
                   *geometry.filter_rows())
            with w.block("for (int g = g0; g < g1; g++)"):
                w.line(f"const float *wg = s->w + (long)g * {group_size};")
                if grouping.input_step:  # a dense conv's panels all read the same inputs: in cache after the first
                    _prefetch_next_group(w, geometry, grouping)
                geometry.output_row(w, block)
            if epilogue:
                with w.block(f"for (int x = 0; x < {out_w}; x++)"):
                    w.line(f"float *o = out + (long)x * {dst_x};")
                    post_op_loop(w, "o", f"g0 * {group_out}", f"g1 * {group_out}", epilogue)
    return w.text(end="\n")


# oneDNN's AVX2 grouped conv runs groups of 8 channels at a tenth of the FMA peak
BACKEND = LibraryCallBackend("grouped_conv", "native C", "direct C grouped convolution (dense: in panels)",
                             grouped_rejection, render_grouped_conv)  # fmt: skip
