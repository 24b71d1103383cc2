"""What kernorch's own library-shaped kernels share (codegen/native/): the vector types they compute in, the
operands they need, and their create/run/destroy skeleton — a state holding the repacked weights, created once
when the plan is loaded (or refused in one line when memory runs out), freed by destroy — written once here."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from kernorch.codegen.c import CWriter
from kernorch.codegen.library import VECTOR_SELECT, LibraryCall

VECTOR_TYPES = """#ifndef KO_VC
#define KO_VC
#ifdef __AVX512F__
#define KO_VC_LANES 16
#define KO_VC_ACCUMULATORS 24
#else
#define KO_VC_LANES 8
#define KO_VC_ACCUMULATORS 12
#endif
typedef float ko_vc __attribute__((vector_size(KO_VC_LANES * 4)));
typedef float ko_vcu __attribute__((vector_size(KO_VC_LANES * 4), aligned(4)));  /* an unaligned load */
/* half a vector, for channel counts below KO_VC_LANES (efficientvit's 8-channel stem on AVX-512) */
#define KO_VH_LANES (KO_VC_LANES / 2)
typedef float ko_vh __attribute__((vector_size(KO_VH_LANES * 4)));
typedef float ko_vhu __attribute__((vector_size(KO_VH_LANES * 4), aligned(4)));
#endif"""


# Vectors of AVX2's width, for the kernels written for it (grouped_conv, panel_conv). The broadcast is AVX's
# instruction where there is one: written as scalar times vector, GCC's SLP vectorizer
# gathered a pixel's adjacent input channels into one vector and spilled each lane to the stack to broadcast it
# (1.3 ms for regnety's first grouped conv, oneDNN's 1.0-1.5)
AVX2_VECTOR_TYPES = """#ifndef KO_V8
#define KO_V8
typedef float ko_v8 __attribute__((vector_size(32)));
typedef float ko_v8u __attribute__((vector_size(32), aligned(4)));  /* an unaligned load */
typedef float ko_v4 __attribute__((vector_size(16)));
typedef float ko_v4u __attribute__((vector_size(16), aligned(4)));
#ifdef __AVX__
#include <immintrin.h>
#define KO_BROADCAST8(p) ((ko_v8)_mm256_broadcast_ss(p))
#define KO_BROADCAST4(p) ((ko_v4)_mm_broadcast_ss(p))
#else
#define KO_BROADCAST8(p) ((ko_v8){0} + *(p))
#define KO_BROADCAST4(p) ((ko_v4){0} + *(p))
#endif
""" + VECTOR_SELECT + """
#endif"""

# The post-ops oneDNN runs slowly inside a convolution; cheap ones (linear, binary) stay there. Relu too is
# slow: oneDNN's relu is a max that turns NaN into 0, so its calls run relu as elu(0) + linear (library/onednn.py),
# an exp per value (mnasnet0_5's 16 -> 48 expansion: conv 4.8 us, conv + relu 13.4 us, profiled).
SLOW_POST_OPS = frozenset({"swish", "logistic", "gelu_erf", "gelu_tanh", "tanh", "exp", "elu", "relu"})


def slow_in_onednn(call: LibraryCall) -> bool:
    """Whether the call has a post-op oneDNN runs at a fraction of its convolution's speed (a transcendental, or
    relu through elu)."""
    return any(op.alg in SLOW_POST_OPS for op, _ in call.post_ops)  # binary ops' algs are add, mul, ...


def operand_rejection(call: LibraryCall) -> str | None:
    """What the depthwise and Winograd kernels both need of their operands: channels contiguous (channels-last)
    in the source and destination, no offsets (weights computed at run time are declined for every native kernel:
    backends/library_calls.py)."""
    if call.src.strides[1] != 1 or call.dst.strides[1] != 1:
        return "not channels-last"
    if call.src.offset or call.dst.offset:
        return "an offset source or destination"
    return None


def source_element(call: LibraryCall) -> str:
    """The C type of the call's source elements: a bf16 plan's source stored bfloat16 is read as its bits."""
    return "uint16_t" if call.src.dtype == "bfloat16" else "float"


