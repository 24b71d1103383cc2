"""The direct few-output-channel convolution (native/direct_conv.py): chosen exactly where it applies, and equal to
onnxruntime across strides, dilations, batch, bias, odd widths (the one-pixel tail) and output layouts."""

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

from kernorch.codegen.library.call import describe_library_call
from kernorch.codegen.library.epilogue import Eltwise
from kernorch.codegen.native.direct_conv import direct_conv_rejection
from kernorch.devtools.mutate import here
from kernorch.testing import cpu_compile, random_array
from kernorch.testing.native import assert_close, assert_compiles_for, small_relu_1x1_kernel
from kernorch.tools.check import run_onnxruntime

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`


def conv_model(in_channels: int, out_channels: int, kernel: int, size: tuple[int, int], batch: int = 1,
               strides: tuple[int, int] = (1, 1), dilations: tuple[int, int] = (1, 1), bias: bool = True,
               pads: tuple[int, int, int, int] = (0, 0, 0, 0)) -> onnx.ModelProto:  # fmt: skip
    """x → 1x1 Conv → Relu → Conv: the first conv gives the tested one a channels-last producer."""
    w = random_array((out_channels, in_channels, kernel, kernel), seed=1) * 0.2
    initializers = [numpy_helper.from_array(w, "w"),
                    numpy_helper.from_array(random_array((in_channels, in_channels, 1, 1), seed=4) * 0.3, "w0"),
                    numpy_helper.from_array(random_array((out_channels,), seed=2), "b")]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w0"], ["x0"]), helper.make_node("Relu", ["x0"], ["r"]),
             helper.make_node("Conv", ["r", "w", "b"] if bias else ["r", "w"], ["y"],
                              strides=list(strides), dilations=list(dilations), pads=list(pads))]  # fmt: skip
    graph = helper.make_graph(nodes, "direct_conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, in_channels, *size))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def compiled_library_calls(model: onnx.ModelProto, layout: str) -> tuple[np.ndarray, np.ndarray, list]:
    """(kernorch's output, onnxruntime's, the library calls after the first 1x1 conv)."""

    feeds = {"x": random_array(tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim), seed=3)}
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout=layout, rewrite=True)
    calls = [describe_library_call(k) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
             if b.stateful]  # fmt: skip
    assert calls[0].weights.dims[2:] == (1, 1), calls  # the producer conv
    return compiled.run(feeds)["y"], run_onnxruntime(model, feeds)["y"], calls[1:]


CASES: dict[str, dict[str, Any]] = {
    "candy's last conv, small": dict(in_channels=32, out_channels=3, kernel=9, size=(12, 21)),
    "one output channel": dict(in_channels=16, out_channels=1, kernel=3, size=(9, 19)),
    "four, strided": dict(in_channels=48, out_channels=4, kernel=3, size=(11, 17), strides=(2, 3)),
    "two, dilated, batch 2, no bias": dict(in_channels=16, out_channels=2, kernel=3, size=(10, 13), batch=2,
                                           dilations=(2, 3), bias=False),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_direct_conv_matches_onnxruntime(case: str) -> None:
    actual, expected, calls = compiled_library_calls(conv_model(**CASES[case]), "channels-last")
    assert [direct_conv_rejection(call) for call in calls] == [None]
    assert_close(actual, expected)


@pytest.mark.parametrize(("changes", "reason"), [
    (dict(out_channels=5), "5 output channels fill oneDNN's vectors"),
    (dict(in_channels=24), "input channels are not contiguous in multiples of 16"),
    (dict(pads=(1, 1, 1, 1)), "padded"),
])  # fmt: skip
def test_shapes_it_does_not_take_stay_with_onednn(changes: dict[str, Any], reason: str) -> None:
    arguments = dict(CASES["candy's last conv, small"]) | changes
    actual, expected, calls = compiled_library_calls(conv_model(**arguments), "channels-last")
    assert [direct_conv_rejection(call) for call in calls] == [reason]
    assert_close(actual, expected)


@pytest.mark.parametrize("layout", ["channels-last", "nchw"])
def test_weights_computed_at_run_time_go_to_onednn(layout: str) -> None:
    """The direct conv's shape with its weights a graph input: it packs weights once, when the plan is created,
    so it declines (it ran with whatever the buffer held then: errors of ~25 on outputs of ~10); two runs with
    different weights match onnxruntime."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Conv", ["r", "w"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 32, 12, 12)),
              helper.make_tensor_value_info("w", TensorProto.FLOAT, (4, 32, 3, 3))]  # fmt: skip
    graph = helper.make_graph(nodes, "runtime_weights", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                               None)])  # fmt: skip
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout=layout)
    calls = [(describe_library_call(k), b.name) for k, b in zip(compiled.kernels, compiled.executor.backends,
                                                                 strict=True) if b.stateful]  # fmt: skip
    assert [name for _, name in calls] == ["onednn"]
    if layout == "channels-last":  # what the direct conv takes, but for the weights
        assert direct_conv_rejection(calls[0][0]) is None and not calls[0][0].weights.constant
    for seed in (1, 2):
        feeds = {"x": random_array((1, 32, 12, 12), seed=seed), "w": random_array((4, 32, 3, 3), seed=seed + 5)}
        assert_close(compiled.run(feeds)["y"], run_onnxruntime(model, feeds)["y"])


def test_explain_names_the_direct_conv(tmp_path: Path) -> None:
    model = conv_model(**CASES["candy's last conv, small"])
    onnx.save(model, tmp_path / "m.onnx")
    command = [sys.executable, "-m", "kernorch.cli", "explain", str(tmp_path / "m.onnx"), "--cost", "analytic",
               "--layout", "channels-last"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    lines = [line for line in result.stdout.splitlines() if "library call:" in line]
    expected = [small_relu_1x1_kernel(), "direct C convolution (few output channels)"]
    assert [line.split(", by ")[-1] for line in lines] == expected, lines


def test_nchw_source_stays_with_onednn() -> None:
    actual, expected, calls = compiled_library_calls(conv_model(**CASES["candy's last conv, small"]), "nchw")
    assert_close(actual, expected)
    assert [direct_conv_rejection(call) for call in calls] == ["input channels are not contiguous in multiples of 16"]


def test_post_ops_stay_with_onednn() -> None:
    _, _, calls = compiled_library_calls(conv_model(**CASES["candy's last conv, small"]), "channels-last")
    relu = (Eltwise("relu", 0.0, 0.0), None)
    assert direct_conv_rejection(dataclasses.replace(calls[0], post_ops=(relu,))) == "post-ops run in oneDNN"


@pytest.mark.parametrize("isa", [("-mavx2", "-mfma"), ("-mavx512f",)])
def test_the_same_source_compiles_for_avx2_and_avx512(isa: tuple[str, ...], tmp_path: Path) -> None:
    _, _, calls = compiled_library_calls(conv_model(**CASES["candy's last conv, small"]), "channels-last")
    assert_compiles_for(isa, calls[0], tmp_path)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("kernorch's own kernels take weights computed at run time (packed once, at create)",
         "if not call.weights.constant and not self.runtime_weights:",
         "if False:",
         file="kernorch/codegen/backends/library_calls.py"),
    here("the direct conv's tail loop stops one pixel short of the row's end",
         'with w.block(f"for (; x0 < {out_w}; x0++)"):',
         'with w.block(f"for (; x0 < {out_w} - 1; x0++)"):'),
    here("the direct conv's reduction drops a vector lane",
         '"for (int l = 0; l < KO_VC_LANES; l++) sum += acc[i][o][l];",',
         '"for (int l = 1; l < KO_VC_LANES; l++) sum += acc[i][o][l];",'),
]  # fmt: skip
