"""oneDNN post-ops (epilogue.py) as C statements, for the library kernels kernorch writes itself.

A direct kernel (native/depthwise_conv.py) applies its epilogue to the values it has just written, still in cache:
each post-op becomes one C statement updating the running float `v`. The scalar helpers are the generated
kernels' (c_prelude.PRELUDE: ko_expf, ko_tanhf, ko_erff), so a loop over channels vectorizes. The formulas
are oneDNN's eltwise definitions, the same ones the epilogue fitted the model's primitives against.

A kernel that holds its outputs in AVX2 registers (native/panel_conv.py, native/grouped_conv.py) applies the
post-ops that have a vector form (relu, clip, hardswish, linear, add, mul, ...) to them before the store instead:
vector_post_op_statements, the same values bit for bit, without the loop over stored outputs that cost a 1x1 conv
more than a separate pass (56x56 64 -> 256 with add + relu: 672 µs alone, 959 with the loop, 730-770 in registers).
"""

from __future__ import annotations

from kernorch.codegen.c import CWriter, c_literal
from kernorch.codegen.library.call import Tensor
from kernorch.codegen.library.epilogue import Binary, Eltwise

_BINARY = {"add": "v = v + {t};", "sub": "v = v - {t};", "mul": "v = v * {t};", "div": "v = v / {t};",
           "max": "v = KO_MAX(v, {t});", "min": "v = KO_MIN(v, {t});"}  # fmt: skip


def _f(value: float) -> str:
    return c_literal(value, "float32")


def _eltwise(op: Eltwise) -> str | None:
    """The statement for `op`, or None when kernorch has no C for it (the call then stays in oneDNN)."""
    a, b = _f(op.alpha), _f(op.beta)
    clamp = "(u < 0.0f ? 0.0f : (u > 1.0f ? 1.0f : u))"
    statements = {
        # NaN stays NaN, as in onnxruntime's Relu; with slope 0 a negative v gives +0 (0 * v would be -0)
        "relu": f"v = v > 0.0f ? v : {a} * v;" if op.alpha else "v = (v > 0.0f || v != v) ? v : 0.0f;",
        "clip": f"v = v < {a} ? {a} : (v > {b} ? {b} : v);",
        "hardswish": f"{{ const float u = {a} * v + {b}; v = v * {clamp}; }}",
        "hardsigmoid": f"{{ const float u = {a} * v + {b}; v = {clamp}; }}",
        "logistic": "v = ko_sigmoidf(v);",
        "swish": f"v = v * ko_sigmoidf({_f(op.alpha or 1.0)} * v);",
        "gelu_tanh": "v = 0.5f * v * (1.0f + ko_tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));",
        "gelu_erf": "v = 0.5f * v * (1.0f + ko_erff(v * 0.7071067811865476f));",
        "tanh": "v = ko_tanhf(v);",
        "exp": "v = ko_expf(v);",
        "abs": "v = __builtin_fabsf(v);",
        "square": "v = v * v;",
        "linear": f"v = {a} * v + {b};",
        "elu": f"v = v > 0.0f ? v : {a} * (ko_expf(v) - 1.0f);",
    }
    return statements.get(op.alg)


# The C vector_post_op_statements' selects need besides ko_v8, AVX2's 8 floats (native/skeleton.AVX2_VECTOR_TYPES
# defines both; its ko_v4 and KO_SELECT4 serve a kernel that renames the statements to half vectors)
VECTOR_SELECT = """typedef int ko_i8 __attribute__((vector_size(32)));  /* a comparison's lanes: all ones where true */
typedef int ko_i4 __attribute__((vector_size(16)));
/* per lane, x where the comparison m holds, else y (C has no ?: over vectors) */
#define KO_SELECT8(m, x, y) ((ko_v8)(((m) & (ko_i8)(x)) | (~(m) & (ko_i8)(y))))
#define KO_SELECT4(m, x, y) ((ko_v4)(((m) & (ko_i4)(x)) | (~(m) & (ko_i4)(y))))"""


def _vector_eltwise(op: Eltwise) -> str | None:
    """`op` on a vector `v` of 8 floats, with _eltwise's results (NaN kept, relu's +0), or None where it has no
    vector form here. Selects are bitwise (KO_SELECT8): C has no ?: over vectors."""
    a, b = _f(op.alpha), _f(op.beta)
    zero, one = "(ko_v8){0}", "((ko_v8){0} + 1.0f)"

    def clamped(u: str) -> str:
        return f"KO_SELECT8({u} < 0.0f, {zero}, KO_SELECT8({u} > 1.0f, {one}, {u}))"

    statements = {
        "relu": (f"v = KO_SELECT8(v > 0.0f, v, {a} * v);" if op.alpha
                 else f"v = KO_SELECT8((v > 0.0f) | (v != v), v, {zero});"),
        "clip": f"v = KO_SELECT8(v < {a}, {zero} + {a}, KO_SELECT8(v > {b}, {zero} + {b}, v));",
        "hardswish": f"{{ const ko_v8 u = {a} * v + {b}; v = v * {clamped('u')}; }}",
        "hardsigmoid": f"{{ const ko_v8 u = {a} * v + {b}; v = {clamped('u')}; }}",
        "abs": "v = (ko_v8)((ko_i8)v & 0x7fffffff);",
        "square": "v = v * v;",
        "linear": f"v = {a} * v + {b};",
    }  # fmt: skip
    return statements.get(op.alg)


