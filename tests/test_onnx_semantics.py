"""ONNX's elementwise semantics exactly: every elementwise operator on every dtype onnxruntime runs it on, over
the edge values of that dtype (±0, ±inf, NaN, subnormals, the extremes of every integer type, halves for
rounding), through the reference interpreter and through the compiled plan (generated C for the dtypes the C
renderer takes, the reference kernels for the rest), compared with onnxruntime: integers and bools exactly,
floats to a few ulps with NaN where onnxruntime has NaN.

Binary operators see every pair of edge values; Cast sees every edge value of its source dtype to every dtype.
One ONNX model per (operator family, dtype) holds all its cases, so a dtype costs one C compile."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import kernorch
from kernorch.codegen.backends import GENERATED_C
from kernorch.devtools.mutate import here
from kernorch.errors import FallbackWarning
from kernorch.fission import fallback_nodes
from kernorch.pipeline import import_graph
from kernorch.runtime.reference import run_reference

FLOATS = ("float16", "float32", "float64")
SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
DTYPES = (*FLOATS, *SIGNED, *UNSIGNED, "bool")

UNARY = ("Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos", "Tanh", "Sigmoid", "Erf", "Relu", "Floor",
         "Ceil", "Round", "Sign", "Not", "Identity", "Softsign", "Softplus", "HardSwish", "IsNaN", "IsInf")
BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod", "Mod1", "Equal", "Less", "Greater", "LessOrEqual",
          "GreaterOrEqual", "And", "Or", "Xor", "BitShiftLeft", "BitShiftRight", "Sum", "Mean", "PRelu")
# Operators that are not correctly rounded (transcendental functions and what is built of them) agree to this
# relative error, or to 1e-4 of it in absolute terms near zero. onnxruntime is no closer to the exact result:
# its float32 sigmoid is 2.5e-5 off at -7.25 and 0 at -20 (2.1e-9), its float64 softplus 1.2e-13 off at -7.25;
# it computes float16 in float32, where kernorch's float16 kernels round each step (2 ulps).
RELATIVE = {"float16": 4e-3, "float32": 1e-4, "float64": 1e-12}


def edge_values(dtype: str) -> np.ndarray:
    if dtype == "bool":
        return np.array([False, True])
    if dtype in FLOATS:
        info = np.finfo(dtype)
        values = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, -7.25, 100.0, 127.5, 255.5, 256.0, -128.5,
                  65504.0, 2.0**31, -(2.0**31), 2.0**63, 1e10, -1e10, float(info.max), float(info.min),
                  float(info.tiny), float(info.smallest_subnormal), -float(info.smallest_subnormal), np.inf, -np.inf,
                  np.nan, 20.0, -20.0, 88.5, -88.5, 710.0]  # fmt: skip
        with np.errstate(over="ignore"):
            return np.array(values, dtype=np.float64).astype(dtype)
    info = np.iinfo(dtype)
    values = [0, 1, 2, 3, 7, 8, 31, 63, 64, 100, int(info.max), int(info.max) - 1, int(info.max) // 2]
    if info.min < 0:
        values += [-1, -2, -3, -7, -8, -100, int(info.min), int(info.min) + 1, int(info.min) // 2]
    return np.array(values, dtype=dtype)


@dataclass(frozen=True)
class Case:
    op: str  # an ONNX op type, or a name above for a variant (Mod1: fmod=1; BitShiftLeft/Right)
    dtype: str
    to: str = ""  # Cast's target

    @property
    def name(self) -> str:
        return f"{self.op}_{self.dtype}" + (f"_to_{self.to}" if self.to else "")

    def node(self, inputs: list[str], output: str) -> onnx.NodeProto:
        if self.op == "Cast":
            return helper.make_node("Cast", inputs, [output], to=helper.np_dtype_to_tensor_dtype(np.dtype(self.to)))
        if self.op == "Mod1":
            return helper.make_node("Mod", inputs, [output], fmod=1)
        if self.op.startswith("BitShift"):
            return helper.make_node("BitShift", inputs, [output], direction=self.op[8:].upper())
        return helper.make_node(self.op, inputs, [output])

    @property
    def arity(self) -> int:
        return 2 if self.op in BINARY else 1

    def output_dtype(self) -> str:
        if self.op == "Cast":
            return self.to
        if self.op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not",
                       "IsNaN", "IsInf"):  # fmt: skip
            return "bool"
        return self.dtype

    def feeds(self) -> list[np.ndarray]:
        values = edge_values(self.dtype)
        if self.arity == 1:
            return [values]
        a, b = (grid.reshape(-1) for grid in np.meshgrid(values, values, indexing="ij"))
        if self.op in ("Div", "Mod", "Mod1") and self.dtype not in FLOATS:
            # onnxruntime refuses a zero divisor and dies of SIGFPE on INT_MIN / -1: both tested on their own below
            keep = (b != 0) & ~((a == edge_values(self.dtype).min()) & (b == -1) & (a < 0))
            a, b = a[keep], b[keep]
        return [a, b]


def _tensor(name: str, dtype: str, length: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [length])


def case_model(cases: list[Case]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    nodes, inputs, outputs, feeds = [], [], [], {}
    for case in cases:
        names = [f"{case.name}_in{i}" for i in range(case.arity)]
        for name, array in zip(names, case.feeds(), strict=True):
            inputs.append(_tensor(name, case.dtype, array.size))
            feeds[name] = array
        nodes.append(case.node(names, case.name))
        outputs.append(_tensor(case.name, case.output_dtype(), feeds[names[0]].size))
    graph = helper.make_graph(nodes, "semantics", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), feeds


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # each op as written
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def runs_in_onnxruntime(case: Case) -> bool:
    """Whether onnxruntime implements the case: it is the reference, so what it refuses is not a case."""
    try:
        model, feeds = case_model([case])
        onnx.checker.check_model(model, full_check=True)
        _onnxruntime(model, feeds)
    except Exception:  # noqa: BLE001 - type not implemented, or not allowed by the operator's schema
        return False
    return True


def all_cases() -> Iterator[Case]:
    for dtype in DTYPES:
        for op in (*UNARY, *BINARY):
            yield Case(op, dtype)
        for to in DTYPES:
            yield Case("Cast", dtype, to)


def mismatch(actual: np.ndarray, expected: np.ndarray, inputs: list[np.ndarray], case: Case) -> str | None:
    """None when equal by the case's standard, else the first differing element described."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return f"{actual.dtype}{actual.shape} instead of {expected.dtype}{expected.shape}"
    if expected.dtype.kind in "fc":
        exact = case.op in ("Neg", "Abs", "Relu", "Floor", "Ceil", "Round", "Sign", "Identity", "Max", "Min",
                            "Cast", "Add", "Sub", "Mul", "Div", "Mod", "Mod1", "Sum")  # correctly rounded in IEEE
        nan = np.isnan(expected)
        same = (actual == expected) | (nan & np.isnan(actual))
        if not exact:
            wide = expected.astype(np.float64)
            bound = RELATIVE[expected.dtype.name] * np.maximum(np.abs(wide), 1e-4)
            with np.errstate(invalid="ignore"):
                close = np.abs(actual.astype(np.float64) - wide) <= bound
            same |= close & ~nan & np.isfinite(actual)
        bad = np.flatnonzero(~same)
    else:
        bad = np.flatnonzero(actual != expected)
    if not bad.size:
        return None
    i = int(bad[0])
    operands = ", ".join(repr(a.reshape(-1)[i].item()) for a in inputs)
    return f"{len(bad)} element(s) differ; first: {case.op}({operands}) = {actual.reshape(-1)[i]!r}, " \
           f"onnxruntime {expected.reshape(-1)[i]!r}"


