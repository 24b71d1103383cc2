"""The AMX matmul (native/amx_matmul.py): chosen for a bf16 plan's matmuls with constant weights, equal to a numpy
model of its arithmetic (operands rounded to bfloat16, products summed in float32 or better, then the bias and
epilogue in float32) across every tail — rows, K and N that are no multiple of the tiles — and the epilogues it
applies itself; its source stored bfloat16 by the kernel before; NaN and ±inf rows as onnxruntime; the path
without tiles (KERNORCH_AMX=0) the same; fp32 plans and products of two inputs left to oneDNN."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kernorch.codegen.native.amx_product as amx_product
import kernorch.pipeline
from kernorch.codegen.backends import ONEDNN
from kernorch.codegen.library.call import describe_library_call
from kernorch.codegen.native.amx_matmul import BACKEND
from kernorch.devtools.mutate import here
from kernorch.precision import choose_precision
from kernorch.runtime.compiled import CompiledModel
from kernorch.testing import cpu_compile, random_array
from kernorch.testing.native import assert_compiles_for
from kernorch.tools.check import run_onnxruntime

pytestmark = [pytest.mark.sanitize,  # under the sanitizers in `make sanitize`
              pytest.mark.skipif(not amx_product.amx_supported(), reason="needs AMX-BF16 tiles")]

EPILOGUES = {  # ONNX nodes after "m" = x·w + b, ending in "y"; "r" is a [M, N] input, "s" a [M, 1] input
    "gelu": [helper.make_node("Gelu", ["m"], ["y"])],
    "relu": [helper.make_node("Relu", ["m"], ["y"])],
    "residual": [helper.make_node("Add", ["m", "r"], ["y"])],
    "scaled per row, then tanh": [helper.make_node("Mul", ["m", "s"], ["t"]), helper.make_node("Tanh", ["t"], ["y"])],
}


def linear_model(rows: int, k: int, n: int, epilogue: str = "gelu", second: int = 0) -> onnx.ModelProto:
    """y = epilogue(x·w + b) for x [rows, k]; with `second` columns, then y·w2 + b2 (the first matmul's result stored
    bfloat16 for the second to read)."""
    initializers = [numpy_helper.from_array(random_array((k, n), seed=1) * np.float32(k**-0.5), "w"),
                    numpy_helper.from_array(random_array((n,), seed=2), "b")]  # fmt: skip
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (rows, k))]
    if epilogue == "residual":
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, (rows, n)))
    if epilogue.startswith("scaled"):
        inputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, (rows, 1)))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["m"]),
             *EPILOGUES[epilogue]]  # fmt: skip
    output = ("y", (rows, n))
    if second:
        initializers += [numpy_helper.from_array(random_array((n, second), seed=3) * np.float32(n**-0.5), "w2"),
                         numpy_helper.from_array(random_array((second,), seed=4), "b2")]  # fmt: skip
        nodes += [helper.make_node("MatMul", ["y", "w2"], ["p2"]), helper.make_node("Add", ["p2", "b2"], ["z"])]
        output = ("z", (rows, second))
    outputs = [helper.make_tensor_value_info(output[0], TensorProto.FLOAT, output[1])]
    graph = helper.make_graph(nodes, "linear", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)


def bf16_plan(model: onnx.ModelProto, monkeypatch: pytest.MonkeyPatch, **options: object) -> CompiledModel:
    """The model's bf16 plan with every matmul in bf16 (the precision stage without prices; priced, a matmul this
    small may stay float32)."""
    monkeypatch.setattr(kernorch.pipeline, "choose_precision",
                        lambda graph, _, precision: choose_precision(graph, None, precision))
    return cpu_compile(model, cost="analytic", device="cpu-nominal", precision="bf16", **options)


def bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def tile_arithmetic(model: onnx.ModelProto, feeds: dict[str, np.ndarray], epilogue: str) -> np.ndarray:
    """What the kernel computes: bf16 operands, exact products summed (float32 in the kernel), bias and epilogue
    in float32 (here float64); the second matmul reads the first's result rounded to bfloat16."""
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    m = bf16(feeds["x"]) @ bf16(weights["w"]) + weights["b"]
    if epilogue == "gelu":
        y = 0.5 * m * (1 + np.vectorize(math.erf)(m / math.sqrt(2)))
    elif epilogue == "relu":
        y = np.maximum(m, 0)
    elif epilogue == "residual":
        y = m + feeds["r"]
    else:
        y = np.tanh(m * feeds["s"])
    if "w2" in weights:
        return bf16(y) @ bf16(weights["w2"]) + weights["b2"]
    return y


