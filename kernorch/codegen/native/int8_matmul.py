"""An int8 matmul on VNNI dot products (on exact AVX2 products without them): matmul_integer ([M, K] uint8 or int8 rows
by constant [K, N] weights, zero points, int32 sums) with the epilogue quantized models put after it, applied while
the sums are in registers: dequantization (the cast to float32, products and sums by a scalar or a per-column
vector: the scales, the bias) and requantization (a quotient by the next scale, rounding half to even, the zero
point, saturation by compares and selects, the cast to int8 or uint8), and an activation after the dequantization
(erf, tanh, sigmoid, exp: BERT's GELU is x * (1 + erf(x / sqrt 2)) / 2), written int32, float32 or 8-bit.

The weights are centred on their zero point and packed once, when the plan is created, for VNNI as int8 in groups of
four consecutive k per column, 16 columns to a 64-byte vector (VNNI's operand: `vpdpbusd` multiplies four unsigned
bytes of a row by four signed bytes of each column and adds the four products to the column's int32 sum). So the
weights' centred values must fit int8 (checked on the constant when the plan is made; uint8 weights with their zero
point in the middle do). A row of int8 values is read as unsigned by flipping its sign bit (a + 128) and its zero
point moved by 128 to match; the zero point then comes off as one product per column:

    sum_k (a - za) * w = sum_k a' * w - za' * colsum(w)      (a' = a + 128, za' = za + 128 for int8 rows)

exact in int32 (matmul_integer's K is bounded so no sum leaves it). An item is 6 rows by 32 columns: 12 int32
accumulators of 16 lanes, the weights' two vectors per step of four k, a broadcast of each row's four bytes.
Compiled where the compiler targets AVX512-VNNI (`-march=native` on Zen 4, Ice Lake and later).

Without VNNI the bytes' own instruction (`vpmaddubsw`) adds pairs of products in a saturating int16: inexact (what
onnxruntime and oneDNN run there). So on AVX2 the weights are packed as int16 pairs of consecutive k, 8 columns to
a 32-byte vector, and each item first widens its rows, their zero point taken off (a - za: within int16), into
int16 on its stack, a chunk of k at a time: `vpmaddwd` multiplies a row's broadcast pair by each column's pair and
adds the two products in int32, exact. An item is 2 rows by 32 columns there. Where neither instruction set is
targeted, the same pairs are summed in scalar C, so a plan never depends on the instructions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernorch import machine
from kernorch.codegen.backends.base import Backend, Verdict, declines, runs
from kernorch.codegen.backends.library_calls import ONEDNN, library_call
from kernorch.codegen.c import CWriter, c_binary, c_cast, c_quaternary, c_unary, prelude_used_by
from kernorch.codegen.library import library_implementation
from kernorch.codegen.native.skeleton import create_function
from kernorch.ir.graph import Node
from kernorch.ir.kernel import CandidateKernel

# An item: 6 rows x 2 vectors of 16 int32 sums. Measured on Zen 4 (2 threads, 128x256x256 / 128x1024x256): 6 x 32
# columns 21.7 / 77 µs; 6 x 64 (24 accumulators, which GCC 12 spills) 40 / 37+; 4 x 64 25 / 95; 8 x 32 21 / 80 with
# spills; 7 x 32 24 / 82; 6 x 48 30 / 116.
ROWS, COLUMNS = 6, 32
# AVX2's item: 2 rows x 4 vectors of 8 int32 sums (8 accumulators of AVX2's 16 registers; the weights read by the
# products from memory), its rows widened PAIR_CHUNK k at a time. Measured on Zen 3 (2 threads, best of 1000 runs,
# 128x256x256 / 128x384x1536 / 128x1536x384 µs): 2 x 32 int16 weights 78 / 710 / 710; 3 x 16 int8 weights widened as
# loaded 120 / 820 / 678; 2 x 24 122 / 775 / 909; 1 x 48 131 / 711 / 881; 4 x 16 int16 spills an accumulator.
AVX2_ROWS, AVX2_COLUMNS, PAIR_CHUNK = 2, 32, 512
assert COLUMNS % AVX2_COLUMNS == 0  # the packed columns (padded to COLUMNS) hold whole AVX2 items
# VL for the 16-byte masked store of an 8-bit result
VNNI_GUARD = "#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)"
AVX2_GUARD = "#elif defined(__AVX2__)"
# the packed weights' layout follows the instructions targeted: VNNI's quads of bytes, else pairs
LAYOUT = f"""#ifndef KO_I8_VNNI
{VNNI_GUARD}
#define KO_I8_VNNI 1
#else
#define KO_I8_VNNI 0
#endif
#endif"""
# AVX2 has no byte-masked store: an 8-bit result's 8 int32 lanes packed to their low bytes, `count` of them stored
AVX2_BYTES = """#if defined(__AVX2__) && !defined(KO_I8_STORE8)
#define KO_I8_STORE8
#include <immintrin.h>
static inline void ko_i8_store8(void *p, __m256i v, int count) {
  const __m256i low = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
  const __m128i bytes = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(low, _mm256_setr_epi32(0, 4, 0, 0, 0, 0,
    0, 0)));
  const int64_t t = _mm_cvtsi128_si64(bytes);
  if (count == 8) memcpy(p, &t, 8); else memcpy(p, &t, (size_t)count);
}
#endif"""
# four bytes of a row at any offset (rows K bytes apart are not 4-aligned: a cast pointer's load is undefined)
WORD = """#ifndef KO_I8_WORD
#define KO_I8_WORD
static inline int32_t ko_i8_word(const uint8_t *p) { int32_t x; memcpy(&x, p, 4); return x; }
#endif"""
_C_TYPES = {"uint8": "uint8_t", "int8": "int8_t"}


