"""The direct grouped convolution (native/grouped_conv.py): chosen exactly where it applies, and equal to
onnxruntime across group widths (4, 8, 16; 32 and 48 split into groups of 16), kernel sizes, strides, dilations,
asymmetric padding, batch, wide rows (several register blocks and a shorter one), maps with fewer rows than
parallel items, and the epilogues it applies."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.library.call import LibraryCall
from kernorch.codegen.native.depthwise_conv_test import compiled_calls, depthwise_model
from kernorch.codegen.native.grouped_conv import grouped_rejection, render_grouped_conv
from kernorch.devtools.mutate import here
from kernorch.testing import random_array
from kernorch.testing.native import assert_close, assert_compiles_for, pretend_isa

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`

@pytest.fixture(autouse=True)
def without_avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel takes its calls on CPUs without AVX-512; its C (8-float vectors) runs on every x86-64, so the
    tests run it wherever they run."""
    pretend_isa(monkeypatch, avx512=False)


CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {  # arguments, the post-ops the call must apply
    "RegNet's groups of 8, strided, relu": (
        dict(channels=48, kernel=3, size=(13, 17), strides=(2, 2), pads=(1, 1, 1, 1), group_channels=8,
             epilogue="relu"), ("relu",)),
    "groups of 16, dilated 5x5, batch 2, no bias, a residual": (
        dict(channels=32, kernel=5, size=(9, 12), batch=2, dilations=(2, 2), pads=(4, 4, 4, 4), bias=False,
             group_channels=16, epilogue="residual"), ("add",)),
    "a wide row (full blocks and a shorter one), asymmetric pads, swish": (
        dict(channels=16, kernel=3, size=(5, 43), pads=(1, 0, 1, 2), group_channels=8, epilogue="swish"),
        ("swish",)),
    "ResNeXt's groups of 4 (half vectors), padded edges on both sides": (
        dict(channels=32, kernel=3, size=(11, 14), pads=(1, 1, 1, 1), group_channels=4, epilogue="relu"),
        ("relu",)),
    "a 7x7 map: fewer rows than items, groups chunked": (
        dict(channels=88, kernel=3, size=(7, 7), pads=(1, 1, 1, 1), group_channels=8), ()),
    "unpadded, stride 2, a per-channel operand": (
        dict(channels=24, kernel=3, size=(9, 10), strides=(2, 2), group_channels=8,
             epilogue="swish, scaled per channel"), ("swish", "mul")),
    "a dense 3x3 conv in panels of 16 (every panel reads every input channel), strided, relu": (
        dict(channels=32, kernel=3, size=(13, 17), strides=(2, 2), pads=(1, 1, 1, 1), group_channels=32,
             epilogue="relu"), ("relu",)),
    "a dense conv of 24 output channels: panels of 8, swish, asymmetric pads": (
        dict(channels=24, kernel=3, size=(6, 19), pads=(0, 1, 2, 1), group_channels=24, epilogue="swish"),
        ("swish",)),
    "ResNeXt-50's last stage: groups of 32 as two of 16 reading the same inputs, a 7x7 map, relu": (
        dict(channels=128, kernel=3, size=(7, 7), pads=(1, 1, 1, 1), group_channels=32, epilogue="relu"),
        ("relu",)),
    "groups of 48 as three of 16, a 1x1 grouped conv, a residual": (
        dict(channels=96, kernel=1, size=(9, 8), group_channels=48, epilogue="residual"),
        ("add",)),
    "a row narrower than the filter's reach: edge pixels only": (
        dict(channels=16, kernel=5, size=(6, 3), pads=(2, 2, 2, 2), group_channels=8, epilogue="relu6"),
        ("clip",)),
}  # fmt: skip


def _post_op_names(call: LibraryCall) -> tuple[str, ...]:
    return tuple(op.alg for op, _ in call.post_ops)


@pytest.mark.parametrize("case", list(CASES))
def test_grouped_conv_matches_onnxruntime(case: str) -> None:
    arguments, post_ops = CASES[case]
    actual, expected, calls = compiled_calls(depthwise_model(**arguments))
    assert [grouped_rejection(call) for call in calls] == [None]
    assert _post_op_names(calls[0]) == post_ops
    source = render_grouped_conv("k", calls[0])
    in_registers = re.search(r"ko_v[48] v = acc", source) is not None
    assert in_registers == (bool(post_ops) and "swish" not in post_ops), source  # swish: over the stored row
    assert_close(actual, expected)


