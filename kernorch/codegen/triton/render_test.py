"""Every primitive kind, rendered as Triton and run in Triton's interpreter (no GPU here), against the reference
interpreter: elementwise primitives on edge values (NaN, ±inf, ±0, integer extremes), casts, reductions in both
templates, windows, every layout primitive, resize, depthwise convolutions, fused rows kernels, the matmul
template with its epilogue, and torch's library calls; the error flag refuses what onnxruntime refuses."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from kernorch.codegen.backends import TORCH_LIBRARY, TRITON, TRITON_MATMUL, choose_backend
from kernorch.codegen.target import GPU_TARGETS
from kernorch.devtools.mutate import here
from kernorch.errors import KernorchError
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.gpu_plan import GpuProgram
from kernorch.runtime.reference import run_reference

pytest.importorskip("triton")

EDGES = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-7, 0.5, -0.5, 2.5, -3.5, 1.0, 88.0, -88.0, 1e30,
                  3.0e9, -3.0e9, 1e-4, 0.03, -0.04, 7.0, 1.5, -1.0, -2.0, 3.0], dtype=np.float32)  # fmt: skip


def _graph(inputs: dict[str, TensorType], steps: Sequence[tuple[str, Sequence[str], dict[str, Any]]],
           constants: dict[str, np.ndarray] | None = None) -> Graph:  # fmt: skip
    """A graph of `steps` (prim, inputs by name or earlier step index "#k", attrs); its output is the last step's."""
    graph = Graph(inputs=list(inputs), outputs=[])
    graph.types.update(inputs)
    for name, array in (constants or {}).items():
        graph.constants[name] = array
        graph.types[name] = TensorType.of(array)
    builder = PrimitiveBuilder(graph)
    produced: list[list[str]] = []
    for prim, operands, attrs in steps:
        names = [produced[int(v[1:])][0] if v.startswith("#") else v for v in operands]
        produced.append(builder.emit(prim, names, attrs))
    graph.outputs = list(produced[-1])
    return graph


def _run(graph: Graph, feeds: dict[str, np.ndarray], backend: Any = TRITON) -> dict[str, np.ndarray]:
    kernel = make_kernel(graph, tuple(range(len(graph.nodes))), tuple(graph.outputs))
    chosen, reason = choose_backend(kernel, "gpu")
    assert chosen is backend, reason
    return GpuProgram(graph, [kernel], GPU_TARGETS["a100"], interpret=True, streams=1)(feeds)


def _check(graph: Graph, feeds: dict[str, np.ndarray], backend: Any = TRITON, rtol: float = 2e-6,
           atol: float = 1e-6) -> None:  # fmt: skip
    got = _run(graph, feeds, backend)
    expected = run_reference(graph, feeds)
    for name in graph.outputs:
        assert got[name].dtype == expected[name].dtype and got[name].shape == expected[name].shape
        np.testing.assert_allclose(got[name], expected[name], rtol=rtol, atol=atol, equal_nan=True, err_msg=name)
        zeros = expected[name] == 0
        if expected[name].dtype.kind == "f" and zeros.any():  # the sign of a zero too (1/-0 is -inf)
            np.testing.assert_array_equal(np.signbit(got[name][zeros]), np.signbit(expected[name][zeros]), name)


UNARY = ["neg", "abs", "exp", "log", "log1p", "sqrt", "reciprocal", "sin", "cos", "tanh", "erf", "sigmoid", "relu",
         "floor", "ceil", "round", "sign"]  # fmt: skip


@pytest.mark.parametrize("prim", UNARY)
def test_unary_primitives_on_edge_values(prim: str) -> None:
    x = EDGES.reshape(5, 5)
    graph = _graph({"x": TensorType(x.shape, "float32")}, [(prim, ["x"], {})])
    with np.errstate(all="ignore"):
        _check(graph, {"x": x}, rtol=4e-6 if prim in ("sin", "cos", "erf") else 2e-6, atol=1e-7)


def test_saturating_round_on_edge_values() -> None:
    """QuantizeLinear's integer step: ties to even, the offset, both bounds, NaN to the lower one, ±inf saturated."""
    x = EDGES.reshape(5, 5) * np.float32(50)
    constants = {"offset": np.asarray(3.0, np.float32), "low": np.asarray(-128.0, np.float32),
                 "high": np.asarray(127.0, np.float32)}  # fmt: skip
    graph = _graph({"x": TensorType(x.shape, "float32")}, [("saturating_round", ["x", "offset", "low", "high"], {})],
                   constants)  # fmt: skip
    expected = run_reference(graph, {"x": x})[graph.outputs[0]]
    assert {-128.0, 127.0} <= set(expected.reshape(-1).tolist())
    _check(graph, {"x": x}, atol=0)