# the epilogue's primitives: what they compute on a vector of 16 lanes (AVX-512) and their result's type
_ARITHMETIC = {"add": "add_ps", "sub": "sub_ps", "mul": "mul_ps", "div": "div_ps"}  # after _mm512_ or _mm256_
_COMPARISONS = {"greater": "_CMP_GT_OQ", "less": "_CMP_LT_OQ", "greater_equal": "_CMP_GE_OQ",
                "less_equal": "_CMP_LE_OQ", "equal": "_CMP_EQ_OQ"}  # ordered: false with NaN, as C's  # fmt: skip
_WRITTEN = ("float32", "int32", "int8", "uint8")  # what the kernel may write
# transcendental steps (an activation after the dequantization: BERT's GELU is erf's): each lane through the
# prelude's branch-free scalar helper, in a loop over the vector's lanes that GCC vectorizes
_LANEWISE = {"erf": "ko_erff", "tanh": "ko_tanhf", "sigmoid": "ko_sigmoidf", "exp": "ko_expf"}


@dataclass(frozen=True)
class Operand:
    """An epilogue step's operand: the product's int32 sums ("sums"), an earlier step's result ("step", its
    index), or an argument of the kernel ("input", its slot; `per_column`: N floats along the output's last axis,
    else one)."""

    kind: str
    index: int = 0
    per_column: bool = False


@dataclass(frozen=True)
class Step:
    """One elementwise primitive of the epilogue and its result's dtype (float32, bool, int32, int8, uint8)."""

    prim: str
    operands: tuple[Operand, ...]
    dtype: str


@dataclass(frozen=True)
class Int8Matmul:
    """What the kernel computes, with its arguments' slots (the kernel's inputs, then its output)."""

    rows: int  # M: every row of the source, its leading axes flattened
    depth: int  # K
    columns: int  # N
    signed: bool  # int8 rows (else uint8)
    src: int
    src_zero: int  # a scalar of the source's type, read when the kernel runs
    weights: int
    weights_type: str
    weights_zero: int
    weights_zero_per_column: bool
    dst: int
    steps: tuple[Step, ...] = ()  # none: the int32 sums are written; else the last step's result

    @property
    def written(self) -> str:
        return self.steps[-1].dtype if self.steps else "int32"


