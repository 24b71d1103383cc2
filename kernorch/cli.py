"""The `kernorch` command line. Exit codes: 0 ok, 1 check/mismatch failed, 2 bad input."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kernorch.errors import KernorchError
from kernorch.frontend import parse_input_shapes
from kernorch.options import RUNTIMES

if TYPE_CHECKING:
    from kernorch.options import Options
    from kernorch.orchestrate import OrchestrationResult
    from kernorch.pipeline import Progress
    from kernorch.rewrite import RewriteReport

EXIT_OK, EXIT_MISMATCH, EXIT_BAD_INPUT = 0, 1, 2


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="path to an ONNX model")
    parser.add_argument(
        "--input-shape", action="append", metavar="NAME=D1xD2x...",
        help="bind a model input to a static shape (needed when the model has symbolic dims); repeatable",
    )  # fmt: skip
    _add_strict_arg(parser)


def _add_strict_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strict", action="store_true", default=None,
                        help="refuse (exit 2) a node kernorch has no rule for, instead of running it through "
                        "onnxruntime as an opaque kernel with a warning")  # fmt: skip


def cmd_check(args: argparse.Namespace) -> int:
    from kernorch.tools.check import check_model

    report, _ = check_model(args.model, parse_input_shapes(args.input_shape), seed=args.seed, rtol=args.rtol,
                            compiled=args.compiled, options=_options(args))  # fmt: skip
    print("\n".join(report.lines()))
    return EXIT_OK if report.passed else EXIT_MISMATCH


def _add_orchestration_args(parser: argparse.ArgumentParser) -> None:
    from kernorch.options import OrchestrationLimits

    defaults = OrchestrationLimits()
    from kernorch.options import DEVICES

    _add_cost_arg(parser, "the cost model the plan is optimized against")
    parser.add_argument("--device", default="cpu", choices=DEVICES,
                        help="roofline parameters: 'cpu' calibrates this machine (cached); others are presets")
    parser.add_argument("--max-kernel-size", type=_positive_int, default=defaults.max_kernel_size,
                        help=f"max primitives per kernel (default {defaults.max_kernel_size})")
    parser.add_argument("--max-subgraph-size", type=_positive_int, default=defaults.max_subgraph_size,
                        help=f"max primitives per subgraph before partitioning (default {defaults.max_subgraph_size})")
    parser.add_argument("--time-limit", type=_positive_float, default=defaults.solver_time_limit,
                        help=f"solver seconds per subgraph (default {defaults.solver_time_limit:g})")
    _add_threads_arg(parser, "threads for measuring and running")
    parser.add_argument("--workers", default="local", metavar="local|ray|ray://HOST:PORT",
                        help="where candidate kernels are compiled and timed: local (default, this process), ray (a "
                        "local Ray instance, or the cluster RAY_ADDRESS names) or ray://HOST:PORT; results merge "
                        "into the local profile database, keyed by the measuring machine (needs kernorch[ray])")
    _add_rewrite_args(parser)
    _add_layout_arg(parser)


# argparse types: a bad value exits 2 with argparse's one-line error, never a traceback.
def _number(text: str, kind: type, minimum: float, what: str, inclusive: bool = True) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not {what}") from None
    if not (value >= minimum if inclusive else value > minimum) or value != value or value in (math.inf, -math.inf):
        bound = f"at least {minimum:g}" if inclusive else f"greater than {minimum:g}"
        raise argparse.ArgumentTypeError(f"{text}: must be {bound}")
    return value


def _positive_int(text: str) -> int:
    return int(_number(text, int, 1, "a whole number"))


def _non_negative_int(text: str) -> int:
    return int(_number(text, int, 0, "a whole number"))


def _positive_float(text: str) -> float:
    return float(_number(text, float, 0, "a number", inclusive=False))


def _non_negative_float(text: str) -> float:
    return float(_number(text, float, 0, "a number"))


def _seconds(text: str) -> float:
    return float(_number(text, float, 0, "a number of seconds"))


def _add_threads_arg(parser: argparse.ArgumentParser, what: str, default: int | None = None) -> None:
    from kernorch.options import DEFAULT_THREADS

    default = DEFAULT_THREADS if default is None else default
    parser.add_argument("--threads", type=_positive_int, default=default,
                        help=f"{what} (default {default})")  # fmt: skip


def _add_cost_arg(parser: argparse.ArgumentParser, what: str) -> None:
    from kernorch.options import COST_MODELS

    parser.add_argument("--cost", choices=COST_MODELS, default="profile",
                        help=f"{what}: profile (default) compiles and times candidate kernels on this machine, "
                        "cached in the profile database; analytic uses a roofline model")  # fmt: skip


def _options(args: argparse.Namespace) -> Options:
    """The one place CLI arguments become compile options; absent arguments keep Options' defaults."""
    from kernorch.options import Options, OrchestrationLimits

    limits = OrchestrationLimits()
    if hasattr(args, "max_kernel_size"):
        limits = OrchestrationLimits(max_kernel_size=args.max_kernel_size, max_subgraph_size=args.max_subgraph_size,
                                     solver_time_limit=args.time_limit)  # fmt: skip
    given = {name: getattr(args, name) for name in ("threads", "cost", "device", "rewrite", "rewrite_budget", "layout",
                                                     "strict", "workers", "screen")
             if getattr(args, name, None) is not None}  # fmt: skip
    return Options(limits=limits).with_(**given)


