"""Shape-generic plans: one plan serves every size of a range from its first call, as onnxruntime computes it, and
never plans on the caller's thread; what cannot be the same program at every size is refused with the reason."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import kernorch
from kernorch.codegen.generic import GenericKernelBackend, NotGeneric
from kernorch.devtools.mutate import here
from kernorch.errors import InputMismatch, KernorchError
from kernorch.options import Options
from kernorch.pipeline import generic_stages, import_graph
from kernorch.shapes import dynamic, generic
from kernorch.shapes.generic import PROBES, SizeRange, check_sizes, probe_sizes

# run again under AddressSanitizer and UBSan by `make sanitize`: the unified C at sizes it was not rendered at
pytestmark = pytest.mark.sanitize

HEADS, WIDTH, TABLE = 4, 16, 64


def _cached_attention_step() -> bytes:
    """A decoder step's attention over a cache of `past` positions: the new key and value concatenated to the
    cache, softmax(q·Kᵀ / 4)·V, plus the row of a position table at `past` (Shape → Gather: a constant that
    follows the size); outputs the attention, both caches side by side (the two caches written in place as
    views of that output, the second at an offset that follows the size) and each cached key's sum."""
    def value(name: str, dims: list[Any]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)

    table = np.random.default_rng(3).standard_normal((TABLE, WIDTH)).astype(np.float32)
    nodes = [
        helper.make_node("Concat", ["past_k", "k"], ["keys"], axis=2),
        helper.make_node("Concat", ["past_v", "v"], ["values"], axis=2),
        helper.make_node("Transpose", ["keys"], ["keys_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "keys_t"], ["scores"]),
        helper.make_node("Mul", ["scores", "quarter"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["weights"], axis=-1),
        helper.make_node("MatMul", ["weights", "values"], ["attended"]),
        helper.make_node("Shape", ["past_k"], ["shape"]),
        helper.make_node("Gather", ["shape", "two"], ["length"], axis=0),
        helper.make_node("Gather", ["table", "length"], ["position"], axis=0),
        helper.make_node("Add", ["attended", "position"], ["y"]),
        helper.make_node("Concat", ["keys", "values"], ["present"], axis=1),
        helper.make_node("ReduceSum", ["keys", "three"], ["key_sums"], keepdims=0),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "cached_attention_step",
        [value("q", [1, HEADS, 1, WIDTH]), value("past_k", [1, HEADS, "past", WIDTH]),
         value("past_v", [1, HEADS, "past", WIDTH]), value("k", [1, HEADS, 1, WIDTH]),
         value("v", [1, HEADS, 1, WIDTH])],
        [value("y", [1, HEADS, 1, WIDTH]), value("present", [1, 2 * HEADS, None, WIDTH]),
         value("key_sums", [1, HEADS, None])],
        [numpy_helper.from_array(np.array(0.25, np.float32), "quarter"),
         numpy_helper.from_array(np.array(2, np.int64), "two"), numpy_helper.from_array(table, "table"),
         numpy_helper.from_array(np.array([3], np.int64), "three")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _feeds(past: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + past)
    cache = (1, HEADS, past, WIDTH)
    return {"q": rng.standard_normal((1, HEADS, 1, WIDTH)).astype(np.float32),
            "past_k": rng.standard_normal(cache).astype(np.float32) * 2,
            "past_v": rng.standard_normal(cache).astype(np.float32),
            "k": rng.standard_normal((1, HEADS, 1, WIDTH)).astype(np.float32),
            "v": rng.standard_normal((1, HEADS, 1, WIDTH)).astype(np.float32)}  # fmt: skip


@pytest.fixture(scope="module")
def step() -> tuple[bytes, Any, Any]:
    """The model, kernorch's compiled model with a generic plan for past=1..40 (analytic costs), onnxruntime."""
    model = _cached_attention_step()
    compiled = kernorch.compile(model, cost="analytic", ranges=["past=1..40"])
    return model, compiled, onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])


def test_one_plan_serves_every_size_of_the_range_as_onnxruntime_computes_it(
        step: tuple[bytes, Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Sizes 1, 2, 3, odd, prime, the probes' lower half and the range's largest: the generic plan's outputs
    (both caches side by side, the second at an offset that follows the size; the position row made per call)
    equal onnxruntime's, and no call plans, orchestrates or compiles anything on the caller's thread. One beyond
    the range is served by onnxruntime."""
    _, compiled, session = step
    (plan,) = compiled.generic_plans
    assert plan.generic_kernels >= 2 and plan.generated, compiled.describe()
    planned: list[Any] = []
    monkeypatch.setattr(dynamic, "compile_model", lambda *a, **k: planned.append(a))
    monkeypatch.setattr(generic, "orchestrate_generic", lambda *a, **k: planned.append(a))
    monkeypatch.setattr(generic, "build_generic_plan", lambda *a, **k: planned.append(a))
    for past in (1, 2, 3, 5, 13, 19, 20, 31, 39, 40, 41):
        feeds = _feeds(past)
        names = ["y", "present", "key_sums"]
        want = dict(zip(names, session.run(names, feeds), strict=True))
        got = compiled.run(feeds)
        assert got["present"].shape == (1, 2 * HEADS, past + 1, WIDTH)
        assert got["key_sums"].shape == (1, HEADS, past + 1)
        np.testing.assert_array_equal(got["present"], want["present"])
        np.testing.assert_allclose(got["key_sums"], want["key_sums"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
    assert planned == [] and plan.calls == 10
    wrong = {**_feeds(5), "q": _feeds(5)["q"].astype(np.float64)}
    with pytest.raises(InputMismatch, match="input 'q' is float64, the model takes float32"):
        compiled.run(wrong)
    assert "generic plan [past=1..40]" in compiled.describe() and "1 shape set(s), 1 call(s)" in compiled.describe()


def test_a_shape_called_again_and_again_is_specialised_aside_and_the_faster_plan_kept(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:  # fmt: skip
    """A range's shape set called HOT_IN_RANGE times is planned in the background (never on the caller's thread),
    timed against the generic plan, and the faster of the two runs it from then on; both compute onnxruntime's.
    Saved and loaded, the choice holds, and `explain` says which shape runs what."""
    from kernorch.shapes.report import shape_lines

    monkeypatch.setattr(dynamic, "HOT_IN_RANGE", 2)
    model = _cached_attention_step()
    compiled = kernorch.compile(model, cost="analytic", ranges=["past=1..40"])
    assert isinstance(compiled, dynamic.DynamicModel)
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    feeds = _feeds(9)
    shapes = dynamic.shape_set({name: array.shape for name, array in feeds.items()})
    for _ in range(2):
        compiled.run(feeds)
    assert compiled.wait_for_tuning(timeout=300)
    assert shapes in compiled.specialisations
    kept = compiled.runs_on(shapes)
    assert kept == "its own plan" or (shapes in compiled.generic_first and kept.startswith("the generic plan")), kept
    np.testing.assert_allclose(compiled.run(feeds)["y"], session.run(["y"], feeds)[0], rtol=1e-5, atol=1e-6)
    compiled.generic_first.symmetric_difference_update({shapes})  # the other plan computes the same
    np.testing.assert_allclose(compiled.run(feeds)["y"], session.run(["y"], feeds)[0], rtol=1e-5, atol=1e-6)
    for generic_first in (True, False):
        compiled.generic_first.clear()
        compiled.generic_first.update({shapes} if generic_first else set())
        loaded = kernorch.load(compiled.save(tmp_path / f"plans-{generic_first}"))
        assert isinstance(loaded, dynamic.DynamicModel) and loaded.generic_first == compiled.generic_first
        lines = "\n".join(shape_lines(loaded))
        assert ("the generic plan of [past=1..40]" if generic_first else "its own plan") in lines, lines


def test_calls_from_many_threads_at_once_each_get_their_own_sizes(step: tuple[bytes, Any, Any]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    _, compiled, session = step
    sizes = [1, 40, 7, 33, 2, 17] * 3

    def call(past: int) -> bool:
        feeds = _feeds(past, seed=7)
        want = session.run(["y"], feeds)[0]
        return bool(np.allclose(compiled.run(feeds)["y"], want, rtol=1e-5, atol=1e-6))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(call, sizes))


def _linear_rows() -> bytes:
    """relu(x · W + b) over a sequence of rows, then each row's sum: the matmul's rows follow the size (a library
    call created once with rows known only when it runs), its bias and activation fused into it."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["product"]), helper.make_node("Add", ["product", "b"], ["biased"]),
             helper.make_node("Relu", ["biased"], ["y"]),
             helper.make_node("ReduceSum", ["y", "last"], ["sums"], keepdims=0)]  # fmt: skip
    graph = helper.make_graph(nodes, "linear_rows",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "sequence", 96])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "sequence", 128]),
                               helper.make_tensor_value_info("sums", TensorProto.FLOAT, [1, "sequence"])],
                              [numpy_helper.from_array(rng.standard_normal((96, 128)).astype(np.float32), "w"),
                               numpy_helper.from_array(rng.standard_normal(128).astype(np.float32), "b"),
                               numpy_helper.from_array(np.array([2], np.int64), "last")])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_a_library_call_whose_rows_follow_the_size_runs_at_every_size() -> None:
    """oneDNN's matmul created once with its rows known only when it runs (codegen/library/run_sizes.py): at 1,
    2, 3, odd, prime and the range's edges, in an order that changes the rows between calls, as onnxruntime."""
    model = _linear_rows()
    compiled = kernorch.compile(model, cost="analytic", ranges=["sequence=1..64"])
    assert isinstance(compiled, dynamic.DynamicModel)
    (plan,) = compiled.generic_plans
    assert any(backend.stateful and isinstance(backend, GenericKernelBackend) for backend in plan.executor.backends)
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for rows in (64, 1, 2, 3, 2, 37, 61, 63, 64, 17):
        x = rng.standard_normal((1, rows, 96)).astype(np.float32)
        want = session.run(["y", "sums"], {"x": x})
        got = compiled.run({"x": x})
        np.testing.assert_allclose(got["y"], want[0], rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(got["sums"], want[1], rtol=1e-5, atol=1e-3)


def _small_cnn() -> bytes:
    """A residual block over a symbolic batch: conv 3x3 + relu, conv 3x3 added to its input, global average pool,
    a linear layer: the convolutions are created for one image and run per image of the call."""
    rng = np.random.default_rng(9)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["s"]), helper.make_node("Relu", ["s"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"]), helper.make_node("Flatten", ["g"], ["flat"]),
             helper.make_node("Gemm", ["flat", "w3", "b3"], ["y"], transB=1)]  # fmt: skip
    graph = helper.make_graph(nodes, "small_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 20, 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
                              [weight("w1", 16, 8, 3, 3), weight("b1", 16), weight("w2", 16, 16, 3, 3),
                               weight("b2", 16), weight("w3", 10, 16), weight("b3", 10)])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
def test_convolutions_over_a_batch_known_only_when_they_run(layout: str) -> None:
    """The batch of a CNN as a range: its convolutions created for one image and run per image
    (codegen/library/run_sizes.py), the pool and the linear layer generic; batches 1, 2, 3, 5, 7 and the range's
    edges, in an order that changes the batch between calls, as onnxruntime computes them."""
    model = _small_cnn()
    compiled = kernorch.compile(model, cost="analytic", ranges=["batch=1..16"], layout=layout)
    assert isinstance(compiled, dynamic.DynamicModel)
    (plan,) = compiled.generic_plans
    assert plan.generic_kernels >= 3, compiled.describe()
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    for batch in (16, 1, 2, 3, 5, 2, 7, 15, 8):
        x = rng.standard_normal((batch, 8, 20, 20)).astype(np.float32)
        np.testing.assert_allclose(compiled.run({"x": x})["y"], session.run(["y"], {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cin, cout, kernel, stride", [(64, 64, 3, 1), (3, 16, 7, 2)])
def test_every_convolution_backend_renders_its_per_shape_form(cin: int, cout: int, kernel: int, stride: int) -> None:
    """oneDNN and each of kernorch's own convolutions that runs a convolution over a batch (channels-last: the
    Winograd kernel's 3x3, the few-channel kernel's 7x7 stem) render the form a generic plan unifies
    (codegen/library/run_sizes.py): their create and run given the sizes, whatever type their stream has (a
    backend whose form fails is never chosen for a range: the plan would lose it)."""
    from kernorch.codegen.backends import registered
    from kernorch.codegen.c import SIZES_PARAMETER
    from kernorch.ir.kernel import make_kernel

    weights = numpy_helper.from_array(np.random.default_rng(2).standard_normal((cout, cin, kernel, kernel))
                                      .astype(np.float32), "w")  # fmt: skip
    pad = kernel // 2
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[pad] * 4, strides=[stride] * 2)], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", cin, 56, 56])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", cout, None, None])], [weights]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()  # fmt: skip
    options = Options(cost="analytic", layout="channels-last")
    graph = generic_stages(import_graph(model, {"x": (4, cin, 56, 56)}), options, "channels-last")
    conv = next(i for i, node in enumerate(graph.nodes) if node.prim == "conv")
    kernel_ = make_kernel(graph, (conv,), graph.nodes[conv].outputs)
    rendered = []
    for backend in registered():
        if backend.stateful and backend.runs_code and backend.applies(kernel_).runs:
            text = backend.generic_source("k", kernel_)
            assert text.count(f"{SIZES_PARAMETER}) {{") == 2, backend.name  # its create and run
            rendered.append(backend.name)
    assert "onednn" in rendered and len(rendered) >= 2, rendered