def _step(node: Node, operands: list[Operand], dtypes: list[str], result: str) -> Step | str:
    """The node as an epilogue step, or why it is not one (`dtypes`: its operands')."""
    if node.prim == "cast":
        if (dtypes[0], result) != ("int32", "float32") and (dtypes[0] != "float32" or result not in _WRITTEN):
            return f"a cast from {dtypes[0]} to {result}"
    elif node.prim in _ARITHMETIC or node.prim in ("round", "saturating_round") or node.prim in _COMPARISONS:
        if any(d != "float32" for d in dtypes):
            return f"{node.prim} of {' and '.join(dtypes)}"
    elif node.prim == "where":
        if dtypes != ["bool", "float32", "float32"]:
            return f"where of {', '.join(dtypes)}"
    elif node.prim in _LANEWISE:
        if dtypes != ["float32"]:
            return f"{node.prim} of {dtypes[0]}"
    else:
        return f"{node.prim} in the epilogue"
    return Step(node.prim, tuple(operands), result)


def describe(kernel: CandidateKernel) -> Int8Matmul | str:
    """The kernel as an int8 matmul, or why it is not one."""
    graph = kernel.graph
    nodes = kernel.primitives
    if nodes[0].prim != "matmul_integer":
        return "not a matmul_integer"
    slots = {value: index for index, value in enumerate((*kernel.inputs, *kernel.outputs))}
    a, b, a_zero, b_zero = nodes[0].inputs
    a_type, b_type = graph.types[a], graph.types[b]
    if b_type.rank != 2:
        return f"weights of rank {b_type.rank} (2-D only)"
    if b not in graph.constants or b_zero not in graph.constants:
        return "weights or their zero point are not constant (packed once, when the plan is created)"
    if graph.types[a_zero].rank != 0:
        return "a zero point per row of the source"
    centred = graph.constants[b].astype(np.int32) - graph.constants[b_zero].astype(np.int32)
    if centred.size and (centred.min() < -128 or centred.max() > 127):
        return "weights whose distance from their zero point does not fit int8"
    sums = nodes[0].outputs[0]
    shape, columns = graph.types[sums].shape, b_type.shape[1]
    computed: dict[str, Operand] = {sums: Operand("sums")}
    steps: list[Step] = []
    for node in nodes[1:]:
        operands = []
        for value in node.inputs:
            value_type = graph.types[value]
            if value in computed:
                operands.append(computed[value])
            elif value in slots and value_type.dtype == "float32" and value_type.numel == 1:
                operands.append(Operand("input", slots[value]))
            elif value in slots and value_type.dtype == "float32" and value_type.shape[-1:] == (columns,) \
                    and value_type.numel == columns:  # fmt: skip
                operands.append(Operand("input", slots[value], per_column=True))
            else:
                return f"an operand {value_type} of {node.prim}: neither a value of the epilogue, one float nor one " \
                    "per column"  # fmt: skip
        (out,) = node.outputs
        if graph.types[out].shape != shape:
            return f"{node.prim} changes the product's shape"
        dtypes = [graph.types[v].dtype for v in node.inputs]
        step = _step(node, operands, dtypes, graph.types[out].dtype)
        if isinstance(step, str):
            return step
        computed[out] = Operand("step", len(steps))
        steps.append(step)
    last = nodes[-1].outputs[0]
    if kernel.outputs != (last,):
        return "the kernel writes more than the epilogue's last value"
    if graph.types[last].dtype not in _WRITTEN:
        return f"a {graph.types[last].dtype} result"
    return Int8Matmul(rows=a_type.numel // a_type.shape[-1], depth=a_type.shape[-1], columns=columns,
                      signed=a_type.dtype == "int8", src=slots[a], src_zero=slots[a_zero], weights=slots[b],
                      weights_type=b_type.dtype, weights_zero=slots[b_zero],
                      weights_zero_per_column=graph.types[b_zero].rank == 1, dst=slots[last],
                      steps=tuple(steps))  # fmt: skip


def _padded(spec: Int8Matmul) -> tuple[int, int]:
    """Groups of four k (the last one zero-padded) and columns padded to whole items."""
    return (spec.depth + 3) // 4, (spec.columns + COLUMNS - 1) // COLUMNS * COLUMNS


