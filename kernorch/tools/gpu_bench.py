"""`kernorch bench MODEL --device cuda`: kernorch's GPU plan against PyTorch on the same GPU, in one run.

Contenders, each in its own process (its own CUDA context, caching allocator and compile caches), on the same
seeded inputs already on the device:
- `kernorch`: the plan (Triton kernels, cuBLAS/cuDNN through torch) replayed as one CUDA graph;
- `torch eager`: the model's primitive graph as torch operations (tools/torch_graph.py: cuDNN/cuBLAS for the
  linear primitives, a torch kernel per other primitive);
- `torch.compile`: that function under Inductor, mode "default" and "max-autotune".
Every contender's output is compared with onnxruntime's (on the CPU) before it is timed. Times are the median
of `runs` calls, each timed with CUDA events after warm-up; ratios are of medians from this one run. Without a
GPU (`device="cpu"`, what the tests do) the same code runs on the CPU, kernorch in Triton's interpreter.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

CONTENDERS = ("kernorch", "torch eager", "torch.compile", "torch.compile max-autotune")


def _timed(function: Callable[[], Any], runs: int, cuda: bool) -> list[float]:
    import torch

    for _ in range(3):
        function()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            function()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        else:
            began = time.perf_counter()
            function()
            times.append(time.perf_counter() - began)
    return times


def _contender(name: str, model_path: str, options: dict[str, Any], device: str, runs: int,
               feeds: dict[str, np.ndarray], expected: list[np.ndarray]) -> dict[str, Any]:  # fmt: skip
    """One contender's result: median/min ms and its largest relative error against onnxruntime (or its error)."""
    import torch

    cuda = device == "cuda"
    try:
        if name == "kernorch":
            from kernorch.api import compile
            from kernorch.runtime.gpu_plan import GpuModel

            model = compile(model_path, **options, interpret=not cuda)
            assert isinstance(model, GpuModel)
            program = model.program
            inputs = {k: torch.from_numpy(v).to(device) for k, v in feeds.items()}

            def call() -> list[Any]:
                return program.run_on_device(inputs)

            outputs = call()
            program.check_errors()
            extra: dict[str, Any] = {"kernels": len(model.kernels), "plan_cost_ms": model.metadata["plan_cost"] * 1e3,
                                     "host_kernels": program.host_steps}  # fmt: skip
        else:
            from kernorch.pipeline import import_graph
            from kernorch.tools.torch_graph import TorchGraph

            graph = import_graph(model_path)
            eager = TorchGraph(graph, torch.device(device))
            inputs = {k: torch.from_numpy(v).to(device) for k, v in feeds.items()}

            def run(values: dict[str, Any]) -> list[Any]:
                return eager(values)

            function: Callable[[dict[str, Any]], list[Any]] = run
            if name.startswith("torch.compile"):
                mode = "max-autotune" if name.endswith("max-autotune") else "default"
                function = torch.compile(run, mode=mode)

            def call() -> list[Any]:
                with torch.no_grad():
                    return function(inputs)

            outputs = call()
            extra = {"host_nodes": eager.host_nodes}
        errors = [float(np.max(np.abs(o.detach().cpu().numpy() - e)) / max(float(np.max(np.abs(e))), 1e-30))
                  for o, e in zip(outputs, expected, strict=True)]  # fmt: skip
        times = _timed(call, runs, cuda)
        return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3, "rel_err": max(errors),
                **extra}  # fmt: skip
    except Exception as error:  # noqa: BLE001 - a contender that fails is reported, the others still run
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}",
                "trace": traceback.format_exc()[-2000:]}  # fmt: skip


def _in_process(queue: Any, *args: Any) -> None:
    queue.put(_contender(*args))


def bench_gpu(model_path: str, options: dict[str, Any], runs: int = 50, device: str = "cuda",
              contenders: tuple[str, ...] = CONTENDERS, timeout: float = 600.0) -> dict[str, Any]:  # fmt: skip
    """Every contender in its own (spawned) process; the report's ratios are kernorch's against each."""
    import onnxruntime as ort

    from kernorch.pipeline import import_graph
    from kernorch.runtime.feeds import graph_feeds

    graph = import_graph(model_path)
    feeds = graph_feeds(graph, seed=0)
    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    context = multiprocessing.get_context("spawn")
    results: dict[str, Any] = {}
    for name in contenders:
        queue = context.Queue()
        process = context.Process(target=_in_process,
                                  args=(queue, name, model_path, options, device, runs, feeds, expected))  # fmt: skip
        process.start()
        try:
            results[name] = queue.get(timeout=timeout)
        except Exception:  # noqa: BLE001 - the queue's Empty: the contender ran out of time
            results[name] = {"error": f"no result within {timeout:.0f} s"}
        process.join(5)
        if process.is_alive():
            process.kill()
    ours = results.get("kernorch", {}).get("median_ms")
    speedups = {name: result["median_ms"] / ours for name, result in results.items()
                if name != "kernorch" and ours and "median_ms" in result}  # fmt: skip
    return {"model": model_path, "device": device, "runs": runs, "contenders": results, "speedup_vs": speedups}


def format_gpu_report(report: dict[str, Any]) -> list[str]:
    lines = [f"{report['model']} on {report['device']}, median of {report['runs']} runs"]
    for name, result in report["contenders"].items():
        if "error" in result:
            lines.append(f"  {name:<28} failed: {result['error']}")
            continue
        ratio = report["speedup_vs"].get(name)
        lines.append(f"  {name:<28} {result['median_ms']:9.3f} ms (min {result['min_ms']:.3f}), rel err "
                     f"{result['rel_err']:.1e}" + (f", kernorch {ratio:.2f}x" if ratio else ""))  # fmt: skip
    return lines
