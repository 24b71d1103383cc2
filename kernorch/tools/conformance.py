"""`kernorch conformance`: run the ONNX backend node tests through import + fission + reference execution.

The node tests are not shipped in the onnx wheel; they are regenerated from the installed onnx package
(`onnx.backend.test.case`) into a cache directory once, in the standard layout (model.onnx plus
test_data_set_*/input_*.pb, output_*.pb), and read from there afterwards.

Outcome per case: passed; unsupported (kernorch refused it with a clear error: an op without a rule,
or an attribute/dtype a rule does not handle); fallback (with --fallback: passed, some node run by
onnxruntime); failed (wrong numbers or an internal error — a bug).
Inputs that a rule needs at compile time (a Reshape target, Slice bounds, …) are bound as constants,
as a static-shape compiler receives them.
"""

from __future__ import annotations

import json
import shutil
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from kernorch.errors import KernorchError
from kernorch.fission import FISSION_RULES, fallback_nodes, fission
from kernorch.frontend import import_model
from kernorch.options import Options, OrchestrationLimits, cache_root
from kernorch.pipeline import compile_plan, plan_graph
from kernorch.precision import choose_precision
from kernorch.runtime import run_reference
from kernorch.tools.check import BF16_RTOL


def default_cache_dir() -> Path:
    return cache_root() / "onnx-node-tests" / onnx.__version__


