"""ONNX's Reduce semantics exactly — the reduction part of the semantics property test (test_onnx_semantics.py
covers the elementwise operators): every Reduce operator, and ArgMax/ArgMin, over every form of `axes` (absent,
empty, given as an attribute before opset 18 — 13 for ReduceSum — or as an input from then on), `keepdims` 0/1
and `noop_with_empty_axes` 0/1, on edge values (NaN, ±inf, ±0, large and tiny, integer extremes) and edge sizes
(1, odd, prime), through the reference interpreter and the compiled plan, against onnxruntime and
`onnx.reference`.

All cases of one opset are one model (one C compile). Where the two references disagree onnxruntime decides,
and `_quirk` names the elements and why (ReduceLogSumExp at infinities); every other element of onnx.reference
must agree with onnxruntime too. The table the closing notes quote is printed by the last test (`pytest -s`).

Max pooling with NaN in a window: kernorch's window max propagates NaN (a window holding NaN is NaN), the
choice the README's edge-semantics section states: onnxruntime's MaxPool skips NaN unless the window is all NaN
(its comparison `x > max` is false for NaN), onnx.reference's follows numpy's max (NaN wins). GlobalMaxPool is
a ReduceMax over the spatial axes in onnxruntime and kernorch alike, and propagates NaN in both.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import kernorch
from kernorch.devtools.mutate import here
from kernorch.errors import FallbackWarning
from kernorch.fission import fallback_nodes
from kernorch.pipeline import import_graph
from kernorch.runtime.reference import run_reference

REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1",
          "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")  # fmt: skip
INTEGER_REDUCE = ("ReduceSum", "ReduceMax", "ReduceMin")  # the ones kernorch and onnxruntime take on int32
SHAPE = (3, 5, 7)  # odd and prime sizes; the axes below include every subset form
AXES = ("absent", "empty", (1,), (-1,), (0, 2), (0, 1, 2))


def float_input() -> np.ndarray:
    """Rows that are clean, and rows holding one of the edge values: each edge value reaches every reduction
    both alone in its slice and among ordinary values."""
    rng = np.random.default_rng(7)
    x = (rng.uniform(0.25, 2.0, SHAPE) * rng.choice([-1, 1], SHAPE)).astype(np.float32)
    edges = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, 1e-40, -1e-30]
    for position, value in enumerate(edges):
        x[position % 3, position % 5, (3 * position) % 7] = value
    x[2, 4, :] = np.inf  # a whole slice of inf: max-shifted sums see inf - inf
    x[1, 0, :] = -np.inf
    return x


def int_input(extremes: bool) -> np.ndarray:
    """With the int32 extremes for max and min; without them for sums (an overflowing integer sum is left to
    the implementation: onnxruntime's saturates here, onnx.reference's and kernorch's wrap)."""
    rng = np.random.default_rng(8)
    x = rng.integers(-1000, 1000, SHAPE).astype(np.int32)
    if extremes:
        x[0, 0, 0], x[1, 1, 1], x[2, 2, 2] = np.iinfo(np.int32).max, np.iinfo(np.int32).min, 0
    return x


@dataclass(frozen=True)
class Case:
    op: str
    dtype: str
    axes: str | tuple[int, ...]
    keepdims: int
    noop: int
    opset: int

    @property
    def name(self) -> str:
        axes = self.axes if isinstance(self.axes, str) else "_".join(str(a).replace("-", "m") for a in self.axes)
        return f"{self.op}_{self.dtype}_axes_{axes}_k{self.keepdims}_n{self.noop}_o{self.opset}"

    @property
    def axes_as_input(self) -> bool:
        return self.opset >= (13 if self.op == "ReduceSum" else 18)

    def nodes(self, source: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
        attrs: dict[str, object] = {"keepdims": self.keepdims}
        inputs, initializers = [source], []
        if self.op.startswith("Arg"):
            axis = self.axes[0] if isinstance(self.axes, tuple) else 0
            return [helper.make_node(self.op, inputs, [self.name], axis=axis, keepdims=self.keepdims,
                                     select_last_index=self.noop)], []  # fmt: skip
        if self.axes_as_input:
            attrs["noop_with_empty_axes"] = self.noop
            if self.axes != "absent":
                values = [] if self.axes == "empty" else list(self.axes)
                initializers.append(helper.make_tensor(f"{self.name}_axes", onnx.TensorProto.INT64, [len(values)],
                                                       values))  # fmt: skip
                inputs.append(f"{self.name}_axes")
        elif isinstance(self.axes, tuple):
            attrs["axes"] = list(self.axes)
        return [helper.make_node(self.op, inputs, [self.name], **attrs)], initializers


def cases(opset: int) -> list[Case]:
    found = []
    for op in (*REDUCE, "ArgMax", "ArgMin"):
        for dtype in ("float32", "int32"):
            if dtype == "int32" and op not in (*INTEGER_REDUCE, "ArgMax", "ArgMin"):
                continue
            for axes in AXES:
                for keepdims in (0, 1):
                    for noop in (0, 1):
                        case = Case(op, dtype, axes, keepdims, noop, opset)
                        arg = op.startswith("Arg")
                        if arg and (axes == "empty" or (isinstance(axes, tuple) and len(axes) > 1)):
                            continue  # ArgMax/ArgMin take one axis; `noop` stands for select_last_index there
                        if not arg and not case.axes_as_input and (noop or axes == "empty"):
                            continue  # no noop_with_empty_axes, no empty axes input before axes were an input
                        found.append(case)
    return found


def case_model(opset: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[Case]]:
    chosen = cases(opset)
    nodes, initializers, outputs = [], [], []
    for case in chosen:
        sums_ints = (case.op, case.dtype) == ("ReduceSum", "int32")
        made, inits = case.nodes("x_int32_sum" if sums_ints else f"x_{case.dtype}")
        nodes += made
        initializers += inits
        out_type = onnx.TensorProto.INT64 if case.op.startswith("Arg") else \
            helper.np_dtype_to_tensor_dtype(np.dtype(case.dtype))  # fmt: skip
        outputs.append(helper.make_tensor_value_info(case.name, out_type, None))
    inputs = [helper.make_tensor_value_info("x_float32", onnx.TensorProto.FLOAT, list(SHAPE)),
              helper.make_tensor_value_info("x_int32", onnx.TensorProto.INT32, list(SHAPE)),
              helper.make_tensor_value_info("x_int32_sum", onnx.TensorProto.INT32, list(SHAPE))]  # fmt: skip
    graph = helper.make_graph(nodes, f"reduce{opset}", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    model = onnx.shape_inference.infer_shapes(model)  # outputs typed: kernorch's import reads declared shapes
    feeds = {"x_float32": float_input(), "x_int32": int_input(True), "x_int32_sum": int_input(False)}
    return model, feeds, chosen


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def _onnx_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        evaluator = ReferenceEvaluator(model)
        names = [o.name for o in model.graph.output]
        return dict(zip(names, evaluator.run(names, feeds), strict=True))


def mismatch(actual: np.ndarray, expected: np.ndarray, exact: bool) -> str | None:
    """None when equal: integers exactly, floats with NaN where the reference has NaN and a sum's rounding
    (the order of additions differs: 1e-5 relative)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return f"{actual.dtype}{actual.shape} instead of {expected.dtype}{expected.shape}"
    if expected.dtype.kind != "f":
        bad = np.flatnonzero(actual != expected)
    else:
        nan = np.isnan(expected)
        same = (actual == expected) | (nan & np.isnan(actual))
        if not exact:
            with np.errstate(invalid="ignore", over="ignore"):
                wide = expected.astype(np.float64)
                same |= (np.abs(actual - wide) <= 1e-5 * np.maximum(np.abs(wide), 1e-30)) & np.isfinite(wide)
        bad = np.flatnonzero(~same)
    if not bad.size:
        return None
    i = int(bad[0])
    return f"{bad.size} element(s) differ; first at {i}: {actual.reshape(-1)[i]!r}, " \
           f"expected {expected.reshape(-1)[i]!r}"


EXACT_OPS = ("ReduceMax", "ReduceMin", "ArgMax", "ArgMin")


def _quirk(case: Case, spec: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """The elements where onnx.reference is known to differ: its ReduceLogSumExp computes x - max(x) with the
    infinities left out of the max, so a slice of -inf alone is NaN (-inf - -inf), and with noop_with_empty_axes
    and no axes it still subtracts, so ±inf become NaN; onnxruntime gives -inf and ±inf (the ONNX definition,
    log(sum(exp(x))), agrees)."""
    if case.op != "ReduceLogSumExp":
        return np.zeros(np.shape(expected), dtype=bool)
    return np.isnan(spec) & np.isinf(expected)


@dataclass
class Table:
    # (opset, op) -> [cases, reference ok, compiled ok, elements where onnx.reference differs]
    rows: dict[tuple[int, str], list[int]]


TABLE = Table({})


@pytest.mark.parametrize("opset", [13, 18])
def test_every_reduce_case_matches_onnxruntime(opset: int) -> None:
    model, feeds, chosen = case_model(opset)
    expected = _onnxruntime(model, feeds)
    spec = _onnx_reference(model, feeds)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", FallbackWarning)
        reference = run_reference(import_graph(model), feeds)
        compiled = kernorch.compile(model, cost="analytic", rewrite=False)
        outputs = compiled.run(feeds)
    assert not fallback_nodes(compiled.graph), "every Reduce case has a fission rule"
    problems = []
    for case in chosen:
        exact = case.op in EXACT_OPS or case.dtype != "float32"
        row = TABLE.rows.setdefault((opset, case.op), [0, 0, 0, 0])
        row[0] += 1
        quirk = _quirk(case, spec[case.name], expected[case.name])
        row[3] += int(quirk.sum())
        agree = mismatch(spec[case.name][~quirk], expected[case.name][~quirk], exact)
        if agree is not None:
            problems.append(f"onnx.reference vs onnxruntime {case.name}: {agree}")
        for path, got, column in (("reference", reference, 1), ("compiled", outputs, 2)):
            problem = mismatch(got[case.name], expected[case.name], exact)
            if problem:
                problems.append(f"{path} {case.name}: {problem}")
            else:
                row[column] += 1
    assert not problems, "\n".join(problems[:30])


def test_the_reduce_table() -> None:
    """Run after the cases (pytest keeps file order): the table, and that every operator was covered."""
    if len(TABLE.rows) < 2 * (len(REDUCE) + 2):
        pytest.skip("run with the whole module to print the table")
    print("\nopset | operator | cases | reference ok | compiled ok | elements where onnx.reference differs")
    for (opset, op), (count, ref_ok, compiled_ok, quirks) in sorted(TABLE.rows.items()):
        print(f"{opset} | {op} | {count} | {ref_ok} | {compiled_ok} | {quirks}")
        assert ref_ok == compiled_ok == count
    assert sum(r[0] for r in TABLE.rows.values()) >= 300


def _max_pool_model(op: str) -> onnx.ModelProto:
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]} if op == "MaxPool" else {}
    out = 2 if op == "MaxPool" else 1
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 4, 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, out, out])
    graph = helper.make_graph([node], "pool", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


@pytest.mark.parametrize("op", ["MaxPool", "GlobalMaxPool"])
def test_max_pooling_propagates_nan(op: str) -> None:
    """The README's choice: a window (or a global pool) holding NaN is NaN, in the reference and compiled alike.
    onnxruntime's MaxPool skips NaN (the test pins that too, so a change there is seen)."""
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 0, 1] = np.nan  # window (0, 0) holds one NaN
    x[0, 0, 2:, 2:] = np.nan  # window (1, 1) is all NaN
    model = _max_pool_model(op)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        reference = run_reference(import_graph(model), {"x": x})["y"]
        compiled = kernorch.compile(model, cost="analytic", rewrite=False).run({"x": x})["y"]
    theirs = _onnxruntime(model, {"x": x})["y"]
    if op == "MaxPool":
        expected = np.array([[np.nan, 7.0], [13.0, np.nan]], np.float32).reshape(1, 1, 2, 2)
        assert theirs[0, 0, 0, 0] == 5.0 and np.isnan(theirs[0, 0, 1, 1])  # onnxruntime skips a NaN among numbers
    else:
        expected = np.full((1, 1, 1, 1), np.nan, np.float32)
        assert np.isnan(theirs).all()
    np.testing.assert_array_equal(reference, expected)
    np.testing.assert_array_equal(compiled, expected)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("noop_with_empty_axes skips the elementwise part too (ReduceSumSquare returns x)",
         "if skip_reduction and ctx.op == \"ReduceLogSumExp\":",
         "if skip_reduction:",
         file="kernorch/fission/rules/reduce.py"),
    here("ReduceLogSumExp shifts by an infinite peak (inf - inf is NaN)",
         'peak = ctx.emit("where", infinite, ctx.scalar(0, dtype), peak)',
         "pass",
         file="kernorch/fission/rules/reduce.py"),
    here("MaxPool skips NaN as onnxruntime's does",
         "result = windows.max(axis=axes) if reducer",
         "result = np.nanmax(windows, axis=axes) if reducer",
         file="kernorch/ir/reference_kernels.py"),
]  # fmt: skip
