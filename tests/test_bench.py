"""The benchmark harness on a small built-in model: every contender runs in its own process, outputs are
checked before timing, the JSON has the documented keys."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernorch.cli import main
from kernorch.devtools.mutate import here
from kernorch.precision import bf16_supported
from kernorch.tools.bench import bench_ceiling, format_report, openvino_available, roofline_bound, unfused_plan
from kernorch.tools.demo_models import conv_norm_act_block


def test_bench_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "block.onnx"
    model.write_bytes(conv_norm_act_block(channels=8, size=16).SerializeToString())
    assert main(["bench", str(model), "--runs", "4", "--cost", "analytic", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"model", "contenders", "speedup_vs_best_peer"} <= set(report)
    peers = {"onnxruntime", "openvino"} if openvino_available() else {"onnxruntime"}
    kernorch = {"kernorch", "kernorch-norewrite", "kernorch-greedy", "kernorch-unfused", "kernorch-rprogram"}
    others = {"onnxruntime-noopt"} | ({"openvino-default"} if openvino_available() else set())
    assert set(report["contenders"]) == peers | others | kernorch
    for name, result in report["contenders"].items():  # each one's error against onnxruntime, within its tolerance
        assert 0 <= result["rel_err"] <= (2e-2 if name == "openvino-default" else 1e-4), (name, result)
    # the same plan as an rProgram: its candidates were measured, the simulator predicted it
    rprogram = report["rprogram"]
    assert rprogram["measured_ms"] == report["contenders"]["kernorch-rprogram"]["median_ms"]
    assert rprogram["predicted_ms"] > 0 and "rTasks on 2 vEUs" in rprogram["program"]
    assert rprogram["choice"] in rprogram["candidates_ms"]
    for result in report["contenders"].values():
        assert 0 < result["min_ms"] <= result["median_ms"] <= result["max_ms"]
    best_peer = min(report["contenders"][p]["median_ms"] for p in peers)  # onnxruntime-noopt is not a peer
    assert report["best_peer"] in peers
    assert report["speedup_vs_best_peer"] == pytest.approx(best_peer / report["contenders"]["kernorch"]["median_ms"])
    assert report["primitives"]["fissioned"] == 25
    assert report["kernels"]["kernorch-unfused"] == report["primitives"]["rewritten"]  # one kernel per primitive
    assert report["rewrites"]["fired"] and report["primitives"]["rewritten"] < 25
    assert report["roofline"]["bound_ms"] > 0


@pytest.mark.skipif(not bf16_supported(), reason="this CPU has no bfloat16 instructions")
def test_bench_in_bf16_compares_with_what_users_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kernorch.tools.demo_models import self_attention_block

    model = tmp_path / "attention.onnx"
    model.write_bytes(self_attention_block(seq=64, hidden=128, heads=4).SerializeToString())
    assert main(["bench", str(model), "--quick", "--runs", "4", "--cost", "analytic", "--precision", "bf16",
                 "--breakdown", "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    text = "\n".join(format_report(report))
    assert "precision bf16" in text and "rel err" in text and "no bf16 path" in text and "breakdown:" in text
    # where the plan's time goes: every kernel counted once, linear ones with their flops
    rows = {row["kind"]: row for row in report["breakdown"]["rows"]}
    assert sum(row["kernels"] for row in rows.values()) == report["kernels"]["kernorch"]
    linear = [row for kind, row in rows.items() if kind.startswith("linear")]
    assert linear and all(row["flops"] > 0 and row["seconds"] > 0 for row in linear)
    assert report["breakdown"]["total_ms"] > 0
    listed = report["breakdown"]["linear_kernels"]  # each linear kernel with its rate against the fp32 peak
    assert len(listed) == sum(row["kernels"] for row in linear) and all(e["of_fp32_peak"] > 0 for e in listed)
    assert all(e["bound"] in ("compute", "memory") and e["of_roofline"] > 0 for e in listed)
    assert all(0 < row["roof_seconds"] for row in linear) and "roofline" in text
    assert "slowest linear kernels" in text
    roof = report["roofline"]  # the quick report holds the best peer against the graph's floor too
    assert roof["floor_ms"] == max(roof["compute_floor_ms"], roof["memory_floor_ms"]) > 0
    assert f"runs at {bench_ceiling(report):.2f}x it" in text
    peers = {"onnxruntime", "openvino-default"} if openvino_available() else {"onnxruntime"}
    assert report["precision"] == "bf16" and report["best_peer"] in peers
    assert set(report["contenders"]) >= peers | {"kernorch"}
    assert report["contenders"]["kernorch"]["rel_err"] <= 2e-2
    assert report["contenders"]["onnxruntime"]["rel_err"] == 0.0


def test_unfused_plan_is_one_kernel_per_primitive() -> None:
    from kernorch.options import Options
    from kernorch.pipeline import plan_model

    result = plan_model(conv_norm_act_block(channels=4, size=8), options=Options(cost="analytic"))
    plan = unfused_plan(result)
    assert [k.nodes for k in plan.kernels] == [(i,) for i in range(len(result.plan.graph.nodes))]


def test_each_slice_is_timed_after_its_warm_up_runs() -> None:
    """A slice of timed runs starts only after WARM_UP_SECONDS of untimed ones (the machine waking up from the
    cool-down pause is not what is compared); the samples are the timed runs only."""
    import time

    from kernorch.tools.bench import WARM_UP_SECONDS, _timing_loop

    calls: list[float] = []

    def run() -> dict[str, object]:
        calls.append(time.perf_counter())
        time.sleep(0.001)
        return {}

    class Connection:  # the parent's side of the pipe: one slice of 3 runs, then stop
        def __init__(self) -> None:
            self.commands: list[tuple[str, int]] = [("run", 3), ("stop", 0)]
            self.sent: list[list[float]] = []

        def recv(self) -> tuple[str, int]:
            return self.commands.pop(0)

        def send(self, value: list[float]) -> None:
            self.sent.append(value)

    connection = Connection()
    _timing_loop(connection, run, {})  # type: ignore[arg-type]
    (samples,) = connection.sent
    # each sample is one run (a 1 ms sleep); the bound only catches a sample that is not (a loaded 2-core CI
    # machine once stalled a 1 ms sleep for 57 ms: 0.05 was too tight to be a fact)
    assert len(samples) == 3 and all(0.001 <= s < 1.0 for s in samples)
    warm = calls[:-3]
    assert warm and calls[-3] - calls[0] >= WARM_UP_SECONDS


QUANTIZED_STEPS = "tests/test_bench.py::test_a_quantized_model_is_checked_and_benched_in_quantization_steps"


def test_quantize_reports_a_model_the_tool_fails_on_and_keeps_going_when_asked(tmp_path: Path) -> None:
    """bench/quantize.py over a model onnxruntime's tool cannot read: a line naming it, exit 1; with --keep-going
    (make sanitize) exit 0, the other models' files written."""
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    good = tmp_path / "block.onnx"
    good.write_bytes(conv_norm_act_block().SerializeToString())
    script = Path(__file__).parents[1] / "bench" / "quantize.py"
    for flags, code in (([], 1), (["--keep-going"], 0)):
        run = subprocess.run([sys.executable, str(script), str(broken), str(good), "-o", str(tmp_path / "q"),
                              "--kind", "dynamic", *flags], capture_output=True, text=True, timeout=300)  # fmt: skip
        assert run.returncode == code, run.stdout + run.stderr
        assert "broken.onnx: onnxruntime's quantization failed" in run.stdout, run.stdout
        assert (tmp_path / "q" / "block.dynamic.onnx").exists()


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
ROOFLINE_FLOOR = "tests/test_bench.py::test_the_roofline_floor_is_the_larger_of_compute_and_memory"
MUTANTS = [
    here("the roofline prices bf16 products at the float32 peak",
         "(float_rate or device.peak_flops * (BF16_RATE if bf16 else 1.0))", "(float_rate or device.peak_flops)",
         file="kernorch/tools/bench.py", tests=(ROOFLINE_FLOOR,)),
    here("the roofline's floor is the sum of its compute and memory floors",
         '"floor_ms": max(compute_ms, memory_ms)', '"floor_ms": compute_ms + memory_ms',
         file="kernorch/tools/bench.py", tests=(ROOFLINE_FLOOR,)),
    here("a quantized model is held to float32's tolerance",
         "    if quantized_model:\n        return QUANTIZED_RTOL\n    return BF16_RTOL",
         "    return BF16_RTOL",
         file="kernorch/tools/check.py", tests=(QUANTIZED_STEPS,)),
    here("the bench times a slice right after the cool-down pause, without its warm-up runs",
         "        while time.perf_counter() < warm_until:\n            run()\n",
         "",
         file="kernorch/tools/bench.py"),
    here("a peer that cannot load the model stops the bench",
         'if name not in (*PEERS, THROUGHPUT_PEER) or name == BEST_PEERS[0]:', "if True:",
         file="kernorch/tools/bench.py",
         tests=("tests/test_bench.py::test_a_peer_that_cannot_run_the_model_is_left_out_and_said_so",)),
]  # fmt: skip