def feeds_for(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {value.name: random_array(tuple(d.dim_value for d in value.type.tensor_type.shape.dim), seed=7 + i)
            for i, value in enumerate(model.graph.input)}  # fmt: skip


def matmul_backends(compiled: CompiledModel) -> list[str]:
    return [b.name for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
            if any(n.prim in ("matmul", "conv") for n in k.primitives)]  # fmt: skip


CASES: dict[str, dict[str, Any]] = {
    "vit's fc2: 197 rows, K 768, N 192": dict(rows=197, k=768, n=192),
    "fewer rows than a tile, K and N tails": dict(rows=5, k=40, n=17),
    "one row": dict(rows=1, k=64, n=32, epilogue="relu"),
    "33 rows, K 100, N 70": dict(rows=33, k=100, n=70, epilogue="residual"),
    "a value per row, N of one tile": dict(rows=64, k=32, n=16, epilogue="scaled per row, then tanh"),
    "a bfloat16 source from the matmul before": dict(rows=40, k=96, n=80, epilogue="relu", second=48),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tiles_multiply_the_rounded_operands(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = linear_model(**CASES[case])
    feeds = feeds_for(model)
    compiled = bf16_plan(model, monkeypatch)
    assert set(matmul_backends(compiled)) == {"amx_matmul"}
    if CASES[case].get("second"):
        calls = [describe_library_call(k) for k in compiled.kernels if any(n.prim == "matmul" for n in k.primitives)]
        assert [c.src.dtype for c in calls] == ["float32", "bfloat16"]  # stored so by the first
    actual = next(iter(compiled.run(feeds).values()))
    expected = tile_arithmetic(model, feeds, str(CASES[case].get("epilogue", "gelu")))
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, rtol=0, atol=(3e-3 if CASES[case].get("second") else 1e-5) * scale)
    reference = next(iter(run_onnxruntime(model, feeds).values()))
    assert np.abs(actual - reference).max() < 2e-2 * float(np.abs(reference).max())


def pointwise_model(batch: int, size: tuple[int, int], channels: int, out_channels: int) -> onnx.ModelProto:
    """[N, H, W, C] → NCHW → 1x1 conv → relu → 1x1 conv + bias → NHWC: channels-last end to end."""
    initializers = [numpy_helper.from_array(random_array((channels, channels, 1, 1), seed=1) * 0.3, "w0"),
                    numpy_helper.from_array(random_array((out_channels, channels, 1, 1), seed=2) * 0.3, "w"),
                    numpy_helper.from_array(random_array((out_channels,), seed=3), "b")]  # fmt: skip
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["xt", "w0"], ["c0"]), helper.make_node("Relu", ["c0"], ["r"]),
             helper.make_node("Conv", ["r", "w", "b"], ["c"]),
             helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])]  # fmt: skip
    graph = helper.make_graph(nodes, "pointwise",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, *size, channels))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (batch, *size, out_channels))],
                              initializers)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_pointwise_convolutions_are_products_of_channels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two 1x1 convs in a channels-last plan, batch 2: both [pixels, C] x [C, OC] on tiles, the first writing
    bfloat16 for the second."""
    model = pointwise_model(batch=2, size=(7, 9), channels=24, out_channels=40)
    x = random_array((2, 7, 9, 24), seed=4)
    compiled = bf16_plan(model, monkeypatch, layout="channels-last", rewrite=True)
    assert matmul_backends(compiled) == ["amx_matmul", "amx_matmul"]
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    first = np.maximum(bf16(x) @ bf16(weights["w0"][:, :, 0, 0]).T, 0)
    expected = bf16(first) @ bf16(weights["w"][:, :, 0, 0]).T + weights["b"]
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=0,
                               atol=3e-3 * float(np.abs(expected).max()))  # fmt: skip


def window_model(channels: int, out_channels: int, kernel: int, size: tuple[int, int], batch: int = 1,
                 strides: tuple[int, int] = (1, 1), dilations: tuple[int, int] = (1, 1),
                 pads: tuple[int, int, int, int] = (0, 0, 0, 0), rounded: bool = False) -> onnx.ModelProto:  # fmt: skip
    """[N, H, W, C] → NCHW → conv + bias → relu → NHWC; `rounded`: the weights rounded to bfloat16 (so that
    onnxruntime's float32 conv of a rounded input computes the tiles' products)."""
    w = random_array((out_channels, channels, kernel, kernel), seed=1) * np.float32((channels * kernel**2) ** -0.5)
    initializers = [numpy_helper.from_array(bf16(w).astype(np.float32) if rounded else w, "w"),
                    numpy_helper.from_array(random_array((out_channels,), seed=2), "b")]  # fmt: skip
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["xt", "w", "b"], ["c"], strides=list(strides), dilations=list(dilations),
                              pads=list(pads)),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1])]
    graph = helper.make_graph(nodes, "window",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, *size, channels))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                                               ir_version=8))  # fmt: skip


WINDOWS: dict[str, dict[str, Any]] = {
    "3x3, padded": dict(channels=32, out_channels=48, kernel=3, size=(9, 11), pads=(1, 1, 1, 1)),
    "candy's residual conv, smaller": dict(channels=128, out_channels=128, kernel=3, size=(10, 12)),
    "5x5 over 16 channels, a kernel row's taps one run": dict(channels=16, out_channels=32, kernel=5, size=(20, 17)),
    "vit's patch embedding, smaller: 16x16 taps over 3 channels, stride 16 (runs of 48)": dict(
        channels=3, out_channels=40, kernel=16, size=(32, 48), strides=(16, 16)),
    "3x3 over 64 channels, padded, 60-pixel rows: loaded from the ring": dict(channels=64, out_channels=40, kernel=3,
                                                                              size=(7, 60), pads=(1, 1, 1, 1)),
    "strided, dilated, asymmetric padding, batch 2": dict(channels=16, out_channels=20, kernel=3, size=(13, 10),
                                                           batch=2, strides=(2, 1), dilations=(1, 2),
                                                           pads=(0, 2, 1, 1)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(WINDOWS))
def test_convolutions_multiply_their_windows(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A convolution's rows are its output pixels, K its taps x channels read through the window (taps in the
    padding zero): equal to onnxruntime's float32 conv of the rounded input and weights."""
    spec = WINDOWS[case]
    model = window_model(**spec)
    x = random_array((spec.get("batch", 1), *spec["size"], spec["channels"]), seed=4)
    compiled = bf16_plan(model, monkeypatch, layout="channels-last", rewrite=True)
    assert matmul_backends(compiled) == ["amx_matmul"]
    expected = run_onnxruntime(window_model(**spec, rounded=True), {"x": bf16(x).astype(np.float32)})["y"]
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=0,
                               atol=2e-5 * float(np.abs(expected).max()))  # fmt: skip