def source_value(call: LibraryCall, element: str) -> str:
    """C of a source element's value as the call multiplies it (`element` its C lvalue): in a bf16 call rounded
    to bfloat16 (a source stored so expanded as it is), else as it is."""
    if call.src.dtype == "bfloat16":
        return f"ko_bf16_float({element})"
    return f"ko_bf16_round({element})" if call.precision == "bf16" else element


def weight_value(call: LibraryCall, element: str) -> str:
    """C of a weight as the call multiplies it: rounded to bfloat16 in a bf16 call (once, when packed)."""
    return f"ko_bf16_round({element})" if call.precision == "bf16" else element


@contextmanager
def run_function(w: CWriter, name: str, call: LibraryCall) -> Iterator[None]:
    """A direct kernel's `<name>_run`: its state, source and destination (from their offsets, a strided view's; a
    bf16 plan's bfloat16 ones as their bits, uint16_t), then the body written inside, then `return 0;`."""
    src_offset = f" + {call.src.offset}" if call.src.offset else ""
    dst_offset = f" + {call.dst.offset}" if call.dst.offset else ""
    with w.function(f"static int {name}_run(void *state, void *stream, void **a)"):
        element, written = source_element(call), "uint16_t" if call.dst.dtype == "bfloat16" else "float"
        w.line("(void)stream;",
               f"const {name}_state *s = (const {name}_state *)state;",
               f"const {element} *src = (const {element} *)a[{call.src.slot}]{src_offset};",
               f"{written} *dst = ({written} *)a[{call.dst.slot}]{dst_offset};")  # fmt: skip
        yield


@contextmanager
def create_function(w: CWriter, name: str, fields: str, buffers: Sequence[str],
                    allocate: Sequence[str]) -> Iterator[None]:  # fmt: skip
    """The state struct (`fields`), `<name>_destroy` (frees each of `buffers`, then the state) and `<name>_create`:
    the state allocated, then `allocate` (statements filling its buffers), then the refusal when any of them is
    missing; the packing written inside, then `return s;`."""
    w.line(f"typedef struct {{ {fields} }} {name}_state;")
    with w.function(f"static void {name}_destroy(void *state)", returns=None):
        w.line(f"{name}_state *s = ({name}_state *)state;", "if (!s) return;",
               *(f"free(s->{buffer});" for buffer in buffers), "free(s);")  # fmt: skip
    with w.function(f"static void *{name}_create(void *engine, void *stream, void **a)", returns="s"):
        w.line("(void)engine; (void)stream;", f"{name}_state *s = ({name}_state *)calloc(1, sizeof({name}_state));")
        if len(allocate) == 1:
            w.line(f"if (s) {allocate[0]}")
        else:
            with w.block("if (s)"):
                w.line(*allocate)
        missing = " || ".join(f"!s->{buffer}" for buffer in buffers)
        w.line(f'if (!s || {missing}) {{ snprintf(ko_error, sizeof ko_error, "{name}: out of memory"); '
               f"{name}_destroy(s); return NULL; }}")  # fmt: skip
        yield


@contextmanager
def packed_weights_state(w: CWriter, name: str, call: LibraryCall, weight_floats: int) -> Iterator[None]:
    """`create_function` for a kernel whose state is its repacked weights (`s->w`, `weight_floats` floats) and its
    bias (`s->bias`, one per output channel, zeros where the call has none): inside, `w` and `bias` point at the
    call's operands and the packing of `s->w` is written; the bias is copied after it."""
    channels = call.dst.dims[1]
    bias = f"(const float *)a[{call.bias.slot}]" if call.bias is not None else "NULL"
    with create_function(w, name, "float *w; float *bias;", ["w", "bias"],
                         [f"s->w = (float *)aligned_alloc(64, {aligned_size(weight_floats * 4)});",
                          f"s->bias = (float *)aligned_alloc(64, {aligned_size(channels * 4)});"]):  # fmt: skip
        w.line(f"const float *w = {weights_pointer(call)};", f"const float *bias = {bias};")
        yield
        w.line(f"for (int o = 0; o < {channels}; o++) s->bias[o] = bias ? bias[o] : 0.0f;")


