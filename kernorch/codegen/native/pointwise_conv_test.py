"""The 1x1 convolution with its transcendental epilogue in cache (native/pointwise_conv.py): chosen exactly where it
applies, and equal to onnxruntime across channel counts that leave a short chunk, pixel counts that leave a short
run and a short register block, batch, no bias, binary post-ops after the swish (a per-channel scale, a residual
read per pixel), and edge values."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch import machine
from kernorch.codegen.backends import GENERATED_C, ONEDNN
from kernorch.codegen.backends.base import Verdict, declines
from kernorch.codegen.library.call import LibraryCall, describe_library_call, is_bf16_cast
from kernorch.codegen.native.pointwise_conv import BACKEND, pointwise_rejection
from kernorch.devtools.mutate import here
from kernorch.ir.kernel import CandidateKernel
from kernorch.machine import bf16_supported
from kernorch.options import Options
from kernorch.pipeline import compile_plan, import_graph, plan_graph
from kernorch.precision import choose_precision
from kernorch.runtime import run_reference
from kernorch.testing import cpu_compile, random_array
from kernorch.testing.native import assert_close, assert_close_with_edges, assert_compiles_for, pretend_isa
from kernorch.tools.check import BF16_RTOL, compare, run_onnxruntime

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`


@pytest.fixture(autouse=True)
def with_avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without AVX-512 the panel kernel (native/panel_conv.py) takes these convolutions first; this kernel's C is
    the same source for every ISA (#ifdef __AVX512F__), so the tests run it wherever they run."""
    pretend_isa(monkeypatch, avx512=True)

EPILOGUES = {  # ONNX nodes after the tested conv's output "c", ending in "e"
    "none": [helper.make_node("Identity", ["c"], ["e"])],
    "swish": [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["e"])],
    "swish, scaled per channel": [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["m"]),
                                  helper.make_node("Mul", ["m", "scale"], ["e"])],
    "swish, then a residual": [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["m"]),
                               helper.make_node("Add", ["m", "r"], ["e"])],
    "tanh": [helper.make_node("Tanh", ["c"], ["e"])],
    "relu": [helper.make_node("Relu", ["c"], ["e"])],
    # the residual is the first conv's output before its relu: the tested conv's own input would fold into its weights
    "a residual, then relu": [helper.make_node("Add", ["c", "x0"], ["m"]), helper.make_node("Relu", ["m"], ["e"])],
    "relu, scaled per channel": [helper.make_node("Relu", ["c"], ["m"]),
                                 helper.make_node("Mul", ["m", "scale"], ["e"])],
    # one value per pixel for every channel (a spatial attention map's shape)
    "relu, times a map of the pixels": [helper.make_node("Relu", ["c"], ["m"]),
                                        helper.make_node("Mul", ["m", "map"], ["e"])],
    "relu6, then a residual": [helper.make_node("Clip", ["c", "zero", "six"], ["m"]),
                               helper.make_node("Add", ["m", "x0"], ["e"])],
}


def pointwise_model(in_channels: int, out_channels: int, size: tuple[int, int], batch: int = 1, bias: bool = True,
                    epilogue: str = "swish", kernel: int = 1,
                    strides: tuple[int, int] = (1, 1)) -> onnx.ModelProto:  # fmt: skip
    """x → 1x1 Conv → Relu → the tested Conv → epilogue → 1x1 Conv to 4 channels: the convs around it keep the
    channels-last layout on both sides, so the epilogue joins the tested conv, not a layout change."""
    pads = [kernel // 2] * 4
    w = random_array((out_channels, in_channels, kernel, kernel), seed=1) * 0.3
    initializers = [numpy_helper.from_array(w, "w"),
                    numpy_helper.from_array(random_array((in_channels, in_channels, 1, 1), seed=4) * 0.3, "w0"),
                    numpy_helper.from_array(random_array((4, out_channels, 1, 1), seed=5) * 0.3, "w1"),
                    numpy_helper.from_array(random_array((out_channels,), seed=2), "b"),
                    numpy_helper.from_array(random_array((out_channels, 1, 1), seed=6), "scale"),
                    numpy_helper.from_array(random_array((1, 1, *size), seed=7), "map"),
                    numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                    numpy_helper.from_array(np.array(6.0, np.float32), "six")]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w0"], ["x0"]), helper.make_node("Relu", ["x0"], ["r"]),
             helper.make_node("Conv", ["r", "w", "b"] if bias else ["r", "w"], ["c"], pads=pads, strides=list(strides)),
             *EPILOGUES[epilogue], helper.make_node("Conv", ["e", "w1"], ["y_nchw"]),
             helper.make_node("Transpose", ["y_nchw"], ["y"], perm=[0, 2, 3, 1])]  # fmt: skip
    graph = helper.make_graph(nodes, "pointwise",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, in_channels, *size))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def compiled_calls(model: onnx.ModelProto, x: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray,
                                                                                  list[LibraryCall]]:  # fmt: skip
    """(kernorch's output, onnxruntime's, the library calls between the first and the last conv)."""
    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    feeds = {"x": random_array(shape, seed=3) if x is None else x}
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout="channels-last", rewrite=True)
    calls = [describe_library_call(k) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
             if b.stateful]  # fmt: skip
    assert len(calls) == 3, calls
    backends = [b.name for b in compiled.executor.backends if b.stateful]
    assert (backends[1] == "pointwise_conv") == (pointwise_rejection(calls[1]) is None), backends
    return compiled.run(feeds)["y"], run_onnxruntime(model, feeds)["y"], calls[1:-1]


CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {  # arguments, the post-ops the call must apply
    "efficientnet's 16 -> 96 expansion with swish": (dict(in_channels=16, out_channels=96, size=(9, 13)), ("swish",)),
    "240 outputs (chunks of 96, 96 and 48), 40 inputs, batch 2, runs of 64 and a short one": (
        dict(in_channels=40, out_channels=240, size=(11, 7), batch=2), ("swish",)),
    "no bias, tanh, 16 outputs (one vector), one pixel": (
        dict(in_channels=8, out_channels=16, size=(1, 1), bias=False, epilogue="tanh"), ("tanh",)),
    "swish, then a per-channel scale (a binary post-op)": (
        dict(in_channels=24, out_channels=144, size=(5, 6), epilogue="swish, scaled per channel"), ("swish", "mul")),
    "swish, then a residual of the map's own shape, batch 2": (
        dict(in_channels=32, out_channels=32, size=(7, 9), batch=2, epilogue="swish, then a residual"),
        ("swish", "add")),
    "relu (oneDNN's keeps NaN only through elu: an exp a value)": (
        dict(in_channels=16, out_channels=48, size=(8, 8), epilogue="relu"), ("relu",)),
}  # fmt: skip


def _post_op_names(call: LibraryCall) -> tuple[str, ...]:
    return tuple(op.alg for op, _ in call.post_ops)


@pytest.mark.parametrize("case", list(CASES))
def test_pointwise_conv_matches_onnxruntime(case: str) -> None:
    arguments, post_ops = CASES[case]
    actual, expected, calls = compiled_calls(pointwise_model(**arguments))
    assert [pointwise_rejection(call) for call in calls] == [None]
    assert _post_op_names(calls[0]) == post_ops
    assert_close(actual, expected)


@pytest.mark.parametrize("epilogue", ["swish", "relu"])
def test_edge_values_pass_through_as_onnxruntime_computes_them(epilogue: str) -> None:
    """Inputs of ±1e30 (swish's sigmoid saturates to 0 and 1 on either side; the products reach ±inf, relu keeps
    +inf and makes -inf 0) and NaN (kept by both)."""
    model = pointwise_model(in_channels=16, out_channels=32, size=(3, 5), epilogue=epilogue)
    x = random_array((1, 16, 3, 5), seed=9)
    x[0, :, 0, 0], x[0, :, 1, 2], x[0, 3, 2, 4] = 1e30, -1e30, np.nan
    actual, expected, calls = compiled_calls(model, x)
    assert [pointwise_rejection(call) for call in calls] == [None]
    assert_close_with_edges(actual, expected)


@pytest.mark.parametrize(("changes", "reason"), [
    (dict(epilogue="none"), "no post-op oneDNN runs slowly: it runs the call at full speed"),
    (dict(in_channels=72), "72 input channels: a chunk's weights would leave L1"),
    (dict(out_channels=40), "40 output channels are no multiple of 16"),
    (dict(kernel=3), "not a 1x1 stride-1 convolution without padding"),
])  # fmt: skip
def test_convs_it_does_not_take_stay_with_onednn(changes: dict[str, Any], reason: str) -> None:
    arguments: dict[str, Any] = dict(in_channels=16, out_channels=32, size=(4, 5)) | changes
    actual, expected, calls = compiled_calls(pointwise_model(**arguments))
    assert [pointwise_rejection(call) for call in calls] == [reason]
    assert_close(actual, expected)


@pytest.mark.parametrize("isa", [("-mavx2", "-mfma"), ("-mavx512f",)])
def test_the_same_source_compiles_for_avx2_and_avx512(isa: tuple[str, ...], tmp_path: Path) -> None:
    arguments, _ = CASES["swish, then a per-channel scale (a binary post-op)"]
    _, _, calls = compiled_calls(pointwise_model(**arguments))
    assert_compiles_for(isa, calls[0], tmp_path)


THIS_CPU = machine.isa_flags  # before a test pretends another ISA


