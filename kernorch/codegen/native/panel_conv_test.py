"""The 1x1 convolution in panels of output channels (native/panel_conv.py): chosen exactly where it applies, and
equal to onnxruntime across output channel counts that leave a panel of 8, maps that leave runs of unequal length
and blocks of fewer rows, one pixel, batch, 1 to 3 threads, no bias, a residual before the relu, and edge values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from kernorch.codegen.library.call import LibraryCall, describe_library_call
from kernorch.codegen.native.panel_conv import panel_rejection, render_panel_conv
from kernorch.codegen.native.pointwise_conv_test import pointwise_model
from kernorch.devtools.mutate import here
from kernorch.testing import cpu_compile, random_array
from kernorch.testing.native import assert_close, assert_close_with_edges, assert_compiles_for, pretend_isa
from kernorch.tools.check import run_onnxruntime

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`

@pytest.fixture(autouse=True)
def without_avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel takes its calls on CPUs without AVX-512; its C (8-float vectors) runs on every x86-64, so the
    tests run it wherever they run."""
    pretend_isa(monkeypatch, avx512=False)


def compiled_calls(model: onnx.ModelProto, x: np.ndarray | None = None, threads: int = 2) -> tuple[
        np.ndarray, np.ndarray, list[LibraryCall]]:  # fmt: skip
    """(kernorch's output, onnxruntime's, the library calls between the first and the last conv)."""
    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    feeds = {"x": random_array(shape, seed=3) if x is None else x}
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout="channels-last", rewrite=True,
                           threads=threads)  # fmt: skip
    calls = [describe_library_call(k) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
             if b.stateful]  # fmt: skip
    assert len(calls) == 3, calls
    backends = [b.name for b in compiled.executor.backends if b.stateful]
    assert (backends[1] == "panel_conv") == (panel_rejection(calls[1]) is None), backends
    return compiled.run(feeds)["y"], run_onnxruntime(model, feeds)["y"], calls[1:-1]


CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {  # arguments, the post-ops the call must apply
    "MobileNetV4's 128 -> 512 expansion at 7x7, relu (runs of 25 and 24 pixels: blocks of 5 and of 6; each "
    "thread's run panel by panel)": (
        dict(in_channels=128, out_channels=512, size=(7, 7)), ("relu",)),
    "72 -> 40: two panels of 16 and one of 8, a 5x7 map": (
        dict(in_channels=72, out_channels=40, size=(5, 7)), ("relu",)),
    "a residual, then relu, batch 2, a 13x11 map (143 pixels: runs of 36 and a last of 35)": (
        dict(in_channels=80, out_channels=80, size=(13, 11), batch=2, epilogue="a residual, then relu"),
        ("add", "relu")),
    "one pixel: fewer than a block per thread, one run whose panels the threads share": (
        dict(in_channels=96, out_channels=24, size=(1, 1)), ("relu",)),
    "no bias, swish, 8 outputs (one panel of 8), a 3x2 map": (
        dict(in_channels=65, out_channels=8, size=(3, 2), bias=False, epilogue="swish"), ("swish",)),
    "few input channels (the pointwise kernel's on AVX-512), relu": (
        dict(in_channels=16, out_channels=48, size=(8, 8)), ("relu",)),
    "tanh over a 16x16 map (six runs: five of 43 pixels, one of 41; panel after panel for each run)": (
        dict(in_channels=70, out_channels=32, size=(16, 16), epilogue="tanh"), ("tanh",)),
    "no post-op (ResNet's 1x1 convs before their own relu or add)": (
        dict(in_channels=64, out_channels=48, size=(7, 9), epilogue="none"), ()),
    "swish, then a residual: the epilogue over each stored block, the residual read per pixel": (
        dict(in_channels=24, out_channels=24, size=(5, 11), epilogue="swish, then a residual"), ("swish", "add")),
    "relu, scaled per channel: a vector of the scales in registers": (
        dict(in_channels=48, out_channels=40, size=(3, 7), epilogue="relu, scaled per channel"), ("relu", "mul")),
    "relu, times a map of the pixels: one value for all of a pixel's channels": (
        dict(in_channels=32, out_channels=24, size=(6, 5), batch=2, epilogue="relu, times a map of the pixels"),
        ("relu", "mul")),
    "relu6, then a residual, batch 2": (
        dict(in_channels=24, out_channels=24, size=(4, 13), batch=2, epilogue="relu6, then a residual"),
        ("clip", "add")),
    "stride 2 (ResNet's downsampling), odd sizes: blocks within each output row, relu": (
        dict(in_channels=40, out_channels=32, size=(13, 11), strides=(2, 2)), ("relu",)),
    "strides 3 x 2, batch 2, no post-op": (
        dict(in_channels=24, out_channels=40, size=(10, 9), batch=2, strides=(3, 2), epilogue="none"), ()),
    "stride 2, swish: the epilogue over each stored block within a row": (
        dict(in_channels=16, out_channels=24, size=(9, 14), strides=(2, 2), epilogue="swish"), ("swish",)),
}  # fmt: skip
# the post-ops a kernel applies over each block it stored (no vector form): swish, tanh (the rest in registers)
STORED_EPILOGUES = {"swish", "tanh"}


