"""A 1x1 convolution over many input channels in generated C, its epilogue in registers, on CPUs without AVX-512.

oneDNN 3.2 runs a 1x1 convolution's relu as elu(0) + linear (library/onednn.py: its relu turns NaN into 0), an exp
per output: MobileNetV4's 128 -> 512 expansions at 7x7 took 111 µs with relu in place against 80 µs without
(onnxruntime's fused conv + relu: 85), and where the plan runs relu as a pass of its own it reads and writes the
map once more. Without a post-op, too, oneDNN's jit:avx2 1x1 kernel is slower than this one on most shapes:
ResNet-50's 1x1 convs in place ran at 0.71-0.97x onnxruntime's nodes on oneDNN (with a residual add 0.68-0.78x),
0.89-1.05x here (bench/results/2026-11-30-panel-everywhere-zen3.md), so it takes every 1x1 convolution whose
output channels it can panel; strided ones too (ResNet's and RegNet's downsampling: 1.15-1.45x oneDNN's time,
isolated), whose blocks stay within an output row, each reading its first pixel's source. native/pointwise_conv.py
keeps a whole chunk's weights in L1, so it takes at most 64 input channels; this kernel takes any number, and on
AVX2 it is the faster of the two below 64 too (relu, 2 threads: 56x56 32 -> 32 56-60 µs against pointwise's 68-72
and oneDNN's conv alone 61; 14x14 64 -> 256 49-51 against 83-93 and 55-60), so it is asked first.

Channels-last, the convolution is a product [pixels, K] x [K, N]. The weights are repacked once at create into
panels of 16 output channels (two AVX2 vectors; a last panel of 8), each [K][16], so a register block reads one
contiguous stream. Each parallel item is a run of at most RUN pixels and one panel: the panel's weights (K x 64
bytes) are read once per block of up to ROWS pixels, the run's source rows once per panel while they stay in L2.
The runs are of equal length and a multiple of the threads in number, so that each thread writes whole output rows.
A block of 6 pixels x 2 vectors accumulates in 12 of AVX2's 16 registers, starting from the bias; per input
channel two weight loads and one broadcast per pixel feed 12 FMAs. The post-ops (library/post_ops.py) are applied
to the accumulators before the store where each has a vector form and each binary operand's pixels are evenly
strided (relu, clip, a residual add, a per-channel scale: ResNet-50's 56x56 64 -> 256 with add + relu 730-770 µs,
959 as a loop over the stored block, 650-680 without the epilogue); the others (swish, tanh) run over the stored
block while it is in L1. A run allocates nothing.

On AVX-512 oneDNN's 1x1 kernels were not measured against this one, so the call stays with oneDNN there."""

from __future__ import annotations

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
    vector_post_op_statements,
)
from kernorch.codegen.native.skeleton import (
    AVX2_VECTOR_TYPES,
    operand_rejection,
    packed_weights_state,
    run_function,
)

LANES = 8  # floats per AVX2 vector
PANEL = 2 * LANES  # output channels per panel: a register block's width
ROWS = 6  # pixels per register block: 6 x 2 accumulators, two weight vectors and a broadcast in 16 registers
RUN = 8 * ROWS  # pixels per parallel item, at most


def panel_rejection(call: LibraryCall) -> str | None:
    """Why the panel kernel does not run `call` (None when it does)."""
    if call.op != "convolution" or len(call.src.dims) != 4 or len(call.weights.dims) != 4:
        return "not a 2-d convolution without groups"
    out_channels, _, kernel_h, kernel_w = call.weights.dims
    if (kernel_h, kernel_w) != (1, 1) or any(call.pad_begin) or any(call.pad_end):
        return "not a 1x1 convolution without padding"
    if out_channels % LANES:
        return f"{out_channels} output channels are no multiple of {LANES}"
    if machine.avx512():
        return "AVX-512: oneDNN's 1x1 convolution, not measured against this kernel there"
    operands = operand_rejection(call)
    if operands is not None:
        return operands
    if call.dst.strides[2] != call.dst.dims[3] * call.dst.strides[3]:
        return "output pixels are not evenly strided"
    return post_ops_rejection(call.post_ops)


