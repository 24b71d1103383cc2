"""The benchmark harness on a small built-in model: every contender runs in its own process, outputs are
checked before timing, the JSON has the documented keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernorch.cli import main
from kernorch.tools.bench import openvino_available, unfused_plan
from kernorch.tools.demo_models import conv_norm_act_block


def test_bench_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "block.onnx"
    model.write_bytes(conv_norm_act_block(channels=8, size=16).SerializeToString())
    assert main(["bench", str(model), "--runs", "4", "--cost", "analytic", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"model", "contenders", "speedup_vs_best_peer"} <= set(report)
    peers = {"onnxruntime", "openvino"} if openvino_available() else {"onnxruntime"}
    kernorch = {"kernorch", "kernorch-norewrite", "kernorch-greedy", "kernorch-unfused", "kernorch-rprogram"}
    assert set(report["contenders"]) == peers | {"onnxruntime-noopt"} | kernorch
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


def test_unfused_plan_is_one_kernel_per_primitive() -> None:
    from kernorch.options import Options
    from kernorch.pipeline import plan_model

    result = plan_model(conv_norm_act_block(channels=4, size=8), options=Options(cost="analytic"))
    plan = unfused_plan(result)
    assert [k.nodes for k in plan.kernels] == [(i,) for i in range(len(result.plan.graph.nodes))]