def test_nan_and_infinity_stay_in_their_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN or ±inf in a source row makes that row's outputs NaN or ±inf, as onnxruntime's; other rows finite."""
    model = linear_model(rows=40, k=64, n=48, epilogue="relu")
    feeds = feeds_for(model)
    feeds["x"][3, 5], feeds["x"][17, 0], feeds["x"][33, 63] = np.nan, np.inf, -np.inf
    actual = bf16_plan(model, monkeypatch).run(feeds)["y"]
    expected = run_onnxruntime(model, feeds)["y"]
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    np.testing.assert_array_equal(np.isposinf(actual), np.isposinf(expected))
    assert np.isnan(actual[3]).all() and np.isfinite(np.delete(actual, [3, 17, 33], axis=0)).all()


def test_the_path_without_tiles_computes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """KERNORCH_AMX=0 (read once by each plan's library, when it first asks for the tiles): the scalar path over the
    same packed operands. A shape no other test compiles, so this plan's library is loaded fresh."""
    monkeypatch.setenv("KERNORCH_AMX", "0")
    model = linear_model(rows=19, k=72, n=40, epilogue="residual")
    feeds = feeds_for(model)
    actual = bf16_plan(model, monkeypatch).run(feeds)["y"]
    expected = tile_arithmetic(model, feeds, "residual")
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5 * float(np.abs(expected).max()))


def test_float32_plans_and_products_of_two_inputs_stay_with_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    model = linear_model(rows=33, k=100, n=70)
    assert set(matmul_backends(cpu_compile(model, cost="analytic", device="cpu-nominal"))) == {"onednn"}
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (16, 32)),
              helper.make_tensor_value_info("w", TensorProto.FLOAT, (32, 16))]  # fmt: skip
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "product", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (16, 16))])  # fmt: skip
    product = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    compiled = bf16_plan(product, monkeypatch)
    (kernel,) = [k for k in compiled.kernels if any(n.prim == "matmul" for n in k.primitives)]
    assert "weights are not constant" in BACKEND.applies(kernel).reason
    assert ONEDNN.applies(kernel).runs


