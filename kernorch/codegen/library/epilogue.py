"""What a library call absorbs after its linear primitive: elementwise primitives as oneDNN post-ops.

The primitives a kernel holds after its linear primitive are compiled, in data-flow order, into a chain of
post-ops applied to the running value `x` (the linear result):

- a *binary step*: `x ⊕ T` for ⊕ in add/sub/mul/div/max/min, where T is a tensor the kernel reads (a
  per-channel constant such as a folded BatchNorm scale, or a residual) that broadcasts to x's shape;
  `T − x` is a sub followed by a negation. A per-output-channel constant added first becomes the call's
  bias argument instead.
- a *scalar step*: a region of primitives whose only non-scalar input is x (e.g. x·sigmoid(x), or the
  five primitives of GELU) is one function f: ℝ → ℝ. It is recognised numerically, not by the shape of
  the subgraph: f is sampled in float64 and compared with every oneDNN eltwise algorithm, with parameters
  fitted (a clip's bounds, a leaky slope, hardswish's α and β) and an affine `a·g(x) + b` allowed around it.
  So however fission and the rewrites spelled an activation (x·½ folded into a weight, a division turned
  into a multiplication), it is found if oneDNN has it.

A kernel whose epilogue does not compile is not generatable; `EpilogueError` says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from kernorch.ir.graph import Graph
from kernorch.ir.primitives import PRIMITIVES, STEP_FUNCTIONS, Kind, run_primitive

MAX_POST_OPS = 8
BINARY_ALGS = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "max": "max", "min": "min"}
_FIT_TOLERANCE = 2e-6  # relative to max(1, |f|): float32 constants evaluated in float64 agree to ~1e-7


class EpilogueError(Exception):
    """The primitives after a linear primitive cannot be expressed as post-ops; the message says why."""


@dataclass(frozen=True)
class Eltwise:
    alg: str  # oneDNN eltwise algorithm without the dnnl_eltwise_ prefix
    alpha: float = 0.0
    beta: float = 0.0

    def describe(self) -> str:
        params = {"linear": f"({self.alpha:g}·x{self.beta:+g})", "clip": f"[{self.alpha:g}, {self.beta:g}]",
                  "relu": f"(slope {self.alpha:g})" if self.alpha else "", "pow": f"^{self.beta:g}"}  # fmt: skip
        return f"{self.alg}{params.get(self.alg, '')}"


@dataclass(frozen=True)
class Binary:
    alg: str  # add, sub, mul, div, max, min
    operand: str  # the tensor the kernel reads

    def describe(self) -> str:
        return f"{self.alg} {self.operand}"


PostOp = Eltwise | Binary


@dataclass(frozen=True)
class Epilogue:
    bias: str | None  # a per-output-channel constant added first: the library call's bias argument
    post_ops: tuple[PostOp, ...]
    output: str  # the value the call writes
    absorbed: tuple[int, ...]  # node indices of the epilogue primitives

    def describe(self) -> str:
        parts = ([f"bias {self.bias}"] if self.bias else []) + [op.describe() for op in self.post_ops]
        return ", ".join(parts) or "nothing"


# ------------------------------------------------------------------------------------------ the table
def _np_erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _fixed(alg: str, g: Callable[[np.ndarray], np.ndarray]) -> Callable[[Callable[[float], float]], tuple[Eltwise,
                                                                         Callable[[np.ndarray], np.ndarray]] | None]:
    return lambda f: (Eltwise(alg), g)


def _leaky_relu(f: Callable[[float], float]) -> tuple[Eltwise, Callable[[np.ndarray], np.ndarray]] | None:
    slope = (f(-1.0) - f(0.0)) / -1.0
    return Eltwise("relu", slope), lambda x: np.where(x > 0, x, slope * x)


def _clip(f: Callable[[float], float]) -> tuple[Eltwise, Callable[[np.ndarray], np.ndarray]] | None:
    low, high = f(-1e6), f(1e6)
    if not (np.isfinite(low) and np.isfinite(high) and low < high):
        return None
    return Eltwise("clip", low, high), lambda x: np.clip(x, low, high)


def _hardsigmoid(f: Callable[[float], float]) -> tuple[Eltwise, Callable[[np.ndarray], np.ndarray]] | None:
    # clip(α·x + β, 0, 1) around 0, up to an affine wrapper: read α and β off the unsaturated middle
    base, step = f(0.0), f(1e-3)
    low, high = f(-1e6), f(1e6)
    if not high > low:
        return None
    beta = (base - low) / (high - low)
    alpha = (step - base) / 1e-3 / (high - low)
    return Eltwise("hardsigmoid", alpha, beta), lambda x: np.clip(alpha * x + beta, 0.0, 1.0)


def _hardswish(f: Callable[[float], float]) -> tuple[Eltwise, Callable[[np.ndarray], np.ndarray]] | None:
    # x · clip(α·x + β, 0, 1): f(x)/x is the clip, read off near 0 where it does not saturate
    r1, r2 = f(1e-3) / 1e-3, f(2e-3) / 2e-3
    alpha, beta = (r2 - r1) / 1e-3, r1 - (r2 - r1)
    return Eltwise("hardswish", alpha, beta), lambda x: x * np.clip(alpha * x + beta, 0.0, 1.0)


def _elu(f: Callable[[float], float]) -> tuple[Eltwise, Callable[[np.ndarray], np.ndarray]] | None:
    alpha = -f(-50.0)
    return Eltwise("elu", alpha), lambda x: np.where(x > 0, x, alpha * (np.exp(np.minimum(x, 0)) - 1))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


# Each entry: given f, an Eltwise (parameters fitted from f) and its float64 formula; None if it cannot fit.
_CANDIDATES: tuple[Callable[[Callable[[float], float]], tuple[Eltwise, Callable[[np.ndarray], np.ndarray]] | None],
                   ...] = (
    _leaky_relu,
    _clip,
    _hardswish,
    _hardsigmoid,
    _fixed("logistic", _sigmoid),
    _fixed("swish", lambda x: x * _sigmoid(x)),
    _fixed("gelu_erf", lambda x: 0.5 * x * (1 + _np_erf(x / math.sqrt(2)))),
    _fixed("gelu_tanh", _gelu_tanh),
    _fixed("tanh", np.tanh),
    _fixed("exp", lambda x: np.exp(np.minimum(x, 80.0))),
    _fixed("abs", np.abs),
    _fixed("square", np.square),
    _elu,
    _fixed("soft_relu", lambda x: np.logaddexp(0.0, x)),
    _fixed("mish", lambda x: x * np.tanh(np.logaddexp(0.0, x))),
)  # fmt: skip

def _snap(value: float) -> float:
    """The float32 value, with round-off around a whole number removed."""
    nearest = round(value)
    return float(nearest) if abs(value - nearest) <= 1e-9 * max(1.0, abs(value)) else float(np.float32(value))


SAMPLES = np.concatenate([np.linspace(-12.0, 12.0, 481), [-1e-3, 1e-3, 2e-3, 0.5, -0.5, 3.0, -3.0, 6.0]])


def fit_scalar_function(f_samples: np.ndarray, f: Callable[[float], float]) -> list[Eltwise]:
    """Post-ops computing f on SAMPLES (one algorithm, possibly followed by an affine `linear`)."""
    scale = np.maximum(1.0, np.abs(f_samples))

    def close(candidate: np.ndarray) -> bool:
        return bool(np.all(np.isfinite(candidate)) and np.max(np.abs(candidate - f_samples) / scale) <= _FIT_TOLERANCE)

    # affine alone
    a, b = f(1.0) - f(0.0), f(0.0)
    if close(a * SAMPLES + b):
        return [] if (a, b) == (1.0, 0.0) else [Eltwise("linear", a, b)]
    for candidate in _CANDIDATES:
        fitted = candidate(f)
        if fitted is None:
            continue
        eltwise, g = fitted
        with np.errstate(all="ignore"):
            g_samples = g(SAMPLES)
        if not np.all(np.isfinite(g_samples)):
            continue
        if close(g_samples):
            return [eltwise]
        # a·g(x) + b: least squares, then the same strict check
        design = np.stack([g_samples, np.ones_like(g_samples)], axis=1)
        (a, b), *_ = np.linalg.lstsq(design, f_samples, rcond=None)
        a, b = _snap(float(a)), _snap(float(b))  # least squares leaves ~1e-16 where the answer is 0 or 1
        if abs(a) > 1e-12 and close(a * g_samples + b):
            return [eltwise] if (a, b) == (1.0, 0.0) else [eltwise, Eltwise("linear", a, b)]
    raise EpilogueError("an elementwise function oneDNN has no eltwise algorithm for")


# ------------------------------------------------------------------------------------------ compiling
def _is_scalar_constant(graph: Graph, value: str) -> bool:
    return value in graph.constants and graph.types[value].numel == 1


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    offset = len(target) - len(shape)
    return all(d in (1, target[offset + i]) for i, d in enumerate(shape))


def channel_bias(graph: Graph, value: str, out_shape: tuple[int, ...], channel_axis: int) -> bool:
    """A constant broadcast along `channel_axis` of the output only: usable as the call's bias."""
    if value not in graph.constants:
        return False
    shape = graph.types[value].shape
    offset = len(out_shape) - len(shape)
    if offset < 0:
        return False
    if graph.types[value].numel == 1:  # a scalar: the bias of a single output channel only (O values are read)
        return out_shape[channel_axis] == 1
    return all(d == (out_shape[channel_axis] if i + offset == channel_axis else 1) for i, d in enumerate(shape))