def _post_op_names(call: LibraryCall) -> tuple[str, ...]:
    return tuple(op.alg for op, _ in call.post_ops)


def _arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"epilogue": "relu", **arguments}


@pytest.mark.parametrize("case", list(CASES))
def test_panel_conv_matches_onnxruntime(case: str) -> None:
    arguments, post_ops = CASES[case]
    actual, expected, calls = compiled_calls(pointwise_model(**_arguments(arguments)))
    assert [panel_rejection(call) for call in calls] == [None]
    assert _post_op_names(calls[0]) == post_ops
    source = render_panel_conv("k", calls[0])
    in_registers = "ko_v8 v = a0_0;" in source
    assert in_registers == (bool(post_ops) and not STORED_EPILOGUES & set(post_ops)), source
    assert ("#pragma omp simd" in source) == bool(STORED_EPILOGUES & set(post_ops))
    assert_close(actual, expected)


@pytest.mark.parametrize("threads", [1, 3])
def test_runs_split_among_any_number_of_threads(threads: int) -> None:
    """The runs are a multiple of the threads, each thread writing whole rows: 54 pixels as two runs of 27 on one
    thread, three of 18 on three."""
    actual, expected, calls = compiled_calls(pointwise_model(in_channels=66, out_channels=56, size=(6, 9),
                                                             epilogue="relu"), threads=threads)  # fmt: skip
    assert [panel_rejection(call) for call in calls] == [None]
    assert_close(actual, expected)


def test_edge_values_pass_through_as_onnxruntime_computes_them() -> None:
    """Inputs of ±1e30 (the products reach ±inf: relu keeps +inf and makes -inf 0) and NaN (kept)."""
    model = pointwise_model(in_channels=72, out_channels=24, size=(3, 5), epilogue="relu")
    x = random_array((1, 72, 3, 5), seed=9)
    x[0, :, 0, 0], x[0, :, 1, 2], x[0, 3, 2, 4] = 1e30, -1e30, np.nan
    actual, expected, calls = compiled_calls(model, x)
    assert [panel_rejection(call) for call in calls] == [None]
    assert_close_with_edges(actual, expected)


@pytest.mark.parametrize(("changes", "reason"), [
    (dict(out_channels=44), "44 output channels are no multiple of 8"),
    (dict(kernel=3), "not a 1x1 convolution without padding"),
])  # fmt: skip
def test_convs_it_does_not_take_go_elsewhere(changes: dict[str, Any], reason: str) -> None:
    arguments: dict[str, Any] = dict(in_channels=72, out_channels=32, size=(4, 5), epilogue="relu") | changes
    actual, expected, calls = compiled_calls(pointwise_model(**arguments))
    assert [panel_rejection(call) for call in calls] == [reason]
    assert_close(actual, expected)


@pytest.mark.parametrize(("case", "residual"), [
    ("a residual, then relu, batch 2, a 13x11 map (143 pixels: runs of 36 and a last of 35)", True),
    ("no post-op (ResNet's 1x1 convs before their own relu or add)", False),
    ("relu, times a map of the pixels: one value for all of a pixel's channels", False),
])  # fmt: skip
def test_the_next_blocks_residual_and_output_lines_are_prefetched(case: str, residual: bool) -> None:
    """A pixel's panel is one line, pixels a channel count apart: the next block's (never past the block range
    it belongs to) are prefetched, the output's with intent to write; an operand with one value per pixel is
    read by every panel, in cache after the first."""
    arguments, _ = CASES[case]
    _, _, calls = compiled_calls(pointwise_model(**_arguments(arguments)))
    source = render_panel_conv("k", calls[0])
    assert "for (long q = rows; q < 2 * rows && p + q < p1; q++)" in source, source
    channels = calls[0].dst.strides[3]  # floats from one pixel to the next
    assert f"__builtin_prefetch(out + q * {channels}L, 1, 3);" in source
    if residual:
        residual_tensor = calls[0].post_ops[0][1]
        assert residual_tensor is not None
        batch_stride = residual_tensor.strides[0]
        assert f"__builtin_prefetch(t0 + n * {batch_stride}L + p * {channels}L + c0 + q * {channels}L, 0, 3);" in source
    assert source.count("__builtin_prefetch") == 1 + residual