@dataclass(frozen=True)
class VectorOperand:
    """A binary post-op's operand as the register blocks read it: `t{position}` advanced to the block's first pixel
    and panel (by the run loop), then `pixel_stride` floats per pixel; a vector of 8 channels, or one value for
    all of them (`per_channel` False: an operand broadcast over channels)."""

    position: int
    batch_stride: int
    pixel_stride: int
    per_channel: bool

    def block_start(self) -> str:
        channels = " + c0" if self.per_channel else ""
        return f"t{self.position} + n * {self.batch_stride}L + p * {self.pixel_stride}L{channels}"

    def vector(self, row: int, vector: int) -> str:
        at = f"t{self.position} + {row * self.pixel_stride}"
        return f"*(const ko_v8u *)({at} + {vector * LANES})" if self.per_channel else f"((ko_v8){{0}} + *({at}))"


def vector_operands(call: LibraryCall) -> list[VectorOperand] | None:
    """The binary post-ops' operands as register blocks read them, or None where one's pixels are not evenly
    strided or its channels not contiguous (the epilogue then runs over the stored block)."""
    _, _, height, width = call.dst.dims
    operands = []
    for position, (_, tensor) in enumerate(call.post_ops):
        if tensor is None:
            continue
        (n, c, y, x), (n_stride, c_stride, y_stride, x_stride) = tensor.dims, tensor.strides
        if (y, x) == (1, 1):
            pixel_stride = 0
        elif (y, x) == (height, width) and y_stride == width * x_stride:
            pixel_stride = x_stride
        else:
            return None
        if c != 1 and c_stride != 1:
            return None
        operands.append(VectorOperand(position, n_stride if n != 1 else 0, pixel_stride, c != 1))
    return operands


def register_block(w: CWriter, name: str, call: LibraryCall, rows: int, vectors: int,
                   operands: list[VectorOperand] | None) -> None:  # fmt: skip
    """`{name}_block_{rows}_{vectors}`: `rows` pixels x `vectors` vectors of one panel, from the bias; with
    `operands`, the epilogue applied in registers before the store (their pointers follow `out`)."""
    in_channels, src_x, dst_x = call.src.dims[1], call.strides[1] * call.src.strides[3], call.dst.strides[3]
    accumulators = [(r, v) for r in range(rows) for v in range(vectors)]
    operand_parameters = "".join(f", const float *restrict t{o.position}" for o in operands or [])
    with w.function(f"static inline __attribute__((always_inline)) void {name}_block_{rows}_{vectors}("
                    "const float *restrict in, const float *restrict wp, const float *restrict bias, "
                    f"float *restrict out{operand_parameters})", returns=None):  # fmt: skip
        w.line(*(f"ko_v8 a{r}_{v} = *(const ko_v8 *)(bias + {v * LANES});" for r, v in accumulators),
               "#pragma GCC unroll 4")  # fmt: skip
        with w.block(f"for (int k = 0; k < {in_channels}; k++)"):
            w.line(*(f"const ko_v8 w{v} = *(const ko_v8 *)(wp + k * {vectors * LANES} + {v * LANES});"
                     for v in range(vectors)))  # fmt: skip
            for r in range(rows):
                fmas = " ".join(f"a{r}_{v} += b * w{v};" for v in range(vectors))
                w.line(f"{{ const ko_v8 b = KO_BROADCAST8(in + {r * src_x}L + k); {fmas} }}")
        for r, v in accumulators:
            store = f"*(ko_v8u *)(out + {r * dst_x}L + {v * LANES})"
            statements = (vector_post_op_statements(call.post_ops, [o.vector(r, v) for o in operands])
                          if operands is not None else None)  # fmt: skip
            if statements:
                w.line(f"{{ ko_v8 v = a{r}_{v}; {' '.join(statements)} {store} = v; }}")
            else:
                w.line(f"{store} = a{r}_{v};")


