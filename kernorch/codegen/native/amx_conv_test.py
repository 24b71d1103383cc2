"""The folded AMX convolution (native/amx_conv.py): a bf16 convolution to few output channels, its kernel columns
folded into the product's columns, equal to onnxruntime's float32 convolution of the rounded operands — from a
float32 source (padding, dilation, channels no multiple of 32, a batch); and every convolution whose tiles load
from the ring of source rows (amx_product.py's `Ring`) when its source is bfloat16, stored so by its producer
(padding, strides, blocks past a row's end); the path without tiles the same; shapes that do not fold stay
unfolded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kernorch.codegen.native.amx_product as amx_product
from kernorch.codegen.library.call import describe_library_call
from kernorch.codegen.native.amx_conv import folds
from kernorch.codegen.native.amx_matmul_test import bf16, bf16_plan, matmul_backends, window_model
from kernorch.codegen.native.amx_product import product_operands
from kernorch.devtools.mutate import here
from kernorch.testing import random_array
from kernorch.testing.native import assert_compiles_for
from kernorch.tools.check import run_onnxruntime

pytestmark = [pytest.mark.sanitize,  # under the sanitizers in `make sanitize`
              pytest.mark.skipif(not amx_product.amx_supported(), reason="needs AMX-BF16 tiles")]

FOLDED: dict[str, dict[str, Any]] = {
    "candy's last conv, smaller (32 to 3, 9x9)": dict(channels=32, out_channels=3, kernel=9, size=(14, 41)),
    "one output, padded, dilated along x": dict(channels=24, out_channels=1, kernel=3, size=(9, 37),
                                                dilations=(2, 3), pads=(1, 4, 2, 3)),
    "5 outputs of 5x5 over 40 channels, strided along y, batch 2": dict(channels=40, out_channels=5, kernel=5,
                                                                          size=(12, 19), strides=(2, 1), batch=2,
                                                                          pads=(2, 2, 2, 2)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FOLDED))
def test_a_folded_convolution_multiplies_its_window(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = FOLDED[case]
    x = random_array((spec.get("batch", 1), *spec["size"], spec["channels"]), seed=4)
    compiled = bf16_plan(window_model(**spec), monkeypatch, layout="channels-last", rewrite=True)
    assert matmul_backends(compiled) == ["amx_matmul"]
    (call,) = [describe_library_call(k) for k in compiled.kernels if any(n.prim == "conv" for n in k.primitives)]
    operands = product_operands(call)
    assert not isinstance(operands, str) and folds(operands)
    expected = run_onnxruntime(window_model(**spec, rounded=True), {"x": bf16(x).astype(np.float32)})["y"]
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=0,
                               atol=2e-5 * float(np.abs(expected).max()))  # fmt: skip


def chained_model(size: tuple[int, int], channels: int, out_channels: int, kernel: int,
                  convolution: dict[str, Any]) -> onnx.ModelProto:  # fmt: skip
    """[1, H, W, C] → NCHW → 1x1 conv → relu → k x k conv (`convolution`'s attributes) + bias → NHWC: the first
    conv stores its result bfloat16 for the second to read."""
    w0 = random_array((channels, channels, 1, 1), seed=1) * np.float32(channels**-0.5)
    w = random_array((out_channels, channels, kernel, kernel), seed=2) * np.float32((channels * kernel**2) ** -0.5)
    initializers = [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w, "w"),
                    numpy_helper.from_array(random_array((out_channels,), seed=3), "b")]  # fmt: skip
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["xt", "w0"], ["c0"]), helper.make_node("Relu", ["c0"], ["r"]),
             helper.make_node("Conv", ["r", "w", "b"], ["c"], **convolution),
             helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])]  # fmt: skip
    graph = helper.make_graph(nodes, "chained",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, *size, channels))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                                               ir_version=8))  # fmt: skip


BFLOAT16_SOURCES: dict[str, tuple[tuple[int, int], int, int, int, dict[str, Any]]] = {
    # (H, W), channels, outputs, kernel, attributes
    "folded: 3 outputs of 7x7, 47 positions a row (the second block reaches past them)": ((11, 47), 64, 3, 7, {}),
    "folded, padded: a block's last positions are padding": ((10, 77), 32, 2, 5, {"pads": [2, 2, 2, 2]}),
    "48 outputs of 3x3, padded, 61 pixels a row": ((9, 61), 64, 48, 3, {"pads": [1, 1, 1, 1]}),
    "40 outputs of 3x3, stride 2, dilated along y": ((13, 126), 32, 40, 3, {"strides": [2, 2], "dilations": [2, 1]}),
    "14 pixels a row: no ring, blocks of consecutive pixels copied": ((9, 14), 32, 40, 3, {"pads": [1, 1, 1, 1]}),
}


@pytest.mark.parametrize("tiles", ["1", "0"])
@pytest.mark.parametrize("case", list(BFLOAT16_SOURCES))
def test_a_bfloat16_source_is_read_through_the_ring(case: str, tiles: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Channels a multiple of 32 in bfloat16, stored so by the conv before: its rows copied into the ring, the
    tiles loaded from there; KERNORCH_AMX=0 the scalar path (a source one pixel wider, so that its plan's library
    is loaded fresh), same sums."""
    monkeypatch.setenv("KERNORCH_AMX", tiles)
    (height, width), channels, out_channels, kernel, convolution = BFLOAT16_SOURCES[case]
    size = (height, width + tiles.count("0"))
    model = chained_model(size, channels, out_channels, kernel, convolution)
    x = random_array((1, *size, channels), seed=4)
    compiled = bf16_plan(model, monkeypatch, layout="channels-last", rewrite=True)
    assert matmul_backends(compiled) == ["amx_matmul", "amx_matmul"]
    calls = [describe_library_call(k) for k in compiled.kernels if any(n.prim == "conv" for n in k.primitives)]
    assert [c.src.dtype for c in calls] == ["float32", "bfloat16"]  # stored so by the first
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    first = np.maximum(bf16(x) @ bf16(weights["w0"][:, :, 0, 0]).T, 0)
    nodes = [helper.make_node("Transpose", ["r"], ["rt"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["rt", "w", "b"], ["c"], **convolution),
             helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])]  # fmt: skip
    initializers = [numpy_helper.from_array(bf16(weights["w"]).astype(np.float32), "w"),
                    numpy_helper.from_array(weights["b"], "b")]  # fmt: skip
    inputs = [helper.make_tensor_value_info("r", TensorProto.FLOAT, first.shape)]
    rounded = helper.make_graph(nodes, "rounded", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                initializers)  # fmt: skip
    reference = helper.make_model(rounded, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    expected = run_onnxruntime(reference, {"r": bf16(first).astype(np.float32)})["y"]
    # the first conv's sums are float32 in the kernel, float64 here: its bfloat16 rounding may differ by an ulp
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=0,
                               atol=3e-3 * float(np.abs(expected).max()))  # fmt: skip


