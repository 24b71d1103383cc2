"""The rounding arbiter: a quantizer that differs from onnxruntime's is judged in exact arithmetic, each divergence on
its own (onnxruntime re-run with kernorch's integers given), and the outputs then compared.

The runs are onnxruntime's, one of them with a quantizer's integers moved by a step (what a float sum's rounding,
or a wrong kernel, does), so which element crosses which boundary is chosen here rather than hoped for."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from kernorch.devtools.mutate import here
from kernorch.options import Options
from kernorch.tools.check import CheckReport, check_model, compare, run_onnxruntime, worst_relative
from kernorch.tools.rounding_arbiter import (
    FLOAT_RTOL,
    NEAR_TIE_STEPS,
    Arbitration,
    QuantizerDivergence,
    _Model,
    arbitrate,
)

SCALE = 0.125  # the input's step: x / SCALE is exact in float32, so an input places x / scale where a test wants it


def _model() -> onnx.ModelProto:
    """x → quantized (step 1/8) → a 3x3 convolution of int8 weights per channel, with bias → quantized → output."""
    rng = np.random.default_rng(3)
    constants: dict[str, np.ndarray] = {
        "xs": np.asarray(SCALE, np.float32), "xz": np.asarray(2, np.int8),
        "w": rng.integers(-90, 90, (4, 3, 3, 3)).astype(np.int8),
        "ws": np.asarray([0.01, 0.02, 0.015, 0.03], np.float32),
        "b": rng.integers(-500, 500, (4,)).astype(np.int32),
        "bs": np.asarray([0.00125, 0.0025, 0.001875, 0.00375], np.float32),
        "ys": np.asarray(0.07, np.float32), "yz": np.asarray(-4, np.int8)}  # fmt: skip
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="quantize_x"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "bs"], ["bd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"], name="quantize_c"),
             helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])],
                              [numpy_helper.from_array(v, k) for k, v in constants.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _feeds() -> dict[str, np.ndarray]:
    """Inputs whose x / SCALE is (k + 0.3) everywhere but element 0 at (k + ½ + 1e-4): a near tie there."""
    steps = np.random.default_rng(4).integers(-40, 40, (1, 3, 5, 5)).astype(np.float64) + 0.3
    steps.reshape(-1)[0] = 7.5001
    return {"x": (steps * SCALE).astype(np.float32)}


def _ort(proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return run_onnxruntime(proto, dict(feeds), threads=1)


def _moved(quantizer: str, element: int, step: int = 1):  # type: ignore[no-untyped-def]
    """A runner computing as onnxruntime does but with `quantizer`'s integer at `element` moved by `step`, and
    everything after it computed from the moved value."""
    model = _Model(_model())

    def run(proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if quantizer in feeds:  # given: nothing of this run's own to move
            return _ort(proto, feeds)
        first = _ort(model.cut(), feeds)
        moved = first[quantizer].copy()
        moved.reshape(-1)[element] += step
        given = [quantizer]
        later = _ort(model.cut(given), {**feeds, quantizer: moved})
        return {**later, quantizer: moved}

    return run


def _arbitrate(kernorch, onnxruntime, proto: onnx.ModelProto | None = None) -> Arbitration:  # type: ignore[no-untyped-def]
    proto = proto or _model()
    feeds = _feeds()
    actual = {"y": kernorch(_Model(proto).cut(), feeds)["y"]}
    return arbitrate(proto, feeds, actual, 2e-2, kernorch, onnxruntime, worst_relative)


def test_equal_runs_need_no_arbitration() -> None:
    arbitration = _arbitrate(_ort, _ort)
    assert arbitration.explained and arbitration.divergences == () and arbitration.remaining == 0.0


def test_onnxruntime_rounding_off_a_tie_is_its_own() -> None:
    """onnxruntime one step off at a non-tie element: kernorch's integer is the exact rounding; the step it carries
    into the convolution's quantizer is not held against kernorch (onnxruntime re-run with kernorch's integer)."""
    arbitration = _arbitrate(_ort, _moved("xq", 5))
    assert arbitration.explained, arbitration.lines()
    (divergence,) = arbitration.divergences
    assert (divergence.quantizer, divergence.differing) == ("quantize_x", 1)
    assert (divergence.exact, divergence.near_tie) == (1, 0)
    assert arbitration.remaining == 0.0
    assert "exact x/scale" in divergence.example


def test_kernorch_off_a_non_tie_is_wrong() -> None:
    arbitration = _arbitrate(_moved("xq", 5), _ort)
    assert not arbitration.explained
    (divergence,) = arbitration.divergences
    assert (divergence.exact, divergence.near_tie) == (0, 0)
    assert "1 WRONG" in divergence.describe()


def test_kernorch_off_at_a_near_tie_is_allowed() -> None:
    """x / scale = 7.5001 + zero point: 10 is the exact rounding, 9 is a float32 sum's: both allowed."""
    arbitration = _arbitrate(_moved("xq", 0, -1), _ort)
    assert arbitration.explained, arbitration.lines()
    assert (arbitration.divergences[0].exact, arbitration.divergences[0].near_tie) == (0, 1)