def test_avx512_keeps_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    pretend_isa(monkeypatch, avx512=True)
    actual, expected, calls = compiled_calls(pointwise_model(in_channels=72, out_channels=32, size=(4, 5),
                                                             epilogue="relu"))  # fmt: skip
    assert [panel_rejection(call) for call in calls] == [
        "AVX-512: oneDNN's 1x1 convolution, not measured against this kernel there"]
    assert_close(actual, expected)


@pytest.mark.parametrize("isa", [("-mavx2", "-mfma"), ("-mavx512f",), ("-march=x86-64",)])
def test_the_source_compiles_for_every_x86_64(isa: tuple[str, ...], tmp_path: Path) -> None:
    _, _, calls = compiled_calls(pointwise_model(in_channels=72, out_channels=40, size=(5, 7), epilogue="relu"))
    assert_compiles_for(isa, calls[0], tmp_path)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the panel conv prefetches the block it computes, not the next",
         'with w.block(f"for (long q = rows; q < 2 * rows && p + q < {end}; q++)"):',
         'with w.block(f"for (long q = 0; q < rows && p + q < {end}; q++)"):'),
    here("the panel conv prefetches no residual",
         "operands = [o for o in vector_operands(self.call) or [] if o.per_channel and o.pixel_stride]",
         "operands = []"),
    here("the panel convolution sums one input channel short",
         'with w.block(f"for (int k = 0; k < {in_channels}; k++)"):',
         'with w.block(f"for (int k = 1; k < {in_channels}; k++)"):'),
    here("the panel convolution packs a last panel of 8 as if it were 16 wide",
         'f"{PANEL} < {PANEL} ? {LANES} : {PANEL}) + o % {PANEL}] = w[(long)o * {w_o} + (long)k * {w_i}];")',
         'f"{PANEL} < 0 ? {LANES} : {PANEL}) + o % {PANEL}] = w[(long)o * {w_o} + (long)k * {w_i}];")'),
    here("the panel convolution's threads take their runs panel by panel at the wrong runs",
         'f"const long g = first + (panel_major ? within % per : within / {panels});",',
         'f"const long g = first + (panel_major ? within / per : within / {panels});",'),
    here("the panel convolution's panel-by-panel order takes the wrong panels",
         'f"const int c0 = (int)(panel_major ? within / per : within % {panels}) * {PANEL};",',
         'f"const int c0 = (int)(panel_major ? within % per : within % {panels}) * {PANEL};",'),
    here("the panel convolution's blocks leave a run's remainder rows out",
         'w.line(f"rows = ({end} - {begin}) / blocks + (b < ({end} - {begin}) % blocks);",',
         'w.line(f"rows = ({end} - {begin}) / blocks;",'),
    here("a strided panel convolution reads its rows unstrided",
         'f"(p - seg_y * {width}) * {stride_x * src_x}L")  # fmt: skip',
         'f"(p - seg_y * {width}) * {src_x}L")  # fmt: skip'),
    here("a strided panel convolution's blocks run on into the next row",
         'f"seg1 = (seg_y + 1) * {width} < p1 ? (seg_y + 1) * {width} : p1;")  # fmt: skip',
         'f"seg1 = p1;")  # fmt: skip'),
    here("the panel convolution's last run stops a pixel short",
         'f"const long p0 = r * run, p1 = p0 + run < {pixels} ? p0 + run : {pixels};",',
         'f"const long p0 = r * run, p1 = p0 + run < {pixels} ? p0 + run : {pixels} - 1;",'),
    here("the panel convolution's epilogue skips the last pixel of a block",
         'with w.block("for (long q = p; q < p + rows; q++)"):',
         'with w.block("for (long q = p; q < p + rows - 1; q++)"):'),
    here("the panel convolution's epilogue reads a residual at the transposed pixel",
         'w.line(f"const long y = q / {width}, x = q % {width};",',
         'w.line(f"const long x = q / {width}, y = q % {width};",'),
    here("the panel convolution's registers read a residual at the block's first pixel for every row",
         'at = f"t{self.position} + {row * self.pixel_stride}"',
         'at = f"t{self.position} + {self.pixel_stride}"'),
    here("the panel convolution's registers read a per-channel operand from the first panel's channels",
         'channels = " + c0" if self.per_channel else ""',
         'channels = ""'),
    here("the panel convolution's registers read one value for a channel vector's operand",
         'operands.append(VectorOperand(position, n_stride if n != 1 else 0, pixel_stride, c != 1))',
         'operands.append(VectorOperand(position, n_stride if n != 1 else 0, pixel_stride, False))'),
    here("the panel convolution's registers read the first image's operand for every image",
         'operands.append(VectorOperand(position, n_stride if n != 1 else 0, pixel_stride, c != 1))',
         'operands.append(VectorOperand(position, 0, pixel_stride, c != 1))'),
]  # fmt: skip
