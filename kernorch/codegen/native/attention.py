"""Fused attention (issue 43 item 3): QKᵀ, the elementwise steps on the scores (scale, mask), softmax with its
row max, and ·V in one kernel, per head and per block of query rows in cache — the scores never reach memory.

The pattern is what fission and the rewrites leave of an attention: S = matmul(Q, Kᵀ); elementwise steps on S
with constants or inputs broadcast onto it; m = reduce_max(S); E = exp(S - m); l = reduce_sum(E); and either
matmul(E, V) / l (the rewrites move the division past the matmul) or matmul(E / l, V), where elementwise steps
with scalar constants may stand between E / l and the matmul (transformers' exports guard a fully masked row
with where(isnan(P), 0, P): the kernel then divides and guards each weight). Q, Kᵀ and V are read
through the strided views that compute them (ir/strided.py: the QKV projection's split, reshape and transposes
cost nothing), in float32 or bfloat16. A bf16 plan's operand casts are absorbed: where all four operands (Q, Kᵀ,
V, the weights) reach bf16 matmuls, a CPU with AMX multiplies them rounded on tiles (attention_amx.py); otherwise
the kernel multiplies in float32, which is at least as accurate as the bf16 matmuls it replaces.

Each thread packs, once per head it visits, Kᵀ as [D][Lk padded] and V as [Lk][Dv] into its scratch (float32),
then for each block of R query rows computes the R score rows with register-blocked FMAs (R rows x JV vectors of
keys), the steps and the softmax on them in L1, and R rows of output (R rows x CV vectors of Dv). The plan's
orchestrator weighs the kernel against the unfused kernels like any candidate (orchestrate/candidates.py adds
the node set; the profile cost model times it).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kernorch.codegen.backends.templates import CTemplate
from kernorch.codegen.c import CWriter, c_binary, c_literal, c_unary
from kernorch.codegen.native.attention_amx import (
    AmxLoads,
    write_amx_exp_pass,
    write_amx_path,
    write_exp_pass_f32,
    write_float_exp_pass,
)
from kernorch.codegen.native.preambles import AMX_SUPPORT, EXP16_SUPPORT
from kernorch.codegen.native.skeleton import VECTOR_TYPES
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.primitives import STRIDED_VIEW_PRIMS
from kernorch.ir.strided import row_major, strided_view

# Query rows per block: R x JV score accumulators, R x CV output accumulators (JV = CV = 2 vectors with AVX-512, 1
# with AVX2). Each block reads the head's packed Kᵀ and V (64 KB at 128 keys x 64 dims: more than L1) from L2, so
# 8 rows x 2 vectors beat 4 x 4 (bert_mini's attention 88 -> 82 us; 12 x 2 and 6 x 4 were slower).
ROWS = 8
AMX_ROWS = 16  # query rows per block on AMX: a tile's rows
MAX_THREADS = 8  # per-thread scratch is allocated for this many; more threads than this are not used
MAX_SCRATCH_PER_THREAD = 4 << 20  # bytes: beyond this (very long sequences) the kernel declines
DV_MULTIPLE = 16  # the head dim of V is covered by whole vectors (16 floats: one AVX-512 or two AVX2 vectors)
_STEPS = {"mul": "*", "add": "+", "sub": "-", "div": "/"}
_OPERAND_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Operand:
    """A matrix per batch item read from one kernel argument: element (b, row, col) at
    offsets[b] + row * row_stride + col * col_stride."""

    slot: int
    dtype: str
    offsets: tuple[int, ...]
    row_stride: int
    col_stride: int
    prologue: tuple[tuple[str, float], ...] = ()  # (mul or div, scalar) applied to each element read, in order
    rounded: bool = False  # the matmul reads it rounded to bfloat16 (a bf16 plan's cast is its last step)


@dataclass(frozen=True)
class ScoreStep:
    """One elementwise step on the scores: S = S op x (or x op S when `scores_first` is False), x broadcast."""

    op: str
    scores_first: bool
    operand: Operand


@dataclass(frozen=True)
class Attention:
    batch: int  # heads times batch: the product of the leading axes
    lq: int
    lk: int
    d: int
    dv: int
    q: Operand  # [Lq, D]
    kt: Operand  # [D, Lk]
    v: Operand  # [Lk, Dv]
    steps: tuple[ScoreStep, ...]
    out_slot: int
    divide_after: bool  # matmul(E, V) / l (True) or matmul(E / l, V): the kernel divides its output rows either way
    # C of the elementwise steps between E / l and ·V (torch's guard turning a fully masked row's NaN into 0), in
    # terms of `w`: the weights are then computed, guarded and multiplied as such (no division of the output)
    weight_expr: str | None = None
    # Q, Kᵀ, V and the weights all reach their matmuls rounded to bfloat16 (a bf16 plan whose two matmuls multiply
    # in bf16): the products may then run on AMX tiles with the very operands the unfused plan's matmuls have
    bf16_products: bool = False

    @property
    def padded_keys(self) -> int:
        return -(-self.lk // 16) * 16

    @property
    def scratch_floats_per_thread(self) -> int:
        """Kᵀ, V, the score rows, the query rows, and a cache line to align to."""
        return self.d * self.padded_keys + self.lk * self.dv + ROWS * self.padded_keys + ROWS * self.d + 16

    @property
    def amx_scratch_bytes_per_thread(self) -> int:
        """The AMX path's: Kᵀ and V packed as tiles (bfloat16 pairs), a block of query rows, its scores (float32),
        its weights (bfloat16) and its output tile rows (float32); 0 when its products are not bfloat16."""
        if not self.bf16_products:
            return 0
        dp, lk32 = -(-self.d // 32) * 32, -(-self.lk // 32) * 32
        return 2 * (self.padded_keys * dp + lk32 * self.dv + AMX_ROWS * dp + AMX_ROWS * lk32) + \
            4 * AMX_ROWS * (self.padded_keys + self.dv) + 64  # fmt: skip

    @property
    def scratch_bytes_per_thread(self) -> int:
        return max(self.scratch_floats_per_thread * 4, self.amx_scratch_bytes_per_thread)


def _producers(kernel: CandidateKernel) -> dict[str, int]:
    return {out: i for i in kernel.nodes for out in kernel.graph.nodes[i].outputs}


def _consumers(kernel: CandidateKernel, value: str) -> list[int]:
    return [i for i in kernel.nodes if value in kernel.graph.nodes[i].inputs]


def _batch_offsets(shape: tuple[int, ...], strides: tuple[int, ...], offset: int, batch_shape: tuple[int, ...]) -> \
        tuple[int, ...]:  # fmt: skip
    """Element offsets of each batch item (leading axes, row-major order); a size-1 axis broadcasts."""
    return tuple(offset + sum(i * (strides[a] if shape[a] != 1 else 0) for a, i in enumerate(index))
                 for index in itertools.product(*(range(n) for n in batch_shape)))  # fmt: skip


def _matrix(kernel: CandidateKernel, value: str, batch_shape: tuple[int, ...], absorbed: set[int]) -> \
        Operand | str:  # fmt: skip
    """`value` (a matmul operand) as an Operand: a kernel input, or a strided view of one computed inside the
    kernel, on the way through casts to bfloat16 (skipped: the kernel multiplies in float32) and products or
    quotients by a scalar constant (applied to each element read: vit's query scaling). The nodes it absorbs
    are added to `absorbed`."""
    graph, producers = kernel.graph, _producers(kernel)
    stepped: set[int] = set()
    prologue: list[tuple[str, float]] = []  # value side first
    last_step: str | None = None  # the computing node nearest the matmul: a cast to bf16 rounds what it reads
    current = value
    while current in producers:
        index = producers[current]
        node = graph.nodes[index]
        if node.prim in STRIDED_VIEW_PRIMS:
            current = node.inputs[0]
            continue
        last_step = node.prim if last_step is None else last_step
        if node.prim == "cast" and node.attr("to") == "bfloat16":
            stepped.add(index)
        elif node.prim in ("mul", "div") and _scalar_constant(kernel, node.inputs[1]) is not None:
            stepped.add(index)
            prologue.append((node.prim, _scalar_constant(kernel, node.inputs[1]) or 0.0))
        else:
            return f"operand {value} is computed inside the kernel by {node.prim}"
        current = node.inputs[0]
    if value in producers:
        view = strided_view(graph, set(kernel.nodes), value, frozenset(stepped))
        if view is None or view.source in producers:
            return f"operand {value} is not a strided view of a kernel input"
        absorbed.update(view.nodes)
        source, offset, shape, strides = view.source, view.offset, view.shape, view.strides
    else:
        source, offset, shape = value, 0, graph.types[value].shape
        strides = row_major(shape)
    if shape[:-2] != batch_shape:
        return f"operand {value} of shape {shape} does not match the heads {batch_shape}"
    dtype = str(graph.types[source].dtype)
    if dtype not in _OPERAND_DTYPES:
        return f"operand {value} is {dtype}"
    rounded = last_step == "cast" or (last_step is None and dtype == "bfloat16")
    return Operand(kernel.inputs.index(source), dtype, _batch_offsets(shape, strides, offset, batch_shape),
                   strides[-2], strides[-1], tuple(reversed(prologue)), rounded)


def _scalar_constant(kernel: CandidateKernel, value: str) -> float | None:
    """The float32 value of a constant with one element, or None."""
    graph = kernel.graph
    if value not in graph.constants or str(graph.types[value].dtype) != "float32":
        return None
    array = np.asarray(graph.constants[value])
    return float(array.reshape(-1)[0]) if array.size == 1 else None


_WEIGHT_PRIMS = frozenset({"equal", "not", "where", "mul", "add", "sub", "div", "max", "min", "cast"})


def _weight_steps(kernel: CandidateKernel, weights: str, second: int, absorbed: set[int]) -> \
        tuple[str, str | None] | str:  # fmt: skip
    """The elementwise primitives between the softmax's value and the second matmul, whose other operands are
    scalar constants (torch's `where(isnan(P), 0, P)`), as one C expression of `w`: (the value the matmul reads,
    the expression or None when there are none). Casts to bfloat16 are skipped (the kernel multiplies float32)."""
    graph, producers = kernel.graph, _producers(kernel)
    expression = {weights: "w"}
    dtypes = {weights: "float32"}
    operand = graph.nodes[second].inputs[0]
    pending = [i for i in kernel.nodes if i not in absorbed and i != second]
    progress = True
    while progress and operand not in expression:
        progress = False
        for i in list(pending):
            node = graph.nodes[i]
            if node.prim not in _WEIGHT_PRIMS or len(node.outputs) != 1:
                continue
            if not all(v in expression or _scalar_value(kernel, v) is not None for v in node.inputs):
                continue
            if not any(v in expression for v in node.inputs):
                continue
            args = [expression[v] if v in expression else c_literal(_scalar_value(kernel, v), str(graph.types[v].dtype))
                    for v in node.inputs]  # fmt: skip
            dtype = next(dtypes[v] for v in node.inputs if v in expression)
            if node.prim == "cast":
                if node.attr("to") != "bfloat16":
                    return f"a cast to {node.attr('to')} between the softmax and the second matmul"
                text, out_dtype = args[0], dtype
            elif node.prim == "where":
                text, out_dtype = f"({args[0]} ? {args[1]} : {args[2]})", "float32"
            elif node.prim == "not":
                text, out_dtype = c_unary("not", "bool", args[0]), "bool"
            else:
                text, out_dtype = c_binary(node.prim, dtype, *args), ("bool" if node.prim == "equal" else dtype)
            expression[node.outputs[0]], dtypes[node.outputs[0]] = f"({text})", out_dtype
            absorbed.add(i)
            pending.remove(i)
            progress = True
    if operand not in expression:
        return "the softmax reaches the second matmul through more than scalar elementwise steps"
    if any(producers.get(v) in pending for v in graph.nodes[second].inputs[:1]):
        return "the second matmul reads a value the weight steps do not compute"
    if dtypes[operand] != "float32":
        return "the weights reach the second matmul as booleans"
    plain = expression[operand].replace("(", "").replace(")", "") == "w"  # nothing, or bf16 casts only
    return operand, (None if plain else expression[operand])


def _scalar_value(kernel: CandidateKernel, value: str) -> float | None:
    """The single element of a constant (any dtype), or None."""
    graph = kernel.graph
    if value not in graph.constants:
        return None
    array = np.asarray(graph.constants[value])
    return array.reshape(-1)[0].item() if array.size == 1 else None


def _last_axis(node_axes: tuple[int, ...], rank: int) -> bool:
    return tuple(a % rank for a in node_axes) == (rank - 1,)


def match_attention(kernel: CandidateKernel) -> Attention | str:
    """The kernel as a fused attention, or why it is not one."""
    graph = kernel.graph
    nodes = {i: graph.nodes[i] for i in kernel.nodes}
    matmuls = [i for i, n in nodes.items() if n.prim == "matmul"]
    exps = [i for i, n in nodes.items() if n.prim == "exp"]
    if len(matmuls) != 2 or len(exps) != 1 or len(kernel.outputs) != 1:
        return "not two matmuls around one softmax with one output"
    producers = _producers(kernel)

    def only_consumer(value: str) -> int | None:
        users = _consumers(kernel, value)
        return users[0] if len(users) == 1 else None

    # from the first matmul's scores through the elementwise steps to the row max
    (exp,) = exps
    candidates = [m for m in matmuls if exp in _descendants(kernel, m, stop=exp)]
    first = candidates[0] if len(candidates) == 1 else None
    if first is None:
        return "the softmax is not between the two matmuls"
    second = next(m for m in matmuls if m != first)
    scores = graph.nodes[first].outputs[0]
    shape = graph.types[scores].shape
    if len(shape) < 2 or str(graph.types[scores].dtype) != "float32":
        return "the scores are not a float32 matrix per head"
    rank, batch_shape = len(shape), tuple(shape[:-2])
    absorbed: set[int] = {first, second, exp}
    steps: list[tuple[str, bool, str]] = []
    current = scores
    while True:
        users = _consumers(kernel, current)
        step = users[0] if len(users) == 1 else None
        if step is None or nodes[step].prim not in _STEPS:
            break
        a, b = nodes[step].inputs
        other = b if a == current else a
        if other in producers or graph.types[nodes[step].outputs[0]].shape != shape:
            return f"{nodes[step].prim} on the scores reads a value computed in the kernel or changes their shape"
        steps.append((nodes[step].prim, a == current, other))
        absorbed.add(step)
        current = nodes[step].outputs[0]
    users = sorted(_consumers(kernel, current), key=lambda i: nodes[i].prim)
    if [nodes[u].prim for u in users] != ["reduce_max", "sub"]:
        return "the scores do not go to a row max and a subtraction"
    rmax, sub = users
    if not _last_axis(nodes[rmax].attr("axes"), rank) or nodes[sub].inputs != (current, nodes[rmax].outputs[0]) \
            or only_consumer(nodes[rmax].outputs[0]) != sub or only_consumer(nodes[sub].outputs[0]) != exp:  # fmt: skip
        return "not a softmax over the last axis of the scores"
    absorbed.update((rmax, sub))
    e = nodes[exp].outputs[0]
    users = sorted(_consumers(kernel, e), key=lambda i: nodes[i].prim)
    kinds = [nodes[u].prim for u in users]
    if kinds not in (["cast", "reduce_sum"], ["matmul", "reduce_sum"], ["div", "reduce_sum"]):
        return "exp's value does not go to a row sum and the second matmul"
    rsum = users[-1]
    total = nodes[rsum].outputs[0]
    if not _last_axis(nodes[rsum].attr("axes"), rank):
        return "the row sum is not over the last axis"
    absorbed.add(rsum)
    weights = e
    divide_after = kinds[0] != "div"
    if not divide_after:
        div = users[0]
        if nodes[div].inputs != (e, total):
            return "the softmax divides something else"
        absorbed.add(div)
        weights = nodes[div].outputs[0]
    weight_expr = None
    if not divide_after:
        guarded = _weight_steps(kernel, weights, second, absorbed)
        if isinstance(guarded, str):
            return guarded
        weights, weight_expr = guarded
    users = [u for u in _consumers(kernel, weights) if u != rsum]
    if len(users) == 1 and nodes[users[0]].prim == "cast" and nodes[users[0]].attr("to") == "bfloat16":
        absorbed.add(users[0])
        weights = nodes[users[0]].outputs[0]
    if [u for u in _consumers(kernel, weights) if u != rsum] != [second] or graph.nodes[second].inputs[0] != weights:
        return "the softmax's value is not the second matmul's first operand"
    weights_rounded = weights in producers and nodes[producers[weights]].prim == "cast"  # absorbed: to bf16 only
    output = graph.nodes[second].outputs[0]
    if divide_after:
        after = only_consumer(output)
        if after is None or nodes[after].prim != "div" or nodes[after].inputs != (output, total):
            return "the second matmul's product is not divided by the row sum"
        absorbed.add(after)
        output = nodes[after].outputs[0]
    if kernel.outputs != (output,) or str(graph.types[output].dtype) != "float32":
        return "the kernel's output is not the attention's float32 result"
    q = _matrix(kernel, graph.nodes[first].inputs[0], batch_shape, absorbed)
    kt = _matrix(kernel, graph.nodes[first].inputs[1], batch_shape, absorbed)
    v = _matrix(kernel, graph.nodes[second].inputs[1], batch_shape, absorbed)
    for operand in (q, kt, v):
        if isinstance(operand, str):
            return operand
    assert isinstance(q, Operand) and isinstance(kt, Operand) and isinstance(v, Operand)
    if absorbed != set(kernel.nodes):
        extra = sorted(set(kernel.nodes) - absorbed)
        return f"the kernel also holds {', '.join(nodes[i].prim for i in extra)}"
    lq, lk = shape[-2:]
    d = graph.types[graph.nodes[first].inputs[0]].shape[-1]
    dv = graph.types[output].shape[-1]
    if dv % DV_MULTIPLE:
        return f"the value head dim {dv} is not a multiple of {DV_MULTIPLE}"
    score_steps = []
    for op, scores_first, other in steps:
        other_shape = graph.types[other].shape
        other_shape = (1,) * (rank - len(other_shape)) + tuple(other_shape)  # numpy broadcasting: right-aligned
        if len(other_shape) != rank or any(o not in (1, s) for o, s in zip(other_shape, shape, strict=True)) \
                or str(graph.types[other].dtype) != "float32":  # fmt: skip
            return f"{op} on the scores with a {other_shape} operand"
        strides = tuple(0 if n == 1 else s for n, s in zip(other_shape, row_major(other_shape), strict=True))
        score_steps.append(ScoreStep(op, scores_first, Operand(
            kernel.inputs.index(other), "float32", _batch_offsets(other_shape, strides, 0, batch_shape),
            strides[-2], strides[-1])))  # fmt: skip
    found = Attention(math.prod(batch_shape), lq, lk, d, dv, q, kt, v, tuple(score_steps),
                      len(kernel.inputs), divide_after, weight_expr,
                      weights_rounded and q.rounded and kt.rounded and v.rounded)  # fmt: skip
    if found.scratch_bytes_per_thread > MAX_SCRATCH_PER_THREAD:
        return f"{lk} keys need more scratch per thread than {MAX_SCRATCH_PER_THREAD >> 20} MiB"
    return found


def _descendants(kernel: CandidateKernel, node: int, stop: int) -> set[int]:
    """Nodes of the kernel downstream of `node` (not going past `stop`)."""
    graph, found, frontier = kernel.graph, set(), [node]
    while frontier:
        for out in graph.nodes[frontier.pop()].outputs:
            for user in _consumers(kernel, out):
                if user not in found:
                    found.add(user)
                    if user != stop:
                        frontier.append(user)
    return found


def attention_supported(kernel: CandidateKernel) -> bool:
    return len(kernel.nodes) > 2 and isinstance(match_attention(kernel), Attention)


def attention_scratch_bytes(kernel: CandidateKernel) -> list[int]:
    found = match_attention(kernel)
    assert isinstance(found, Attention)
    return [found.scratch_bytes_per_thread * MAX_THREADS + 64]


def describe_attention(kernel: CandidateKernel) -> str:
    found = match_attention(kernel)
    if isinstance(found, str):
        return found
    steps = ", ".join(step.op for step in found.steps) or "none"
    products = "bfloat16 on AMX tiles where the CPU has them, else float32" if found.bf16_products else "float32"
    return (f"{found.batch} heads of {found.lq} queries x {found.lk} keys, head dims {found.d}/{found.dv}, "
            f"steps on the scores: {steps}; products in {products}; the scores stay in cache")


def _load(operand: Operand, index: str) -> str:
    """C reading one element of the operand as float32, its prologue applied (float32 rounding each step)."""
    if operand.dtype == "bfloat16":
        loaded = f"ko_bf16_float(((const uint16_t *)args[{operand.slot}])[{index}])"
    else:
        loaded = f"((const float *)args[{operand.slot}])[{index}]"
    for op, scalar in operand.prologue:
        loaded = f"({loaded} {_STEPS[op]} {float(np.float32(scalar)).hex()}f)"
    return loaded


def _offsets(name: str, operand: Operand, generic: bool = False) -> str:
    storage = "" if generic else "static "  # generic: the offsets are expressions of the sizes, computed per call
    return f"{storage}const int64_t {name}[{len(operand.offsets)}] = {{{', '.join(map(str, operand.offsets))}}};"


def _float_path(w: CWriter, a: Attention, loads: dict[str, str], softmax: Callable[[CWriter], None]) -> None:
    """float32: Kᵀ [D][LKP] and V [Lk][Dv] packed per head, FMAs on broadcast elements, for one block of ROWS
    query rows."""
    w.line("/* float32: Kᵀ [D][LKP] and V [Lk][Dv] per head, FMAs on broadcast elements */")
    with w.block("if (b != packed)"):
        _pack_kt(w, a.kt, loads["load_k"])
        w.nest("for (int64_t j = 0; j < LK; j++)",
               f"for (int64_t c = 0; c < DV; c++) vp[j * DV + c] = {loads['load_v']};")
        w.line("packed = b;")
    w.nest("for (int64_t r = 0; r < ROWS; r++)",
           f"for (int64_t d = 0; d < HD; d++) qb[r * HD + d] = r < rows ? {loads['load_q']} : 0.0f;")
    w.line("int64_t j = 0;")
    with w.block("for (; j < LKP; j += KO_VC_LANES * (j + JV * KO_VC_LANES <= LKP ? JV : 1))"):
        w.line("const int wide = j + JV * KO_VC_LANES <= LKP;", "ko_vc acc[ROWS][JV];")
        _zero_accumulators(w, "JV")
        with w.block("if (wide)"), w.block("for (int64_t d = 0; d < HD; d++)"):
            w.line("ko_vc k[JV];", "#pragma GCC unroll 4",
                   "for (int c = 0; c < JV; c++) k[c] = *(const ko_vc *)(kt + d * LKP + j + c * KO_VC_LANES);",
                   "#pragma GCC unroll 16")  # fmt: skip
            with w.block("for (int r = 0; r < ROWS; r++)"):
                w.line("const float qv = qb[r * HD + d];", "#pragma GCC unroll 4",
                       "for (int c = 0; c < JV; c++) acc[r][c] += qv * k[c];")
        with w.orelse(), w.block("for (int64_t d = 0; d < HD; d++)"):
            w.line("const ko_vc k = *(const ko_vc *)(kt + d * LKP + j);", "#pragma GCC unroll 16",
                   "for (int r = 0; r < ROWS; r++) acc[r][0] += qb[r * HD + d] * k;")
        w.line("#pragma GCC unroll 16")
        with w.block("for (int r = 0; r < ROWS; r++)"):
            w.line("#pragma GCC unroll 4", "for (int c = 0; c < (wide ? JV : 1); c++) "
                   "*(ko_vc *)(s + r * LKP + j + c * KO_VC_LANES) = acc[r][c];")  # fmt: skip
    softmax(w)
    with w.block("for (int64_t c0 = 0; c0 < DV; c0 += CV * KO_VC_LANES)"):
        w.line("const int64_t width = DV - c0 < CV * KO_VC_LANES ? (DV - c0) / KO_VC_LANES : CV;",
               "ko_vc acc[ROWS][CV];")
        _zero_accumulators(w, "CV")
        with w.block("for (int64_t j = 0; j < LK; j++)"):
            w.line("ko_vc x[CV];", "#pragma GCC unroll 4")
            w.nest("for (int c = 0; c < CV; c++)",
                   "x[c] = c < width ? *(const ko_vcu *)(vp + j * DV + c0 + c * KO_VC_LANES) : (ko_vc){0};")
            w.line("#pragma GCC unroll 16")
            with w.block("for (int r = 0; r < ROWS; r++)"):
                w.line("const float w = s[r * LKP + j];", "#pragma GCC unroll 4",
                       "for (int c = 0; c < CV; c++) acc[r][c] += w * x[c];")
        w.nest("for (int64_t r = 0; r < rows; r++)", "for (int c = 0; c < width; c++)",
               "*(ko_vcu *)(out + ((b * LQ) + i0 + r) * DV + c0 + c * KO_VC_LANES) = acc[r][c] / sums[r];")


def _zero_accumulators(w: CWriter, vectors: str) -> None:
    w.line("#pragma GCC unroll 16")
    with w.block("for (int r = 0; r < ROWS; r++)"):
        w.line("#pragma GCC unroll 4", f"for (int c = 0; c < {vectors}; c++) acc[r][c] = (ko_vc){{0}};")


def _pack_kt(w: CWriter, kt: Operand, load_k: str) -> None:
    """Kᵀ packed as [D][LKP] into the thread's scratch, in the loop order that reads the operand along its
    contiguous axis: rows copied along the keys where they are contiguous; where the head dim is (K's rows, as the
    QKV projection leaves them) in 16 x 16 tiles along the head dim, transposed in L1. Element by element across
    the keys, every read was to another cache line (a quarter of the kernel's time on bert_mini's attention)."""
    if abs(kt.col_stride) <= abs(kt.row_stride):
        with w.block("for (int64_t d = 0; d < HD; d++)"):
            w.line(f"for (int64_t j = 0; j < LK; j++) kt[d * LKP + j] = {load_k};",
                   "for (int64_t j = LK; j < LKP; j++) kt[d * LKP + j] = 0.0f;")
        return
    with w.block("for (int64_t j0 = 0; j0 < LK; j0 += 16)"):
        w.line("const int64_t jn = LK - j0 < 16 ? LK - j0 : 16;")
        with w.block("for (int64_t d0 = 0; d0 < HD; d0 += 16)"):
            w.line("const int64_t dn = HD - d0 < 16 ? HD - d0 : 16;", "float tile[16][16];")
            with w.block("for (int64_t jj = 0; jj < jn; jj++)"):
                w.line("const int64_t j = j0 + jj;", "#pragma omp simd")
                with w.block("for (int64_t dd = 0; dd < dn; dd++)"):
                    w.line("const int64_t d = d0 + dd;", f"tile[jj][dd] = {load_k};")
            w.nest("for (int64_t dd = 0; dd < dn; dd++)",
                   "for (int64_t jj = 0; jj < jn; jj++) kt[(d0 + dd) * LKP + j0 + jj] = tile[jj][dd];")
    w.nest("for (int64_t d = 0; d < HD; d++)", "for (int64_t j = LK; j < LKP; j++) kt[d * LKP + j] = 0.0f;")


def _softmax(w: CWriter, a: Attention, capacity: str, exp_pass: Callable[[CWriter], None]) -> None:
    """E's rows for a block of `capacity` query rows: the steps (one read and write of the row for all), the row
    max, exp and sum (`exp_pass` puts each e where the products read it and sums them into l). The division by the
    sum is applied to the output rows (for matmul(E / l, V) too: one division per output element instead of one
    per weight), unless guarded weights need E / l itself."""
    pointers, steps = [], []
    for i, s in enumerate(a.steps):
        o = s.operand
        x = f"x{i}[j * {o.col_stride}]" if o.col_stride else f"x{i}[0]"
        expression = f"v {_STEPS[s.op]} {x}" if s.scores_first else f"{x} {_STEPS[s.op]} v"
        pointers.append(f"const float *x{i} = (const float *)args[{o.slot}] + x{i}_off[b] + i * {o.row_stride};")
        steps.append(f"v = {expression};")
    w.line(f"float sums[{capacity}] = {{0}};")
    with w.block("for (int64_t r = 0; r < rows; r++)"):
        w.line("float *sr = s + r * LKP;", "const int64_t i = i0 + r;", "(void)i;", "\n".join(pointers),
               "float m = -INFINITY;", "#pragma omp simd reduction(max:m)",
               f"for (int64_t j = 0; j < LK; j++) {{ float v = sr[j]; {' '.join(steps)} sr[j] = v; "
               "m = v > m ? v : m; }",
               "float l = 0.0f;")  # fmt: skip
        exp_pass(w)
        w.line("sums[r] = l;")
        if a.weight_expr is None:
            w.line("")
        else:
            w.line("#pragma omp simd",
                   f"for (int64_t j = 0; j < LK; j++) {{ const float w = sr[j] / l; sr[j] = {a.weight_expr}; }}",
                   "sums[r] = 1.0f;  /* the weights are divided and guarded already */")


_DEFINES = ("LK", "LK32", "DP", "AMX_ROWS", "LKP", "LQ", "DV", "ROWS", "HD", "JV", "CV")


def render_attention(name: str, kernel: CandidateKernel, generic: bool = False) -> str:
    """The kernel's C. `generic`: the form a shape-generic plan unifies across sizes (Backend.generic_source): the
    key and query counts as variables, what follows from them (padded counts, scratch per thread, blocks of
    query rows) computed from them in C rather than written as literals, the offset tables not static."""
    found = match_attention(kernel)
    assert isinstance(found, Attention), found
    a = found
    lkp, per_thread = a.padded_keys, str(a.scratch_bytes_per_thread)
    qblocks = str(-(-a.lq // ROWS))
    q, kt, v = a.q, a.kt, a.v
    loads = dict(load_k=_load(kt, f"k_off[b] + d * {kt.row_stride} + j * {kt.col_stride}"),
                 load_v=_load(v, f"v_off[b] + j * {v.row_stride} + c * {v.col_stride}"),
                 load_q=_load(q, f"q_off[b] + (i0 + r) * {q.row_stride} + d * {q.col_stride}"))
    values: dict[str, object] = dict(
        LK=a.lk, LK32=-(-a.lk // 32) * 32, DP=-(-a.d // 32) * 32, AMX_ROWS=AMX_ROWS, LKP=lkp, LQ=a.lq, DV=a.dv,
        ROWS=ROWS, HD=a.d, JV="(KO_VC_LANES == 16 ? 2 : 1)", CV="(KO_VC_LANES == 16 ? 2 : 1)")  # fmt: skip
    counts: list[str] = []
    if generic and not a.bf16_products:  # (the AMX path's tiles are sized in literals: it stays specialised)
        values.update(LK="ko_lk", LK32="((ko_lk + 31) / 32 * 32)", LKP="((ko_lk + 15) / 16 * 16)", LQ="ko_lq")
        counts = [f"const int64_t ko_lk = {a.lk}, ko_lq = {a.lq};"]
        per_thread = "((HD * LKP + LK * DV + ROWS * LKP + ROWS * HD + 16) * 4)"  # scratch_floats_per_thread's
        assert a.scratch_bytes_per_thread == (a.d * lkp + a.lk * a.dv + ROWS * lkp + ROWS * a.d + 16) * 4
        qblocks = "((ko_lq + ROWS - 1) / ROWS)"
    w = CWriter()
    w.line("", VECTOR_TYPES, EXP16_SUPPORT, AMX_SUPPORT if a.bf16_products else "",
           *(f"#define {macro} {values[macro]}" for macro in _DEFINES))  # fmt: skip
    with w.function(f"int {name}(void **args)"):
        generic_offsets = bool(counts)
        w.line(*counts, _offsets("q_off", q, generic_offsets), _offsets("k_off", kt, generic_offsets),
               _offsets("v_off", v, generic_offsets),
               *(_offsets(f"x{i}_off", s.operand, generic_offsets) for i, s in enumerate(a.steps)),
               f"float *out = (float *)args[{a.out_slot}];", f"char *scratch = (char *)args[{a.out_slot + 1}];",
               "int threads = omp_get_max_threads();", f"threads = threads < {MAX_THREADS} ? threads : {MAX_THREADS};")
        if a.bf16_products:
            _amx_path(w, a, loads)
        w.line("#pragma omp parallel num_threads(threads)")
        with w.block(""):
            w.line("const int64_t p = omp_get_thread_num(), np = omp_get_num_threads();",
                   f"float *kt = (float *)(((uintptr_t)(scratch + p * {per_thread}) + 63) & ~(uintptr_t)63);  "
                   "/* [D][LKP] */",
                   "float *vp = kt + HD * LKP;  /* [Lk][Dv] */", "float *s = vp + LK * DV;  /* [R][LKP] */",
                   "float *qb = s + ROWS * LKP;  /* [R][D] */", "int64_t packed = -1;",
                   f"const int64_t items = {f'{a.batch} * {qblocks}' if counts else a.batch * int(qblocks)};",
                   "const int64_t first = items * p / np, last = items * (p + 1) / np;")  # fmt: skip
            with w.block("for (int64_t it = first; it < last; it++)"):
                w.line(f"const int64_t b = it / {qblocks}, i0 = (it % {qblocks}) * ROWS;",
                       "const int64_t rows = LQ - i0 < ROWS ? LQ - i0 : ROWS;", "")
                _float_path(w, a, loads, lambda w: _softmax(w, a, "ROWS", write_float_exp_pass))
    w.line(*(f"#undef {macro}" for macro in _DEFINES))
    return w.text("\n")


def _amx_path(w: CWriter, a: Attention, loads: dict[str, str]) -> None:
    """The weights rounded where the graph rounds them: E as the exp pass computes it, for matmul(E, V) / l; E / l
    or the guarded weights (already divided: sums of 1) in a pass after the row sum."""
    v = a.v
    at_exp = a.divide_after and a.weight_expr is None
    divides = not a.divide_after and a.weight_expr is None
    amx_loads = AmxLoads(loads["load_k"], loads["load_v"],
                         _load(v, f"v_off[b] + (j + 1) * {v.row_stride} + c * {v.col_stride}"), loads["load_q"],
                         "sr[j] / l" if divides else "sr[j]")  # fmt: skip
    exps = write_amx_exp_pass if at_exp else write_exp_pass_f32
    write_amx_path(w, amx_loads, lambda w: _softmax(w, a, "AMX_ROWS", exps), a.batch * -(-a.lq // AMX_ROWS),
                   -(-a.lq // AMX_ROWS), a.scratch_bytes_per_thread, not at_exp, divides)  # fmt: skip


# QKᵀ, softmax and ·V per block of query rows: the heads' row blocks in one parallel region
BACKEND = CTemplate("fused_attention", "fused attention C template", attention_supported, attention_scratch_bytes,
                    render_attention, describe_attention,
                    lambda name, kernel: render_attention(name, kernel, generic=True))  # fmt: skip
