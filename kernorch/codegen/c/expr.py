"""C for the values and indices of a loop description: literals, elementwise primitives, index arithmetic.

Used by the GIR renderer of generated kernels (`c/render.py`) and by the epilogues of library calls, so
a primitive has one C spelling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kernorch.codegen.loops import C_TYPES, Tree
from kernorch.ir.primitives import BOOLEAN_RESULTS

FLOAT_SUFFIX = {"float32": "f", "float64": ""}


def c_math(name: str, dtype: str) -> str:
    return name + FLOAT_SUFFIX.get(dtype, "")


# Integer arithmetic wraps around (two's complement, as onnxruntime and numpy): computed on the unsigned type,
# where C defines overflow, and converted back.
_UNSIGNED = {"int32": "uint32_t", "int64": "uint64_t", "int16": "uint16_t", "int8": "uint8_t", "uint16": "uint16_t",
             "uint8": "uint8_t"}  # fmt: skip
# the prelude's out-of-range-safe conversions; a narrower integer keeps the low bits of the 32-bit one (as x86's
# truncating conversion narrowed, which is what onnxruntime's casts compute)
FLOAT_TO_INT = {"int32": "ko_f2i32", "int64": "ko_f2i64", "int16": "(int16_t)ko_f2i32", "uint16": "(uint16_t)ko_f2i32",
                "int8": "(int8_t)ko_f2i32", "uint8": "(uint8_t)ko_f2i32"}  # fmt: skip
# from float32 to the 32-bit and narrower integers: the prelude's conversion that loops vectorize
FLOAT32_TO_INT = {target: call.replace("ko_f2i32", "ko_f2i32f") for target, call in FLOAT_TO_INT.items()
                  if target != "int64"}  # fmt: skip


def _wrapping(dtype: str, operator: str, a: str, b: str) -> str:
    if dtype not in _UNSIGNED:
        return f"({a} {operator} {b})"
    return f"(({C_TYPES[dtype]})(({_UNSIGNED[dtype]})({a}) {operator} ({_UNSIGNED[dtype]})({b})))"


def c_cast(value: str, source: str, target: str) -> str:
    """`value` of dtype `source` converted as ONNX's Cast: to bool, anything non-zero (NaN too) is true; floats
    to integers by the prelude's conversions (out of range: onnxruntime's result, never undefined behaviour)."""
    if target == "bool":
        return f"((uint8_t)(({value}) != 0))"
    if source == "float32" and target in FLOAT32_TO_INT:
        return f"{FLOAT32_TO_INT[target]}({value})"
    if source in FLOAT_SUFFIX and target in FLOAT_TO_INT:
        return f"{FLOAT_TO_INT[target]}({value})"
    return f"(({C_TYPES[target]})({value}))"


def c_binary(prim: str, dtype: str, a: str, b: str) -> str:
    is_float = dtype in FLOAT_SUFFIX
    table = {
        "add": _wrapping(dtype, "+", a, b), "sub": _wrapping(dtype, "-", a, b), "mul": _wrapping(dtype, "*", a, b),
        "div": f"({a} / {b})" if is_float else f"(({C_TYPES[dtype]})ko_idiv({a}, {b}, &err))",
        "pow": f"{c_math('pow', dtype)}({a}, {b})" if is_float
               else f"{FLOAT_TO_INT.get(dtype, 'ko_f2i32')}(pow((double){a}, (double){b}))",
        "fmod": f"{c_math('fmod', dtype)}({a}, {b})" if is_float else f"(({C_TYPES[dtype]})ko_imod({a}, {b}, &err))",
        "max": f"KO_MAX({a}, {b})", "min": f"KO_MIN({a}, {b})",
        "equal": f"({a} == {b})", "less": f"({a} < {b})", "greater": f"({a} > {b})",
        "less_equal": f"({a} <= {b})", "greater_equal": f"({a} >= {b})",
        "and": f"({a} && {b})", "or": f"({a} || {b})", "xor": f"((!!{a}) != (!!{b}))",
    }  # fmt: skip
    return table[prim]


def c_quaternary(prim: str, x: str, offset: str, low: str, high: str) -> str:
    """The four-operand primitive (float32): saturating_round, QuantizeLinear's integer step."""
    if prim != "saturating_round":
        raise KeyError(prim)
    return f"ko_satroundf({x}, {offset}, {low}, {high})"


def c_bound(prim: str, a: str, number: str) -> str:
    """max/min of `a` and a `number` that is not NaN (a literal): one compare and select (GCC: a compare and a
    blend per vector), against KO_MAX's seven operations; a NaN in `a` passes through (the compare is false)."""
    return f"({number} > {a} ? {number} : {a})" if prim == "max" else f"({number} < {a} ? {number} : {a})"