def _detector() -> bytes:
    """A detector's shape over a symbolic batch, height and width: two stride-2 convolutions, the coarser map
    upsampled and concatenated to the finer, a 1x1 head whose map is flattened into one row per position (a
    reshape whose size follows height·width), and the coarser map's mean per channel."""
    rng = np.random.default_rng(11)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Resize", ["r2", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Concat", ["r1", "up"], ["both"], axis=1),
             helper.make_node("Conv", ["both", "w3", "b3"], ["head"]),
             helper.make_node("Reshape", ["head", "rows"], ["flat"]),
             helper.make_node("Transpose", ["flat"], ["boxes"], perm=[0, 2, 1]),
             helper.make_node("GlobalAveragePool", ["r2"], ["pooled"])]  # fmt: skip
    graph = helper.make_graph(nodes, "detector",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
                              [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["batch", None, 6]),
                               helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 16, 1, 1])],
                              [weight("w1", 8, 3, 3, 3), weight("b1", 8), weight("w2", 16, 8, 3, 3), weight("b2", 16),
                               weight("w3", 6, 24, 1, 1), weight("b3", 6),
                               numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
                               numpy_helper.from_array(np.array([0, 6, -1], np.int64), "rows")])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("batches", ["1..16", "1"])
def test_a_detector_at_image_sizes_known_only_when_it_runs(batches: str) -> None:
    """Height and width as a range in steps of 8 (the detector halves its image twice... and a step of 8 keeps
    every map's size a polynomial of the units): its convolutions created once per image size on its first
    call (codegen/library/run_sizes.py), the rest generic; sizes 8 (the smallest: maps of 2x2), odd and prime
    units, tall and wide images, the largest, and two images a call, as onnxruntime computes them."""
    model = _detector()
    compiled = kernorch.compile(model, cost="analytic", ranges=[f"batch={batches},height=8..96:8,width=8..96:8"])
    assert isinstance(compiled, dynamic.DynamicModel)
    (plan,) = compiled.generic_plans
    assert plan.generic_kernels >= 3, compiled.describe()
    assert "height=8..96:8" in compiled.describe()
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for batch, height, width in ((1, 96, 96), (1, 8, 8), (2, 56, 8), (1, 8, 88), (2, 40, 40), (1, 96, 96),
                                 (1, 24, 72), (2, 88, 16), (1, 56, 56), (1, 16, 16), (1, 64, 32), (1, 96, 96)):
        batch = batch if batches != "1" else 1
        x = rng.standard_normal((batch, 3, height, width)).astype(np.float32)
        got = compiled.run({"x": x})
        assert compiled.runs_on(dynamic.shape_set({"x": x.shape})).startswith("the generic plan"), (height, width)
        for name, want in zip(["boxes", "pooled"], session.run(["boxes", "pooled"], {"x": x}), strict=True):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=f"{name} at {height}x{width}")
    for height, width in ((12, 16), (104, 96)):  # between the steps, beyond the range: served as before
        x = rng.standard_normal((1, 3, height, width)).astype(np.float32)
        assert not compiled.runs_on(dynamic.shape_set({"x": x.shape})).startswith("the generic plan")
        np.testing.assert_allclose(compiled.run({"x": x})["boxes"], session.run(["boxes"], {"x": x})[0], rtol=1e-4,
                                   atol=1e-5)  # fmt: skip


