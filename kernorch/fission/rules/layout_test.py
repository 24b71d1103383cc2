"""Layout rules: primitives emitted (static operands folded into attributes) and equality with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.testing import fission_and_compare, primitive_names, random_array, single_op_model

X = random_array((2, 3, 4, 5))


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


CASES = [
    ("Reshape", {}, {"shape": i64(0, -1, 5)}, ["reshape"]),
    ("Flatten", {"axis": 2}, {}, ["reshape"]),
    ("Squeeze", {}, {"axes": i64(0)}, None),  # needs a size-1 axis: covered below
    ("Unsqueeze", {}, {"axes": i64(0, -1)}, ["reshape"]),
    ("Transpose", {"perm": [0, 2, 3, 1]}, {}, ["transpose"]),
    ("Slice", {}, {"starts": i64(1, -1), "ends": i64(3, -100), "axes": i64(2, 3), "steps": i64(1, -2)}, ["slice"]),
    ("Pad", {"mode": "reflect"}, {"pads": i64(0, 0, 2, 1, 0, 0, 1, 3)}, ["pad"]),
    ("Pad", {"mode": "edge"}, {"pads": i64(0, 1, 2, 0, 0, 0, 1, 1)}, ["pad"]),
    ("Pad", {"mode": "constant"}, {"pads": i64(0, 0, -1, 2, 0, 0, 1, -2), "value": np.array(1.5, np.float32)},
     ["slice", "pad"]),
    ("Expand", {}, {"shape": i64(3, 1, 1, 1, 1)}, ["reshape", "expand"]),
    ("Tile", {}, {"repeats": i64(1, 2, 1, 3)}, ["reshape", "expand", "reshape"]),
    ("SpaceToDepth", {"blocksize": 2}, {}, None),
]


@pytest.mark.parametrize("op, attrs, constants, expected", [c for c in CASES if c[3]],
                         ids=[c[0] for c in CASES if c[3]])  # fmt: skip
def test_rule(op: str, attrs: dict, constants: dict, expected: list[str]) -> None:
    model = single_op_model(op, {"x": X}, attrs, constants)
    graph = fission_and_compare(model, {"x": X})
    assert primitive_names(graph) == expected


def test_squeeze_and_depth_to_space() -> None:
    x = random_array((1, 8, 2, 3))
    graph = fission_and_compare(single_op_model("Squeeze", {"x": x}, {}, {"axes": i64(0)}), {"x": x})
    assert primitive_names(graph) == ["reshape"]
    for mode in ("DCR", "CRD"):
        graph = fission_and_compare(single_op_model("DepthToSpace", {"x": x}, {"blocksize": 2, "mode": mode}), {"x": x})
        assert primitive_names(graph) == ["reshape", "transpose", "reshape"]


def test_concat_and_split() -> None:
    a, b = random_array((2, 3)), random_array((2, 5), seed=1)
    graph = fission_and_compare(single_op_model("Concat", {"a": a, "b": b}, {"axis": -1}), {"a": a, "b": b})
    assert primitive_names(graph) == ["concat"]
    model = single_op_model("Split", {"x": X}, {"axis": 3}, {"split": i64(2, 3)}, outputs=2)
    graph = fission_and_compare(model, {"x": X})
    assert primitive_names(graph) == ["split"]
    model = single_op_model("Split", {"x": X}, {"axis": 1, "num_outputs": 3}, outputs=3, opset=18)
    assert primitive_names(fission_and_compare(model, {"x": X})) == ["split"]


def test_gather_embedding_and_gather_elements() -> None:
    table = random_array((10, 4))
    ids = np.array([[0, 9, 3], [-1, 2, 2]], dtype=np.int64)
    model = single_op_model("Gather", {"ids": ids}, {"axis": 0}, {"table": table}, input_order=["table", "ids"])
    assert primitive_names(fission_and_compare(model, {"ids": ids})) == ["gather"]
    index = np.array([[0, 3], [2, 1]], dtype=np.int64)
    data = random_array((2, 4))
    model = single_op_model("GatherElements", {"data": data, "index": index}, {"axis": 1})
    assert primitive_names(fission_and_compare(model, {"data": data, "index": index})) == ["gather_elements"]


def test_shape_arithmetic_folds_away() -> None:
    """The Shape → Gather → Unsqueeze → Concat → Reshape chain PyTorch exports leaves one reshape."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT64, [], [0])),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Identity", ["flat"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "shape_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
         helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = random_array((2, 3, 4))
    fissioned = fission_and_compare(model, {"x": x})
    assert primitive_names(fissioned) == ["reshape"]
    assert fissioned.nodes[0].attr("shape") == (2, 12)
