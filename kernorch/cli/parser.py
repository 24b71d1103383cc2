"""The `kernorch` argument parser: every subcommand, its arguments and its help."""

from __future__ import annotations

import argparse

from kernorch.cli.commands import cmd_bench, cmd_check, cmd_conformance, cmd_demo, cmd_optimize, cmd_run
from kernorch.cli.common import (
    add_cost_arg,
    add_device_args,
    add_layout_arg,
    add_model_args,
    add_orchestration_args,
    add_rewrite_args,
    add_shape_policy_args,
    add_strict_arg,
    add_threads_arg,
    add_validate_arg,
    non_negative_float,
    non_negative_int,
    positive_int,
    seconds,
)
from kernorch.cli.explain import cmd_explain
from kernorch.options import RUNTIMES


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
        "magnitude). Exit 0 when the relative error is within --rtol, else 1 — except that a quantized model "
        "beyond it is arbitrated: where its quantizers' integers leave onnxruntime's, each is evaluated in float64 "
        "and must be kernorch's exact rounding or a tie (the README's check entry).",
    )  # fmt: skip
    add_model_args(check, several_shapes=True)
    check.add_argument("--seed", type=non_negative_int, default=0, help="seed of the random inputs (default 0)")
    check.add_argument("--rtol", type=non_negative_float, default=None,
                       help="relative error tolerance (default 1e-4; 2e-2 with --precision bf16, against "
                       "onnxruntime's float32 result)")
    check.add_argument("--compiled", action="store_true",
                       help="run the optimized, compiled plan instead of the reference interpreter")
    add_cost_arg(check, "with --compiled, the cost model that picks the plan")
    add_device_args(check)
    add_rewrite_args(check)
    add_layout_arg(check)
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
    conformance.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                             help="bf16: every float32 matmul and convolution multiplies in bfloat16 (float32 sums), "
                             "and a case with one passes within 2e-2 of its output's magnitude (default fp32)")
    conformance.set_defaults(handler=cmd_conformance)

    optimize = commands.add_parser(
        "optimize", help="find the optimal kernel orchestration of a model (Korch BLP) and report it",
        description="Fission MODEL, partition the primitive graph into subgraphs, enumerate execution states "
        "and candidate kernels, and solve the kernel-orchestration BLP with HiGHS. Prints per subgraph the "
        "primitives, states, candidates, solve seconds and solver status, then the plan cost next to the "
        "greedy-fusion baseline on the same cost model. A model with symbolic dims and several shapes (--input-shape "
        "repeated, or --dim sizes) gets a plan per shape set, tuned one after the other — kernels the shapes share "
        "are measured once — and -o saves them all in one directory that `kernorch run` and `kernorch.load` "
        "read (a shape without a plan is specialised on first use).",
    )  # fmt: skip
    add_model_args(optimize, several_shapes=True)
    add_shape_policy_args(optimize)
    add_orchestration_args(optimize)
    optimize.add_argument("--json", action="store_true",
                          help="one JSON object: subgraphs, plan_cost, greedy_cost, kernels")  # fmt: skip
    optimize.add_argument("-o", "--output", metavar="PLAN_DIR",
                          help="compile the plan and save it (plan.json, weights.npz, kernels.c/.so) here")
    optimize.set_defaults(handler=cmd_optimize)

    run = commands.add_parser(
        "run", help="load a compiled plan directory and run it, printing the latency",
        description="Load PLAN_DIR (written by `kernorch optimize -o`) without re-tuning, run it on random "
        "inputs or on .npy files given with --input NAME=FILE.npy, and print the outputs and the median latency. "
        "A directory of several plans (a model with symbolic dims) runs each saved plan, or with --input the one "
        "for those inputs' shapes.",
    )  # fmt: skip
    run.add_argument("plan", help="directory written by `kernorch optimize MODEL -o PLAN_DIR`")
    run.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input from a .npy file")
    run.add_argument("--runs", type=positive_int, default=20, help="timed runs (default 20)")
    run.add_argument("--threads", type=positive_int, default=None, help="threads (default: as saved)")
    run.add_argument("--seed", type=non_negative_int, default=0, help="seed of random inputs (default 0)")
    run.add_argument("--runtime", choices=RUNTIMES, default="kernels",
                     help="kernels: kernel by kernel, each with its own parallel loops (default); rprogram: the "
                     "kernels' rTasks scheduled on the threads of one persistent parallel region (Rammer), from "
                     "times measured in place when the plan is loaded")  # fmt: skip
    run.set_defaults(handler=cmd_run)

    explain = commands.add_parser(
        "explain", help="print the chosen kernels and, on request, rejected candidates with the reason",
        description="Orchestrate MODEL like `optimize`, then list every kernel of the plan with its primitives, "
        "the ONNX nodes they came from, the dtypes it reads and the values it writes with theirs (int8 kept between "
        "kernels shows). --rejected N also lists N rejected candidate "
        "kernels with the pruning rule and reason. Two --input-shape sets (a model with symbolic dims) plan both "
        "shapes and list the kernels in which the two plans differ. --range plans a range of sizes once and lists "
        "its kernels, each taking the sizes or the same at every size, and what each shape runs on; MODEL may be a "
        "saved directory of plans (`optimize --range ... -o DIR`): which shapes run their own plan, which a "
        "range's generic plan.",
    )  # fmt: skip
    add_model_args(explain)
    add_orchestration_args(explain)
    explain.add_argument("--range", action="append", metavar="NAME=LOW..HIGH[:STEP],...",
                         help="plan MODEL once for every size in the range (as `optimize --range`) and explain it")
    explain.add_argument("--rejected", type=non_negative_int, default=0, metavar="N",
                         help="list N rejected candidates")  # fmt: skip
    explain.add_argument("--gir", type=non_negative_int, metavar="K",
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
    bench.add_argument("--input-shape", action="append", metavar="NAME=D1xD2x...",
                       help="bind a model input to a static shape (a model with symbolic dims needs one per input), "
                       "e.g. a batch of 8: input=8x3x224x224; every contender runs that shape")
    bench.add_argument("--throughput", action="store_true",
                       help="also time OpenVINO under its THROUGHPUT hint (its streams serve several requests at once; "
                       "reported per batch) and count it among the best peers")
    add_strict_arg(bench)
    bench.add_argument("--runs", type=positive_int, default=20, help="timed runs per contender (default 20)")
    add_threads_arg(bench, "threads for every contender")
    add_cost_arg(bench, "the cost model of kernorch's plans")
    add_device_args(bench)
    bench.add_argument("--quick", action="store_true",
                       help="only kernorch's optimal plan against onnxruntime and OpenVINO (no rewrite-free, greedy, "
                            "unfused or rProgram contenders): one plan instead of three")
    bench.add_argument("--compare-layouts", action="store_true",
                       help="also time kernorch's optimal plans with every conv channels-last (torch.compile's rule) "
                       "and with everything NCHW, next to the default whole-graph layout choice")
    bench.add_argument("--breakdown", action="store_true",
                       help="after timing, run kernorch's plan kernel by kernel in place and print where its time "
                       "goes: linear kernels (fp32/bf16) against the fp32 peak and their roofline (the peak, or the "
                       "bytes they move at the streamed bandwidth, whichever bounds them), generated kernels "
                       "against the bandwidth, layout changes, Python-run kernels, and the runtime's overhead")
    bench.add_argument("--float-model", metavar="FLOAT.onnx", default=None,
                       help="a quantized model's float original: every contender's error against its onnxruntime "
                       "outputs is printed beside the error against onnxruntime on the quantized file (what "
                       "quantizing cost each contender), and kernorch's plan of the float model is timed too "
                       "(kernorch-float: what quantizing gained kernorch)")
    add_validate_arg(bench)
    bench.add_argument("--rewrite-budget", type=seconds, default=None, metavar="SECONDS",
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
    add_threads_arg(demo, "threads for kernorch and onnxruntime")
    demo.add_argument("--runs", type=positive_int, default=50, help="timed runs per contender (default 50)")
    add_cost_arg(demo, "the cost model of the plans")
    demo.add_argument("--pictures", default="kernorch-demo", metavar="DIR",
                      help="where the plan pictures (SVG) are written (default ./kernorch-demo)")
    demo.set_defaults(handler=cmd_demo)
    return parser
