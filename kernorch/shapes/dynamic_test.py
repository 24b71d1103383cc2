"""One compiled model for many shapes: a symbolic batch and a symbolic sequence length, each compiled once and run
at five shapes against onnxruntime; the saved plan with several specialisations; the shape policy; padding."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kernorch
from kernorch.devtools.mutate import here
from kernorch.errors import InputMismatch, KernorchError
from kernorch.options import OrchestrationLimits
from kernorch.runtime.artifact import ArtifactError
from kernorch.shapes import DynamicModel, prove_paddable
from kernorch.tools.check import run_onnxruntime

# the nominal CPU roofline plans without calibrating this machine (the plan runs here as generated C), and small
# kernels keep each specialisation's BLP quick: these tests are about shapes, not about the best plan
FAST: dict[str, Any] = {"cost": "analytic", "device": "cpu-nominal", "rewrite_budget": 0.0,
                        "limits": OrchestrationLimits(max_kernel_size=4)}
# the tests of planning on first use: a shape without a plan is specialised on the caller's thread (the default
# serves it by onnxruntime and plans it aside once it is hot)
SPECIALISE: dict[str, Any] = {**FAST, "new_shapes": "specialise"}
RNG = np.random.default_rng(7)


def _const(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def cnn_with_symbolic_batch() -> onnx.ModelProto:
    """conv → batch norm → relu → max pool → flatten through a Shape-computed reshape → gemm → softmax."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Shape", ["p"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "minus1"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["p", "flat_shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc", "fc_b"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    initializers = [
        _const("w", 4, 3, 3, 3), _const("b", 4), _const("scale", 4), _const("bias", 4), _const("mean", 4),
        numpy_helper.from_array(np.full(4, 1.5, np.float32), "var"), _const("fc", 10, 4 * 4 * 4), _const("fc_b", 10),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "axes0"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
    ]  # fmt: skip
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def attention_with_symbolic_sequence() -> onnx.ModelProto:
    """Token embedding + position embedding sliced to the sequence length (through Shape) and one attention head
    (softmax over the sequence) with its residual: the shape arithmetic of an exported transformer."""
    width = 16
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["tokens"], axis=0),
        helper.make_node("Shape", ["ids"], ["shape"]),
        helper.make_node("Slice", ["shape", "one", "two"], ["length"]),
        helper.make_node("Slice", ["positions", "zero", "length"], ["pos"]),
        helper.make_node("Add", ["tokens", "pos"], ["h"]),
        helper.make_node("MatMul", ["h", "wq"], ["q"]),
        helper.make_node("MatMul", ["h", "wk"], ["k"]),
        helper.make_node("MatMul", ["h", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["attention"], axis=-1),
        helper.make_node("MatMul", ["attention", "v"], ["mixed"]),
        helper.make_node("Add", ["mixed", "h"], ["y"]),
    ]
    ints = {"one": [1], "two": [2], "zero": [0]}
    initializers = [
        _const("table", 50, width), _const("positions", 128, width), _const("wq", width, width),
        _const("wk", width, width), _const("wv", width, width),
        numpy_helper.from_array(np.array(width**-0.5, np.float32), "scale"),
        *(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "sequence"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "sequence", width])], initializers)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def assert_matches(model: onnx.ModelProto, compiled: object, feeds: dict[str, np.ndarray]) -> None:
    expected = run_onnxruntime(model, feeds)
    actual = compiled.run(feeds)  # type: ignore[attr-defined]
    for name, value in expected.items():
        assert actual[name].shape == value.shape
        np.testing.assert_allclose(actual[name], value, rtol=1e-4, atol=1e-5)


