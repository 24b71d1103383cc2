"""The subcommands other than explain: check, optimize, run, bench, conformance, demo."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kernorch.cli.common import (
    EXIT_MISMATCH,
    EXIT_OK,
    make_options,
    median_ms,
    orchestrate_model,
    progress_bars,
    shape_sets,
)
from kernorch.errors import KernorchError


def cmd_check(args: argparse.Namespace) -> int:
    from kernorch.tools.check import check_model

    passed = True
    options = make_options(args)
    for shapes in shape_sets(args) or [{}]:  # several shape sets: each checked
        report, _ = check_model(args.model, shapes, seed=args.seed, rtol=args.rtol, compiled=args.compiled,
                                options=options)  # fmt: skip
        print("\n".join(report.lines()))
        passed = passed and report.passed
    return EXIT_OK if passed else EXIT_MISMATCH


def cmd_optimize(args: argparse.Namespace) -> int:
    if len(shape_sets(args)) > 1 or args.dim or args.range:
        return _optimize_shapes(args)
    result = orchestrate_model(args, show_progress=not args.json)
    if args.output:
        from kernorch.pipeline import compile_plan

        saved = compile_plan(result, make_options(args)).save(args.output)
        if not args.json:
            print(f"compiled plan saved to {saved} (run it with: kernorch run {saved})")
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
        return EXIT_OK
    print(f"{'#':>3} {'first':>5} {'prims':>5} {'states':>6} {'cands':>6} {'solve s':>8}  {'cost us':>9} "
          f"{'greedy us':>9}  status")  # fmt: skip
    for i, s in enumerate(result.subgraphs):
        print(f"{i:>3} {s.first_node:>5} {s.primitives:>5} {s.states:>6} {s.candidates:>6} {s.solve_seconds:>8.3f}  "
              f"{s.cost * 1e6:>9.1f} {s.greedy_cost * 1e6:>9.1f}  {s.status}"
              + (f" (the BLP of #{s.same_as}: its solution reused)" if s.same_as is not None else "")
              + ("  [candidate cap hit: optimal over the enumerated candidates only]" if s.candidates_capped else ""))
    plan, greedy = result.plan, result.greedy_plan
    print(f"plan cost {plan.cost * 1e3:.3f} ms in {len(plan.kernels)} kernels; "
          f"greedy fusion {greedy.cost * 1e3:.3f} ms in {len(greedy.kernels)} kernels "
          f"({greedy.cost / plan.cost:.2f}x); cost model {result.cost_model}; {result.seconds:.1f} s")
    if result.rewrite_report is not None:
        print(result.rewrite_report.summary())
    if result.layout_report is not None:
        print(result.layout_report.summary())
    if result.precision_report is not None and result.precision_report.precision == "bf16":
        print(result.precision_report.summary())
    if result.in_plan is not None:
        print(result.in_plan.summary())
    if result.validation is not None:
        print(result.validation.summary())
    if result.tuning and any(result.tuning.values()):
        tuning = result.tuning
        print(f"tuning: {tuning['measured']} kernel(s) measured here, {tuning['measured_remotely']} on Ray workers"
              + (f"; {tuning['foreign']} result(s) from workers of another machine kind stored apart (not used for "
                 "this plan)" if tuning["foreign"] else ""))  # fmt: skip
    if not result.all_optimal:
        print("WARNING: not every subgraph was solved to proven optimality (see status)")
    if result.contended_kernels:
        print(f"WARNING: {result.contended_kernels} kernel(s) of the plan were costed by measurements taken while "
              "other processes kept the CPU busy; the plan may not be optimal. Re-run on a quiet machine: those "
              "kernels are measured again.")
    return EXIT_OK


def _optimize_shapes(args: argparse.Namespace) -> int:
    """Several shapes of a model with symbolic dims: a plan per shape set, tuned one after the other (kernels
    shared between them measured once), saved together with -o."""
    from kernorch.api import DynamicModel, compile
    from kernorch.frontend import describe_shapes

    if args.json:
        raise KernorchError("--json shows one plan: give each input one --input-shape")
    options = make_options(args).with_(shapes=shape_sets(args))
    model = compile(args.model, options=options, progress=progress_bars(True))
    if not isinstance(model, DynamicModel):
        raise KernorchError("the model has static shapes: --dim, --range and several --input-shape need symbolic "
                            "dims")
    print(f"{'shape set':<36} {'kernels':>7} {'plan ms':>9} {'measured':>8} {'reused':>7} {'seconds':>8}")
    for shapes, plan in model.specialisations.items():
        tuning = plan.metadata.get("tuning") or {}
        seconds = plan.metadata.get("specialised_seconds")
        print(f"{describe_shapes(shapes):<36} {len(plan.kernels):>7} {plan.metadata['plan_cost'] * 1e3:>9.3f} "
              f"{tuning.get('measured', '-'):>8} {tuning.get('from_database', '-'):>7} "
              f"{'cached' if seconds is None else f'{seconds:.1f}':>8}")
    for generic in model.generic_plans:
        print(f"range {generic.describe()}; planned once in {generic.seconds:.1f} s")
    for spec, reason in model.range_refusals.items():
        print(f"range [{spec}]: no generic plan: {reason}")
    if args.output:
        saved = model.save(args.output)
        ranges = f" and {len(model.generic_plans)} range plan(s)" if model.generic_plans else ""
        print(f"{len(model.specialisations)} shape plan(s){ranges} saved to {saved} (run them with: kernorch run "
              f"{saved})")  # fmt: skip
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from kernorch.api import DynamicModel, load

    loaded = load(args.plan, threads=args.threads, runtime=args.runtime)
    files = _input_files(args.input)
    if not isinstance(loaded, DynamicModel):
        _run_plan(args, loaded, files)
    elif files:  # the inputs' shapes pick the plan (specialised now if none was saved for them)
        missing = sorted(set(loaded.input_names) - set(files))
        if missing:
            raise KernorchError(f"a plan with symbolic dims takes every input from a file: '{missing[0]}' is missing")
        _run_plan(args, loaded, files)
    else:  # no inputs given: each saved plan on random inputs of its shape
        print(f"{args.plan}: a plan per shape — {loaded.describe()}")
        for plan in loaded.specialisations.values():
            _run_plan(args, plan, files)
    return EXIT_OK


def _input_files(specs: list[str] | None) -> dict[str, Any]:
    import numpy as np

    feeds = {}
    for spec in specs or []:
        name, sep, path = spec.partition("=")
        if not sep:
            raise KernorchError(f"bad --input '{spec}': expected NAME=FILE.npy")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise KernorchError(f"cannot read input '{name}' from {path}: {error}") from None
    return feeds


def _run_plan(args: argparse.Namespace, model: Any, files: dict[str, Any]) -> None:
    import numpy as np

    from kernorch.api import DynamicModel
    from kernorch.frontend import describe_shapes, shape_set
    from kernorch.runtime.feeds import graph_feeds

    feeds = dict(files) if isinstance(model, DynamicModel) else {**graph_feeds(model.graph, seed=args.seed), **files}
    outputs = model.run(feeds)
    latency = median_ms(lambda: model.run(feeds), args.runs)
    shapes = shape_set({name: np.shape(value) for name, value in feeds.items()})
    for name, value in outputs.items():
        print(f"output {name}: {value.dtype}{list(value.shape)} mean {float(np.mean(value)):.6g}")
    # a dynamic model ran these shapes on their own plan, a range's generic plan, a bucket's padded or onnxruntime
    plan = model.specialisations.get(shapes) if isinstance(model, DynamicModel) else model
    if plan is None:
        assert isinstance(model, DynamicModel)
        print(f"[{describe_shapes(shapes)}] on {model.runs_on(shapes)}, median latency {latency:.3f} ms over "
              f"{args.runs} runs")  # fmt: skip
        return
    device = plan.metadata.get("device", "cpu")
    how = f"{plan.threads} threads, {args.runtime} runtime" if device == "cpu" else f"GPU plan for {device}"
    print(f"[{describe_shapes(shapes)}] {len(plan.kernels)} kernels, median latency {latency:.3f} ms over {args.runs} "
          f"runs ({how})")  # fmt: skip
    rprogram = getattr(getattr(plan, "executor", None), "rprogram", None)  # a GPU plan has no executor
    if rprogram is not None and rprogram.program is not None:
        print(f"rProgram: {rprogram.program.describe()}")


def cmd_bench(args: argparse.Namespace) -> int:
    from kernorch.cli.common import one_shape_set
    from kernorch.tools.bench import bench_model, format_report, quick_bench

    options, bars = make_options(args), progress_bars(not args.json)
    shapes = one_shape_set(args, "kernorch bench")
    if options.gpu:
        return _bench_gpu(args, options)
    if args.quick:
        report = quick_bench(args.model, runs=args.runs, options=options, progress=bars, input_shapes=shapes,
                             throughput=args.throughput, breakdown=args.breakdown,
                             float_model=args.float_model)  # fmt: skip
    else:
        report = bench_model(args.model, runs=args.runs, options=options, progress=bars,
                             compare_layouts=args.compare_layouts, input_shapes=shapes,
                             throughput=args.throughput, breakdown=args.breakdown,
                             float_model=args.float_model)  # fmt: skip
    print(json.dumps(report, indent=1) if args.json else "\n".join(format_report(report)))
    return EXIT_OK


def _bench_gpu(args: argparse.Namespace, options: Any) -> int:
    from kernorch.codegen.triton import nvidia_device_present
    from kernorch.tools.gpu_bench import bench_gpu, format_gpu_report

    if options.device != "cuda":
        raise KernorchError(f"bench times the GPU present: --device cuda (not {options.device})")
    if not nvidia_device_present():
        raise KernorchError("--device cuda: this machine has no GPU (`kernorch check --compiled --device a100` "
                            "verifies a GPU plan here in Triton's interpreter)")  # fmt: skip
    if args.input_shape:
        raise KernorchError("bench --device cuda runs the model's own shapes")
    plan_options = {"cost": options.cost, "device": "cuda", "tf32": options.tf32, "rewrite": options.rewrite,
                    "rewrite_budget": options.rewrite_budget, "layout": options.layout}  # fmt: skip
    report = bench_gpu(args.model, plan_options, runs=args.runs)
    print(json.dumps(report, indent=1) if args.json else "\n".join(format_gpu_report(report)))
    return EXIT_OK


def cmd_conformance(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tqdm import tqdm

    from kernorch.tools.conformance import default_cache_dir, generate_node_tests, run_conformance, summarize

    if args.compiled and args.precision == "bf16":  # one line here, not a refusal per case
        from kernorch.machine import check_bf16_supported

        check_bf16_supported()
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    print(f"ONNX node tests: {cache} (generated from the installed onnx package on first use)", flush=True)
    generate_node_tests(cache)
    results = run_conformance(cache, args.filter,
                              progress=lambda it: tqdm(it, desc="cases", unit="case", disable=args.quiet,
                                                       file=sys.stderr, leave=False),
                              compiled=args.compiled, fallback=args.fallback, precision=args.precision)  # fmt: skip
    if args.precision == "bf16":
        print("precision bf16: every float32 matmul/conv multiplies in bfloat16; a case with one is held to "
              "2e-2 of its output's magnitude")
    per_op = summarize(results)
    width = max((len(op) for op in per_op), default=2)
    columns = ("passed", "failed", "unsupported") + (("fallback",) if args.fallback else ())
    print(f"{'operator':<{width}}  " + "  ".join(columns))
    for op, counts in sorted(per_op.items()):
        print(f"{op:<{width}}  " + "  ".join(f"{counts[c]:>{len(c)}}" for c in columns))
    shown = [r for r in results if r.status == "failed" or (args.verbose and r.status == "unsupported")]
    for result in shown:
        print(f"{result.status.upper()} {result.name}: {result.detail}")
    totals = {status: sum(1 for r in results if r.status == status) for status in columns}
    last = f"{totals['passed']} passed, {totals['failed']} failed, {totals['unsupported']} unsupported"
    print(last + (f", {totals['fallback']} passed through the onnxruntime fallback" if args.fallback else ""))
    return EXIT_MISMATCH if totals["failed"] else EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kernorch.api import CompiledModel, compile
    from kernorch.runtime.feeds import graph_feeds
    from kernorch.tools.check import check_model, compare, run_onnxruntime, timed_onnxruntime
    from kernorch.tools.demo_models import DEMO_MODELS
    from kernorch.tools.picture import GraphvizMissing, write_svg

    status = EXIT_OK
    for name, build in DEMO_MODELS.items():
        proto = build()
        print(f"== built-in model: {name}")
        report, _ = check_model(proto, options=make_options(args))
        print(f"primitive graph: {report.lines()[0].split(': ', 1)[1]}")
        print("reference interpreter vs onnxruntime:")
        print("\n".join(report.lines()[1:]))
        compiled = compile(proto, options=make_options(args))
        if not isinstance(compiled, CompiledModel):
            raise KernorchError("the demo runs CPU plans (check a GPU plan with `kernorch check --compiled --device`)")
        print(f"kernel plan ({len(compiled.kernels)} kernels; plan cost {compiled.metadata['plan_cost'] * 1e6:.1f} us, "
              f"greedy {compiled.metadata['greedy_cost'] * 1e6:.1f} us, {compiled.metadata['cost_model']} cost):")
        for i, (kernel, backend) in enumerate(zip(compiled.kernels, compiled.executor.backends, strict=True)):
            # the compiled graph is the rewritten one: its node indices are not check's
            prims = " → ".join(compiled.graph.nodes[n].prim for n in kernel.nodes)
            print(f"  kernel {i:>2} [{backend.name:>11}] {prims}")
        try:
            picture = write_svg(Path(args.pictures) / f"{name}.svg", compiled.graph, compiled.kernels, compiled.costs,
                                name)  # fmt: skip
            print(f"picture of the plan: {picture} (kernels as coloured clusters; open it in a browser)")
        except GraphvizMissing as missing:
            print(f"picture of the plan: not drawn ({missing})")
        feeds = graph_feeds(compiled.graph)
        errors = compare(compiled.run(feeds), run_onnxruntime(proto, feeds, args.threads))
        worst = max(e.relative for e in errors)
        ours = median_ms(lambda: compiled.run(feeds), args.runs)  # noqa: B023
        theirs = timed_onnxruntime(proto, feeds, args.threads, args.runs)
        verdict = "PASS" if worst <= 1e-4 else "FAIL"
        print(f"compiled plan vs onnxruntime: {verdict} (rel err {worst:.2e})")
        print(f"latency ({args.threads} threads, median of {args.runs}): kernorch {ours:.3f} ms, "
              f"onnxruntime {theirs:.3f} ms, speedup {theirs / ours:.2f}x")  # fmt: skip
        status = max(status, EXIT_OK if report.passed and worst <= 1e-4 else EXIT_MISMATCH)
    return status