@pytest.mark.parametrize(("changes", "reason"), [
    (dict(group_channels=2), "2 output channels per group (this kernel takes 4, 8 or a multiple of 16)"),
    (dict(group_channels=24, channels=48), "24 output channels per group (this kernel takes 4, 8 or a multiple of 16)"),
    (dict(group_channels=64, channels=128), "a split group's weights (3x3 x 64 x 16 floats) would leave L1"),
    (dict(epilogue="softplus"), "no C for the soft_relu post-op"),
    (dict(channels=16, group_channels=16), "a dense convolution without a post-op oneDNN runs slowly: oneDNN's"),
    (dict(channels=48, group_channels=48, epilogue="relu"),
     "a panel's weights (3x3 x 48 x 16 floats) would leave L1"),
    (dict(channels=16, group_channels=16, kernel=1, pads=(0, 0, 0, 0), epilogue="relu"),
     "a 1x1 stride-1 convolution: the pointwise and panel kernels'"),
])  # fmt: skip
def test_convs_it_does_not_take_stay_with_onednn(changes: dict[str, Any], reason: str) -> None:
    arguments: dict[str, Any] = dict(channels=64, kernel=3, size=(7, 9), pads=(1, 1, 1, 1), group_channels=8) | changes
    actual, expected, calls = compiled_calls(depthwise_model(**arguments))
    assert [grouped_rejection(call) for call in calls] == [reason]
    assert_close(actual, expected)


