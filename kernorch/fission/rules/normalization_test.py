"""Softmax and normalization rules: primitives emitted and equality with onnxruntime."""

from __future__ import annotations

import numpy as np

from kernorch.testing import fission_and_compare, primitive_names, random_array, single_op_model

X = random_array((2, 4, 6, 5))
C = 4


def test_softmax_is_stable_and_on_axis() -> None:
    big = X * 1000  # would overflow exp() without subtracting the row max
    graph = fission_and_compare(single_op_model("Softmax", {"x": big}, {"axis": 1}), {"x": big})
    assert primitive_names(graph) == ["reduce_max", "sub", "exp", "reduce_sum", "div"]
    assert graph.nodes[0].attr("axes") == (1,)


def test_softmax_opset11_coerces_to_2d() -> None:
    graph = fission_and_compare(single_op_model("Softmax", {"x": X}, {"axis": 2}, opset=11), {"x": X})
    assert graph.nodes[0].attr("axes") == (2, 3)


def test_log_softmax() -> None:
    graph = fission_and_compare(single_op_model("LogSoftmax", {"x": X}, {"axis": -1}), {"x": X})
    assert primitive_names(graph) == ["reduce_max", "sub", "exp", "reduce_sum", "log", "sub"]


def test_layer_normalization() -> None:
    scale, bias = random_array((6, 5), seed=1), random_array((6, 5), seed=2)
    model = single_op_model("LayerNormalization", {"x": X}, {"axis": -2, "epsilon": 1e-3},
                            {"scale": scale, "bias": bias})  # fmt: skip
    graph = fission_and_compare(model, {"x": X})
    assert primitive_names(graph) == ["reduce_sum", "div", "sub", "mul", "reduce_sum", "div", "add", "sqrt",
                                      "reciprocal", "mul", "mul", "add"]  # fmt: skip
    assert graph.nodes[0].attr("axes") == (2, 3)


def test_instance_normalization() -> None:
    model = single_op_model("InstanceNormalization", {"x": X}, {"epsilon": 1e-4},
                            {"s": random_array((C,), seed=1), "b": random_array((C,), seed=2)})  # fmt: skip
    graph = fission_and_compare(model, {"x": X}, rtol=1e-4, atol=1e-5)
    assert primitive_names(graph).count("reduce_sum") == 2
    assert graph.nodes[0].attr("axes") == (2, 3)


def test_group_normalization() -> None:
    model = single_op_model("GroupNormalization", {"x": X}, {"num_groups": 2, "epsilon": 1e-5},
                            {"s": random_array((C,), seed=1), "b": random_array((C,), seed=2)}, opset=21)  # fmt: skip
    graph = fission_and_compare(model, {"x": X}, rtol=1e-4, atol=1e-5)
    assert primitive_names(graph)[0] == "reshape"
    assert graph.nodes[1].attr("axes") == (2,)


def test_batch_normalization_folds_statistics() -> None:
    stats = {"s": random_array((C,), seed=1), "b": random_array((C,), seed=2), "m": random_array((C,), seed=3),
             "v": np.abs(random_array((C,), seed=4)) + 0.5}  # fmt: skip
    graph = fission_and_compare(single_op_model("BatchNormalization", {"x": X}, {"epsilon": 1e-3}, stats), {"x": X})
    # scale / sqrt(var + eps) is computed at compile time: only three elementwise primitives remain.
    assert primitive_names(graph) == ["sub", "mul", "add"]


def test_lp_normalization() -> None:
    for p, norm in ((1, ["abs", "reduce_sum"]), (2, ["mul", "reduce_sum", "sqrt"])):
        graph = fission_and_compare(single_op_model("LpNormalization", {"x": X}, {"axis": 1, "p": p}), {"x": X})
        assert primitive_names(graph) == [*norm, "equal", "where", "div"]
        assert graph.nodes[1].attr("axes") == (1,)
    # a zero vector stays zero (not 0/0)
    zeros = np.zeros((2, 3), np.float32)
    from kernorch.fission import fission
    from kernorch.frontend import import_model
    from kernorch.runtime import run_reference

    graph = fission(import_model(single_op_model("LpNormalization", {"x": zeros}, {"axis": 1})))
    assert not run_reference(graph, {"x": zeros})["out0"].any()


def test_rms_normalization_matches_the_onnx_reference() -> None:
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    from kernorch.fission import fission
    from kernorch.frontend import import_model
    from kernorch.runtime import run_reference

    scale = random_array((6, 5), seed=1)
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=-2, epsilon=1e-3)
    graph_proto = helper.make_graph(
        [node], "rms", [helper.make_tensor_value_info("x", 1, X.shape)],
        [helper.make_tensor_value_info("y", 1, X.shape)],
        [helper.make_tensor("scale", 1, scale.shape, scale.reshape(-1).tolist())])  # fmt: skip
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    graph = fission(import_model(model))
    assert primitive_names(graph) == ["mul", "reduce_sum", "div", "add", "sqrt", "reciprocal", "mul", "mul"]
    assert graph.nodes[1].attr("axes") == (2, 3)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": X})
    expected = np.asarray(expected)
    np.testing.assert_allclose(run_reference(graph, {"x": X})["y"], expected, rtol=1e-5, atol=1e-6)