def _add_layout_arg(parser: argparse.ArgumentParser) -> None:
    from kernorch.options import LAYOUT_POLICIES

    parser.add_argument("--layout", choices=LAYOUT_POLICIES, default="auto",
                        help="which values are stored channels-last: auto (default) decides for the whole graph "
                        "with a 0-1 program over measured conv and transpose costs; channels-last makes every "
                        "convolution channels-last (torch.compile's rule); nchw keeps every value row-major")


def _add_rewrite_args(parser: argparse.ArgumentParser) -> None:
    from kernorch.options import DEFAULT_REWRITE_BUDGET_SECONDS as DEFAULT_REWRITE_BUDGET

    parser.add_argument("--no-rewrite", dest="rewrite", action="store_false",
                        help="skip the primitive-graph rewrites (CSE, simplification, TASO-style substitutions)")
    parser.add_argument("--no-screen", dest="screen", action="store_false", default=None,
                        help="profile every candidate kernel, also the fusions the GIR performance model predicts "
                        "more than 2x slower than their primitives one by one (left out by default)")
    parser.add_argument("--rewrite-budget", type=_seconds, default=DEFAULT_REWRITE_BUDGET, metavar="SECONDS",
                        help="time for trying the cost-guided rewrites, each judged by orchestrating its "
                        f"neighbourhood before and after (default {DEFAULT_REWRITE_BUDGET:g})")


def _progress(show: bool, rewrite_site: Callable[[str], None] | None = None) -> Progress:
    """Progress bars on stderr for the long stages (hidden when `show` is False or stderr is not a terminal)."""
    from tqdm import tqdm

    from kernorch.pipeline import Progress

    hidden = not show or None  # None: tqdm hides itself when stderr is not a terminal
    return Progress(
        subgraphs=lambda items: tqdm(items, desc="subgraphs", unit="subgraph", file=sys.stderr, leave=False,
                                     disable=hidden),
        tuning=lambda items, total: iter(tqdm(items, total=total, desc="measuring kernels", unit="kernel",
                                              file=sys.stderr, leave=False, disable=hidden)),
        rewrite_site=rewrite_site,
    )  # fmt: skip


def _orchestrate(args: argparse.Namespace, show_progress: bool) -> OrchestrationResult:
    from tqdm import tqdm

    from kernorch.pipeline import plan_model

    options = _options(args)
    sites = tqdm(desc="cost-guided rewrites", unit="site", file=sys.stderr, leave=False,
                 disable=not show_progress or None)  # fmt: skip

    def site_judged(message: str) -> None:
        sites.update(1)
        sites.set_postfix_str(message[-70:])

    try:
        return plan_model(args.model, parse_input_shapes(args.input_shape), options,
                          _progress(show_progress, site_judged))  # fmt: skip
    finally:
        sites.close()


