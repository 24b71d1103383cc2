"""`kernorch explain`: the plan kernel by kernel, with its rewrites, layouts, GIR, schedule and pictures."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernorch.cli.common import EXIT_OK, make_options, orchestrate_model, progress_bars, shape_sets
from kernorch.errors import KernorchError

if TYPE_CHECKING:
    from kernorch.orchestrate import OrchestrationResult
    from kernorch.rewrite import RewriteReport


def cmd_explain(args: argparse.Namespace) -> int:
    from kernorch.codegen.backends import choose_backend
    from kernorch.codegen.library import absorbed_summary

    if getattr(args, "range", None) or Path(args.model).is_dir():
        return _explain_shapes(args)
    if len(shape_sets(args)) == 2:
        return _explain_two_shapes(args)
    result = orchestrate_model(args, show_progress=True)
    graph = result.plan.graph
    device = "gpu" if make_options(args).gpu else "cpu"
    bf16_plan = result.precision_report is not None and result.precision_report.precision == "bf16"
    for i, (kernel, cost) in enumerate(zip(result.plan.kernels, result.plan.costs, strict=True)):
        origins = sorted({graph.nodes[n].origin for n in kernel.nodes})
        print(f"kernel {i}: {cost * 1e6:.1f} us  [{' → '.join(graph.nodes[n].prim for n in kernel.nodes)}]")
        print(f"    from: {', '.join(origins)}")
        backend, reason = choose_backend(kernel, device)
        absorbed = absorbed_summary(kernel)
        if absorbed is not None and backend is not None and backend.stateful:
            print(f"    library call: {absorbed}, by {backend.summary(kernel)}")
        else:
            print(f"    runs as: {backend.summary(kernel) if backend is not None else reason}")
        # the dtypes say which values a plan keeps int8 (or bfloat16) between kernels
        written = ", ".join(f"{value} ({graph.types[value].dtype})" for value in kernel.outputs)
        read = _dtype_counts(graph.types, kernel.inputs)
        print(f"    reads {len(kernel.inputs)} value(s) [{read}], writes {written}")
        if bf16_plan:  # a bf16 kernel multiplies bfloat16 operands; everything else computes in float32
            from kernorch.precision import kernel_precision

            print(f"    precision: {kernel_precision(kernel)}")
    print(f"{len(result.plan.kernels)} kernels, plan cost {result.plan.cost * 1e3:.3f} ms")
    if result.layout_report is not None:
        print(result.layout_report.summary())
    if result.precision_report is not None and result.precision_report.precision == "bf16":
        from kernorch.precision import policy_lines

        print(result.precision_report.summary())
        print("precision policy (bf16 mode):\n" + "\n".join(policy_lines()))
    if result.in_plan is not None:
        print(result.in_plan.summary())
    if result.validation is not None:
        print(result.validation.summary())
    if result.rewrite_report is not None:
        _explain_rewrites(result.rewrite_report)
    if args.schedule:
        _explain_schedule(args, result)
    if args.svg or args.html:
        try:
            from kernorch.tools.picture import write_html, write_svg
        except ImportError as error:
            raise KernorchError(f"--svg and --html need the graphviz package: pip install 'kernorch[pictures]' "
                                f"({error})") from None  # fmt: skip
        name = Path(args.model).stem
        if args.svg:
            picture = write_svg(args.svg, graph, result.plan.kernels, result.plan.costs, name, device)
            print(f"picture of the plan: {picture}")
        if args.html:
            print(f"report: {write_html(args.html, result, name, device)}")
    if args.gir is not None and device == "gpu":
        _explain_triton(result, args.gir, make_options(args))
    elif args.gir is not None:
        _explain_gir(result, args.gir)
    if args.rejected:
        counts: dict[str, int] = {}
        for report in result.subgraphs:
            for rule, count in report.rejected_counts.items():
                counts[rule] = counts.get(rule, 0) + count
        print("rejected candidates by rule: " + ", ".join(f"{rule} {n}" for rule, n in sorted(counts.items())))
        for rejection in result.rejected[: args.rejected]:
            prims = " → ".join(graph.nodes[n].prim for n in rejection.nodes)
            print(f"  rejected [{prims}] ({rejection.rule}): {rejection.reason}")
    return EXIT_OK


def _explain_shapes(args: argparse.Namespace) -> int:
    """A model with symbolic dims: what each shape runs on — a saved family of plans (`kernorch optimize --range
    ... -o DIR`, or a served model saved), or MODEL compiled with its --range: each range's plan kernel by kernel."""
    import kernorch
    from kernorch.shapes import DynamicModel
    from kernorch.shapes.report import generic_plan_lines, shape_lines

    if Path(args.model).is_dir():
        model = kernorch.load(args.model)
    else:
        model = kernorch.compile(args.model, options=make_options(args))
    if not isinstance(model, DynamicModel):
        raise KernorchError(f"{args.model} is one plan for one shape: explain it from its model with --input-shape")
    for plan in model.generic_plans:
        print("\n".join(generic_plan_lines(plan)))
    print("\n".join(shape_lines(model)))
    return EXIT_OK


