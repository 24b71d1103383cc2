"""The convolution over few input channels (native/few_channel_conv.py): chosen exactly where it applies, and equal
to onnxruntime for stems with and without padding, strides, batch, kernel rows merged (channels-last, a run of
KW x IC per pixel, copied with zeros where it crosses the border) or tap by tap (dilated), output channels that
leave a short chunk, post-ops, and edge values on the border."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.library.call import describe_library_call
from kernorch.codegen.native.few_channel_conv import MAX_OUTPUT_WIDTH, few_channel_rejection, kernel_rows_merged
from kernorch.codegen.native.streaming_product_test import compiled_call, conv_model
from kernorch.devtools.mutate import here
from kernorch.testing import cpu_compile, random_array
from kernorch.testing.native import assert_close, assert_compiles_for
from kernorch.tools.check import run_onnxruntime

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`

CASES: dict[str, tuple[dict[str, Any], bool]] = {  # conv_model's arguments, whether kernel rows are merged
    "squeezenet's stem: 3 → 64 3x3 stride 2, unpadded, relu": (
        dict(in_channels=3, out_channels=64, kernel=3, size=(33, 33), strides=(2, 2), pads=0, epilogue="relu"), True),
    "resnet's stem: 7x7 stride 2 pad 3, batch 2, no bias": (
        dict(in_channels=3, out_channels=64, kernel=7, size=(20, 26), strides=(2, 2), batch=2, bias=False), True),
    "24 outputs (a short chunk), 3x3 pad 1 on an odd width": (
        dict(in_channels=3, out_channels=24, kernel=3, size=(9, 23)), True),
    "100 outputs (chunks of 64 and 36), four input channels, 5x5 stride 3": (
        dict(in_channels=4, out_channels=100, kernel=5, size=(17, 14), strides=(3, 3)), True),
    "dilated 3x3: tap by tap, two input channels": (
        dict(in_channels=2, out_channels=32, kernel=3, size=(12, 15), dilations=(2, 2)), False),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_few_channel_convs_match_onnxruntime(case: str) -> None:
    arguments, merged = CASES[case]
    actual, expected, call, backend = compiled_call(conv_model(**arguments))
    assert (backend, few_channel_rejection(call), kernel_rows_merged(call)) == ("few_channel_conv", None, merged)
    assert_close(actual, expected)


@pytest.mark.parametrize("case", ["24 outputs (a short chunk), 3x3 pad 1 on an odd width",
                                  "dilated 3x3: tap by tap, two input channels"])  # fmt: skip
def test_edge_values_on_the_border_propagate_as_in_onnxruntime(case: str) -> None:
    """NaN and inf on the first and last columns (the runs copied with zeros around them) and inside."""
    arguments, _ = CASES[case]
    shape = (1, arguments["in_channels"], *arguments["size"])
    x = random_array(shape, seed=7)
    x[0, 0, 0, 0], x[0, 1, 4, -1], x[0, 1, 5, 7], x[0, 0, -1, -2] = np.nan, np.inf, -1e30, 1e30
    actual, expected, _, backend = compiled_call(conv_model(**arguments), feeds={"x": x})
    assert backend == "few_channel_conv"
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-4, atol=1e-6)


def test_rows_of_any_width_with_a_transcendental_epilogue() -> None:
    """efficientnet_b0's stem (3 → 32 3x3 stride 2, swish, then a depthwise conv) writes 112-pixel rows, past
    MAX_OUTPUT_WIDTH: oneDNN would run the conv alone as fast, but its swish post-op slowly (254 us in place with
    it vs 183 here), so with a transcendental post-op the kernel takes any width. Here 75-pixel rows."""
    initializers = [numpy_helper.from_array(random_array((32, 3, 3, 3), seed=1) / 5, "w"),
                    numpy_helper.from_array(random_array((32,), seed=2), "b"),
                    numpy_helper.from_array(random_array((32, 1, 3, 3), seed=4) / 3, "wd")]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["e"]),
             helper.make_node("Conv", ["e", "wd"], ["y"], group=32, pads=[1, 1, 1, 1])]  # fmt: skip
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 10, 150))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout="channels-last")
    (call,) = [describe_library_call(k) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
               if b.name == "few_channel_conv"]  # fmt: skip
    assert call.dst.dims[3] == 75 > MAX_OUTPUT_WIDTH and [op.alg for op, _ in call.post_ops] == ["swish"]
    assert few_channel_rejection(dataclasses.replace(call, post_ops=())) == \
        "output rows of 75 pixels: oneDNN's blocking along them is as fast"  # fmt: skip
    x = random_array((1, 3, 10, 150), seed=3)
    x[0, 0, 0, 0], x[0, 1, 4, -1], x[0, 2, 5, 70] = np.nan, np.inf, -np.inf
    actual, expected = compiled.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    finite = np.isfinite(expected)
    assert_close(actual[finite], expected[finite])


@pytest.mark.parametrize(("changes", "reason"), [
    (dict(in_channels=5), "5 input channels: oneDNN's blocking pays off"),
    (dict(out_channels=8), "8 output channels leave most of a vector idle"),
    (dict(size=(8, 132)), "output rows of 65 pixels: oneDNN's blocking along them is as fast"),
    (dict(in_channels=4, kernel=17, size=(40, 40)),
     "a 17x17 window over 4 channels: its border rows would crowd the stack"),
])  # fmt: skip
def test_convs_it_does_not_take_stay_with_onednn(changes: dict[str, Any], reason: str) -> None:
    arguments = CASES["squeezenet's stem: 3 → 64 3x3 stride 2, unpadded, relu"][0] | changes
    actual, expected, call, backend = compiled_call(conv_model(**arguments))
    assert (backend, few_channel_rejection(call)) == ("onednn", reason)
    assert_close(actual, expected)


@pytest.mark.parametrize("isa", [("-mavx2", "-mfma"), ("-mavx512f",)])
def test_the_same_source_compiles_for_avx2_and_avx512(isa: tuple[str, ...], tmp_path: Path) -> None:
    _, _, call, _ = compiled_call(conv_model(**CASES["resnet's stem: 7x7 stride 2 pad 3, batch 2, no bias"][0]))
    assert_compiles_for(isa, call, tmp_path)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the few-channel conv refuses wide rows even with a transcendental post-op",
         "if call.dst.dims[3] > MAX_OUTPUT_WIDTH and not slow_in_onednn(call):",
         "if call.dst.dims[3] > MAX_OUTPUT_WIDTH:"),
    here("the few-channel conv takes a run that crosses the right border as if inside",
         "else if (at_x >= 0 && at_x + {kernel_w} <= {width}) ",
         "else if (at_x >= 0 && at_x + {kernel_w} <= {width} + 1) "),
    here("the few-channel conv's border copy shifts its pixels by one",
         "(at_x + kx) * {src_x}L + c] : 0.0f;",
         "(at_x + kx - 1) * {src_x}L + c] : 0.0f;"),
    here("the few-channel conv's tap-by-tap rows ignore the dilation along x",
         "+ {name}_kx[t] * {dilate_x};",
         "+ {name}_kx[t];"),
]  # fmt: skip
