"""The product over few rows that streams its weights once (native/streaming_product.py): chosen exactly where it
applies, and equal to onnxruntime for convolutions with padded taps, taps wholly in the padding, strides,
dilation, batch, both layouts, output channels that leave a short chunk, two (and five) register blocks,
post-ops (relu, a residual); for a classifier's Gemm and a matmul over a few rows with a per-row operand; and on
edge values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.library.call import LibraryCall, describe_library_call
from kernorch.codegen.native.streaming_product import chunk_vectors, geometry, streaming_rejection
from kernorch.devtools.mutate import here
from kernorch.testing import cpu_compile, random_array
from kernorch.testing.native import assert_close, assert_compiles_for
from kernorch.tools.check import run_onnxruntime

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`


def conv_model(in_channels: int, out_channels: int, kernel: int, size: tuple[int, int], batch: int = 1,
               strides: tuple[int, int] = (1, 1), dilations: tuple[int, int] = (1, 1), pads: int | None = None,
               bias: bool = True, epilogue: str = "none") -> onnx.ModelProto:  # fmt: skip
    """x → Relu → the tested Conv → epilogue ("none", "relu" or "residual, relu": + x's Relu, the shapes
    permitting) → Sigmoid: elementwise neighbours, so the tested conv is the model's only linear primitive."""
    pad = kernel // 2 * dilations[0] if pads is None else pads
    w = random_array((out_channels, in_channels, kernel, kernel), seed=1) / np.sqrt(in_channels * kernel * kernel)
    initializers = [numpy_helper.from_array(w.astype(np.float32), "w"),
                    numpy_helper.from_array(random_array((out_channels,), seed=2), "b")]  # fmt: skip
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Conv", ["r", "w", "b"] if bias else ["r", "w"], ["c"], strides=list(strides),
                              dilations=list(dilations), pads=[pad] * 4)]  # fmt: skip
    if epilogue == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["e"]))
    elif epilogue == "residual, relu":
        nodes += [helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["e"])]
    else:
        nodes.append(helper.make_node("Identity", ["c"], ["e"]))
    nodes.append(helper.make_node("Sigmoid", ["e"], ["y"]))
    graph = helper.make_graph(nodes, "streaming",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, in_channels, *size))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def gemm_model(rows: int, inputs: int, outputs: int, residual: str = "none") -> onnx.ModelProto:
    """x → Relu → Gemm (transB, bias) → + a residual ("none", "row": one value per row, "matrix") → Tanh."""
    weights = (random_array((outputs, inputs), seed=1) / np.sqrt(inputs)).astype(np.float32)
    initializers = [numpy_helper.from_array(weights, "w"),
                    numpy_helper.from_array(random_array((outputs,), seed=2), "b")]  # fmt: skip
    inputs_info = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (rows, inputs))]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Gemm", ["r", "w", "b"], ["g"], transB=1)]
    if residual == "none":
        nodes.append(helper.make_node("Identity", ["g"], ["e"]))
    else:
        shape = (rows, 1) if residual == "row" else (rows, outputs)
        inputs_info.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, shape))
        nodes.append(helper.make_node("Add", ["g", "z"], ["e"]))
    nodes.append(helper.make_node("Tanh", ["e"], ["y"]))
    graph = helper.make_graph(nodes, "streaming_gemm", inputs_info,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def compiled_call(model: onnx.ModelProto, layout: str = "channels-last", feeds: dict[str, np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, LibraryCall, str]:  # fmt: skip
    """(kernorch's output, onnxruntime's, the model's one library call, the backend that ran it)."""
    shapes = {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim) for i in model.graph.input}
    feeds = feeds or {name: random_array(shape, seed=3 + k) for k, (name, shape) in enumerate(shapes.items())}
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout=layout, rewrite=True)
    calls = [(describe_library_call(k), b.name) for k, b in zip(compiled.kernels, compiled.executor.backends,
                                                               strict=True) if b.stateful]  # fmt: skip
    assert len(calls) == 1, calls
    return compiled.run(feeds)["y"], run_onnxruntime(model, feeds)["y"], *calls[0]


CONVS: dict[str, dict[str, Any]] = {
    "resnet's last stage: 3x3 on 2x2, every row with padded taps": dict(
        in_channels=64, out_channels=48, kernel=3, size=(2, 2), epilogue="relu"),
    "3x3 on 1x1: eight taps wholly in the padding, not packed": dict(
        in_channels=192, out_channels=128, kernel=3, size=(1, 1)),
    "stride 2, 4x4 → 2x2, 100 outputs (a short chunk), no bias": dict(
        in_channels=40, out_channels=100, kernel=3, size=(4, 4), strides=(2, 2), bias=False),
    "1x1 on 4x4: 16 rows, two register blocks, a residual then relu": dict(
        in_channels=128, out_channels=128, kernel=1, size=(4, 4), epilogue="residual, relu"),
    "dilated 3x3, batch 2 on 2x3: 12 rows": dict(
        in_channels=64, out_channels=96, kernel=3, size=(2, 3), batch=2, dilations=(2, 2)),
    "5x5 on 3x3 with 2x3 taps out of the padding's reach": dict(
        in_channels=48, out_channels=64, kernel=5, size=(3, 3), pads=1),
    "1x1 on 7x7: 49 rows in five register blocks, 1 MiB of weights (cold in place)": dict(
        in_channels=256, out_channels=1024, kernel=1, size=(7, 7), epilogue="relu"),
}  # fmt: skip


