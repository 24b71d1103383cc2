"""The int8 convolution over pixels (native/int8_pixel_conv.py): chosen for static-QDQ convolutions to few output
channels, equal to onnxruntime's QDQ fusion on windows with and without padding (taps reading the zero point),
channels that leave a partial word, widths and heights that leave partial strips and bands, row strides and
dilations, batches, int8 and uint8 sources, scales per tensor and per channel, with and without a bias and a relu;
its scalar C equal to its VNNI path bit for bit; declined where oneDNN's vectors fill or the lanes would not be
consecutive pixels."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.backends.library_calls import library_call
from kernorch.codegen.native.int8_matmul_test import VNNI, run_library
from kernorch.codegen.native.int8_pixel_conv import BACKEND as PIXEL
from kernorch.codegen.native.int8_pixel_conv import MAX_STAGE_BYTES, pixel_conv_rejection, render_pixel_conv, tiling
from kernorch.cost.profile import isolate
from kernorch.devtools.mutate import here
from kernorch.ir.kernel import make_kernel
from kernorch.runtime import run_reference
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.feeds import seeded_feeds
from kernorch.testing import cpu_compile, keep_integer_convolutions, random_array
from kernorch.tools.check import run_onnxruntime

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`


@pytest.fixture(autouse=True)
def _integer_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests build the kernel's convolutions from QDQ models on every CPU: without VNNI fission keeps such a
    convolution float (`integer_convolution_pays`: this kernel's scalar C is exact there, but slower)."""
    keep_integer_convolutions(monkeypatch)


