"""`kernorch bench`: kernorch side by side with its peers, each contender in its own worker process.

Peers: onnxruntime with all graph optimizations (and with none, for reference), and OpenVINO (latency hint, one
stream, the same thread count) when the `openvino` package is installed: `openvino` with its inference precision
hint set to f32, and `openvino-default` without a hint, which is what users get — bf16 on CPUs with bf16
instructions. The *best peer* is the faster of onnxruntime and OpenVINO fp32; with `--precision bf16` it is the
faster of onnxruntime (its CPU provider has no bf16 path for most operators: float32) and OpenVINO's default.
Every contender's error against onnxruntime's float32 outputs is printed beside its time and held to a
tolerance: 1e-4 for float32 contenders, 2e-2 for bf16 ones (kernorch in bf16 mode, OpenVINO's default) and for every
contender of a quantized model (a few quantization steps: tools/check.py, QUANTIZED_RTOL).
kernorch: its optimal plan; its optimal plan without primitive-graph rewrites
(`--no-rewrite`); its greedy-fusion plan and a no-fusion plan (one kernel per primitive) of the rewritten
graph, on the same code generator; with `--compare-layouts`, also its optimal plans under the other layout
policies (every conv channels-last, torch.compile's rule; and all NCHW). Workers
are spawned fresh (no OpenMP or thread pool shared with another contender) with the same thread count,
receive the same inputs, and run round by round, interleaved, so machine drift hits all alike; each slice of
timed runs follows a pause (another worker's spinning threads go idle) and untimed runs for `WARM_UP_SECONDS`
(the machine wakes up from the pause over the first milliseconds: steady state is what is compared). Every
contender's outputs are checked against onnxruntime before any timing.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from kernorch.errors import KernorchError, PeerWarning
from kernorch.frontend import checked_proto
from kernorch.ir.kernel import make_kernel
from kernorch.ir.plan import Plan, validate_plan
from kernorch.options import Options
from kernorch.orchestrate import OrchestrationResult
from kernorch.pipeline import Progress
from kernorch.runtime.feeds import graph_feeds
from kernorch.runtime.timing import time_call
from kernorch.tools.check import quantized, run_onnxruntime, worst_relative
from kernorch.tools.quantized_check import widened

OPENVINO_DEFAULT = "openvino-default"  # no precision hint: bf16 on CPUs that have it, what users run
PEERS = ("onnxruntime", "openvino", OPENVINO_DEFAULT, "onnxruntime-noopt")
BEST_PEERS = ("onnxruntime", "openvino")  # "best peer" is the faster of these; the first is the reference
BEST_PEERS_BF16 = ("onnxruntime", OPENVINO_DEFAULT)  # with --precision bf16
KERNORCH_FP32 = "kernorch-fp32"  # with --precision bf16: the float32 plan beside the bf16 one
# with --float-model: kernorch's plan of the quantized model's float original, beside its plan of the quantized one
# (what quantizing gains kernorch), held to the float model's onnxruntime outputs
KERNORCH_FLOAT = "kernorch-float"
# OpenVINO's THROUGHPUT hint (`--throughput`): its streams split the threads and serve several requests at once, so
# a timed run submits as many copies of the batch as it asks for and counts the time per batch
THROUGHPUT_PEER = "openvino-throughput"
COOL_DOWN_SECONDS = 0.2
# Untimed runs at the start of each slice, until this much time has passed: after the cool-down pause the machine
# wakes up over the first 1-2 ms (squeezenet1_1 at 64x64, medians by position in slices of 8: 1.10, 0.71, 0.62,
# 0.59, 0.58 ms for onnxruntime; 1.06, 0.77, 0.59, 0.58, 0.52 for kernorch), so with 4 runs a slice the median of a
# sub-millisecond model sat in that ramp, and the fastest contender spent more of its runs there
WARM_UP_SECONDS = 0.01
KERNORCH = ("kernorch", "kernorch-norewrite", "kernorch-greedy", "kernorch-unfused")
RPROGRAM = "kernorch-rprogram"  # kernorch's plan, the same plan directory, run as an rProgram (schedule/)
LAYOUT_CONTENDERS = {"kernorch-channels-last": "channels-last", "kernorch-nchw": "nchw"}


def openvino_available() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


class WorkerFailed(KernorchError):
    """A contender's worker could not set up or run (its message names the contender and the cause)."""

    exit_code = 1