def test_a_symbolic_batch_compiles_once_and_runs_five_batches(tmp_path: Path) -> None:
    model = cnn_with_symbolic_batch()
    compiled = kernorch.compile(model, cache_dir=tmp_path, **SPECIALISE)
    assert isinstance(compiled, DynamicModel)
    assert compiled.specialisations == {}  # nothing named ahead: each batch is specialised on first use
    for batch in (1, 2, 3, 8, 16):
        assert_matches(model, compiled, {"x": RNG.standard_normal((batch, 3, 8, 8)).astype(np.float32)})
    assert len(compiled.specialisations) == 5
    x = RNG.standard_normal((3, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(compiled(x), compiled.run({"x": x})["y"])  # positional call, same plan


def test_a_symbolic_sequence_compiles_once_and_runs_five_lengths(tmp_path: Path) -> None:
    model = attention_with_symbolic_sequence()
    compiled = kernorch.compile(model, cache_dir=tmp_path, shapes=[{"ids": (1, 7)}], **FAST)
    assert isinstance(compiled, DynamicModel) and len(compiled.specialisations) == 1  # prepared ahead of time
    for length in (1, 7, 16, 33, 100):
        assert_matches(model, compiled, {"ids": RNG.integers(0, 50, (1, length)).astype(np.int64)})
    with pytest.raises(InputMismatch, match="size 2 on axis 0"):
        compiled(RNG.integers(0, 50, (2, 4)))


def test_the_saved_plan_holds_every_specialisation_each_verified(tmp_path: Path) -> None:
    model = cnn_with_symbolic_batch()
    compiled = kernorch.compile(model, cache_dir=tmp_path / "cache", buckets={"batch": (1, 4)}, **SPECIALISE)
    assert isinstance(compiled, DynamicModel)
    assert sorted(s[0][1][0] for s in compiled.specialisations) == [1, 4]
    saved = compiled.save(tmp_path / "plan")
    loaded = kernorch.load(saved, cache_dir=tmp_path / "other-cache")
    assert isinstance(loaded, DynamicModel) and len(loaded.specialisations) == 2
    for batch in (1, 4):
        assert_matches(model, loaded, {"x": RNG.standard_normal((batch, 3, 8, 8)).astype(np.float32)})
    assert loaded.specialised_here == 0  # both came from the directory
    assert_matches(model, loaded, {"x": RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)})  # a new one
    assert loaded.specialised_here == 1

    # every part is verified: a specialisation's C, the manifest, the model, a specialisation filed wrongly
    kernels = saved / "shape-1" / "kernels.c"
    original = kernels.read_text()
    kernels.write_text(original + "\n/* edited */\n")
    with pytest.raises(ArtifactError, match="checksum"):
        kernorch.load(saved)
    kernels.write_text(original)
    family = json.loads((saved / "family.json").read_text())
    family["options"]["threads"] = 7
    (saved / "family.json").write_text(json.dumps(family))
    with pytest.raises(ArtifactError, match="modified"):
        kernorch.load(saved)
    compiled.save(saved)
    (saved / "shape-0").rename(saved / "swap")
    (saved / "shape-1").rename(saved / "shape-0")
    (saved / "swap").rename(saved / "shape-1")
    with pytest.raises(ArtifactError, match="is not the plan family.json lists there"):
        kernorch.load(saved)
    compiled.save(saved)
    (saved / "model.onnx").write_bytes((saved / "model.onnx").read_bytes()[:-10])
    with pytest.raises(ArtifactError, match="model.onnx does not match"):
        kernorch.load(saved)


def test_specialisations_are_cached_on_disk_and_a_corrupt_one_is_rebuilt(tmp_path: Path) -> None:
    model = cnn_with_symbolic_batch()
    first = kernorch.compile(model, cache_dir=tmp_path, shapes=[{"x": (2, 3, 8, 8)}], **FAST)
    assert isinstance(first, DynamicModel) and first.specialised_here == 1
    again = kernorch.compile(model, cache_dir=tmp_path, shapes=[{"x": (2, 3, 8, 8)}], **FAST)
    assert isinstance(again, DynamicModel) and again.specialised_here == 0
    other_options = kernorch.compile(model, cache_dir=tmp_path, shapes=[{"x": (2, 3, 8, 8)}],
                                     **{**FAST, "layout": "nchw"})  # fmt: skip
    assert isinstance(other_options, DynamicModel) and other_options.specialised_here == 1  # another key
    for plan_json in (tmp_path / "specialisations").rglob("plan.json"):
        plan_json.write_text("{ truncated")
    rebuilt = kernorch.compile(model, cache_dir=tmp_path, shapes=[{"x": (2, 3, 8, 8)}], **FAST)
    assert isinstance(rebuilt, DynamicModel) and rebuilt.specialised_here == 1
    assert_matches(model, rebuilt, {"x": RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)})


def test_concurrent_first_calls_of_one_shape_specialise_it_once(tmp_path: Path) -> None:
    model = cnn_with_symbolic_batch()
    compiled = kernorch.compile(model, cache_dir=tmp_path, **SPECIALISE)
    assert isinstance(compiled, DynamicModel)
    x = RNG.standard_normal((5, 3, 8, 8)).astype(np.float32)
    results: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: results.append(compiled(x))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert compiled.specialised_here == 1 and len(results) == 4
    for result in results[1:]:
        np.testing.assert_array_equal(result, results[0])


def test_new_shapes_can_be_refused(tmp_path: Path) -> None:
    compiled = kernorch.compile(cnn_with_symbolic_batch(), cache_dir=tmp_path, shapes=[{"x": (2, 3, 8, 8)}],
                                new_shapes="refuse", **FAST)  # fmt: skip
    compiled(np.zeros((2, 3, 8, 8), np.float32))
    with pytest.raises(InputMismatch, match=r"no plan for \[x=3x3x8x8\].*prepared: \[x=2x3x8x8\]"):
        compiled(np.zeros((3, 3, 8, 8), np.float32))