@pytest.mark.parametrize("prim", ["add", "sub", "mul", "div", "max", "min", "equal", "less", "greater",
                                  "less_equal", "greater_equal"])  # fmt: skip
def test_binary_float_primitives_on_edge_values(prim: str) -> None:
    a = np.repeat(EDGES, EDGES.size).reshape(EDGES.size, EDGES.size)
    b = a.T.copy()
    graph = _graph({"a": TensorType(a.shape, "float32"), "b": TensorType(b.shape, "float32")}, [(prim, ["a", "b"], {})])
    with np.errstate(all="ignore"):
        _check(graph, {"a": a, "b": b}, atol=0)


def _c_pow(a: float, b: float) -> float:
    """C's pow, as onnxruntime computes it (numpy's differs at pow(-inf, 0.5) and pow(-0, 0.5))."""
    odd = b == int(b) and int(b) % 2 == 1 if math.isfinite(b) else False
    if a == 0 and b < 0:  # a pole: C gives an infinity (Python raises)
        return math.copysign(math.inf, a) if odd else math.inf
    try:
        return math.pow(a, b)
    except ValueError:  # a negative base to a fractional power
        return math.nan
    except OverflowError:
        return math.copysign(math.inf, a) if a < 0 and odd else math.inf


@pytest.mark.parametrize("exponent", [None, 2.0, 0.5, -1.0, 3.0])
def test_pow_follows_c_on_edge_values(exponent: float | None) -> None:
    a = np.repeat(EDGES, EDGES.size).reshape(EDGES.size, EDGES.size)
    b = a.T.copy() if exponent is None else np.full_like(a, exponent)
    if exponent is None:
        types = {"a": TensorType(a.shape, "float32"), "b": TensorType(b.shape, "float32")}
        graph, feeds = _graph(types, [("pow", ["a", "b"], {})]), {"a": a, "b": b}
    else:  # a constant exponent: a scalar in the kernel
        constant = {"e": np.array(exponent, np.float32)}
        graph, feeds = _graph({"a": TensorType(a.shape, "float32")}, [("pow", ["a", "e"], {})], constant), {"a": a}
    got = _run(graph, feeds)[graph.outputs[0]]
    with np.errstate(all="ignore"):
        expected = np.array([_c_pow(float(x), float(y)) for x, y in zip(a.ravel(), b.ravel(), strict=True)],
                            dtype=np.float64).astype(np.float32).reshape(a.shape)  # fmt: skip
    np.testing.assert_allclose(got, expected, rtol=4e-6, atol=0, equal_nan=True)
    zeros = expected == 0
    np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(expected[zeros]))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_arithmetic_wraps_and_truncates(dtype: str) -> None:
    info = np.iinfo(dtype)
    values = np.array([info.min, info.max, -7, 7, -1, 1, 3, -3, 2], dtype=dtype)
    a = np.repeat(values, values.size).reshape(values.size, values.size)
    b = a.T.copy()
    for prim in ("add", "sub", "mul", "div", "fmod", "max", "min", "equal", "less"):
        graph = _graph({"a": TensorType(a.shape, dtype), "b": TensorType(b.shape, dtype)}, [(prim, ["a", "b"], {})])
        with np.errstate(all="ignore"):
            _check(graph, {"a": a, "b": b}, atol=0, rtol=0)


def test_integer_division_by_zero_is_refused_and_the_next_call_runs() -> None:
    graph = _graph({"a": TensorType((4,), "int32"), "b": TensorType((4,), "int32")}, [("div", ["a", "b"], {})])
    kernel = make_kernel(graph, (0,), tuple(graph.outputs))
    program = GpuProgram(graph, [kernel], GPU_TARGETS["a100"], interpret=True, streams=1)
    a = np.arange(4, dtype=np.int32)
    with pytest.raises(KernorchError, match="division by zero"):
        program({"a": a, "b": np.array([1, 2, 0, 3], dtype=np.int32)})
    got = program({"a": a, "b": np.array([1, 2, 1, 3], dtype=np.int32)})  # the flag is the call's, not the plan's
    np.testing.assert_array_equal(got[graph.outputs[0]], np.array([0, 0, 2, 1], dtype=np.int32))