@dataclass(frozen=True)
class Panels:
    """A product's register blocks as written into the C (`register_block`, one per rows x vectors), what a call of
    one passes after `out`, and the epilogue's scalar statements where it runs over the stored block (empty where
    it is applied in registers)."""

    name: str
    call: LibraryCall
    blocks: tuple[tuple[int, int], ...]
    block_operands: str
    epilogue: tuple[str, ...]

    def write_blocks(self, w: CWriter, begin: str, end: str, source: str, before: tuple[str, ...] = ()) -> None:
        """Pixels [begin, end) of batch item n as blocks of nearly equal rows (at most ROWS) of the panel at
        output channel c0 (`vectors` wide, its weights at `wp`, bias at `bp`), each read from `source` (C of its
        first pixel's input, in terms of `p`) after `before` (statements), stored, and the epilogue over it where
        it is not in registers."""
        _, _, _, width = self.call.dst.dims
        dst_n, _, _, dst_x = self.call.dst.strides
        w.line(f"const long blocks = {end} > {begin} ? ({end} - {begin} + {ROWS - 1}) / {ROWS} : 0;")
        with w.block(f"for (long b = 0, p = {begin}, rows; b < blocks; b++, p += rows)"):
            w.line(f"rows = ({end} - {begin}) / blocks + (b < ({end} - {begin}) % blocks);", *before,
                   f"const float *in = {source};", f"float *out = dst + n * {dst_n}L + p * {dst_x}L + c0;")  # fmt: skip
            self._prefetch_next_block(w, end)
            with w.block("switch (rows * 2 + vectors - 1)"):  # one inlined block per (rows, vectors)
                w.extend(f"case {rows * 2 + vectors - 1}: {self.name}_block_{rows}_{vectors}(in, wp, bp, out"
                         f"{self.block_operands}); break;" for rows, vectors in self.blocks)  # fmt: skip
            if self.epilogue:  # over the block just stored, still in L1
                with w.block("for (long q = p; q < p + rows; q++)"):
                    w.line(f"const long y = q / {width}, x = q % {width};",
                           "(void)y; (void)x;  /* read by binary post-ops' operands only */",
                           f"float *o = dst + n * {dst_n}L + q * {dst_x}L;")  # fmt: skip
                    post_op_loop(w, "o", "c0", f"c0 + vectors * {LANES}", list(self.epilogue), simd=True)

    def _prefetch_next_block(self, w: CWriter, end: str) -> None:
        """C prefetching the lines the next block of the panel reads from its binary operands and writes (with
        intent to write) while this block is computed. A panel's channels are one line of every pixel and the
        pixels a whole channel count apart (2 KB at 512 channels), a stride that leaves its 4 KB page every
        other pixel, where the hardware prefetchers stop: ResNet-50's 28x28 128 -> 512 conv with the residual
        add and relu took 1.0 ms in place (onnxruntime's node 0.71), every line of the residual and the output
        a miss. Alternated with the same kernel without it (Zen 3): 1.66-1.74 -> 1.18-1.25 ms after a 64 MB
        flush, 0.99-1.17 -> 0.83-0.85 hot (L3); 56x56 64 -> 256 with the add 1.91 -> 1.47 flushed; without a
        residual the output lines alone 5-10 % (28x28 128 -> 512 1.15 -> 1.06). Two blocks ahead was slower."""
        dst_x = self.call.dst.strides[3]
        operands = [o for o in vector_operands(self.call) or [] if o.per_channel and o.pixel_stride]
        with w.block(f"for (long q = rows; q < 2 * rows && p + q < {end}; q++)"):
            w.line(*(f"__builtin_prefetch({o.block_start()} + q * {o.pixel_stride}L, 0, 3);" for o in operands),
                   f"__builtin_prefetch(out + q * {dst_x}L, 1, 3);")  # fmt: skip