def test_a_quantized_model_is_checked_and_benched_in_quantization_steps() -> None:
    """A model holding quantization operators agrees with onnxruntime within a few quantization steps (float32
    ulps before a quantizer move values across a step), in check as in bench; a float model keeps 1e-4."""
    import numpy as np

    from kernorch.testing import single_op_model
    from kernorch.tools.bench import tolerance
    from kernorch.tools.check import DEFAULT_RTOL, QUANTIZED_RTOL, check_model, quantized

    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    dynamic = single_op_model("DynamicQuantizeLinear", {"x": x}, outputs=3)
    assert quantized(dynamic) and not quantized(conv_norm_act_block(channels=4, size=8))
    report, _ = check_model(dynamic, compiled=True)
    assert report.rtol == QUANTIZED_RTOL and report.passed and report.spread == 0.0  # onnxruntime's runs agree
    report, _ = check_model(conv_norm_act_block(channels=4, size=8))
    assert report.rtol == DEFAULT_RTOL
    assert tolerance("kernorch", "fp32", quantized_model=True) == QUANTIZED_RTOL  # no spread: the fixed tolerance
    assert tolerance("kernorch", "fp32") == DEFAULT_RTOL


@pytest.mark.skipif(not openvino_available(), reason="OpenVINO is not installed")
def test_a_peer_that_cannot_run_the_model_is_left_out_and_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """OpenVINO loads no QLinearGlobalAveragePool or QGemm (every QOperator CNN file has one): the bench times the
    others and warns in one line (it exited with OpenVINO's error before)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    scalars = [numpy_helper.from_array(np.asarray(value, dtype), name) for name, value, dtype in (
        ("s", 0.05, np.float32), ("z", 128, np.uint8), ("sy", 0.1, np.float32), ("zy", 100, np.uint8))]  # fmt: skip
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "s", "z", "sy", "zy"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "qpool", [helper.make_tensor_value_info("x", TensorProto.UINT8, (1, 4, 5, 5))],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, (1, 4, 1, 1))], scalars)
    model = tmp_path / "qpool.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                              helper.make_opsetid("com.microsoft", 1)],
                                        ir_version=8).SerializeToString())  # fmt: skip
    assert main(["bench", str(model), "--quick", "--runs", "4", "--cost", "analytic", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert set(report["contenders"]) == {"onnxruntime", "kernorch"} and report["best_peer"] == "onnxruntime"
    assert "kernorch: warning: openvino" in captured.err and "left out of the timing" in captured.err
    assert "QLinearGlobalAveragePool" in captured.err  # the cause, not the location OpenVINO starts with


def test_a_quantized_model_is_timed_beside_kernorchs_plan_of_its_float_original(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--float-model`: kernorch's plan of the float original runs beside the quantized one (what quantizing gained
    kernorch), held to the float model's onnxruntime outputs; every contender's error against those is reported."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import quantize_dynamic

    from kernorch.tools.bench import KERNORCH_FLOAT

    weights = numpy_helper.from_array(np.random.default_rng(1).standard_normal((64, 48)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "product",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (16, 64))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (16, 48))], [weights])  # fmt: skip
    original, quantized = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    original.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                           ir_version=8).SerializeToString())  # fmt: skip
    quantize_dynamic(str(original), str(quantized))
    assert main(["bench", str(quantized), "--quick", "--runs", "4", "--cost", "analytic", "--json",
                 "--float-model", str(original)]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert {"kernorch", KERNORCH_FLOAT} <= set(report["contenders"]) and report["kernels"][KERNORCH_FLOAT] >= 1
    floats = report["contenders"][KERNORCH_FLOAT]
    assert floats["rel_err"] == floats["fp32_err"] <= 1e-4  # the float plan against the float model
    assert 1e-4 < report["contenders"]["kernorch"]["fp32_err"] < 0.1  # the int8 plan: quantization's error
    assert any("the quantized plan runs" in line for line in format_report(report))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_roofline_floor_is_the_larger_of_compute_and_memory(precision: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """One matmul [64, 512] x [512, 256] on a machine of 100 GFLOP/s and 10 GB/s: its flops at the float32 peak, or
    in bf16 (where the CPU multiplies bfloat16) at twice it with the weights moved as two bytes each; the floor the
    larger of the two floors, the sum the full bench's bound; `float_rate` (an instruction peak) replaces the rate."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    import kernorch.cost.analytic as analytic
    import kernorch.machine
    from kernorch.options import Options
    from kernorch.pipeline import import_graph

    weights = numpy_helper.from_array(np.ones((512, 256), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (64, 512))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (64, 256))], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    monkeypatch.setattr(analytic, "calibrate_this_machine", lambda *_: analytic.DeviceSpec("test", 10e9, 100e9, 0.0))
    monkeypatch.setattr(kernorch.machine, "bf16_supported", lambda: True)
    roof = roofline_bound(import_graph(model, None, strict=True), Options(precision=precision))
    flops, rate = 2 * 64 * 512 * 256, 100e9 * (2 if precision == "bf16" else 1)
    moved = 64 * 512 * 4 + 512 * 256 * (2 if precision == "bf16" else 4) + 64 * 256 * 4
    assert roof["compute_floor_ms"] == pytest.approx(flops / rate * 1e3)
    assert roof["memory_floor_ms"] == pytest.approx(moved / 10e9 * 1e3)
    assert roof["floor_ms"] == max(roof["compute_floor_ms"], roof["memory_floor_ms"])
    assert roof["bound_ms"] == pytest.approx(roof["compute_floor_ms"] + roof["memory_floor_ms"])
    measured = roofline_bound(import_graph(model, None, strict=True), Options(precision=precision), float_rate=1e9)
    assert measured["compute_floor_ms"] == pytest.approx(flops / 1e9 * 1e3) == measured["floor_ms"]
    report = {"best_peer": "p", "contenders": {"p": {"median_ms": 3 * measured["floor_ms"]}}, "roofline": measured}
    assert bench_ceiling(report) == pytest.approx(3.0)
