"""The registry's seam, used the way a second renderer (Triton for GPUs) will use it: a toy backend that renders a
kernel's GIR as a NumPy function registers itself, takes the fused elementwise kernels of a plan, and the plan
runs through it and matches onnxruntime. Nothing outside the backend changes: the orchestrator prices its
kernels, the executor runs them (`Backend.python_kernel`), the plan program leaves them out."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from onnx import ModelProto, TensorProto, helper

from kernorch.codegen.backends import (
    GENERATED_C,
    REFERENCE,
    Backend,
    NotGeneratable,
    PythonKernel,
    Verdict,
    choose_backend,
    declines,
    register,
    registered,
    runs,
    unregister,
    withheld,
)
from kernorch.codegen.gir import CONSTANT, ELEMENTWISE, MOVE, Gir, rewritten
from kernorch.devtools.mutate import here
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.pipeline import import_graph
from kernorch.testing import cpu_compile
from kernorch.tools.check import run_onnxruntime

NUMPY = {"add": "np.add", "sub": "np.subtract", "mul": "np.multiply", "div": "np.divide", "tanh": "np.tanh",
         "exp": "np.exp", "neg": "np.negative", "abs": "np.abs", "sqrt": "np.sqrt"}  # fmt: skip


def render_numpy(name: str, gir: Gir) -> str:
    """The GIR of an elementwise kernel (one phase; every load and the store at the same index) as the source of
    a Python function over whole flattened arrays: the gOperators in order, one statement each."""
    (phase,) = gir.phases
    position = {buffer.name: i for i, buffer in enumerate(gir.buffers)}
    inputs = sum(1 for buffer in gir.buffers if buffer.role == "input")
    lines = [f"def {name}(args):", "    out = [None] * " + str(len(gir.buffers) - inputs)]
    shapes = []
    for op in phase.ops:
        if op.kind == MOVE and op.name == "load":
            lines.append(f"    r{op.writes[0]} = args[{position[gir.slices[op.reads[0]].buffer]}].reshape(-1)")
        elif op.kind == CONSTANT:
            value, dtype = op.constant
            lines.append(f"    r{op.writes[0]} = np.{dtype}(float({str(value)!r}))")
        elif op.kind == ELEMENTWISE:
            lines.append(f"    r{op.writes[0]} = {NUMPY[op.name]}({', '.join(f'r{r}' for r in op.reads)})")
        else:  # the store
            buffer = gir.buffers[position[gir.slices[op.writes[0]].buffer]]
            shapes.append(buffer.shape)
            lines.append(f"    out[{position[buffer.name] - inputs}] = np.broadcast_to(r{op.reads[0]}, "
                         f"({int(np.prod(buffer.shape))},)).reshape({buffer.shape})")  # fmt: skip
    return "\n".join([*lines, "    return out", ""])


class NumpyElementwise(Backend):
    name = "numpy_toy"
    family = "reference"
    native = False  # run by Python: `python_kernel`
    signature_label = "numpy_toy"

    def applies(self, kernel: CandidateKernel) -> Verdict:
        if len(kernel.nodes) < 2:
            return declines("the toy takes fusions only")
        try:
            gir = rewritten(kernel)
        except NotGeneratable as error:
            return declines(str(error))
        if len(gir.phases) != 1 or any(b.role not in ("input", "output") or b.dtype != "float32"
                                       for b in gir.buffers):  # fmt: skip
            return declines("not one phase over float32 inputs and outputs")
        ops = gir.phases[0].ops
        if any(op.kind not in (MOVE, CONSTANT, ELEMENTWISE) or op.kind == ELEMENTWISE and op.name not in NUMPY
               or op.scope or op.outer for op in ops):  # fmt: skip
            return declines("not a plain map of the elementwise primitives the toy knows")
        moves = [op for op in ops if op.kind == MOVE]
        shapes = {gir.buffers[i].shape for i, b in enumerate(gir.buffers)
                  if any(gir.slices[s].buffer == b.name for op in moves for s in (*op.reads, *op.writes))}
        if len({op.code for op in moves}) != 1 or len(shapes) != 1:
            return declines("its loads and store are not at one index of one shape")
        return runs("NumPy, rendered from the GIR")

    def python_kernel(self, kernel: CandidateKernel) -> PythonKernel:
        namespace: dict[str, object] = {"np": np}
        exec(render_numpy("toy_kernel", rewritten(kernel)), namespace)  # noqa: S102 - our own rendered source
        function = namespace["toy_kernel"]

        def run(arrays: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
            return function(arrays)  # type: ignore[operator, no-any-return]

        return run


TOY = NumpyElementwise()


@pytest.fixture
def toy() -> Iterator[NumpyElementwise]:
    register(TOY, before=GENERATED_C)
    try:
        yield TOY
    finally:
        unregister(TOY)


def _model() -> ModelProto:
    nodes = [helper.make_node("Mul", ["x", "two"], ["m"]), helper.make_node("Add", ["m", "b"], ["s"]),
             helper.make_node("Tanh", ["s"], ["t"]), helper.make_node("MatMul", ["t", "w"], ["y"])]  # fmt: skip
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        nodes, "toy", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 64]) for n in "xb"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
         helper.make_tensor("w", TensorProto.FLOAT, [64, 32], rng.standard_normal(64 * 32).tolist())])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_registered_backend_runs_its_kernels_of_a_plan(toy: NumpyElementwise) -> None:
    model = _model()
    compiled = cpu_compile(model, cost="analytic", rewrite=False)
    assert toy in compiled.executor.backends, compiled.executor.backends
    assert any(b.native for b in compiled.executor.backends)  # the matmul stays a library call
    toys = [k for k, b in enumerate(compiled.executor.backends) if b is toy]
    assert toys and not any(f"_k{k}_slots" in compiled.executor.source for k in toys)  # left out of the C
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((4, 64)).astype(np.float32) for n in "xb"}
    np.testing.assert_allclose(compiled.run(feeds)["y"], run_onnxruntime(model, feeds)["y"], rtol=1e-5, atol=1e-5)


def test_the_registry_asks_in_order_and_refuses_a_second_name(toy: NumpyElementwise) -> None:
    order = registered()
    assert order.index(toy) == order.index(GENERATED_C) - 1 and order[-1] is REFERENCE
    with pytest.raises(ValueError, match="registered already"):
        register(NumpyElementwise())


def test_without_it_the_same_kernels_are_generated_c() -> None:
    compiled = cpu_compile(_model(), cost="analytic", rewrite=False)
    assert TOY not in compiled.executor.backends and GENERATED_C in compiled.executor.backends
    assert all(choose_backend(k)[0] is not TOY for k in compiled.kernels)


def test_a_kernel_nothing_runs_carries_the_reason_of_its_kind() -> None:
    """Two matmuls in one kernel: the library calls' reason (generated C declines linear primitives without
    claiming them); a lone top_k: generated C's reason, run by the reference implementation."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("MatMul", ["m", "w"], ["y"]),
             helper.make_node("TopK", ["x", "k"], ["v", "i"])]  # fmt: skip
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8]),
               helper.make_tensor_value_info("v", TensorProto.FLOAT, [4, 2]),
               helper.make_tensor_value_info("i", TensorProto.INT64, [4, 2])]  # fmt: skip
    constants = [helper.make_tensor("w", TensorProto.FLOAT, [8, 8], rng.standard_normal(64).tolist()),
                 helper.make_tensor("k", TensorProto.INT64, [1], [2])]  # fmt: skip
    graph = import_graph(helper.make_model(helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])], outputs, constants),
        opset_imports=[helper.make_opsetid("", 17)]))  # fmt: skip
    assert choose_backend(make_kernel(graph, (0, 1), ("y",))) == (None, "2 linear primitives in one library call")
    backend, reason = choose_backend(make_kernel(graph, (2,), graph.nodes[2].outputs))
    assert backend is REFERENCE and reason == "reference implementation (top_k is not a memory-intensive primitive)"


def test_a_withheld_backend_returns_to_its_place_even_when_the_block_fails() -> None:
    before = registered()
    with pytest.raises(RuntimeError), withheld(GENERATED_C):
        assert GENERATED_C not in registered()
        raise RuntimeError("the block fails")
    assert registered() == before


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the executor ignores a Python backend's function",
         "function = self.backends[k].python_kernel(kernel)",
         "function = None",
         file="kernorch/runtime/executor.py"),
    here("a registered backend is asked after the built-in ones",
         "order.insert(order.index(before) if before is not None else len(order), backend)",
         "order.append(backend)"),
    here("a kernel no backend runs gets the last backend's reason",
         "if verdict.claims and claimed is None:",
         "if True:"),
]  # fmt: skip