def compile_epilogue(graph: Graph, linear: int, members: tuple[int, ...], outputs: tuple[str, ...],
                     channel_axis: int, absorbed_operands: set[int]) -> Epilogue:  # fmt: skip
    """Post-ops for the kernel {linear} ∪ members that writes `outputs`; raises EpilogueError."""
    out_value = graph.nodes[linear].outputs[0]
    out_type = graph.types[out_value]
    rest = [i for i in sorted(members) if i != linear and i not in absorbed_operands]
    for i in rest:
        node = graph.nodes[i]
        if PRIMITIVES[node.prim].kind != Kind.ELEMENTWISE:
            raise EpilogueError(f"{node.prim} is not elementwise")
        if len(node.outputs) != 1:
            raise EpilogueError(f"{node.prim} has several outputs")
    current = out_value
    bias: str | None = None
    post_ops: list[PostOp] = []
    pending = list(rest)
    while pending:
        head = graph.nodes[pending[0]]
        other = next((v for v in head.inputs if v != current), current)
        if bias is None and not post_ops and head.prim == "add" and current in head.inputs and other != current \
                and channel_bias(graph, other, out_type.shape, channel_axis) \
                and graph.types[head.outputs[0]].shape == out_type.shape:  # fmt: skip
            bias, current = other, head.outputs[0]  # before the scalar region: one channel's bias is a scalar
            pending.pop(0)
            continue
        region = _scalar_region(graph, pending, current)
        if region:
            exits = [graph.nodes[i].outputs[0] for i in region
                     if graph.nodes[i].outputs[0] in outputs or _used_outside(graph, i, region, pending)]  # fmt: skip
            if len(exits) != 1:
                raise EpilogueError("an activation whose intermediate values are used elsewhere")
            post_ops.extend(_fit_region(graph, region, current, exits[0], out_type.dtype))
            current = exits[0]
            pending = [i for i in pending if i not in region]
            continue
        node = graph.nodes[pending[0]]
        if current not in node.inputs or node.prim not in BINARY_ALGS or len(node.inputs) != 2:
            raise EpilogueError(f"{node.prim} does not continue the running value as a binary post-op")
        other = node.inputs[1] if node.inputs[0] == current else node.inputs[0]
        if other == current:
            raise EpilogueError(f"{node.prim}(x, x) outside an elementwise function")
        other_type = graph.types[other]
        if other_type.dtype != out_type.dtype or not _broadcasts_to(other_type.shape, out_type.shape):
            raise EpilogueError(f"{node.prim} operand {other_type} does not broadcast to {out_type}")
        if graph.types[node.outputs[0]].shape != out_type.shape:
            raise EpilogueError(f"{node.prim} broadcasts the result beyond the linear output")
        swapped = node.inputs[1] == current
        if swapped and node.prim == "sub":  # T − x = −(x − T)
            post_ops.extend([Binary("sub", other), Eltwise("linear", -1.0, 0.0)])
        elif swapped and node.prim == "div":
            raise EpilogueError("a division by the linear result")
        else:
            post_ops.append(Binary(BINARY_ALGS[node.prim], other))
        current = node.outputs[0]
        pending.pop(0)
    if tuple(outputs) != (current,):
        raise EpilogueError(f"the call writes only its final value, but {list(outputs)} are needed")
    if len(post_ops) > MAX_POST_OPS:
        raise EpilogueError(f"{len(post_ops)} post-ops exceed {MAX_POST_OPS}")
    return Epilogue(bias, tuple(post_ops), current, tuple(rest))