def qdq_conv(*, channels: int = 32, outputs: int = 3, kernel: int = 3, size: tuple[int, int] = (13, 19),
             pads: int = 1, strides: tuple[int, int] = (1, 1), dilations: tuple[int, int] = (1, 1), batch: int = 1,
             activations: str = "int8", per_channel: bool = True, bias: bool = True, relu: bool = False,
             pool: bool = False, seed: int = 0) -> onnx.ModelProto:  # fmt: skip
    """x -> QuantizeLinear -> DequantizeLinear -> Conv (DQ of constant int8 weights) [-> Relu] [-> GlobalAveragePool]:
    a static-QDQ convolution as onnxruntime's quantize_static writes it (the pooling's [N, O, 1, 1] output is the
    same bytes in either layout: no transpose after the convolution's epilogue)."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, (outputs, channels, kernel, kernel)).astype(np.int8)
    scale = np.linspace(0.002, 0.02, outputs).astype(np.float32) if per_channel else np.asarray(0.01, np.float32)
    constants = {"w": w, "ws": scale, "wz": np.zeros(scale.shape, np.int8), "xs": np.asarray(0.05, np.float32),
                 "xz": np.asarray(-5 if activations == "int8" else 7, activations),
                 "b": rng.standard_normal(outputs).astype(np.float32)}  # fmt: skip
    result = "y" if not relu and not pool else "c"
    conv = helper.make_node("Conv", ["xd", "wd", *(["b"] if bias else [])], [result],
                            kernel_shape=[kernel, kernel], pads=[pads] * 4, strides=list(strides),
                            dilations=list(dilations))  # fmt: skip
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0), conv,
             *([helper.make_node("Relu", ["c"], ["r" if pool else "y"])] if relu else []),
             *([helper.make_node("GlobalAveragePool", ["r" if relu else "c"], ["y"])] if pool else [])]  # fmt: skip
    graph = helper.make_graph(nodes, "qdq_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                [batch, channels, *size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


CASES: dict[str, dict[str, Any]] = {
    "candy's last: 32 → 3 9x9 unpadded": dict(kernel=9, pads=0, size=(20, 75)),
    "3x3 padded: taps in the padding read the zero point": dict(),
    "7 channels (a partial word), 6 outputs, uint8 source": dict(channels=7, outputs=6, activations="uint8"),
    "one output, per-tensor scale, no bias, a relu": dict(outputs=1, per_channel=False, bias=False, relu=True),
    "row stride 2 and row dilation 2, batch 2, prime sizes": dict(strides=(2, 1), dilations=(2, 1), batch=2,
                                                                  size=(37, 67)),
    "5x5 on 1x1: every tap but one in the padding": dict(kernel=5, pads=2, size=(1, 1), channels=12),
}  # fmt: skip


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    x = random_array(shape, seed=5) * 8  # beyond the int8 grid's range (±6.4): saturated at both ends
    x.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, 0.0]
    return {"x": x}


@pytest.mark.parametrize("case", list(CASES))
def test_equals_onnxruntime(case: str) -> None:
    """Exact integer sums: the outputs equal onnxruntime's QDQ fusion (and the float model's) within float
    rounding, whatever the plan fuses around it."""
    model = qdq_conv(**CASES[case])
    compiled = cpu_compile(model, cost="analytic", layout="channels-last")
    convs = [(k, b.name) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
             if any(n.prim == "conv_integer" for n in k.primitives)]  # fmt: skip
    assert [name for _, name in convs] == ["int8_pixel_conv"], convs
    assert pixel_conv_rejection(library_call(convs[0][0])) is None
    feeds = _feeds(model)
    expected = run_onnxruntime(model, feeds)["y"]
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(compiled.run(feeds)["y"], expected, rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(compiled.run(feeds)["y"], run_onnxruntime(model, feeds, optimized=False)["y"],
                               rtol=1e-4, atol=1e-4 * scale)  # fmt: skip


@pytest.mark.parametrize("case", ["3x3 padded: taps in the padding read the zero point",
                                  "row stride 2 and row dilation 2, batch 2, prime sizes",
                                  "per-tensor scale, no bias"])  # fmt: skip
def test_the_dequantization_bias_and_relu_run_inside(case: str, tmp_path: Path) -> None:
    """The convolution with its whole epilogue as one kernel — the cast and scale (per channel or per tensor) as the
    call's scales, the bias, the relu as a post-op — against the reference, whatever the plan chose to fuse."""
    arguments = CASES.get(case, dict(per_channel=False, bias=False)) | dict(relu=True, pool=True)
    graph = cpu_compile(qdq_conv(**arguments), cost="analytic", layout="channels-last").kernels[0].graph
    chain = [next(i for i, n in enumerate(graph.nodes) if n.prim == "conv_integer")]
    while graph.nodes[chain[-1]].prim != "relu":
        chain.append(next(i for i, n in enumerate(graph.nodes) if graph.nodes[chain[-1]].outputs[0] in n.inputs))
    kernel = isolate(make_kernel(graph, tuple(chain), (graph.nodes[chain[-1]].outputs[0],)))
    call = library_call(kernel)
    assert PIXEL.applies(kernel).runs and call.scales is not None and [op.alg for op, _ in call.post_ops] == ["relu"]
    assert (call.bias is not None, call.scales.dims) == (arguments.get("bias", True),
                                                         (3,) if arguments.get("per_channel", True) else (1,))
    feeds = seeded_feeds({v: kernel.graph.types[v] for v in kernel.graph.inputs}, seed=4)
    got = PlanExecutor(kernel.graph, [kernel], 2, tmp_path)(feeds)
    for name, want in run_reference(kernel.graph, feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()))


@pytest.mark.parametrize(("change", "altered", "reason"), [
    (dict(outputs=8), {}, "8 output channels fill oneDNN's vectors"),
    ({}, dict(strides=(1, 2)), "a stride or dilation along x (its lanes are consecutive pixels)"),
    ({}, dict(dilates=(0, 1)), "a stride or dilation along x (its lanes are consecutive pixels)"),
    (dict(channels=256, kernel=11, pads=5), {}, "a 11x11 window over 256 channels: its staged rows would crowd the "
                                                "stack"),
])  # fmt: skip
def test_declines_with_its_reason(change: dict[str, Any], altered: dict[str, Any], reason: str) -> None:
    """Models it declines (oneDNN runs them), and calls altered."""
    compiled = cpu_compile(qdq_conv(**change), cost="analytic", layout="channels-last")
    (kernel,) = [k for k in compiled.kernels if any(n.prim == "conv_integer" for n in k.primitives)]
    assert pixel_conv_rejection(dataclasses.replace(library_call(kernel), **altered)) == reason


def test_the_stage_fits_its_bound() -> None:
    """Bands shrink to fit the staged rows in MAX_STAGE_BYTES: candy's 9x9 over 32 channels stages 8 rows."""
    compiled = cpu_compile(qdq_conv(**CASES["candy's last: 32 → 3 9x9 unpadded"]), cost="analytic",
                           layout="channels-last")  # fmt: skip
    (kernel,) = [k for k in compiled.kernels if any(n.prim == "conv_integer" for n in k.primitives)]
    shape = tiling(library_call(kernel))
    assert (shape.rows, shape.stage_rows, shape.quads, shape.vectors) == (8, 16, 8, 4)
    assert shape.stage_bytes <= MAX_STAGE_BYTES