class BenchMismatch(KernorchError):
    """A contender's outputs differ from onnxruntime: nothing is timed (exit 1)."""

    exit_code = 1


def _worker(connection: Connection, contender: str, model_path: str, plan_dir: str, threads: int) -> None:
    try:
        _serve(connection, contender, model_path, plan_dir, threads)
    except Exception as error:  # noqa: BLE001 - reported to the parent in one line: it stops the bench, or a
        # peer that cannot run the model is left out (time_contenders)
        connection.send(WorkerFailed(f"{contender}: {type(error).__name__}: {_cause(error)}"))


def _cause(error: Exception) -> str:
    """The line of an error message that says why: OpenVINO's start with source locations ("Exception from
    src/...:"), and its summary names the operators it has no rule for."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(("Exception from ", "Check '"))]
    summary = [line.lstrip("- ") for line in said if line.startswith("-- No conversion rule")]
    return (summary or said or lines or [""])[0][:300]


def _serve(connection: Connection, contender: str, model_path: str, plan_dir: str, threads: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    feeds: dict[str, np.ndarray] = connection.recv()
    compiled: Any = None  # kernorch's plan, in a kernorch worker
    if contender.startswith("onnxruntime"):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: its warnings are not ours to print
        if contender == "onnxruntime-noopt":
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]

        def run() -> dict[str, np.ndarray]:
            return dict(zip(names, session.run(names, feeds), strict=True))
    elif contender.startswith("openvino"):
        import onnx
        import openvino as ov

        core = ov.Core()
        source = core.read_model(model_path)
        if any(port.get_partial_shape().is_dynamic for port in source.inputs):  # fixed to the feeds', like ours
            source.reshape({port.get_any_name(): list(feeds[port.get_any_name()].shape) for port in source.inputs})
        hint = {"PERFORMANCE_HINT": "THROUGHPUT"} if contender == THROUGHPUT_PEER else \
            {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        if contender != OPENVINO_DEFAULT:
            hint["INFERENCE_PRECISION_HINT"] = "f32"
        network = core.compile_model(source, "CPU", {"INFERENCE_NUM_THREADS": threads, **hint})
        request = network.create_infer_request()
        # OpenVINO may rename outputs (e.g. dynamo exports): its ports follow the model's output order
        names = [output.name for output in onnx.load(model_path, load_external_data=False).graph.output]
        outputs = list(zip(names, network.outputs, strict=True))

        def run() -> dict[str, np.ndarray]:
            request.infer(feeds)
            return {name: np.array(request.get_tensor(port).data) for name, port in outputs}  # copied, like ours

        if contender == THROUGHPUT_PEER:
            copies = int(network.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
            queue = ov.AsyncInferQueue(network, copies)
            check = run

            def run() -> dict[str, np.ndarray]:
                for _ in range(copies):
                    queue.start_async(feeds)
                queue.wait_all()
                return {}

            connection.send(check())
            _timing_loop(connection, run, feeds, per_call=copies)
            return
    else:
        import kernorch

        compiled = kernorch.load(plan_dir, threads=threads)

        def run() -> dict[str, np.ndarray]:
            return compiled.run(feeds)

    connection.send(run())
    _timing_loop(connection, run, feeds, compiled)


def _timing_loop(connection: Connection, run: Any, feeds: dict[str, np.ndarray], compiled: Any = None,
                 per_call: int = 1) -> None:  # fmt: skip
    """Answer the parent's commands: time `runs` calls (seconds per batch: a call that ran `per_call` batches
    counts as that many), schedule the rProgram (a kernorch worker), stop."""
    while True:
        command, count = connection.recv()
        if command == "stop":
            return
        if command == "prepare":  # the rProgram is calibrated here, once every worker is loaded and idle
            runner = compiled.executor.build_rprogram(feeds)
            compiled.executor.runtime = "rprogram"
            assert runner.program is not None
            connection.send({"outputs": run(), "predicted_ms": runner.predicted_seconds() * 1e3,
                             "program": runner.program.describe(), "choice": runner.choice,
                             "candidates_ms": {name: s * 1e3 for name, s in runner.measured.items()}})  # fmt: skip
            continue
        warm_until = time.perf_counter() + WARM_UP_SECONDS
        run()
        while time.perf_counter() < warm_until:
            run()
        connection.send([sample / per_call for sample in time_call(run, runs=count, warmup=0).samples])


@dataclass
class ContenderResult:
    median_ms: float
    min_ms: float
    max_ms: float
    rel_err: float  # worst output's max abs error / its max |onnxruntime float32 value|
    fp32_err: float | None = None  # a quantized model's: the same against the float model's outputs (--float-model)


def _results(times: dict[str, list[float]], errors: dict[str, float],
             float_errors: dict[str, float]) -> dict[str, ContenderResult]:  # fmt: skip
    return {name: ContenderResult(float(np.median(t) * 1e3), float(np.min(t) * 1e3), float(np.max(t) * 1e3),
                                  errors[name], float_errors.get(name)) for name, t in times.items()}  # fmt: skip


def tolerance(contender: str, precision: str, quantized_model: bool = False, spread: float = 0.0) -> float:
    """The error a contender's outputs may have against onnxruntime's float32 ones. A quantized model's: kernorch's
    as `kernorch check` allows (a few quantization steps, or twice the `spread` between onnxruntime's own int8 and
    float runs: tools/quantized_check.py; the bench also counts OpenVINO's int8 run's distance from onnxruntime as
    spread: on efficientnet_b0's static QDQ file onnxruntime's two runs agree exactly, OpenVINO is 3.2e-2 away and
    kernorch 2.4e-2); a peer's is reported, not held (each quantizes its own way)."""
    from kernorch.tools.check import default_rtol

    if quantized_model:
        if not contender.startswith("kernorch"):
            return math.inf
        return widened(default_rtol("fp32", True), spread)
    bf16 = contender == OPENVINO_DEFAULT or (precision == "bf16" and contender.startswith("kernorch")
                                             and contender != KERNORCH_FP32)  # fmt: skip
    return default_rtol("bf16" if bf16 else "fp32", quantized_model)