@pytest.mark.parametrize(("source", "target"), [("float32", "int32"), ("float32", "int64"), ("float32", "bool"),
                                                ("bool", "float32"), ("int64", "int32"), ("int32", "float64"),
                                                ("float64", "float32"), ("int64", "bool")])  # fmt: skip
def test_casts_follow_onnxruntime(source: str, target: str) -> None:
    with np.errstate(all="ignore"):
        x = EDGES.astype(source) if source != "bool" else EDGES > 0
    if source.startswith("int"):
        x = np.array([np.iinfo(source).min, -1, 0, 1, 2**31 + 5 if source == "int64" else 5, np.iinfo(source).max],
                     dtype=source)  # fmt: skip
    graph = _graph({"x": TensorType(x.shape, source)}, [("cast", ["x"], {"to": target})])
    _check(graph, {"x": x}, atol=0, rtol=0)


def test_logic_and_where_on_booleans() -> None:
    a = np.array([True, False, True, False])
    b = np.array([True, True, False, False])
    x = EDGES[:4]
    types = {"a": TensorType((4,), "bool"), "b": TensorType((4,), "bool"), "x": TensorType((4,), "float32")}
    graph = _graph(types, [("xor", ["a", "b"], {}), ("and", ["#0", "a"], {}), ("or", ["#1", "b"], {}),
                           ("not", ["#2"], {}), ("where", ["#3", "x", "x"], {}), ("neg", ["#4"], {}),
                           ("where", ["#2", "#5", "x"], {})])  # fmt: skip
    _check(graph, {"a": a, "b": b, "x": x})


@pytest.mark.parametrize("prim", ["reduce_sum", "reduce_max", "reduce_min", "reduce_prod"])
@pytest.mark.parametrize(("shape", "axes"), [((6, 40), (1,)), ((40, 6), (0,)), ((3, 5, 7), (0, 2)), ((2, 3), (1,)),
                                             ((3, 2500), (1,))])  # rows longer than a block: several steps
def test_reductions_in_either_template(prim: str, shape: tuple[int, ...], axes: tuple[int, ...]) -> None:
    x = np.random.default_rng(1).uniform(0.9, 1.1, shape).astype(np.float32)
    x.reshape(-1)[3] = np.nan if prim in ("reduce_max", "reduce_min") else x.reshape(-1)[3]
    graph = _graph({"x": TensorType(shape, "float32")}, [(prim, ["x"], {"axes": axes})])
    _check(graph, {"x": x}, rtol=1e-5)