def test_shape_policy_mistakes_are_one_line_refusals(tmp_path: Path) -> None:
    with pytest.raises(KernorchError, match="'seq', which is not a symbolic dim"):
        kernorch.compile(cnn_with_symbolic_batch(), cache_dir=tmp_path, buckets={"seq": (1, 2)}, **FAST)
    with pytest.raises(KernorchError, match="no buckets to pad to"):
        kernorch.Options(pad=("batch",))
    with pytest.raises(InputMismatch, match="rank 3"):
        kernorch.compile(cnn_with_symbolic_batch(), cache_dir=tmp_path, shapes=[{"x": (1, 3, 8)}], **FAST)


def test_batch_padding_is_exact_where_proven_and_logged_where_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = cnn_with_symbolic_batch()
    compiled = kernorch.compile(model, cache_dir=tmp_path, buckets={"batch": (4, 8)}, pad=("batch",), **SPECIALISE)
    assert isinstance(compiled, DynamicModel)
    for batch in (1, 3, 5):
        assert_matches(model, compiled, {"x": RNG.standard_normal((batch, 3, 8, 8)).astype(np.float32)})
    assert compiled.specialised_here == 2  # the buckets only: 1, 3 ran padded to 4, 5 to 8

    # attention mixes the padding into every row (QKᵀ is padded on rows and columns, the softmax reduces over
    # the padded keys): refused at the first such primitive, the call specialised instead
    sequence = attention_with_symbolic_sequence()
    padded = kernorch.compile(sequence, cache_dir=tmp_path, buckets={"sequence": (8,)}, pad=("sequence",),
                                **SPECIALISE)
    with caplog.at_level(logging.INFO, logger="kernorch.shapes"):
        assert_matches(sequence, padded, {"ids": RNG.integers(0, 50, (1, 5)).astype(np.int64)})
    assert "not padding sequence to [ids=1x8]: matmul" in caplog.text and "both operands padded" in caplog.text
    assert isinstance(padded, DynamicModel) and padded.specialised_here == 2


def test_a_model_that_computes_with_its_batch_size_is_not_padded() -> None:
    """y = x / batch (Shape → Gather → Cast → Div): row-wise, yet the folded size differs between bucket and call."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Cast", ["batch"], ["size"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["x", "size"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "per_batch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])],
                              [numpy_helper.from_array(np.array(0, np.int64), "zero")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    signature = kernorch.shapes.dynamic.input_signature(model)
    proof = prove_paddable(model, signature, ["b"], {"b": 8}, {"b": 3})
    assert not proof.exact and "depends on the size" in proof.reason
    proof = prove_paddable(model, signature, ["b"], {"b": 8}, {"b": 8})
    assert proof.exact  # at its own size nothing differs


def elementwise_with_symbolic_batch() -> onnx.ModelProto:
    nodes = [helper.make_node("Mul", ["x", "scale"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
                              [_const("scale", 16)])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_background_tuning_serves_the_analytic_plan_first(tmp_path: Path) -> None:
    model = elementwise_with_symbolic_batch()
    compiled = kernorch.compile(model, cache_dir=tmp_path, cost="profile", background_tuning=True, rewrite=False,
                                new_shapes="specialise")
    assert isinstance(compiled, DynamicModel)
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    assert_matches(model, compiled, {"x": x})
    first = next(iter(compiled.specialisations.values()))
    assert first.metadata["cost_model"].startswith("analytic")
    assert compiled.wait_for_tuning(timeout=300)
    tuned = next(iter(compiled.specialisations.values()))
    assert tuned.metadata["cost_model"].startswith("profile")
    assert_matches(model, compiled, {"x": x})


def _counting_planner(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that plan (compile_model) from now on, one per call."""
    planners: list[str] = []
    plan = kernorch.shapes.dynamic.compile_model

    def counted(*args: Any, **kwargs: Any) -> Any:
        planners.append(threading.current_thread().name)
        return plan(*args, **kwargs)

    monkeypatch.setattr(kernorch.shapes.dynamic, "compile_model", counted)
    return planners


