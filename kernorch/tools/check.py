"""`kernorch check`: fission a model, run it with the reference interpreter, compare with onnxruntime."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from kernorch.errors import KernorchError
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.ir.graph import Graph
from kernorch.ir.plan import PlanError, storing
from kernorch.options import Options
from kernorch.orchestrate import OrchestrationResult
from kernorch.pipeline import compile_plan, plan_graph, warn_about_fallbacks
from kernorch.precision import choose_precision
from kernorch.rewrite import rewrite as rewrite_graph
from kernorch.runtime import run_reference
from kernorch.runtime.feeds import graph_feeds
from kernorch.runtime.memory import check_values_fit
from kernorch.runtime.timing import time_call
from kernorch.tools.quantized_check import StepCounts, output_steps, step_counts, widened
from kernorch.tools.rounding_arbiter import Arbitration, arbitrate

DEFAULT_RTOL = 1e-4
# bf16 mode against onnxruntime's float32 result: operands rounded to 8 significant bits (relative error up to
# 2^-9 each) over the depth of a network; OpenVINO's default (bf16) is 1e-3..1e-2 from float32 on the shared models
BF16_RTOL = 2e-2
# A quantized model (QDQ, dynamically quantized): a few float32 ulps before a quantizer move a value across a
# rounding step, and one 8-bit step is ~4e-3 of the quantized range; 2e-2 is a few steps. (onnxruntime's own
# optimized and unoptimized runs of a dynamically quantized bert_mini differ by 1e-4; OpenVINO's int8 by 7e-4.)
QUANTIZED_RTOL = 2e-2
# operators that make a model a quantized one: onnxruntime's quantization tool writes these
QUANTIZATION_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                              "ConvInteger", "QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul",
                              "QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool", "QLinearConcat",
                              "QGemm", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
                              "DynamicQuantizeLSTM"})  # fmt: skip


def quantized(proto: onnx.ModelProto) -> bool:
    """Whether the model holds a quantization operator (its outputs then agree in quantization steps)."""
    return any(node.op_type in QUANTIZATION_OPS for node in proto.graph.node)


def default_rtol(precision: str, quantized_model: bool = False) -> float:
    """The tolerance a check of a plan in this precision (of a quantized model or not) uses unless one is given."""
    if quantized_model:
        return QUANTIZED_RTOL
    return BF16_RTOL if precision == "bf16" else DEFAULT_RTOL


def onnxruntime_session(proto: onnx.ModelProto, threads: int = 2, optimized: bool = True) -> Any:
    """An onnxruntime CPU session; `optimized` False: its graph optimizations off (a quantized model then runs the
    float arithmetic its operators define, not onnxruntime's fused int8 kernels)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise KernorchError("onnxruntime is needed to check results: pip install 'kernorch[ort]'") from None

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: its warnings are not ours to print
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime's exceptions share no base class but Exception (found by the fuzzer)
        first = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
        raise KernorchError(f"onnxruntime cannot load the model to compare with: {first}") from None


def run_onnxruntime(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int = 2,
                    optimized: bool = True) -> dict[str, np.ndarray]:  # fmt: skip
    session = onnxruntime_session(proto, threads, optimized)
    names = [o.name for o in session.get_outputs()]
    try:
        results = session.run(names, feeds)
    except Exception as error:  # onnxruntime's exceptions share no base class but Exception
        first = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
        raise KernorchError(f"onnxruntime failed on the model: {first}") from None
    return dict(zip(names, results, strict=True))


def timed_onnxruntime(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int, runs: int) -> float:
    """Median milliseconds of onnxruntime (all graph optimizations) on `feeds`."""
    session = onnxruntime_session(proto, threads)
    return time_call(lambda: session.run(None, feeds), runs=runs).median * 1e3


@dataclass
class OutputError:
    name: str
    max_abs: float
    relative: float  # max abs error / max |reference|


@dataclass
class CheckReport:
    model: str
    primitive_counts: dict[str, int]
    primitives: int
    errors: list[OutputError] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    rtol: float = DEFAULT_RTOL
    # a quantized model: how far onnxruntime's float run of it is from its int8 one (quantized_check.py), and the
    # outputs dequantized from int8 in steps
    spread: float | None = None
    steps: dict[str, StepCounts] = field(default_factory=dict)
    # a quantized model beyond the tolerance: its divergences from onnxruntime judged in exact arithmetic
    arbitration: Arbitration | None = None

    @property
    def worst_relative(self) -> float:
        return max((e.relative for e in self.errors), default=0.0)

    @property
    def passed(self) -> bool:
        return self.worst_relative <= self.rtol or self.arbitration is not None and self.arbitration.explained

    def lines(self) -> list[str]:
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(self.primitive_counts.items()))
        out = [f"{self.model}: {self.primitives} primitives ({kinds})"]
        for e in self.errors:
            out.append(f"  output {e.name}: max abs err {e.max_abs:.3e}, rel err {e.relative:.3e}")
            if e.name in self.steps:
                out.append(f"    {self.steps[e.name].describe()}")
        if self.spread is not None:
            out.append(f"  onnxruntime's own int8 and float (unoptimized) runs differ by {self.spread:.3e}")
        if self.arbitration is not None:
            out.extend(self.arbitration.lines())
        timing = ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items())
        verdict = "PASS" if self.passed else "FAIL"
        if self.passed and self.worst_relative > self.rtol:
            verdict += " (beyond the tolerance only through roundings judged exact or tied)"
        out.append(f"  {verdict} (rel err {self.worst_relative:.3e} vs tolerance {self.rtol:.0e}; {timing})")
        return out


