"""Planning on in-plan costs: each round measures a plan compiled here, the dispatch excess is shared out, every
new plan becomes an alternative, and the validated result still computes what onnxruntime does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernorch.cost import DEVICE_PRESETS, AnalyticCostModel
from kernorch.cost.model import GeneratableCost
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.ir.kernel import CandidateKernel
from kernorch.options import Options, OrchestrationLimits
from kernorch.orchestrate import orchestrate
from kernorch.runtime.compiled import CompiledModel
from kernorch.runtime.feeds import graph_feeds
from kernorch.tools.check import run_onnxruntime
from kernorch.tools.demo_models import conv_norm_act_block
from kernorch.validate import validate_plans
from kernorch.validate.in_plan import _without_dispatch, refine_in_plan


class _Signed(GeneratableCost):
    """An analytic cost model with a signature per kernel (the profiles' role in the pipeline)."""

    def signature_of(self, candidate: CandidateKernel) -> str | None:
        return repr(candidate.key)


def test_dispatch_excess_is_shared_out_per_kernel_that_ran_code() -> None:
    assert _without_dispatch([3.0, 0.0, 5.0], 6.0) == [2.0, 0.0, 4.0]
    assert _without_dispatch([3.0, 5.0], 9.0) == [3.0, 5.0]  # no excess: as measured
    assert _without_dispatch([1.0, 9.0], 2.0) == [0.5, 5.0]  # each keeps at least half its time


def test_refined_plans_are_measured_validated_and_correct(tmp_path: Path) -> None:
    model = conv_norm_act_block()
    graph = fission(import_model(model))
    cost = _Signed(AnalyticCostModel(DEVICE_PRESETS["cpu-nominal"]))
    result = orchestrate(graph, cost)
    feeds = graph_feeds(graph)
    refined = refine_in_plan(result, cost, OrchestrationLimits(), 2, feeds, threads=2, cache_dir=tmp_path)
    report = refined.in_plan
    assert report is not None and 1 <= len(report.rounds) <= 3
    assert len(refined.alternatives) == len(report.rounds) - 1
    assert refined.alternative_sources == [f"in place {i}" for i in range(1, len(report.rounds))]
    for row in report.rounds:
        assert row.measured_ms > 0 and row.in_plan_ms > 0 and row.isolated_ms > 0
        assert 0 <= row.error_after and "error" in report.summary()
    validated = validate_plans(refined, threads=2, cache_dir=tmp_path)
    compiled = CompiledModel(graph, validated.plan.kernels, validated.plan.costs, 2, cache_dir=tmp_path)
    expected = run_onnxruntime(model, feeds)
    for name, value in compiled.run(feeds).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-4)


def test_in_plan_is_refused_without_measured_profiles() -> None:
    from kernorch.errors import KernorchError

    with pytest.raises(KernorchError, match="in_plan"):
        Options(in_plan=1, cost="analytic", device="cpu-nominal")
    with pytest.raises(KernorchError, match="in_plan"):
        Options(in_plan=-1)


def test_in_plan_refuses_a_cost_model_without_signatures() -> None:
    from kernorch.errors import KernorchError
    from kernorch.pipeline import plan_graph

    graph = fission(import_model(conv_norm_act_block()))
    cost = GeneratableCost(AnalyticCostModel(DEVICE_PRESETS["cpu-nominal"]))
    with pytest.raises(KernorchError, match="profiled cost model"):
        plan_graph(graph, Options(in_plan=1, rewrite=False), cost_model=cost)


def test_the_former_name_in_place_is_still_accepted() -> None:
    """Renamed from in_place ("timed inside the running plan", read as buffer reuse): the API keyword, the CLI
    flag and a plan saved with the old field name keep working."""
    from kernorch.cli.parser import build_parser
    from kernorch.options import options_from_json

    assert Options().with_(in_place=2).in_plan == 2
    assert options_from_json({"in_place": 3}, None).in_plan == 3
    for flag in ("--in-plan", "--in-place"):
        assert build_parser().parse_args(["optimize", "m.onnx", flag, "1"]).in_plan == 1
