"""Stacked LSTM layers as waves (one `lstm_stack`) against layer after layer, measured (issue 13, deliverable 7).

For each model, two plans of the same graph, both orchestrated with profiled costs:
- layer by layer: each layer's input projection a oneDNN matmul, its scan split over every thread (a barrier
  per step);
- waves: the rule lstm-layers-as-waves applied everywhere, so the stacked layers are one kernel whose threads
  own layers and run (layer, chunk) rTasks side by side (codegen/native/lstm_stack.py).
Both run kernel by kernel in this process, alternately; medians and best runs are compared. Then what
`kernorch.compile`'s cost-guided search chose for the model: every merge it tried, with the local plan's
profiled cost before and after.

    python bench/lstm_waves.py [--runs 40] [MODEL.onnx ...]   (default: lstm_tc and three small stacks)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import onnx

from kernorch.options import Options
from kernorch.pipeline import compile_plan, import_graph, plan_graph
from kernorch.rewrite import REWRITE_RULES, apply_rules, rewrite
from kernorch.runtime.compiled import CompiledModel
from kernorch.runtime.feeds import graph_feeds
from kernorch.tools.demo_models import stacked_lstm

RULE = "lstm-layers-as-waves"
MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


def _times_ms(compiled: list[CompiledModel], feeds: dict[str, np.ndarray], runs: int) -> list[tuple[float, float]]:
    """(median, best) ms of each model, run alternately (this host's noise comes in bursts that last seconds)."""
    samples: list[list[float]] = [[] for _ in compiled]
    for model in compiled:
        model.run(feeds)
    for _ in range(runs):
        for i, model in enumerate(compiled):
            started = time.perf_counter()
            model.run(feeds)
            samples[i].append(time.perf_counter() - started)
    return [(statistics.median(s) * 1e3, min(s) * 1e3) for s in samples]


def compare(name: str, model: onnx.ModelProto, runs: int) -> None:
    options = Options()
    graph, _ = rewrite(import_graph(model))  # the safe rules, as the pipeline runs them first
    stacked, _ = apply_rules(graph, [REWRITE_RULES[RULE]])
    plain = options.with_(rewrite=False)
    layered = compile_plan(plan_graph(graph, plain), plain)
    waves = compile_plan(plan_graph(stacked, plain), plain)
    chosen_result = plan_graph(graph, options)
    chosen = compile_plan(chosen_result, options)
    stacks = [len(k.primitives[0].attr("unit_blocks")) for k in chosen.kernels if k.primitives[0].prim == "lstm_stack"]
    feeds = graph_feeds(graph)
    (layered_ms, layered_best), (waves_ms, waves_best), (chosen_ms, _) = _times_ms([layered, waves, chosen], feeds,
                                                                                  runs)  # fmt: skip
    stacked = f"stacks of {', '.join(map(str, stacks))} layers" if stacks else "no stack"
    print(f"{name}: layer by layer {layered_ms:.3f} ms (best {layered_best:.3f}), waves {waves_ms:.3f} ms "
          f"(best {waves_best:.3f}): {layered_ms / waves_ms:.2f}x, best {layered_best / waves_best:.2f}x; chosen "
          f"plan {chosen_ms:.3f} ms with {stacked}")  # fmt: skip
    report = chosen_result.rewrite_report
    for trial in [t for t in (report.trials if report else []) if t.rule == RULE]:
        print(f"    tried at {trial.origin}: {trial.cost_before * 1e3:.3f} -> {trial.cost_after * 1e3:.3f} ms "
              f"{'kept' if trial.kept else 'rejected'}{' (judged like an identical site)' if trial.reused else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    models = [(path.stem, onnx.load(path)) for path in args.models] or [
        ("lstm_tc", onnx.load(MODELS / "lstm_tc.onnx")),
        ("stack 4 x 64", stacked_lstm(4, 64, 100)),
        ("stack 8 x 32", stacked_lstm(8, 32, 100)),
        ("stack 4 x 128", stacked_lstm(4, 128, 100)),
    ]
    for name, model in models:
        compare(name, model, args.runs)


if __name__ == "__main__":
    main()
