"""Every shared model, rewritten with every rule (cost-guided ones included, unconditionally), matches
onnxruntime in the reference interpreter; it orchestrates to proven optimality, never worse than greedy;
its plan — run kernel by kernel with the reference primitives — computes what the primitive graph
computes; and the compiled plan (generated C + library calls) matches onnxruntime."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from kernorch.cli import main
from kernorch.cost import DEVICE_PRESETS, AnalyticCostModel
from kernorch.cost.model import GeneratableCost
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.orchestrate import orchestrate, validate_plan
from kernorch.pipeline import compile_plan
from kernorch.rewrite import REWRITE_RULES, apply_rules
from kernorch.runtime import run_plan_reference, run_reference
from kernorch.runtime.feeds import graph_feeds
from kernorch.tools.check import compare, run_onnxruntime

from .conftest import shared_models

MODELS = shared_models()
COST = GeneratableCost(AnalyticCostModel(DEVICE_PRESETS["v100"]))
# the slowest models (gpt2_mini 30 s, segformer_b0 29 s, vit_tiny 13 s, candy 12 s) run in `make test-slow`, which
# keeps `make test` under CI's 10 minutes: bert_mini, efficientnet_b0, efficientvit_b0, shufflenet_v2 and lstm_tc
# cover transformers, CNNs (auto layout included) and the LSTM scan in `make test`
SLOW = {"gpt2_mini", "vit_tiny", "segformer_b0", "candy"}


@pytest.mark.skipif(not MODELS, reason="../shared/models not present")
@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW else [])
                                  for p in MODELS])  # fmt: skip
def test_model_orchestrates_optimally(path: Path) -> None:
    model = import_model(path)
    fissioned = fission(model)
    graph, _ = apply_rules(fissioned, list(REWRITE_RULES.values()))
    feeds = graph_feeds(fissioned)
    expected_onnx = run_onnxruntime(model.proto, feeds)
    expected = run_reference(graph, feeds)
    assert max(e.relative for e in compare(expected, expected_onnx)) <= 1e-4
    result = orchestrate(graph, COST)
    assert result.all_optimal, [s.status for s in result.subgraphs]
    assert result.plan.cost <= result.greedy_plan.cost * (1 + 1e-9)
    for report in result.subgraphs:
        assert report.cost <= report.greedy_cost * (1 + 1e-9)
    validate_plan(graph, result.plan.kernels)
    for plan in (result.plan, result.greedy_plan):
        actual = run_plan_reference(graph, plan.kernels, feeds)
        for name, value in expected.items():
            np.testing.assert_array_equal(actual[name], value)
    compiled = compile_plan(result)
    errors = compare(compiled.run(feeds), expected_onnx)
    assert max(e.relative for e in errors) <= 1e-4, errors


def test_optimize_json_and_explain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kernorch.tools.demo_models import self_attention_block

    path = tmp_path / "attention.onnx"
    path.write_bytes(self_attention_block().SerializeToString())
    assert main(["optimize", str(path), "--device", "a100"]) == 2  # profile measures this machine only
    assert "--cost analytic" in capsys.readouterr().err
    assert main(["optimize", str(path), "--cost", "analytic", "--device", "a100", "--json", "--no-rewrite"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rewrites"] is None
    assert {"subgraphs", "plan_cost", "greedy_cost", "kernels"} <= set(report)
    assert set(report["subgraphs"][0]) >= {"primitives", "states", "candidates", "solve_seconds", "status"}
    assert all(s["status"] == "optimal" for s in report["subgraphs"])
    assert report["plan_cost"] <= report["greedy_cost"]
    assert sum(s["primitives"] for s in report["subgraphs"]) == 34
    covered = {n for k in report["kernels"] for n in k["nodes"]}
    assert covered == set(range(34))

    assert main(["optimize", str(path), "--cost", "analytic", "--device", "h100"]) == 0
    text = capsys.readouterr().out
    assert "plan cost" in text and "greedy fusion" in text and "optimal" in text

    assert main(["explain", str(path), "--cost", "analytic", "--device", "cpu-nominal", "--rejected", "3"]) == 0
    text = capsys.readouterr().out
    assert "kernel 0:" in text and "rejected candidates by rule" in text and "library call" in text
    assert "rewrites:" in text and "tried reduce-to-matmul" in text and "neighbourhood plan" in text

    # a generated kernel's GIR before and after the rules, and the C rendered from it; a bad index is refused
    kernels = re.findall(r"^kernel (\d+): .*\[(.*)\]$", text, flags=re.M)
    # (the softmax runs inside the fused attention kernel: the layer norm is the generated kernel with reductions)
    norm = next(int(k) for k, prims in kernels if "reduce_sum" in prims and "matmul" not in prims)
    assert main(["explain", str(path), "--cost", "analytic", "--device", "cpu-nominal", "--gir", str(norm)]) == 0
    text = capsys.readouterr().out
    assert f"kernel {norm} GIR as lowered" in text and "after the rewrite rules" in text
    assert "reduce reduce_sum" in text and "sqrtf(" in text and "rendered from the rewritten GIR" in text
    assert main(["explain", str(path), "--cost", "analytic", "--device", "cpu-nominal", "--gir", "999"]) == 2
    assert "--gir 999: the plan has kernels 0 to" in capsys.readouterr().err

    assert main(["optimize", str(path), "--cost", "analytic", "--device", "a100", "--json"]) == 0
    rewritten = json.loads(capsys.readouterr().out)
    assert rewritten["rewrites"]["trials"] and rewritten["rewrites"]["nodes_before"] == 34
    assert rewritten["plan_cost"] <= report["plan_cost"] * (1 + 1e-9)  # rewrites never worsen the plan here


def test_optimize_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\x00garbage")
    assert main(["optimize", str(path)]) == 2
    assert "not" in capsys.readouterr().err


def test_explain_names_the_dtypes_each_kernel_reads_and_writes(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A dynamically quantized convolution: the integer convolution reads the uint8 map (and its uint8 zero point)
    and writes int32 sums; the kernel quantizing the map writes uint8."""
    from kernorch.testing import dynamically_quantized_convolution, keep_integer_convolutions

    keep_integer_convolutions(monkeypatch)  # without VNNI it would be a float32 convolution

    path = tmp_path / "dq.onnx"
    path.write_bytes(dynamically_quantized_convolution().SerializeToString())
    assert main(["explain", str(path), "--cost", "analytic"]) == 0
    kernels = re.findall(r"^kernel \d+: .*\[(.*)\]\n.*\n.*\n    reads \d+ value\(s\) \[(.*)\], writes (.*)$",
                         capsys.readouterr().out, flags=re.M)  # fmt: skip
    convolution = [(reads, writes) for prims, reads, writes in kernels if "conv_integer" in prims.split(" → ")]
    assert len(convolution) == 1, kernels
    reads, writes = convolution[0]
    assert "uint8" in reads and "float32" not in reads and writes.endswith("(int32)"), convolution
    assert any("(uint8)" in writes for _, _, writes in kernels), kernels