def compare(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> list[OutputError]:
    errors = []
    for name, reference in expected.items():
        got = actual[name]
        if got.shape != reference.shape:
            errors.append(OutputError(name, float("inf"), float("inf")))
            continue
        if reference.dtype == bool or reference.dtype.kind in "iu":
            mismatches = float(np.count_nonzero(got != reference))
            errors.append(OutputError(name, mismatches, mismatches))
            continue
        with np.errstate(invalid="ignore"):  # inf - inf: NaN, then counted as equal below
            diff = np.abs(got.astype(np.float64) - reference.astype(np.float64))
        same = (np.isnan(got) & np.isnan(reference)) | (got == reference)  # equal infinities differ by nothing
        diff = np.where(same, 0.0, diff)
        max_abs = float(np.nanmax(diff, initial=0.0)) if not np.isnan(diff).any() else float("inf")
        scale = float(np.max(np.abs(reference[np.isfinite(reference)]), initial=0.0))
        errors.append(OutputError(name, max_abs, max_abs / scale if scale > 0 else max_abs))
    return errors


def worst_relative(got: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    """The largest relative error of `got`'s outputs against `reference`'s (0 with none)."""
    return max((e.relative for e in compare(dict(got), dict(reference))), default=0.0)


def _interpreted(graph: Graph, options: Options) -> Graph:
    """What the reference interpreter runs of a fissioned graph: the safe rewrites unless they are off (no cost
    model), and in bf16 mode every linear primitive bf16 (no cost model either: the mode's worst case)."""
    if options.rewrite:
        graph, _ = rewrite_graph(graph)
    if options.precision == "bf16":
        graph, _ = choose_precision(graph, None, "bf16")
    return graph


def _kernorch_run(proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                  input_shapes: dict[str, tuple[int, ...]] | None, options: Options,
                  checked: tuple[Graph, OrchestrationResult] | None) -> dict[str, np.ndarray]:  # fmt: skip
    """kernorch's outputs of `proto` (the arbiter's cut of the checked model, every quantizer's results among its
    outputs) as the check ran the model: its reference interpreter, or with `checked` (the fissioned graph and its
    plan) the checked plan's own kernels storing those results too, so the same arithmetic in the same order.

    Where the checked plan no longer holds them (a static QDQ model's quantizers fold into the float operators
    around them), a plan of the cut model: other kernels, so other float orders, and the arbiter holds its outputs
    to the checked ones within the tolerance only: a fault in the checked plan's kernels that the other plan does
    not share shows there, not as the quantizer it moved."""
    graph = fission(import_model(proto, input_shapes), strict=options.strict)
    if checked is None:
        return run_reference(_interpreted(graph, options), feeds)
    try:
        return _stored_run(graph, feeds, options, *checked)
    except _NotStored:
        return compile_plan(plan_graph(graph, options), options).run(feeds)


class _NotStored(Exception):
    """The checked plan does not compute one of the cut model's outputs as a value of its own."""


def _stored_run(cut: Graph, feeds: Mapping[str, np.ndarray], options: Options, fissioned: Graph,
                result: OrchestrationResult) -> dict[str, np.ndarray]:  # fmt: skip
    """The cut model's outputs from the checked plan's kernels, each storing what it computes of them too."""
    values = _aligned_outputs(fissioned, cut)
    try:
        plan = storing(result.plan, [value for value in values.values() if value not in fissioned.constants])
        program = compile_plan(result, options, plan)
    except (PlanError, KernorchError) as error:  # (a kernel no backend runs with the extra stores: too large)
        raise _NotStored(str(error)) from None
    outputs = program.run(feeds)
    layouts = result.layout_report.layouts if result.layout_report is not None else {}

    def row_major(value: str) -> np.ndarray:  # a value the layout stage stored in another axis order, turned back
        if value in fissioned.constants:
            return np.asarray(fissioned.constants[value])
        layout = layouts.get(value)
        return outputs[value] if layout is None else np.transpose(outputs[value], np.argsort(layout))

    found = {name: row_major(value) for name, value in values.items()}
    for name, array in found.items():
        if array.shape != cut.types[name].shape:
            raise KernorchError(f"the checked plan holds {name} as {array.shape}, not {cut.types[name].shape}")
    return found


def _aligned_outputs(fissioned: Graph, cut: Graph) -> dict[str, str]:
    """The cut model's graph outputs as values of the checked model's fissioned graph. Both fission the same
    operators in the same order, the cut only naming more results as outputs (a renamed value, or an identity at
    the end for a constant or shared one), so their primitives line up position by position."""
    rename: dict[str, str] = {}
    for index, node in enumerate(cut.nodes):
        other = fissioned.nodes[index] if index < len(fissioned.nodes) else None
        if node.origin == "output" and node.prim == "identity":  # _name_outputs' copy of a constant or shared value
            rename[node.outputs[0]] = rename.get(node.inputs[0], node.inputs[0])
        elif other is None or (other.prim, other.attrs, len(other.outputs)) != (node.prim, node.attrs,
                                                                                len(node.outputs)):
            raise _NotStored(f"the model with its quantizers' results as outputs fissions differently "
                             f"(primitive {index}: {node.prim} from {node.origin})")  # fmt: skip
        else:
            rename.update(zip(node.outputs, other.outputs, strict=True))
    return {name: rename.get(name, name) for name in cut.outputs}


def check_model(
    source: str | os.PathLike[str] | onnx.ModelProto,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    seed: int = 0,
    rtol: float | None = None,
    compiled: bool = False,
    options: Options | None = None,
) -> tuple[CheckReport, Graph]:
    """Compare kernorch with onnxruntime on seeded inputs: the reference interpreter on the fissioned
    graph (with the cost-independent rewrites unless options.rewrite is off), or with `compiled=True` the
    optimized plan as generated code. `rtol` None: `default_rtol` for the precision and the model."""
    options = options or Options()
    started = time.perf_counter()
    model = import_model(source, input_shapes)
    quantized_model = quantized(model.proto)
    widen = rtol is None and quantized_model  # a given tolerance is kept as given
    if rtol is None:
        rtol = default_rtol(options.precision, quantized_model)
    fissioned_graph = fission(model, strict=options.strict)
    check_values_fit(fissioned_graph, "the model at these input shapes")  # before feeds of that size are drawn
    warn_about_fallbacks(fissioned_graph)
    feeds = graph_feeds(fissioned_graph, seed)
    if compiled and options.gpu and not options.interpret:
        from kernorch.codegen.triton import use_interpreter_without_gpu

        # a GPU plan checked on a machine without a GPU: its Triton kernels in the interpreter, the library calls
        # through torch on the CPU
        options = options.with_(interpret=use_interpreter_without_gpu())
    checked = None
    if compiled:
        checked = (fissioned_graph, plan_graph(fissioned_graph, options))
        program = compile_plan(checked[1], options)
        graph = program.graph
        fissioned = time.perf_counter()
        actual = program.run(feeds)
    else:
        graph = _interpreted(fissioned_graph, options)
        fissioned = time.perf_counter()
        actual = run_reference(graph, feeds)
    interpreted = time.perf_counter()
    expected = run_onnxruntime(model.proto, feeds, options.threads)
    spread = None
    if quantized_model:
        unoptimized = run_onnxruntime(model.proto, feeds, options.threads, optimized=False)
        spread = worst_relative(unoptimized, expected)
        if widen:
            rtol = widened(rtol, spread)
    errors = compare(actual, expected)
    arbitration = None
    compared = time.perf_counter()
    if quantized_model and worst_relative(actual, expected) > rtol:
        arbitration = arbitrate(
            model.proto, feeds, actual, rtol,
            kernorch=lambda proto, inputs: _kernorch_run(proto, inputs, input_shapes, options, checked),
            onnxruntime=lambda proto, inputs: run_onnxruntime(proto, dict(inputs), options.threads),
            compare=worst_relative)  # fmt: skip
    finished = time.perf_counter()
    name = os.path.basename(str(source)) if not isinstance(source, onnx.ModelProto) else graph.name
    stage = "optimize+compile" if compiled else "import+fission+rewrite" if options.rewrite else "import+fission"
    if options.precision == "bf16":
        stage += " (bf16)"
    if compiled and options.gpu:
        stage += f" (GPU plan for {options.device}{', run in Triton interpreter' if options.interpret else ''})"
    report = CheckReport(
        model=name,
        primitive_counts=graph.count_by_kind(),
        primitives=len(graph.nodes),
        errors=errors,
        seconds={stage: fissioned - started, ("compiled run" if compiled else "reference"): interpreted - fissioned,
                 "onnxruntime": compared - interpreted,
                 **({"arbitration": finished - compared} if arbitration is not None else {})},  # fmt: skip
        rtol=rtol,
        spread=spread,
        arbitration=arbitration,
        steps={name: step_counts(actual[name], expected[name], step) for name, step in output_steps(model.proto).items()
               if name in actual and actual[name].shape == expected[name].shape},
    )
    return report, graph