def c_unary(prim: str, dtype: str, a: str) -> str:
    ctype = C_TYPES[dtype]
    table = {
        "neg": f"(-{a})" if dtype not in _UNSIGNED else _wrapping(dtype, "-", "0", a),
        "abs": f"{c_math('fabs', dtype)}({a})" if dtype in FLOAT_SUFFIX
               else f"(({a}) < 0 ? {_wrapping(dtype, '-', '0', a)} : ({a}))",
        "exp": f"ko_expf({a})" if dtype == "float32" else f"exp({a})", "log": f"{c_math('log', dtype)}({a})",
        "log1p": f"{c_math('log1p', dtype)}({a})",
        "sqrt": f"{c_math('sqrt', dtype)}({a})", "reciprocal": f"(({ctype})1 / {a})",
        "sin": f"{c_math('sin', dtype)}({a})", "cos": f"{c_math('cos', dtype)}({a})",
        "tanh": f"ko_tanhf({a})" if dtype == "float32" else f"tanh({a})",
        "erf": f"ko_erff({a})" if dtype == "float32" else f"erf({a})",
        "sigmoid": f"ko_sigmoidf({a})" if dtype == "float32" else f"(1.0 / (1.0 + exp(-{a})))",
        "relu": f"(((({a}) > 0) | (({a}) != ({a}))) ? ({a}) : ({ctype})0)",
        "floor": f"{c_math('floor', dtype)}({a})", "ceil": f"{c_math('ceil', dtype)}({a})",
        "round": f"{c_math('nearbyint', dtype)}({a})",
        "sign": f"(({a}) != ({a}) ? ({a}) : ({ctype})(({a}) > 0) - ({ctype})(({a}) < 0))"
                if dtype in FLOAT_SUFFIX else f"(({ctype})(({a}) > 0) - ({ctype})(({a}) < 0))",  # NaN stays NaN
        "not": f"(!{a})",
    }  # fmt: skip
    if prim not in table:
        raise KeyError(prim)
    return table[prim]


def c_literal(value: Any, dtype: str) -> str:
    """A C literal of `dtype` for `value` (NaN and infinities through math.h's macros)."""
    if dtype in FLOAT_SUFFIX:
        number = float(value)
        if np.isnan(number):
            return "NAN"
        if np.isinf(number):
            return "INFINITY" if number > 0 else "-INFINITY"
        return repr(number) + FLOAT_SUFFIX[dtype]
    if dtype == "bool":
        return "1" if value else "0"
    return f"((int64_t){int(value)}LL)" if dtype == "int64" else str(int(value))


def c_value_type(prim: str, dtype: str) -> str:
    """The C type an elementwise primitive of `dtype` operands produces (comparisons and logic: uint8_t)."""
    return "uint8_t" if prim in BOOLEAN_RESULTS else C_TYPES[dtype]


def c_index(tree: Tree, value: Callable[[Tree], str], prefix: str,
            formulas: Mapping[str, Callable[[str], str]] | None = None) -> str:  # fmt: skip
    """An index tree as a C expression. `value` renders a value tree read as an index (a gather's indices);
    `prefix` names the kernel's tables (`PREFIX_NAME`); `formulas`: tables computed from their index instead
    (render.table_formula)."""
    def index(t: Tree) -> str:
        return c_index(t, value, prefix, formulas)

    kind = tree[0]
    if kind == "var":
        return str(tree[1])
    if kind == "lit":
        return f"{tree[1]}LL" if abs(tree[1]) > 2**31 - 1 else str(tree[1])
    if kind in ("+", "-", "*", "/", "%"):
        return f"({index(tree[1])} {kind} {index(tree[2])})"
    if kind in ("min", "max"):
        a, b = index(tree[1]), index(tree[2])
        return f"(({a}) {'<' if kind == 'min' else '>'} ({b}) ? ({a}) : ({b}))"
    if kind == "sel":
        return f"({c_cond(tree[1], value, prefix, formulas)} ? {index(tree[2])} : {index(tree[3])})"
    if kind == "index":
        return f"ko_index((int64_t)({value(tree[1])}), {tree[2]}, &err)"
    if kind == "table":
        if formulas and tree[1] in formulas:
            return formulas[tree[1]](index(tree[2]))
        return f"{prefix}_{tree[1]}[{index(tree[2])}]"
    if kind == "part":  # a merged variable's coordinate that did not collapse back
        stride = int(np.prod(tree[2][tree[3] + 1:]))
        return f"(({tree[1]} / {stride}) % {tree[2][tree[3]]})"
    raise ValueError(f"not an index tree: {kind}")


def c_cond(tree: Tree, value: Callable[[Tree], str], prefix: str,
           formulas: Mapping[str, Callable[[str], str]] | None = None) -> str:  # fmt: skip
    if tree[0] == "&&":
        return f"({c_cond(tree[1], value, prefix, formulas)} && {c_cond(tree[2], value, prefix, formulas)})"
    return f"({c_index(tree[1], value, prefix, formulas)} {tree[0]} {c_index(tree[2], value, prefix, formulas)})"