@pytest.mark.skipif(not bf16_supported(), reason="this CPU has no bfloat16 instructions")
@pytest.mark.parametrize("stored", [True, False], ids=["source stored bfloat16", "float32 source rounded as read"])
@pytest.mark.parametrize("epilogue", ["relu", "swish, scaled per channel"])
def test_a_bf16_call_multiplies_its_operands_rounded_to_bfloat16(epilogue: str, stored: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """In a bf16 plan (every product bf16, unpriced) the tested conv runs here: its weights rounded when packed, its
    source read as the relu before it stored it (bfloat16) or, where the conversion is the call's own, rounded as it
    is read; equal to the bf16 reference up to the order of the sums, and far from float32 (it did round). NaN and
    ±inf where the reference has them."""
    monkeypatch.setattr(machine, "isa_flags", THIS_CPU)  # its bf16 instructions (AVX-512 with them)
    model = pointwise_model(in_channels=16, out_channels=48, size=(7, 9), epilogue=epilogue)
    options = Options(cost="analytic", device="cpu-nominal", precision="bf16", layout="channels-last", rewrite=True)
    graph, _ = choose_precision(import_graph(model), None, "bf16")
    with _source_conversion(stored):
        result = plan_graph(graph, options)
    compiled = compile_plan(result, options)
    calls = [describe_library_call(k) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
             if b.name == "pointwise_conv"]  # fmt: skip
    (tested,) = [call for call in calls if call.dst.dims[1] == 48]
    assert tested.precision == "bf16" and tested.src.dtype == ("bfloat16" if stored else "float32")
    if stored:  # the first conv, with the relu, runs here too and writes the bfloat16 the tested one reads
        (first,) = [call for call in calls if call.dst.dims[1] == 16]
        assert first.dst.dtype == "bfloat16"
    x = random_array((1, 16, 7, 9), seed=3)
    for error in compare(compiled.run({"x": x}), run_reference(result.plan.graph, {"x": x})):
        assert error.relative < 2e-6, error
    for error in compare(compiled.run({"x": x}), run_reference(import_graph(model), {"x": x})):
        assert 1e-4 < error.relative < BF16_RTOL, error
    x[0, :, 0, 0], x[0, :, 1, 2], x[0, 3, 2, 4] = 1e30, -1e30, np.nan
    assert_close_with_edges(compiled.run({"x": x})["y"], run_reference(result.plan.graph, {"x": x})["y"])


@contextmanager
def _source_conversion(stored: bool) -> Iterator[None]:
    """Plans made inside: the tested conv's source stored bfloat16 by the kernel before it (`stored`), or converted
    by the call itself (no kernel may store a value it computes as bfloat16: each backend declines such a kernel)."""
    if stored:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        for backend in (GENERATED_C, BACKEND, ONEDNN):
            patch.setattr(backend, "applies", _storing_no_bfloat16(backend.applies))
        yield


def _storing_no_bfloat16(applies: Callable[[CandidateKernel], Verdict]) -> Callable[[CandidateKernel], Verdict]:
    def declining(kernel: CandidateKernel) -> Verdict:
        computed = {v for node in kernel.primitives for v in node.outputs}
        if any(is_bf16_cast(node) and node.inputs[0] in computed for node in kernel.primitives):
            return declines("a test's plan converts its operands in the call reading them")
        return applies(kernel)

    return declining


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the 1x1 convolution sums one input channel short",
         'with w.block(f"for (int k = 0; k < {in_channels}; k++)"):',
         'with w.block(f"for (int k = 1; k < {in_channels}; k++)"):'),
    here("the 1x1 convolution's epilogue skips the last pixel of a run",
         'with w.block("for (p = p0; p < p1; p++)"):',
         'with w.block("for (p = p0; p < p1 - 1; p++)"):'),
    here("the 1x1 convolution's last register block of a run takes ROWS pixels past the run",
         'blocks(f"p + {name}_ROWS <= p1", f"{name}_ROWS")',
         'blocks("p < p1", f"{name}_ROWS")'),
    here("the 1x1 convolution's epilogue reads a residual at the transposed pixel",
         'w.line(f"const long y = p / {width}, x = p % {width};",',
         'w.line(f"const long x = p / {width}, y = p % {width};",'),
    here("a bf16 1x1 convolution multiplies its weights unrounded",
         'return f"ko_bf16_round({element})" if call.precision == "bf16" else element\n\n\n@contextmanager',
         'return element\n\n\n@contextmanager',
         file="kernorch/codegen/native/skeleton.py"),
    here("a bf16 1x1 convolution multiplies a float32 source unrounded",
         'return f"ko_bf16_round({element})" if call.precision == "bf16" else element\n\n\ndef weight_value',
         'return element\n\n\ndef weight_value',
         file="kernorch/codegen/native/skeleton.py"),
    here("kernorch's own convolutions' relu turns NaN into 0",
         '"v = (v > 0.0f || v != v) ? v : 0.0f;"',
         '"v = v > 0.0f ? v : 0.0f;"',
         file="kernorch/codegen/library/post_ops.py"),
]  # fmt: skip
