"""The Winograd F(2x2, 3x3) convolution (native/winograd_conv.py): chosen exactly where it applies, and equal to
onnxruntime with padding (symmetric or not), odd output sizes (partial tiles), batch, a short last block of
tiles, bias, and the epilogues it applies itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.native import winograd_conv as c_winograd_conv
from kernorch.codegen.native.depthwise_conv_test import EPILOGUES, compiled_calls
from kernorch.codegen.native.direct_conv_test import assert_close, assert_compiles_for
from kernorch.codegen.native.winograd_conv import winograd_rejection
from kernorch.testing import random_array


def conv3x3_model(in_channels: int, out_channels: int, size: tuple[int, int], batch: int = 1,
                  pads: tuple[int, int, int, int] = (0, 0, 0, 0), bias: bool = True, epilogue: str = "none",
                  kernel: int = 3, strides: tuple[int, int] = (1, 1)) -> onnx.ModelProto:  # fmt: skip
    """x → 1x1 Conv → Relu → the conv → epilogue → 1x1 Conv (channels-last on both sides of the tested conv)."""
    initializers = [
        numpy_helper.from_array(random_array((out_channels, in_channels, kernel, kernel), seed=1) * 0.1, "w"),
        numpy_helper.from_array(random_array((in_channels, in_channels, 1, 1), seed=4) * 0.3, "w0"),
        numpy_helper.from_array(random_array((4, out_channels, 1, 1), seed=5) * 0.3, "w1"),
        numpy_helper.from_array(random_array((out_channels,), seed=2), "b"),
        numpy_helper.from_array(random_array((out_channels, 1, 1), seed=6), "scale"),
    ]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w0"], ["x0"]), helper.make_node("Relu", ["x0"], ["r"]),
             helper.make_node("Conv", ["r", "w", "b"] if bias else ["r", "w"], ["c"], pads=list(pads),
                              strides=list(strides)),
             *EPILOGUES[epilogue], helper.make_node("Conv", ["e", "w1"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "winograd",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, in_channels, *size))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {  # arguments, the post-ops the call must apply
    "candy's residual conv, small, hardswish": (
        dict(in_channels=32, out_channels=32, size=(12, 14), epilogue="hardswish"), ("hardswish",)),
    "padded, odd output, batch 2, a residual": (
        dict(in_channels=32, out_channels=32, size=(9, 13), batch=2, pads=(1, 1, 1, 1), epilogue="residual"),
        ("add",)),
    "asymmetric pads, no bias, more output than input channels": (
        dict(in_channels=16, out_channels=48, size=(7, 11), pads=(1, 0, 2, 1), bias=False), ()),
    "a per-channel operand broadcast over the map": (
        dict(in_channels=16, out_channels=16, size=(6, 10), pads=(1, 1, 1, 1), epilogue="swish, scaled per channel"),
        ("swish", "mul")),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_winograd_conv_matches_onnxruntime(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c_winograd_conv, "MIN_MACS", 0)  # small shapes, every path of the kernel
    arguments, post_ops = CASES[case]
    actual, expected, calls = compiled_calls(conv3x3_model(**arguments))
    assert [winograd_rejection(call) for call in calls] == [None]
    assert tuple(op.alg for op, _ in calls[0].post_ops) == post_ops
    assert_close(actual, expected)


def test_a_conv_above_the_size_threshold_takes_it_unpatched() -> None:
    actual, expected, calls = compiled_calls(conv3x3_model(in_channels=64, out_channels=64, size=(42, 42)))
    assert [winograd_rejection(call) for call in calls] == [None]
    assert_close(actual, expected)


@pytest.mark.parametrize(("changes", "reason"), [
    (dict(kernel=5, pads=(2, 2, 2, 2)), "not 3x3, stride 1, undilated"),
    (dict(strides=(2, 2)), "not 3x3, stride 1, undilated"),
    (dict(out_channels=24), "channels are not multiples of 16"),
    (dict(epilogue="softplus"), "no C for the soft_relu post-op"),
])  # fmt: skip
def test_convs_it_does_not_take_stay_with_onednn(changes: dict[str, Any], reason: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(c_winograd_conv, "MIN_MACS", 0)
    arguments: dict[str, Any] = dict(in_channels=16, out_channels=16, size=(8, 9), pads=(1, 1, 1, 1)) | changes
    actual, expected, calls = compiled_calls(conv3x3_model(**arguments))
    assert [winograd_rejection(call) for call in calls] == [reason]
    assert_close(actual, expected)


def test_convs_with_many_channels_stay_with_onednn() -> None:
    # resnet's 256 -> 256 3x3 on 14x14 ran 1.5x slower in Winograd than in oneDNN, its 512 -> 512 on 7x7 5x
    actual, expected, calls = compiled_calls(conv3x3_model(in_channels=256, out_channels=128, size=(28, 28)))
    assert [winograd_rejection(call) for call in calls] == [
        "its transformed filters (2048 KiB) outgrow the L2 every block of tiles reads them from"]
    assert_close(actual, expected)
    _, _, calls = compiled_calls(conv3x3_model(in_channels=128, out_channels=128, size=(28, 28)))
    assert [winograd_rejection(call) for call in calls] == [None]  # 1 MiB: the largest it takes


def test_small_convs_stay_with_onednn() -> None:
    _, _, calls = compiled_calls(conv3x3_model(in_channels=16, out_channels=16, size=(8, 9), pads=(1, 1, 1, 1)))
    assert [winograd_rejection(call) for call in calls] == ["too small for the transforms to pay"]


@pytest.mark.parametrize("isa", [("-mavx2", "-mfma"), ("-mavx512f",)])
def test_the_same_source_compiles_for_avx2_and_avx512(isa: tuple[str, ...], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(c_winograd_conv, "MIN_MACS", 0)
    arguments, _ = CASES["padded, odd output, batch 2, a residual"]
    _, _, calls = compiled_calls(conv3x3_model(**arguments))
    assert_compiles_for(isa, calls[0], tmp_path)
