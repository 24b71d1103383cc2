"""bf16 values between kernels: the precision stage's casts, and each place the orchestrator may run one — fused
into the producer (generated C stores bfloat16; a library call writes a bfloat16 destination), alone, or inside
the reading call (a reorder) — computing exactly what the reference computes, on edge values too."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.codegen.backends import GENERATED_C, ONEDNN, Backend, choose_backend
from kernorch.codegen.library import converted_operands, describe_library_call
from kernorch.devtools.mutate import here
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.primitives import PRIMITIVES
from kernorch.ir.types import TensorType
from kernorch.precision import bf16_supported, with_conversions
from kernorch.precision.precision_test import BF16_LIBRARIES, bf16_library
from kernorch.runtime import run_reference
from kernorch.runtime.executor import PlanExecutor
from kernorch.testing import random_array

needs_bf16 = pytest.mark.skipif(not bf16_supported(), reason="this CPU has no bfloat16 instructions")

# float32 values whose bfloat16 rounding is a corner: ties both ways, a carry into the exponent, the largest finite
# float32 (inf in bfloat16), subnormals (rounded, not flushed), signed zero, NaN and the infinities
EDGES = np.array([1.00390625, 1.01171875, -1.00390625, 1.9960938, 3.4028235e38, -3.39e38, 1e-40, -3e-39, -0.0,
                  np.nan, np.inf, -np.inf, 65504.0, 2.0**-126], np.float32)  # fmt: skip


def _two_matmuls() -> Graph:
    """x * s → matmul (w1) + bias → matmul (w2): both matmuls bf16, their operands converted."""
    graph = Graph(inputs=["x", "s"], outputs=[])
    graph.types["x"], graph.types["s"] = TensorType((2, 24, 96), "float32"), TensorType((96,), "float32")
    b = PrimitiveBuilder(graph)
    (scaled,) = b.emit("mul", ["x", "s"])
    (m,) = b.emit("matmul", [scaled, b.constant(random_array((96, 128), seed=1) * 0.1)], {"precision": "bf16"})
    (a,) = b.emit("add", [m, b.constant(random_array((128,), seed=2))])
    (y,) = b.emit("matmul", [a, b.constant(random_array((128, 64), seed=3) * 0.1)], {"precision": "bf16"})
    graph.outputs = [y]
    return with_conversions(graph)


def _kernels(graph: Graph, groups: list[list[str]]) -> list[CandidateKernel]:
    """A plan: each group of primitive names (in graph order, each taken once) one kernel writing what later
    kernels and the graph read."""
    remaining = list(range(len(graph.nodes)))
    chosen: list[tuple[int, ...]] = []
    for group in groups:
        nodes: list[int] = []
        for prim in group:
            index = next(i for i in remaining if graph.nodes[i].prim == prim)
            remaining.remove(index)
            nodes.append(index)
        chosen.append(tuple(sorted(nodes)))
    assert not remaining, [graph.nodes[i].prim for i in remaining]
    kernels = []
    for k, members in enumerate(chosen):
        later = {v for other in chosen[k + 1:] for i in other for v in graph.nodes[i].inputs} | set(graph.outputs)
        outputs = tuple(v for i in members for v in graph.nodes[i].outputs if v in later)
        kernels.append(make_kernel(graph, members, outputs))
    return kernels


def _feeds(edges: bool) -> dict[str, np.ndarray]:
    x = random_array((2, 24, 96), seed=4)
    if edges:
        x[0, 0, : len(EDGES)] = EDGES
        x[1, 5, : len(EDGES)] = EDGES[::-1]
    return {"x": x, "s": random_array((96,), seed=5)}


def test_the_stage_converts_each_bf16_operand_once_and_leaves_constants_and_float32_readers_alone() -> None:
    graph = _two_matmuls()
    casts = [n for n in graph.nodes if n.prim == "cast"]
    assert [n.attr("to") for n in casts] == ["bfloat16", "bfloat16"]
    for node in (n for n in graph.nodes if n.prim == "matmul"):
        activation, weights = node.inputs
        assert graph.types[activation].dtype == "bfloat16" and weights in graph.constants  # packed once, float32
        assert graph.types[node.outputs[0]].dtype == "float32"
    add = next(n for n in graph.nodes if n.prim == "add")
    assert graph.types[add.inputs[0]].dtype == "float32"  # the bias add reads the matmul's float32 result
    with pytest.raises(ValueError, match="needs precision bf16"):
        PRIMITIVES["matmul"].infer([TensorType((2, 3), "bfloat16"), TensorType((3, 2), "float32")], {})
    with pytest.raises(ValueError, match="from and to float32 only"):
        PRIMITIVES["cast"].infer([TensorType((2,), "float64")], {"to": "bfloat16"})


@needs_bf16
@BF16_LIBRARIES
@pytest.mark.parametrize("edges", [False, True])
@pytest.mark.parametrize("where", ["fused into producers", "alone", "inside the calls"])
def test_each_place_a_conversion_runs_computes_the_reference(where: str, edges: bool, library: Backend) -> None:
    graph = _two_matmuls()
    groups = {"fused into producers": [["mul", "cast"], ["matmul", "add", "cast"], ["matmul"]],
              "alone": [["mul"], ["cast"], ["matmul", "add"], ["cast"], ["matmul"]],
              "inside the calls": [["mul"], ["cast", "matmul", "add"], ["cast", "matmul"]]}[where]  # fmt: skip
    kernels = _kernels(graph, groups)
    with bf16_library(library):
        backends = [choose_backend(k)[0] for k in kernels]
        executor = PlanExecutor(graph, kernels)
    assert backends == [library if any(p.prim == "matmul" for p in k.primitives) else GENERATED_C for k in kernels]
    calls = [describe_library_call(k) for k, b in zip(kernels, backends, strict=True) if b is library]
    if where == "fused into producers":  # read and written as bfloat16: nothing converted on a run
        assert [(c.src.dtype, c.dst.dtype, converted_operands(c)) for c in calls] == \
            [("bfloat16", "bfloat16", ()), ("bfloat16", "float32", ())]  # fmt: skip
    elif where == "inside the calls":
        assert [(c.src.dtype, converted_operands(c)) for c in calls] == [("float32", (0,)), ("float32", (0,))]
    feeds = _feeds(edges)
    got = executor(feeds)[graph.outputs[0]]
    expected = run_reference(graph, feeds)[graph.outputs[0]]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    assert np.isnan(expected).any() == edges
    finite = np.isfinite(expected)
    error = np.abs(got[finite] - expected[finite]) / np.abs(expected[finite]).max()
    # the same roundings, sums in another order: nearly all equal to float32's last bits; where the first
    # matmul's sum lies within those bits of a bfloat16 tie, its rounding may go the other way (one bfloat16 ulp,
    # 2^-8, of one term of the second matmul: ~1e-5 of the output). Multiplying in float32 would be ~1e-3 off.
    assert np.mean(error < 2e-6) > 0.98 and error.max() < 1e-4, (np.mean(error < 2e-6), error.max())


@pytest.mark.parametrize("split", [False, True])
def test_generated_c_stores_and_moves_bfloat16_bits_exactly_as_the_reference_rounds(split: bool) -> None:
    """x * s converted to bfloat16, then transposed as bfloat16 (a generated copy loads and stores the bits): in
    one kernel or two, every bit as ml_dtypes rounds it — NaN, ties, overflow to inf, subnormals kept."""
    graph = Graph(inputs=["x", "s"], outputs=[])
    graph.types["x"], graph.types["s"] = TensorType((24, 96), "float32"), TensorType((96,), "float32")
    b = PrimitiveBuilder(graph)
    (scaled,) = b.emit("mul", ["x", "s"])
    (converted,) = b.emit("cast", [scaled], {"to": "bfloat16"})
    (moved,) = b.emit("transpose", [converted], {"perm": (1, 0)})
    graph.outputs = [moved]
    kernels = _kernels(graph, [["mul", "cast"], ["transpose"]] if split else [["mul", "cast", "transpose"]])
    assert all(choose_backend(k)[0] is GENERATED_C for k in kernels)
    x = random_array((24, 96), seed=6) * 100
    x[3, : len(EDGES)] = EDGES
    x[7, 10:20] = 1.0 + np.arange(10, dtype=np.float32) * 2.0**-9  # halfway and beyond: ties to even
    x[9, :2] = np.array([0x7FFFFFFF, 0xFFFFFFFF], np.uint32).view(np.float32)  # NaNs whose rounding would carry
    feeds = {"x": x, "s": np.ones(96, np.float32)}
    got = PlanExecutor(graph, kernels)(feeds)[moved]
    expected = run_reference(graph, feeds)[moved]
    assert got.dtype == expected.dtype == np.dtype("bfloat16")
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))
    assert np.isnan(got.astype(np.float32)).sum() == 3 and np.isinf(got.astype(np.float32)).sum() == 3


def _attention_scores(k_also_read: bool) -> Graph:
    """q @ transpose(k), bf16; with `k_also_read`, the transposed k is also summed (a float32 reader)."""
    graph = Graph(inputs=["q", "k"], outputs=[])
    graph.types["q"] = graph.types["k"] = TensorType((1, 4, 24, 32), "float32")
    b = PrimitiveBuilder(graph)
    (kt,) = b.emit("transpose", ["k"], {"perm": (0, 1, 3, 2)})
    (scores,) = b.emit("matmul", ["q", kt], {"precision": "bf16"})
    graph.outputs = [scores]
    if k_also_read:
        (total,) = b.emit("reduce_sum", [kt], {"axes": (3,), "keepdims": True})
        graph.outputs.append(total)
    return with_conversions(graph)


def test_a_view_chain_read_only_by_bf16_matmuls_is_converted_before_its_views() -> None:
    graph = _attention_scores(k_also_read=False)
    assert [n.prim for n in graph.nodes] == ["cast", "cast", "transpose", "matmul"]
    transpose = next(n for n in graph.nodes if n.prim == "transpose")
    assert graph.types[transpose.inputs[0]].dtype == graph.types[transpose.outputs[0]].dtype == "bfloat16"
    # a float32 reader of the view keeps it: the operand is converted after its views
    kept = _attention_scores(k_also_read=True)
    assert [n.prim for n in kept.nodes] == ["transpose", "cast", "cast", "matmul", "reduce_sum"]
    transpose = next(n for n in kept.nodes if n.prim == "transpose")
    assert kept.types[transpose.outputs[0]].dtype == "float32"


@needs_bf16
@pytest.mark.parametrize("plan", ["view read through strides", "generated bfloat16 copy"])
def test_a_bfloat16_view_runs_as_the_reference(plan: str) -> None:
    graph = _attention_scores(k_also_read=False)
    groups = [["cast"], ["cast"], ["transpose", "matmul"]] if plan == "view read through strides" else \
        [["cast"], ["cast"], ["transpose"], ["matmul"]]  # fmt: skip
    kernels = _kernels(graph, groups)
    call = describe_library_call(kernels[-1])
    assert call.weights.dtype == "bfloat16" and not converted_operands(call)
    if plan == "view read through strides":  # k's buffer, its last two axes swapped
        assert call.weights.strides[-2:] == (1, 32)
    else:
        assert choose_backend(kernels[2])[0] is GENERATED_C
    feeds = {"q": random_array((1, 4, 24, 32), seed=7), "k": random_array((1, 4, 24, 32), seed=8)}
    feeds["k"][0, 1, 2, :4] = [np.nan, np.inf, -np.inf, 3.4e38]
    got = PlanExecutor(graph, kernels)(feeds)[graph.outputs[0]]
    expected = run_reference(graph, feeds)[graph.outputs[0]]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = np.isfinite(expected)
    assert np.isnan(expected).any() and finite.sum() > 0.9 * expected.size
    assert np.abs(got[finite] - expected[finite]).max() < 2e-6 * np.abs(expected[finite]).max()


def test_bfloat16_is_internal_a_model_holding_one_is_still_refused() -> None:
    import onnx
    from onnx import TensorProto, helper

    from kernorch.errors import KernorchError
    from kernorch.pipeline import import_graph

    def model(nodes: list[onnx.NodeProto], x: int, y: int) -> onnx.ModelProto:
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", x, [4])],
                                  [helper.make_tensor_value_info("y", y, [4])])  # fmt: skip
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    cast = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.BFLOAT16)
    with pytest.raises(KernorchError, match="dtype bfloat16 is not supported"):
        import_graph(model([cast], TensorProto.FLOAT, TensorProto.BFLOAT16))
    with pytest.raises(KernorchError, match="dtype bfloat16 is not supported"):
        import_graph(model([helper.make_node("Relu", ["x"], ["y"])], TensorProto.BFLOAT16, TensorProto.BFLOAT16))


def _depthwise_then_cast(channels_last: bool) -> Graph:
    graph = Graph(inputs=["x"], outputs=[])
    graph.types["x"] = TensorType((1, 14, 14, 16) if channels_last else (1, 16, 14, 14), "float32")
    b = PrimitiveBuilder(graph)
    w = b.constant(random_array((16, 1, 3, 3), seed=9))
    attrs = {"group": 16, "strides": (1, 1), "dilations": (1, 1), "pads": (1, 1, 1, 1), "channels_last": channels_last}
    (y,) = b.emit("conv", ["x", w], attrs)
    (converted,) = b.emit("cast", [y], {"to": "bfloat16"})
    graph.outputs = [converted]
    return graph


@needs_bf16
def test_kernorchs_own_convolutions_never_write_a_bfloat16_destination() -> None:
    """A float32 depthwise conv whose output a bf16 conv reads (shufflenet, efficientvit): kernorch's depthwise
    kernel writes float32, so it declines the kernel ending in the cast (it once wrote 4-byte floats into the
    2-byte buffer), and so does oneDNN (no float32 conv writes bfloat16): the kernel costs infinity and the
    cast runs elsewhere. Generated C's NCHW depthwise conv does run it, storing what the reference stores."""
    from kernorch.codegen.native import depthwise_conv, direct_conv, winograd_conv

    graph = _depthwise_then_cast(channels_last=True)
    alone, with_cast = _kernels(graph, [["conv"], ["cast"]])[0], _kernels(graph, [["conv", "cast"]])[0]
    assert depthwise_conv.BACKEND.applies(alone).runs
    for native in (depthwise_conv.BACKEND, direct_conv.BACKEND, winograd_conv.BACKEND, ONEDNN):
        verdict = native.applies(with_cast)
        assert not verdict.runs and "writes float32" in verdict.reason, (native.name, verdict)
    assert choose_backend(with_cast)[0] is None
    graph = _depthwise_then_cast(channels_last=False)
    (kernel,) = _kernels(graph, [["conv", "cast"]])
    assert choose_backend(kernel)[0] is GENERATED_C
    feeds = {"x": random_array((1, 16, 14, 14), seed=10)}
    got = PlanExecutor(graph, [kernel])(feeds)[graph.outputs[0]].astype(np.float32)
    expected = run_reference(graph, feeds)[graph.outputs[0]].astype(np.float32)
    # sums in another order may round to the neighbouring bfloat16 (2^-8 apart)
    assert np.mean(got == expected) > 0.98 and np.abs(got - expected).max() <= 2.0**-7 * np.abs(expected).max()


