"""The direct depthwise convolution (native/depthwise_conv.py): chosen exactly where it applies, and equal to
onnxruntime across kernel sizes, strides, dilations, asymmetric padding, batch, channel counts that leave a
scalar tail, wide rows (several register blocks) and the epilogues it applies itself."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.library.call import LibraryCall, describe_library_call
from kernorch.codegen.native.depthwise_conv import depthwise_rejection
from kernorch.devtools.mutate import here
from kernorch.testing import cpu_compile, random_array
from kernorch.testing.native import assert_close, assert_compiles_for, small_relu_1x1_kernel
from kernorch.tools.check import run_onnxruntime

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`

# ONNX nodes after the depthwise conv's output "c", ending in "e". The residual is "x0", the 1x1 conv's output: the
# tested conv's own input "r" would join its kernel (the identity-into-conv rewrite), leaving no residual post-op
EPILOGUES = {
    "none": [helper.make_node("Identity", ["c"], ["e"])],
    "swish": [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["e"])],
    "hardswish": [helper.make_node("HardSwish", ["c"], ["e"])],
    "relu": [helper.make_node("Relu", ["c"], ["e"])],
    "relu6": [helper.make_node("Clip", ["c", "lo", "hi"], ["e"])],
    "residual": [helper.make_node("Add", ["c", "x0"], ["e"])],
    "swish, scaled per channel": [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["m"]),
                                  helper.make_node("Mul", ["m", "scale"], ["e"])],
    "softplus": [helper.make_node("Softplus", ["c"], ["e"])],
}


def depthwise_model(channels: int, kernel: int, size: tuple[int, int], batch: int = 1,
                    strides: tuple[int, int] = (1, 1), dilations: tuple[int, int] = (1, 1),
                    pads: tuple[int, int, int, int] = (0, 0, 0, 0), bias: bool = True, epilogue: str = "none",
                    group_channels: int = 1, channels_last_output: bool = False) -> onnx.ModelProto:  # fmt: skip
    """x → 1x1 Conv → Relu → depthwise Conv → epilogue → 1x1 Conv: the 1x1 convs around it keep the
    channels-last layout on both sides, so the epilogue joins the depthwise conv, not the layout change.
    With `channels_last_output` the model's output is transposed to [N, H, W, C] (the last conv then has no
    reason to run as a matmul writing NCHW)."""
    w = random_array((channels, group_channels, kernel, kernel), seed=1) * 0.3
    initializers = [numpy_helper.from_array(w, "w"),
                    numpy_helper.from_array(random_array((channels, channels, 1, 1), seed=4) * 0.3, "w0"),
                    numpy_helper.from_array(random_array((4, channels, 1, 1), seed=5) * 0.3, "w1"),
                    numpy_helper.from_array(random_array((channels,), seed=2), "b"),
                    numpy_helper.from_array(random_array((channels, 1, 1), seed=6), "scale"),
                    numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
                    numpy_helper.from_array(np.array(6.0, np.float32), "hi")]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w0"], ["x0"]), helper.make_node("Relu", ["x0"], ["r"]),
             helper.make_node("Conv", ["r", "w", "b"] if bias else ["r", "w"], ["c"], group=channels // group_channels,
                              strides=list(strides), dilations=list(dilations), pads=list(pads)),
             *EPILOGUES[epilogue], helper.make_node("Conv", ["e", "w1"], ["y_nchw" if channels_last_output else "y"])]
    if channels_last_output:
        nodes.append(helper.make_node("Transpose", ["y_nchw"], ["y"], perm=[0, 2, 3, 1]))
    graph = helper.make_graph(nodes, "depthwise",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, channels, *size))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def compiled_calls(model: onnx.ModelProto) -> tuple[np.ndarray, np.ndarray, list[LibraryCall]]:
    """(kernorch's output, onnxruntime's, the library calls between the two 1x1 convs)."""

    feeds = {"x": random_array(tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim), seed=3)}
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout="channels-last", rewrite=True)
    calls = [describe_library_call(k) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
             if b.stateful]  # fmt: skip
    # the 1x1 convs around it (the last one may run as a matmul writing the NCHW output: layout/modes.py)
    assert calls[0].weights.dims[2:] == (1, 1) and (calls[-1].weights.dims[2:] == (1, 1) or calls[-1].op == "matmul"), \
        calls  # fmt: skip
    return compiled.run(feeds)["y"], run_onnxruntime(model, feeds)["y"], calls[1:-1]


CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {  # arguments, the post-ops the call must apply
    "efficientnet's 5x5 with bias and swish": (
        dict(channels=32, kernel=5, size=(9, 13), pads=(2, 2, 2, 2), epilogue="swish"), ("swish",)),
    "strided, asymmetric pads, a scalar channel tail, hardswish": (
        dict(channels=20, kernel=3, size=(10, 17), strides=(2, 2), pads=(1, 0, 1, 2), epilogue="hardswish"),
        ("hardswish",)),
    "dilated, batch 2, no bias, a residual": (
        dict(channels=16, kernel=3, size=(8, 11), batch=2, dilations=(2, 2), pads=(2, 2, 2, 2), bias=False,
             epilogue="residual"), ("add",)),
    "7x7 over a wide row, fewer channels than a vector, relu6": (
        dict(channels=6, kernel=7, size=(5, 40), pads=(3, 3, 3, 3), epilogue="relu6"), ("clip",)),
    "a per-channel operand broadcast over the map": (
        dict(channels=24, kernel=3, size=(6, 10), pads=(1, 1, 1, 1), epilogue="swish, scaled per channel"),
        ("swish", "mul")),
    "efficientvit's stem: 8 channels (half an AVX-512 vector), hardswish": (
        dict(channels=8, kernel=3, size=(12, 19), pads=(1, 1, 1, 1), epilogue="hardswish"), ("hardswish",)),
    "12 channels: a half vector moved back": (
        dict(channels=12, kernel=3, size=(7, 11), strides=(2, 2), pads=(1, 1, 1, 1), epilogue="swish"), ("swish",)),
    "shufflenet's stride 2 with 58 channels, unpadded": (
        dict(channels=58, kernel=3, size=(9, 9), strides=(2, 2)), ()),
}  # fmt: skip


def _post_op_names(call: LibraryCall) -> tuple[str, ...]:
    return tuple(op.alg for op, _ in call.post_ops)


@pytest.mark.parametrize("case", list(CASES))
def test_depthwise_conv_matches_onnxruntime(case: str) -> None:
    arguments, post_ops = CASES[case]
    actual, expected, calls = compiled_calls(depthwise_model(**arguments))
    assert [depthwise_rejection(call) for call in calls] == [None]
    assert _post_op_names(calls[0]) == post_ops
    assert_close(actual, expected)


@pytest.mark.parametrize(("changes", "reason"), [
    (dict(group_channels=2), "not depthwise (one input and one output channel per group)"),
    (dict(epilogue="softplus"), "no C for the soft_relu post-op"),
    (dict(channels=128), "128 channels: a power of two, whose pixels alias in the L1 cache"),
])  # fmt: skip
def test_convs_it_does_not_take_stay_with_onednn(changes: dict[str, Any], reason: str) -> None:
    arguments: dict[str, Any] = dict(channels=16, kernel=3, size=(7, 9), pads=(1, 1, 1, 1)) | changes
    actual, expected, calls = compiled_calls(depthwise_model(**arguments))
    assert [depthwise_rejection(call) for call in calls] == [reason]
    assert_close(actual, expected)


def test_nchw_is_refused() -> None:
    """(An NCHW depthwise conv is a generated loop kernel, not a library call: its refusal is checked here.)"""
    _, _, (call,) = compiled_calls(depthwise_model(channels=16, kernel=3, size=(7, 9)))
    n, c, h, w = call.src.dims
    nchw = dataclasses.replace(call.src, strides=(c * h * w, h * w, w, 1))
    assert depthwise_rejection(dataclasses.replace(call, src=nchw)) == "not channels-last"


def test_explain_names_the_depthwise_conv(tmp_path: Path) -> None:
    model = depthwise_model(channels=16, kernel=3, size=(7, 9), epilogue="swish", channels_last_output=True)
    onnx.save(model, tmp_path / "m.onnx")
    command = [sys.executable, "-m", "kernorch.cli", "explain", str(tmp_path / "m.onnx"), "--cost", "analytic",
               "--layout", "channels-last"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    lines = [line for line in result.stdout.splitlines() if "library call:" in line]
    expected = [small_relu_1x1_kernel(), "direct C depthwise convolution", "direct C convolution (few output channels)"]
    assert [line.split(", by ")[-1] for line in lines] == expected, lines
    assert "conv (channels-last) ← bias, swish" in lines[1]


@pytest.mark.parametrize("isa", [("-mavx2", "-mfma"), ("-mavx512f",)])
def test_the_same_source_compiles_for_avx2_and_avx512(isa: tuple[str, ...], tmp_path: Path) -> None:
    arguments, _ = CASES["efficientnet's 5x5 with bias and swish"]
    _, _, calls = compiled_calls(depthwise_model(**arguments))
    assert_compiles_for(isa, calls[0], tmp_path)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the depthwise conv's padded edge reads the pixel past the row's end",
         'f"if (ix < 0 || ix >= {width}) continue;",',
         'f"if (ix < 0 || ix > {width}) continue;",'),
    here("the depthwise conv's padded edge forgets the bias",
         'body = accumulate("ko_vc acc = *(const ko_vcu *)(s->bias + c);",',
         'body = accumulate("ko_vc acc = (ko_vc){0};",'),
    here("the depthwise conv adds the top padding instead of subtracting it",
         'return f"(y * {stride_y} - {pad_y} + {tap_y} * {dilate_y + 1}) * {self.call.src.strides[2]}L"',
         'return f"(y * {stride_y} + {pad_y} + {tap_y} * {dilate_y + 1}) * {self.call.src.strides[2]}L"',
         file="kernorch/codegen/native/skeleton.py"),
]  # fmt: skip