@pytest.mark.parametrize(("group_in", "group_out"), [(4, 8), (16, 8), (1, 4), (8, 32)])
def test_groups_whose_input_and_output_widths_differ(group_in: int, group_out: int) -> None:
    """x -> 1x1 Conv -> Relu -> grouped Conv (4 groups of `group_in` -> `group_out` channels) -> 1x1 Conv."""
    groups, size = 4, (9, 11)
    inputs, outputs = groups * group_in, groups * group_out
    initializers = [numpy_helper.from_array(random_array((inputs, inputs, 1, 1), seed=4) * 0.3, "w0"),
                    numpy_helper.from_array(random_array((outputs, group_in, 3, 3), seed=1) * 0.3, "w"),
                    numpy_helper.from_array(random_array((outputs,), seed=2), "b"),
                    numpy_helper.from_array(random_array((4, outputs, 1, 1), seed=5) * 0.3, "w1")]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w0"], ["x0"]), helper.make_node("Relu", ["x0"], ["r"]),
             helper.make_node("Conv", ["r", "w", "b"], ["c"], group=groups, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c", "w1"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "grouped", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               (1, inputs, *size))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                                                ir_version=8))  # fmt: skip
    actual, expected, calls = compiled_calls(model)
    assert [grouped_rejection(call) for call in calls] == [None]
    assert_close(actual, expected)


@pytest.mark.parametrize(("case", "prefetched"), [
    ("RegNet's groups of 8, strided, relu", "in + (g + 1) * 8;"),
    ("ResNeXt-50's last stage: groups of 32 as two of 16 reading the same inputs, a 7x7 map, relu",
     "in + (g + 1) / 2 * 32;"),
    ("a dense 3x3 conv in panels of 16 (every panel reads every input channel), strided, relu", None),
])  # fmt: skip
def test_the_next_groups_input_lines_are_prefetched_unless_every_group_reads_the_same(case: str,
                                                                                      prefetched: str | None) -> None:
    """A group's channels lie a pixel's width apart, beyond the hardware prefetchers' 4 KB page: group g + 1's
    (its conv's group: a split group's halves read the same) are prefetched while g is computed, one line per 16
    channels; a dense conv's panels read the inputs the first one brought in."""
    arguments, _ = CASES[case]
    _, _, calls = compiled_calls(depthwise_model(**arguments))
    source = render_grouped_conv("k", calls[0])
    if prefetched is None:
        assert "__builtin_prefetch" not in source
        return
    assert f"const float *next = {prefetched}" in source, source
    lines = -(-arguments["group_channels"] // 16)
    assert f"for (int l = 0; l < {lines}; l++)" in source
    assert "if (g + 1 < " in source  # never past the last group


def test_avx512_keeps_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    arguments, _ = CASES["RegNet's groups of 8, strided, relu"]
    _, _, calls = compiled_calls(depthwise_model(**arguments))
    pretend_isa(monkeypatch, avx512=True)
    reason = "AVX-512: oneDNN's grouped convolution, not measured against this kernel there"
    assert grouped_rejection(calls[0]) == reason


def test_depthwise_and_ungrouped_convs_are_not_its() -> None:
    _, _, (depthwise,) = compiled_calls(depthwise_model(channels=16, kernel=3, size=(7, 9), pads=(1, 1, 1, 1)))
    assert grouped_rejection(depthwise) == "depthwise"


@pytest.mark.parametrize("isa", [("-mavx2", "-mfma"), ("-mavx512f",), ("-march=x86-64",)])
def test_the_same_source_compiles_for_every_isa(isa: tuple[str, ...], tmp_path: Path) -> None:
    arguments, _ = CASES["RegNet's groups of 8, strided, relu"]
    _, _, calls = compiled_calls(depthwise_model(**arguments))
    assert_compiles_for(isa, calls[0], tmp_path)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the grouped conv's padded edge reads the pixel past the row's end",
         'f"if (ix < 0 || ix >= {self.call.src.dims[3]}) continue;",',
         'f"if (ix < 0 || ix > {self.call.src.dims[3]}) continue;",'),
    here("the grouped conv's interior forgets the bias",
         'w.line(*(f"ko_v8 acc{i}_{v} = *(const ko_v8u *)(s->bias + g * {self.group_out} + {v * lanes});"',
         'w.line(*(f"ko_v8 acc{i}_{v} = (ko_v8){{0}};"'),
    here("the grouped conv reads every group's input from the first group's channels",
         'f" + {self.input_offset};", f"const float *wt = {self.weights(\'ky\', \'kx\')};")',
         'f" + 0;", f"const float *wt = {self.weights(\'ky\', \'kx\')};")'),
    here("the grouped conv's split groups each read the inputs of a group of their own",
         'group = f"g / {grouping.splits}" if grouping.splits > 1 else "g"',
         'group = "g"'),
    here("the grouped conv packs each split group's first output channels for all of its parts",
         'f"w[(long)(g / {grouping.splits}) * {w_g} + (long)(g % {grouping.splits} * {group_out} + o) * {w_o} + "',
         'f"w[(long)(g / {grouping.splits}) * {w_g} + (long)(o) * {w_o} + "'),
    here("the grouped conv's dense panels each read the input channels of a group of their own",
         "return Grouping(out_channels // panel, panel, in_channels, (panel * w_o, w_o, w_i, w_y, w_x), 0)",
         "return Grouping(out_channels // panel, panel, in_channels, (panel * w_o, w_o, w_i, w_y, w_x), in_channels)"),
    here("the grouped conv's dense panels of 8 are packed as panels of 16",
         "panel = LANES * MAX_GROUP_VECTORS if out_channels % (LANES * MAX_GROUP_VECTORS) == 0 else LANES",
         "panel = LANES * MAX_GROUP_VECTORS if out_channels % LANES == 0 else LANES"),
    here("the grouped conv packs the weights with input and output channels swapped",
         "f\"s->w[(long)g * {group_size} + ((ky * {kernel_w} + kx) * {group_in} + i) * {group_out} + o] = \"",
         "f\"s->w[(long)g * {group_size} + ((ky * {kernel_w} + kx) * {group_out} + o) * {group_in} + i] = \""),
    here("the grouped conv's chunked items skip their last group",
         'f"const int g1 = g0 + {chunk} < {groups} ? g0 + {chunk} : {groups};",',
         'f"const int g1 = g0 + {chunk} < {groups} ? g0 + {chunk} - 1 : {groups};",'),
    here("the grouped conv's registers read every pixel's residual at the block's first",
         'statements = vector_epilogue(self.call.post_ops, "n", channel, "y", pixel) if self.epilogue_in_registers',
         'statements = vector_epilogue(self.call.post_ops, "n", channel, "y", "x") if self.epilogue_in_registers'),
    here("the grouped conv prefetches its own group's lines, not the next one's",
         'following = "(g + 1) / " + str(grouping.splits) if grouping.splits > 1 else "(g + 1)"',
         'following = "g / " + str(grouping.splits) if grouping.splits > 1 else "g"'),
    here("the grouped conv prefetches one line of a group wider than 16 channels",
         "lines = -(-grouping.group_in * 4 // 64)",
         "lines = 1"),
    here("the grouped conv prefetches for dense panels too",
         "if grouping.input_step:  # a dense conv's panels all read the same inputs: in cache after the first",
         "if True:  # a dense conv's panels all read the same inputs: in cache after the first"),
    here("a vector operand is read from the first image for every image",
         'axes = ((n, dims[0], strides[0]), (y, dims[2], strides[2]), (x, dims[3], strides[3]))',
         'axes = ((n, dims[0], 0), (y, dims[2], strides[2]), (x, dims[3], strides[3]))',
         file="kernorch/codegen/library/post_ops.py"),
]  # fmt: skip