def test_without_amx_the_matmul_stays_with_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = bf16_plan(linear_model(rows=33, k=100, n=70), monkeypatch)
    (kernel,) = [k for k in compiled.kernels if any(n.prim == "matmul" for n in k.primitives)]
    monkeypatch.setattr(amx_product, "isa_flags", lambda: ("avx512f", "avx512_bf16"))
    assert BACKEND.applies(kernel).reason == "no AMX-BF16 on this CPU"


@pytest.mark.parametrize(("model", "reason"), [
    (lambda: window_model(channels=3, out_channels=32, kernel=9, size=(20, 17)), "3 input channels"),
    (lambda: linear_model(rows=64, k=64, n=256), "K = 64 for 256 columns"),
])  # fmt: skip
def test_shapes_onednn_runs_faster_stay_with_it(model: Callable[[], onnx.ModelProto], reason: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    compiled = bf16_plan(model(), monkeypatch, layout="channels-last", rewrite=True)
    (kernel,) = [k for k in compiled.kernels if any(n.prim in ("matmul", "conv") for n in k.primitives)]
    assert reason in BACKEND.applies(kernel).reason
    assert ONEDNN.applies(kernel).runs


def test_the_source_compiles_without_amx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the compiler does not target AMX (AVX2 here) only the scalar path is compiled: it must compile."""
    compiled = bf16_plan(linear_model(rows=33, k=100, n=70, epilogue="residual"), monkeypatch)
    (kernel,) = [k for k in compiled.kernels if any(n.prim == "matmul" for n in k.primitives)]
    assert_compiles_for(("-mavx2", "-mfma"), describe_library_call(kernel), tmp_path)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("AMX matmul drops the last of its four tile products",
         '"_tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);")',
         '"_tile_dpbf16ps(2, 5, 6);")',
         file="kernorch/codegen/native/amx_product.py",
         tests=("kernorch/codegen/native/amx_matmul_test.py", "kernorch/codegen/native/amx_conv_test.py")),
    here("AMX matmul converts only its first block of rows",
         'with w.block(f"if ({\'!tiles && \' if ring is not None else \'\'}mb != loaded)"):',
         'with w.block(f"if ({\'!tiles && \' if ring is not None else \'\'}loaded < 0)"):',
         tests=("kernorch/codegen/native/amx_matmul_test.py", "kernorch/codegen/native/amx_conv_test.py")),
    here("AMX matmul leaves the bias out",
         'biased = " + bias[n]" if',
         'biased = "" if',
         file="kernorch/codegen/native/amx_product.py"),
    here("AMX matmul's path without tiles stops one k short",
         'f"for (int k = 0; k < {k_total}; k++)")',
         'f"for (int k = 0; k < {k_total} - 1; k++)")',
         file="kernorch/codegen/native/amx_product.py",
         tests=("kernorch/codegen/native/amx_matmul_test.py", "kernorch/codegen/native/amx_conv_test.py")),
    here("AMX matmul takes convolutions over few channels, where oneDNN is faster",
         "FEW_CHANNELS, SHORT_RUN = 16, 32",
         "FEW_CHANNELS, SHORT_RUN = 0, 32"),
    here("AMX matmul reads taps in a convolution's padding",
         'with w.block(f"if (iy < 0 || iy >= {ih} || ix < 0 || ix >= {iw})"):',
         'with w.block("if (iy < 0 || ix < 0)"):'),
    here("AMX convolution's ring keeps a slot's row when another row wants the slot",
         'with w.block("if (tags[slot] != tag)"):',
         'with w.block("if (tags[slot] < 0)"):',
         file="kernorch/codegen/native/amx_product.py",
         tests=("kernorch/codegen/native/amx_matmul_test.py", "kernorch/codegen/native/amx_conv_test.py")),
    here("AMX convolution's ring leaves out the left padding",
         "to=f'row + {px * c}'",
         "to='row'",
         file="kernorch/codegen/native/amx_product.py",
         tests=("kernorch/codegen/native/amx_matmul_test.py", "kernorch/codegen/native/amx_conv_test.py")),
]  # fmt: skip