def write_panels(w: CWriter, name: str, call: LibraryCall) -> tuple[Panels, list[str]]:
    """The vector types, the state (weights packed in panels: panel p holds output channels [16p, 16p + width) as
    [k][width], a last panel of 8 is 8 wide, at 16p x K) and the register blocks of a 1x1 convolution `call`; its
    Panels and the C declaring the binary post-ops' operand pointers (for the run function)."""
    in_channels, out_channels = call.src.dims[1], call.dst.dims[1]
    w_o, w_i, _, _ = call.weights.strides
    panels = -(-out_channels // PANEL)
    pointers, operands = binary_operands(call.post_ops)
    # the epilogue in registers before the store where every post-op has a vector form (relu, clip, add, ...),
    # else over each stored block: ResNet-50's 56x56 64 -> 256 with add + relu took 959 µs that way, 672 without
    in_registers = vector_operands(call)
    if in_registers is not None and vector_post_op_statements(call.post_ops, ["t"] * len(in_registers)) is None:
        in_registers = None
    epilogue = post_op_statements(call.post_ops, operands) if in_registers is None else []
    w.line(AVX2_VECTOR_TYPES)
    with packed_weights_state(w, name, call, panels * PANEL * in_channels):
        w.nest(f"for (int o = 0; o < {out_channels}; o++) for (int k = 0; k < {in_channels}; k++)",
               f"s->w[(long)(o / {PANEL}) * {PANEL * in_channels} + (long)k * ({out_channels} - o / {PANEL} * "
               f"{PANEL} < {PANEL} ? {LANES} : {PANEL}) + o % {PANEL}] = w[(long)o * {w_o} + (long)k * {w_i}];")
    widths = sorted({min(2, (out_channels - p * PANEL) // LANES) for p in range(panels)})  # vectors per panel
    blocks = tuple((rows, vectors) for vectors in widths for rows in range(1, ROWS + 1))
    for rows, vectors in blocks:
        register_block(w, name, call, rows, vectors, in_registers)
    block_operands = "".join(f", {o.block_start()}" for o in in_registers or [])
    return Panels(name, call, blocks, block_operands, tuple(epilogue)), pointers


def render_panel_conv(name: str, call: LibraryCall) -> str:
    """C for `call` (which `panel_rejection` accepted): state, create, run, destroy."""
    batch, in_channels = call.src.dims[:2]
    _, out_channels, height, width = call.dst.dims
    stride_y, stride_x = call.strides
    src_n, _, src_y, src_x = call.src.strides
    pixels = height * width
    panels = -(-out_channels // PANEL)
    w = CWriter()
    product, pointers = write_panels(w, name, call)

    with run_function(w, name, call):
        # whole runs per thread: two threads writing the two halves of the same output rows ran no faster than one
        # (7x7, 128 -> 512: 84 µs on one thread, 82 on two, 53 with a run each), so the runs are a multiple of the
        # threads, of equal length; with fewer pixels than a block per thread, one run whose panels the threads share
        w.line(*pointers, "const long threads = omp_get_max_threads();",
               f"const long runs = {pixels} < threads * {ROWS} ? 1 : "
               f"({-(-pixels // RUN)} + threads - 1) / threads * threads;",
               f"const long run = ({pixels} + runs - 1) / runs, total = {batch}L * runs;",
               "const long per = total % threads ? total : total / threads;  /* a thread's runs */",
               # A thread takes its runs panel by panel where the weights outweigh its source rows (which then stay
               # in L2 while the weights stream through once), else panel after panel for each run (its rows in L1)
               f"const int panel_major = total % threads == 0 && {out_channels}L * threads > {pixels};",
               "#pragma omp parallel for schedule(static)")  # fmt: skip
        with w.block(f"for (long item = 0; item < total * {panels}; item++)"):
            w.line(f"const long first = item / (per * {panels}) * per, within = item % (per * {panels});",
                   f"const long g = first + (panel_major ? within % per : within / {panels});",
                   f"const int c0 = (int)(panel_major ? within / per : within % {panels}) * {PANEL};",
                   "const long n = g / runs, r = g % runs;",
                   f"const int vectors = {out_channels} - c0 < {PANEL} ? 1 : 2;",
                   f"const long p0 = r * run, p1 = p0 + run < {pixels} ? p0 + run : {pixels};",
                   f"const float *wp = s->w + (long)c0 * {in_channels}, *bp = s->bias + c0;")  # fmt: skip
            if (stride_y, stride_x) == (1, 1) and src_y == call.src.dims[3] * src_x:
                # the source's pixels evenly strided too: a block may run on into the next row
                product.write_blocks(w, "p0", "p1", f"src + n * {src_n}L + p * {src_x}L")
            else:  # a strided conv (ResNet's downsampling): blocks within a row, each from its pixel's source
                with w.block("for (long seg0 = p0, seg1; seg0 < p1; seg0 = seg1)"):
                    w.line(f"const long seg_y = seg0 / {width};",
                           f"seg1 = (seg_y + 1) * {width} < p1 ? (seg_y + 1) * {width} : p1;")  # fmt: skip
                    product.write_blocks(w, "seg0", "seg1", f"src + n * {src_n}L + seg_y * {stride_y * src_y}L + "
                            f"(p - seg_y * {width}) * {stride_x * src_x}L")  # fmt: skip
    return w.text(end="\n")


# oneDNN's jit:avx2 1x1 convolution is slower without a post-op, and runs relu as an exp per output
BACKEND = LibraryCallBackend("panel_conv", "native C", "1x1 C convolution in panels, its epilogue in registers",
                             panel_rejection, render_panel_conv)  # fmt: skip