def cmd_optimize(args: argparse.Namespace) -> int:
    result = _orchestrate(args, show_progress=not args.json)
    if args.output:
        from kernorch.pipeline import compile_plan

        saved = compile_plan(result, _options(args)).save(args.output)
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


def _median_ms(function: Callable[[], object], runs: int) -> float:
    from kernorch.runtime.timing import time_call

    return time_call(function, runs=runs).median * 1e3


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from kernorch.api import load
    from kernorch.runtime.feeds import graph_feeds

    model = load(args.plan, threads=args.threads, runtime=args.runtime)
    feeds = graph_feeds(model.graph, seed=args.seed)
    for spec in args.input or []:
        name, sep, path = spec.partition("=")
        if not sep:
            raise KernorchError(f"bad --input '{spec}': expected NAME=FILE.npy")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise KernorchError(f"cannot read input '{name}' from {path}: {error}") from None
    outputs = model.run(feeds)
    latency = _median_ms(lambda: model.run(feeds), args.runs)
    for name, value in outputs.items():
        print(f"output {name}: {value.dtype}{list(value.shape)} mean {float(np.mean(value)):.6g}")
    print(f"{len(model.kernels)} kernels, median latency {latency:.3f} ms over {args.runs} runs "
          f"({model.threads} threads, {args.runtime} runtime)")  # fmt: skip
    if model.executor.rprogram is not None and model.executor.rprogram.program is not None:
        print(f"rProgram: {model.executor.rprogram.program.describe()}")
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    from kernorch.tools.bench import bench_model, format_report, quick_bench

    if args.quick:
        report = quick_bench(args.model, runs=args.runs, options=_options(args), progress=_progress(not args.json))
    else:
        report = bench_model(args.model, runs=args.runs, options=_options(args), progress=_progress(not args.json),
                             compare_layouts=args.compare_layouts)  # fmt: skip
    print(json.dumps(report, indent=1) if args.json else "\n".join(format_report(report)))
    return EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    from kernorch.codegen.backends import choose_backend
    from kernorch.codegen.library import absorbed_summary

    result = _orchestrate(args, show_progress=True)
    graph = result.plan.graph
    for i, (kernel, cost) in enumerate(zip(result.plan.kernels, result.plan.costs, strict=True)):
        origins = sorted({graph.nodes[n].origin for n in kernel.nodes})
        print(f"kernel {i}: {cost * 1e6:.1f} us  [{' → '.join(graph.nodes[n].prim for n in kernel.nodes)}]")
        print(f"    from: {', '.join(origins)}")
        backend, reason = choose_backend(kernel)
        absorbed = absorbed_summary(kernel)
        if absorbed is not None and backend is not None:
            print(f"    library call: {absorbed}, by {backend.summary(kernel)}")
        else:
            print(f"    runs as: {backend.summary(kernel) if backend is not None else reason}")
        print(f"    reads {len(kernel.inputs)} value(s), writes {', '.join(kernel.outputs)}")
    print(f"{len(result.plan.kernels)} kernels, plan cost {result.plan.cost * 1e3:.3f} ms")
    if result.layout_report is not None:
        print(result.layout_report.summary())
    if result.rewrite_report is not None:
        _explain_rewrites(result.rewrite_report)
    if args.schedule:
        _explain_schedule(args, result)
    if args.svg or args.html:
        from pathlib import Path

        try:
            from kernorch.tools.picture import write_html, write_svg
        except ImportError as error:
            raise KernorchError(f"--svg and --html need the graphviz package: pip install 'kernorch[pictures]' "
                                f"({error})") from None  # fmt: skip
        name = Path(args.model).stem
        if args.svg:
            print(f"picture of the plan: {write_svg(args.svg, graph, result.plan.kernels, result.plan.costs, name)}")
        if args.html:
            print(f"report: {write_html(args.html, result, name)}")
    if args.gir is not None:
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