def test_a_call_converts_only_an_operand_it_reads_from_a_buffer() -> None:
    """[mul, cast, matmul]: the cast's input is computed inside the kernel, so no library call runs it (the
    enumerator never proposes it; asked anyway, the answer is a reason, not a crash)."""
    from kernorch.codegen.loops import NotGeneratable

    graph = _two_matmuls()
    kernel = make_kernel(graph, (0, 1, 2), (graph.nodes[2].outputs[0],))
    assert [n.prim for n in kernel.primitives] == ["mul", "cast", "matmul"]
    with pytest.raises(NotGeneratable, match="computed inside the kernel"):
        describe_library_call(kernel)


def test_a_view_of_constant_weights_is_not_converted_on_every_run() -> None:
    """matmul(x, transpose(w)) with w constant and the transpose not folded: the call packs the weights once (in
    bfloat16); a cast before the views would convert them on every run instead."""
    graph = Graph(inputs=["x"], outputs=[])
    graph.types["x"] = TensorType((8, 32), "float32")
    graph.types["w"] = TensorType((16, 32), "float32")
    graph.constants["w"] = random_array((16, 32), seed=11)
    b = PrimitiveBuilder(graph)
    (wt,) = b.emit("transpose", ["w"], {"perm": (1, 0)})
    if wt in graph.constants:  # the builder folded it: unfold, as a graph built elsewhere may hold it
        del graph.constants[wt]
        graph.nodes.append(Node("transpose", ("w",), (wt,), (("perm", (1, 0)),)))
    (y,) = b.emit("matmul", ["x", wt], {"precision": "bf16"})
    graph.outputs = [y]
    converted = with_conversions(graph)
    assert [n.prim for n in converted.nodes] == ["transpose", "cast", "cast", "matmul"]
    assert {n.inputs[0] for n in converted.nodes if n.prim == "cast"} == {"x", wt}  # not w: after its view
    # the call that absorbs the view and its cast reads w itself, packed once
    (kernel,) = _kernels(converted, [["transpose", "cast", "cast", "matmul"]])
    call = describe_library_call(kernel)
    assert call.weights.constant and converted_operands(call) == (0,)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    # bf16 values between kernels: generated C's bfloat16 stores and loads, the calls' bfloat16 operands and
    # destinations, the stage's casts
    here("generated C truncates to bfloat16",
         "const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;",
         "const uint32_t rounded = u >> 16;",
         file="kernorch/codegen/c/prelude.py"),
    here("generated C's bfloat16 NaN may carry into inf",
         "return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? ((u >> 16) & 0x8000u) | 0x7FC0u : rounded);",
         "return (uint16_t)rounded;",
         file="kernorch/codegen/c/prelude.py"),
    here("a bfloat16 load reads the low half",
         "const uint32_t u = (uint32_t)bits << 16;",
         "const uint32_t u = (uint32_t)bits;",
         file="kernorch/codegen/c/prelude.py"),
    here("a call reads a bfloat16 operand as float32",
         'if tensor.dtype != "float32":  # bfloat16 stored so by its producer, read as it is; an int8 call',
         "if False:",
         file="kernorch/codegen/library/onednn.py"),
    here("a call's bfloat16 destination is written as float32",
         'slots[epilogue.output], dst_dtype = slots[graph.nodes[stored].outputs[0]], "bfloat16"',
         'slots[epilogue.output], dst_dtype = slots[graph.nodes[stored].outputs[0]], "float32"',
         file="kernorch/codegen/library/call.py"),
    here("a view chain with a float32 reader is converted before its views",
         "out not in outputs and readers.get(out, set()) <= members for i in chain",
         "True for i in chain",
         file="kernorch/precision/stage.py"),
]  # fmt: skip