def _create(w: CWriter, name: str, spec: Int8Matmul) -> None:
    """State (packed weights, their column sums), destroy, and create. The weights' centred values v = b[k][n] -
    b_zero (0 in the padding) packed for VNNI as int8 w[(n / 16 * K4 + k / 4) * 64 + n % 16 * 4 + k % 4], else as
    int16 pairs w[(n / 8 * K2 + k / 2) * 16 + n % 8 * 2 + k % 2] (K2 = 2 K4); colsum[n] = the column's sum (VNNI's)."""
    groups, padded = _padded(spec)
    zero = "zb[n]" if spec.weights_zero_per_column else "zb[0]"
    b_type = _C_TYPES[spec.weights_type]
    with create_function(w, name, "int8_t *w; int32_t *colsum;", ["w", "colsum"],
                         [f"s->w = (int8_t *)aligned_alloc(64, {groups * padded * 4} * (KO_I8_VNNI ? 1 : 2));",
                          f"s->colsum = (int32_t *)aligned_alloc(64, {padded * 4});"]):  # fmt: skip
        w.line(f"const {b_type} *b = (const {b_type} *)a[{spec.weights}];",
               f"const {b_type} *zb = (const {b_type} *)a[{spec.weights_zero}];")
        with w.block(f"for (long n = 0; n < {padded}; n++)"):
            w.line("int32_t sum = 0;")
            with w.block(f"for (long k = 0; k < {groups * 4}; k++)"):
                w.line(f"const int32_t v = k < {spec.depth} && n < {spec.columns} ? "
                       f"(int32_t)b[k * {spec.columns} + n] - (int32_t){zero} : 0;",
                       f"if (KO_I8_VNNI) s->w[(n / 16 * {groups} + k / 4) * 64 + n % 16 * 4 + k % 4] = (int8_t)v;",
                       f"else ((int16_t *)s->w)[(n / 8 * {groups * 2} + k / 2) * 16 + n % 8 * 2 + k % 2] = "
                       "(int16_t)v;",
                       "sum += v;")  # fmt: skip
            w.line("s->colsum[n] = sum;")


@dataclass(frozen=True)
class _Vectors:
    """How the epilogue is written for one vector width: its intrinsics as templates (`lanes`: the columns
    stored, a mask of the ISA's kind)."""

    prefix: str  # _mm512 or _mm256
    lanes: int  # floats to a vector
    types: dict[str, str]  # a step's dtype -> its vector type
    round: str  # round half to even
    compare: str  # {a}, {b}, {predicate}: a mask of the lanes where it holds (false with NaN)
    select: str  # {mask}, {yes}, {no}
    load_columns: str  # {pointer}: the stored columns' floats, 0 past them
    to_bytes: str  # {x}: float32 to the integer whose low byte an 8-bit result keeps
    stores: dict[str, str]  # written dtype -> {pointer}, {value}


_AVX512 = _Vectors(
    prefix="_mm512", lanes=16, types={"float32": "__m512", "bool": "__mmask16", "int32": "__m512i", "int8": "__m128i",
                            "uint8": "__m128i"},
    round="_mm512_roundscale_ps({x}, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)",
    compare="_mm512_cmp_ps_mask({a}, {b}, {predicate})", select="_mm512_mask_blend_ps({mask}, {no}, {yes})",
    load_columns="_mm512_maskz_loadu_ps(lanes, {pointer})", to_bytes="_mm512_cvtepi32_epi8(_mm512_cvttps_epi32({x}))",
    stores={"float32": "_mm512_mask_storeu_ps({pointer}, lanes, {value});",
            "int32": "_mm512_mask_storeu_epi32({pointer}, lanes, {value});",
            "int8": "_mm_mask_storeu_epi8({pointer}, lanes, {value});"})  # fmt: skip
_AVX2 = _Vectors(
    prefix="_mm256", lanes=8, types={"float32": "__m256", "bool": "__m256", "int32": "__m256i", "int8": "__m256i",
                            "uint8": "__m256i"},
    round="_mm256_round_ps({x}, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)",
    compare="_mm256_cmp_ps({a}, {b}, {predicate})", select="_mm256_blendv_ps({no}, {yes}, {mask})",
    load_columns="_mm256_maskload_ps({pointer}, lanes)", to_bytes="_mm256_cvttps_epi32({x})",
    stores={"float32": "_mm256_maskstore_ps({pointer}, lanes, {value});",
            "int32": "_mm256_maskstore_epi32({pointer}, lanes, {value});",
            "int8": "ko_i8_store8({pointer}, {value}, count);"})  # fmt: skip