# Where kernorch deliberately differs from onnxruntime: (the elements concerned, what kernorch returns there, why).
Inputs = list[np.ndarray]
KNOWN_DIFFERENCES = {
    ("Sign", "float16"): (lambda ins, ort: np.isnan(ins[0]), lambda ins: ins[0],
                          "onnxruntime's float16 Sign maps NaN to 0; its float32/float64 Sign and numpy keep NaN"),
    ("Softplus", "float16"): (lambda ins, ort: np.isinf(ort) & np.isfinite(ins[0]), lambda ins: ins[0],
                              "onnxruntime computes log(exp(x) + 1), inf once exp(x) overflows; kernorch returns x"),
    ("Softplus", "float64"): (lambda ins, ort: np.isinf(ort) & np.isfinite(ins[0]), lambda ins: ins[0],
                              "onnxruntime computes log(exp(x) + 1), inf once exp(x) overflows; kernorch returns x"),
}


@dataclass
class Outcome:
    cases: int = 0
    generated_c: int = 0  # cases whose node ran in generated C (the rest: reference kernels, or the fallback)
    fallback: int = 0  # cases kernorch has no rule for: run by onnxruntime itself
    known: int = 0  # elements where a documented difference applies


OUTCOME = Outcome()


def case_groups() -> dict[str, list[Case]]:
    groups: dict[str, list[Case]] = {}
    for case in all_cases():
        if runs_in_onnxruntime(case):
            groups.setdefault(f"{case.dtype}-{'cast' if case.op == 'Cast' else 'ops'}", []).append(case)
    return groups


GROUPS = case_groups()


