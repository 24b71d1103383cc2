"""The GPU run of issue 40 in one go (bench/gpu.sh installs, then runs this): every shared model planned for the
GPU present, checked against onnxruntime and timed against PyTorch eager and torch.compile (Inductor, default and
max-autotune), each contender in its own process (kernorch/tools/gpu_bench.py). Writes one Markdown table and
its JSON. A deadline keeps the whole run inside the device's time: models and contenders that would start after
it are listed as skipped, never silently dropped.

    python bench/gpu.py ../shared/models/*.onnx --deadline 480 --out bench/results/DATE-gpu
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from kernorch.tools.gpu_bench import CONTENDERS, bench_gpu

TOLERANCE = 1e-4  # as `kernorch check`


def device_line() -> str:
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (a dry run on the CPU: kernorch in Triton's interpreter)"
    properties = torch.cuda.get_device_properties(0)
    import triton

    return (f"{properties.name}, {properties.multi_processor_count} SMs, {properties.total_memory / 2**30:.0f} GiB; "
            f"torch {torch.__version__}, CUDA {torch.version.cuda}, Triton {triton.__version__}")


def measured_levels() -> str:
    """The device's own global-memory bandwidth (a 1 GiB copy) and launch overhead (1000 tiny kernels), beside the
    preset kernorch planned with: what the GPU Target's numbers should be replaced by."""
    import torch

    from kernorch.codegen.target import GPU_TARGETS
    from kernorch.runtime.gpu_plan import device_preset

    source = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    target = torch.empty_like(source)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    target.copy_(source)
    start.record()
    for _ in range(10):
        target.copy_(source)
    end.record()
    end.synchronize()
    bandwidth = 10 * 2 * source.nbytes / (start.elapsed_time(end) * 1e-3)
    tiny = torch.zeros(1, device="cuda")
    start.record()
    for _ in range(1000):
        tiny.add_(1)
    end.record()
    end.synchronize()
    launch = start.elapsed_time(end) * 1e-3 / 1000
    preset = GPU_TARGETS[device_preset()]
    return (f"measured: global memory {bandwidth / 1e9:.0f} GB/s (preset {preset.global_bandwidth / 1e9:.0f}), "
            f"a launch {launch * 1e6:.1f} us (preset {preset.launch_overhead * 1e6:.1f}; a CUDA graph node costs less)")


def markdown(results: list[dict], device: str, seconds: float, skipped: list[str], cli_check: str) -> str:
    lines = [f"# kernorch on a GPU — {time.strftime('%Y-%m-%d')}", "", f"Device: {device}. Run: {seconds:.0f} s, "
             "every contender in its own process, median of each contender's runs (CUDA events), ratios of "
             "medians from this one run. PyTorch baseline: the model's primitive graph as torch operations "
             "(kernorch/tools/torch_graph.py: the models are ONNX exports with random weights).", "",
             f"`kernorch check --compiled --device cuda` (CLI): {cli_check}", "",
             "| model | kernels | check (rel err vs onnxruntime) | kernorch ms | " +
             " | ".join(f"{name} ms" for name in CONTENDERS[1:]) + " | vs eager | vs Inductor | vs max-autotune |",
             "|" + "---|" * (4 + 2 * (len(CONTENDERS) - 1))]  # fmt: skip
    ratios: dict[str, list[float]] = {name: [] for name in CONTENDERS[1:]}
    for report in results:
        contenders = report["contenders"]
        ours = contenders.get("kernorch", {})
        check = "failed: " + ours["error"] if "error" in ours else \
            f"{'PASS' if ours['rel_err'] <= TOLERANCE else 'FAIL'} ({ours['rel_err']:.1e})"  # fmt: skip
        cells = [Path(report["model"]).stem, str(ours.get("kernels", "-")), check,
                 f"{ours['median_ms']:.3f}" if "median_ms" in ours else "-"]  # fmt: skip
        for name in CONTENDERS[1:]:
            result = contenders.get(name, {})
            cells.append(f"{result['median_ms']:.3f}" if "median_ms" in result else result.get("error", "skipped")[:60])
        for name in CONTENDERS[1:]:
            ratio = report["speedup_vs"].get(name)
            cells.append(f"{ratio:.2f}x" if ratio else "-")
            if ratio:
                ratios[name].append(ratio)
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for name, values in ratios.items():
        if values:
            mean = math.exp(sum(map(math.log, values)) / len(values))
            lines.append(f"- kernorch vs {name}: geometric mean {mean:.2f}x over {len(values)} models "
                         f"(min {min(values):.2f}x, max {max(values):.2f}x)")  # fmt: skip
    lines.append("- Anchor: Korch reports 1.30x over the best of PyTorch, TVM and TensorRT on an A100 (TF32).")
    if skipped:
        lines.append(f"- Skipped for the deadline: {', '.join(skipped)}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--deadline", type=float, default=480.0, help="seconds for the whole run (default 480)")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--out", required=True, help="path without suffix: writes OUT.md and OUT.json")
    parser.add_argument("--tf32", action="store_true")
    args = parser.parse_args()
    started = time.time()
    device = device_line()
    cuda = "no CUDA" not in device
    if cuda:
        device += "; " + measured_levels()
    print(device, flush=True)
    smallest = min(args.models, key=lambda m: Path(m).stat().st_size)
    command = [sys.executable, "-m", "kernorch.cli", "check", smallest, "--compiled", "--device",
               "cuda" if cuda else "a100", "--cost", "analytic"]  # fmt: skip
    check = subprocess.run(command, capture_output=True, text=True, timeout=300)
    cli_check = f"{Path(smallest).stem}: exit {check.returncode}, " + \
        (check.stdout.strip().splitlines() or check.stderr.strip().splitlines() or [""])[0][:160]  # fmt: skip
    print(cli_check, flush=True)
    options = {"cost": "analytic", "device": "cuda" if cuda else "a100", "tf32": args.tf32, "rewrite_budget": 10.0}
    results, skipped = [], []
    # the cheapest first: a model whose contenders would start after the deadline is skipped
    for model in sorted(args.models, key=lambda m: Path(m).stat().st_size):
        left = args.deadline - (time.time() - started)
        if left < 60:
            skipped.append(Path(model).stem)
            continue
        contenders = CONTENDERS if left > 240 else CONTENDERS[:3]  # max-autotune only with time to tune
        report = bench_gpu(model, options, runs=args.runs, device="cuda" if cuda else "cpu",
                           contenders=contenders, timeout=min(left, 240))  # fmt: skip
        if contenders != CONTENDERS:
            report["contenders"][CONTENDERS[3]] = {"error": "skipped (deadline)"}
        results.append(report)
        print(json.dumps({k: v for k, v in report.items() if k != "contenders"}), flush=True)
    seconds = time.time() - started
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for report in results:
        for result in report["contenders"].values():
            result.pop("trace", None) if "error" not in result else None
    out.with_suffix(".json").write_text(json.dumps({"device": device, "seconds": seconds, "results": results,
                                                    "skipped": skipped, "cli_check": cli_check}, indent=1))
    out.with_suffix(".md").write_text(markdown(results, device, seconds, skipped, cli_check))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
