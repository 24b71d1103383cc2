"""The layout decision timed end to end: the faster plan measured is kept (beyond the margin), one computing other
outputs never is, plans predicted far apart or without a measuring cost model are not timed, and plan_graph
times them only where its cost model measures on this machine."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kernorch.cost import DEVICE_PRESETS, AnalyticCostModel
from kernorch.cost.model import GeneratableCost
from kernorch.devtools.mutate import here
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.options import Options
from kernorch.orchestrate import OrchestrationResult
from kernorch.pipeline import SILENT, _orchestrate_in_layout, compile_plan, plan_graph
from kernorch.runtime.feeds import seeded_feeds
from kernorch.tools.check import run_onnxruntime
from kernorch.tools.demo_models import conv_norm_act_block
from kernorch.validate import layouts, validate_test
from kernorch.validate import plans as validate

COST = GeneratableCost(AnalyticCostModel(DEVICE_PRESETS["cpu-nominal"]))


def _both_layouts() -> tuple[OrchestrationResult, OrchestrationResult]:
    """The block orchestrated row-major (the 0-1 program's choice for it) and channels-last everywhere."""
    graph = fission(import_model(conv_norm_act_block()))
    options = Options(cost="analytic")
    return (_orchestrate_in_layout(graph, "nchw", options, COST, SILENT),
            _orchestrate_in_layout(graph, "channels-last", options, COST, SILENT))  # fmt: skip


class _FakeModel(validate_test._FakeModel):
    """validate_test's stand-in for a compiled plan, its latency and output offset set by its graph (each layout's
    plan has a graph of its own), and the graphs compiled recorded."""

    behaviour: dict[int, tuple[float, float]] = {}  # type: ignore[assignment]  # id of the plan's graph -> (s, offset)
    built: list[int] = []

    def __init__(self, graph: Any, *_: Any, **__: Any) -> None:
        self.seconds, self.offset = self.behaviour[id(graph)]
        self.outputs = list(graph.outputs)
        self.built.append(id(graph))


@pytest.mark.serial  # timed plans 5 % apart: alone, not beside the parallel test workers
@pytest.mark.parametrize(("nchw", "last", "kept"), [
    ((2e-3, 0.0), (1e-3, 0.0), "channels-last"),  # predicted dearer, measured faster: kept
    ((1e-3, 0.0), (2e-3, 0.0), "nchw"),  # predicted cheaper and faster
    ((1e-3, 0.0), (0.995e-3, 0.0), "nchw"),  # within the margin: the cheaper prediction stays
    ((2e-3, 0.0), (1e-3, 0.5), "nchw"),  # the faster computes other outputs: never kept
])  # fmt: skip
def test_the_layout_measured_faster_is_kept(nchw: tuple[float, float], last: tuple[float, float], kept: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    row_major, channels_last = _both_layouts()
    assert row_major.plan.cost < channels_last.plan.cost <= row_major.plan.cost * layouts.BAND
    monkeypatch.setattr(_FakeModel, "behaviour", {id(row_major.plan.graph): nchw, id(channels_last.plan.graph): last})
    monkeypatch.setattr(validate, "CompiledModel", _FakeModel)
    chosen = layouts.choose_layout(row_major, channels_last, layouts.Timing(threads=2))
    assert chosen is (channels_last if kept == "channels-last" else row_major)
    note = chosen.layout_report.note
    verdict = "channels-last everywhere" if kept == "channels-last" else "the 0-1 program's assignment"
    assert note.startswith(verdict) and "predicted; measured" in note, note
    assert ("outputs differ" in note) == (last[1] != 0.0), note


def test_plans_are_not_timed_without_a_measuring_model_or_predicted_far_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    row_major, channels_last = _both_layouts()
    monkeypatch.setattr(_FakeModel, "behaviour", {id(row_major.plan.graph): (2e-3, 0.0),
                                                  id(channels_last.plan.graph): (1e-4, 0.0)})  # fmt: skip
    monkeypatch.setattr(_FakeModel, "built", [])
    monkeypatch.setattr(validate, "CompiledModel", _FakeModel)
    assert layouts.choose_layout(row_major, channels_last, None) is row_major  # the cheaper prediction
    monkeypatch.setattr(layouts, "BAND", channels_last.plan.cost / row_major.plan.cost * 0.99)
    kept = layouts.choose_layout(row_major, channels_last, layouts.Timing(threads=2))
    assert kept is row_major and _FakeModel.built == [] and "measured" not in kept.layout_report.note


def test_plan_graph_times_the_layouts_where_its_cost_model_measures(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[layouts.Timing | None] = []

    def recording(first: OrchestrationResult, second: OrchestrationResult,
                  timing: layouts.Timing | None) -> OrchestrationResult:  # fmt: skip
        seen.append(timing)
        return first

    class Measuring(GeneratableCost):
        measures = True

    import kernorch.pipeline as pipeline

    monkeypatch.setattr(pipeline, "choose_layout", recording)
    graph = fission(import_model(conv_norm_act_block()))
    plan_graph(graph, Options(cost="analytic"), cost_model=COST)
    plan_graph(graph, Options(cost="analytic", threads=1, runtime="rprogram"),
               cost_model=Measuring(AnalyticCostModel(DEVICE_PRESETS["cpu-nominal"])))  # fmt: skip
    assert seen == [None, layouts.Timing(threads=1, runtime="rprogram")]


def test_the_layout_kept_by_timing_runs_like_onnxruntime(tmp_path: Any) -> None:
    """Real plans, compiled and timed: whichever is kept computes the model's outputs."""
    model = conv_norm_act_block()
    row_major, channels_last = _both_layouts()
    chosen = layouts.choose_layout(row_major, channels_last, layouts.Timing(threads=2, cache_dir=tmp_path))
    assert "measured" in chosen.layout_report.note and "differ" not in chosen.layout_report.note
    options = Options(cost="analytic", cache_dir=tmp_path)
    compiled = compile_plan(chosen, options)
    feeds = seeded_feeds({name: chosen.plan.graph.types[name] for name in chosen.plan.graph.inputs})
    expected = run_onnxruntime(model, feeds)
    for name, value in compiled.run(feeds).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-4)


# The mutants of the code this file tests (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the margin protects the cheaper prediction",
         "if second < first * (1 - MARGIN):",
         "if second < first:",
         file="kernorch/validate/layouts.py"),
    here("plans predicted far apart are not timed",
         "if timing is not None and dearer.plan.cost <= cheaper.plan.cost * BAND:",
         "if timing is not None:",
         file="kernorch/validate/layouts.py"),
    here("only a measuring cost model's plans are timed",
         'if cost_model.measures and options.device == "cpu" else None',
         'if options.device == "cpu" else None',
         file="kernorch/pipeline.py"),
]  # fmt: skip