def test_softmax_and_layer_norm_run_as_rows() -> None:
    shape = (12, 130)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32) * 4
    steps = [("reduce_max", ["x"], {"axes": (1,)}), ("sub", ["x", "#0"], {}), ("exp", ["#1"], {}),
             ("reduce_sum", ["#2"], {"axes": (1,)}), ("div", ["#2", "#3"], {}),
             ("reduce_sum", ["#4"], {"axes": (1,)}), ("mul", ["#5", "s"], {}), ("sub", ["#4", "#6"], {}),
             ("mul", ["#7", "#7"], {}), ("reduce_sum", ["#8"], {"axes": (1,)}), ("mul", ["#9", "s"], {}),
             ("add", ["#10", "e"], {}), ("sqrt", ["#11"], {}), ("div", ["#7", "#12"], {})]  # fmt: skip
    constants = {"s": np.array(1 / shape[1], np.float32), "e": np.array(1e-5, np.float32)}
    graph = _graph({"x": TensorType(shape, "float32")}, steps, constants)
    kernel = make_kernel(graph, tuple(range(len(graph.nodes))), tuple(graph.outputs))
    rendered = TRITON.triton("k", kernel, GPU_TARGETS["a100"])
    assert rendered is not None and {launch.template for launch in rendered.launches} == {"rows"}
    _check(graph, {"x": x}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("prim", "kernel", "strides", "pads", "dilations", "ceil"),
                         [("window_max", (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
                          ("window_sum", (2, 3), (1, 2), (0, 1, 1, 0), (2, 1), True),
                          ("window_max", (7, 7), (1, 1), (0, 0, 0, 0), (1, 1), False)])  # fmt: skip
def test_windows(prim: str, kernel: tuple[int, ...], strides: tuple[int, ...], pads: tuple[int, ...],
                 dilations: tuple[int, ...], ceil: bool) -> None:  # fmt: skip
    x = np.random.default_rng(3).standard_normal((2, 3, 9, 11)).astype(np.float32)
    attrs = {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations, "ceil_mode": ceil}
    graph = _graph({"x": TensorType(x.shape, "float32")}, [(prim, ["x"], attrs)])
    _check(graph, {"x": x}, rtol=1e-5)


LAYOUT_CASES: dict[str, list[tuple[str, list[str], dict[str, Any]]]] = {
    "transpose-tiles": [("transpose", ["x"], {"perm": (0, 2, 1)}), ("exp", ["#0"], {})],
    "transpose": [("transpose", ["x"], {"perm": (2, 0, 1)}), ("exp", ["#0"], {})],
    "slice": [("slice", ["x"], {"ranges": ((1, 4, 2), (5, 0, -2), (0, 7, 3))}), ("exp", ["#0"], {})],
    "concat": [("exp", ["x"], {}), ("concat", ["x", "#0"], {"axis": 1})],
    "split": [("split", ["x"], {"axis": 2, "sizes": (3, 4)}), ("mul", ["#0", "#0"], {})],
    "pad-constant": [("pad", ["x"], {"pads": (1, 0, 2, 0, 3, 1), "mode": "constant", "value": -2.0})],
    "pad-reflect": [("pad", ["x"], {"pads": (0, 2, 1, 0, 2, 3), "mode": "reflect", "value": 0.0})],
    "pad-edge": [("pad", ["x"], {"pads": (0, 1, 1, 0, 2, 3), "mode": "edge", "value": 0.0})],
    "pad-wrap": [("pad", ["x"], {"pads": (0, 1, 1, 0, 2, 3), "mode": "wrap", "value": 0.0})],
    "expand": [("reduce_sum", ["x"], {"axes": (1,)}), ("expand", ["#0"], {"shape": (5, 6, 7)}),
               ("add", ["#1", "x"], {})],
    "reshape": [("reshape", ["x"], {"shape": (6, 35)}), ("transpose", ["#0"], {"perm": (1, 0)}),
                ("neg", ["#1"], {})],
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_layout_primitives(case: str) -> None:
    shape = (3, 40, 70) if case == "transpose-tiles" else (5, 6, 7)  # tiles: both axes at least a tile
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    graph = _graph({"x": TensorType(x.shape, "float32")}, LAYOUT_CASES[case])
    if case == "transpose-tiles":
        kernel = make_kernel(graph, tuple(range(len(graph.nodes))), tuple(graph.outputs))
        rendered = TRITON.triton("k", kernel, GPU_TARGETS["a100"])
        assert rendered is not None and [launch.template for launch in rendered.launches] == ["tiles"]
    _check(graph, {"x": x})


def test_gathers_wrap_negative_indices_and_refuse_outside() -> None:
    table = np.random.default_rng(5).standard_normal((10, 4)).astype(np.float32)
    ids = np.array([[0, -1, 3], [9, -10, 2]], dtype=np.int64)
    graph = _graph({"ids": TensorType(ids.shape, "int64")}, [("gather", ["w", "ids"], {"axis": 0}),
                                                           ("mul", ["#0", "#0"], {})], {"w": table})  # fmt: skip
    _check(graph, {"ids": ids})
    positions = np.array([[1, 0, -1, 3]] * 10, dtype=np.int64)
    elements = _graph({"i": TensorType(positions.shape, "int64")},
                      [("gather_elements", ["w", "i"], {"axis": 1})], {"w": table})  # fmt: skip
    _check(elements, {"i": positions})
    with pytest.raises(KernorchError, match="index out of range"):
        _run(graph, {"ids": np.array([[0, 10, 1], [1, 1, 1]], dtype=np.int64)})
    # a constant index (ViT's class token): checked in a scalar, the flag's mask still a block
    x = np.random.default_rng(5).standard_normal((2, 7, 3)).astype(np.float32)
    token = _graph({"x": TensorType(x.shape, "float32")}, [("gather", ["x", "i"], {"axis": 1}), ("neg", ["#0"], {})],
                   {"i": np.array(-7, np.int64)})  # fmt: skip
    _check(token, {"x": x})


@pytest.mark.parametrize(("mode", "coordinates"), [("nearest", "asymmetric"), ("linear", "half_pixel"),
                                                   ("cubic", "align_corners"), ("linear", "pytorch_half_pixel")])
def test_resize(mode: str, coordinates: str) -> None:
    x = np.random.default_rng(6).standard_normal((1, 2, 5, 6)).astype(np.float32)
    attrs = {"sizes": (1, 2, 10, 9), "scales": (1.0, 1.0, 2.0, 1.5), "mode": mode, "coordinate_mode": coordinates,
             "nearest_mode": "floor", "cubic_coeff_a": -0.75, "exclude_outside": False}  # fmt: skip
    _check(_graph({"x": TensorType(x.shape, "float32")}, [("resize", ["x"], attrs)]), {"x": x}, rtol=1e-5)


@pytest.mark.parametrize("last", [False, True])
def test_depthwise_convolution(last: bool) -> None:
    rng = np.random.default_rng(7)
    shape = (1, 9, 10, 6) if last else (1, 6, 9, 10)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    attrs = {"group": 6, "strides": (2, 1), "dilations": (1, 1), "pads": (1, 1, 1, 1), "channels_last": last}
    graph = _graph({"x": TensorType(shape, "float32")}, [("conv", ["x", "w"], attrs), ("sigmoid", ["#0"], {})],
                   {"w": w})  # fmt: skip
    _check(graph, {"x": x}, rtol=1e-5, atol=1e-6)


def test_the_matmul_template_fuses_its_epilogue() -> None:
    rng = np.random.default_rng(8)
    a = rng.standard_normal((3, 37, 50)).astype(np.float32)
    w = rng.standard_normal((50, 70)).astype(np.float32)
    bias = rng.standard_normal((70,)).astype(np.float32)
    graph = _graph({"a": TensorType(a.shape, "float32")},
                   [("matmul", ["a", "w"], {}), ("add", ["#0", "b"], {}), ("erf", ["#1"], {}),
                    ("mul", ["#2", "#1"], {})],
                   {"w": w, "b": bias})  # fmt: skip
    _check(graph, {"a": a}, TRITON_MATMUL, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["matmul", "conv", "conv-channels-last", "conv-asymmetric", "conv_transpose"])
def test_library_calls_through_torch(case: str) -> None:
    rng = np.random.default_rng(9)
    if case == "matmul":
        a, b = rng.standard_normal((2, 4, 9, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
        graph = _graph({"a": TensorType(a.shape, "float32")}, [("matmul", ["a", "b"], {})], {"b": b})
        _check(graph, {"a": a}, TORCH_LIBRARY, rtol=1e-5)
        return
    last = case == "conv-channels-last"
    x = rng.standard_normal((1, 7, 8, 4) if last else (1, 4, 7, 8)).astype(np.float32)
    if case == "conv_transpose":
        w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
        attrs = {"group": 1, "strides": (2, 2), "dilations": (1, 1), "pads": (1, 0, 0, 1), "output_padding": (1, 0)}
    else:
        w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
        pads = (0, 1, 2, 1) if case == "conv-asymmetric" else (1, 1, 1, 1)
        attrs = {"group": 2, "strides": (1, 2), "dilations": (1, 1), "pads": pads, "channels_last": last}
    prim = "conv_transpose" if case == "conv_transpose" else "conv"
    graph = _graph({"x": TensorType(x.shape, "float32")}, [(prim, ["x", "w"], attrs)], {"w": w})
    _check(graph, {"x": x}, TORCH_LIBRARY, rtol=1e-5, atol=1e-5)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    # GPU plans: the Triton renderer, the GPU runtime, the GPU cost model, saved GPU plans
    here("triton: a negative gather index is not counted from the end",
         'wrapped, _ = self.temp(f"tl.where({raw} < 0, {raw} + {size}, {raw})", "int64")',
         'wrapped, _ = self.temp(f"{raw}", "int64")'),
    here("triton: round half to even rounds ties up",
         "r = tl.where(((r - x) == 0.5) & odd, r - 1.0, r)",
         "r = r",
         file="kernorch/codegen/triton/expr.py"),
    here("triton: a pad's border reads the input unmasked and keeps it",
         'ctx.rows))\n            return self.temp(f"tl.where({chosen}, {a}, {b})", dtype, key)',
         'ctx.rows))\n            return self.temp(a, dtype, key)'),
    here("triton: a row's reduction forgets its taps beyond the first block",
         'self.open(f"for {start} in range(0, {taps}, {lanes}):")',
         'self.open(f"for {start} in range(0, 1, 1):")'),
    here("triton: the matmul template's epilogue is dropped",
         "result, _ = writer.value(expr, context)",
         'result = "ko_acc"',
         file="kernorch/codegen/triton/matmul.py"),
    here("gpu runtime: the error flag is never cleared",
         "        self.error.zero_()\n",
         "",
         file="kernorch/runtime/gpu_plan.py"),
]  # fmt: skip
