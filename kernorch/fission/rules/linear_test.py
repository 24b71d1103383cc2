"""Linear rules: one linear primitive plus elementwise bias/scale, equal to onnxruntime."""

from __future__ import annotations

import pytest

from kernorch.testing import fission_and_compare, primitive_names, random_array, single_op_model


def test_matmul_batched_and_1d() -> None:
    a, b = random_array((2, 1, 4, 5)), random_array((3, 5, 6), seed=1)
    assert primitive_names(fission_and_compare(single_op_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b})) == [
        "matmul"
    ]
    v = random_array((5,), seed=2)
    fission_and_compare(single_op_model("MatMul", {"a": a, "v": v}), {"a": a, "v": v})


@pytest.mark.parametrize("trans_a, trans_b, alpha, beta", [(0, 1, 1.0, 1.0), (1, 0, 0.5, 2.0)])
def test_gemm(trans_a: int, trans_b: int, alpha: float, beta: float) -> None:
    a = random_array((5, 4) if trans_a else (4, 5))
    b = random_array((6, 5) if trans_b else (5, 6), seed=1)
    c = random_array((6,), seed=2)
    model = single_op_model("Gemm", {"a": a}, {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta},
                            {"b": b, "c": c})  # fmt: skip
    graph = fission_and_compare(model, {"a": a})
    # transposes of constant B fold away; transA of the input stays a layout primitive.
    expected = (["transpose"] if trans_a else []) + ["matmul"] + (["mul"] if alpha != 1 else []) + ["add"]
    assert primitive_names(graph) == expected


@pytest.mark.parametrize(
    "attrs",
    [
        {"pads": [1, 1, 1, 1]},
        {"strides": [2, 2], "pads": [0, 1, 2, 1], "dilations": [2, 1]},
        {"group": 4, "auto_pad": "SAME_UPPER"},  # depthwise
        {"group": 2, "strides": [2, 1], "auto_pad": "SAME_LOWER"},
    ],
)
def test_conv(attrs: dict) -> None:
    x = random_array((1, 4, 9, 8))
    in_per_group = 4 // attrs.get("group", 1)
    w, bias = random_array((4, in_per_group, 3, 3), seed=1), random_array((4,), seed=2)
    graph = fission_and_compare(single_op_model("Conv", {"x": x}, attrs, {"w": w, "b": bias}), {"x": x},
                                rtol=1e-4, atol=1e-5)  # fmt: skip
    assert primitive_names(graph) == ["conv", "add"]


@pytest.mark.parametrize(
    "attrs",
    [
        {"strides": [2, 2]},
        {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 1]},
        {"strides": [3, 2], "output_shape": [10, 8]},
        {"group": 2, "dilations": [2, 1]},
    ],
)
def test_conv_transpose(attrs: dict) -> None:
    x = random_array((1, 4, 3, 3))
    w = random_array((4, 3 if attrs.get("group", 1) == 1 else 2, 3, 3), seed=1)
    graph = fission_and_compare(single_op_model("ConvTranspose", {"x": x}, attrs, {"w": w}), {"x": x},
                                rtol=1e-4, atol=1e-5)  # fmt: skip
    assert primitive_names(graph)[0] == "conv_transpose"
