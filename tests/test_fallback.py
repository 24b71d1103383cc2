"""Nodes without a kernorch rule run through onnxruntime (with a warning), or are refused with --strict."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import kernorch
from kernorch.cli import main
from kernorch.devtools.mutate import here
from kernorch.errors import FallbackWarning, UnsupportedOperator
from kernorch.fission import fallback_nodes, fission
from kernorch.frontend import import_model


def _det_model() -> onnx.ModelProto:
    """relu → Det (no kernorch rule) → exp: the fallback sits between two fusable kernels."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Det", ["r"], ["d"], name="the_det"),
             helper.make_node("Exp", ["d"], ["y"])]  # fmt: skip
    return helper.make_model(helper.make_graph(nodes, "det", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_a_node_without_rule_runs_through_onnxruntime_and_matches(tmp_path: Path) -> None:
    model = _det_model()
    x = np.random.default_rng(0).standard_normal((3, 4, 4)).astype(np.float32)
    with pytest.warns(FallbackWarning, match=r"1 node\(s\) run through onnxruntime.*Det \(no fission rule"):
        compiled = kernorch.compile(model, cost="analytic")
    (node,) = fallback_nodes(compiled.graph)
    assert node.attr("op_type") == "Det" and node.origin == "the_det"
    (expected,) = _onnxruntime(model, {"x": x})
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=1e-5)
    # the plan saves and loads like any other (the node is data: base64 protobuf, typed)
    loaded = kernorch.load(compiled.save(tmp_path / "plan"))
    np.testing.assert_allclose(loaded.run({"x": x})["y"], expected, rtol=1e-5)


def test_a_fallback_node_runs_on_the_calling_thread_through_a_runner_prepared_at_load() -> None:
    """Each fallback node's session runs on the caller's thread (a pool of its own waits for the cores the plan's
    OpenMP workers spin on: 3x the whole model's time); the plan's executor calls the runner built at load."""
    from kernorch.ir import foreign

    with pytest.warns(FallbackWarning):
        compiled = kernorch.compile(_det_model(), cost="analytic")
    (node,) = fallback_nodes(compiled.graph)
    runner = foreign.prepare(node.attr_dict, [compiled.graph.types[v] for v in node.inputs])
    options = runner.session.get_session_options()
    assert options.intra_op_num_threads == 1 and options.inter_op_num_threads == 1
    x = np.abs(np.random.default_rng(1).standard_normal((3, 4, 4))).astype(np.float32)
    (expected,) = _onnxruntime(_det_model(), {"x": x})
    (det,) = runner([np.maximum(x, 0)])
    assert det.shape == (3,) and det.dtype == np.float32
    np.testing.assert_allclose(np.exp(det), expected, rtol=1e-5)
    assert foreign.prepare(node.attr_dict, [compiled.graph.types[v] for v in node.inputs]) is runner  # one per node


def test_a_static_qdq_model_is_planned_whole_and_equals_onnxruntime(tmp_path: Path) -> None:
    """onnxruntime's quantize_static (QDQ, per-channel int8 weights, int8 activations): every QuantizeLinear and
    DequantizeLinear fissions (fission/rules/quantize.py), nothing falls back, and the output equals onnxruntime's."""
    from onnx import numpy_helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np.float32), "w1"),
               numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.1).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r"], ["y"])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 12, 12))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 12, 12))], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "f.onnx")
    samples = [{"x": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)} for _ in range(3)]

    class Samples(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.left, None)

    quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Samples(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    model = onnx.load(tmp_path / "q.onnx")
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in model.graph.node}
    compiled = kernorch.compile(model, cost="analytic")
    assert not fallback_nodes(compiled.graph)
    x = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
    (expected,) = _onnxruntime(model, {"x": x})
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=1e-5, atol=1e-6)