def _used_outside(graph: Graph, node_index: int, region: list[int], pending: list[int]) -> bool:
    value = graph.nodes[node_index].outputs[0]
    return any(value in graph.nodes[i].inputs for i in pending if i not in region) or \
        any(value in n.inputs for j, n in enumerate(graph.nodes) if j not in pending)  # fmt: skip


def _scalar_region(graph: Graph, pending: list[int], current: str) -> list[int]:
    """Pending nodes (in order) whose inputs are the running value, region values or scalar constants."""
    region: list[int] = []
    produced = {current}
    for i in pending:
        node = graph.nodes[i]
        if not any(v in produced for v in node.inputs):
            continue
        if all(v in produced or _is_scalar_constant(graph, v) for v in node.inputs):
            region.append(i)
            produced.update(node.outputs)
    return region


# float64 formulas for the primitives whose reference goes through torch: fitting happens when a plan is
# loaded too (its C is regenerated), and a loaded plan must not need torch.
_FLOAT64_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {"erf": _np_erf, "sigmoid": _sigmoid}

# A region is one scalar function: the primitives, how they are wired, and the scalar constants' values.
RegionKey = tuple[tuple[str, Any, tuple[Any, ...]], ...]


def _region_key(graph: Graph, region: list[int], current: str, exit_value: str) -> RegionKey:
    names = {current: "x"}
    steps: list[tuple[str, Any, tuple[Any, ...]]] = []
    for i in region:
        node = graph.nodes[i]
        wiring = tuple(names[v] if v in names else
                       ("const", graph.types[v].dtype, graph.constants[v].reshape(()).item())
                       for v in node.inputs)  # fmt: skip
        steps.append((node.prim, node.attrs, wiring))
        names[node.outputs[0]] = f"t{len(steps)}"
    steps.append(("exit", (), (names[exit_value],)))
    return tuple(steps)


