"""The oneDNN probe (onednn.py: reference_rejection): it names the implementation oneDNN picks, declines the calls
only its reference matmul takes, and a plan then keeps such a post-op out of the call — same result, without the
reference matmul's 100-10000x slowdown."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.library import describe_library_call
from kernorch.codegen.library.call import LibraryCall, Tensor
from kernorch.codegen.library.epilogue import Binary
from kernorch.codegen.library.onednn import (
    library_implementation,
    onednn_probe_available,
    reference_rejection,
    repacked_weights,
)
from kernorch.devtools.mutate import here
from kernorch.ir.strided import row_major
from kernorch.machine import bf16_supported
from kernorch.testing import cpu_compile, random_array
from kernorch.tools.check import BF16_RTOL, DEFAULT_RTOL, compare, run_onnxruntime

pytestmark = pytest.mark.skipif(not onednn_probe_available(), reason="oneDNN is not installed")


def _tensor(dims: tuple[int, ...], constant: bool = False) -> Tensor:
    return Tensor(0, dims, row_major(dims), constant)


def _call(src: tuple[int, ...], weights: tuple[int, ...], operand: tuple[int, ...],
          constant: bool = False) -> LibraryCall:  # fmt: skip
    dst = (*src[:-1], weights[-1])
    return LibraryCall("matmul", _tensor(src), _tensor(weights, constant), None, _tensor(dst),
                       post_ops=((Binary("add", "x"), _tensor(operand)),))  # fmt: skip


def test_the_probe_names_the_implementation_and_declines_the_reference_one() -> None:
    # swin's window scores [windows, heads, 49, 49] plus a relative-position bias shared by the windows: ref:any
    windows = _call((4, 12, 49, 32), (4, 12, 32, 49), (1, 12, 49, 49))
    assert (library_implementation(windows) or "").startswith("ref")
    assert "reference implementation" in (reference_rejection(windows) or "")
    # a value per row on one 3-D product (what rows_merged makes of a per-row post-op): brgemm
    per_row = _call((1, 197, 192), (1, 192, 576), (1, 197, 1), constant=True)
    assert not (library_implementation(per_row) or "ref").startswith("ref")
    assert reference_rejection(per_row) is None


def _window_scores(windows: int = 16, heads: int = 4, tokens: int = 49, head_dim: int = 32) -> onnx.ModelProto:
    """q·kᵀ per window and head plus a [1, heads, T, T] bias shared by the windows (swin's attention scores)."""
    shape = (windows, heads, tokens, head_dim)
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Add", ["s", "bias"], ["y"])]  # fmt: skip
    bias = numpy_helper.from_array(random_array((1, heads, tokens, tokens), seed=9), "bias")
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qk"]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "window_scores", inputs, outputs, [bias])
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.serial  # a wall-clock bound on one call: alone, not beside the parallel test workers
def test_a_plan_keeps_the_bias_out_of_the_reference_matmul() -> None:
    model = _window_scores()
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=False)
    calls = [describe_library_call(k) for k in compiled.kernels if any(n.prim == "matmul" for n in k.primitives)]
    assert calls and all(reference_rejection(call) is None for call in calls)
    feeds = {"q": random_array((16, 4, 49, 32), seed=1), "k": random_array((16, 4, 49, 32), seed=2)}
    expected = run_onnxruntime(model, feeds)["y"]
    compiled.run(feeds)
    fastest = float("inf")
    for _ in range(3):  # the fastest of three: a call the VM stalls once is no failure, the reference's every one is
        started = time.perf_counter()
        actual = compiled.run(feeds)["y"]
        fastest = min(fastest, time.perf_counter() - started)
    assert fastest < 0.02  # by the reference matmul: 0.106 s here (plan ~0.2 ms)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


def _conv_call(strides: tuple[int, ...], post_op: bool) -> LibraryCall:
    src, dst = _tensor((1, 512, 8, 8)), _tensor((1, 128, 8, 8))
    if strides == (1, 0, 0, 0):  # channels-last
        src = Tensor(0, (1, 512, 8, 8), (32768, 1, 4096, 512), False)
        dst = Tensor(0, (1, 128, 8, 8), (8192, 1, 1024, 128), False)
    operand = Tensor(0, dst.dims, dst.strides, False)
    return LibraryCall("convolution", src, _tensor((128, 512, 1, 1), constant=True), None, dst, (1, 1), (0, 0),
                       (0, 0), (0, 0), post_ops=((Binary("add", "x"), operand),) if post_op else ())  # fmt: skip


def test_the_probe_declines_a_plain_layout_convolution_with_a_tensor_operand() -> None:
    """poolformer's 1x1 conv + residual add in NCHW: oneDNN's reference conv (~250 ms a call in an analytic plan);
    the same call channels-last, or without the operand, has a jit kernel."""
    plain = _conv_call((), post_op=True)
    assert (library_implementation(plain) or "").startswith("ref")
    assert "convolution" in (reference_rejection(plain) or "")
    assert not (library_implementation(_conv_call((), post_op=False)) or "ref").startswith("ref")
    channels_last = _conv_call((1, 0, 0, 0), post_op=True)
    assert not (library_implementation(channels_last) or "ref").startswith("ref")
    assert reference_rejection(channels_last) is None