def test_new_shapes_are_served_at_once_and_the_hot_ones_planned_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = attention_with_symbolic_sequence()
    compiled = kernorch.compile(model, cache_dir=tmp_path, shapes=[{"ids": (1, 8)}], new_shapes="serve", **FAST)
    assert isinstance(compiled, DynamicModel) and len(compiled.specialisations) == 1
    planners = _counting_planner(monkeypatch)
    with caplog.at_level(logging.INFO, logger="kernorch.shapes"):
        for length in (1, 2, 7, 13, 100, 8):  # 1, 2, odd, prime, beyond the prepared size, and the prepared one
            assert_matches(model, compiled, {"ids": RNG.integers(0, 50, (1, length)).astype(np.int64)})
    assert planners == [] and len(compiled.specialisations) == 1  # nothing planned on the caller's thread
    assert "[ids=1x7] has no plan: served by onnxruntime" in caplog.text
    assert "served by onnxruntime without a plan: 5 shape set(s), 5 call(s)" in compiled.describe()

    hot = {"ids": RNG.integers(0, 50, (1, 5)).astype(np.int64)}
    for _ in range(kernorch.shapes.serving.HOT_CALLS):
        assert_matches(model, compiled, hot)
    assert compiled.wait_for_tuning(timeout=300)
    assert planners == ["kernorch-hot-shapes"]  # planned once, aside
    assert sorted(s[0][1][1] for s in compiled.specialisations) == [5, 8]
    assert_matches(model, compiled, hot)  # now on its plan


def test_serving_without_onnxruntime_plans_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(kernorch.shapes.dynamic, "onnxruntime_available", lambda: False)
    model = cnn_with_symbolic_batch()
    with caplog.at_level(logging.WARNING, logger="kernorch.shapes"):
        compiled = kernorch.compile(model, cache_dir=tmp_path, new_shapes="serve", **FAST)
    assert "onnxruntime is not installed" in caplog.text
    assert_matches(model, compiled, {"x": RNG.standard_normal((3, 3, 8, 8)).astype(np.float32)})
    assert isinstance(compiled, DynamicModel) and compiled.specialised_here == 1


def test_an_empty_tensor_is_served_and_never_planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = elementwise_with_symbolic_batch()
    compiled = kernorch.compile(model, cache_dir=tmp_path, **FAST)  # the default policy: serve
    planners = _counting_planner(monkeypatch)
    for _ in range(kernorch.shapes.serving.HOT_CALLS + 1):
        assert_matches(model, compiled, {"x": np.zeros((0, 16), np.float32)})  # as a prefill's empty cache
    assert isinstance(compiled, DynamicModel) and compiled.wait_for_tuning(timeout=60)
    assert planners == [] and compiled.specialisations == {}
    refusing = kernorch.compile(model, cache_dir=tmp_path, new_shapes="specialise", **FAST)
    with pytest.raises(InputMismatch, match="empty axis 0; kernorch plans non-empty"):
        refusing(np.zeros((0, 16), np.float32))


def test_a_model_onnxruntime_cannot_load_is_planned_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(self: Any) -> None:
        raise KernorchError("onnxruntime cannot load the model to serve shapes without a plan: no kernel")

    monkeypatch.setattr(kernorch.shapes.serving.GenericServer, "prepare", refuse)
    model = elementwise_with_symbolic_batch()
    with caplog.at_level(logging.WARNING, logger="kernorch.shapes"):
        compiled = kernorch.compile(model, cache_dir=tmp_path, **FAST)
    assert "shapes without a plan are planned on first use" in caplog.text
    assert_matches(model, compiled, {"x": RNG.standard_normal((3, 16)).astype(np.float32)})
    assert isinstance(compiled, DynamicModel) and compiled.specialised_here == 1


def test_a_served_call_of_the_wrong_type_is_a_one_line_refusal(tmp_path: Path) -> None:
    compiled = kernorch.compile(cnn_with_symbolic_batch(), cache_dir=tmp_path, new_shapes="serve", **FAST)
    with pytest.raises(InputMismatch, match="onnxruntime refused the call it serves"):
        compiled(np.zeros((2, 3, 8, 8), np.float64))


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("shapes: padding proof ignores a size-dependent constant",
         "        if axis is None:\n            raise NotProven(f\"constant",
         "        if False:\n            raise NotProven(f\"constant",
         file="kernorch/shapes/padding.py"),
    here("shapes: padded outputs cut one row late",
         "index[output_axis] = slice(0, self.sizes[dim])",
         "index[output_axis] = slice(1, self.sizes[dim] + 1)",
         file="kernorch/shapes/padding.py"),
    here("shapes: a served shape planned on its first call",
         "if count != self._hot_calls or not plannable:", "if count > self._hot_calls or not plannable:",
         file="kernorch/shapes/serving.py"),
    here("shapes: an empty tensor's shape planned once hot", "if count != self._hot_calls or not plannable:",
         "if count != self._hot_calls:", file="kernorch/shapes/serving.py"),
    here("shapes: new shapes planned on the caller's thread though served",
         "        if self._serving:\n            self._hot.called(shapes)",
         "        if False:\n            self._hot.called(shapes)", file="kernorch/shapes/dynamic.py"),
]  # fmt: skip