@pytest.mark.parametrize("case", ["3x3 padded: taps in the padding read the zero point",
                                  "7 channels (a partial word), 6 outputs, uint8 source"])  # fmt: skip
def test_scalar_c_equals_the_vnni_path(case: str, tmp_path: Path) -> None:
    """The scalar path (compiled for x86-64-v3: no AVX-512) against the reference on the isolated kernel, and the
    VNNI path (where this CPU has it) against the scalar one, bit for bit."""
    compiled = cpu_compile(qdq_conv(**CASES[case], size=(9, 70)), cost="analytic", layout="channels-last")
    (kernel,) = [isolate(k) for k in compiled.kernels if any(n.prim == "conv_integer" for n in k.primitives)]
    graph = kernel.graph
    feeds = seeded_feeds({v: graph.types[v] for v in graph.inputs}, seed=4)
    inputs = [feeds[v] if v in feeds else graph.constants[v] for v in kernel.inputs]
    (output,) = kernel.outputs
    expected = run_reference(graph, feeds)[output]
    source = render_pixel_conv("k", library_call(kernel))
    outputs = {}
    for isa in ("x86-64-v3", *(("native",) if VNNI else ())):
        out = np.zeros(graph.types[output].shape, expected.dtype)
        run_library(source, isa, tmp_path, [*(np.ascontiguousarray(a) for a in inputs), out])
        outputs[isa] = out
    np.testing.assert_allclose(outputs["x86-64-v3"], expected, rtol=1e-6, atol=1e-6 * float(np.abs(expected).max()))
    if VNNI:
        np.testing.assert_array_equal(outputs["native"], outputs["x86-64-v3"])


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the pixel conv's padding holds zero instead of the zero point",
         'f"for (int q = 0; q < {shape.quads}; q++) row[q * {shape.stage_width} + p] = fill;"',
         'f"for (int q = 0; q < {shape.quads}; q++) row[q * {shape.stage_width} + p] = 0;"',
         file="kernorch/codegen/native/int8_pixel_conv.py"),
    here("the pixel conv forgets the zero point's product",
         "_mm512_sub_epi32(c{o}_{v}, z{o})",
         "_mm512_sub_epi32(c{o}_{v}, _mm512_setzero_si512())",
         file="kernorch/codegen/native/int8_pixel_conv.py"),
    here("the pixel conv reads an int8 source as unsigned without moving its zero point",
         "{' + 128' if call.src.dtype == 'int8' else ''};\",",
         "\",", file="kernorch/codegen/native/int8_pixel_conv.py"),
    here("the pixel conv's last partial word reads one channel too few",
         "for b in range(channels % 4))",
         "for b in range(channels % 4 - 1))", file="kernorch/codegen/native/int8_pixel_conv.py"),
    here("the pixel conv's scale is per tensor when it is per channel",
         '(" * scale[c]" if call.scales.dims[0] > 1 else " * scale[0]")',
         '" * scale[0]"', file="kernorch/codegen/native/int8_pixel_conv.py"),
    here("the pixel conv stages rows without the row stride",
         'f"const long iy = y0 * {stride_y} - {pad_y} + r;"',
         'f"const long iy = y0 - {pad_y} + r;"', file="kernorch/codegen/native/int8_pixel_conv.py"),
    here("the pixel conv's scalar path reads the next word's weights",
         '"for (int b = 0; b < 4; b++) sum += (int32_t)(uint8_t)(x >> (8 * b)) * "',
         '"for (int b = 0; b < 3; b++) sum += (int32_t)(uint8_t)(x >> (8 * b)) * "',
         file="kernorch/codegen/native/int8_pixel_conv.py"),
    here("an int8 convolution to one channel loses its channels-last relabelling (the layout's early return)",
         'and not any(mode.channels_last and graph.nodes[i].prim == "conv_integer"',
         "and not any(False", file="kernorch/layout/stage.py"),
    here("the pixel conv takes eight output channels",
         "MAX_OUTPUT_CHANNELS = 6", "MAX_OUTPUT_CHANNELS = 8", file="kernorch/codegen/native/int8_pixel_conv.py"),
]  # fmt: skip
