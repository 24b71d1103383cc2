"""Resize rule: one resize primitive, equal to onnxruntime for the modes the shared models use and more."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.devtools.mutate import here
from kernorch.errors import UnsupportedOperator
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.testing import cpu_compile, fission_and_compare, primitive_names, random_array, single_op_model
from kernorch.tools.check import run_onnxruntime

X = random_array((1, 2, 5, 7))


@pytest.mark.parametrize(
    "attrs, scales",
    [
        ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, [1, 1, 2, 2]),
        ({"mode": "linear", "coordinate_transformation_mode": "half_pixel"}, [1, 1, 2.5, 1.5]),
        ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, [1, 1, 0.6, 3]),
        ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, [1, 1, 0.5, 1.3]),
        ({"mode": "cubic", "coordinate_transformation_mode": "half_pixel", "cubic_coeff_a": -0.5}, [1, 1, 2, 0.8]),
        ({"mode": "nearest"}, [1, 1, 0.6, 1.7]),
    ],
)
def test_resize(attrs: dict, scales: list[float]) -> None:
    constants = {"roi": np.zeros(0, np.float32), "scales": np.array(scales, np.float32)}
    model = single_op_model("Resize", {"x": X}, attrs, constants, input_order=["x", "roi", "scales"])
    graph = fission_and_compare(model, {"x": X}, rtol=1e-4, atol=1e-5)
    assert primitive_names(graph) == ["resize"]


def test_resize_sizes() -> None:
    constants = {"sizes": np.array([1, 2, 16, 3], np.int64)}
    model = single_op_model("Resize", {"x": X}, {"mode": "linear"}, constants, input_order=["x", "", "", "sizes"])
    assert primitive_names(fission_and_compare(model, {"x": X}, rtol=1e-4, atol=1e-5)) == ["resize"]


@pytest.mark.parametrize("antialias, mode, scales", [(0, "linear", [1, 1, 0.6, 1.7]), (0, "nearest", [1, 1, 0.6, 2]),
                                                     (1, "linear", [1, 1, 2, 1.5]), (1, "cubic", [1, 1, 1, 3])])
def test_antialias_where_it_changes_nothing(antialias: int, mode: str, scales: list[float]) -> None:
    constants = {"roi": np.zeros(0, np.float32), "scales": np.array(scales, np.float32)}
    model = single_op_model("Resize", {"x": X}, {"mode": mode, "antialias": antialias}, constants,
                            input_order=["x", "roi", "scales"], opset=18)  # fmt: skip
    assert primitive_names(fission_and_compare(model, {"x": X}, rtol=1e-4, atol=1e-5)) == ["resize"]


@pytest.mark.parametrize("mode, scales, why", [("linear", [1, 1, 0.5, 1], "antialiased linear downscaling"),
                                              ("cubic", [1, 1, 1, 0.9], "antialiased cubic downscaling"),
                                              ("nearest", [1, 1, 2, 2], "linear and cubic modes only")])
def test_antialias_where_it_matters_is_refused(mode: str, scales: list[float], why: str) -> None:
    constants = {"roi": np.zeros(0, np.float32), "scales": np.array(scales, np.float32)}
    model = single_op_model("Resize", {"x": X}, {"mode": mode, "antialias": 1}, constants,
                            input_order=["x", "roi", "scales"], opset=18)  # fmt: skip
    with pytest.raises(UnsupportedOperator, match=why):
        fission(import_model(model))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32])  # what onnxruntime resizes
def test_nearest_resize_moves_integers(dtype: type) -> None:
    info = np.iinfo(dtype)
    x: np.ndarray = np.random.default_rng(3).integers(info.min, info.max, (1, 3, 5, 7), endpoint=True).astype(dtype)
    constants = {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 1.5], np.float32)}
    model = single_op_model("Resize", {"x": x}, {"mode": "nearest"}, constants, input_order=["x", "roi", "scales"])
    graph = fission_and_compare(model, {"x": x}, rtol=0, atol=0)
    assert primitive_names(graph) == ["resize"]
    expected = run_onnxruntime(model, {"x": x})["out0"]
    np.testing.assert_array_equal(cpu_compile(model, cost="analytic").run({"x": x})["out0"], expected)


def test_interpolating_an_integer_resize_is_refused() -> None:
    x = np.zeros((1, 1, 2, 2), np.uint8)
    constants = {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32)}
    model = single_op_model("Resize", {"x": x}, {"mode": "linear"}, constants, input_order=["x", "roi", "scales"])
    with pytest.raises(UnsupportedOperator, match="nearest mode only"):
        fission(import_model(model))


@pytest.mark.parametrize("mode, opset", [("nearest", 9), ("linear", 9), ("nearest", 7)])
def test_upsample_is_an_asymmetric_resize(mode: str, opset: int) -> None:
    scales = [1.0, 1.0, 2.0, 3.0]
    if opset == 7:
        model = single_op_model("Upsample", {"x": X}, {"mode": mode, "scales": scales}, opset=opset)
    else:
        model = single_op_model("Upsample", {"x": X}, {"mode": mode}, {"scales": np.array(scales, np.float32)},
                                opset=opset)  # fmt: skip
    graph = fission_and_compare(model, {"x": X}, rtol=1e-4, atol=1e-5)
    assert primitive_names(graph) == ["resize"]
    assert graph.nodes[0].attr("coordinate_mode") == "asymmetric" and graph.nodes[0].attr("sizes") == (1, 2, 10, 21)


MUTANTS = [
    here("antialiased downscaling accepted as plain interpolation",
         "if antialias and any(scale < 1 for scale in scales):",
         "if antialias and any(scale < 0 for scale in scales):"),
]