@pytest.mark.parametrize(("spec", "folded"), [
    (dict(channels=32, out_channels=16, kernel=3, size=(9, 9)), False),  # a tile's width of outputs
    (dict(channels=32, out_channels=4, kernel=9, size=(12, 12)), False),  # 36 folded columns
    (dict(channels=32, out_channels=4, kernel=3, size=(12, 12), strides=(1, 2)), False),  # strided along x
    (dict(channels=32, out_channels=8, kernel=3, size=(12, 12), strides=(2, 1)), True),
])  # fmt: skip
def test_which_convolutions_fold(spec: dict[str, Any], folded: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = bf16_plan(window_model(**spec), monkeypatch, layout="channels-last", rewrite=True)
    assert matmul_backends(compiled) == ["amx_matmul"]
    (call,) = [describe_library_call(k) for k in compiled.kernels if any(n.prim == "conv" for n in k.primitives)]
    operands = product_operands(call)
    assert not isinstance(operands, str) and folds(operands) == folded
    x = random_array((1, *spec["size"], spec["channels"]), seed=4)
    expected = run_onnxruntime(window_model(**spec, rounded=True), {"x": bf16(x).astype(np.float32)})["y"]
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=0,
                               atol=2e-5 * float(np.abs(expected).max()))  # fmt: skip


@pytest.mark.parametrize("case", list(BFLOAT16_SOURCES)[:2])
def test_the_sources_compile_without_amx(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the compiler does not target AMX (AVX2 here) only the scalar paths are compiled: they must compile."""
    (height, width), channels, out_channels, kernel, convolution = BFLOAT16_SOURCES[case]
    compiled = bf16_plan(chained_model((height, width), channels, out_channels, kernel, convolution), monkeypatch,
                         layout="channels-last", rewrite=True)  # fmt: skip
    calls = [describe_library_call(k) for k in compiled.kernels if any(n.prim == "conv" for n in k.primitives)]
    assert_compiles_for(("-mavx2", "-mfma"), calls[-1], tmp_path)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("AMX convolution loads a strided block's second row tile one stride short",
         "_tile_loadd(5, x + {16 * sx * c}",
         "_tile_loadd(5, x + {16 * c}",
         file="kernorch/codegen/native/amx_matmul.py"),
    here("folded AMX convolution sums one kernel column short",
         'with w.block(f"for (int kx = 0; kx < {kw}; kx++)"):',
         'with w.block(f"for (int kx = 1; kx < {kw}; kx++)"):'),
]  # fmt: skip