@dataclass(frozen=True)
class ConvGeometry:
    """A direct 2-d convolution's source arithmetic, as the C of its run function uses it (`y` the output row, `in`
    its image): which input row and column a tap reads, which output columns read no padding, which filter rows
    fall inside the image. The depthwise and grouped kernels share it."""

    call: LibraryCall

    @property
    def kernel_w(self) -> int:
        return self.call.weights.dims[-1]

    def source_row(self, tap_y: str) -> str:
        """Offset of the input row filter row `tap_y` reads for output row y."""
        (stride_y, _), (dilate_y, _), (pad_y, _) = self.call.strides, self.call.dilates, self.call.pad_begin
        return f"(y * {stride_y} - {pad_y} + {tap_y} * {dilate_y + 1}) * {self.call.src.strides[2]}L"

    def source_column(self, x: str, tap_x: str) -> str:
        (_, stride_x), (_, dilate_x), (_, pad_x) = self.call.strides, self.call.dilates, self.call.pad_begin
        return f"((long)({x}) * {stride_x} - {pad_x} + {tap_x} * {dilate_x + 1})"

    def inside_columns(self) -> tuple[int, int]:
        """[first, last): the output columns whose taps all fall inside the image."""
        width, out_w = self.call.src.dims[3], self.call.dst.dims[3]
        (_, stride_x), (_, dilate_x), (_, pad_x) = self.call.strides, self.call.dilates, self.call.pad_begin
        first = min(-(-pad_x // stride_x), out_w)
        last = (width - 1 + pad_x - (self.kernel_w - 1) * (dilate_x + 1)) // stride_x + 1
        return first, max(min(last, out_w), first)

    def edge(self, w: CWriter, begin: str, end: str) -> None:
        """The C of output columns [begin, end), whose taps may read padding."""
        raise NotImplementedError

    def interior(self, w: CWriter, block: int) -> None:
        """The C of `block` output columns from x on, whose taps all read the image."""
        raise NotImplementedError

    def output_row(self, w: CWriter, block: int) -> None:
        """The C of one output row: the padded columns on the left, the inside in register blocks of `block`
        columns and one shorter block, the padded columns on the right."""
        first, last = self.inside_columns()
        blocked = first + (last - first) // block * block
        self.edge(w, "0", str(first))
        with w.block(f"for (int x = {first}; x < {blocked}; x += {block})"):
            self.interior(w, block)
        if last > blocked:
            with w.block(""):
                w.line(f"const int x = {blocked};")
                self.interior(w, last - blocked)
        self.edge(w, str(last), str(self.call.dst.dims[3]))

    def filter_rows(self) -> list[str]:
        """C declaring `ky0` and `ky1`: the filter rows inside the image for output row y."""
        kernel_h, height = self.call.weights.dims[-2], self.call.src.dims[2]
        (stride_y, _), (dilate_y, _), (pad_y, _) = self.call.strides, self.call.dilates, self.call.pad_begin
        return [f"int ky0 = 0, ky1 = {kernel_h};  /* the filter rows inside the image */",
                f"while (ky0 < {kernel_h} && y * {stride_y} - {pad_y} + ky0 * {dilate_y + 1} < 0) ky0++;",
                f"while (ky1 > ky0 && y * {stride_y} - {pad_y} + (ky1 - 1) * {dilate_y + 1} >= {height}) ky1--;"]


def aligned_size(size: int) -> int:
    """`size` bytes rounded up to a multiple of 64, the alignment every native kernel's buffers are allocated at:
    C11's aligned_alloc requires it of the size (ASan reports a size that is not)."""
    return -(-size // 64) * 64


def weights_pointer(call: LibraryCall) -> str:
    """C for the call's weights as `create` reads them: a constant's view may start `offset` elements in."""
    offset = f" + {call.weights.offset}" if call.weights.offset else ""
    return f"(const float *)a[{call.weights.slot}]{offset}"