def vector_operand(position: int, tensor: Tensor, n: str, c: str, y: str, x: str) -> str | None:
    """C of 8 lanes of binary operand `position` (binary_operands' `t{position}`) from element (n, c, y, x) on along
    its channels: a vector load where they are contiguous, one value for all of them where it broadcasts over
    channels; None otherwise."""
    dims, strides = tensor.dims, tensor.strides
    axes = ((n, dims[0], strides[0]), (y, dims[2], strides[2]), (x, dims[3], strides[3]))
    offset = " + ".join(f"(long)({index}) * {0 if size == 1 else stride}" for index, size, stride in axes)
    if dims[1] == 1:
        return f"((ko_v8){{0}} + t{position}[{offset}])"
    if strides[1] != 1:
        return None
    return f"*(const ko_v8u *)(t{position} + {offset} + {c})"


def vector_post_op_statements(post_ops: tuple[tuple[Eltwise | Binary, Tensor | None], ...],
                              operand: list[str]) -> list[str] | None:  # fmt: skip
    """post_op_statements on a vector `v` of AVX2's 8 floats (native/skeleton.AVX2_VECTOR_TYPES: ko_v8, ko_i8,
    KO_SELECT8), for a kernel applying its epilogue to accumulators before it stores them; `operand[i]` is the C
    of binary post-op i's vector. None where a post-op has no vector form (the transcendentals; max and min): the
    kernel then runs post_op_loop over the outputs it stored."""
    lines, binary = [], 0
    for op, _ in post_ops:
        if isinstance(op, Binary):
            if op.alg in ("max", "min"):
                return None
            lines.append(_BINARY[op.alg].format(t=operand[binary]))
            binary += 1
        else:
            statement = _vector_eltwise(op)
            if statement is None:
                return None
            lines.append(statement)
    return lines


def post_ops_rejection(post_ops: tuple[tuple[Eltwise | Binary, Tensor | None], ...]) -> str | None:
    """Why these post-ops have no C here (None when every one has)."""
    for op, _ in post_ops:
        if isinstance(op, Eltwise) and _eltwise(op) is None:
            return f"no C for the {op.alg} post-op"
    return None


def binary_operands(post_ops: tuple[tuple[Eltwise | Binary, Tensor | None], ...]) -> tuple[list[str], list[str]]:
    """(C declaring a pointer per binary operand, the C expression of each one's element) for a kernel that
    loops over the output with `long n`, `int c` (channel), `y` and `x`: dims of size 1 broadcast."""
    pointers, operands = [], []
    for position, (_, tensor) in enumerate(post_ops):
        if tensor is None:
            continue
        n, c, y, x = (0 if d == 1 else s for d, s in zip(tensor.dims, tensor.strides, strict=True))
        pointers.append(f"const float *t{position} = (const float *)a[{tensor.slot}] + {tensor.offset};")
        operands.append(f"t{position}[n * {n}L + (long)c * {c} + (long)y * {y} + (long)x * {x}]")
    return pointers, operands


def post_op_loop(w: CWriter, row: str, first: str, last: str, statements: list[str], simd: bool = False,
                 store: str | None = None) -> None:  # fmt: skip
    """C applying `statements` (post_op_statements) to `row[c]` for channels c in [first, last), in place or, with
    `store`, into that element (C in terms of c): the loop a direct kernel runs over the outputs it has just
    computed, still in L1."""
    if simd:
        w.line("#pragma omp simd")
    with w.block(f"for (int c = {first}; c < {last}; c++)"):
        w.line(f"float v = {row}[c];", *statements, f"{store or f'{row}[c]'} = v;")


def post_op_statements(post_ops: tuple[tuple[Eltwise | Binary, Tensor | None], ...],
                       operand: list[str]) -> list[str]:  # fmt: skip
    """One statement per post-op on `v`; `operand[i]` is the C expression of binary post-op i's element (the
    caller knows the loop variables)."""
    lines, binary = [], 0
    for op, _ in post_ops:
        if isinstance(op, Binary):
            lines.append(_BINARY[op.alg].format(t=operand[binary]))
            binary += 1
        else:
            statement = _eltwise(op)
            assert statement is not None, "post_ops_rejection accepted these post-ops"
            lines.append(statement)
    return lines


def vector_epilogue(post_ops: tuple[tuple[Eltwise | Binary, Tensor | None], ...], n: str, c: str, y: str,
                    x: str) -> list[str] | None:  # fmt: skip
    """vector_post_op_statements for the 8 output channels from element (n, c, y, x) on, each binary operand read
    by vector_operand; None where a post-op or an operand has no vector form."""
    operands = [vector_operand(position, tensor, n, c, y, x)
                for position, (_, tensor) in enumerate(post_ops) if tensor is not None]  # fmt: skip
    if any(operand is None for operand in operands):
        return None
    return vector_post_op_statements(post_ops, [operand for operand in operands if operand is not None])