def _explain_gir(result: OrchestrationResult, k: int) -> None:
    """Kernel k's GIR before and after the rewrite rules, with the global bytes each moves, and the C
    rendered from the rewritten one."""
    from kernorch.codegen.backends import choose_backend
    from kernorch.codegen.c import render_kernel
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
    print(render_kernel(f"kernel_{k}", loops))


def _explain_schedule(args: argparse.Namespace, result: OrchestrationResult) -> None:
    from pathlib import Path

    from kernorch.pipeline import compile_plan
    from kernorch.runtime.feeds import graph_feeds
    from kernorch.tools.schedule_picture import draw_schedule, measure_schedule

    compiled = compile_plan(result, _options(args))
    executor = compiled.executor
    report = measure_schedule(executor, graph_feeds(compiled.graph))
    print("\n".join(report.summary()))
    picture = draw_schedule(args.schedule, report, executor.backends, executor.threads, Path(args.model).stem)
    print(f"schedule picture (measured timestamps): {picture}")


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


def cmd_conformance(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tqdm import tqdm

    from kernorch.tools.conformance import default_cache_dir, generate_node_tests, run_conformance, summarize

    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    print(f"ONNX node tests: {cache} (generated from the installed onnx package on first use)", flush=True)
    generate_node_tests(cache)
    results = run_conformance(cache, args.filter,
                              progress=lambda it: tqdm(it, desc="cases", unit="case", disable=args.quiet,
                                                       file=sys.stderr, leave=False),
                              compiled=args.compiled, fallback=args.fallback)  # fmt: skip
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

    from kernorch.api import compile
    from kernorch.runtime.feeds import graph_feeds
    from kernorch.tools.check import check_model, compare, run_onnxruntime, timed_onnxruntime
    from kernorch.tools.demo_models import DEMO_MODELS
    from kernorch.tools.picture import GraphvizMissing, write_svg

    status = EXIT_OK
    for name, build in DEMO_MODELS.items():
        proto = build()
        print(f"== built-in model: {name}")
        report, _ = check_model(proto, options=_options(args))
        print(f"primitive graph: {report.lines()[0].split(': ', 1)[1]}")
        print("reference interpreter vs onnxruntime:")
        print("\n".join(report.lines()[1:]))
        compiled = compile(proto, options=_options(args))
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
        ours = _median_ms(lambda: compiled.run(feeds), args.runs)  # noqa: B023
        theirs = timed_onnxruntime(proto, feeds, args.threads, args.runs)
        verdict = "PASS" if worst <= 1e-4 else "FAIL"
        print(f"compiled plan vs onnxruntime: {verdict} (rel err {worst:.2e})")
        print(f"latency ({args.threads} threads, median of {args.runs}): kernorch {ours:.3f} ms, "
              f"onnxruntime {theirs:.3f} ms, speedup {theirs / ours:.2f}x")  # fmt: skip
        status = max(status, EXIT_OK if report.passed and worst <= 1e-4 else EXIT_MISMATCH)
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernorch",
        description="Optimal kernel orchestration for ONNX inference graphs (Korch-style, CPU). "
        "Exit codes: 0 ok, 1 check failed, 2 bad input (unsupported op, malformed model, wrong shape).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = commands.add_parser(
        "check", help="fission a model, run it with the reference interpreter and compare with onnxruntime",
        description="Import MODEL, fission it into primitives, run the primitive graph with the reference "
        "interpreter on seeded random inputs (integer token ids drawn in range) and compare with onnxruntime. "
        "Prints primitive counts by kind and the max abs / relative error (relative to the output's max "
        "magnitude). Exit 0 when the relative error is within --rtol, else 1.",
    )  # fmt: skip
    _add_model_args(check)
    check.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the random inputs (default 0)")
    check.add_argument("--rtol", type=_non_negative_float, default=1e-4, help="relative error tolerance (default 1e-4)")
    check.add_argument("--compiled", action="store_true",
                       help="run the optimized, compiled plan instead of the reference interpreter")
    _add_cost_arg(check, "with --compiled, the cost model that picks the plan")
    _add_rewrite_args(check)
    _add_layout_arg(check)
    check.set_defaults(handler=cmd_check)

    conformance = commands.add_parser(
        "conformance", help="run the ONNX backend node tests through import, fission and reference execution",
        description="Regenerate the ONNX backend node tests from the installed onnx package into a cache "
        "directory (once), run each case (through the reference interpreter, or with --compiled through the "
        "optimized, compiled plan) and print a per-operator summary; the last line is "
        "'N passed, N failed, N unsupported'. Exit 1 if any case failed.",
    )  # fmt: skip
    conformance.add_argument("--cache-dir", help="where the generated tests live (default ~/.cache/kernorch/...)")
    conformance.add_argument("-k", "--filter", default="", help="only cases whose name contains this text")
    conformance.add_argument("-v", "--verbose", action="store_true", help="also list every unsupported case")
    conformance.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    conformance.add_argument("--compiled", action="store_true",
                             help="run every case through the compiled path (optimized plan: generated C and oneDNN "
                             "library calls) instead of the reference interpreter")
    conformance.add_argument("--fallback", action="store_true",
                             help="run nodes without a kernorch rule through onnxruntime (as `optimize` does unless "
                             "--strict) and count the cases that pass that way apart, in a 'fallback' column")
    conformance.set_defaults(handler=cmd_conformance)

    optimize = commands.add_parser(
        "optimize", help="find the optimal kernel orchestration of a model (Korch BLP) and report it",
        description="Fission MODEL, partition the primitive graph into subgraphs, enumerate execution states "
        "and candidate kernels, and solve the kernel-orchestration BLP with HiGHS. Prints per subgraph the "
        "primitives, states, candidates, solve seconds and solver status, then the plan cost next to the "
        "greedy-fusion baseline on the same cost model.",
    )  # fmt: skip
    _add_model_args(optimize)
    _add_orchestration_args(optimize)
    optimize.add_argument("--json", action="store_true",
                          help="one JSON object: subgraphs, plan_cost, greedy_cost, kernels")  # fmt: skip
    optimize.add_argument("-o", "--output", metavar="PLAN_DIR",
                          help="compile the plan and save it (plan.json, weights.npz, kernels.c/.so) here")
    optimize.set_defaults(handler=cmd_optimize)

    run = commands.add_parser(
        "run", help="load a compiled plan directory and run it, printing the latency",
        description="Load PLAN_DIR (written by `kernorch optimize -o`) without re-tuning, run it on random "
        "inputs or on .npy files given with --input NAME=FILE.npy, and print the outputs and the median latency.",
    )  # fmt: skip
    run.add_argument("plan", help="directory written by `kernorch optimize MODEL -o PLAN_DIR`")
    run.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input from a .npy file")
    run.add_argument("--runs", type=_positive_int, default=20, help="timed runs (default 20)")
    run.add_argument("--threads", type=_positive_int, default=None, help="threads (default: as saved)")
    run.add_argument("--seed", type=_non_negative_int, default=0, help="seed of random inputs (default 0)")
    run.add_argument("--runtime", choices=RUNTIMES, default="kernels",
                     help="kernels: kernel by kernel, each with its own parallel loops (default); rprogram: the "
                     "kernels' rTasks scheduled on the threads of one persistent parallel region (Rammer), from "
                     "times measured in place when the plan is loaded")  # fmt: skip
    run.set_defaults(handler=cmd_run)

    explain = commands.add_parser(
        "explain", help="print the chosen kernels and, on request, rejected candidates with the reason",
        description="Orchestrate MODEL like `optimize`, then list every kernel of the plan with its primitives, "
        "the ONNX nodes they came from and the values it writes. --rejected N also lists N rejected candidate "
        "kernels with the pruning rule and reason.",
    )  # fmt: skip
    _add_model_args(explain)
    _add_orchestration_args(explain)
    explain.add_argument("--rejected", type=_non_negative_int, default=0, metavar="N",
                         help="list N rejected candidates")  # fmt: skip
    explain.add_argument("--gir", type=_non_negative_int, metavar="K",
                         help="print generated kernel K's GIR (memory slices, gOperators, parallel units) as lowered "
                         "and after the rewrite rules, with the global bytes each moves, and the C rendered from it")
    explain.add_argument("--svg", metavar="PLAN.svg",
                         help="draw the primitive graph with each kernel as a coloured cluster (library calls, "
                         "generated C, fallbacks; costs; primitives computed by several kernels outlined in red)")
    explain.add_argument("--schedule", metavar="OUT.png",
                         help="compile the plan, run it as an rProgram and draw its Gantt chart (vEU x time from "
                         "measured timestamps, one colour per kernel); prints both runtimes' medians, the "
                         "simulator's prediction and which kernels ran side by side")  # fmt: skip
    explain.add_argument("--html", metavar="REPORT.html",
                         help="write one self-contained page: the picture, the kernel table, rewrites, layout")
    explain.set_defaults(handler=cmd_explain)

    bench = commands.add_parser(
        "bench", help="time kernorch against onnxruntime (and its own greedy / unfused plans) side by side",
        description="Measure, in one run, onnxruntime (all graph optimizations, and none) and kernorch (optimal "
        "plan with and without primitive-graph rewrites, greedy-fusion and no-fusion plans on the same code "
        "generator, and the optimal plan again as an rProgram), each in its own worker process, "
        "interleaved round by round, with the same inputs and thread count. Outputs are checked against "
        "onnxruntime before timing. Prints median/min/max, the ratio to the best peer and the roofline bound.",
    )  # fmt: skip
    bench.add_argument("model", help="path to an ONNX model")
    _add_strict_arg(bench)
    bench.add_argument("--runs", type=_positive_int, default=20, help="timed runs per contender (default 20)")
    _add_threads_arg(bench, "threads for every contender")
    _add_cost_arg(bench, "the cost model of kernorch's plans")
    bench.add_argument("--quick", action="store_true",
                       help="only kernorch's optimal plan against onnxruntime and OpenVINO (no rewrite-free, greedy, "
                            "unfused or rProgram contenders): one plan instead of three")
    bench.add_argument("--compare-layouts", action="store_true",
                       help="also time kernorch's optimal plans with every conv channels-last (torch.compile's rule) "
                       "and with everything NCHW, next to the default whole-graph layout choice")
    bench.add_argument("--rewrite-budget", type=_seconds, default=None, metavar="SECONDS",
                       help="time for trying the cost-guided rewrites (default: as optimize)")
    bench.add_argument("--json", action="store_true",
                       help="one JSON object: model, contenders {name: {median_ms, min_ms, max_ms}}, "
                       "speedup_vs_best_peer, plus kernels and roofline")  # fmt: skip
    bench.set_defaults(handler=cmd_bench)

    demo = commands.add_parser(
        "demo", help="fission and check the built-in models (self-attention, conv-norm-act)",
        description="Build two small models with onnx.helper (a self-attention block, a conv-norm-act block), "
        "check the primitive graph against onnxruntime, optimize and compile it, print the kernel plan, and "
        "compare the compiled plan's output and latency with onnxruntime (same inputs, same thread count).",
    )  # fmt: skip
    _add_threads_arg(demo, "threads for kernorch and onnxruntime")
    demo.add_argument("--runs", type=_positive_int, default=50, help="timed runs per contender (default 50)")
    _add_cost_arg(demo, "the cost model of the plans")
    demo.add_argument("--pictures", default="kernorch-demo", metavar="DIR",
                      help="where the plan pictures (SVG) are written (default ./kernorch-demo)")
    demo.set_defaults(handler=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    from kernorch.errors import FallbackWarning

    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    with warnings.catch_warnings(record=True) as caught:  # kernorch's warnings are about the model: one line
        warnings.simplefilter("always", FallbackWarning)
        try:
            code = handler(args)
        except KernorchError as error:  # the error alone names the cause (a fallback's failure says so)
            print(f"kernorch: error: {error}", file=sys.stderr)
            return error.exit_code
    for warning in caught:
        if issubclass(warning.category, FallbackWarning):
            print(f"kernorch: warning: {warning.message}", file=sys.stderr)
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    return code


if __name__ == "__main__":
    sys.exit(main())