def test_a_size_between_the_steps_of_a_range_is_not_in_it() -> None:
    size_range = SizeRange.parse("height=32..640:32,width=32..640:32")
    assert size_range.contains({"height": 64, "width": 640}) and not size_range.contains({"height": 65, "width": 64})
    assert size_range.units({"height": 224, "width": 640}) == {"height": 7, "width": 20}
    assert all(p["height"] % 32 == 0 and p["width"] % 32 == 0 for p in (*probe_sizes(size_range),
                                                                        *check_sizes(size_range)))  # fmt: skip
    assert {c["height"] for c in check_sizes(size_range)} >= {32, 64, 96, 128, 608, 640}
    for spec, why in (("height=30..640:32", "multiples"), ("height=32..640:0", "STEP >= 1"),
                      ("height=32..640:x", "NAME=LOW..HIGH")):  # fmt: skip
        with pytest.raises(KernorchError, match=why):
            SizeRange.parse(spec)


def test_a_call_that_fails_on_the_generic_plan_is_served_by_onnxruntime(step: tuple[bytes, Any, Any],
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A kernel failing at run time on the generic plan (a primitive a library refuses to create at a new size)
    is no lost call: onnxruntime answers it, and the log says why."""
    from kernorch.runtime.executor import KernelFailed

    model, compiled, session = step

    def failing(self: Any, sizes: Any, feeds: Any) -> Any:
        raise KernelFailed("kernel 3 ([conv]): oneDNN execution failed")

    monkeypatch.setattr(generic.GenericPlan, "run", failing)
    feeds = _feeds(7, seed=2)
    np.testing.assert_allclose(compiled.run(feeds)["y"], session.run(["y"], feeds)[0], rtol=1e-5, atol=1e-6)
    assert "failed on its range's generic plan (kernel 3" in caplog.text


def test_a_saved_range_loads_with_its_kernels_and_its_code_regenerated(step: tuple[bytes, Any, Any],
                                                                        tmp_path: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Saved and loaded: the range's kernels come from family.json (no orchestration), their code is rendered,
    unified and checked again, and the loaded model serves the range as onnxruntime computes it. Kernels that are
    not a plan of the graph are refused (and the range planned again)."""
    model, compiled, session = step
    compiled.save(tmp_path / "plans")
    (saved,) = compiled.generic_plans
    monkeypatch.setattr(generic, "orchestrate_generic", lambda *a, **k: pytest.fail("orchestrated on load"))
    loaded = kernorch.load(tmp_path / "plans")
    assert isinstance(loaded, dynamic.DynamicModel)
    (plan,) = loaded.generic_plans
    assert plan.saved == saved.saved and len(plan.executor.kernels) == len(saved.executor.kernels)
    for past in (1, 6, 40):
        feeds = _feeds(past, seed=3)
        np.testing.assert_allclose(loaded.run(feeds)["y"], session.run(["y"], feeds)[0], rtol=1e-5, atol=1e-6)
    signature = loaded.signature
    reference = loaded._generic.run
    nodes, _ = saved.saved[0]
    uncovered = (saved.saved[0], *saved.saved[2:])  # a primitive no kernel covers
    unwritten = ((nodes, ()), *saved.saved[1:])  # a value the graph reads that no kernel writes
    for kernels, why in ((uncovered, "cover"), (unwritten, "outputs")):
        with pytest.raises(NotGeneric, match=why):
            generic.build_generic_plan(model, signature, SizeRange.parse("past=1..40"), Options(cost="analytic"),
                                       reference, kernels)  # fmt: skip


def test_the_command_line_plans_a_range_saves_it_and_runs_a_size_in_it(tmp_path: Any,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`kernorch optimize --range ... -o` then `kernorch run PLAN --input ...` at a size inside the range; a range
    naming no symbolic dim exits 2 in one line."""
    from kernorch.cli import main

    model = tmp_path / "step.onnx"
    model.write_bytes(_cached_attention_step())
    plans = tmp_path / "plans"
    assert main(["optimize", str(model), "--range", "past=1..40", "--cost", "analytic", "-o", str(plans)]) == 0
    assert "1 range plan(s) saved" in capsys.readouterr().out
    inputs = []
    for name, array in _feeds(23).items():
        np.save(tmp_path / f"{name}.npy", array)
        inputs += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    assert main(["run", str(plans), *inputs]) == 0
    out = capsys.readouterr().out
    assert "present: float32[1, 8, 24, 16]" in out and "on the generic plan of [past=1..40]" in out, out
    assert main(["explain", str(plans)]) == 0  # the saved family: each range's kernels, what each shape runs on
    out = capsys.readouterr().out
    assert "range [past=1..40]: one plan" in out and "generic over past" in out, out
    assert "every other shape of [past=1..40]: its generic plan" in out, out
    assert main(["explain", str(model), "--range", "past=1..40", "--cost", "analytic"]) == 0
    assert "generic over past" in capsys.readouterr().out
    assert main(["optimize", str(model), "--range", "pasta=1..40", "--cost", "analytic"]) == 2
    assert "names 'pasta', not a symbolic dim" in capsys.readouterr().err


def test_values_placed_in_a_concatenation_move_with_the_size() -> None:
    """relu(x) and sigmoid(x) each a kernel of its own (saved kernels: the orchestration's choice does not
    matter here), written in place into their concatenation, the second at an offset of 8·S: at 1, 2, 3, odd,
    prime and the range's edges, as onnxruntime computes it."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["x"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["y"], axis=1)]  # fmt: skip
    graph = helper.make_graph(nodes, "two_halves",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "sequence", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, 8])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    options, size_range = Options(cost="analytic"), SizeRange.parse("sequence=1..32")
    largest = generic_stages(import_graph(model, {"x": (1, 32, 8)}), options)
    singletons = tuple(((i,), node.outputs) for i, node in enumerate(largest.nodes))
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    reference = lambda feeds: dict(zip(["y"], session.run(["y"], dict(feeds)), strict=True))  # noqa: E731
    plan = generic.build_generic_plan(model, dynamic.input_signature(model), size_range, options, reference,
                                      singletons)  # fmt: skip
    offsets = plan.executor.layout.view_offsets
    assert any(not offset.is_constant for offset in offsets.values()), offsets
    for length in (32, 1, 2, 3, 7, 13, 31, 2):
        x = np.random.default_rng(length).standard_normal((1, length, 8)).astype(np.float32)
        np.testing.assert_allclose(plan.run({"sequence": length}, {"x": x})["y"], reference({"x": x})["y"],
                                   rtol=1e-6, atol=1e-7)  # fmt: skip


def _scaled_by_sequence(unary: str) -> bytes:
    """x · unary(sequence): the size reaches a value (Shape → Cast → unary, folded into a constant)."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),
             helper.make_node("Cast", ["length"], ["length_f"], to=TensorProto.FLOAT),
             helper.make_node(unary, ["length_f"], ["factor"]),
             helper.make_node("Mul", ["x", "factor"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "scaled_by_sequence",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "sequence", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "sequence", 8])],
                              [numpy_helper.from_array(np.array(1, np.int64), "one")])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_a_mean_over_the_size_is_made_per_call() -> None:
    """1 / sequence (a mean's divisor) is a count's reciprocal: made per call, exactly as the fold makes it."""
    compiled = kernorch.compile(_scaled_by_sequence("Reciprocal"), cost="analytic", ranges=["sequence=1..32"])
    assert isinstance(compiled, dynamic.DynamicModel)
    assert len(compiled.generic_plans) == 1, compiled.describe()
    for length in (1, 2, 11, 31, 32):
        x = np.random.default_rng(length).standard_normal((1, length, 8)).astype(np.float32)
        np.testing.assert_array_equal(compiled.run({"x": x})["y"], x * np.reciprocal(np.float32(length)))


def test_a_size_used_as_a_value_is_refused_and_its_range_served_as_before() -> None:
    compiled = kernorch.compile(_scaled_by_sequence("Sqrt"), cost="analytic", ranges=["sequence=1..32"])
    assert isinstance(compiled, dynamic.DynamicModel)
    assert compiled.generic_plans == []
    assert "holds values that follow the size" in compiled.range_refusals["sequence=1..32"]
    x = np.random.default_rng(0).standard_normal((1, 11, 8)).astype(np.float32)
    np.testing.assert_allclose(compiled.run({"x": x})["y"], x * np.sqrt(np.float32(11)), rtol=1e-6)


@pytest.mark.parametrize(("ranges", "message"), [
    (["past=0..3"], "1 <= LOW <= HIGH"), (["past=9..3"], "1 <= LOW <= HIGH"), (["past=1..x"], "not NAME=SIZE"),
    (["past=1,past=2"], "twice"), ([""], "names no dim"),
])  # fmt: skip
def test_a_malformed_range_is_refused_in_one_line(ranges: list[str], message: str) -> None:
    with pytest.raises(KernorchError, match=message):
        Options(ranges=ranges)  # type: ignore[arg-type]  # specs are normalised on construction


def test_a_range_the_model_does_not_have_is_refused(step: tuple[bytes, Any, Any]) -> None:
    model = step[0]
    with pytest.raises(KernorchError, match="names 'sequence', not a symbolic dim"):
        kernorch.compile(model, cost="analytic", ranges=["sequence=1..8"])
    with pytest.raises(KernorchError, match="fixes every dim"):
        kernorch.compile(model, cost="analytic", ranges=["past=8"])


def test_probes_cover_the_upper_half_with_every_remainder_and_checks_reach_the_edges() -> None:
    size_range = SizeRange.parse("sequence=1,past=1..256")
    probes = probe_sizes(size_range)
    pasts = [p["past"] for p in probes]
    assert probes[0] == {"sequence": 1, "past": 256} and len(set(pasts)) == PROBES == len(pasts)
    assert all(128 <= p <= 256 for p in pasts) and 255 in pasts  # two consecutive: no shared remainder
    assert all(p["sequence"] == 1 for p in probes)
    checked = [c["past"] for c in check_sizes(size_range)]
    assert {1, 2, 3, 4, 255, 256} <= set(checked) and any(all(n % d for d in range(2, n)) and n > 100
                                                          for n in checked)  # a prime between  # fmt: skip
    two = probe_sizes(SizeRange.parse("batch=1..16,past=1..64"))
    assert len(two) > 2 * PROBES - 1 and any(p["batch"] != 16 and p["past"] != 64 for p in two)  # off the lines
    with pytest.raises(NotGeneric, match="fewer than"):
        probe_sizes(SizeRange.parse("past=1..6"))


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# kill (kernorch/devtools/mutate.py collects them; `make mutate` runs them).
MUTANTS = [
    here("generic: a view's offset left where the largest sizes put it",
         "if value in self.plan.slots and not layout.view_offsets[value].is_constant]", "if False]",
         file="kernorch/runtime/generic.py"),
    here("generic: a constant that follows the size kept from the largest sizes",
         "inputs[name] = generate(sizes)", "inputs[name] = generate(self.layout.largest)",
         file="kernorch/runtime/generic.py"),
    here("generic: outputs allocated at the largest shapes",
         "outputs[name], address = aligned_buffer(layout.shape(name, sizes), self.graph.types[name].dtype)",
         "outputs[name], address = aligned_buffer(self.graph.types[name].shape, self.graph.types[name].dtype)",
         file="kernorch/runtime/generic.py"),
    here("generic: the size array of the largest sizes",
         "inputs[SIZES_INPUT] = np.array([sizes[name] for name in layout.sizes], dtype=np.int64)",
         "inputs[SIZES_INPUT] = np.array([layout.largest[name] for name in layout.sizes], dtype=np.int64)",
         file="kernorch/runtime/generic.py"),
    here("generic: a range's shape not served by its plan",
         "return next((plan for plan in self.generic_plans if plan.size_range.contains(values)), None)",
         "return None", file="kernorch/shapes/dynamic.py"),
    here("generic: a matmul's rows fixed when it is created",
         "return \", \".join([RUNTIME] * (len(values) - 1) + [str(values[-1])])",
         "return \", \".join(str(v) for v in values)", file="kernorch/codegen/library/run_sizes.py"),
    here("generic: every image of a batch read from the first",
         'w.line(*(f"image[{slot}] = (char *)a[{slot}] + n * {step};" for slot, step in sorted(steps.items())),',
         'w.line(*(f"image[{slot}] = (char *)a[{slot}];" for slot, step in sorted(steps.items())),',
         file="kernorch/codegen/library/run_sizes.py"),
    here("generic: a convolution run with the primitive of another image size",
         "if (c->state && !memcmp(c->key, key, sizeof key)) e = c;", "if (c->state) e = c;",
         file="kernorch/codegen/library/run_sizes.py"),
    here("generic: a saved plan forgets which specialised shapes the generic plan runs faster",
         "loaded.generic_first.update(shapes for shapes in family.generic_first if shapes in family.plans)", "pass",
         file="kernorch/shapes/dynamic.py"),
    here("generic: a count folded into a constant made without its reciprocal",
         "np.reciprocal(dtype.type(count(sizes))) if inverse else count(sizes), dtype)",
         "count(sizes), dtype)", file="kernorch/shapes/generic_constants.py"),
    here("generic: a range's units taken as its sizes",
         "return {name: sizes[name] // steps[name] for name in self.varying}",
         "return {name: sizes[name] for name in self.varying}", file="kernorch/shapes/generic.py"),
    here("generic: probes without the consecutive pair",
         "sizes = [high, high - 1, low,", "sizes = [high, high - 2, low,", file="kernorch/shapes/generic.py"),
    here("generic: a constant that differs between probes taken as fixed",
         "if all(a.shape == array.shape and np.array_equal(a, array, equal_nan=True) for a in arrays[1:]):",
         "if True:", file="kernorch/shapes/generic_constants.py"),
]  # fmt: skip
