"""The oneDNN probe (onednn.py: reference_rejection): it names the implementation oneDNN picks, declines the calls
only its reference matmul takes, and a plan then keeps such a post-op out of the call — same result, without the
reference matmul's 100-10000x slowdown."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.library import describe_library_call
from kernorch.codegen.library.call import LibraryCall, Tensor
from kernorch.codegen.library.epilogue import Binary
from kernorch.codegen.library.onednn import matmul_implementation, onednn_probe_available, reference_rejection
from kernorch.ir.strided import row_major
from kernorch.testing import cpu_compile, random_array
from kernorch.tools.check import run_onnxruntime

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
    assert (matmul_implementation(windows) or "").startswith("ref")
    assert "reference implementation" in (reference_rejection(windows) or "")
    # a value per row on one 3-D product (what rows_merged makes of a per-row post-op): brgemm
    per_row = _call((1, 197, 192), (1, 192, 576), (1, 197, 1), constant=True)
    assert not (matmul_implementation(per_row) or "ref").startswith("ref")
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


def test_a_plan_keeps_the_bias_out_of_the_reference_matmul() -> None:
    model = _window_scores()
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=False)
    calls = [describe_library_call(k) for k in compiled.kernels if any(n.prim == "matmul" for n in k.primitives)]
    assert calls and all(reference_rejection(call) is None for call in calls)
    feeds = {"q": random_array((16, 4, 49, 32), seed=1), "k": random_array((16, 4, 49, 32), seed=2)}
    expected = run_onnxruntime(model, feeds)["y"]
    compiled.run(feeds)
    started = time.perf_counter()
    actual = compiled.run(feeds)["y"]
    assert time.perf_counter() - started < 0.02  # by the reference matmul: 0.106 s here (plan ~0.2 ms)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)