def _vector_operand(operand: Operand, column: str, isa: _Vectors) -> str:
    if operand.kind == "sums":
        return "v"
    if operand.kind == "step":
        return f"t{operand.index}"
    pointer = f"e{operand.index} + {column}"
    return isa.load_columns.format(pointer=pointer) if operand.per_column else \
        f"{isa.prefix}_set1_ps(e{operand.index}[0])"  # fmt: skip


def _vector_epilogue(w: CWriter, spec: Int8Matmul, row: str, column: str, isa: _Vectors) -> None:
    """The sums `v` of (row, column..) through the epilogue's steps and stored (the columns `lanes`)."""
    for index, step in enumerate(spec.steps):
        x = [_vector_operand(o, column, isa) for o in step.operands]
        if step.prim == "cast":
            value = {"float32": f"{isa.prefix}_cvtepi32_ps({x[0]})", "int32": f"{isa.prefix}_cvttps_epi32({x[0]})"}\
                .get(step.dtype, isa.to_bytes.format(x=x[0]))  # 8-bit: the low byte, as C's
        elif step.prim == "round":
            value = isa.round.format(x=x[0])
        elif step.prim == "saturating_round":  # max_ps gives its second operand where the first is NaN: low
            rounded = isa.round.format(x=x[0])
            value = f"{isa.prefix}_min_ps({isa.prefix}_max_ps({isa.prefix}_add_ps({rounded}, {x[1]}), {x[2]}), {x[3]})"
        elif step.prim in _COMPARISONS:
            value = isa.compare.format(a=x[0], b=x[1], predicate=_COMPARISONS[step.prim])
        elif step.prim == "where":
            value = isa.select.format(mask=x[0], yes=x[1], no=x[2])
        elif step.prim in _LANEWISE:
            value = f"{_lanewise_name(step.prim, isa)}({x[0]})"
        else:
            value = f"{isa.prefix}_{_ARITHMETIC[step.prim]}({x[0]}, {x[1]})"
        w.line(f"const {isa.types[step.dtype]} t{index} = {value};")
    result = f"t{len(spec.steps) - 1}" if spec.steps else "v"
    store = isa.stores.get(spec.written, isa.stores["int8"])
    pointer = f"({_C_RESULT_TYPES[spec.written]} *)dst + ({row}) * {spec.columns}L + {column}"
    w.line(store.format(pointer=pointer, value=result))


def _lanewise_name(prim: str, isa: _Vectors) -> str:
    return f"ko_i8_{prim}{isa.lanes}"


def _lanewise_helpers(spec: Int8Matmul, isa: _Vectors) -> list[str]:
    """The vector form of each transcendental step: the lanes stored, mapped by the prelude's scalar function (the
    scalar path's, so both paths round alike where the compiler contracts alike), loaded back. The loop is kept
    rolled: GCC 12 unrolls a loop of 8 or 16 before its vectorizer sees it and then computes the lanes one by one
    (64 vdivss in an erf epilogue; one vdivps per vector rolled, with the plan's -fno-trapping-math)."""
    helpers = []
    for prim in sorted({step.prim for step in spec.steps if step.prim in _LANEWISE}):
        name, vector = _lanewise_name(prim, isa), isa.types["float32"]
        helpers.append(f"""#ifndef {name.upper()}
#define {name.upper()}
static inline {vector} {name}({vector} x) {{
  float t[{isa.lanes}] __attribute__((aligned({isa.lanes * 4})));
  {isa.prefix}_store_ps(t, x);
  #pragma GCC unroll 1
  for (int i = 0; i < {isa.lanes}; i++) t[i] = {_LANEWISE[prim]}(t[i]);
  return {isa.prefix}_load_ps(t);
}}
#endif""")
    return helpers


