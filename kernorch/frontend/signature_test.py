"""Symbolic dims: reading them, binding concrete shapes to them, and the CLI's shape and bucket syntax."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from kernorch.devtools.mutate import here
from kernorch.errors import InputMismatch, ShapeError
from kernorch.frontend import bind, input_signature, parse_dim_buckets, parse_shape_sets, shapes_for


def _two_inputs() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "seq", 8]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 8, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_symbol_shared_by_two_inputs_must_have_one_size() -> None:
    signature = input_signature(_two_inputs())
    assert [s.dims for s in signature] == [("batch", "seq", 8), ("batch", 8, "b.2")]  # unnamed: its own symbol
    assert bind(signature, {"a": (2, 5, 8), "b": (2, 8, 3)}) == {"batch": 2, "seq": 5, "b.2": 3}
    with pytest.raises(InputMismatch, match="'batch' is 2 in one input and 3 in 'b'"):
        bind(signature, {"a": (2, 5, 8), "b": (3, 8, 3)})
    with pytest.raises(InputMismatch, match="size 9 on axis 2"):
        bind(signature, {"a": (2, 5, 9), "b": (2, 8, 3)})
    with pytest.raises(InputMismatch, match="missing input 'b'"):
        bind(signature, {"a": (2, 5, 8)})
    with pytest.raises(InputMismatch, match="empty axis"):
        bind(signature, {"a": (0, 5, 8), "b": (0, 8, 3)})
    assert shapes_for(signature, {"batch": 4, "seq": 1, "b.2": 2}) == (("a", (4, 1, 8)), ("b", (4, 8, 2)))


def test_shape_sets_and_buckets_from_the_command_line() -> None:
    assert parse_shape_sets(["a=1x8", "a=2x8", "m=1"]) == [{"a": (1, 8), "m": (1,)}, {"a": (2, 8), "m": (1,)}]
    with pytest.raises(ShapeError, match="gives 'a' 2 shapes"):
        parse_shape_sets(["a=1x8", "a=2x8", "m=1", "m=2", "m=3"])
    assert parse_dim_buckets(["batch=pow2:1..16", "seq=x64:1..200", "h=3,1,3"]) == {
        "batch": (1, 2, 4, 8, 16), "seq": (64, 128, 192), "h": (1, 3)}  # fmt: skip
    for bad in ("batch", "batch=pow3:1..4", "batch=0,1", "batch=x0:1..4", "batch=1,,2"):
        with pytest.raises(ShapeError, match="bad --dim"):
            parse_dim_buckets([bad])


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    # dynamic shapes: binding, saved specialisations, the padding proof and its use
    here("shapes: one symbol may take two sizes",
         "elif values.setdefault(dim, size) != size:",
         "elif False:"),
]  # fmt: skip
