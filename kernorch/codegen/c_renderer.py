"""Render `KernelLoops` as C with OpenMP: a table of primitive → C snippets, loops, pragmas.

Every kernel becomes `int NAME(void **buffers)`: buffers in the order of `KernelLoops.buffers` minus
scratch (inputs, then outputs). It returns 0, or 1 when a gathered index was out of range (the caller
raises). Shapes are compile-time constants; the runtime checks buffer shapes before any call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernorch.codegen.loops import KernelLoops, Phase, Tree

C_TYPES = {"float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t", "bool": "uint8_t"}
_FLOAT_SUFFIX = {"float32": "f", "float64": ""}

PRELUDE = """#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#define KO_MAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define KO_MIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
static inline int64_t ko_index(int64_t i, int64_t n, int *err) {
    if (i < 0) i += n;
    if (i < 0 || i >= n) { *err = 1; return 0; }
    return i;
}
static inline int64_t ko_idiv(int64_t a, int64_t b) { return b ? a / b : 0; }
"""


def _math(name: str, dtype: str) -> str:
    return name + _FLOAT_SUFFIX.get(dtype, "")


def _binary(prim: str, dtype: str, a: str, b: str) -> str:
    is_float = dtype in _FLOAT_SUFFIX
    table = {
        "add": f"({a} + {b})", "sub": f"({a} - {b})", "mul": f"({a} * {b})",
        "div": f"({a} / {b})" if is_float else f"ko_idiv({a}, {b})",
        "pow": f"{_math('pow', dtype)}({a}, {b})" if is_float else f"(({C_TYPES[dtype]})pow((double){a}, (double){b}))",
        "max": f"KO_MAX({a}, {b})", "min": f"KO_MIN({a}, {b})",
        "equal": f"({a} == {b})", "less": f"({a} < {b})", "greater": f"({a} > {b})",
        "less_equal": f"({a} <= {b})", "greater_equal": f"({a} >= {b})",
        "and": f"({a} && {b})", "or": f"({a} || {b})", "xor": f"((!!{a}) != (!!{b}))",
    }  # fmt: skip
    return table[prim]


def _unary(prim: str, dtype: str, a: str) -> str:
    ctype = C_TYPES[dtype]
    table = {
        "neg": f"(-{a})", "abs": f"{_math('fabs', dtype)}({a})" if dtype in _FLOAT_SUFFIX else f"llabs({a})",
        "exp": f"{_math('exp', dtype)}({a})", "log": f"{_math('log', dtype)}({a})",
        "sqrt": f"{_math('sqrt', dtype)}({a})", "reciprocal": f"(({ctype})1 / {a})",
        "sin": f"{_math('sin', dtype)}({a})", "cos": f"{_math('cos', dtype)}({a})",
        "tanh": f"{_math('tanh', dtype)}({a})", "erf": f"{_math('erf', dtype)}({a})",
        "sigmoid": f"(({ctype})1 / (({ctype})1 + {_math('exp', dtype)}(-{a})))",
        "relu": f"(({a}) > 0 || ({a}) != ({a}) ? ({a}) : ({ctype})0)",
        "floor": f"{_math('floor', dtype)}({a})", "ceil": f"{_math('ceil', dtype)}({a})",
        "round": f"{_math('nearbyint', dtype)}({a})",
        "sign": f"(({ctype})(({a}) > 0) - ({ctype})(({a}) < 0))", "not": f"(!{a})",
    }  # fmt: skip
    if prim not in table:
        raise KeyError(prim)
    return table[prim]


def _literal(value: Any, dtype: str) -> str:
    if dtype in _FLOAT_SUFFIX:
        number = float(value)
        if np.isnan(number):
            return "NAN"
        if np.isinf(number):
            return "INFINITY" if number > 0 else "-INFINITY"
        return repr(number) + _FLOAT_SUFFIX[dtype]
    if dtype == "bool":
        return "1" if value else "0"
    return f"((int64_t){int(value)}LL)" if dtype == "int64" else str(int(value))


class _Emitter:
    def __init__(self, loops: KernelLoops, prefix: str, counter: list[int]) -> None:
        self.loops = loops
        self.prefix = prefix
        self.types = {b.name: b.dtype for b in loops.buffers}
        self.lines: list[str] = []
        self.counter = counter  # shared by all emitters of a kernel: temporaries get unique names

    def index(self, tree: Tree) -> str:
        kind = tree[0]
        if kind == "var":
            return str(tree[1])
        if kind == "lit":
            return f"{tree[1]}LL" if abs(tree[1]) > 2**31 - 1 else str(tree[1])
        if kind in ("+", "-", "*", "/", "%"):
            return f"({self.index(tree[1])} {kind} {self.index(tree[2])})"
        if kind in ("min", "max"):
            a, b = self.index(tree[1]), self.index(tree[2])
            return f"(({a}) {'<' if kind == 'min' else '>'} ({b}) ? ({a}) : ({b}))"
        if kind == "sel":
            return f"({self.cond(tree[1])} ? {self.index(tree[2])} : {self.index(tree[3])})"
        if kind == "index":
            return f"ko_index((int64_t)({self.value(tree[1])}), {tree[2]}, &err)"
        if kind == "table":
            return f"{self.prefix}_{tree[1]}[{self.index(tree[2])}]"
        raise ValueError(f"not an index tree: {kind}")

    def cond(self, tree: Tree) -> str:
        if tree[0] == "&&":
            return f"({self.cond(tree[1])} && {self.cond(tree[2])})"
        return f"({self.index(tree[1])} {tree[0]} {self.index(tree[2])})"

    def value(self, tree: Tree) -> str:
        kind = tree[0]
        if kind == "load":
            return f"{tree[1]}[{self.index(tree[2])}]"
        if kind == "const":
            return _literal(tree[1], tree[2])
        if kind == "scalar":
            return str(tree[1])
        if kind == "cast":
            return f"(({C_TYPES[tree[1]]})({self.value(tree[2])}))"
        if kind == "table":
            return self.index(tree)
        if kind == "where":
            condition = self.cond(tree[1]) if tree[1][0] in ("<", ">=", "==", "&&") else self.value(tree[1])
            return f"({condition} ? {self.value(tree[2])} : {self.value(tree[3])})"
        if kind == "op":
            prim, dtype, args = tree[1], tree[2], [self.value(a) for a in tree[3:]]
            return _unary(prim, dtype, args[0]) if len(args) == 1 else _binary(prim, dtype, args[0], args[1])
        if kind == "reduce":
            return self.reduction(tree)
        raise ValueError(f"not a value tree: {kind}")

    def reduction(self, tree: Tree) -> str:
        """Emit the loop nest into `self.lines` and return the accumulator's name."""
        _, prim, dtype, loops, body = tree
        self.counter[0] += 1
        acc = f"t{self.counter[0]}"
        is_float = dtype in _FLOAT_SUFFIX
        acc_type = "double" if is_float and prim in ("reduce_sum", "reduce_prod") else C_TYPES[dtype]
        if prim == "reduce_sum":
            init, update = "0", "{acc} += {x};"
        elif prim == "reduce_prod":
            init, update = "1", "{acc} *= {x};"
        else:
            big = "INFINITY" if is_float else {"int64": "INT64_MAX", "int32": "INT32_MAX", "bool": "1"}[dtype]
            init = big if prim == "reduce_min" else ("-INFINITY" if is_float else
                                                     {"int64": "INT64_MIN", "int32": "INT32_MIN", "bool": "0"}[dtype])
            update = "{acc} = KO_MAX({acc}, {x});" if prim == "reduce_max" else "{acc} = KO_MIN({acc}, {x});"
        self.lines.append(f"{acc_type} {acc} = {init};")
        for var, size in loops:
            self.lines.append(f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{")
        guard = None
        if body[0] == "guard":
            guard, body = body[1], body[2]
        x = self.value(body)  # may emit nested reduction loops first
        statement = update.format(acc=acc, x=x)
        if guard is not None:
            statement = f"if ({self.cond(guard)}) {{ {statement} }}"
        self.lines.append(statement)
        self.lines.extend("}" for _ in loops)
        return f"(({C_TYPES[dtype]}){acc})"

    def store(self, phase: Phase, index: str) -> None:
        target_type = C_TYPES[self.types[phase.target]]
        value = self.value(phase.expr)
        self.lines.append(f"{phase.target}[{index}] = ({target_type})({value});")


def _flat(vars_: tuple[str, ...], shape: tuple[int, ...]) -> str:
    flat = "0"
    for var, size in zip(vars_, shape, strict=True):
        flat = f"({flat} * {size} + {var})"
    return flat


def render_kernel(name: str, loops: KernelLoops) -> str:
    out: list[str] = []
    for table, values in loops.tables.items():
        ctype = "int64_t" if values.dtype.kind == "i" else "float"
        body = ", ".join(str(int(v)) if ctype == "int64_t" else repr(float(v)) + "f" for v in values)
        out.append(f"static const {ctype} {name}_{table}[{max(len(values), 1)}] = {{{body or '0'}}};")
    out.append(f"int {name}(void **args) {{")
    out.append("    int err = 0;")
    position = 0
    for buffer in loops.buffers:
        ctype = C_TYPES[buffer.dtype]
        if buffer.role == "scratch":
            count = int(np.prod(buffer.shape, dtype=np.int64))
            out.append(f"    {ctype} *{buffer.name} = ({ctype} *)malloc(sizeof({ctype}) * {max(count, 1)});")
            continue
        qualifier = "const " if buffer.role == "input" else ""
        out.append(f"    {qualifier}{ctype} *restrict {buffer.name} = ({qualifier}{ctype} *)args[{position}];")
        position += 1
    out.append(_render_phases(loops, name))
    for buffer in loops.buffers:
        if buffer.role == "scratch":
            out.append(f"    free({buffer.name});")
    out.append("    return err;\n}\n")
    return "\n".join(out)


def _loop_nest(vars_: tuple[str, ...], shape: tuple[int, ...], parallel: bool, inner: list[str]) -> list[str]:
    lines: list[str] = []
    if not vars_:
        return inner
    outer = len(vars_) - 1
    if parallel and outer >= 1 and int(np.prod(shape[:outer], dtype=np.int64)) > 1:
        lines.append(f"#pragma omp parallel for collapse({outer}) reduction(|:err) schedule(static)")
    elif parallel and outer == 0 and shape[0] > 1:
        lines.append("#pragma omp parallel for reduction(|:err) schedule(static)")
    for var, size in zip(vars_, shape, strict=True):
        lines.append(f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{")
    lines.extend(inner)
    lines.extend("}" for _ in vars_)
    return lines


def _render_phases(loops: KernelLoops, prefix: str) -> str:
    lines: list[str] = []
    counter = [0]
    if loops.schedule == "phased":
        for phase in loops.phases:
            emitter = _Emitter(loops, prefix, counter)
            emitter.store(phase, _flat(phase.loop_vars, phase.shape))
            nest = _loop_nest(phase.loop_vars, phase.shape, True, emitter.lines)
            lines.extend(nest if phase.loop_vars else ["{", *nest, "}"])
        return "\n".join("    " + line for line in lines)

    # Row schedule: a parallel loop over rows (the non-reduced axes); per row, reductions into scalars,
    # then the outputs. Reduced axes have a row variable fixed at 0.
    row_vars = loops.row_vars
    body: list[str] = [f"const int64_t {v} = 0;" for a, v in enumerate(row_vars) if loops.row_shape[a] == 1]
    for phase in loops.phases:
        emitter = _Emitter(loops, prefix, counter)
        if phase.scalar:
            value = emitter.value(phase.expr)
            body.extend(emitter.lines)
            body.append(f"const double {phase.target} = {value};")
        elif phase.loop_vars:  # full-shape output: inner loops over the reduced axes
            full_vars = tuple(f"i{a}" if f"i{a}" in phase.loop_vars else v for a, v in enumerate(row_vars))
            emitter.store(phase, _flat(full_vars, phase.shape))
            sizes = tuple(phase.shape[int(v[1:])] for v in phase.loop_vars)
            body.extend(_loop_nest(phase.loop_vars, sizes, False, emitter.lines))
        else:  # reduced-shape output: one value per row
            emitter.store(phase, _flat(row_vars, phase.shape))
            body.extend(emitter.lines)
    outer = [(v, loops.row_shape[a]) for a, v in enumerate(row_vars) if loops.row_shape[a] != 1]
    if outer and int(np.prod([size for _, size in outer])) > 1:
        lines.append(f"#pragma omp parallel for collapse({len(outer)}) reduction(|:err) schedule(static)")
    for var, size in outer:
        lines.append(f"for (int64_t {var} = 0; {var} < {size}; {var}++) {{")
    lines.extend(body if outer else ["{", *body, "}"])
    lines.extend("}" for _ in outer)
    return "\n".join("    " + line for line in lines)
