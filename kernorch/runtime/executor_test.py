"""Compiled plans equal the reference interpreter: random primitive graphs under random valid plans
(fused, unfused, with redundant kernels), plus the layout primitives the C renderer handles."""

from __future__ import annotations

import ast
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernorch.codegen.backends import GENERATED_C, ONEDNN, VIEW, NotGeneratable, choose_backend, withheld
from kernorch.codegen.native.panel_matmul import BACKEND as PANEL_MATMUL
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node, verify
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.plan import executable_order, validate_plan
from kernorch.ir.primitives import PRIMITIVES
from kernorch.ir.types import TensorType
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate.candidates import enumerate_candidates
from kernorch.orchestrate.pruning import LinearEpilogues
from kernorch.orchestrate.subgraph import build_subgraphs
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference
from kernorch.testing import cpu_compile

UNARY = ["exp", "tanh", "sigmoid", "relu", "neg", "abs", "erf"]
BINARY = ["add", "sub", "mul", "max", "min"]
SHAPE = (2, 3, 4)


class _Builder:
    """Appends typed nodes to a random graph; every builder below ends in a float32 value of SHAPE."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.count = 0

    def node(self, prim: str, inputs: tuple[str, ...], out: TensorType, **attrs: Any) -> str:
        self.count += 1
        name = f"t{self.count}"
        self.graph.nodes.append(Node(prim, inputs, (name,), tuple(sorted(attrs.items()))))
        self.graph.types[name] = out
        return name

    def const(self, array: np.ndarray) -> str:
        self.count += 1
        name = f"c{self.count}"
        self.graph.constants[name] = array
        self.graph.types[name] = TensorType.of(array)
        return name


def _full(dtype: str = "float32", shape: tuple[int, ...] = SHAPE) -> TensorType:
    return TensorType(shape, dtype)


# Each: (builder, rng, source value, another value) -> a float32 value of SHAPE. Together they cover every
# primitive kind the generated C handles: elementwise arithmetic (div, pow), comparisons and where, casts,
# integer and bool tensors, reductions, layout (transpose, reshape, slice, pad, gather, concat, split).
def _unary(b: _Builder, rng: random.Random, x: str, other: str) -> str:
    return b.node(rng.choice(UNARY), (x,), _full())


def _binary(b: _Builder, rng: random.Random, x: str, other: str) -> str:
    return b.node(rng.choice(BINARY), (x, rng.choice([other, "w"])), _full())


def _divide(b: _Builder, rng: random.Random, x: str, other: str) -> str:
    positive = b.node("add", (b.node("abs", (other,), _full()), b.const(np.array(0.5, np.float32))), _full())
    return b.node("div", (x, positive), _full())  # the divisor is ≥ 0.5: never ill-conditioned


def _power(b: _Builder, rng: random.Random, x: str, other: str) -> str:
    bounded = b.node("tanh", (x,), _full())
    return b.node("pow", (bounded, b.const(np.array(rng.choice([2.0, 3.0, 0.5]), np.float32))), _full()) \
        if rng.random() < 0.7 else b.node("pow", (b.node("abs", (bounded,), _full()), bounded), _full())  # fmt: skip


def _compare_where(b: _Builder, rng: random.Random, x: str, other: str) -> str:
    prim = rng.choice(["less", "greater", "less_equal", "greater_equal", "equal"])
    # against max(x, other) or min(x, other) about half the elements tie, so `<` and `<=` differ
    against = b.node(rng.choice(["max", "min"]), (x, other), _full()) if rng.random() < 0.6 else other
    condition = b.node(prim, (x, against), _full("bool"))
    if rng.random() < 0.5:  # bool logic on the way
        second = b.node("greater", (other, b.const(np.array(0.0, np.float32))), _full("bool"))
        condition = b.node(rng.choice(["and", "or", "xor"]), (condition, second), _full("bool"))
        condition = b.node("not", (condition,), _full("bool")) if rng.random() < 0.5 else condition
    return b.node("where", (condition, x, other), _full())


def _integers(b: _Builder, rng: random.Random, x: str, other: str) -> str:
    dtype = rng.choice(["int32", "int64"])
    scaled = b.node("mul", (b.node("tanh", (x,), _full()), b.const(np.array(50.0, np.float32))), _full())
    whole = b.node("cast", (scaled,), _full(dtype), to=dtype)
    other_whole = b.node("cast", (b.node("mul", (b.node("tanh", (other,), _full()),
                                                  b.const(np.array(9.0, np.float32))), _full()),), _full(dtype),
                         to=dtype)  # fmt: skip
    mixed = b.node(rng.choice(["add", "sub", "mul", "max", "min"]), (whole, other_whole), _full(dtype))
    if rng.random() < 0.5:  # integer division truncates toward zero; the divisor is never 0
        positive = b.node("add", (b.node("abs", (other_whole,), _full(dtype)), b.const(np.array(1, dtype))),
                          _full(dtype))  # fmt: skip
        mixed = b.node("div", (mixed, positive), _full(dtype))
    return b.node("cast", (mixed,), _full(), to="float32")


def _reduce(b: _Builder, rng: random.Random, x: str, other: str) -> str:
    axes = tuple(sorted(rng.sample([0, 1, 2], rng.randint(1, 2))))
    reduced = b.node(rng.choice(["reduce_sum", "reduce_max", "reduce_min"]), (x,),
                     _full(shape=tuple(1 if a in axes else d for a, d in enumerate(SHAPE))), axes=axes)  # fmt: skip
    return b.node("sub", (x, reduced), _full())


def _transpose_reshape(b: _Builder, rng: random.Random, x: str, other: str) -> str:
    moved = b.node("transpose", (x,), _full(shape=(2, 4, 3)), perm=(0, 2, 1))
    return b.node("reshape", (moved,), _full(), shape=SHAPE)


def _slice(b: _Builder, rng: random.Random, x: str, other: str) -> str:
    return b.node("slice", (x,), _full(), ranges=((0, 2, 1), (2, -1, -1), (0, 4, 1)))


def _pad(b: _Builder, rng: random.Random, x: str, other: str) -> str:
    mode = rng.choice(["constant", "edge", "reflect"])
    padded = b.node("pad", (x,), _full(shape=(2, 5, 6)), pads=(0, 1, 1, 0, 1, 1), mode=mode, value=0.5)
    row, column = rng.randint(0, 2), rng.randint(0, 2)  # a window of the padded tensor, borders included
    return b.node("slice", (padded,), _full(), ranges=((0, 2, 1), (row, row + 3, 1), (column, column + 4, 1)))


def _gather(b: _Builder, rng: random.Random, x: str, other: str) -> str:
    indices = b.const(np.array(rng.sample([0, 1, 2], 3), np.int64))
    return b.node("gather", (x, indices), _full(), axis=1)


def _split_concat(b: _Builder, rng: random.Random, x: str, other: str) -> str:
    count = b.count + 1
    b.graph.nodes.append(Node("split", (x,), (f"s{count}a", f"s{count}b"), (("axis", 1), ("sizes", (1, 2)))))
    b.graph.types[f"s{count}a"] = _full(shape=(2, 1, 4))
    b.graph.types[f"s{count}b"] = _full(shape=(2, 2, 4))
    b.count += 1
    return b.node("concat", (f"s{count}b", f"s{count}a"), _full(), axis=1)


BUILDERS = [_unary, _binary, _divide, _power, _compare_where, _integers, _reduce, _transpose_reshape, _slice,
            _pad, _gather, _split_concat]  # fmt: skip


def random_graph(rng: random.Random, size: int) -> Graph:
    """Random graph on a float32 [2, 3, 4] input mixing every kind of primitive (see BUILDERS)."""
    graph = Graph(inputs=["x"], types={"x": _full()})
    graph.constants["w"] = np.random.default_rng(rng.randint(0, 99)).standard_normal((1, 3, 1)).astype(np.float32)
    graph.types["w"] = TensorType((1, 3, 1), "float32")
    builder = _Builder(graph)
    values = ["x"]
    for _ in range(size):
        values.append(rng.choice(BUILDERS)(builder, rng, rng.choice(values), rng.choice(values)))
    consumed = {v for n in graph.nodes for v in n.inputs}
    graph.outputs = [v for v in values[1:] if v not in consumed] or [values[-1]]
    verify(graph)
    return graph


def random_plan(graph: Graph, rng: random.Random) -> list[CandidateKernel]:
    """A random executable selection: greedily cover required values with random candidates, sometimes
    adding redundant kernels that recompute primitives another kernel already ran."""
    (sub,) = build_subgraphs(graph, [(0, len(graph.nodes))])
    kernels = enumerate_candidates(sub, OrchestrationLimits(max_kernel_size=6), LinearEpilogues(graph)).kernels
    rng.shuffle(kernels)
    refused: set[object] = set()

    def pick(pool: list[CandidateKernel]) -> CandidateKernel | None:
        """A random kernel of `pool` some backend runs, asked on demand (describing all of a graph's thousands of
        candidates took minutes)."""
        pool = [k for k in pool if k.key not in refused]
        while pool:
            kernel = pool.pop(rng.randrange(len(pool)))
            if choose_backend(kernel)[0]:
                return kernel
            refused.add(kernel.key)
        return None

    available = set(graph.inputs) | set(graph.constants)
    chosen: list[CandidateKernel] = []
    while not set(graph.outputs) <= available:
        kernel = pick([k for k in kernels if set(k.inputs) <= available and not set(k.outputs) <= available])
        assert kernel is not None, "no runnable candidate"
        chosen.append(kernel)
        available |= set(kernel.outputs)
        if rng.random() < 0.3:
            extra = pick([k for k in kernels if set(k.inputs) <= available and k not in chosen])
            if extra is not None:
                chosen.append(extra)  # redundant: recomputes values already available
                available |= set(extra.outputs)
    order, stuck = executable_order(chosen, set(graph.inputs) | set(graph.constants))
    assert not stuck
    plan = [chosen[i] for i in order]
    validate_plan(graph, plan)
    return plan


# derandomize: CI sees the same examples every run. rtol 1e-4: the generated float32 exp is within ~1e-7 of
# libm, but chains such as exp(exp(x)) amplify that (1.2e-5 relative seen at 2.6e18); wrong code is off by O(1).
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), size=st.integers(2, 6))
def test_random_plans_match_reference(seed: int, size: int) -> None:
    graph, plan, feeds, expected = random_case(seed, size)
    actual = PlanExecutor(graph, plan)(feeds)
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=1e-4, atol=1e-5)


def random_case(seed: int, size: int) -> tuple[Graph, list[CandidateKernel], dict[str, np.ndarray],
                                               dict[str, np.ndarray]]:  # fmt: skip
    """A random graph, a random valid plan of it, an input, and what the reference interpreter computes."""
    rng = random.Random(seed)
    graph = random_graph(rng, size)
    plan = random_plan(graph, rng)
    feeds = {"x": np.random.default_rng(seed).standard_normal((2, 3, 4)).astype(np.float32)}
    return graph, plan, feeds, run_reference(graph, feeds)


def _single(prim: str, input_types: dict[str, TensorType], attrs: dict, out: TensorType,
            constants: dict[str, np.ndarray] | None = None) -> Graph:  # fmt: skip
    graph = Graph(inputs=list(input_types), outputs=["y"], types={**input_types, "y": out})
    for name, array in (constants or {}).items():
        graph.constants[name] = array
        graph.types[name] = TensorType.of(array)
    graph.nodes = [Node(prim, (*input_types, *(constants or {})), ("y",), tuple(sorted(attrs.items())))]
    inferred = PRIMITIVES[prim].infer([graph.types[v] for v in graph.nodes[0].inputs], attrs)
    assert inferred == [out], inferred
    return graph


F32 = "float32"
CASES: dict[str, tuple[str, dict[str, Any], tuple[int, ...], tuple[int, ...] | None]] = {
    "pad_reflect": ("pad", {"pads": (0, 1, 2, 0, 2, 1), "mode": "reflect", "value": 0.0}, (1, 4, 5), (1, 7, 8)),
    "pad_edge": ("pad", {"pads": (0, 1, 0, 0, 0, 3), "mode": "edge", "value": 0.0}, (1, 4, 5), (1, 5, 8)),
    "pad_constant": ("pad", {"pads": (0, 1, 1, 0, 0, 2), "mode": "constant", "value": 1.5}, (1, 4, 5), (1, 5, 8)),
    "window_max": ("window_max", {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "dilations": (1, 1),
                                  "ceil_mode": False}, (1, 2, 7, 6), (1, 2, 4, 3)),
    "window_sum_ceil": ("window_sum", {"kernel": (2, 3), "strides": (2, 2), "pads": (0, 0, 0, 0),
                                       "dilations": (1, 1), "ceil_mode": True}, (1, 2, 7, 6), (1, 2, 4, 3)),
    "resize_linear": ("resize", {"sizes": (1, 2, 10, 9), "scales": (1.0, 1.0, 2.0, 1.5), "mode": "linear",
                                 "coordinate_mode": "half_pixel", "nearest_mode": "floor", "cubic_coeff_a": -0.75,
                                 "exclude_outside": False}, (1, 2, 5, 6), (1, 2, 10, 9)),
    "resize_nearest": ("resize", {"sizes": (1, 2, 10, 12), "scales": (1.0, 1.0, 2.0, 2.0), "mode": "nearest",
                                  "coordinate_mode": "asymmetric", "nearest_mode": "floor", "cubic_coeff_a": -0.75,
                                  "exclude_outside": False}, (1, 2, 5, 6), (1, 2, 10, 12)),
    "resize_cubic": ("resize", {"sizes": (1, 2, 8, 6), "scales": (1.0, 1.0, 1.6, 1.0), "mode": "cubic",
                                "coordinate_mode": "half_pixel", "nearest_mode": "floor", "cubic_coeff_a": -0.5,
                                "exclude_outside": False}, (1, 2, 5, 6), (1, 2, 8, 6)),
    "transpose": ("transpose", {"perm": (2, 0, 1)}, (2, 3, 4), (4, 2, 3)),
    "reshape": ("reshape", {"shape": (4, 6)}, (2, 3, 4), (4, 6)),
    "split": ("split", {"axis": 1, "sizes": (1, 2)}, (2, 3, 4), None),
}


@pytest.mark.parametrize("prim", ["less", "greater", "less_equal", "greater_equal", "equal"])
def test_comparisons_at_ties(prim: str) -> None:
    """where(x PRIM max(x, w), x, w): half the elements tie, where `<` and `<=` (or `>` and `>=`) disagree."""
    graph = Graph(inputs=["x"], types={"x": _full()})
    graph.constants["w"] = np.linspace(-1.0, 1.0, 3, dtype=np.float32).reshape(1, 3, 1)
    graph.types["w"] = TensorType((1, 3, 1), "float32")
    b = _Builder(graph)
    upper = b.node("max", ("x", "w"), _full())
    chosen = b.node("where", (b.node(prim, ("x", upper), _full("bool")), "x", "w"), _full())
    graph.outputs = [chosen]
    verify(graph)
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    fused = [make_kernel(graph, tuple(range(len(graph.nodes))), (chosen,))]
    np.testing.assert_array_equal(PlanExecutor(graph, fused)({"x": x})[chosen], run_reference(graph, {"x": x})[chosen])


@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_and_window_primitives(case: str) -> None:
    prim, attrs, in_shape, out_shape = CASES[case]
    x = np.random.default_rng(0).standard_normal(in_shape).astype(np.float32)
    if prim == "split":
        graph = Graph(inputs=["x"], outputs=["a", "b"], types={"x": TensorType(in_shape, F32),
                      "a": TensorType((2, 1, 4), F32), "b": TensorType((2, 2, 4), F32)})  # fmt: skip
        graph.nodes = [Node("split", ("x",), ("a", "b"), tuple(sorted(attrs.items())))]
    else:
        assert out_shape is not None
        graph = _single(prim, {"x": TensorType(in_shape, F32)}, attrs, TensorType(out_shape, F32))
    kernel = make_kernel(graph, (0,), tuple(graph.outputs))
    assert choose_backend(kernel)[0] is (VIEW if prim == "reshape" else GENERATED_C)  # a lone reshape is an alias
    expected = run_reference(graph, {"x": x})
    actual = PlanExecutor(graph, [kernel])({"x": x})
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-6)


def test_gather_and_concat_and_out_of_range_index() -> None:
    table = np.random.default_rng(1).standard_normal((10, 4)).astype(np.float32)
    graph = Graph(inputs=["ids"], outputs=["y"], constants={"table": table},
                  types={"ids": TensorType((2, 3), "int64"), "table": TensorType.of(table),
                         "y": TensorType((2, 3, 4), F32)})  # fmt: skip
    graph.nodes = [Node("gather", ("table", "ids"), ("y",), (("axis", 0),))]
    verify(graph)
    kernel = make_kernel(graph, (0,), ("y",))
    assert choose_backend(kernel)[0] is GENERATED_C
    executor = PlanExecutor(graph, [kernel])
    ids = np.array([[0, 9, -1], [3, 3, 2]], dtype=np.int64)
    np.testing.assert_array_equal(executor({"ids": ids})["y"], run_reference(graph, {"ids": ids})["y"])
    from kernorch.runtime.executor import KernelFailed

    with pytest.raises(KernelFailed, match="out of range"):
        executor({"ids": np.array([[0, 10, 0], [0, 0, 0]], dtype=np.int64)})

    a, b = TensorType((2, 3), F32), TensorType((2, 5), F32)
    graph = Graph(inputs=["a", "b"], outputs=["y"], types={"a": a, "b": b, "y": TensorType((2, 8), F32)})
    graph.nodes = [Node("concat", ("a", "b"), ("y",), (("axis", 1),))]
    feeds = {"a": np.ones((2, 3), np.float32), "b": np.arange(10, dtype=np.float32).reshape(2, 5)}
    out = PlanExecutor(graph, [make_kernel(graph, (0,), ("y",))])(feeds)
    np.testing.assert_array_equal(out["y"], np.concatenate([feeds["a"], feeds["b"]], axis=1))


def test_one_openmp_runtime_per_process() -> None:
    """The generated library, oneDNN and torch share one libgomp, whichever is loaded first."""
    import subprocess
    import sys

    script = (
        "import kernorch, numpy as np, torch\n"
        "from kernorch.tools.demo_models import conv_norm_act_block\n"
        "m = kernorch.compile(conv_norm_act_block(channels=4, size=8), cost='analytic')\n"
        "m(np.zeros((1, 4, 8, 8), np.float32)); torch.matmul(torch.ones(64, 64), torch.ones(64, 64))\n"
        "maps = open('/proc/self/maps').read().splitlines()\n"
        "assert any('libdnnl' in l for l in maps), 'the conv did not run through oneDNN'\n"
        "print(sorted({l.split()[-1] for l in maps if 'omp' in l.split('/')[-1]}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    runtimes = ast.literal_eval(out.strip().splitlines()[-1])
    assert len(runtimes) == 1 and "torch" in runtimes[0], runtimes
    # kernorch first, torch imported afterwards: torch reuses the runtime already loaded
    late = script.replace("import kernorch, numpy as np, torch\n", "import kernorch, numpy as np\n").replace(
        "m(np.zeros((1, 4, 8, 8), np.float32)); ", "m(np.zeros((1, 4, 8, 8), np.float32)); import torch; ")
    out = subprocess.run([sys.executable, "-c", late], capture_output=True, text=True, check=True).stdout
    runtimes = ast.literal_eval(out.strip().splitlines()[-1])
    assert len(runtimes) == 1, runtimes



def test_matmul_bias_is_absorbed_into_the_library_call() -> None:
    from onnx import TensorProto, helper, numpy_helper

    from kernorch.testing import random_array
    from kernorch.tools.check import run_onnxruntime

    a, b, c = random_array((2, 3, 5)), random_array((5, 6), seed=1), random_array((6,), seed=2)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Add", ["m", "c"], ["y"])], "mm_bias",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, (2, 3, 5))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3, 6))],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(c, "c")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    compiled = cpu_compile(model, cost="analytic")
    assert compiled.executor.backends == [ONEDNN]  # one oneDNN matmul with the bias argument
    assert "DNNL_ARG_BIAS" in compiled.executor.source
    np.testing.assert_allclose(compiled.run({"a": a})["y"], run_onnxruntime(model, {"a": a})["y"], rtol=1e-6, atol=1e-6)


def test_transposed_matmul_operands_are_read_through_strides() -> None:
    """q @ kᵀ (attention scores) and aᵀ @ w: the transposes are absorbed into the library call, which reads
    the untransposed buffers with their last two strides swapped."""
    from onnx import TensorProto, helper, numpy_helper

    from kernorch.testing import random_array
    from kernorch.tools.check import run_onnxruntime

    q, k, w = random_array((2, 5, 8)), random_array((2, 7, 8), seed=1), random_array((5, 6), seed=2)
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), helper.make_node("MatMul", ["q", "kt"], ["s"]),
         helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1]), helper.make_node("MatMul", ["qt", "w"], ["p"])],
        "mm_transposed",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, (2, 5, 8)),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, (2, 7, 8))],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, (2, 5, 7)),
         helper.make_tensor_value_info("p", TensorProto.FLOAT, (2, 8, 6))],
        [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with withheld(PANEL_MATMUL):  # which takes the 2-d product without AVX-512
        compiled = cpu_compile(model, cost="analytic")
    assert compiled.executor.backends == [ONEDNN, ONEDNN]  # no transposing copy before either call
    expected = run_onnxruntime(model, {"q": q, "k": k})
    actual = compiled.run({"q": q, "k": k})
    for name in ("s", "p"):
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-5)


def test_a_residual_of_a_transposed_matmul_operand_is_not_a_post_op() -> None:
    """r = xᵀ; y = r @ w + r (ResMLP's token mixing): a candidate reading r through strides cannot also add r as
    a binary post-op (no buffer holds it); it is refused with the reason and the plan computes the right thing."""
    from onnx import TensorProto, helper, numpy_helper

    from kernorch.codegen.backends import choose_backend
    from kernorch.testing import random_array
    from kernorch.tools.check import run_onnxruntime

    x, w = random_array((1, 6, 6)), random_array((6, 6), seed=1)
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["r"], perm=[0, 2, 1]), helper.make_node("MatMul", ["r", "w"], ["m"]),
         helper.make_node("Add", ["m", "r"], ["y"])],
        "residual_view", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 6, 6))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 6, 6))], [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    compiled = cpu_compile(model, cost="analytic")
    fissioned = compiled.graph
    whole = make_kernel(fissioned, tuple(range(len(fissioned.nodes))), tuple(fissioned.outputs))
    backend, reason = choose_backend(whole)
    assert backend is None and "computed inside the kernel" in reason
    np.testing.assert_allclose(compiled.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"], rtol=1e-5,
                               atol=1e-6)  # fmt: skip


def test_attention_reads_q_k_v_from_the_fused_projection_through_strides() -> None:
    """split → reshape → transpose of a fused QKV projection (gpt2's attention) is no copy: each attention
    matmul reads its heads straight out of the projection's output, at an offset and with row stride 3·H·D."""
    from onnx import TensorProto, helper, numpy_helper

    from kernorch.codegen.library.call import absorbed_summary
    from kernorch.testing import random_array
    from kernorch.tools.check import run_onnxruntime

    seq, heads, dim = 40, 2, 24
    x, w = random_array((seq, 32)), random_array((32, 3 * heads * dim), seed=1)
    qkv = [f"{n}" for n in ("q", "k", "v")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]),
             helper.make_node("Split", ["p", "sizes"], [f"{n}2" for n in qkv], axis=1)]
    for n in qkv:
        nodes.append(helper.make_node("Reshape", [f"{n}2", "heads"], [f"{n}3"]))
    nodes += [helper.make_node("Transpose", ["q3"], ["q4"], perm=[1, 0, 2]),
              helper.make_node("Transpose", ["k3"], ["k4"], perm=[1, 2, 0]),
              helper.make_node("Transpose", ["v3"], ["v4"], perm=[1, 0, 2]),
              helper.make_node("MatMul", ["q4", "k4"], ["s"]), helper.make_node("Softmax", ["s"], ["a"], axis=-1),
              helper.make_node("MatMul", ["a", "v4"], ["y"])]
    graph = helper.make_graph(
        nodes, "qkv_views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (seq, 32))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (heads, seq, dim))],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([heads * dim] * 3, np.int64), "sizes"),
         numpy_helper.from_array(np.array([seq, heads, dim], np.int64), "heads")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    compiled = cpu_compile(model, cost="analytic")
    summaries = [absorbed_summary(k) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
                 if b.stateful]  # fmt: skip
    # the split became a slice per piece (rewrite split-to-slices), each read by its matmul through strides
    assert sum((s or "").count("strided operand (slice → reshape → transpose") for s in summaries) == 3, summaries
    assert all(b in (ONEDNN, PANEL_MATMUL, GENERATED_C, VIEW) for b in compiled.executor.backends)
    layout_kernels = [k for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
                      if b is GENERATED_C and all(n.prim in ("split", "reshape", "transpose") for n in k.primitives)]
    assert not layout_kernels, [k.describe() for k in layout_kernels]  # no copy of q, k or v
    np.testing.assert_allclose(compiled.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"], rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_a_matmul_operand_view_without_a_contiguous_inner_axis_is_refused() -> None:
    from kernorch.codegen.library.call import describe_library_call
    from kernorch.ir.kernel import make_kernel
    from kernorch.ir.types import TensorType

    graph = Graph(inputs=["x"], outputs=["y"], name="rotated")
    graph.constants = {"w": np.ones((5, 3), np.float32)}
    graph.types = {"x": TensorType((4, 5, 6), "float32"), "t": TensorType((6, 4, 5), "float32"),
                   "w": TensorType((5, 3), "float32"), "y": TensorType((6, 4, 3), "float32")}  # fmt: skip
    graph.nodes = [Node("transpose", ("x",), ("t",), (("perm", (2, 0, 1)),)), Node("matmul", ("t", "w"), ("y",))]
    with pytest.raises(NotGeneratable, match="neither of its last two axes is contiguous"):
        describe_library_call(make_kernel(graph, (0, 1), ("y",)))
    swapped = Node("transpose", ("x",), ("t",), (("perm", (0, 2, 1)),))  # rows of x are its columns: stride 1
    graph.nodes[0] = swapped
    graph.types["t"] = TensorType((4, 6, 5), "float32")
    graph.types["y"] = TensorType((4, 6, 3), "float32")
    call = describe_library_call(make_kernel(graph, (0, 1), ("y",)))
    assert call.src.strides == (30, 1, 6)


def test_constant_matmul_weights_packed_with_a_padded_row_pitch_compute_the_same() -> None:
    """Weights oneDNN keeps plain get rows 16 floats further apart (c_library.padded_pitch): a 2-D weight read
    transposed with a bias, and a batched 3-D weight whose batch stride follows the padded pitch."""
    from onnx import TensorProto, helper, numpy_helper

    from kernorch.codegen.library.onednn import padded_pitch
    from kernorch.testing import random_array
    from kernorch.tools.check import run_onnxruntime

    assert padded_pitch(48, 144) == 160 and padded_pitch(1, 144) is None and padded_pitch(48, 100) is None
    x, wt, bias = random_array((48, 40)), random_array((144, 40), seed=1), random_array((144,), seed=2)
    xb, wb = random_array((2, 48, 40), seed=3), random_array((2, 40, 144), seed=4)
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["wt"], ["w"], perm=[1, 0]), helper.make_node("MatMul", ["x", "w"], ["m"]),
         helper.make_node("Add", ["m", "bias"], ["y"]), helper.make_node("MatMul", ["xb", "wb"], ["yb"])],
        "mm_pitch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (48, 40)),
         helper.make_tensor_value_info("xb", TensorProto.FLOAT, (2, 48, 40))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (48, 144)),
         helper.make_tensor_value_info("yb", TensorProto.FLOAT, (2, 48, 144))],
        [numpy_helper.from_array(wt, "wt"), numpy_helper.from_array(bias, "bias"), numpy_helper.from_array(wb, "wb")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with withheld(PANEL_MATMUL):  # which takes the 2-d product without AVX-512
        compiled = cpu_compile(model, cost="analytic")
    assert compiled.executor.backends == [ONEDNN, ONEDNN]
    source = compiled.executor.source
    assert "s_padded[] = {160, 1}" in source and "s_padded[] = {6400, 160, 1}" in source
    feeds = {"x": x, "xb": xb}
    expected, actual = run_onnxruntime(model, feeds), compiled.run(feeds)
    for name in ("y", "yb"):
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
def test_depthwise_conv_with_epilogue_matches_onnxruntime(layout: str) -> None:
    """Depthwise convs: generated C (a per-channel window reduction) on NCHW buffers, oneDNN channels-last."""
    from onnx import TensorProto, helper, numpy_helper

    from kernorch.testing import random_array
    from kernorch.tools.check import run_onnxruntime

    x, w, b = random_array((1, 24, 15, 15)), random_array((24, 1, 5, 5), seed=1), random_array((24,), seed=2)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=24, pads=[2, 1, 2, 1], strides=[2, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "depthwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 24, 15, 15))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 24, 8, 15))],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout=layout)
    conv_kernels = [b for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
                    if any(compiled.graph.nodes[i].prim == "conv" for i in k.nodes)]  # fmt: skip
    # channels-last: a library-shaped call (oneDNN's, or kernorch's own depthwise conv where it is faster)
    assert conv_kernels == [GENERATED_C] if layout == "nchw" else [b.stateful for b in conv_kernels] == [True]
    np.testing.assert_allclose(compiled.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"], rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_inputs_and_outputs_are_bound_without_copies_and_never_kept() -> None:
    """A contiguous input is read in place, a strided one is copied; each call returns fresh output arrays the
    kernels wrote directly; afterwards the executor's table points at its own buffers again."""
    graph = Graph(inputs=["x"], outputs=["y"], types={"x": TensorType((64, 48), "float32"),
                                                      "t": TensorType((64, 48), "float32"),
                                                      "y": TensorType((64, 48), "float32")})  # fmt: skip
    graph.nodes = [Node("exp", ("x",), ("t",)), Node("neg", ("t",), ("y",))]
    kernels = [make_kernel(graph, (0,), ("t",)), make_kernel(graph, (1,), ("y",))]
    executor = PlanExecutor(graph, kernels)
    assert set(executor._input_slots) == {"x"} and set(executor._output_slots) == {"y"}
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 48)).astype(np.float32)
    strided = rng.standard_normal((64, 96)).astype(np.float32)[:, ::2]
    first = executor({"x": x})["y"]
    second = executor({"x": strided})["y"]
    assert first is not second and not np.shares_memory(first, second)
    np.testing.assert_allclose(first, -np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(second, -np.exp(strided), rtol=1e-6)
    assert not np.shares_memory(first, executor.buffers["y"])  # written in place, not copied from our buffer
    assert executor.library is not None
    own = {executor.plan.slots[v]: executor.buffers[v].ctypes.data for v in ("x", "y")}
    assert all(executor.library.table[slot] == pointer for slot, pointer in own.items())


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    # generated C: templates and index arithmetic
    here("C div becomes mul",
         '"div": f"({a} / {b})" if is_float',
         '"div": f"({a} * {b})" if is_float',
         file="kernorch/codegen/c/expr.py",
         tests=("kernorch/runtime/executor_test.py::test_random_plans_match_reference",)),
    here("C < becomes <=",
         '"less": f"({a} < {b})"',
         '"less": f"({a} <= {b})"',
         file="kernorch/codegen/c/expr.py",
         tests=("kernorch/runtime/executor_test.py::test_comparisons_at_ties",
                "kernorch/runtime/executor_test.py::test_random_plans_match_reference")),
    here("C max picks the smaller",
         "ko_m_ = ko_a_ > ko_b_ ? ko_a_ : ko_b_",
         "ko_m_ = ko_a_ < ko_b_ ? ko_a_ : ko_b_",
         file="kernorch/codegen/c/prelude.py",
         tests=("kernorch/runtime/executor_test.py::test_random_plans_match_reference",)),
    here("integer division floors",
         "return b == -1 ? (int64_t)(0 - (uint64_t)a) : a / b;",
         "return b == -1 ? (int64_t)(0 - (uint64_t)a) : (a - (((a % b) + b) % b)) / b;",
         file="kernorch/codegen/c/prelude.py",
         tests=("kernorch/runtime/executor_test.py::test_random_plans_match_reference",
                "tests/test_onnx_semantics.py::test_every_case_matches_onnxruntime")),
    here("pow becomes mul",
         """"pow": f"{c_math('pow', dtype)}({a}, {b})\"""",
         """"pow": f"({a} * {b})\"""",
         file="kernorch/codegen/c/expr.py",
         tests=("kernorch/runtime/executor_test.py::test_random_plans_match_reference",)),
    here("pooling border check dropped too often",
         "(kernel[j] - 1) * dilations[j] < in_shape[lead + j]:",
         "(kernel[j] - 1) * dilations[j] <= in_shape[lead + j]:",
         file="kernorch/codegen/loops/description.py"),
    here("running max starts at 0",
         'return "-INFINITY" if low else "INFINITY", update',
         'return "0" if low else "INFINITY", update',
         file="kernorch/codegen/c/loops.py",
         tests=("kernorch/runtime/executor_test.py",
                "tests/test_conformance.py::test_compiled_path_passes_what_the_reference_passes")),
    here("depthwise taps shifted",
         'lit(-attrs["pads"][j])),',
         'lit(1 - attrs["pads"][j])),',
         file="kernorch/codegen/loops/description.py"),
    here("bias bound to the wrong argument",
         'memories.append(("DNNL_ARG_BIAS", call.bias, False))',
         'memories.append(("DNNL_ARG_SRC_1", call.bias, False))',
         file="kernorch/codegen/library/onednn.py",
         tests=("kernorch/runtime/executor_test.py", "kernorch/codegen/library/epilogue_test.py")),
]  # fmt: skip
