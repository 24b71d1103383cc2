"""Epilogues: every activation, scale/shift and residual the issue lists is absorbed into one oneDNN call
(asserting the post-ops) and the compiled result matches onnxruntime; things oneDNN cannot express are not."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch import machine
from kernorch.codegen.library.call import absorbed_summary
from kernorch.codegen.library.epilogue import Eltwise, channel_bias, fit_scalar_function
from kernorch.devtools.mutate import here
from kernorch.machine import isa_flags
from kernorch.testing import cpu_compile, random_array
from kernorch.tools.check import run_onnxruntime

CHANNELS, SIZE = 8, 6


def conv_then(activation: list[onnx.NodeProto], extra_inputs: dict[str, np.ndarray] | None = None,
              opset: int = 17, bias: bool = True) -> onnx.ModelProto:  # fmt: skip
    """x → Conv (with bias) → `activation` nodes (reading "c", writing "y") → a 1x1 Conv, so that the
    activation sits between two convolutions (in channels-last, neither end is a layout change)."""
    for node in activation:
        node.output[:] = ["act" if name == "y" else name for name in node.output]
    w = random_array((CHANNELS, CHANNELS, 3, 3), seed=1) * 0.3
    b = random_array((CHANNELS,), seed=2)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, CHANNELS, SIZE, SIZE))]
    initializers = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
                    numpy_helper.from_array(random_array((CHANNELS, CHANNELS, 1, 1), seed=7), "w2")]
    for name, array in (extra_inputs or {}).items():
        if name.startswith("const_"):
            initializers.append(numpy_helper.from_array(array, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, array.shape))
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"], pads=[1, 1, 1, 1]), *activation,
             helper.make_node("Conv", ["act", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "conv_epilogue", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def compile_single_kernel(model: onnx.ModelProto, feeds: dict[str, np.ndarray], layout: str,
                          library_kernels: int = 2) -> str:  # fmt: skip
    """Compile, check against onnxruntime, and return what the first library kernel absorbed."""

    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout=layout, rewrite=True)
    expected = run_onnxruntime(model, feeds)["y"]
    np.testing.assert_allclose(compiled.run(feeds)["y"], expected, rtol=1e-5, atol=2e-5)
    library = [k for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True) if b.stateful]
    assert len(library) == library_kernels, [[compiled.graph.nodes[i].prim for i in k.nodes] for k in compiled.kernels]
    summary = absorbed_summary(library[0])
    assert summary is not None
    return summary


ACTIVATIONS = {
    "relu": ([helper.make_node("Relu", ["c"], ["y"])], "relu"),
    "clip-relu6": ([helper.make_node("Clip", ["c", "const_lo", "const_hi"], ["y"])], "clip[0, 6]"),
    "hardswish": ([helper.make_node("HardSwish", ["c"], ["y"])], "hardswish"),
    # clip(0.2·x + 0.5, 0, 1): the rewrites fold 0.2 into the weights and 0.5 into the bias, leaving a clip
    "hardsigmoid": ([helper.make_node("HardSigmoid", ["c"], ["y"], alpha=0.2, beta=0.5)], "clip[0, 1]"),
    "sigmoid": ([helper.make_node("Sigmoid", ["c"], ["y"])], "logistic"),
    "silu": ([helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])], "swish"),
    "gelu-erf": ([helper.make_node("Gelu", ["c"], ["y"])], "gelu_erf"),
    "gelu-tanh": ([helper.make_node("Gelu", ["c"], ["y"], approximate="tanh")], "gelu_tanh"),
    "leaky-relu": ([helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1)], "relu(slope 0.1)"),
}  # fmt: skip


# oneDNN's clip and logistic turn NaN into a number (onnxruntime keeps NaN): its calls decline them (without
# AVX-512 a native kernel applies logistic in C instead: native/grouped_conv.py, which the tests below set aside)
DECLINED_BY_ONEDNN = {"clip-relu6", "hardsigmoid", "sigmoid"}
RELU6 = {"const_lo": np.array(0.0, np.float32), "const_hi": np.array(6.0, np.float32)}


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_is_a_post_op(name: str, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "avx512", lambda: True)  # oneDNN's calls, not the AVX2 kernels of codegen/native
    nodes, expected = ACTIVATIONS[name]
    model = conv_then(nodes, RELU6 if name == "clip-relu6" else None, opset=20)
    summary = compile_single_kernel(model, {"x": random_array((1, CHANNELS, SIZE, SIZE), seed=3) * 3}, layout)
    assert summary.startswith("conv"), summary
    if name in DECLINED_BY_ONEDNN:  # the activation (and the bias before it) run in generated C
        assert expected not in summary, summary
    else:
        assert summary.endswith(f"bias, {expected}"), summary
    assert ("channels-last" in summary) == (layout == "channels-last")


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activations_keep_nan_infinities_and_zeros_signed_like_onnxruntime(name: str, layout: str) -> None:
    """NaN and ±inf inputs through conv + activation (NaN and infinite sums, negatives clamped to zero): the
    compiled plan has NaN where onnxruntime does (oneDNN's relu and clip would give 0 or a bound), infinities
    and signed zeros alike, and the rest close."""
    nodes, _ = ACTIVATIONS[name]
    model = conv_then(nodes, RELU6 if name == "clip-relu6" else None, opset=20)
    graph = model.graph
    del graph.node[-1]  # the activation is the output: nothing after it mixes NaN into every channel
    graph.node[-1].output[:] = ["y"]
    del graph.value_info[:]
    x = random_array((1, CHANNELS, SIZE, SIZE), seed=3) * 3
    x[0, :, 0, 0], x[0, 2, 3, 3], x[0, 5, 5, 1] = np.nan, np.inf, -np.inf
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout=layout, rewrite=True)
    got, expected = compiled.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    assert np.isnan(expected).any() and not np.isnan(expected).all()
    if name != "gelu-erf" or "avx512f" in isa_flags():
        # (oneDNN's AVX2 gelu_erf writes +0 where x·Φ(x) underflows below a negative x, onnxruntime's -0: seen on
        # AMD Zen 3, a difference left standing — a sign of zero, and gelu fused into the matmul)
        np.testing.assert_array_equal(np.signbit(got[got == 0]), np.signbit(expected[got == 0]))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)  # equal NaNs, equal infinities


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
def test_scale_shift_and_residual_are_post_ops(layout: str) -> None:
    scale = random_array((1, CHANNELS, 1, 1), seed=4)
    shift = random_array((1, CHANNELS, 1, 1), seed=5)
    # the residual is computed from the block's input (channels-last when the conv is); x itself would join the
    # conv's kernel (the identity-into-conv rewrite)
    nodes = [helper.make_node("Mul", ["c", "const_scale"], ["m"]), helper.make_node("Add", ["m", "const_shift"], ["a"]),
             helper.make_node("Relu", ["x"], ["rx"]), helper.make_node("Add", ["a", "rx"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]  # fmt: skip
    model = conv_then(nodes, {"const_scale": scale, "const_shift": shift})
    summary = compile_single_kernel(model, {"x": random_array((1, CHANNELS, SIZE, SIZE), seed=3)}, layout)
    if layout == "nchw":  # oneDNN runs a plain-layout conv with a tensor operand only by its reference conv
        assert "tensor" not in summary, summary  # (onednn_test.py): the residual is added apart
        return
    # the scale folds into the weights and the shift into the bias (rewrites); the residual is a binary post-op
    assert summary.endswith("bias, add tensor, relu"), summary
    assert ("channels-last" in summary) == (layout == "channels-last")


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
def test_reversed_subtraction_and_a_late_channel_add(layout: str) -> None:
    """x − conv is a sub post-op then a negation; a per-channel add after the ReLU is a binary post-op in its
    place, not the bias (which oneDNN adds before every post-op)."""
    offset = random_array((1, CHANNELS, 1, 1), seed=4)
    nodes = [helper.make_node("Sub", ["x", "c"], ["d"]), helper.make_node("Relu", ["d"], ["r"]),
             helper.make_node("Add", ["r", "const_offset"], ["y"])]  # fmt: skip
    model = conv_then(nodes, {"const_offset": offset})
    summary = compile_single_kernel(model, {"x": random_array((1, CHANNELS, SIZE, SIZE), seed=3)}, layout)
    if layout == "nchw":  # as above: oneDNN's reference conv would take the operands; they run apart
        assert "tensor" not in summary, summary
        return
    assert summary.endswith("bias, sub tensor, linear(-1·x+0), relu, add tensor"), summary


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
def test_a_channel_add_after_an_activation_is_not_the_bias(layout: str) -> None:
    """With no bias of its own, the conv must still not take a per-channel add that follows the ReLU as its
    bias: relu(conv + b) differs from relu(conv) + b."""
    offset = random_array((1, CHANNELS, 1, 1), seed=4)
    nodes = [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["r", "const_offset"], ["y"])]
    model = conv_then(nodes, {"const_offset": offset}, bias=False)
    summary = compile_single_kernel(model, {"x": random_array((1, CHANNELS, SIZE, SIZE), seed=3)}, layout)
    assert summary.endswith("← relu, add tensor"), summary


def test_matmul_with_bias_and_gelu() -> None:
    w = random_array((16, 24), seed=1)
    b = random_array((24,), seed=2)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["c"]),
         helper.make_node("Gelu", ["c"], ["y"])], "mm_gelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 5, 16))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 5, 24))],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=8)
    summary = compile_single_kernel(model, {"x": random_array((2, 5, 16), seed=3)}, "nchw", library_kernels=1)
    assert summary == "matmul ← bias, gelu_erf", summary


def test_fit_recognises_scaled_functions_and_refuses_others() -> None:
    x = np.linspace(-12.0, 12.0, 481)
    samples = np.concatenate([x, [-1e-3, 1e-3, 2e-3, 0.5, -0.5, 3.0, -3.0, 6.0]])

    def fit(f):  # noqa: ANN001, ANN202
        return fit_scalar_function(f(samples), lambda v: float(f(np.array([v]))[0]))

    from math import erf

    erf_ = np.vectorize(erf)
    # GELU with its ½ folded into the next weight (what the rewrites do to BERT): 2·gelu
    assert fit(lambda v: v * (1 + erf_(v / np.sqrt(2)))) == [Eltwise("gelu_erf"), Eltwise("linear", 2.0, 0.0)]
    assert fit(lambda v: 3 * v + 1) == [Eltwise("linear", 3.0, 1.0)]
    assert fit(lambda v: v) == []
    from kernorch.codegen.library.epilogue import EpilogueError

    with pytest.raises(EpilogueError):
        fit(np.sin)
    with pytest.raises(EpilogueError):
        fit(lambda v: v**3)


def test_what_cannot_be_a_post_op_stays_outside() -> None:
    """sin is no oneDNN algorithm; a division *by* the conv result is no binary post-op."""

    for nodes in ([helper.make_node("Sin", ["c"], ["y"])],
                  [helper.make_node("Div", ["const_one", "c"], ["y"])]):  # fmt: skip
        model = conv_then(nodes, {"const_one": np.array(1.0, np.float32)})
        compiled = cpu_compile(model, cost="analytic", device="cpu-nominal")
        kinds = [tuple(compiled.graph.nodes[i].prim for i in k.nodes) for k in compiled.kernels]
        assert all(kernel in (("conv",), ("conv", "add")) for kernel in kinds if "conv" in kernel), kinds
        feeds = {"x": random_array((1, CHANNELS, SIZE, SIZE), seed=3)}
        expected = run_onnxruntime(model, feeds)["y"]  # 1/c magnifies rounding near 0: relative to the largest
        np.testing.assert_allclose(compiled.run(feeds)["y"], expected, atol=1e-4 * float(np.abs(expected).max()))


@pytest.mark.parametrize("requantize", [False, True])
def test_a_rounding_is_no_post_op(requantize: bool) -> None:
    """A product's quotient rounded (and with `requantize`, the rest of a QuantizeLinear: saturated and cast to
    int8, then dequantized: a static-QDQ model's attention scores) is no oneDNN post-op: divided by 50 it is 0 on
    every sample of the fit, which once made the call write zeros. The product runs alone; the result is
    onnxruntime's."""
    if requantize:
        nodes = [helper.make_node("QuantizeLinear", ["m", "s", "z"], ["q"]),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]  # fmt: skip
    else:
        nodes = [helper.make_node("Div", ["m", "s"], ["d"]), helper.make_node("Round", ["d"], ["y"])]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), *nodes], "rounded",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (8, 16))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (8, 12))],
                              [numpy_helper.from_array(random_array((16, 12), seed=1) * 100, "w"),
                               numpy_helper.from_array(np.asarray(50.0, np.float32), "s"),
                               numpy_helper.from_array(np.asarray(3, np.int8), "z")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal")
    for kernel in compiled.kernels:
        prims = [compiled.graph.nodes[i].prim for i in kernel.nodes]
        if "matmul" in prims:
            assert not {"round", "cast"} & set(prims), prims
    feeds = {"x": random_array((8, 16), seed=3) * 10}
    expected = run_onnxruntime(model, feeds)["y"]
    assert np.abs(expected).max() > 0
    np.testing.assert_array_equal(compiled.run(feeds)["y"], expected)


def test_a_scalar_is_the_bias_of_one_output_channel_only() -> None:
    """The call reads O bias values: a one-element constant can be the bias of a single channel, never of
    several (it would be read past its end)."""
    from kernorch.ir.graph import Graph
    from kernorch.ir.types import TensorType

    graph = Graph(inputs=[], outputs=[], name="bias")
    for name, array in {"s": np.float32(0.5), "one": np.ones((1, 1, 1), np.float32),
                        "v": np.ones((4, 1, 1), np.float32)}.items():  # fmt: skip
        graph.constants[name] = np.asarray(array)
        graph.types[name] = TensorType.of(graph.constants[name])
    assert channel_bias(graph, "s", (1, 1, 5, 5), 1) and channel_bias(graph, "one", (1, 1, 5, 5), 1)
    assert not channel_bias(graph, "s", (1, 4, 5, 5), 1) and not channel_bias(graph, "one", (1, 4, 5, 5), 1)
    assert channel_bias(graph, "v", (1, 4, 5, 5), 1) and not channel_bias(graph, "v", (1, 5, 5, 4), 3)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_matmul_activations_keep_nan_like_onnxruntime(name: str) -> None:
    nodes = copy.deepcopy(ACTIVATIONS[name][0])
    for node in nodes:  # reading the matmul's "a" and writing "y"
        node.input[:] = ["a" if value == "c" else value for value in node.input]
        node.output[:] = ["y" if value in ("y", "act") else value for value in node.output]
    x = random_array((2, 12, 32), seed=3) * 3
    # NaN only: a row of ±inf sums (inf·w of both signs) would reach gelu at -inf, NaN in oneDNN's gelu_erf and 0
    # in onnxruntime's — a difference left standing (the conv test above has infinities short of that)
    x[0, 0, 0], x[1, 4, 7] = np.nan, np.nan
    w, b = random_array((32, 48), seed=1) * 0.3, random_array((48,), seed=2)
    constants = {"w": w, "b": b, **({"const_lo": RELU6["const_lo"], "const_hi": RELU6["const_hi"]}
                                    if name == "clip-relu6" else {})}  # fmt: skip
    head = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"])]
    graph = helper.make_graph([*head, *nodes], "matmul_epilogue",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in constants.items()])  # fmt: skip
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)],
                                                                ir_version=8))  # fmt: skip
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=True)
    got, expected = compiled.run({"x": x})["y"], run_onnxruntime(model, {"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    assert np.isnan(expected).any()
    if name != "gelu-erf" or "avx512f" in isa_flags():
        # (oneDNN's AVX2 gelu_erf writes +0 where x·Φ(x) underflows below a negative x, onnxruntime's -0: seen on
        # AMD Zen 3, a difference left standing — a sign of zero, and gelu fused into the matmul)
        np.testing.assert_array_equal(np.signbit(got[got == 0]), np.signbit(expected[got == 0]))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a step function fitted as a post-op", 'if node.prim in STEP_FUNCTIONS:', 'if node.prim in ():'),
    # NaN through oneDNN's post-ops: relu as elu(0) + 0, clip/hardsigmoid/logistic declined
    here("oneDNN's relu post-op turns NaN into 0",
         'if isinstance(op, Eltwise) and op.alg == "relu" and op.alpha == 0.0:',
         "if False:",
         file="kernorch/codegen/library/onednn.py"),
    here("oneDNN takes a clip post-op",
         'NAN_TO_BOUND = ("clip", "hardsigmoid", "logistic")',
         'NAN_TO_BOUND = ("logistic",)',
         file="kernorch/codegen/library/onednn.py"),
    # library calls and their epilogues
    here("T - x loses its negation",
         'post_ops.extend([Binary("sub", other), Eltwise("linear", -1.0, 0.0)])',
         'post_ops.extend([Binary("sub", other)])'),
    here("a later per-channel add becomes the bias",
         'if bias is None and not post_ops and head.prim == "add"',
         'if bias is None and head.prim == "add"'),
    here("activation fit accepts anything close-ish",
         "_FIT_TOLERANCE = 2e-6",
         "_FIT_TOLERANCE = 2e-1"),
]  # fmt: skip
