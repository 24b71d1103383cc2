"""A generation as users run it, from a cold start: kernorch against onnxruntime (and OpenVINO) on a decoder whose
cache length is a symbolic dim (bench/dynamic/decoders.py writes two).

    .venv/bin/python bench/decode.py DECODER.onnx [--prompt 64] [--tokens 128] [--threads 2]
                                     [--contenders kernorch,kernorch-serve,onnxruntime,openvino] [--json OUT.json]

Each contender runs in a process of its own, one after the other (a cold start is the point): it prepares the
model (kernorch.compile; onnxruntime's and OpenVINO's session creation — reported, not counted in the first
pass). `kernorch` is given the steps' range (sequence=1, past=1..prompt+tokens): one shape-generic plan serves
every step; `kernorch-serve` is not (each new length is served by onnxruntime, as kernorch does for a shape it
has no plan for). Each contender then runs the generation twice: prefill of a
seeded random prompt, then `tokens` greedy steps, each feeding back the cache the previous call returned. The
first pass is what a user's first generation costs; the second is the steady state. Reported: each pass's total,
the per-token latency percentiles of the steps, and whether the tokens equal onnxruntime's.

The decoder's inputs: `ids` [1, sequence], `past_keys` / `past_values` [layers, 1, kv_heads, past, head_dim];
its outputs: `logits` [1, sequence, vocab] and the caches one position longer.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

CONTENDERS = ("kernorch", "kernorch-serve", "onnxruntime", "openvino")


def cache_shape(model: Path) -> tuple[int, ...]:
    """[layers, 1, kv_heads, 0, head_dim]: the empty cache of the prefill."""
    inputs = {i.name: i for i in onnx.load(str(model), load_external_data=False).graph.input}
    dims = inputs["past_keys"].type.tensor_type.shape.dim
    return tuple(0 if d.dim_param else int(d.dim_value) for d in dims)


def runner(name: str, model: Path, threads: int, ranges: list[str]) -> Any:
    """A function feeds -> the outputs (a list) for the contender, prepared: kernorch compiled with `ranges` (its
    generic plans: "kernorch") or without them (each new shape served by onnxruntime: "kernorch-serve"),
    onnxruntime, OpenVINO in float32. bench/varying_length.py runs its contenders with this too."""
    if name in ("kernorch", "kernorch-serve"):
        import kernorch

        compiled = kernorch.compile(str(model), threads=threads, ranges=ranges if name == "kernorch" else [])
        if name == "kernorch" and not compiled.generic_plans:
            raise SystemExit(f"no generic plan: {compiled.range_refusals}")
        return lambda feeds: list(compiled.run(feeds).values())
    if name == "onnxruntime":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        return lambda feeds: session.run(None, feeds)
    import openvino

    compiled_ov = openvino.Core().compile_model(str(model), "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                                    "INFERENCE_PRECISION_HINT": "f32"})  # fmt: skip
    request = compiled_ov.create_infer_request()
    return lambda feeds: [np.array(v) for v in request.infer(feeds).values()]


def _generate(run: Any, ids: np.ndarray, empty: tuple[int, ...], tokens: int) -> dict[str, Any]:
    keys = values = np.zeros(empty, np.float32)
    started = time.perf_counter()
    logits, keys, values = run({"ids": ids, "past_keys": keys, "past_values": values})
    prefill = time.perf_counter() - started
    generated, steps = [int(np.argmax(logits[0, -1]))], []
    for _ in range(tokens - 1):
        started = time.perf_counter()
        logits, keys, values = run({"ids": np.array([[generated[-1]]], np.int64), "past_keys": keys,
                                    "past_values": values})  # fmt: skip
        steps.append(time.perf_counter() - started)
        generated.append(int(np.argmax(logits[0, -1])))
    return {"tokens": generated, "prefill_ms": prefill * 1e3, "steps_ms": [s * 1e3 for s in steps],
            "total_ms": (prefill + sum(steps)) * 1e3}  # fmt: skip


def worker(name: str, model: Path, threads: int, prompt: int, tokens: int) -> dict[str, Any]:
    empty = cache_shape(model)
    started = time.perf_counter()
    # the prefill's cache is empty (kernorch plans non-empty tensors: onnxruntime serves it); every step's length
    # is new: "kernorch" plans the steps' range once (one shape-generic plan, shapes/generic.py)
    run = runner(name, model, threads, [f"sequence=1,past=1..{prompt + tokens}"])
    prepared = time.perf_counter() - started
    ids = np.random.default_rng(0).integers(0, 1000, (1, prompt)).astype(np.int64)
    first = _generate(run, ids, empty, tokens)
    steady = _generate(run, ids, empty, tokens)
    return {"prepare_s": prepared, "first": first, "steady": steady}


def percentiles(steps: list[float]) -> str:
    """p50 / p90 / p99 of per-call milliseconds (bench/varying_length.py reports with this too)."""
    p50, p90, p99 = np.percentile(steps, [50, 90, 99])
    return f"{p50:.3f} / {p90:.3f} / {p99:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--prompt", type=int, default=64, help="prompt length (default 64)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated (default 128)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)  # one contender, in this process
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.threads, args.prompt, args.tokens)))
        return 0
    results: dict[str, Any] = {}
    for name in args.contenders.split(","):
        command = [sys.executable, __file__, str(args.model), "--worker", name, "--prompt", str(args.prompt),
                   "--tokens", str(args.tokens), "--threads", str(args.threads)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
        if done.returncode:
            results[name] = {"error": (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1]}
            continue
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    reference = results.get("onnxruntime", {}).get("first", {}).get("tokens")
    print(f"{args.model.name}: prefill {args.prompt} tokens, then {args.tokens - 1} steps; {args.threads} threads; "
          f"{platform.processor() or platform.machine()}")  # fmt: skip
    print("| contender | prepare s | first pass ms | steady pass ms | first pass per token p50/p90/p99 ms "
          "| steady per token p50/p90/p99 ms | prefill ms (first / steady) | tokens = onnxruntime's |")
    print("|---|---|---|---|---|---|---|---|")
    for name, result in results.items():
        if "error" in result:
            print(f"| {name} | failed: {result['error'][:150]} |||||||")
            continue
        first, steady = result["first"], result["steady"]
        same = "—" if reference is None else ("yes" if first["tokens"] == reference else "NO")
        print(f"| {name} | {result['prepare_s']:.2f} | {first['total_ms']:.1f} | {steady['total_ms']:.1f} | "
              f"{percentiles(first['steps_ms'])} | {percentiles(steady['steps_ms'])} | "
              f"{first['prefill_ms']:.2f} / {steady['prefill_ms']:.2f} | {same} |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "prompt": args.prompt, "tokens": args.tokens,
                                         "threads": args.threads, "results": results}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
