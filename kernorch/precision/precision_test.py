"""bf16 mode: the rounding the reference specifies, the stage's choices, and compiled bf16 library calls held to
their reference as tightly as float32 ones (so a call that silently multiplied in float32 fails), on edge values
too."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.backends import ONEDNN, Backend, choose_backend, withheld
from kernorch.codegen.library import absorbed_summary
from kernorch.codegen.native.amx_matmul import BACKEND as AMX_MATMUL
from kernorch.codegen.native.amx_product import amx_supported
from kernorch.cost.interface import CostModelBase
from kernorch.cost.profile import signature
from kernorch.devtools.mutate import here
from kernorch.errors import KernorchError
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.patterns import attention_spans
from kernorch.ir.primitives import PRIMITIVES
from kernorch.ir.reference_kernels import round_to_bf16
from kernorch.ir.types import TensorType
from kernorch.options import Options
from kernorch.pipeline import compile_plan, import_graph, plan_graph
from kernorch.precision import bf16_supported, choose_precision, with_precision
from kernorch.runtime import run_reference
from kernorch.testing import random_array
from kernorch.tools.check import BF16_RTOL, compare
from kernorch.tools.demo_models import self_attention_block

needs_bf16 = pytest.mark.skipif(not bf16_supported(), reason="this CPU has no bfloat16 instructions")
# the libraries running a bf16 plan's calls: oneDNN's, and kernorch's AMX matmul (asked first where the CPU has it)
BF16_LIBRARIES = pytest.mark.parametrize("library", [ONEDNN, AMX_MATMUL], ids=lambda backend: backend.name)


@contextmanager
def bf16_library(library: Backend) -> Iterator[None]:
    """Plans made inside the block run their bf16 calls by `library`: oneDNN with the AMX matmul withheld, the AMX
    matmul where the CPU has AMX-BF16 (skipped elsewhere)."""
    if library is ONEDNN:
        with withheld(AMX_MATMUL):
            yield
    elif not amx_supported():
        pytest.skip("no AMX-BF16 on this CPU")
    else:
        yield



def test_rounding_to_bf16_is_to_nearest_even_like_torch_on_edge_values() -> None:
    torch = pytest.importorskip("torch")
    specials = [0.0, -0.0, 1.0, 1.00390625, 1.005859375, 1.0029296875, -1.0029296875, 3.4028235e38, -3.4028235e38,
                3.3895314e38, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 65504.0, 2.0**-126]  # fmt: skip
    x = np.concatenate([np.array(specials, np.float32), random_array((1000,), seed=4) * 1e3])
    expected = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    got = round_to_bf16(x)
    np.testing.assert_array_equal(got, expected)  # equal NaNs count as equal
    assert np.signbit(got[1]) and got.dtype == np.float32
    assert got[4] == 1.0078125 and got[5] == 1.0 and got[6] == -1.0  # ties to even, both ways; below a tie down


def test_a_bf16_matmuls_reference_multiplies_rounded_operands_and_sums_in_float32() -> None:
    a, b = random_array((8, 40), seed=1), random_array((40, 5), seed=2)
    (got,) = PRIMITIVES["matmul"].reference([a, b], {"precision": "bf16"})
    np.testing.assert_allclose(got, round_to_bf16(a).astype(np.float64) @ round_to_bf16(b), rtol=1e-6, atol=1e-6)
    assert np.abs(got - a @ b).max() > 1e-4  # it is not the float32 product
    (plain,) = PRIMITIVES["matmul"].reference([a, b], {})
    np.testing.assert_allclose(plain, a @ b, rtol=1e-5, atol=1e-5)
    ints = [TensorType((2, 3), "int32"), TensorType((3, 2), "int32")]
    with pytest.raises(ValueError, match="bf16 needs float32"):
        PRIMITIVES["matmul"].infer(ints, {"precision": "bf16"})
    with pytest.raises(ValueError, match="precision"):
        PRIMITIVES["matmul"].infer(ints, {"precision": "fp8"})


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, ...]], outputs: list[str],
           constants: dict[str, np.ndarray]) -> onnx.ModelProto:  # fmt: skip
    graph = helper.make_graph(nodes, "bf16", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                              for n, s in inputs.items()],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                              [numpy_helper.from_array(a, n) for n, a in constants.items()])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def _models() -> dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]]:
    """Each linear primitive the way the shared models use it, with what its library call absorbs."""
    w = random_array((96, 128), seed=1) * 0.1
    b = random_array((128,), seed=2)
    conv_w = random_array((32, 16, 3, 3), seed=3) * 0.2
    dw = random_array((16, 1, 3, 3), seed=4)
    deconv_w = random_array((16, 8, 2, 2), seed=5)
    x = random_array((2, 24, 96), seed=6)
    img = random_array((1, 16, 12, 12), seed=7)
    q, k = random_array((2, 4, 24, 32), seed=8), random_array((2, 4, 24, 32), seed=9)
    return {
        "matmul+bias+relu": (_model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                                     helper.make_node("Add", ["m", "b"], ["a"]),
                                     helper.make_node("Relu", ["a"], ["y"])], {"x": x.shape}, ["y"], {"w": w, "b": b}),
                             {"x": x}),
        "matmul+bias": (_model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                                helper.make_node("Add", ["m", "b"], ["y"])], {"x": x.shape}, ["y"], {"w": w, "b": b}),
                        {"x": x}),
        "attention scores (two activations, one transposed)": (
            _model([helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
                    helper.make_node("MatMul", ["q", "kt"], ["y"])], {"q": q.shape, "k": k.shape}, ["y"], {}),
            {"q": q, "k": k}),
        "conv+relu": (_model([helper.make_node("Conv", ["img", "cw"], ["c"], pads=[1, 1, 1, 1]),
                              helper.make_node("Relu", ["c"], ["y"])], {"img": img.shape}, ["y"], {"cw": conv_w}),
                      {"img": img}),
        "depthwise conv": (_model([helper.make_node("Conv", ["img", "dw"], ["y"], pads=[1, 1, 1, 1], group=16)],
                                  {"img": img.shape}, ["y"], {"dw": dw}), {"img": img}),
        "conv_transpose": (_model([helper.make_node("ConvTranspose", ["img", "tw"], ["y"], strides=[2, 2])],
                                  {"img": img.shape}, ["y"], {"tw": deconv_w}), {"img": img}),
    }  # fmt: skip


def _compile_all_bf16(model: onnx.ModelProto, layout: str) -> tuple[Any, Graph]:
    """Every linear primitive bf16 (no cost model), planned and compiled; the compiled model and its graph."""
    options = Options(cost="analytic", device="cpu-nominal", precision="bf16", layout=layout, rewrite=False)
    graph, report = choose_precision(import_graph(model), None, "bf16")
    assert report.bf16 == report.linear >= 1
    result = plan_graph(graph, options)
    marked = [n for n in result.plan.graph.nodes if n.prim in ("matmul", "conv", "conv_transpose")]
    assert marked and all(n.attr("precision") == "bf16" for n in marked), marked
    return compile_plan(result, options), result.plan.graph


# what the AMX matmul declines (a product of two activations, grouped convs, a transposed conv): oneDNN's alone
NOT_AMX = {"attention scores (two activations, one transposed)", "depthwise conv", "conv_transpose"}


@needs_bf16
@BF16_LIBRARIES
@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
@pytest.mark.parametrize("case", list(_models()))
def test_compiled_bf16_calls_match_their_bf16_reference_tightly(case: str, layout: str, library: Backend) -> None:
    if library is AMX_MATMUL and case in NOT_AMX:
        pytest.skip("oneDNN runs it (the onednn case)")
    model, feeds = _models()[case]
    with bf16_library(library):
        compiled, graph = _compile_all_bf16(model, layout)
    # kernorch's other convs are float32; the AMX matmul takes a convolution on a channels-last source only
    expected = ONEDNN if case.startswith("conv") and layout == "nchw" else library
    assert expected in compiled.executor.backends, compiled.executor.backends
    got = compiled.run(feeds)
    for error in compare(got, run_reference(graph, feeds)):  # the same roundings: only the order of sums differs
        assert error.relative < 2e-6, (case, error)
    float32 = run_reference(import_graph(model), feeds)
    for error in compare(got, float32):  # and it did round: far from float32, within the mode's tolerance
        assert 1e-4 < error.relative < BF16_RTOL, (case, error)


@needs_bf16
def test_nan_and_infinities_pass_through_a_bf16_call_where_the_reference_has_them() -> None:
    # (a relu post-op is left out: oneDNN's relu maps NaN to 0 in float32 too, where onnxruntime keeps it)
    model, feeds = _models()["matmul+bias"]
    x = feeds["x"].copy()
    x[0, 0, 0], x[0, 1, 5], x[1, 2, 7] = np.nan, np.inf, -np.inf
    x[1, 3, :] = 3.4e38  # finite in float32, infinite in bfloat16: the row's sums are inf - inf, NaN, in both
    compiled, graph = _compile_all_bf16(model, "nchw")
    got, expected = compiled.run({"x": x})["y"], run_reference(graph, {"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(expected))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected))
    assert np.isnan(got).any() and np.isinf(got).any()
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-5, atol=1e-4)


class _Priced(CostModelBase):
    """A cost model pricing a kernel by what its linear primitives multiply in."""

    name = "priced"

    def __init__(self, bf16_factor: float) -> None:
        self.bf16_factor = bf16_factor

    def cost(self, candidate: CandidateKernel) -> float:
        bf16 = any(n.attr("precision") == "bf16" for n in candidate.primitives)
        return 1e-3 * (self.bf16_factor if bf16 else 1.0)


def _attention_block() -> Graph:
    x = random_array((1, 16, 32), seed=1)
    w = random_array((32, 32), seed=2)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["s"], axis=-1),
             helper.make_node("ReduceMean", ["s"], ["y"], axes=[-1])]  # fmt: skip
    model = _model(nodes, {"x": x.shape}, ["y"], {"w": w})
    return import_graph(model)


def test_the_stage_gives_bf16_to_linear_primitives_only_and_only_where_cheaper() -> None:
    graph = _attention_block()
    chosen, report = choose_precision(graph, _Priced(0.5), "bf16")
    precisions = {n.prim: n.attr("precision") for n in chosen.nodes}
    assert precisions["matmul"] == "bf16"
    assert all(p is None for prim, p in precisions.items() if prim != "matmul"), precisions  # softmax, mean: f32
    assert (report.linear, report.bf16) == (1, 1) and report.cost_chosen == pytest.approx(report.cost_fp32 / 2)
    assert "1 of 1 linear primitives" in report.summary()
    slower, report = choose_precision(graph, _Priced(1.5), "bf16")
    assert report.bf16 == 0 and all(n.attr("precision") is None for n in slower.nodes)
    same, report = choose_precision(graph, _Priced(0.5), "fp32")
    assert same is graph and report.bf16 == 0
    every, report = choose_precision(graph, None, "bf16")  # check's reference run: all of them, no prices
    assert report.bf16 == 1 and "no cost model" in report.summary() and "nan" not in report.summary()
    assert all(n.attr("precision") is None for n in graph.nodes)  # the input graph is not edited


class _ConvertingPriced(_Priced):
    """bf16 at half the float32 price, plus a full price for each float32 operand a bf16 call converts itself
    (the reorder of a large activation): what made resnet50's first convolutions stay float32."""

    def cost(self, candidate: CandidateKernel) -> float:
        graph = candidate.graph
        converted = sum(graph.types[v].dtype == "float32" and v not in graph.constants for v in candidate.inputs)
        bf16 = any(n.attr("precision") == "bf16" for n in candidate.primitives)
        return super().cost(candidate) + (1e-3 * converted if bf16 else 0.0)


