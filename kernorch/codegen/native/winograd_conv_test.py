"""The Winograd F(2x2, 3x3) convolution (native/winograd_conv.py), both schedules: chosen exactly where it applies,
and equal to onnxruntime with padding (symmetric or not), odd output sizes (partial tiles), batch, a short last
block of tiles, bias, the epilogues it applies itself, and pixels or weights that are not finite (NaN and
infinities where onnxruntime's direct sum has them, not spread over a tile); and 3-d convolutions run over frames
(padded or not over frames, kernels one to three frames deep, batch, a residual, values that are not finite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.library import LibraryCall, Tensor
from kernorch.codegen.library.call import describe_library_call
from kernorch.codegen.library.epilogue import Binary
from kernorch.codegen.native import winograd_conv as c_winograd_conv
from kernorch.codegen.native.depthwise_conv_test import EPILOGUES, compiled_calls
from kernorch.codegen.native.winograd_conv import _streamed, planar, winograd_rejection
from kernorch.devtools.mutate import here
from kernorch.testing import cpu_compile, random_array
from kernorch.testing.native import assert_close, assert_compiles_for
from kernorch.tools.check import run_onnxruntime

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`


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
    "padded, odd output, relu (in registers)": (
        dict(in_channels=16, out_channels=32, size=(9, 11), pads=(1, 1, 1, 1), epilogue="relu"), ("relu",)),
    "a per-channel operand broadcast over the map": (
        dict(in_channels=16, out_channels=16, size=(6, 10), pads=(1, 1, 1, 1), epilogue="swish, scaled per channel"),
        ("swish", "mul")),
    # the streamed schedule (output channels a multiple of 64)
    "streamed: padded, odd output, batch 2, a residual": (
        dict(in_channels=64, out_channels=64, size=(9, 13), batch=2, pads=(1, 1, 1, 1), epilogue="residual"),
        ("add",)),
    "streamed: unpadded, two blocks of output channels, hardswish": (
        dict(in_channels=32, out_channels=128, size=(12, 15), epilogue="hardswish"), ("hardswish",)),
    "streamed: padded, relu (in registers)": (
        dict(in_channels=32, out_channels=64, size=(8, 10), pads=(1, 1, 1, 1), epilogue="relu"), ("relu",)),
    "streamed: asymmetric pads, no bias, a tile count no multiple of 6": (
        dict(in_channels=48, out_channels=64, size=(7, 11), pads=(1, 0, 2, 1), bias=False), ()),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_winograd_conv_matches_onnxruntime(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c_winograd_conv, "MIN_MACS", 0)  # small shapes, every path of the kernel
    arguments, post_ops = CASES[case]
    actual, expected, calls = compiled_calls(conv3x3_model(**arguments))
    assert [winograd_rejection(call) for call in calls] == [None]
    assert _streamed(calls[0]) == case.startswith("streamed")
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


def test_large_filters_take_the_streamed_schedule() -> None:
    # 2 MiB of transformed filters: past a core's L2, each read once per run (the blocked schedule refused them)
    actual, expected, calls = compiled_calls(conv3x3_model(in_channels=256, out_channels=128, size=(28, 28)))
    assert [winograd_rejection(call) for call in calls] == [None]
    assert _streamed(calls[0])
    assert_close(actual, expected)
    _, _, calls = compiled_calls(conv3x3_model(in_channels=128, out_channels=48, size=(36, 36)))
    assert [(winograd_rejection(call), _streamed(call)) for call in calls] == [(None, False)]  # blocked: 384 KiB


@pytest.mark.parametrize(("arguments", "reason"), [
    (dict(in_channels=256, out_channels=144, size=(28, 28)), "takes output channels in multiples of 64"),
    (dict(in_channels=512, out_channels=512, size=(8, 8)), "needs 16 tiles to read its filters once for all, this "
                                                            "map has 9"),
])  # fmt: skip
def test_large_filters_the_streamed_schedule_cannot_take_stay_with_onednn(arguments: dict[str, Any],
                                                                           reason: str) -> None:  # fmt: skip
    actual, expected, calls = compiled_calls(conv3x3_model(**arguments))
    transformed = 16 * arguments["in_channels"] * arguments["out_channels"] * 4
    assert [winograd_rejection(call) for call in calls] == [
        f"its transformed filters ({transformed >> 10} KiB) outgrow the L2 every block of tiles reads them from, "
        f"and the streamed schedule {reason}"]
    assert_close(actual, expected)


def _assert_same_non_finite(actual: np.ndarray, expected: np.ndarray) -> None:
    """NaN exactly where onnxruntime has NaN, each infinity where it has that infinity, the rest close."""
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    infinite = np.isinf(expected)
    np.testing.assert_array_equal(actual[infinite], expected[infinite])
    finite = np.isfinite(expected)
    assert np.isfinite(actual[finite]).all()
    if finite.any():
        np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-4,
                                   atol=1e-5 * float(np.abs(expected[finite]).max()))  # fmt: skip


@pytest.mark.parametrize("out_channels", [48, 64])  # the blocked and the streamed schedule
@pytest.mark.parametrize("weights", ["finite", "an infinite weight"])
def test_pixels_and_weights_that_are_not_finite_give_onnxruntimes_direct_sum(
        out_channels: int, weights: str, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # the conv alone, its input a graph input: an infinity in one channel enters each output through one tap,
    # so the direct sum keeps it infinite where Winograd's transforms would subtract it from itself (NaN)
    monkeypatch.setattr(c_winograd_conv, "MIN_MACS", 0)
    w = random_array((out_channels, 16, 3, 3), seed=1) * 0.1
    if weights != "finite":  # a corner tap of output channel 5: NaN where it meets an infinity of the other sign's
        w[5, 3, 0, 0] = np.inf  # ... product, finite where the tap lies in the padding (onnxruntime skips those)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], "winograd_non_finite",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 16, 11, 14))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(random_array((out_channels,), seed=2), "b")])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                                                ir_version=8))  # fmt: skip
    x = random_array((2, 16, 11, 14), seed=3)
    # at a tile's corner, on the border, inside (each tile-local row and column), in the second image
    x[0, 0, 0, 0], x[0, 2, 5, 6], x[0, 7, 10, 13], x[1, 4, 4, 9] = np.nan, np.inf, -np.inf, np.inf
    x[1, 9, 7, 2], x[1, 11, 2, 11] = -np.inf, np.inf
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout="channels-last", rewrite=True)
    calls = [describe_library_call(k) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
             if b.name == "winograd_conv"]  # fmt: skip
    assert len(calls) == 1 and _streamed(calls[0]) == (out_channels == 64)
    actual, expected = compiled.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"]
    assert np.isinf(expected).sum() > 10  # the case the transforms get wrong is there
    _assert_same_non_finite(actual, expected)


def test_small_convs_stay_with_onednn() -> None:
    _, _, calls = compiled_calls(conv3x3_model(in_channels=16, out_channels=16, size=(8, 9), pads=(1, 1, 1, 1)))
    assert [winograd_rejection(call) for call in calls] == ["too small for the transforms to pay"]


@pytest.mark.parametrize("case", ["padded, odd output, batch 2, a residual",
                                  "streamed: padded, odd output, batch 2, a residual"])
@pytest.mark.parametrize("isa", [("-mavx2", "-mfma"), ("-mavx512f",)])
def test_the_same_source_compiles_for_avx2_and_avx512(case: str, isa: tuple[str, ...], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(c_winograd_conv, "MIN_MACS", 0)
    arguments, _ = CASES[case]
    _, _, calls = compiled_calls(conv3x3_model(**arguments))
    assert _streamed(calls[0]) == case.startswith("streamed")
    assert_compiles_for(isa, calls[0], tmp_path)


def conv3x3x3_model(in_channels: int, out_channels: int, size: tuple[int, int, int], batch: int = 1,
                    pads: tuple[int, ...] = (1, 1, 1, 1, 1, 1), epilogue: str = "none", depth: int = 3,
                    strides: tuple[int, int, int] = (1, 1, 1)) -> onnx.ModelProto:  # fmt: skip
    """x → 1x1x1 Conv → Relu → a (depth)x3x3 Conv with bias → epilogue → 1x1x1 Conv, as r3d_18's blocks."""
    initializers = [
        numpy_helper.from_array(random_array((out_channels, in_channels, depth, 3, 3), seed=1) * 0.1, "w"),
        numpy_helper.from_array(random_array((in_channels, in_channels, 1, 1, 1), seed=4) * 0.3, "w0"),
        numpy_helper.from_array(random_array((4, out_channels, 1, 1, 1), seed=5) * 0.3, "w1"),
        numpy_helper.from_array(random_array((out_channels,), seed=2), "b"),
    ]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w0"], ["x0"]), helper.make_node("Relu", ["x0"], ["r"]),
             helper.make_node("Conv", ["r", "w", "b"], ["c"], pads=list(pads), strides=list(strides)),
             *EPILOGUES[epilogue], helper.make_node("Conv", ["e", "w1"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "winograd_frames",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, in_channels, *size))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def _compiled_3d(model: onnx.ModelProto, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[Any]]:
    """(kernorch's output, onnxruntime's, the library calls that are not the 1x1x1 convs around the tested one)."""
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout="channels-last", rewrite=True)
    calls = [describe_library_call(k) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
             if b.stateful]  # fmt: skip
    tested = [call for call in calls if call.op == "convolution" and call.weights.dims[2:] != (1, 1, 1)]
    return compiled.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"], tested


