"""The candidate compile check compiles what the orchestrator enumerates and names a kernel that does not
compile (or does not render), without losing the others of its translation unit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import kernorch.devtools.compile_candidates as check
from kernorch.cost.analytic import AnalyticCostModel, device_by_name
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.types import TensorType
from kernorch.tools.demo_models import conv_norm_act_block


def _candidates() -> list[CandidateKernel]:
    """relu(x + 1) and the row sums of x: two C kernels."""
    graph = Graph(inputs=["x"], outputs=[])
    graph.types["x"] = TensorType((8, 64), "float32")
    b = PrimitiveBuilder(graph)
    (shifted,) = b.emit("add", ["x", b.constant(np.array(1.0, np.float32))])
    (relu,) = b.emit("relu", [shifted])
    (sums,) = b.emit("reduce_sum", ["x"], {"axes": (1,), "keepdims": True})
    graph.outputs = [relu, sums]
    by_output = {out: i for i, node in enumerate(graph.nodes) for out in node.outputs}
    return [make_kernel(graph, (by_output[shifted], by_output[relu]), (relu,)),
            make_kernel(graph, (by_output[sums],), (sums,))]  # fmt: skip


def _compiling(tmp_path: Path) -> check.CompilingCost:
    return check.CompilingCost(AnalyticCostModel(device_by_name("cpu", tmp_path, 2)), tmp_path)


def test_a_kernel_that_does_not_compile_is_named_and_the_rest_still_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    render = check.render_plan

    def broken_for_sums(prefix: str, kernels: list[CandidateKernel], *args: Any, **kwargs: Any) -> Any:
        plan = render(prefix, kernels, *args, **kwargs)
        return replace(plan, body=plan.body + "\nint broken( {") if "reduce_sum" in kernels[0].describe() else plan

    monkeypatch.setattr(check, "render_plan", broken_for_sums)
    compiling = _compiling(tmp_path)
    compiling.prepare(_candidates())
    compiling.prepare(_candidates())  # seen already: not compiled twice
    compiling.compile_all()
    assert compiling.compiled == 2
    assert [f.kernel for f in compiling.failures] == [_candidates()[1].describe()]
    assert "error" in compiling.failures[0].error


def test_a_renderer_that_raises_is_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def raising(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no rendering")

    monkeypatch.setattr(check, "render_plan", raising)
    compiling = _compiling(tmp_path)
    compiling.prepare(_candidates())
    compiling.compile_all()
    assert len(compiling.failures) == 2 and all("rendering failed" in f.error for f in compiling.failures)


def test_a_kernel_whose_output_differs_from_the_reference_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernorch.cost import verify

    reference = verify.run_reference

    def off_for_sums(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = reference(graph, feeds)
        return {name: v * 1.001 if "reduce_sum" in name else v for name, v in values.items()}

    monkeypatch.setattr(verify, "run_reference", off_for_sums)
    compiling = check.CompilingCost(AnalyticCostModel(device_by_name("cpu", tmp_path, 2)), tmp_path, run=True)
    compiling.prepare(_candidates())
    compiling.compile_all()
    assert [f.kernel for f in compiling.failures] == [_candidates()[1].describe()]
    assert "differs from the reference" in compiling.failures[0].error


def test_every_candidate_of_a_small_model_compiles_and_matches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "block.onnx"
    onnx.save(conv_norm_act_block(channels=4, size=8), model)
    assert check.main([str(model), "--layout", "channels-last", "--run"]) == 0
    out = capsys.readouterr().out
    summary = next(line for line in out.splitlines() if "kernels compiled" in line)
    compiled = int(summary.split(": ")[1].split(" kernels")[0])
    assert compiled > 10 and " 0 failed" in summary and "planning" in out, out