def _explain_two_shapes(args: argparse.Namespace) -> int:
    """Two shape sets of a model with symbolic dims: both plans, and the kernels in which they differ (Korch §6.4:
    the best orchestration at batch 1 is not the best at batch 16). Kernels are compared by the primitives they
    fuse and the ONNX nodes those come from, so plans whose graphs the layout or rewrites changed still compare."""
    from collections import Counter

    from kernorch.frontend import describe_shapes, shape_set
    from kernorch.pipeline import plan_model

    def key(kernel: Any) -> tuple[str, str]:  # a CandidateKernel
        nodes = [kernel.graph.nodes[n] for n in kernel.nodes]
        return " → ".join(n.prim for n in nodes), ", ".join(sorted({n.origin for n in nodes}))

    sets, options = shape_sets(args), make_options(args)
    names = [describe_shapes(shape_set(shapes)) for shapes in sets]
    results = [plan_model(args.model, shapes, options, progress_bars(True)) for shapes in sets]
    kernels = [Counter(key(k) for k in result.plan.kernels) for result in results]
    for name, result in zip(names, results, strict=True):
        print(f"[{name}]: {len(result.plan.kernels)} kernels, plan cost {result.plan.cost * 1e3:.3f} ms"
              + (f"; {result.layout_report.summary()}" if result.layout_report is not None else ""))
    for name, own, other in ((names[0], kernels[0], kernels[1]), (names[1], kernels[1], kernels[0])):
        only = own - other
        print(f"kernels only in the plan for [{name}] ({sum(only.values())}):")
        for (prims, origins), count in sorted(only.items()):
            print(f"  [{prims}]" + (f" ×{count}" if count > 1 else "") + f" from {origins}")
    print(f"{sum((kernels[0] & kernels[1]).values())} kernels are the same in both plans")
    return EXIT_OK


def _explain_triton(result: OrchestrationResult, k: int, options: Any) -> None:
    """A GPU plan's kernel k as Triton: its launches (template, programs, block) and its source."""
    from kernorch.codegen.backends import GpuBackend, choose_backend
    from kernorch.codegen.target import GPU_TARGETS

    kernels = result.plan.kernels
    if not 0 <= k < len(kernels):
        raise KernorchError(f"--gir {k}: the plan has kernels 0 to {len(kernels) - 1}")
    backend, reason = choose_backend(kernels[k], "gpu")
    target = GPU_TARGETS.get(options.device, GPU_TARGETS["h100"])
    rendered = backend.triton(f"kernel_{k}", kernels[k], target, options.tf32) \
        if isinstance(backend, GpuBackend) else None  # fmt: skip
    if rendered is None:
        print(f"kernel {k} runs no Triton: {backend.summary(kernels[k]) if backend is not None else reason}")
        return
    for launch in rendered.launches:
        print(f"kernel {k} launch {launch.function}: {launch.template} template, {launch.programs} programs of "
              f"{' x '.join(map(str, launch.block))} lanes")  # fmt: skip
    print(rendered.source)


def _explain_gir(result: OrchestrationResult, k: int) -> None:
    """Kernel k's GIR before and after the rewrite rules, with the global bytes each moves, and the C
    rendered from the rewritten one."""
    from kernorch.codegen.backends import choose_backend
    from kernorch.codegen.gir import lower, optimize
    from kernorch.codegen.loops import describe

    kernels = result.plan.kernels
    if not 0 <= k < len(kernels):
        raise KernorchError(f"--gir {k}: the plan has kernels 0 to {len(kernels) - 1}")
    backend, reason = choose_backend(kernels[k])
    if backend is None or not backend.has_gir:
        print(f"kernel {k} has no GIR: {backend.summary(kernels[k]) if backend is not None else reason}")
        return
    loops = describe(kernels[k])
    before, after = lower(loops), optimize(lower(loops))
    for name, gir in (("as lowered", before), ("after the rewrite rules", after)):
        moved = gir.traffic("load") + gir.traffic("store")
        print(f"kernel {k} GIR {name} ({moved / 1e6:.3f} MB of global reads and writes per call):")
        print(gir.describe())
    print(f"kernel {k} C, rendered from the rewritten GIR:")
    print(backend.source(f"kernel_{k}", kernels[k]))


def _explain_schedule(args: argparse.Namespace, result: OrchestrationResult) -> None:
    from kernorch.pipeline import compile_plan
    from kernorch.runtime.feeds import graph_feeds
    from kernorch.tools.schedule_picture import draw_schedule, measure_schedule

    compiled = compile_plan(result, make_options(args))
    executor = compiled.executor
    report = measure_schedule(executor, graph_feeds(compiled.graph))
    print("\n".join(report.summary()))
    picture = draw_schedule(args.schedule, report, executor.backends, executor.threads, Path(args.model).stem)
    print(f"schedule picture (measured timestamps): {picture}")


def _dtype_counts(types: Mapping[str, Any], values: Sequence[str]) -> str:
    """"float32 ×2, uint8": how many of `values` (typed by `types`, the graph's) are of each dtype, in order of
    first appearance."""
    counts = Counter(types[value].dtype for value in values)
    return ", ".join(dtype if count == 1 else f"{dtype} ×{count}" for dtype, count in counts.items())


def _explain_rewrites(report: RewriteReport) -> None:
    from kernorch.rewrite import REWRITE_RULES

    print(report.summary())
    places: dict[str, list[str]] = {}
    for firing in report.fired:
        places.setdefault(firing.rule, []).append(firing.origin)
    for rule, origins in places.items():
        shown = ", ".join(list(dict.fromkeys(origins))[:6]) + (", …" if len(set(origins)) > 6 else "")
        print(f"  {rule} ×{len(origins)}: {REWRITE_RULES[rule].doc}")
        print(f"      at {shown}")
    for trial in report.trials:
        verdict = "kept" if trial.kept else "rejected"
        follow = f" (+ {', '.join(trial.follow_ups)})" if trial.follow_ups else ""
        print(f"  tried {trial.rule}{follow} at {trial.origin}: neighbourhood plan {trial.cost_before * 1e6:.1f} → "
              f"{trial.cost_after * 1e6:.1f} us, {verdict}")