@pytest.mark.parametrize("layout", ["channels-last", "nchw"])
@pytest.mark.parametrize("case", list(CONVS))
def test_convolutions_match_onnxruntime(case: str, layout: str) -> None:
    actual, expected, call, backend = compiled_call(conv_model(**CONVS[case]), layout)
    assert (backend, streaming_rejection(call)) == ("streaming_product", None)
    assert_close(actual, expected)


def test_taps_in_the_padding_are_not_packed() -> None:
    _, _, call, _ = compiled_call(conv_model(**CONVS["3x3 on 1x1: eight taps wholly in the padding, not packed"]))
    shape = geometry(call)
    assert not isinstance(shape, str)
    assert shape.taps == ((1, 1),) and shape.sources == ((0,),)
    _, _, call, _ = compiled_call(conv_model(**CONVS["5x5 on 3x3 with 2x3 taps out of the padding's reach"]))
    shape = geometry(call)
    assert not isinstance(shape, str)
    assert len(shape.taps) == 9 and all(ky in (1, 2, 3) and kx in (1, 2, 3) for ky, kx in shape.taps)


@pytest.mark.parametrize(("rows", "residual"), [(1, "none"), (3, "row"), (5, "matrix")])
def test_gemms_match_onnxruntime(rows: int, residual: str) -> None:
    """A classifier's Gemm (one row, 1000 outputs: a short last chunk) and a few rows with a residual operand."""
    actual, expected, call, backend = compiled_call(gemm_model(rows, 256, 1000 if rows == 1 else 200, residual))
    assert (call.op, backend, streaming_rejection(call)) == ("matmul", "streaming_product", None)
    assert [op.alg for op, _ in call.post_ops] == ([] if residual == "none" else ["add"]) + ["tanh"]
    assert_close(actual, expected)


def test_edge_values_propagate_as_in_onnxruntime() -> None:
    """NaN, ±inf and ±1e30 inputs: a NaN or inf row stays so through the sums (the padding reads zeros, as the
    zero-padded convolution does) and sigmoid saturates the rest."""
    model = conv_model(**CONVS["resnet's last stage: 3x3 on 2x2, every row with padded taps"])
    x = random_array((1, 64, 2, 2), seed=5)
    x[0, 3, 0, 0], x[0, 5, 1, 1], x[0, 7, 0, 1], x[0, 9, 1, 0] = np.nan, np.inf, 1e30, -1e30
    actual, expected, _, backend = compiled_call(model, feeds={"x": x})
    assert backend == "streaming_product"
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("changes", "reason"), [
    (dict(size=(5, 4)), "20 output rows reuse each of 110592 bytes of weights: oneDNN's blocking pays off"),
    (dict(in_channels=256, out_channels=512, kernel=1, size=(7, 7)),
     "49 output rows reuse each of 524288 bytes of weights: oneDNN's blocking pays off"),
    (dict(in_channels=8, out_channels=16), "4608 bytes of weights are no stream"),
])  # fmt: skip
def test_products_it_does_not_take_stay_with_onednn(changes: dict[str, Any], reason: str) -> None:
    arguments = CONVS["resnet's last stage: 3x3 on 2x2, every row with padded taps"] | changes
    actual, expected, call, backend = compiled_call(conv_model(**arguments))
    assert (backend, streaming_rejection(call)) == ("onednn", reason)
    assert_close(actual, expected)


def test_chunks_shrink_to_give_both_threads_items() -> None:
    assert [chunk_vectors(rows, 512) for rows in (1, 4, 6, 7, 8, 9, 12, 16)] == [4, 4, 4, 3, 3, 2, 2, 2]
    assert chunk_vectors(1, 1000) == 4  # 16 chunks, the last of 40 channels
    assert chunk_vectors(1, 64) == 1 and chunk_vectors(1, 96) == 1 and chunk_vectors(1, 128) == 2


@pytest.mark.parametrize("isa", [("-mavx2", "-mfma"), ("-mavx512f",)])
def test_the_same_source_compiles_for_avx2_and_avx512(isa: tuple[str, ...], tmp_path: Path) -> None:
    _, _, call, _ = compiled_call(conv_model(**CONVS["1x1 on 4x4: 16 rows, two register blocks, a residual then relu"]))
    assert_compiles_for(isa, call, tmp_path)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the streaming product packs only the taps every row reads (not those any row reads)",
         "if any(offset >= 0 for offset in offsets):",
         "if all(offset >= 0 for offset in offsets):"),
    here("the streaming product's register block starts every block at the first row",
         "const long at = {name}_src[t][first + r];",
         "const long at = {name}_src[t][r];"),
    here("the streaming product's short last chunk writes a whole chunk of channels",
         "c1 = c0 + {name}_CHUNK < {outputs} ? c0 + {name}_CHUNK : {outputs};",
         "c1 = c0 + {name}_CHUNK;",
         tests=("kernorch/codegen/native/streaming_product_test.py",
                "kernorch/codegen/native/few_channel_conv_test.py")),
    here("the streaming product's padded taps read the source's first row, not zeros",
         "+ r] = at < 0 ? {name}_zeros : src + at;",
         "+ r] = at < 0 ? src : src + at;"),
    here("the streaming product stops at 16 rows whatever its weights",
         "if rows > (MAX_ROWS_COLD if weight_bytes >= COLD_WEIGHT_BYTES else MAX_ROWS):",
         "if rows > MAX_ROWS:"),
]  # fmt: skip
