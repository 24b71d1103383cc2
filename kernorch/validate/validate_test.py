"""Whole-plan validation: the next-best plans are distinct and no cheaper than the optimum, the fastest plan
measured is kept (unless within the margin), one computing other outputs never is, and the choice is recorded in
the saved plan and shown by the CLI."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernorch.cost import DEVICE_PRESETS, AnalyticCostModel
from kernorch.cost.model import GeneratableCost
from kernorch.devtools.mutate import here
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.ir.plan import validate_plan
from kernorch.options import Options
from kernorch.orchestrate import orchestrate
from kernorch.pipeline import compile_plan, plan_graph
from kernorch.runtime.feeds import seeded_feeds
from kernorch.tools.check import run_onnxruntime
from kernorch.tools.demo_models import conv_norm_act_block, self_attention_block
from kernorch.validate import plans as validate

COST = GeneratableCost(AnalyticCostModel(DEVICE_PRESETS["cpu-nominal"]))


def test_next_best_plans_are_distinct_valid_and_no_cheaper_than_the_optimum() -> None:
    graph = fission(import_model(self_attention_block()))
    result = orchestrate(graph, COST, alternatives=3)
    assert len(result.alternatives) == 3
    plans = [result.plan, *result.alternatives]
    costs = [p.cost for p in plans]
    assert costs == sorted(costs), costs
    kernel_sets = {frozenset(k.key for k in p.kernels) for p in plans}
    assert len(kernel_sets) == len(plans), "each plan is another selection of kernels"
    for plan in plans:
        validate_plan(graph, plan.kernels)
    assert orchestrate(graph, COST).alternatives == []  # none unless asked


class _FakeModel:
    """Stands in for a compiled plan: its latency and outputs are set per plan (by its kernels)."""

    behaviour: dict[frozenset[Any], tuple[float, float]] = {}  # kernel keys -> (seconds per run, output offset)

    def __init__(self, graph: Any, kernels: list[Any], *_: Any, **__: Any) -> None:
        self.seconds, self.offset = self.behaviour[frozenset(k.key for k in kernels)]
        self.outputs = list(graph.outputs)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        deadline = time.perf_counter() + self.seconds
        while time.perf_counter() < deadline:
            pass
        return {name: np.full(4, 1.0 + self.offset, np.float32) for name in self.outputs}


@pytest.mark.serial  # timed plans 0.5 % apart: alone, not beside the parallel test workers
@pytest.mark.parametrize(("latencies", "offsets", "kept"), [
    ((2e-3, 0.5e-3, 1e-3), (0.0, 0.0, 0.0), 1),  # the fastest, not the next cheapest by cost
    ((1e-3, 0.995e-3, 2e-3), (0.0, 0.0, 0.0), 0),  # within the margin: the optimum stays
    ((2e-3, 0.2e-3, 1e-3), (0.0, 0.5, 0.0), 2),  # the fastest computes other outputs: never kept
])  # fmt: skip
def test_the_fastest_plan_measured_is_kept(latencies: tuple[float, ...], offsets: tuple[float, ...], kept: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    graph = fission(import_model(self_attention_block()))
    result = orchestrate(graph, COST, alternatives=2)
    plans = [result.plan, *result.alternatives]
    keys = [frozenset(k.key for k in p.kernels) for p in plans]
    monkeypatch.setattr(_FakeModel, "behaviour", {key: (t, o) for key, t, o in zip(keys, latencies, offsets,
                                                                                   strict=True)})  # fmt: skip
    monkeypatch.setattr(validate, "CompiledModel", _FakeModel)
    chosen = plans[kept]
    validated = validate.validate_plans(result, threads=2)
    assert validated.plan is chosen
    report = validated.validation
    assert report.chosen == kept and len(report.plans) == 3
    assert (report.plans[2].measured_ms is None) == (offsets[2] != 0.0) and (report.plans[1].measured_ms is None) \
        == (offsets[1] != 0.0)  # fmt: skip
    assert report.seconds > 0 and "validation: 3 plans" in report.summary()
    saved = json.loads(json.dumps(report.to_json()))
    assert validate.ValidationReport.from_json(saved).to_json() == saved


def test_a_validated_plan_runs_like_onnxruntime_and_records_the_choice(tmp_path: Path) -> None:
    model = conv_norm_act_block()
    options = Options(cost="analytic", validate=3, cache_dir=tmp_path / "cache")
    result = plan_graph(fission(import_model(model)), options)
    report = result.validation
    assert report is not None and [p.source for p in report.plans] == ["optimum", "next best 1", "next best 2",
                                                                        "greedy fusion"]  # fmt: skip
    assert all(p.measured_ms is not None and p.measured_ms > 0 for p in report.plans)
    compiled = compile_plan(result, options)
    feeds = seeded_feeds({name: result.plan.graph.types[name] for name in result.plan.graph.inputs})
    expected = run_onnxruntime(model, feeds)
    for name, value in compiled.run(feeds).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-4)
    saved = compiled.save(tmp_path / "plan")
    metadata = json.loads((saved / "plan.json").read_text())["metadata"]
    assert metadata["validation"]["chosen"] == report.chosen


def test_validate_is_refused_where_it_cannot_measure() -> None:
    from kernorch.errors import KernorchError

    with pytest.raises(KernorchError, match="validate"):
        Options(validate=0)
    with pytest.raises(KernorchError, match="not validated"):
        Options(validate=2, cost="analytic", device="a100")
    with pytest.raises(KernorchError, match="validate"):
        Options(validate=True)


def test_bf16_plans_agree_within_their_rounding_and_no_further() -> None:
    """Two bf16 plans round different values (one fuses the attention in float32, another casts elsewhere): 1 % of
    the output's magnitude apart is the same answer for them, not for float32 plans; half of it is a wrong plan."""
    want = {"y": np.linspace(-3, 3, 60, dtype=np.float32).reshape(3, 20)}
    close = {"y": want["y"] + np.float32(0.03)}  # 1 % of the magnitude 3
    wrong = {"y": want["y"] + np.float32(1.5)}
    assert not validate._same_outputs(want, close) and validate._same_outputs(want, close, bf16=True)
    assert not validate._same_outputs(want, wrong) and not validate._same_outputs(want, wrong, bf16=True)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("validation holds bf16 plans to float32 agreement",
         "BF16_AGREEMENT = 4e-2",
         "BF16_AGREEMENT = 1e-4",
         file="kernorch/validate/plans.py"),
]  # fmt: skip
