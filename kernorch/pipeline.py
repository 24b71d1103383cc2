"""The pipeline driver: the one path from a model to a compiled plan.

frontend → fission → rewrite → layout → orchestrate (with a cost model) → codegen + runtime. `kernorch.compile`,
`kernorch check`, `kernorch bench`, `kernorch demo` and the CLI's `optimize`/`explain` all come through
here, so a stage is wired in once and every entry point sees the same defaults (`kernorch.options`).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import onnx

from kernorch.cost.interface import CostModel
from kernorch.cost.model import GeneratableCost
from kernorch.errors import FallbackWarning, KernorchError
from kernorch.fission import fallback_nodes, fission
from kernorch.frontend import import_model
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.plan import Plan
from kernorch.layout import choose_layouts
from kernorch.machine import check_bf16_supported
from kernorch.options import Options, plan_shaping
from kernorch.orchestrate import OrchestrationResult, orchestrate
from kernorch.precision import choose_precision
from kernorch.rewrite import rewrite
from kernorch.runtime.compiled import CompiledModel
from kernorch.runtime.memory import check_values_fit
from kernorch.runtime.origin import ORIGIN_KEY, PlanOrigin, model_digest
from kernorch.validate.layouts import Timing as LayoutTiming
from kernorch.validate.layouts import choose_layout

ModelSource = str | os.PathLike[str] | bytes | onnx.ModelProto


@dataclass(frozen=True)
class Progress:
    """Hooks for long work; None means silent. The CLI fills them with progress bars."""

    subgraphs: Callable[[Iterable[Any]], Iterator[Any]] | None = None  # wraps the subgraphs being orchestrated
    tuning: Callable[[Iterable[Any], int], Iterator[Any]] | None = None  # wraps the kernels being measured
    rewrite_site: Callable[[str], None] | None = None  # called once per cost-guided rewrite site judged


SILENT = Progress()


def import_graph(model: ModelSource, input_shapes: Mapping[str, Sequence[int]] | None = None,
                 strict: bool = False) -> Graph:  # fmt: skip
    """Frontend and fission: the primitive graph of an ONNX model. Nodes without a kernorch rule run through
    onnxruntime (with a FallbackWarning naming them) unless `strict`, which refuses them."""
    shapes = {name: tuple(shape) for name, shape in (input_shapes or {}).items()}
    graph = fission(import_model(model, shapes), strict=strict)
    check_values_fit(graph, "the model at these input shapes")
    warn_about_fallbacks(graph)
    return graph


def warn_about_fallbacks(graph: Graph) -> None:
    """One FallbackWarning naming the operators that run through onnxruntime, with why, if any do."""
    reasons: dict[str, list[str]] = {}
    for node in fallback_nodes(graph):
        reasons.setdefault(node.attr("op_type"), []).append(node.attr("reason"))
    if not reasons:
        return
    parts = [f"{op}" + (f" ×{len(why)}" if len(why) > 1 else "") + f" ({why[0]})" for op, why in reasons.items()]
    warnings.warn(FallbackWarning(
        f"{sum(map(len, reasons.values()))} node(s) run through onnxruntime, not optimized by kernorch: "
        + "; ".join(parts) + " (--strict refuses them)"), stacklevel=2)  # fmt: skip


def make_cost_model(options: Options, progress: Progress = SILENT) -> CostModel:
    """The cost model `options` ask for; kernels no backend can generate cost infinity."""
    from kernorch.cost.analytic import AnalyticCostModel, device_by_name

    if options.gpu:
        from kernorch.cost.gpu_roofline import gpu_cost_model

        return GeneratableCost(gpu_cost_model(options), device="gpu")
    roofline = AnalyticCostModel(device_by_name(options.device, options.cache, options.threads))
    if options.cost == "analytic":
        return GeneratableCost(roofline)
    from kernorch.cost.bandwidth import measure_levels
    from kernorch.cost.profile import ProfileDatabase, ProfiledCostModel
    from kernorch.cost.traffic import ActivationTraffic

    screen = None
    if options.screen:
        from kernorch.cost.gir_model import GirScreen

        screen = GirScreen(lambda: measure_levels(options.cache, options.threads), options.threads)
    return ProfiledCostModel(ProfileDatabase.open(options.cache), options.threads, progress.tuning,
                             kernel_cache=options.cache, workers=options.ray_address, screen=screen,
                             traffic=ActivationTraffic(measure_levels(options.cache, options.threads)))  # fmt: skip


def plan_graph(graph: Graph, options: Options, progress: Progress = SILENT,
               cost_model: CostModel | None = None) -> OrchestrationResult:  # fmt: skip
    """Rewrite (unless options.rewrite is off), choose layouts and precisions and orchestrate a primitive graph."""
    if options.precision == "bf16" and options.device == "cpu":  # before any tuning (compiling checks again)
        check_bf16_supported()
    cost_model = cost_model or make_cost_model(options, progress)
    report = None
    if options.rewrite:

        def plan_cost(window: Graph) -> float:
            return orchestrate(window, cost_model, options.limits).plan.cost

        graph, report = rewrite(graph, plan_cost, options.rewrite_budget, progress.rewrite_site)
    result = _orchestrate_in_layout(graph, options.layout, options, cost_model, progress)
    # (where the 0-1 program already put every convolution channels-last, the alternative is that assignment
    # again: orchestrating it a second time doubled vit_tiny's planning time for the same plan)
    if options.layout == "auto" and result.layout_report.channels_last_convs < result.layout_report.convs:
        # The 0-1 program prices a layout change as a standalone transpose; fused into a neighbouring kernel it
        # is nearly free. So the orchestrated plans decide between its assignment and channels-last everywhere
        # (segformer: 172 vs 132 ms measured before this), timed end to end where their predictions are close
        # (validate/layouts.py: a layout's kernels mispredicted together)
        alternative = _orchestrate_in_layout(graph, "channels-last", options, cost_model, progress)
        timing = LayoutTiming(options.threads, options.cache_dir, options.runtime) \
            if cost_model.measures and options.device == "cpu" else None  # fmt: skip
        result = choose_layout(result, alternative, timing)
    result.rewrite_report = report
    if options.in_plan:
        from kernorch.runtime.feeds import graph_feeds
        from kernorch.validate.in_plan import refine_in_plan

        if not cost_model.has_signatures:  # an analytic or a caller's own model: nothing to correct by signature
            raise KernorchError(f"in_plan needs a profiled cost model (kernel signatures); {cost_model.name} has none")
        result = refine_in_plan(result, cost_model, options.limits, options.in_plan,
                                 graph_feeds(result.plan.graph), options.threads, options.cache_dir,
                                 options.runtime)  # fmt: skip
    if options.validate > 1:  # next-best plans of the layout kept only (the other's are never timed)
        from kernorch.orchestrate import add_next_best

        add_next_best(result, options.validate - 1)
        if result.greedy_plan.kernel_keys != result.plan.kernel_keys:
            # the greedy-fusion plan too: next-best plans are near ties of the optimum, this one another strategy,
            # so the validation also guards against a cost model misleading the BLP wholesale
            result.alternatives = [*result.alternatives, result.greedy_plan]
            result.alternative_sources = [*result.alternative_sources, "greedy fusion"]
    if result.alternatives:  # the next-best plans (options.validate), greedy, and those measured in place
        from kernorch.validate import validate_plans

        result = validate_plans(result, options.threads, options.cache_dir, options.runtime)
    if cost_model.measures:
        result.contended_kernels = cost_model.contended_in(result.plan.kernels)
        result.tuning = cost_model.tuning_counts()
    return result


def _orchestrate_in_layout(graph: Graph, policy: str, options: Options, cost_model: CostModel,
                           progress: Progress) -> OrchestrationResult:  # fmt: skip
    laid_out, layout_report = choose_layouts(graph, cost_model, policy)
    if options.rewrite and layout_report.channels_last_convs:
        laid_out, _ = rewrite(laid_out)  # the safe rules tidy what the layout left (transpose pairs, no-op reshapes)
    laid_out, precision_report = choose_precision(laid_out, cost_model, options.precision)
    result = orchestrate(laid_out, cost_model, options.limits, progress.subgraphs,
                         keep_instances=options.validate > 1)  # fmt: skip
    result.layout_report = layout_report
    result.precision_report = precision_report
    return result


def generic_stages(graph: Graph, options: Options, layout: str | None = None) -> Graph:
    """The stages between fission and orchestration as a shape-generic plan runs them (shapes/generic.py): what
    they decide must follow from the graph's structure, the same at every size of a range, so the graphs at the
    range's probe sizes line up primitive by primitive. The safe rewrite rules only (the cost-guided search
    judges sizes), layouts by `layout` (`generic_layout` decides it once for the range) priced by the analytic
    model, float32."""
    analytic = make_cost_model(options.with_(cost="analytic"))
    graph, _ = rewrite(graph)
    laid_out, layout_report = choose_layouts(graph, analytic, layout or options.layout)
    if layout_report.channels_last_convs:
        laid_out, _ = rewrite(laid_out)
    return laid_out


def generic_layout(graph: Graph, options: Options) -> str:
    """The layout policy of a range's generic plan, decided once at its largest sizes: the options', or for "auto"
    the cheaper of the 0-1 program's assignment and channels-last everywhere by their analytic orchestrated plans
    (as `plan_graph` decides, with measured costs, for one shape). Channels-last everywhere is then the same
    at every size; the 0-1 program's assignment is checked to be, by the probes' graphs lining up."""
    if options.layout != "auto" or not any(node.prim == "conv" for node in graph.nodes):
        return options.layout
    analytic = make_cost_model(options.with_(cost="analytic"))
    costs = {policy: orchestrate(generic_stages(graph, options, policy), analytic, options.limits).plan.cost
             for policy in ("auto", "channels-last")}  # fmt: skip
    return min(costs, key=lambda policy: (costs[policy], policy != "channels-last"))


class ExcludedKernels:
    """A cost model in which the kernels named by their primitives (`excluded`) cost infinity: a shape-generic
    plan orchestrated again without the kernels whose code is not the same program at every size."""

    def __init__(self, base: CostModel, excluded: frozenset[tuple[int, ...]]) -> None:
        self._base, self.excluded = base, excluded

    @property
    def name(self) -> str:
        return self._base.name

    def cost(self, candidate: CandidateKernel) -> float:
        return math.inf if candidate.nodes in self.excluded else self._base.cost(candidate)

    def __getattr__(self, attribute: str) -> Any:  # every other hook is the base model's
        return getattr(self._base, attribute)


def orchestrate_generic(graph: Graph, options: Options, excluded: frozenset[tuple[int, ...]],
                        cost_model: CostModel | None = None) -> OrchestrationResult:  # fmt: skip
    """The optimal plan of a graph `generic_stages` prepared, without the `excluded` kernels."""
    base = cost_model or make_cost_model(options)
    return orchestrate(graph, cast(CostModel, ExcludedKernels(base, excluded)), options.limits)


def plan_model(model: ModelSource, input_shapes: Mapping[str, Sequence[int]] | None = None,
               options: Options | None = None, progress: Progress = SILENT) -> OrchestrationResult:  # fmt: skip
    """Import, fission, rewrite and orchestrate an ONNX model."""
    options = options or Options()
    return plan_graph(import_graph(model, input_shapes, options.strict), options, progress)


def compile_plan(result: OrchestrationResult, options: Options | None = None,
                 plan: Plan | None = None) -> Any:  # fmt: skip
    """Compile the result's optimal plan, or another plan of the same graph (e.g. greedy, for comparison)."""
    options = options or Options()
    chosen = plan or result.plan
    metadata = {"cost_model": result.cost_model, "plan_cost": chosen.cost,
                "greedy_cost": result.greedy_plan.cost, "all_optimal": result.all_optimal,
                "rewrites": result.rewrite_report.fired_counts() if result.rewrite_report else None,
                "layout": result.layout_report.to_json() if result.layout_report else None,
                "precision": result.precision_report.to_json() if result.precision_report else None,
                "tuning": result.tuning or None,
                "validation": result.validation.to_json() if result.validation is not None else None,
                "in_plan": result.in_plan.to_json() if result.in_plan is not None else None}  # fmt: skip
    if options.gpu:
        from kernorch.runtime.gpu_plan import GpuModel, device_preset

        preset = device_preset() if options.device == "cuda" else options.device
        return GpuModel(chosen.graph, chosen.kernels, chosen.costs, preset, metadata, options.cache, options.tf32,
                        interpret=options.interpret)  # fmt: skip
    return CompiledModel(chosen.graph, chosen.kernels, chosen.costs, options.threads, metadata,
                         cache_dir=options.cache, runtime=options.runtime,
                         max_workspaces=options.max_workspaces)  # fmt: skip


def compile_model(model: ModelSource, input_shapes: Mapping[str, Sequence[int]] | None = None,
                  options: Options | None = None, progress: Progress = SILENT) -> Any:  # fmt: skip
    """Plan and compile; the plan records its origin (runtime/origin.py): the model's bytes, the input shapes
    and the plan-shaping options, which a loader that knows what it wants the plan for checks."""
    options = options or Options()
    result = plan_model(model, input_shapes, options, progress)
    compiled = compile_plan(result, options)
    graph = result.plan.graph
    inputs = tuple(sorted((name, graph.types[name].shape) for name in graph.inputs))
    compiled.metadata[ORIGIN_KEY] = PlanOrigin(model_digest(model), inputs, plan_shaping(options)).to_json()
    return compiled