# Step functions (ir/primitives.py) are never fitted: sampled, one is the smooth function it equals on the samples'
# range (a quotient by 50 rounded is 0 on [-12, 12], which "linear 0, 0" fits), and no oneDNN post-op computes one.
# Found wrong on a static-QDQ gpt2 (its requantized attention scores written as zeros by a oneDNN matmul).


def _fit_region(graph: Graph, region: list[int], current: str, exit_value: str, dtype: str) -> list[Eltwise]:
    if dtype != "float32":
        raise EpilogueError(f"post-ops on {dtype}")
    for i in region:
        node = graph.nodes[i]
        if node.prim in STEP_FUNCTIONS:
            raise EpilogueError(f"{node.prim}: a step function, which no post-op computes")
        if node.prim == "cast" and not graph.types[node.outputs[0]].is_float:
            raise EpilogueError(f"a cast to {graph.types[node.outputs[0]].dtype}: the call writes float32")
    fitted = _fit_key(_region_key(graph, region, current, exit_value))
    if isinstance(fitted, str):
        raise EpilogueError(fitted)
    return list(fitted)


@cache
def _fit_key(key: RegionKey) -> tuple[Eltwise, ...] | str:
    """Evaluate the region as f(x) in float64 and fit it (memoized: repeated layers share regions)."""

    def evaluate(points: np.ndarray) -> np.ndarray:
        values: dict[str, np.ndarray] = {"x": points}
        with np.errstate(all="ignore"):
            for position, (prim, attrs, wiring) in enumerate(key[:-1]):
                args = [values[w] if isinstance(w, str) else
                        np.asarray(w[2], dtype=np.float64 if w[1].startswith("float") else w[1])
                        for w in wiring]  # fmt: skip
                if prim in _FLOAT64_UNARY:
                    result = _FLOAT64_UNARY[prim](args[0])
                else:
                    (result,) = run_primitive(prim, args, dict(attrs))
                values[f"t{position + 1}"] = np.asarray(result)
        (exit_name,) = key[-1][2]
        return np.asarray(values[str(exit_name)], dtype=np.float64)

    f_samples = evaluate(SAMPLES)
    if not np.all(np.isfinite(f_samples)):
        return "an elementwise function that is not finite on [-12, 12]"
    try:
        return tuple(fit_scalar_function(f_samples, lambda x: float(evaluate(np.array([x], dtype=np.float64))[0])))
    except EpilogueError as error:  # remembered like a success: repeated layers ask again
        return str(error)
