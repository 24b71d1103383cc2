"""A convolution's geometry as oneDNN takes it: dilations (oneDNN counts the gaps, ONNX the step), strides and
asymmetric pads, in both layouts, run by oneDNN itself (enough output channels that no kernel of kernorch's own
takes it) and compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.backends import ONEDNN
from kernorch.testing import cpu_compile, random_array
from kernorch.tools.check import run_onnxruntime


def _conv(dilations: tuple[int, int], strides: tuple[int, int], pads: tuple[int, int, int, int]) -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], dilations=list(dilations), strides=list(strides),
                              pads=list(pads))]  # fmt: skip
    initializers = [numpy_helper.from_array(random_array((24, 16, 3, 3), seed=1) * 0.2, "w"),
                    numpy_helper.from_array(random_array((24,), seed=2), "b")]  # fmt: skip
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 16, 13, 17))]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "dilated", inputs, outputs, initializers)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
@pytest.mark.parametrize(("dilations", "strides", "pads"),
                         [((2, 3), (1, 1), (2, 3, 2, 3)), ((2, 1), (2, 3), (1, 0, 2, 1))])
def test_a_dilated_conv_in_onednn_matches_onnxruntime(
        dilations: tuple[int, int], strides: tuple[int, int], pads: tuple[int, int, int, int], layout: str) -> None:
    model = _conv(dilations, strides, pads)
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout=layout, rewrite=False)
    assert ONEDNN in compiled.executor.backends, compiled.executor.backends
    x = random_array((1, 16, 13, 17), seed=3)
    expected = run_onnxruntime(model, {"x": x})["y"]
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=1e-4, atol=1e-4)
