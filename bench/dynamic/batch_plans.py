"""Korch §6.4 on the CPU: the best orchestration depends on the batch. One model with a symbolic batch is planned at
a small and at a large batch; each plan is then run at both batches — its own, and the other's, with the same
kernels (node sets) instantiated on the other batch's graph — side by side with onnxruntime.

    .venv/bin/python bench/dynamic/batch_plans.py dynamic-models/efficientvit_b0.onnx [--small 1 --large 16]
                                                  [--bind height=128 --bind width=128]

Both batches are planned without rewrites and without layout changes (NCHW throughout): at batch 1 the safe rules
drop reshapes, and the layout pass turns transposes into reshapes, that are no-ops only there. So their primitive
graphs are the same up to the batch and a plan's kernels carry over; what differs is the orchestration alone. Prints
the kernels in which the plans differ (the primitives each fuses and the ONNX nodes they come from), the
predicted and measured times of each plan at each batch, and writes the figures as JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kernorch.frontend import input_signature
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.plan import Plan, validate_plan
from kernorch.options import Options
from kernorch.orchestrate import OrchestrationResult
from kernorch.pipeline import compile_plan, import_graph, make_cost_model, plan_graph
from kernorch.runtime.feeds import graph_feeds
from kernorch.tools.bench import time_contenders


def describe(kernel: CandidateKernel) -> str:
    prims = "+".join(kernel.graph.nodes[i].prim for i in kernel.nodes)
    origins = sorted({kernel.graph.nodes[i].origin for i in kernel.nodes})
    return f"{prims}  [{', '.join(origins)[:90]}]"


def transplant(plan: Plan, result: OrchestrationResult, cost: Any) -> Plan:
    """`plan`'s kernels (node sets and outputs) on the graph of `result`, costed by the same model."""
    graph = result.plan.graph
    kernels = [make_kernel(graph, k.nodes, k.outputs) for k in plan.kernels]
    validate_plan(graph, kernels)
    return Plan(graph, kernels, [cost.cost(k) for k in kernels])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--small", type=int, default=1)
    parser.add_argument("--large", type=int, default=16)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layout", default="nchw")
    parser.add_argument("--bind", action="append", default=[], metavar="DIM=SIZE",
                        help="the size of another symbolic dim (e.g. height=128), the same at both batches")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    signature = input_signature(str(args.model))
    bound = {name: int(size) for name, _, size in (spec.partition("=") for spec in args.bind)}
    options = Options(threads=args.threads, rewrite=False, layout=args.layout)
    cost = make_cost_model(options)
    batches = {"small": args.small, "large": args.large}
    results: dict[str, OrchestrationResult] = {}
    for label, batch in batches.items():
        sizes = {**bound, "batch": batch}
        shapes = {s.name: tuple(sizes[d] if isinstance(d, str) else d for d in s.dims) for s in signature}
        graph = import_graph(str(args.model), shapes)  # type: ignore[arg-type]
        results[label] = plan_graph(graph, options, cost_model=cost)
        print(f"planned batch {batch}: {len(results[label].plan.kernels)} kernels, predicted "
              f"{results[label].plan.cost * 1e3:.3f} ms", flush=True)
    small, large = results["small"], results["large"]
    same = [(n.prim, n.inputs, n.outputs) for n in small.plan.graph.nodes] == \
        [(n.prim, n.inputs, n.outputs) for n in large.plan.graph.nodes]
    if not same:
        print("the two batches' primitive graphs differ: a plan cannot be carried over", file=sys.stderr)
        return 2
    plans = {  # (plan's origin, batch it runs at) -> plan
        ("small", "small"): small.plan, ("large", "large"): large.plan,
        ("small", "large"): transplant(small.plan, large, cost),
        ("large", "small"): transplant(large.plan, small, cost),
    }  # fmt: skip
    own = {frozenset(k.nodes) for k in small.plan.kernels}
    other = {frozenset(k.nodes) for k in large.plan.kernels}
    print(f"\nkernels only in the batch-{args.small} plan ({len(own - other)}):")
    for kernel in small.plan.kernels:
        if frozenset(kernel.nodes) not in other:
            print("  " + describe(kernel))
    print(f"kernels only in the batch-{args.large} plan ({len(other - own)}):")
    for kernel in large.plan.kernels:
        if frozenset(kernel.nodes) not in own:
            print("  " + describe(kernel))

    figures: dict[str, Any] = {"model": args.model.name, "batches": batches, "bound": bound, "layout": args.layout,
                               "runs": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        for at, batch in batches.items():
            result = results[at]
            dirs = {f"kernorch-{origin}-plan": str(compile_plan(result, options, plans[(origin, at)])
                                                   .save(Path(work) / f"{origin}-at-{at}"))
                    for origin in batches}  # fmt: skip
            times, _, _ = time_contenders(str(args.model), ["onnxruntime", *dirs], dirs,
                                       graph_feeds(result.plan.graph), args.threads, args.runs, 5)  # fmt: skip
            medians = {name: float(np.median(t) * 1e3) for name, t in times.items()}
            figures["runs"][f"batch {batch}"] = {
                "measured_ms": medians,
                "predicted_ms": {f"kernorch-{o}-plan": plans[(o, at)].cost * 1e3 for o in batches},
                "kernels": {f"kernorch-{o}-plan": len(plans[(o, at)].kernels) for o in batches},
            }  # fmt: skip
    print(f"\n{'at batch':>8}  {'plan of':>8}  {'kernels':>7}  {'predicted ms':>12}  {'measured ms':>11}")
    for batch in batches.values():
        row = figures["runs"][f"batch {batch}"]
        for origin in batches:
            name = f"kernorch-{origin}-plan"
            print(f"{batch:>8}  {batches[origin]:>8}  {row['kernels'][name]:>7}  {row['predicted_ms'][name]:>12.3f}  "
                  f"{row['measured_ms'][name]:>11.3f}")
        print(f"{batch:>8}  {'onnxruntime':>8}  {'':>7}  {'':>12}  {row['measured_ms']['onnxruntime']:>11.3f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