def _vnni_items(w: CWriter, spec: Int8Matmul) -> None:
    """The items' loop on VNNI dot products (inside the guard). The accumulators, weight vectors and rows are
    named one by one (GCC keeps an array of vectors that a loop indexes in memory: every step spilled them)."""
    groups, padded = _padded(spec)
    full = spec.depth // 4
    blocks = padded // COLUMNS
    vectors = range(COLUMNS // 16)
    w.line("#pragma omp parallel for schedule(static)")
    with w.block(f"for (long it = 0; it < {(spec.rows + ROWS - 1) // ROWS * blocks}L; it++)"):
        w.line(f"const long m0 = it / {blocks} * {ROWS}, n0 = it % {blocks} * {COLUMNS};",
               f"const int rows = {spec.rows} - m0 < {ROWS} ? (int)({spec.rows} - m0) : {ROWS};",
               f"const int8_t *wb = s->w + n0 / 16 * {groups * 64}L;")  # fmt: skip
        for r in range(ROWS):  # rows past the last are computed from the last row (in bounds) and never stored
            w.line(f"const uint8_t *row{r} = src + (m0 + ({r} < rows ? {r} : rows - 1)) * {spec.depth}L;",
                   f"__m512i {', '.join(f'c{r}_{j} = _mm512_setzero_si512()' for j in vectors)};")  # fmt: skip
        if spec.signed:  # int8 rows read as unsigned: a + 128
            w.line("const __m512i flip = _mm512_set1_epi32((int)0x80808080u);")
        with w.block(f"for (long g = 0; g < {groups}; g++)"):
            w.line(*(f"const __m512i w{j} = _mm512_load_si512((const void *)(wb + ({j * groups} + g) * 64));"
                     for j in vectors))  # fmt: skip
            for r in range(ROWS):
                if full == groups:
                    load = f"_mm512_set1_epi32(ko_i8_word(row{r} + g * 4))"
                else:  # the last group's bytes past K are not the row's: read those inside it only
                    tail = " | ".join(f"(uint32_t)row{r}[g * 4 + {t}] << {8 * t}" for t in range(spec.depth % 4))
                    load = f"_mm512_set1_epi32(g < {full} ? ko_i8_word(row{r} + g * 4) : (int32_t)({tail}))"
                w.line(f"const __m512i x{r} = {f'_mm512_xor_si512({load}, flip)' if spec.signed else load};",
                       *(f"c{r}_{j} = _mm512_dpbusd_epi32(c{r}_{j}, x{r}, w{j});" for j in vectors))
        for j in vectors:
            with w.block(f"if (n0 + {j * 16} < {spec.columns})"):
                w.line(f"const long n = n0 + {j * 16};",
                       f"const __mmask16 lanes = {spec.columns} - n >= 16 ? (__mmask16)0xFFFF : "
                       f"(__mmask16)((1u << ({spec.columns} - n)) - 1);",
                       "const __m512i zc = _mm512_mullo_epi32(_mm512_set1_epi32(za), "
                       "_mm512_load_si512((const void *)(s->colsum + n)));")  # fmt: skip
                for r in range(ROWS):
                    with w.block(f"if ({r} < rows)"):
                        w.line(f"const __m512i v = _mm512_sub_epi32(c{r}_{j}, zc);")
                        _vector_epilogue(w, spec, f"m0 + {r}", "n", _AVX512)


def _avx2_items(w: CWriter, spec: Int8Matmul) -> None:
    """The items' loop on AVX2's exact int16 products (inside its guard): each item widens its rows, a chunk of k
    at a time, into int16 on its stack (a - za, zero past K), then per pair of k broadcasts each row's pair and adds
    `vpmaddwd`'s int32 sums of the two products into its accumulators."""
    groups, _ = _padded(spec)
    pairs = groups * 2  # the packed pairs per column (K rounded up to four)
    blocks = (spec.columns + AVX2_COLUMNS - 1) // AVX2_COLUMNS
    vectors = range(AVX2_COLUMNS // 8)
    chunk = min(PAIR_CHUNK, groups * 4)
    w.line("#pragma omp parallel for schedule(static)")
    row_blocks = (spec.rows + AVX2_ROWS - 1) // AVX2_ROWS
    with w.block(f"for (long it = 0; it < {row_blocks * blocks}L; it++)"):
        # a thread's consecutive items share their columns: its weights stay in cache, the rows are streamed
        w.line(f"const long m0 = it % {row_blocks} * {AVX2_ROWS}, n0 = it / {row_blocks} * {AVX2_COLUMNS};",
               f"const int rows = {spec.rows} - m0 < {AVX2_ROWS} ? (int)({spec.rows} - m0) : {AVX2_ROWS};",
               f"const int16_t *wb = (const int16_t *)s->w + n0 / 8 * {pairs * 16}L;",
               f"int16_t x[{AVX2_ROWS}][{chunk}] __attribute__((aligned(32)));")  # fmt: skip
        for r in range(AVX2_ROWS):  # rows past the last are computed from the last row (in bounds), never stored
            w.line(f"const uint8_t *row{r} = src + (m0 + ({r} < rows ? {r} : rows - 1)) * {spec.depth}L;",
                   f"__m256i {', '.join(f'c{r}_{j} = _mm256_setzero_si256()' for j in vectors)};")  # fmt: skip
        flip = " ^ 0x80" if spec.signed else ""
        with w.block(f"for (long k0 = 0; k0 < {spec.depth}; k0 += {chunk})"):
            w.line(f"const long kn = {spec.depth} - k0 < {chunk} ? {spec.depth} - k0 : {chunk};")
            for r in range(AVX2_ROWS):
                w.line(f"for (long k = 0; k < kn; k++) x[{r}][k] = (int16_t)((int32_t)(row{r}[k0 + k]{flip}) - za);",
                       f"for (long k = kn; k < (kn + 1) / 2 * 2; k++) x[{r}][k] = 0;")  # fmt: skip
            with w.block("for (long p = 0; p < (kn + 1) / 2; p++)"):
                w.line(*(f"const __m256i w{j} = _mm256_load_si256((const __m256i *)(wb + ({j * pairs}L + k0 / 2 + p) "
                         "* 16));" for j in vectors))  # fmt: skip
                for r in range(AVX2_ROWS):
                    w.line(f"const __m256i x{r} = _mm256_set1_epi32(ko_i8_word((const uint8_t *)&x[{r}][2 * p]));",
                           *(f"c{r}_{j} = _mm256_add_epi32(c{r}_{j}, _mm256_madd_epi16(x{r}, w{j}));"
                             for j in vectors))  # fmt: skip
        for j in vectors:
            with w.block(f"if (n0 + {j * 8} < {spec.columns})"):
                w.line(f"const long n = n0 + {j * 8};",
                       f"const int count = {spec.columns} - n >= 8 ? 8 : (int)({spec.columns} - n);",
                       "const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), "
                       "_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));",
                       "(void)lanes; (void)count;")  # fmt: skip
                for r in range(AVX2_ROWS):
                    with w.block(f"if ({r} < rows)"):
                        w.line(f"const __m256i v = c{r}_{j};")
                        _vector_epilogue(w, spec, f"m0 + {r}", "n", _AVX2)


def _scalar_operand(operand: Operand) -> str:
    if operand.kind == "sums":
        return "v"
    if operand.kind == "step":
        return f"t{operand.index}"
    return f"e{operand.index}[n]" if operand.per_column else f"e{operand.index}[0]"


_C_RESULT_TYPES = {"float32": "float", "bool": "int", "int32": "int32_t", "int8": "int8_t", "uint8": "uint8_t"}


def _scalar_items(w: CWriter, spec: Int8Matmul) -> None:
    """The same sums of the pairs in scalar C (int64, then int32 as the vector sums wrap), and the epilogue
    as generated C computes it (codegen/c/expr.py)."""
    groups, _ = _padded(spec)
    flip = "^ 0x80" if spec.signed else ""
    w.line("#pragma omp parallel for schedule(static)")
    with w.block(f"for (long m = 0; m < {spec.rows}L; m++)"):
        with w.block(f"for (long n = 0; n < {spec.columns}; n++)"):
            w.line("int64_t sum = 0;",
                   f"for (long k = 0; k < {spec.depth}; k++) "
                   f"sum += (int64_t)((int32_t)(uint8_t)(src[m * {spec.depth}L + k] {flip}) - za) * "
                   f"((const int16_t *)s->w)[(n / 8 * {groups * 2} + k / 2) * 16 + n % 8 * 2 + k % 2];",
                   "const int32_t v = (int32_t)sum;")  # fmt: skip
            dtypes = ["int32"]
            for index, step in enumerate(spec.steps):
                x = [_scalar_operand(o) for o in step.operands]
                if step.prim == "cast":
                    source = dtypes[step.operands[0].index + 1] if step.operands[0].kind == "step" else "int32"
                    value = c_cast(x[0], source, step.dtype)
                elif step.prim == "round":
                    value = c_unary("round", "float32", x[0])
                elif step.prim == "saturating_round":
                    value = c_quaternary(step.prim, *x)
                elif step.prim == "where":
                    value = f"({x[0]} ? {x[1]} : {x[2]})"
                elif step.prim in _LANEWISE:
                    value = f"{_LANEWISE[step.prim]}({x[0]})"
                else:
                    value = c_binary(step.prim, "float32", x[0], x[1])
                w.line(f"const {_C_RESULT_TYPES[step.dtype]} t{index} = {value};")
                dtypes.append(step.dtype)
            result = f"t{len(spec.steps) - 1}" if spec.steps else "v"
            w.line(f"(({_C_RESULT_TYPES[spec.written]} *)dst)[m * {spec.columns}L + n] = {result};")


def render(name: str, spec: Int8Matmul) -> str:
    """C for the kernel: its state, create (packing), run, destroy."""
    w = CWriter()
    w.verbatim(VNNI_GUARD, "#include <immintrin.h>", *_lanewise_helpers(spec, _AVX512), "#endif", WORD, LAYOUT,
               AVX2_BYTES)
    avx2_helpers = _lanewise_helpers(spec, _AVX2)
    if avx2_helpers:
        w.verbatim("#if defined(__AVX2__)", "#include <immintrin.h>", *avx2_helpers, "#endif")
    _create(w, name, spec)
    a_type = _C_TYPES["int8" if spec.signed else "uint8"]
    with w.function(f"static int {name}_run(void *state, void *stream, void **a)"):
        w.line("(void)stream;", f"const {name}_state *s = (const {name}_state *)state;",
               f"const uint8_t *src = (const uint8_t *)a[{spec.src}];",
               # the sums use the zero point of the rows as read (unsigned: int8 rows moved by 128)
               f"const int32_t za = (int32_t)((const {a_type} *)a[{spec.src_zero}])[0]"
               f"{' + 128' if spec.signed else ''};",
               f"void *dst = a[{spec.dst}];")  # fmt: skip
        inputs = sorted({o.index for step in spec.steps for o in step.operands if o.kind == "input"})
        w.line(*(f"const float *e{slot} = (const float *)a[{slot}];" for slot in inputs))
        w.verbatim(VNNI_GUARD)
        _vnni_items(w, spec)
        w.verbatim(AVX2_GUARD)
        _avx2_items(w, spec)
        w.verbatim("#else")
        _scalar_items(w, spec)
        w.verbatim("#endif")
    return w.text(end="\n")


def on_amx_tiles(kernel: CandidateKernel) -> str | None:
    """Why oneDNN's int8 matmul runs this kernel instead (None where it should not): on a CPU with AMX-INT8 its
    brgemm multiplies on the tiles (a tile product is 16x16x64 multiply-adds, VNNI's dot product 16x4) where this
    kernel has VNNI only: static gpt2_mini's plan ran 1.49x faster end to end with its 24 matmuls there (13.03 ->
    8.72 ms, Xeon with AMX, 2 threads, alternated in one process)."""
    if "amx_int8" not in machine.isa_flags() or not ONEDNN.applies(kernel).runs:
        return None
    implementation = library_implementation(library_call(kernel)) or ""
    return f"oneDNN's int8 matmul runs it on AMX tiles ({implementation})" if "amx" in implementation else None


class Int8MatmulBackend(Backend):
    """matmul_integer and its epilogue (de- and requantization) as one kernel (`describe` says which)."""

    name = "int8_matmul"
    family = "native C"
    stateful = True
    signature_label = "int8"

    def applies(self, kernel: CandidateKernel) -> Verdict:
        spec = describe(kernel)
        if isinstance(spec, str):
            return declines(spec)
        tiles = on_amx_tiles(kernel)
        if tiles is not None:
            return declines(tiles)
        epilogue = f" + {len(spec.steps)} epilogue steps" if spec.steps else ""
        return runs(f"int8 matmul {spec.rows}x{spec.depth}x{spec.columns}{epilogue}, written {spec.written}")

    def source(self, name: str, kernel: CandidateKernel) -> str:
        spec = describe(kernel)
        assert not isinstance(spec, str), spec
        return render(name, spec)

    def signature_text(self, kernel: CandidateKernel) -> str:
        source = self.source("k", kernel)
        return prelude_used_by(source) + source  # the helpers a transcendental step calls are part of its code


BACKEND = Int8MatmulBackend()