def generate_node_tests(cache_dir: Path) -> Path:
    """Write every node test case of the installed onnx into `cache_dir` (once; marked complete)."""
    marker = cache_dir / "cases.json"
    if marker.is_file():
        return cache_dir
    from onnx.backend.test.case import node as node_cases

    staging = cache_dir.with_name(cache_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    index: dict[str, dict[str, object]] = {}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        # onnx's own test generators overflow casts on purpose; their warnings are noise here.
        warnings.simplefilter("ignore")
        cases = node_cases.collect_testcases()
    for case in cases:
        if case.kind != "node" or case.model is None or not case.data_sets:
            continue
        case_dir = staging / case.name
        case_dir.mkdir()
        (case_dir / "model.onnx").write_bytes(case.model.SerializeToString())
        graph_inputs = list(case.model.graph.input)
        for set_index, (inputs, outputs) in enumerate(case.data_sets):
            data_dir = case_dir / f"test_data_set_{set_index}"
            data_dir.mkdir()
            for kind, arrays, infos in (("input", inputs, graph_inputs), ("output", outputs, case.model.graph.output)):
                for j, array in enumerate(arrays):
                    if isinstance(array, onnx.TensorProto):
                        tensor = array
                    elif isinstance(array, (np.ndarray, np.generic)) and np.asarray(array).dtype != object:
                        tensor = numpy_helper.from_array(np.asarray(array), infos[j].name if j < len(infos) else "")
                    else:
                        continue  # sequences/maps/optionals: the case will be refused at import
                    (data_dir / f"{kind}_{j}.pb").write_bytes(tensor.SerializeToString())
        nodes = case.model.graph.node
        index[case.name] = {
            "op": nodes[0].op_type if len(nodes) == 1 else "",
            "rtol": case.rtol,
            "atol": case.atol,
        }
    # Expanded (function-body) variants are grouped under the operator they expand.
    for name, entry in index.items():
        if not entry["op"]:
            stem = name.split("_expanded")[0]
            entry["op"] = index.get(stem, {}).get("op") or name.removeprefix("test_")
    (staging / "cases.json").write_text(json.dumps(index, indent=1, sort_keys=True))
    shutil.rmtree(cache_dir, ignore_errors=True)
    staging.rename(cache_dir)
    return cache_dir


@dataclass
class CaseResult:
    name: str
    op: str
    status: str  # "passed", "failed", "unsupported", or "fallback" (passed, some node run by onnxruntime)
    detail: str = ""


def _read_tensor(path: Path) -> np.ndarray:
    tensor = onnx.TensorProto()
    tensor.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(tensor)


def _static_inputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Graph inputs some rule must know at compile time (shape, axes, pads...) -> bind as constants."""
    bound: dict[str, np.ndarray] = {}
    for node in model.graph.node:
        fission_rule = FISSION_RULES.get(node.op_type)
        if fission_rule is None:
            continue
        for index in fission_rule.static_inputs:
            if index < len(node.input) and node.input[index] in feeds:
                bound[node.input[index]] = feeds[node.input[index]]
    return bound


def _close(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float, scale_rtol: float = 0.0) -> str:
    """"" when `actual` passes for `expected`; `scale_rtol` also allows that much of the largest finite |expected|
    as absolute error (bf16 mode: an error relative to the output's magnitude, like `kernorch check`)."""
    if actual.shape != expected.shape:
        return f"shape {actual.shape} != expected {expected.shape}"
    if expected.dtype.kind in "fc":
        if actual.dtype != expected.dtype:
            return f"dtype {actual.dtype} != expected {expected.dtype}"
        if scale_rtol:
            finite = np.abs(expected[np.isfinite(expected)])
            atol = max(atol, scale_rtol * float(finite.max(initial=0.0)))
        if np.allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True):
            return ""
        worst = float(np.nanmax(np.abs(actual.astype(np.float64) - expected)))
        return f"max abs err {worst:.3e}"
    if actual.dtype != expected.dtype and not (actual.dtype.kind == expected.dtype.kind == "b"):
        return f"dtype {actual.dtype} != expected {expected.dtype}"
    mismatches = int(np.count_nonzero(actual != expected))
    return f"{mismatches} elements differ" if mismatches else ""


# The compiled path plans with the analytic cost model of a fixed preset: no measuring, and the same plan on
# every machine (which kernels fuse differs from a profiled plan, but every kernel runs as generated code).
# Node tests check numbers, not plan optimality: short solver and rewrite budgets keep large expanded cases quick.
COMPILED_OPTIONS = Options(cost="analytic", device="cpu-nominal", rewrite_budget=1.0,
                           limits=OrchestrationLimits(solver_time_limit=2.0))


def run_case(case_dir: Path, op: str, rtol: float, atol: float, compiled: bool = False,
             fallback: bool = False, precision: str = "fp32") -> CaseResult:  # fmt: skip
    """One node test: fission + reference interpreter, or with `compiled` the optimized plan as generated C
    and library calls. With `fallback`, nodes without a rule run through onnxruntime; a case that then
    passes counts as "fallback", apart from those kernorch's own rules pass. With precision bf16 every float32
    linear primitive multiplies in bfloat16 (the mode's worst case, chosen without a cost model) and a case whose
    graph has one is held to the bf16 tolerance relative to its output's magnitude."""
    name = case_dir.name
    try:
        model_proto = onnx.load(str(case_dir / "model.onnx"))
        graph_inputs = [i.name for i in model_proto.graph.input
                        if i.name not in {t.name for t in model_proto.graph.initializer}]  # fmt: skip
        data_dirs = sorted(case_dir.glob("test_data_set_*"))
        through_onnxruntime = False
        for data_dir in data_dirs:
            feeds = {}
            for j, input_name in enumerate(graph_inputs):
                path = data_dir / f"input_{j}.pb"
                if not path.is_file():
                    return CaseResult(name, op, "unsupported", f"input '{input_name}' is not a tensor")
                feeds[input_name] = _read_tensor(path)
            bound = _static_inputs(model_proto, feeds)
            model = import_model(model_proto, {n: tuple(a.shape) for n, a in feeds.items() if n not in bound}, bound)
            graph = fission(model, strict=not fallback)
            through_onnxruntime = through_onnxruntime or bool(fallback_nodes(graph))
            runtime_feeds = {n: a for n, a in feeds.items() if n not in bound}
            graph, chosen = choose_precision(graph, None, precision)
            scale_rtol = BF16_RTOL if chosen.bf16 else 0.0
            if compiled:
                options = COMPILED_OPTIONS.with_(precision=precision)
                program = compile_plan(plan_graph(graph, options), options)
                outputs = program.run(runtime_feeds)
            else:
                outputs = run_reference(graph, runtime_feeds)
            for j, output_name in enumerate(model.output_names):
                path = data_dir / f"output_{j}.pb"
                if not path.is_file():
                    return CaseResult(name, op, "unsupported", f"output '{output_name}' is not a tensor")
                problem = _close(outputs[output_name], _read_tensor(path), rtol, atol, scale_rtol)
                if problem:
                    return CaseResult(name, op, "failed", f"output '{output_name}': {problem}")
        return CaseResult(name, op, "fallback" if through_onnxruntime else "passed")
    except KernorchError as error:
        return CaseResult(name, op, "unsupported", str(error))
    except Exception as error:  # an internal error is a kernorch bug: report it as a failure
        last = traceback.extract_tb(error.__traceback__)[-1]
        return CaseResult(name, op, "failed", f"{type(error).__name__}: {error} ({last.filename}:{last.lineno})")


def run_conformance(cache_dir: Path | None = None, pattern: str = "",
                    progress: Callable[[Iterator[str]], Iterator[str]] | None = None,
                    compiled: bool = False, fallback: bool = False, precision: str = "fp32") -> list[CaseResult]:
    directory = generate_node_tests(cache_dir or default_cache_dir())
    index: dict[str, dict[str, object]] = json.loads((directory / "cases.json").read_text())
    names = sorted(n for n in index if pattern in n)
    iterator = progress(iter(names)) if progress else iter(names)
    results = []
    for name in iterator:
        entry = index[name]
        results.append(run_case(directory / name, str(entry["op"]), float(entry["rtol"]),  # type: ignore[arg-type]
                                float(entry["atol"]), compiled, fallback, precision))  # type: ignore[arg-type]
    return results


def summarize(results: list[CaseResult]) -> dict[str, dict[str, int]]:
    per_op: dict[str, dict[str, int]] = {}
    for result in results:
        counts = per_op.setdefault(result.op, {"passed": 0, "failed": 0, "unsupported": 0, "fallback": 0})
        counts[result.status] += 1
    return per_op