def _check(case: Case, actual: np.ndarray, expected: np.ndarray, inputs: Inputs, path: str) -> list[str]:
    if (case.op, case.dtype) in KNOWN_DIFFERENCES:
        where, ours, _ = KNOWN_DIFFERENCES[(case.op, case.dtype)]
        mask = where(inputs, expected)
        problem = mismatch(actual[mask], np.asarray(ours(inputs))[mask].astype(expected.dtype),
                           [i[mask] for i in inputs], case)  # fmt: skip
        if problem:
            return [f"{path} {case.name} (documented difference): {problem}"]
        OUTCOME.known += int(mask.sum())
        actual, expected, inputs = actual[~mask], expected[~mask], [i[~mask] for i in inputs]
    problem = mismatch(actual, expected, inputs, case)
    return [f"{path} {case.name}: {problem}"] if problem else []


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_case_matches_onnxruntime(group: str) -> None:
    cases = GROUPS[group]
    model, feeds = case_model(cases)
    expected = _onnxruntime(model, feeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        reference = run_reference(import_graph(model), feeds)
        compiled = kernorch.compile(model, cost="analytic", rewrite=False)
    outputs = compiled.run(feeds)
    fallback_outputs = {o for n in fallback_nodes(compiled.graph) for o in n.outputs}
    in_c = {o for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True) if b is GENERATED_C
            for o in k.outputs}  # fmt: skip
    problems: list[str] = []
    for case in cases:
        inputs = [feeds[f"{case.name}_in{i}"] for i in range(case.arity)]
        problems += _check(case, reference[case.name], expected[case.name], inputs, "reference")
        problems += _check(case, outputs[case.name], expected[case.name], inputs, "compiled")
        OUTCOME.cases += 1
        OUTCOME.fallback += case.name in fallback_outputs
        OUTCOME.generated_c += case.name in in_c
    assert not problems, "\n".join(problems)


def test_the_cases_cover_every_dtype_and_most_run_in_generated_c() -> None:
    """Run after the groups (pytest keeps file order): how much the property test covered."""
    if OUTCOME.cases < sum(len(g) for g in GROUPS.values()):
        pytest.skip("run with the whole module to count the cases")
    print(f"\n{OUTCOME.cases} cases ({sum(f.size for g in GROUPS.values() for c in g for f in c.feeds())} input "
          f"elements), {OUTCOME.generated_c} in generated C, {OUTCOME.fallback} through the onnxruntime fallback, "
          f"{OUTCOME.known} elements under a documented difference")  # fmt: skip
    assert OUTCOME.cases >= 350
    assert {g.split("-")[0] for g in GROUPS} == set(DTYPES)
    assert OUTCOME.generated_c >= 250


_DIVISION_EDGES = """
import sys, warnings
import numpy as np
from onnx import TensorProto, helper
import kernorch
dtype = sys.argv[1]
low = np.iinfo(dtype).min
nodes = [helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Mod", ["a", "b"], ["r"]),
         helper.make_node("Mod", ["a", "b"], ["f"], fmod=1)]
t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
model = helper.make_model(helper.make_graph(nodes, "d", [helper.make_tensor_value_info(n, t, [3]) for n in "ab"],
                          [helper.make_tensor_value_info(n, t, [3]) for n in "qrf"]),
                          opset_imports=[helper.make_opsetid("", 18)])
compiled = kernorch.compile(model, cost="analytic", rewrite=False)
out = compiled.run({"a": np.array([low, low, 7], dtype), "b": np.array([-1, 1, -1], dtype)})
print(out["q"].tolist(), out["r"].tolist(), out["f"].tolist(), compiled.executor.backends)
try:
    compiled.run({"a": np.array([1, 2, 3], dtype), "b": np.array([1, 0, 1], dtype)})
except kernorch.errors.KernorchError as error:
    print("refused:", error)
"""


@pytest.mark.parametrize("dtype", ["int32", "int64", "int8"])
def test_integer_division_edges_never_signal(dtype: str) -> None:
    """INT_MIN / -1 wraps to INT_MIN and its remainder is 0 (onnxruntime's process dies of SIGFPE there); a zero
    divisor is refused with a one-line error naming the kernel (onnxruntime refuses it too). In a child process:
    a signal would end it, not the suite."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _DIVISION_EDGES, dtype], capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    low = int(np.iinfo(dtype).min)
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith(f"[{low}, {low}, -7] [0, 0, 0] [0, 0, 0]"), lines
    assert "<backend c>" in lines[0]  # int8 too: generated C computes 8- and 16-bit integers
    assert "integer division or modulo by zero" in lines[1] or "integer division by zero" in lines[1], lines


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a cast to bool keeps the low byte",
         'return f"((uint8_t)(({value}) != 0))"',
         'return f"((uint8_t)({value}))"',
         file="kernorch/codegen/c/expr.py",
         tests=("tests/test_onnx_semantics.py::test_every_case_matches_onnxruntime",)),
    here("Sign of NaN is 0 in C",
         '"sign": f"(({a}) != ({a}) ? ({a}) :',
         '"sign": f"(0 ? ({a}) :',
         file="kernorch/codegen/c/expr.py",
         tests=("tests/test_onnx_semantics.py::test_every_case_matches_onnxruntime",)),
    here("a float cast to a narrow integer keeps out-of-range values",
         "valid = (whole >= low) & (whole < high)",
         "valid = whole == whole",
         file="kernorch/ir/numeric.py",
         tests=("tests/test_onnx_semantics.py::test_every_case_matches_onnxruntime",)),
    here("INT_MIN / -1 divides (a trap)",
         "return b == -1 ? (int64_t)(0 - (uint64_t)a) : a / b;",
         "return a / b;",
         file="kernorch/codegen/c/prelude.py",
         tests=("tests/test_onnx_semantics.py::test_integer_division_edges_never_signal",)),
]  # fmt: skip