def test_a_later_divergence_is_judged_on_its_own() -> None:
    """kernorch's first quantizer right (onnxruntime off at a non-tie) does not excuse a wrong step in the
    convolution's quantizer after it: judged from agreed inputs once onnxruntime has kernorch's integers."""

    def kernorch(proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = _ort(proto, feeds)
        out["cq"] = out["cq"].copy()
        out["cq"].reshape(-1)[7] += 1
        out["y"] = ((out["cq"].astype(np.float32) + 4) * np.float32(0.07)).astype(np.float32)
        return out

    arbitration = _arbitrate(kernorch, _moved("xq", 5))
    assert not arbitration.explained
    assert [d.quantizer for d in arbitration.divergences] == ["quantize_x", "quantize_c"]
    assert arbitration.divergences[0].explained and not arbitration.divergences[1].explained


def test_what_cannot_be_arbitrated_says_why() -> None:
    moved = _moved("xq", 5)
    computed = _model()  # the quantizer's scale computed, not a constant
    computed.graph.node.insert(0, helper.make_node("Identity", ["xs"], ["xs_computed"]))
    computed.graph.node[1].input[1] = "xs_computed"
    assert "not a constant" in _arbitrate(_ort, moved, computed).reason


def test_a_plan_is_held_to_the_interpreter() -> None:
    """Checked outputs apart from the arbitrated run's (the model with every quantizer's results kept) by more than
    the tolerance are not excused by that run's arbitration."""
    far = arbitrate(_model(), _feeds(), {"y": np.zeros((1, 4, 5, 5), np.float32)}, 2e-2, _ort, _moved("xq", 5),
                    worst_relative)  # fmt: skip
    assert not far.explained and far.plan_error > 2e-2
    assert "differ from the arbitrated run's" in "\n".join(far.lines())
    near = _ort(_Model(_model()).cut(), _feeds())["y"]
    assert arbitrate(_model(), _feeds(), {"y": near}, 2e-2, _ort, _moved("xq", 5), worst_relative).explained


def test_the_check_passes_only_what_is_explained() -> None:
    divergence = QuantizerDivergence("q", 1, 10, 1, 0, "")
    report = CheckReport("m", {}, 0, rtol=1e-2)
    report.errors = compare({"y": np.array([1.0, 2.0])}, {"y": np.array([1.0, 2.1])})
    assert not report.passed
    report.arbitration = Arbitration((divergence,), 0.0, 1e-2)
    assert report.passed and "judged exact or tied" in "\n".join(report.lines())
    report.arbitration = Arbitration((divergence,), 2e-2, 1e-2)  # the outputs still apart afterwards
    assert not report.passed
    report.arbitration = Arbitration((QuantizerDivergence("q", 2, 10, 1, 0, ""),), 0.0, 1e-2)
    assert not report.passed


def test_check_model_arbitrates_beyond_the_tolerance(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """onnxruntime one step off in the input's quantizer: the check fails on the outputs, arbitrates, and passes
    saying why; its feeds are the check's own (seeded), so the moved element is wherever x / scale is no tie."""
    import kernorch.tools.check as check

    real = check.run_onnxruntime
    model = _Model(_model())

    def moved(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int = 2,
              optimized: bool = True) -> dict[str, np.ndarray]:  # fmt: skip
        if "xq" in feeds:
            return real(proto, feeds, threads, optimized)
        first = real(model.cut(), feeds, threads, optimized)
        first["xq"].reshape(-1)[int(np.argmax(np.abs(feeds["x"].reshape(-1) / SCALE % 1 - 0.5)))] += 1
        later = real(model.cut(["xq"]), {**feeds, "xq": first["xq"]}, threads, optimized)
        return {name: later[name] for name in (o.name for o in proto.graph.output) if name in later} | \
            ({"xq": first["xq"]} if "xq" in {o.name for o in proto.graph.output} else {})  # fmt: skip

    monkeypatch.setattr(check, "run_onnxruntime", moved)
    for compiled in (False, True):  # compiled: kernorch's integers from a plan keeping every quantizer's results
        report, _ = check_model(_model(), rtol=1e-3, compiled=compiled, options=Options(cost="analytic"))
        assert report.worst_relative > 1e-3 and report.passed, report.lines()
        assert report.arbitration is not None
        assert [d.quantizer for d in report.arbitration.divergences] == ["quantize_x"]
        assert report.arbitration.plan_error == 0.0
        assert "judged exact or tied" in "\n".join(report.lines())


def _dynamic_model() -> onnx.ModelProto:
    """x → DynamicQuantizeLinear → a 1x1 ConvInteger of int8 weights → scaled to float → output (a dynamically
    quantized convolution as onnxruntime's quantize_dynamic writes it)."""
    rng = np.random.default_rng(5)
    constants: dict[str, np.ndarray] = {"w": rng.integers(-100, 100, (4, 3, 1, 1)).astype(np.uint8),
                                        "ws": np.asarray(0.02, np.float32)}
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="quantize_x"),
             helper.make_node("ConvInteger", ["xq", "w", "xz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "dq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])],
                              [numpy_helper.from_array(v, k) for k, v in constants.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_dynamic_quantizer_is_judged_with_kernorch_own_scale() -> None:
    """DynamicQuantizeLinear: kernorch one step off at an element that is no tie is wrong; the same element moved
    in onnxruntime's run is onnxruntime's (its scale, zero point and integers given to the re-run)."""
    proto = _dynamic_model()
    model = _Model(proto)
    feeds = {"x": np.random.default_rng(6).uniform(-3, 5, (1, 3, 5, 5)).astype(np.float32)}
    exact = feeds["x"].astype(np.float64) / ((5 + 3) / 255)  # about: the element chosen must be no tie
    element = int(np.argmin(np.abs(np.abs(exact.reshape(-1) % 1 - 0.5) - 0.25)))

    def moved(proto: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "xq" in inputs:
            return _ort(proto, inputs)
        first = _ort(model.cut(), inputs)
        first["xq"] = first["xq"].copy()
        first["xq"].reshape(-1)[element] += 1
        given = {name: first[name] for name in ("xq", "xs", "xz")}
        return {**_ort(model.cut(given), {**inputs, **given}), **given}

    theirs = arbitrate(proto, feeds, {"y": _ort(proto, feeds)["y"]}, 1e-3, _ort, moved, worst_relative)
    assert theirs.explained, theirs.lines()
    assert (theirs.divergences[0].differing, theirs.divergences[0].exact) == (1, 1)
    assert "scale" in theirs.divergences[0].example
    wrong = arbitrate(proto, feeds, {"y": moved(model.cut(), feeds)["y"]}, 1e-3, moved, _ort, worst_relative)
    assert not wrong.explained and wrong.divergences[0].exact == 0

    def scaled(proto: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A scale 1e-3 off: its integers as onnxruntime's, its scale not (max - min) / 255."""
        if "xq" in inputs:
            return _ort(proto, inputs)
        first = _ort(model.cut(), inputs)
        given = {"xq": first["xq"], "xs": np.asarray(first["xs"] * np.float32(1 + 1e-3), np.float32), "xz": first["xz"]}
        return {**_ort(model.cut(given), {**inputs, **given}), **given}

    off = arbitrate(proto, feeds, {"y": scaled(model.cut(), feeds)["y"]}, 1e-3, scaled, _ort, worst_relative)
    assert not off.explained and "1 WRONG" in off.divergences[0].describe()


def test_outputs_apart_after_the_last_quantizer_are_judged_exactly() -> None:
    """Every quantizer agrees, yet onnxruntime's outputs stay apart (its byte products saturate without VNNI): the
    operators after the quantizers are evaluated in float64 from kernorch's integers, and they decide."""
    proto = _dynamic_model()
    feeds = {"x": np.random.default_rng(6).uniform(-3, 5, (1, 3, 5, 5)).astype(np.float32)}

    def off(proto: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {**(run := _ort(proto, inputs)), "y": run["y"] * np.float32(1.1)}  # a product 10% off

    right = arbitrate(proto, feeds, _ort(proto, feeds), 1e-3, _ort, off, worst_relative)
    assert right.remaining is not None and right.remaining > 5e-2 and not right.divergences
    assert right.exact_remaining is not None and right.exact_remaining < 1e-6 and right.explained
    assert "evaluated exactly" in "\n".join(right.lines())
    wrong = arbitrate(proto, feeds, off(proto, feeds), 1e-3, off, _ort, worst_relative)
    assert wrong.exact_remaining is not None and wrong.exact_remaining > 5e-2 and not wrong.explained


def _channels_last_dynamic_model() -> onnx.ModelProto:
    """x → a float convolution → DynamicQuantizeLinear → ConvInteger → scaled to float: laid out channels-last, the
    quantizer's integers are stored in that order (the layout stage's transpose under their own name)."""
    rng = np.random.default_rng(8)
    constants: dict[str, np.ndarray] = {"wf": rng.normal(0, 0.5, (6, 3, 3, 3)).astype(np.float32),
                                        "w": rng.integers(-60, 60, (5, 6, 1, 1)).astype(np.int8),
                                        "ws": np.asarray(0.02, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "wf"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("DynamicQuantizeLinear", ["c"], ["cq", "cs", "cz"], name="quantize_c"),
             helper.make_node("ConvInteger", ["cq", "w", "cz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["cs", "ws"], ["s"]), helper.make_node("Mul", ["accf", "s"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "dq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 6, 7])],
                              [numpy_helper.from_array(v, k) for k, v in constants.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_compiled_check_is_arbitrated_on_its_own_kernels(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """check --compiled's arbitration reads every quantizer's results from the checked plan's kernels (no second
    plan, whose other kernels may not share a fault), turned back from the layout they are stored in, and the
    plan's outputs are then the checked ones bit for bit."""
    import kernorch.tools.check as check
    from kernorch.fission import fission
    from kernorch.frontend import import_model
    from kernorch.pipeline import compile_plan, plan_graph

    proto = _channels_last_dynamic_model()
    options = Options(cost="analytic", layout="channels-last")
    graph = fission(import_model(proto))
    result = plan_graph(graph, options)
    assert result.layout_report is not None and any(len(set(layout)) > 1 and list(layout) != sorted(layout)
                                                    for layout in result.layout_report.layouts.values())  # fmt: skip
    planned: list[object] = []
    monkeypatch.setattr(check, "plan_graph", lambda *arguments, **options: planned.append(arguments))
    feeds = {"x": np.random.default_rng(9).normal(0, 1, (1, 3, 6, 7)).astype(np.float32)}
    cut = _Model(proto).cut()
    mine = check._kernorch_run(cut, feeds, None, options, (graph, result))
    assert not planned
    theirs = _ort(cut, feeds)
    assert mine["cq"].shape == theirs["cq"].shape == (1, 6, 6, 7)
    assert np.count_nonzero(mine["cq"] != theirs["cq"]) <= 2 and mine["cz"] == theirs["cz"]
    np.testing.assert_allclose(mine["cs"], theirs["cs"], rtol=1e-5)  # the float convolution's sums: an ulp apart
    np.testing.assert_array_equal(mine["y"], compile_plan(result, options).run(feeds)["y"])


def test_a_quantizer_after_a_float_residual_waits_for_everything_before_it() -> None:
    """What a quantizer is computed from reaches back through float operators to every quantizer behind them."""
    model = _Model(_model())
    upstream = model.upstream()
    assert upstream["c"] == frozenset({"xq"}) and upstream["xd"] == frozenset({"xq"})
    assert upstream["xq"] == frozenset()


def test_near_tie_bound() -> None:
    assert 0 < NEAR_TIE_STEPS <= 1e-2 and 0 < FLOAT_RTOL <= 1e-4


MUTANTS = [
    here("a near tie judged wrong", "tie = np.abs(fraction - 0.5) <= np.maximum(",
         "tie = np.abs(fraction - 0.5) < 0 * np.maximum("),
    here("every divergence a tie", "tie = np.abs(fraction - 0.5) <= np.maximum(",
         "tie = fraction == fraction + 0 * np.maximum("),
    here("a divergence judged before its inputs agree",
         "if name not in differing or upstream.get(quantizer.input[0], frozenset()) & differing:",
         "if name not in differing:"),
    here("the outputs not compared afterwards", "        return not self.reason and all(d.explained for d in "
         "self.divergences) and self.remaining is not None \\\n            and min(self.remaining, math.inf if "
         "self.exact_remaining is None else self.exact_remaining) <= self.rtol \\",
         "        return not self.reason and all(d.explained for d in self.divergences) \\"),
    here("a dynamic quantizer's scale taken as right",
         "    scale_right = abs(scale - exact_scale) <= FLOAT_RTOL * exact_scale",
         "    scale_right = True"),
    here("a stored value read in the axis order the layout stage stored it in",
         "return outputs[value] if layout is None else np.transpose(outputs[value], np.argsort(layout))",
         "return outputs[value]", file="kernorch/tools/check.py"),
    here("the outputs after the last quantizer judged against onnxruntime's again",
         "{n: mine[n] for n in outputs}, {n: exact.of(n) for n in outputs})",
         "{n: mine[n] for n in outputs}, {n: theirs[n] for n in outputs})"),
    here("the checked outputs not held to the interpreter's",
         "<= self.rtol \\\n            and self.plan_error <= self.rtol", "<= self.rtol"),
]  # fmt: skip