FRAME_CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {  # arguments, the post-ops the call applies
    "r3d's 3x3x3: padded, batch 2, a residual": (
        dict(in_channels=64, out_channels=64, size=(4, 9, 13), batch=2, epilogue="residual"), ("add",)),
    "unpadded over frames, fewer input channels, hardswish": (
        dict(in_channels=32, out_channels=64, size=(5, 8, 7), pads=(0, 1, 1, 0, 1, 1), epilogue="hardswish"),
        ("hardswish",)),
    "both frame pads before the first frame, asymmetric spatial pads": (
        dict(in_channels=16, out_channels=64, size=(3, 7, 11), pads=(2, 1, 0, 0, 2, 1)), ()),
    "a kernel two frames deep, batch 3": (
        dict(in_channels=16, out_channels=128, size=(4, 6, 6), batch=3, pads=(1, 1, 1, 0, 1, 1), depth=2), ()),
    "one frame deep (1x3x3): V's tiles are the output's, batch 2, a residual": (
        dict(in_channels=64, out_channels=64, size=(3, 8, 9), batch=2, pads=(0, 1, 1, 0, 1, 1), depth=1,
             epilogue="residual"), ("add",)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FRAME_CASES))
def test_3d_convolutions_run_over_frames_and_match_onnxruntime(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c_winograd_conv, "MIN_MACS", 0)
    arguments, post_ops = FRAME_CASES[case]
    model = conv3x3x3_model(**arguments)
    x = random_array((arguments.get("batch", 1), arguments["in_channels"], *arguments["size"]), seed=3)
    actual, expected, calls = _compiled_3d(model, x)
    assert [winograd_rejection(call) for call in calls] == [None]
    assert _streamed(calls[0])
    assert tuple(op.alg for op, _ in calls[0].post_ops) == post_ops
    assert_close(actual, expected)