def test_an_operand_a_generated_kernel_computes_is_priced_as_stored_bfloat16() -> None:
    """conv(relu(x)) then conv(x'), x' the other conv's output: the first conv's operand comes from a memory-bound
    kernel, which stores it as bfloat16 for the call, so bf16 is priced without its conversion and chosen; the
    second reads a linear primitive's output, which stays float32 when priced (converted by the call): dearer."""
    w1, w2 = random_array((8, 8, 3, 3), seed=1) * 0.2, random_array((8, 8, 1, 1), seed=2) * 0.2
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Conv", ["r", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c", "w2"], ["y"])]  # fmt: skip
    graph = import_graph(_model(nodes, {"x": (1, 8, 10, 10)}, ["y"], {"w1": w1, "w2": w2}))
    chosen, report = choose_precision(graph, _ConvertingPriced(0.5), "bf16")
    precisions = [n.attr("precision") for n in chosen.nodes if n.prim == "conv"]
    assert precisions == ["bf16", None], precisions
    assert report.bf16 == 1 and report.cost_chosen == pytest.approx(report.cost_fp32 * 0.75)


@pytest.mark.parametrize("amx", [True, False])
def test_an_attentions_two_products_are_bf16_together_where_amx_multiplies_them(
        amx: bool, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Priced alone, bf16 is dearer for every matmul here; on an AMX CPU the attention's Q·Kᵀ and P·V are bf16
    anyway (the fused kernel's tile path needs both), the projections stay float32; without AMX all are priced."""
    import kernorch.precision.stage as stage

    monkeypatch.setattr(stage, "isa_flags", lambda: ("avx512_bf16", "amx_bf16") if amx else ("avx512_bf16",))
    graph = import_graph(self_attention_block())
    spans = attention_spans(graph)
    assert spans
    chosen, report = choose_precision(graph, _Priced(1.5), "bf16")
    products = {graph.nodes[i].outputs[0] for span in spans for i in span}
    bf16 = {n.outputs[0] for n in chosen.nodes if n.attr("precision") == "bf16"}
    assert bf16 == (products if amx else set())
    assert report.bf16 == len(bf16) and report.linear > len(products)


@pytest.mark.parametrize("last", [False, True])
def test_kernorchs_own_float32_convolutions_decline_a_bf16_one(last: bool) -> None:
    model, _ = _models()["depthwise conv"]
    graph = import_graph(model)
    index = next(i for i, n in enumerate(graph.nodes) if n.prim == "conv")
    node = graph.nodes[index]
    if last:  # kernorch's depthwise kernel takes the channels-last one, generated C the NCHW one, in float32
        node = Node(node.prim, node.inputs, node.outputs, tuple(sorted({**node.attr_dict, "channels_last": True}
                                                                        .items())), node.origin)  # fmt: skip
        for value in (node.inputs[0], node.outputs[0]):
            shape = graph.types[value].shape
            graph.types[value] = TensorType((shape[0], *shape[2:], shape[1]), "float32")
    graph.nodes[index] = node
    float32 = make_kernel(graph, (index,), tuple(node.outputs))
    assert choose_backend(float32)[0] is not ONEDNN
    marked = graph.copy()
    marked.nodes[index] = with_precision(node, "bf16")
    kernel = make_kernel(marked, (index,), tuple(node.outputs))
    assert choose_backend(kernel)[0] is ONEDNN
    assert "[bf16]" in (absorbed_summary(kernel) or "")


def test_bf16_mode_is_refused_in_one_line_on_a_cpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before tuning, and wherever a bf16 plan would be compiled or loaded (a plan priced by a fixed roofline, a
    saved one): never oneDNN's emulation, nor its failure to create the primitive."""
    import kernorch.machine as machine

    graph = _attention_block()
    marked, _ = choose_precision(graph, None, "bf16")
    options = Options(precision="bf16", cost="analytic", device="cpu-nominal")
    result = plan_graph(marked, options)
    monkeypatch.setattr(machine, "isa_flags", lambda: ("avx2", "fma"))
    with pytest.raises(KernorchError, match="AVX512-BF16 or AMX"):
        plan_graph(graph, options.with_(device="cpu"))
    with pytest.raises(KernorchError, match="AVX512-BF16 or AMX"):
        compile_plan(result, options)
    plan_graph(graph, Options(cost="analytic"))  # float32 is never refused


def test_the_precision_option_is_checked() -> None:
    with pytest.raises(KernorchError, match="unknown precision"):
        Options(precision="fp16")
    with pytest.raises(KernorchError, match="CPU option"):
        Options(precision="bf16", device="a100", cost="analytic")
    assert Options().precision == "fp32"


def test_a_bf16_kernel_is_profiled_apart_from_its_float32_twin() -> None:
    model, _ = _models()["conv+relu"]
    graph = import_graph(model)
    index = next(i for i, n in enumerate(graph.nodes) if n.prim == "conv")
    marked = graph.copy()
    marked.nodes[index] = with_precision(graph.nodes[index], "bf16")
    outputs = tuple(graph.nodes[index].outputs)
    assert signature(make_kernel(graph, (index,), outputs))[1] != signature(make_kernel(marked, (index,), outputs))[1]


@needs_bf16
def test_the_cli_plans_explains_and_checks_in_bf16(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kernorch.cli import main
    from kernorch.tools.demo_models import self_attention_block

    path = tmp_path / "attention.onnx"
    path.write_bytes(self_attention_block(seq=64, hidden=256, heads=4).SerializeToString())
    common = ["--cost", "analytic", "--device", "cpu-nominal", "--precision", "bf16"]
    assert main(["explain", str(path), *common]) == 0
    text = capsys.readouterr().out
    assert "precision: bf16 (operands rounded" in text and "precision: fp32" in text  # a line per kernel
    assert "[bf16]" in text and "precision bf16:" in text and "lstm_recurrence: fp32" in text  # the policy
    assert main(["check", str(path), "--precision", "bf16"]) == 0  # reference, every linear primitive bf16
    text = capsys.readouterr().out
    assert "(bf16)" in text and "tolerance 2e-02" in text and "PASS" in text
    assert main(["check", str(path), "--compiled", *common]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["check", str(path), "--precision", "bf16", "--rtol", "1e-6"]) == 1  # bf16 is not float32
    with pytest.raises(SystemExit) as exit_:  # argparse's one line
        main(["optimize", str(path), "--precision", "fp16"])
    assert exit_.value.code == 2 and "invalid choice: 'fp16'" in capsys.readouterr().err


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    # bf16 mode: the reference's rounding, the library call's conversion, the stage's choice
    here("bf16 rounding truncates instead of rounding to nearest even",
         "rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)",
         "rounded = bits & np.uint32(0xFFFF0000)",
         file="kernorch/ir/reference_kernels.py"),
    here("a bf16 library call multiplies in float32",
         'if tensor.dtype == "float32" and not (i == 1 and tensor.constant))',
         "if False)",
         file="kernorch/codegen/library/onednn.py"),
    here("a bf16 call's weights stay float32 when packed",
         'element = {"bf16": "dnnl_bf16", "int8": "dnnl_s8"}.get(call.precision, "dnnl_f32")',
         'element = {"int8": "dnnl_s8"}.get(call.precision, "dnnl_f32")',
         file="kernorch/codegen/library/onednn.py", needs="avx512_bf16"),  # bf16 calls are refused without it
    here("the precision stage gives bf16 where it is slower",
         "if bf16_cost < fp32_cost:",
         "if bf16_cost != fp32_cost:",
         file="kernorch/precision/stage.py"),
    here("the precision stage prices every bf16 operand as converted by the call",
         "if producer is not None and PRIMITIVES[graph.nodes[producer].prim].kind in MEMORY_BOUND_KINDS:",
         "if False:",
         file="kernorch/precision/stage.py"),
    here("the precision stage prices a linear primitive's output as stored bfloat16",
         "MEMORY_BOUND_KINDS = (Kind.ELEMENTWISE, Kind.REDUCE, Kind.LAYOUT)",
         "MEMORY_BOUND_KINDS = (Kind.ELEMENTWISE, Kind.REDUCE, Kind.LAYOUT, Kind.LINEAR)",
         file="kernorch/precision/stage.py"),
    here("kernorch's float32 depthwise kernel takes a bf16 conv",
         "if call.precision not in self.precisions:",
         "if False:",
         file="kernorch/codegen/backends/library_calls.py"),
    here("the precision stage prices an attention's products alone on AMX too",
         'if "amx_bf16" not in isa_flags():',
         "if True:",
         file="kernorch/precision/stage.py"),
]  # fmt: skip