def test_a_fallback_node_keeps_its_scalar_constants_scalar() -> None:
    """A conv, then a float16 QuantizeLinear/DequantizeLinear pair (no kernorch rule: the fallback) with scalar
    scales and zero points. The layout stage once stored every constant through np.ascontiguousarray, which makes a 0-d
    array 1-d: the fallback node, typed for scalars, refused its [1] scale and the plan died in a traceback."""
    from onnx import numpy_helper

    rng = np.random.default_rng(3)
    constants = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
                 numpy_helper.from_array(np.array(0.05, np.float16), "scale"),
                 numpy_helper.from_array(np.array(3, np.int8), "zero")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Cast", ["c"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("QuantizeLinear", ["h", "scale", "zero"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["d"]),
             helper.make_node("Cast", ["d"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "float16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 8, 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 4, 8, 8))], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.warns(FallbackWarning, match="QuantizeLinear"):
        compiled = kernorch.compile(model, cost="analytic")
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    (expected,) = _onnxruntime(model, {"x": x})
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=1e-5, atol=1e-6)


def test_reference_kernels_keep_a_scalar_a_scalar() -> None:
    from kernorch.ir.primitives import run_primitive

    scalar = np.array(2.5, np.float32)
    for prim, attrs in (("transpose", {"perm": ()}), ("expand", {"shape": ()})):
        (result,) = run_primitive(prim, [scalar], attrs)
        assert result.shape == () and result == 2.5, prim


def test_strict_refuses_the_node() -> None:
    with pytest.raises(UnsupportedOperator, match="Det node 'the_det': no fission rule"):
        kernorch.compile(_det_model(), cost="analytic", strict=True)


def test_cli_warns_in_one_line_and_strict_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "det.onnx"
    onnx.save(_det_model(), str(path))
    assert main(["check", str(path)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Det" in err[0]
    assert err[0].startswith("kernorch: warning: 1 node(s) run through onnxruntime")
    assert main(["check", str(path), "--strict"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kernorch: error: unsupported: Det node 'the_det': no fission rule for this operator"]


def test_an_attribute_a_rule_refuses_falls_back_too() -> None:
    """A rule's refusal (here Resize's antialiased downscaling, which kernorch's rule does not take) falls back
    too, with the rule's reason in the warning."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 0.5, 0.5])
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", antialias=1)
    model = helper.make_model(helper.make_graph([node], "r", [x], [y], [scales]),
                              opset_imports=[helper.make_opsetid("", 18)])  # fmt: skip
    graph = fission(import_model(model), strict=False)
    assert [n.prim for n in graph.nodes] == ["onnx_node"]
    data = np.random.default_rng(1).standard_normal((1, 1, 8, 8)).astype(np.float32)
    with pytest.warns(FallbackWarning, match="Resize.*antialias"):
        compiled = kernorch.compile(model, cost="analytic")
    np.testing.assert_allclose(compiled.run({"x": data})["y"], _onnxruntime(model, {"x": data})[0], rtol=1e-5)


@pytest.mark.parametrize("case", ["data-dependent shape", "subgraph", "unknown to onnxruntime"])
def test_what_cannot_run_alone_is_still_refused(case: str) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    opsets = [helper.make_opsetid("", 17)]
    if case == "data-dependent shape":
        y = helper.make_tensor_value_info("y", TensorProto.INT64, [1, "n"])
        node = helper.make_node("NonZero", ["x"], ["y"])
        expected = "data-dependent shape|not known before running"
    elif case == "subgraph":
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
        body = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [],
                                 [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])])  # fmt: skip
        node = helper.make_node("Loop", ["", ""], ["y"], body=body)
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
        expected = "subgraph attribute"
    else:
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
        node = helper.make_node("Frobnicate", ["x"], ["y"], domain="example.custom")
        opsets.append(helper.make_opsetid("example.custom", 1))
        expected = "no onnxruntime fallback"
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=opsets)
    with pytest.raises(UnsupportedOperator, match=expected):
        fission(import_model(model), strict=False)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_a_dynamically_quantized_lstm_runs_through_onnxruntime(direction: str, tmp_path: Path) -> None:
    """quantize_dynamic writes an LSTM as com.microsoft's DynamicQuantizeLSTM, which onnx's shape inference does not
    know: its outputs are typed as an LSTM's (Y, Y_h, Y_c for the direction count), and it runs through the
    fallback, equal to onnxruntime on one thread as the fallback runs it (onnxruntime's own runs of this node on one
    and on two threads differ by 1e-2)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(7)
    directions, hidden = (2 if direction == "bidirectional" else 1), 6
    weights = {"w": rng.standard_normal((directions, 4 * hidden, 5)), "r": rng.standard_normal((directions,
               4 * hidden, hidden)), "b": rng.standard_normal((directions, 8 * hidden))}  # fmt: skip
    node = helper.make_node("LSTM", ["x", "w", "r", "b"], ["y", "h", "c"], hidden_size=hidden, direction=direction)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [7, 3, 5])
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, directions, 3, hidden]),
               *(helper.make_tensor_value_info(v, TensorProto.FLOAT, [directions, 3, hidden]) for v in "hc")]
    model = helper.make_model(helper.make_graph([node], "lstm", [x], outputs, [
        onnx.numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]),
        opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    onnx.save(model, tmp_path / "float.onnx")
    quantize_dynamic(tmp_path / "float.onnx", tmp_path / "dynamic.onnx", weight_type=QuantType.QInt8)
    quantized = onnx.load(tmp_path / "dynamic.onnx")
    assert [n.op_type for n in quantized.graph.node] == ["DynamicQuantizeLSTM"]
    feeds = {"x": rng.standard_normal((7, 3, 5)).astype(np.float32)}
    with pytest.warns(FallbackWarning, match="DynamicQuantizeLSTM"):
        compiled = kernorch.compile(quantized, cost="analytic")
    state = (directions, 3, hidden)
    assert [compiled.graph.types[v].shape for v in ("y", "h", "c")] == [(7, directions, 3, hidden), state, state]
    one_thread = ort.SessionOptions()
    one_thread.intra_op_num_threads = 1
    session = ort.InferenceSession(quantized.SerializeToString(), one_thread, providers=["CPUExecutionProvider"])
    for got, expected in zip(compiled.run(feeds).values(), session.run(None, feeds), strict=True):
        np.testing.assert_array_equal(got, expected)
    # without Y: the states are typed by their own positions, not shifted into Y's
    del quantized.graph.output[0]
    quantized.graph.node[0].output[0] = ""
    with pytest.warns(FallbackWarning, match="DynamicQuantizeLSTM"):
        states = kernorch.compile(quantized, cost="analytic")
    assert [states.graph.types[v].shape for v in ("h", "c")] == [state, state]
    session = ort.InferenceSession(quantized.SerializeToString(), one_thread, providers=["CPUExecutionProvider"])
    for got, expected in zip(states.run(feeds).values(), session.run(None, feeds), strict=True):
        np.testing.assert_array_equal(got, expected)


MUTANTS = [
    here("a dynamically quantized LSTM typed as one direction's",
         "directions = 2 if attributes.get(\"direction\", b\"forward\") == b\"bidirectional\" else 1",
         "directions = 1", file="kernorch/fission/fallback.py"),
    here("a dynamically quantized LSTM's types taken by present output, not by position",
         "if name]",
         "]", file="kernorch/fission/fallback.py"),
    here("the layout stage stores a scalar constant as [1]",
         'array = np.asarray(np.transpose(self.old.constants[value], layout), order="C")',
         "array = np.ascontiguousarray(np.transpose(self.old.constants[value], layout))",
         file="kernorch/layout/materialize.py"),
    here("a fallback node's session gets a thread pool of its own",
         "    options.intra_op_num_threads = 1\n",
         "    options.intra_op_num_threads = 0\n",
         file="kernorch/ir/foreign.py"),
]  # fmt: skip