def test_3d_convolutions_strided_over_frames_stay_with_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c_winograd_conv, "MIN_MACS", 0)
    model = conv3x3x3_model(in_channels=16, out_channels=64, size=(6, 8, 8), strides=(2, 1, 1))
    actual, expected, calls = _compiled_3d(model, random_array((1, 16, 6, 8, 8), seed=3))
    assert [winograd_rejection(call) for call in calls] == ["strided or dilated over frames"]
    assert_close(actual, expected)


@pytest.mark.parametrize("weights", ["finite", "an infinite weight"])
def test_3d_pixels_and_weights_that_are_not_finite_give_onnxruntimes_direct_sum(
        weights: str, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # an infinity enters an output through one tap of one frame: the direct sum over the frame taps keeps it
    monkeypatch.setattr(c_winograd_conv, "MIN_MACS", 0)
    w = random_array((64, 16, 3, 3, 3), seed=1) * 0.1
    if weights != "finite":
        w[5, 3, 2, 0, 0] = np.inf  # the last frame tap's corner: in the padding for the last frame
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1, 1, 1])], "winograd_frames_non_finite",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 16, 4, 7, 9))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(random_array((64,), seed=2), "b")])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                                                ir_version=8))  # fmt: skip
    x = random_array((2, 16, 4, 7, 9), seed=3)
    # the first and last frames, a tile's corner, the border, the second image
    x[0, 0, 0, 0, 0], x[0, 2, 3, 5, 6], x[0, 7, 1, 6, 8], x[1, 4, 2, 4, 1] = np.nan, np.inf, -np.inf, np.inf
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout="channels-last", rewrite=True)
    calls = [describe_library_call(k) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
             if b.name == "winograd_conv"]  # fmt: skip
    assert len(calls) == 1 and _streamed(calls[0])
    actual, expected = compiled.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"]
    assert np.isinf(expected).sum() > 10
    _assert_same_non_finite(actual, expected)