def unfused_plan(result: OrchestrationResult) -> Plan:
    """One kernel per primitive, on the same graph and code generator."""
    graph = result.plan.graph
    needed = set(graph.outputs) | {v for n in graph.nodes for v in n.inputs}
    kernels = [make_kernel(graph, (i,), tuple(o for o in node.outputs if o in needed))
               for i, node in enumerate(graph.nodes)]  # fmt: skip
    validate_plan(graph, kernels)
    return Plan(graph, kernels, [math.nan] * len(kernels))


INTEGER_PRODUCTS = ("matmul_integer", "conv_integer")


def roofline_bound(graph: Any, options: Options, float_rate: float | None = None) -> dict[str, float]:
    """The graph's floors on this machine: compute (its linear flops at the measured fp32 peak with the bench's
    threads; in bf16, where the CPU multiplies bfloat16, at BF16_RATE times that peak, as if every float product
    were bf16; integer products at the int8 rate) and memory (inputs, weights and outputs moved once at the measured
    bandwidth; in bf16 a product's constant weights at two bytes each). `bound_ms` is their sum, what the full bench
    holds kernorch against; `floor_ms` the larger of the two: no plan computing the graph's products directly (no
    Winograd) at that rate runs faster, whoever's, so a peer at `floor_ms` x N can be beaten by about N at most
    (bench_ceiling). The calibrated peak is oneDNN's GEMM rate, a little below the instruction peak: `float_rate`
    (flop/s) replaces it by one measured apart (bench/zoo/ceiling.py's probe), for a floor no kernel passes."""
    from kernorch.cost.analytic import BF16_RATE, calibrate_this_machine, int8_rate, primitive_flops
    from kernorch.ir.primitives import PRIMITIVES, Kind
    from kernorch.machine import bf16_supported

    device = calibrate_this_machine(options.cache, options.threads)
    bf16 = options.precision == "bf16" and bf16_supported()
    linear = [n for n in graph.nodes if PRIMITIVES[n.prim].kind == Kind.LINEAR]
    floats = [n for n in linear if n.prim not in INTEGER_PRODUCTS]
    float_flops = sum(primitive_flops(graph, n) for n in floats)
    integer_flops = sum(primitive_flops(graph, n) for n in linear if n.prim in INTEGER_PRODUCTS)
    compute_s = (float_flops / (float_rate or device.peak_flops * (BF16_RATE if bf16 else 1.0))
                 + integer_flops / (device.peak_flops * int8_rate()))  # fmt: skip
    halved = {n.inputs[1] for n in floats if len(n.inputs) > 1 and n.inputs[1] in graph.constants} if bf16 else set()
    used = {v for n in graph.nodes for v in n.inputs}
    moved = sum(graph.types[v].nbytes // (2 if v in halved else 1)
                for v in [*graph.inputs, *graph.constants] if v in used)  # fmt: skip
    moved += sum(graph.types[v].nbytes for v in graph.outputs)
    compute_ms, memory_ms = compute_s * 1e3, moved / device.bandwidth * 1e3
    return {"compute_floor_ms": compute_ms, "memory_floor_ms": memory_ms, "bound_ms": compute_ms + memory_ms,
            "floor_ms": max(compute_ms, memory_ms), "flops": float_flops + integer_flops,
            "peak_gflops": device.peak_flops / 1e9,
            "compute_gflops": ((float_flops + integer_flops) / compute_s if compute_s else device.peak_flops) / 1e9,
            "bandwidth_gbs": device.bandwidth / 1e9}  # fmt: skip