@pytest.mark.serial  # a wall-clock bound on one call: alone, not beside the parallel test workers
def test_a_plain_layout_plan_keeps_the_residual_out_of_the_reference_convolution() -> None:
    """The NCHW conv + add compiled with analytic costs: the add runs outside the call, the result matches
    onnxruntime, and a run takes milliseconds, not the reference conv's quarter second."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "r"], ["y"])]
    weights = numpy_helper.from_array(random_array((128, 512, 1, 1), seed=3), "w")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 512, 8, 8)),
              helper.make_tensor_value_info("r", TensorProto.FLOAT, (1, 128, 8, 8))]  # fmt: skip
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "conv_residual", inputs, outputs, [weights])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=False, layout="nchw")
    calls = [describe_library_call(k) for k in compiled.kernels if any(n.prim == "conv" for n in k.primitives)]
    assert calls and all(reference_rejection(call) is None for call in calls)
    assert not any(operand is not None for call in calls for _, operand in call.post_ops)  # the add: a kernel apart
    feeds = {"x": random_array((1, 512, 8, 8), seed=4), "r": random_array((1, 128, 8, 8), seed=5)}
    feeds["r"][0, 0, 0, :3] = np.array([np.nan, np.inf, -np.inf], dtype=np.float32)
    expected = run_onnxruntime(model, feeds)["y"]
    compiled.run(feeds)
    started = time.perf_counter()
    actual = compiled.run(feeds)["y"]
    assert time.perf_counter() - started < 0.05
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


def test_a_convolution_with_weights_known_only_at_run_time_is_packed_not_run_by_the_reference_kernel() -> None:
    """Plain weights made oneDNN 3.2 pick `ref:any` for a convolution (55 ms a call where packed weights take
    0.15 ms); weights not known when the plan is created are reordered into the chosen layout on every run."""
    for strides in ((), (1, 0, 0, 0)):
        call = _conv_call(strides, post_op=False)
        runtime = replace(call, weights=replace(call.weights, constant=False))
        assert repacked_weights(runtime) and not repacked_weights(call)
        assert not (library_implementation(runtime) or "ref").startswith("ref"), library_implementation(runtime)


def _conv_with_weights_input(op: str = "Conv") -> onnx.ModelProto:
    """x -> Conv(x, w) with w a graph input (a 3x3, padded, strided conv; or a ConvTranspose), then Relu."""
    nodes = [helper.make_node(op, ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 1]),
             helper.make_node("Relu", ["c"], ["y"])]  # fmt: skip
    weights = (48, 32, 3, 3) if op == "Conv" else (32, 48, 3, 3)  # ConvTranspose's are [in, out, ...]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 32, 12, 10)),
              helper.make_tensor_value_info("w", TensorProto.FLOAT, weights)]  # fmt: skip
    bias = numpy_helper.from_array(random_array((48,), seed=8), "b")
    graph = helper.make_graph(nodes, "conv_weights_input", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [bias])  # fmt: skip
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=pytest.mark.skipif(
    not bf16_supported(), reason="bf16 mode needs AVX512-BF16 or AMX"))])  # fmt: skip
@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_weights_known_only_at_run_time_are_repacked_on_every_run(layout: str, precision: str, op: str) -> None:
    """Two runs with different weights (the second with NaN and ±inf among them) each match onnxruntime: the
    repacking reorder reads the weights of its own run. The non-finite weights are centre taps, which read no
    padding: oneDNN's channels-last kernels skip a padded tap where onnxruntime multiplies an inf weight by the
    padding's zero (NaN) — a difference of oneDNN's convolutions whatever their weights."""
    model = _conv_with_weights_input(op)
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=False, layout=layout,
                           precision=precision)  # fmt: skip
    calls = [describe_library_call(k) for k in compiled.kernels
             if any(n.prim in ("conv", "conv_transpose") for n in k.primitives)]  # fmt: skip
    assert any(repacked_weights(call) for call in calls)
    tolerance = BF16_RTOL if precision == "bf16" else DEFAULT_RTOL
    for seed in (1, 2):
        feeds = {"x": random_array((2, 32, 12, 10), seed=seed),
                 "w": random_array(tuple(model.graph.input[1].type.tensor_type.shape.dim[i].dim_value
                                         for i in range(4)), seed=seed + 10)}  # fmt: skip
        if seed == 2 and op == "Conv":  # oneDNN's bf16 deconvolution multiplies the zeros it inserts between
            # the pixels (a NaN or inf weight: NaN all over its output channel, where onnxruntime has it on one row in
            # two): a difference of the deconvolution whatever its weights, left out here
            feeds["w"][0, 0, 1, 1], feeds["w"][1, 3, 1, 1], feeds["w"][2, 5, 1, 1] = np.nan, np.inf, -np.inf
        expected = run_onnxruntime(model, feeds)
        (error,) = compare(compiled.run(feeds), expected)  # the worst error over the largest |value|
        assert error.relative <= tolerance, (seed, error)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("oneDNN calls its reference matmul would run are kept",
         'if implementation is None or not implementation.startswith("ref"):',
         "if True:"),
    here("oneDNN repacks run-time convolution weights once, at create, not on every run",
         "continue\n            if i in per_run:", "continue\n            if i in per_run and i != 1:"),
    here("the oneDNN probe asks about matmuls only (a plain-layout conv with a residual goes to ref:any)",
         'if call.op not in ("matmul", "convolution") or \\\n',
         'if call.op not in ("matmul",) or \\\n'),
]  # fmt: skip