def _strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    """Channels-last element strides of [n, c, d, y, x] dims."""
    n, c, d, y, x = dims
    return (d * y * x * c, 1, y * x * c, x * c, c)


@pytest.mark.parametrize(("operand", "merged"), [
    ((2, 64, 4, 6, 6), ((8, 64, 6, 6), (6 * 6 * 64, 1, 6 * 64, 64))),  # per image and frame: one frame axis
    ((1, 64, 1, 1, 1), ((1, 64, 1, 1), (0, 1, 64, 64))),  # per channel: the same for every frame
    ((2, 64, 1, 6, 6), None),  # per image, the same for its frames: no one frame axis indexes it
    ((1, 64, 4, 6, 6), None),  # per frame, the same for both images
])  # fmt: skip
def test_frames_merge_only_where_one_frame_axis_indexes_every_operand(
        operand: tuple[int, ...], merged: tuple[tuple[int, ...], tuple[int, ...]] | None) -> None:  # fmt: skip
    def tensor(slot: int, dims: tuple[int, ...]) -> Tensor:
        return Tensor(slot, dims, _strides(dims) if dims[2] > 1 or dims[0] > 1 else (64, 1, 64, 64 * dims[4], 64))

    call = LibraryCall("convolution", tensor(0, (2, 32, 4, 6, 6)), Tensor(1, (64, 32, 3, 3, 3), (864, 27, 9, 3, 1)),
                       None, tensor(3, (2, 64, 4, 6, 6)), strides=(1, 1, 1), dilates=(0, 0, 0), pad_begin=(1, 1, 1),
                       pad_end=(1, 1, 1), post_ops=((Binary("add", "t"), tensor(2, operand)),))  # fmt: skip
    flat = planar(call)
    if merged is None:
        assert flat == "its frames are not one axis in memory"
        return
    assert not isinstance(flat, str)
    planar_call, frames = flat
    (_, merged_operand), = planar_call.post_ops
    assert merged_operand is not None and (merged_operand.dims, merged_operand.strides) == merged
    assert planar_call.src.dims == (8, 32, 6, 6) and planar_call.dst.dims == (8, 64, 6, 6)
    assert (frames.images, frames.depth, frames.out_depth, frames.taps, frames.pad) == (2, 4, 4, 3, 1)