def bench_ceiling(report: Mapping[str, Any]) -> float:
    """The most any plan could beat the report's best peer by on this machine: its median over the roofline's floor."""
    return float(report["contenders"][report["best_peer"]]["median_ms"] / report["roofline"]["floor_ms"])


def time_contenders(model_path: str, names: list[str], plan_dirs: dict[str, str], feeds: dict[str, np.ndarray],
                    threads: int, runs: int, rounds: int, precision: str = "fp32",
                    float_model: str | None = None) -> tuple[dict[str, list[float]], dict[str, Any], dict[str, float],
                                                             dict[str, float]]:  # fmt: skip
    """Each contender in a spawned worker of its own; outputs checked against onnxruntime (each within its
    `tolerance`); `runs` timed runs each, interleaved over `rounds` rounds. With RPROGRAM among `names`, its worker
    schedules the plan first (returned as the second value). Returns seconds per contender, the schedule, each
    contender's relative error, and with `float_model` (a quantized model's float original) each one's error
    against that model's onnxruntime outputs (KERNORCH_FLOAT, that model's plan, is held to those outputs only)."""
    context = multiprocessing.get_context("spawn")
    workers: dict[str, tuple[Any, Connection]] = {}
    prepared: dict[str, Any] = {}
    try:
        for name in names:
            parent, child = context.Pipe()
            process = context.Process(target=_worker, args=(child, name, model_path, plan_dirs.get(name, ""), threads),
                                      daemon=True)  # fmt: skip
            process.start()
            parent.send(feeds)
            workers[name] = (process, parent)
        outputs = {name: connection.recv() for name, (_, connection) in workers.items()}
        for name, failure in list(outputs.items()):
            if not isinstance(failure, WorkerFailed):
                continue
            if name not in (*PEERS, THROUGHPUT_PEER) or name == BEST_PEERS[0]:  # kernorch's plans, the reference
                raise failure
            warnings.warn(f"{failure}: left out of the timing", PeerWarning, stacklevel=1)
            del outputs[name]
            _stop(*workers.pop(name))
        if RPROGRAM in workers:  # the same plan as an rProgram: scheduled while the other workers are idle
            workers[RPROGRAM][1].send(("prepare", 0))
            answer = workers[RPROGRAM][1].recv()
            if isinstance(answer, WorkerFailed):
                raise answer
            prepared = answer
            outputs[RPROGRAM] = prepared.pop("outputs")
        reference = outputs["onnxruntime"]
        quantized_model = quantized(onnx.load(model_path, load_external_data=False))
        spread = worst_relative(run_onnxruntime(onnx.load(model_path), feeds, threads, optimized=False), reference) \
            if quantized_model else 0.0  # fmt: skip
        float_reference = run_onnxruntime(checked_proto(float_model)[0], feeds, threads) if float_model else None
        float_errors = {name: worst_relative(got, float_reference) for name, got in outputs.items()} \
            if float_reference is not None else {}  # fmt: skip
        errors = {name: float_errors[name] if name == KERNORCH_FLOAT else worst_relative(got, reference)
                  for name, got in outputs.items()}  # fmt: skip
        if quantized_model:  # the other int8 engine's distance from onnxruntime is as much a spread as its own two runs
            spread = max([spread, *(errors[peer] for peer in BEST_PEERS[1:] if peer in errors)])  # [0]: reference
        for name, worst in errors.items():
            allowed = tolerance(name, precision, quantized_model and name != KERNORCH_FLOAT, spread)
            if not worst <= allowed:
                against = "onnxruntime on the float model" if name == KERNORCH_FLOAT else "onnxruntime"
                raise BenchMismatch(f"{name} outputs differ from {against} (rel err {worst:.2e}, tolerance "
                                    f"{allowed:.0e}); nothing timed")  # fmt: skip
        times: dict[str, list[float]] = {name: [] for name in workers}
        per_round = max(1, runs // rounds)
        order = list(workers)
        for round_index in range(rounds):
            # Interleaved: one slice of each contender per round, in an order rotated every round so no
            # contender always follows the same one; a pause between slices lets the previous worker's
            # spinning pool threads (onnxruntime spins after a run) go idle before the next is timed.
            rotation = round_index % len(order)
            for name in order[rotation:] + order[:rotation]:
                time.sleep(COOL_DOWN_SECONDS)
                connection = workers[name][1]
                connection.send(("run", per_round))
                times[name].extend(connection.recv())
    finally:
        for process, connection in workers.values():
            _stop(process, connection)
    return times, prepared, errors, float_errors


def _stop(process: Any, connection: Connection) -> None:
    try:
        connection.send(("stop", 0))
    except (BrokenPipeError, OSError):
        pass
    process.join(timeout=10)
    if process.is_alive():
        process.kill()


def available_peers(names: Sequence[str], throughput: bool = False) -> list[str]:
    """The peers among `names` that are installed, with OpenVINO's THROUGHPUT hint too when asked for."""
    chosen = [*names, *([THROUGHPUT_PEER] if throughput else [])]
    return [p for p in chosen if not p.startswith("openvino") or openvino_available()]


def _breakdown(plan_dir: str, feeds: dict[str, np.ndarray], threads: int) -> dict[str, Any]:
    """kernorch's plan, loaded here once every worker has stopped, timed kernel by kernel (tools/breakdown.py)."""
    import kernorch
    from kernorch.tools.breakdown import breakdown

    return breakdown(kernorch.load(plan_dir, threads=threads), feeds)


def quick_bench(model_path: str, runs: int = 20, options: Options | None = None, rounds: int = 5,
                progress: Progress | None = None, input_shapes: Mapping[str, Sequence[int]] | None = None,
                throughput: bool = False, breakdown: bool = False,
                float_model: str | None = None) -> dict[str, Any]:  # fmt: skip
    """kernorch's optimal plan against onnxruntime and OpenVINO (fp32) only: what the zoo measures on many models
    (bench_model also plans without rewrites, greedy and unfused, and schedules an rProgram). `input_shapes` binds
    a model's symbolic dims; `throughput` adds OpenVINO under its THROUGHPUT hint (time per batch); `float_model`
    (a quantized model's float original) adds each contender's error against it."""
    from kernorch.pipeline import compile_plan, import_graph, make_cost_model, plan_graph

    options = options or Options()
    progress = progress or Progress()
    fissioned = import_graph(model_path, input_shapes, strict=options.strict)
    cost_model = make_cost_model(options, progress)
    plans = {"kernorch": plan_graph(fissioned, options, progress, cost_model)}
    if float_model:
        plans[KERNORCH_FLOAT] = plan_graph(import_graph(float_model, input_shapes, strict=options.strict), options,
                                           progress, cost_model)  # fmt: skip
    result = plans["kernorch"]
    peers = available_peers(BEST_PEERS if options.precision == "fp32" else (*BEST_PEERS, OPENVINO_DEFAULT), throughput)
    with tempfile.TemporaryDirectory() as work:
        plan_dirs = {name: str(compile_plan(origin, options, origin.plan).save(Path(work) / name))
                     for name, origin in plans.items()}  # fmt: skip
        times, _, errors, float_errors = time_contenders(model_path, [*peers, *plans], plan_dirs,
                                                         graph_feeds(fissioned), options.threads, runs, rounds,
                                                         options.precision, float_model)  # fmt: skip
        parts = _breakdown(plan_dirs["kernorch"], graph_feeds(fissioned), options.threads) if breakdown else None
    return {"model": Path(model_path).name, "threads": options.threads, "runs": len(times["kernorch"]),
            "inputs": {name: list(fissioned.types[name].shape) for name in fissioned.inputs},
            **_versus_best_peer(_results(times, errors, float_errors), options.precision),
            "roofline": roofline_bound(result.plan.graph, options),
            "kernels": {name: len(origin.plan.kernels) for name, origin in plans.items()}, "breakdown": parts,
            "validation": result.validation.to_json() if result.validation is not None else None,
            "in_plan": result.in_plan.to_json() if result.in_plan is not None else None,
            "in_plan_summary": result.in_plan.summary() if result.in_plan is not None else None}  # fmt: skip


def _versus_best_peer(contenders: dict[str, ContenderResult], precision: str) -> dict[str, Any]:
    """The report's contenders and each one's speed-up over the best peer (of this precision's best peers)."""
    best = (*(BEST_PEERS if precision == "fp32" else BEST_PEERS_BF16), THROUGHPUT_PEER)
    best_name = min((p for p in best if p in contenders), key=lambda p: contenders[p].median_ms)
    best_peer = contenders[best_name].median_ms
    return {"precision": precision, "contenders": {name: vars(r) for name, r in contenders.items()},
            "best_peer": best_name, "speedup_vs_best_peer": best_peer / contenders["kernorch"].median_ms,
            "speedups": {name: best_peer / r.median_ms for name, r in contenders.items()}}  # fmt: skip


def bench_model(model_path: str, runs: int = 20, options: Options | None = None, rounds: int = 5,
                progress: Progress | None = None, compare_layouts: bool = False,
                input_shapes: Mapping[str, Sequence[int]] | None = None,
                throughput: bool = False, breakdown: bool = False,
                float_model: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Plan the model with and without rewrites (and, with `compare_layouts`, under the other layout
    policies) from one import and one cost model, then time every contender side by side (`float_model`: as
    quick_bench's)."""
    from kernorch.pipeline import compile_plan, import_graph, make_cost_model, plan_graph

    options = options or Options()
    progress = progress or Progress()
    threads = options.threads
    fissioned = import_graph(model_path, input_shapes, strict=options.strict)
    cost_model = make_cost_model(options, progress)
    result = plan_graph(fissioned, options.with_(rewrite=True), progress, cost_model)
    plain = plan_graph(fissioned, options.with_(rewrite=False), progress, cost_model)
    feeds = graph_feeds(fissioned)
    # contender -> (the orchestration it comes from, the plan it runs)
    plans: dict[str, tuple[OrchestrationResult, Plan]] = {
        "kernorch": (result, result.plan), "kernorch-norewrite": (plain, plain.plan),
        "kernorch-greedy": (result, result.greedy_plan), "kernorch-unfused": (result, unfused_plan(result)),
    }  # fmt: skip
    if options.precision == "bf16":  # what bf16 gains over kernorch's own float32 plan
        fp32 = plan_graph(fissioned, options.with_(precision="fp32"), progress, cost_model)
        plans[KERNORCH_FP32] = (fp32, fp32.plan)
    if float_model:  # what quantizing gains: kernorch's plan of the float original
        floats = plan_graph(import_graph(float_model, input_shapes, strict=options.strict), options, progress,
                            cost_model)  # fmt: skip
        plans[KERNORCH_FLOAT] = (floats, floats.plan)
    layouts = {"kernorch": result.layout_report}
    if compare_layouts and any(n.prim in ("conv", "conv_transpose") for n in fissioned.nodes):
        for name, policy in LAYOUT_CONTENDERS.items():
            other = plan_graph(fissioned, options.with_(layout=policy), progress, cost_model)
            plans[name] = (other, other.plan)
            layouts[name] = other.layout_report
    peers = available_peers(PEERS, throughput)
    with tempfile.TemporaryDirectory() as work:
        plan_dirs: dict[str, str] = {}
        for name, (origin, plan) in plans.items():
            plan_dirs[name] = str(compile_plan(origin, options, plan).save(Path(work) / name))
        plan_dirs[RPROGRAM] = plan_dirs["kernorch"]
        times, prepared, errors, float_errors = time_contenders(model_path, [*peers, *plans, RPROGRAM], plan_dirs,
                                                                feeds, threads, runs, rounds, options.precision,
                                                                float_model)  # fmt: skip
        parts = _breakdown(plan_dirs["kernorch"], feeds, threads) if breakdown else None
    contenders = _results(times, errors, float_errors)
    bound = roofline_bound(result.plan.graph, options)
    return {
        "model": Path(model_path).name,
        "threads": threads,
        "inputs": {name: list(fissioned.types[name].shape) for name in fissioned.inputs},
        "runs": len(times["kernorch"]),
        **_versus_best_peer(contenders, options.precision),
        "kernels": {name: len(plan.kernels) for name, (_, plan) in plans.items()},
        "precision_choice": result.precision_report.to_json() if result.precision_report is not None else None,
        "breakdown": parts,
        "primitives": {"rewritten": len(result.plan.graph.nodes), "fissioned": len(plain.plan.graph.nodes)},
        "rewrites": result.rewrite_report.to_json() if result.rewrite_report is not None else None,
        "layouts": {name: report.to_json() for name, report in layouts.items() if report is not None},
        "epilogues": absorbed_epilogues(result.plan),
        "memory": memory_report(result.plan),
        "roofline": {**bound, "kernorch_over_bound": contenders["kernorch"].median_ms / bound["bound_ms"]},
        "rprogram": {**prepared, "measured_ms": contenders[RPROGRAM].median_ms,
                     "simulator_error": prepared["predicted_ms"] / contenders[RPROGRAM].median_ms - 1.0,
                     "over_kernel_by_kernel": contenders["kernorch"].median_ms / contenders[RPROGRAM].median_ms},
    }


def memory_report(plan: Plan) -> dict[str, int]:
    """The plan's static memory: the arena's peak bytes next to one buffer per intermediate value, and how many
    kernels are views (run no code: a reshape, contiguous slice or split, a concat its producers write into)."""
    from kernorch.codegen.backends import REFERENCE, choose_backend, plan_views
    from kernorch.runtime.memory import plan_memory

    backends, views = plan_views(plan.kernels, [choose_backend(k)[0] or REFERENCE for k in plan.kernels])
    memory = plan_memory(plan.graph, plan.kernels, {value: source for value, (source, _) in views.items()})
    view_kernels = sum(1 for b in backends if not b.runs_code)
    return {"arena_bytes": memory.arena_bytes, "unshared_bytes": memory.unshared_bytes, "kernels": len(backends),
            "view_kernels": view_kernels, "kernels_running_code": len(backends) - view_kernels}  # fmt: skip


def absorbed_epilogues(plan: Plan) -> dict[str, int]:
    """What the plan's library calls absorbed, counted by kind (e.g. "conv ← bias, relu": 12)."""
    from kernorch.codegen.library import absorbed_summary

    counts: dict[str, int] = {}
    for kernel in plan.kernels:
        summary = absorbed_summary(kernel)
        if summary is not None and "←" in summary:
            counts[summary] = counts.get(summary, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def format_report(report: dict[str, Any]) -> list[str]:
    inputs = ", ".join(f"{name}={'x'.join(map(str, shape))}" for name, shape in report.get("inputs", {}).items())
    lines = [f"{report['model']} [{inputs}]: {report['runs']} runs per contender, {report['threads']} threads, "
             f"interleaved; precision {report.get('precision', 'fp32')}; best peer {report['best_peer']}"
             + ("; openvino-throughput: time per batch with its streams serving several at once"
                if THROUGHPUT_PEER in report["contenders"] else "")]
    if report.get("precision") == "bf16":
        lines.append("  (onnxruntime's CPU provider has no bf16 path for most operators: it runs float32; "
                     "openvino-default computes in bf16 where this CPU has bf16 instructions)")
    against_float = any(r.get("fp32_err") is not None for r in report["contenders"].values())
    header = (f"  {'contender':<22} {'median ms':>10} {'min ms':>9} {'max ms':>9} {'vs best peer':>13} {'kernels':>8} "
              f"{'rel err':>9}" + (f" {'vs fp32':>9}" if against_float else ""))  # fmt: skip
    lines.append(header)
    for name, r in report["contenders"].items():
        kernels = report["kernels"].get(name if name != RPROGRAM else "kernorch", "")
        error = r.get("rel_err", math.nan)
        float_error = f" {r['fp32_err']:>9.1e}" if against_float and r.get("fp32_err") is not None else ""
        lines.append(f"  {name:<22} {r['median_ms']:>10.3f} {r['min_ms']:>9.3f} {r['max_ms']:>9.3f} "
                     f"{report['speedups'][name]:>12.2f}x {kernels!s:>8} {error:>9.1e}{float_error}")  # fmt: skip
    if KERNORCH_FLOAT in report["contenders"]:
        contenders = report["contenders"]
        lines.append(f"  {KERNORCH_FLOAT}: kernorch's plan of the float model (its rel err against that model's "
                     "onnxruntime outputs); the quantized plan runs "
                     f"{contenders[KERNORCH_FLOAT]['median_ms'] / contenders['kernorch']['median_ms']:.2f}x as fast")
    if report.get("precision_choice"):
        choice = report["precision_choice"]
        lines.append(f"  precision: {choice['bf16']} of {choice['linear']} linear primitives in bf16")
    if report.get("in_plan_summary"):
        lines.append("  " + report["in_plan_summary"])
    if report.get("validation"):
        from kernorch.validate import ValidationReport

        lines.append("  " + ValidationReport.from_json(report["validation"]).summary())
    if report.get("breakdown"):
        from kernorch.tools.breakdown import format_breakdown

        lines += format_breakdown(report["breakdown"])
    roof = report.get("roofline")
    if roof is not None and "floor_ms" in roof:
        rate = f"{roof['compute_gflops']:.0f} GFLOP/s" + (" (bf16)" if report.get("precision") == "bf16" else "")
        lines.append(f"  roofline floor {roof['floor_ms']:.3f} ms (compute {roof['compute_floor_ms']:.3f} ms at "
                     f"{rate}, memory {roof['memory_floor_ms']:.3f} ms at {roof['bandwidth_gbs']:.1f} GB/s): the best "
                     f"peer runs at {bench_ceiling(report):.2f}x it (direct products, calibrated rate)")  # fmt: skip
    if roof is None or "kernorch_over_bound" not in roof:  # quick_bench: the plan against the peers only
        return lines
    lines.append(f"  roofline bound {roof['bound_ms']:.3f} ms (compute {roof['compute_floor_ms']:.3f} ms at "
                 f"{roof['peak_gflops']:.0f} GFLOP/s + memory {roof['memory_floor_ms']:.3f} ms at "
                 f"{roof['bandwidth_gbs']:.1f} GB/s); "
                 f"kernorch is {roof['kernorch_over_bound']:.1f}x the bound")  # fmt: skip
    if report.get("rewrites"):
        fired = ", ".join(f"{rule} ×{n}" for rule, n in report["rewrites"]["fired"].items()) or "none"
        primitives = report["primitives"]
        lines.append(f"  rewrites: {primitives['fissioned']} → {primitives['rewritten']} primitives; fired: {fired}")
    for name, layout in report.get("layouts", {}).items():
        lines.append(f"  layout of {name}: {layout['channels_last_convs']} of {layout['convs']} convs channels-last, "
                     f"{layout['transposes']} layout change(s)")  # fmt: skip
    if report.get("memory"):
        mem = report["memory"]
        lines.append(f"  memory: arena {mem['arena_bytes'] / 2**20:.2f} MiB vs {mem['unshared_bytes'] / 2**20:.2f} MiB "
                     f"with one buffer per value; {mem['view_kernels']} of {mem['kernels']} kernels are views "
                     f"(run no code)")  # fmt: skip
    if report.get("rprogram"):
        rp = report["rprogram"]
        candidates = ", ".join(f"{name} {ms:.3f}" for name, ms in rp["candidates_ms"].items())
        lines.append(f"  same plan as an rProgram: {rp['over_kernel_by_kernel']:.2f}x kernel by kernel; simulator "
                     f"predicted {rp['predicted_ms']:.3f} ms ({rp['simulator_error']:+.0%}); {rp['program']}")
        lines.append(f"  rProgram candidates measured at load (ms): {candidates}; kept: {rp['choice']}")
    if report.get("epilogues"):
        lines.append("  library calls absorbed: " + "; ".join(f"{k} ×{n}" for k, n in report["epilogues"].items()))
    return lines
