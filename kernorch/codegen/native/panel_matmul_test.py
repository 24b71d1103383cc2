"""The float32 matmul in panels of output columns (native/panel_matmul.py): chosen exactly where it applies, and
equal to onnxruntime across column counts that leave a panel of 8, rows that leave blocks of fewer than six, one
row, batch dims folded into the rows, more rows than a pass, fewer panels than threads (the threads split the
rows), transposed weights (Gemm's transB), post-ops in registers and over the stored block, and edge values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.library.call import LibraryCall, Tensor, describe_library_call
from kernorch.codegen.native.panel_matmul import PASS_ROWS, panel_matmul_rejection, render_panel_matmul
from kernorch.devtools.mutate import here
from kernorch.testing import cpu_compile, random_array
from kernorch.testing.native import assert_close, assert_close_with_edges, assert_compiles_for, pretend_isa
from kernorch.tools.check import run_onnxruntime

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`


@pytest.fixture(autouse=True)
def without_avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel takes its calls on CPUs without AVX-512; its C (8-float vectors) runs on every x86-64."""
    pretend_isa(monkeypatch, avx512=False)


def matmul_model(rows: tuple[int, ...], inputs: int, outputs: int, epilogue: str = "none",
                 transposed: bool = False, batched_weights: bool = False, sliced: bool = False
                 ) -> onnx.ModelProto:  # fmt: skip
    """x [*rows, inputs] (`sliced`: the first rows[-1] of each batch item's rows[-1] + 3) → MatMul by constant
    weights (or Gemm with transB) → + bias → epilogue → y. Epilogues: "none", "relu", "swish", "a residual,
    then relu" (z: y's shape), "times a value per row" (z: [*rows, 1]), "plus a value per column" (z: [1,
    outputs], read at run time)."""
    weights = (random_array((inputs, outputs), seed=1) / np.sqrt(inputs)).astype(np.float32)
    if batched_weights:
        weights = np.stack([weights, -weights])
    initializers = [numpy_helper.from_array(weights.T.copy() if transposed else weights, "w"),
                    numpy_helper.from_array(random_array((outputs,), seed=2), "b")]  # fmt: skip
    inputs_info = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (*rows[:-1], rows[-1] + 3 * sliced, inputs))]
    nodes = []
    if sliced:
        initializers += [numpy_helper.from_array(np.array([value], np.int64), name)
                         for name, value in (("start", 0), ("end", rows[-1]), ("axis", -2))]  # fmt: skip
        nodes.append(helper.make_node("Slice", ["x", "start", "end", "axis"], ["xs"]))
    source = "xs" if sliced else "x"
    if transposed:
        nodes.append(helper.make_node("Gemm", [source, "w", "b"], ["c"], transB=1))
    else:
        nodes += [helper.make_node("MatMul", [source, "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["c"])]
    operand = {"a residual, then relu": (*rows, outputs), "times a value per row": (*rows, 1),
               "plus a value per column": (1, outputs)}.get(epilogue)  # fmt: skip
    if operand is not None:
        inputs_info.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, operand))
    if epilogue == "none":
        nodes.append(helper.make_node("Identity", ["c"], ["y"]))
    elif epilogue == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif epilogue == "swish":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    elif epilogue == "a residual, then relu":
        nodes += [helper.make_node("Add", ["c", "z"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    elif epilogue == "times a value per row":
        nodes.append(helper.make_node("Mul", ["c", "z"], ["y"]))
    else:
        nodes.append(helper.make_node("Add", ["c", "z"], ["y"]))
    graph = helper.make_graph(nodes, "panel_matmul", inputs_info,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def compiled_call(model: onnx.ModelProto, threads: int = 2, feeds: dict[str, np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, LibraryCall, str]:  # fmt: skip
    """(kernorch's output, onnxruntime's, the model's one library call, the backend that ran it)."""
    shapes = {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim) for i in model.graph.input}
    feeds = feeds or {name: random_array(shape, seed=3 + k) for k, (name, shape) in enumerate(shapes.items())}
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout="channels-last", rewrite=True,
                           threads=threads)  # fmt: skip
    calls = [(describe_library_call(k), b.name) for k, b in zip(compiled.kernels, compiled.executor.backends,
                                                               strict=True) if b.stateful]  # fmt: skip
    assert len(calls) == 1, calls
    return compiled.run(feeds)["y"], run_onnxruntime(model, feeds)["y"], *calls[0]


CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {  # arguments, the post-ops the call must apply
    "37 rows (register blocks of 6, 6 and five of 5), 200 columns (12 panels of 16 and one of 8), bias only": (
        dict(rows=(37,), inputs=96, outputs=200), ()),
    "Qwen2's MLP gate at a tenth of its width: 128 rows, swish over each stored block": (
        dict(rows=(1, 128), inputs=90, outputs=488, epilogue="swish"), ("swish",)),
    "batch dims folded into the rows (2 x 5), a residual then relu in registers": (
        dict(rows=(2, 5), inputs=64, outputs=48, epilogue="a residual, then relu"), ("add", "relu")),
    "one row, a prime depth": (dict(rows=(1,), inputs=97, outputs=24), ()),
    "one panel of 8 for two threads: the threads split the rows": (
        dict(rows=(23,), inputs=40, outputs=8, epilogue="relu"), ("relu",)),
    f"more rows than outputs, split among the threads, more than a pass ({PASS_ROWS}) each: a second pass": (
        dict(rows=(2 * PASS_ROWS + 11,), inputs=48, outputs=40, epilogue="relu"), ("relu",)),
    "Gemm's transposed weights (transB)": (dict(rows=(19,), inputs=72, outputs=56, transposed=True), ()),
    "a value per row, broadcast over the columns in registers": (
        dict(rows=(3, 7), inputs=32, outputs=40, epilogue="times a value per row"), ("mul",)),
    "a value per column read at run time, a vector of them in registers": (
        dict(rows=(13,), inputs=32, outputs=24, epilogue="plus a value per column"), ("add",)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_panel_matmul_matches_onnxruntime(case: str) -> None:
    arguments, post_ops = CASES[case]
    actual, expected, call, backend = compiled_call(matmul_model(**arguments))
    assert (backend, panel_matmul_rejection(call)) == ("panel_matmul", None)
    assert tuple(op.alg for op, _ in call.post_ops) == post_ops
    source = render_panel_matmul("k", call)
    assert ("ko_v8 v = a0_0;" in source) == (bool(post_ops) and "swish" not in post_ops), source
    assert ("#pragma omp simd" in source) == ("swish" in post_ops)
    assert_close(actual, expected)


@pytest.mark.parametrize("threads", [1, 3])
def test_any_number_of_threads(threads: int) -> None:
    """29 rows: three panels among one or three threads (by columns), 24 columns by rows (fewer than the rows, and
    two panels among three threads)."""
    for outputs in (40, 24):
        actual, expected, call, backend = compiled_call(matmul_model((29,), 56, outputs, "relu"), threads)
        assert backend == "panel_matmul"
        assert_close(actual, expected)


@pytest.mark.parametrize(("rows", "outputs", "by_columns"), [(128, 488, 1), (128, 128, 1), (491, 40, 0)])
def test_threads_split_the_columns_only_where_the_weights_outweigh_the_rows(rows: int, outputs: int,
                                                                           by_columns: int) -> None:  # fmt: skip
    """By columns each thread reads every row and its share of the weights, by rows its share of the rows and
    every weight: the columns where N >= M."""
    _, _, call, _ = compiled_call(matmul_model((rows,), 32, outputs))
    assert f"const int by_columns = {by_columns} && " in render_panel_matmul("k", call)


def test_edge_values_pass_through_as_onnxruntime_computes_them() -> None:
    """Inputs of ±1e30 (the products reach ±inf: relu keeps +inf and makes -inf 0) and NaN (kept)."""
    model = matmul_model((9,), 40, 24, "relu")
    x = random_array((9, 40), seed=9)
    x[0, :], x[4, :], x[7, 3] = 1e30, -1e30, np.nan
    actual, expected, call, backend = compiled_call(model, feeds={"x": x})
    assert backend == "panel_matmul"
    assert_close_with_edges(actual, expected)


@pytest.mark.parametrize(("changes", "reason"), [
    (dict(outputs=44), "44 output columns are no multiple of 8"),
    (dict(rows=(2, 7), batched_weights=True), "weights with batch dims"),
    (dict(rows=(2, 5), sliced=True), "rows that are not evenly strided"),
])  # fmt: skip
def test_matmuls_it_does_not_take_stay_with_onednn(changes: dict[str, Any], reason: str) -> None:
    arguments: dict[str, Any] = dict(rows=(7,), inputs=72, outputs=32) | changes
    actual, expected, call, backend = compiled_call(matmul_model(**arguments))
    assert (backend, panel_matmul_rejection(call)) == ("onednn", reason)
    assert_close(actual, expected)


def test_a_vector_times_a_matrix_is_not_its() -> None:
    call = LibraryCall("matmul", Tensor(0, (64,), (1,)), Tensor(1, (64, 32), (32, 1), constant=True), None,
                       Tensor(2, (32,), (1,)))  # fmt: skip
    assert panel_matmul_rejection(call) == "a 1-d operand"


def test_avx512_keeps_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    pretend_isa(monkeypatch, avx512=True)
    actual, expected, call, backend = compiled_call(matmul_model((7,), 72, 32))
    assert (backend, panel_matmul_rejection(call)) == (
        "onednn", "AVX-512: oneDNN's matmul, not measured against this kernel there")
    assert_close(actual, expected)


@pytest.mark.parametrize("isa", [("-mavx2", "-mfma"), ("-mavx512f",), ("-march=x86-64",)])
def test_the_source_compiles_for_every_x86_64(isa: tuple[str, ...], tmp_path: Path) -> None:
    _, _, call, _ = compiled_call(matmul_model((37,), 96, 200, "a residual, then relu"))
    assert_compiles_for(isa, call, tmp_path)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the panel matmul folds batch dims into rows that are not evenly strided",
         "if dim != 1 and stride != rows * row_stride:",
         "if dim != 1 and stride < 0:"),
    here("the panel matmul reads the weights' rows as their columns",
         "w_k, w_n = call.weights.strides[-2:]",
         "w_n, w_k = call.weights.strides[-2:]"),
    here("the panel matmul's threads split the columns of a product whose rows outweigh its weights",
         'f"const int by_columns = {int(outputs >= rows)} && {panels} >= threads;",',
         'f"const int by_columns = {int(outputs >= 0)} && {panels} >= threads;",'),
    here("the panel matmul's threads, splitting the rows, skip the first panel",
         'f"const long q0 = by_columns ? {panels} * t / threads : 0;",',
         'f"const long q0 = by_columns ? {panels} * t / threads : 1;",'),
    here("the panel matmul's last thread stops a panel short",
         'f"const long q1 = by_columns ? {panels} * (t + 1) / threads : {panels};",',
         'f"const long q1 = by_columns ? {panels} * (t + 1) / threads - (t + 1 == threads) : {panels};",'),
    here("the panel matmul's threads split the rows at the wrong row",
         'f"const long m0 = by_columns ? 0 : {rows}L * t / threads;",',
         'f"const long m0 = by_columns ? 0 : {rows}L * t / threads + 1;",'),
    here("the panel matmul's passes stop short of the last rows",
         'w.line(f"const long pass_end = pass + {PASS_ROWS} < m1 ? pass + {PASS_ROWS} : m1;",',
         'w.line(f"const long pass_end = pass + {PASS_ROWS} < m1 ? pass + {PASS_ROWS} - 1 : m1;",'),
    here("a per-row operand of the panel matmul is read per column",
         "operands.append((op, dataclasses.replace(tensor, dims=(1, o_columns, 1, o_rows),",
         "operands.append((op, dataclasses.replace(tensor, dims=(1, o_rows, 1, o_columns),"),
]  # fmt: skip