def test_exact_float32_sums_take_no_winograd_transform_nor_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3x3 integer convolution in float32 would suit Winograd's kernel, whose transforms round; it runs on a
    direct one. And the precision stage never offers it bfloat16."""
    from kernorch import machine
    from kernorch.fission import fission
    from kernorch.frontend import import_model
    from kernorch.precision.stage import candidate_for_bf16
    from kernorch.runtime import run_reference
    from kernorch.testing import integer_extremes, single_op_model

    monkeypatch.setattr(machine, "int8_dot_products", lambda: False)
    monkeypatch.setattr(c_winograd_conv, "MIN_MACS", 0)
    rng = np.random.default_rng(5)
    x, w = integer_extremes(rng, np.uint8, (1, 16, 8, 8)), integer_extremes(rng, np.int8, (16, 16, 3, 3))
    model = single_op_model("ConvInteger", {"x": x}, dict(pads=[1, 1, 1, 1]), {"w": w, "zx": np.asarray(np.uint8(3))},
                            input_order=["x", "w", "zx"])  # fmt: skip
    graph = fission(import_model(model))
    (conv,) = [n for n in graph.nodes if n.prim == "conv"]
    assert conv.attr("exact_sums") and not candidate_for_bf16(graph, conv)
    compiled = cpu_compile(model, cost="analytic", layout="channels-last")
    assert "winograd_conv" not in [b.name for b in compiled.executor.backends]
    np.testing.assert_array_equal(compiled.run({"x": x})["out0"], run_reference(graph, {"x": x})["out0"])


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("Winograd takes a convolution whose float32 sums must stay exact",
         "    if call.exact_sums:\n        return", "    if False:\n        return",
         file="kernorch/codegen/native/winograd_conv.py"),
    here("Winograd's in-register epilogue stores the vector without its post-ops",
         'sizeof v);", *vector,',
         'sizeof v);",',
         file="kernorch/codegen/native/winograd_conv.py"),
    here("the blocked Winograd schedule takes transformed filters past a core's L2 (5x slower on 7x7 maps)",
         "MAX_TRANSFORMED_BYTES = 1 << 20",
         "MAX_TRANSFORMED_BYTES = 1 << 30"),
    here("the streamed Winograd schedule takes any number of output channels",
         "if out_channels % STREAMED_CHANNELS:",
         "if False:"),
    here("a streamed Winograd tile reading NaN or an infinity keeps its transforms",
         '_tile_outputs(w, call, frames, "tile", tiles, "bad")',
         '_tile_outputs(w, call, frames, "tile", tiles, "0")'),
    here("a Winograd tile over frames flags only what its first frame tap reads",
         "ft++) bad |= s->bad[row + (long)ft * {frame_tiles}];",
         "ft++) bad |= s->bad[row];"),
    here("the transformed input frames start at the image's first, not after its padding frames",
         "v_row(frames.depth, frames.pad)",
         "v_row(frames.depth, 0)"),
    here("an operand per image, the same for its frames, is indexed by the frame (Winograd over frames)",
         "elif n != images or d != depth:",
         "elif False:"),
    here("the direct sum over frames skips the padding's zeros (onnxruntime's 3-d conv multiplies them)",
         "w.strides[2], True)",
         "w.strides[2], False)"),
    here("a blocked Winograd tile reading NaN or an infinity keeps its transforms",
         '_tile_outputs(w, call, frames, "t", TILES, "bad[t]")',
         '_tile_outputs(w, call, frames, "t", TILES, "0")'),
    here("Winograd ignores an infinite weight",
         '"if (z != z) s->weights_bad = 1;")',
         '"(void)z;")'),
    here("the streamed Winograd products read the panel of the wrong block",
         "const float *ue = s->u + (long)item * ",
         "const float *ue = s->u + (long)e * "),
]  # fmt: skip
