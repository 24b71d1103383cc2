"""The integer linear rules against onnxruntime, through the reference interpreter and compiled: uint8 and int8
operands at their extremes, zero points per tensor, per row, per column and per channel (and absent), sizes 1,
odd and prime, a K long enough for sums near int32's limit. MatMulInteger and ConvInteger must equal onnxruntime's
sums exactly; the requantizing QLinearMatMul and QLinearConv may differ by one step where onnxruntime's product by
one multiplier and the reference's division land on either side of a tie (counted, and bounded). On a CPU without
VNNI onnxruntime's own products of unsigned by signed bytes are not exact (its AVX2 kernels add pairs of them in a
saturating int16, a limitation its quantization guide states): there the reference is onnx.reference's."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

from kernorch import machine
from kernorch.devtools.mutate import here
from kernorch.errors import UnsupportedOperator
from kernorch.fission import fallback_nodes, fission
from kernorch.frontend import import_model
from kernorch.ir.primitives import MAX_INTEGER_K
from kernorch.runtime import run_reference
from kernorch.testing import cpu_compile, exact_int8_outputs, integer_extremes, single_op_model
from kernorch.tools.check import run_onnxruntime

RNG = np.random.default_rng(11)


def _integers(dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    return integer_extremes(RNG, dtype, shape)


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray], per: str | None) -> np.ndarray:
    """onnxruntime's output; for the zero point per row of a or per output channel (`per`: its constant) that
    onnxruntime refuses (the ONNX reference too), row by row or channel by channel from models with that row's or
    channel's zero point as a scalar (a zero point reaches only its own row's or channel's sums)."""
    if per is None:
        return exact_int8_outputs(model, feeds)["out0"]
    (initializer,) = [i for i in model.graph.initializer if i.name == per]
    vector = onnx.numpy_helper.to_array(initializer)
    rows = []
    for index, value in enumerate(vector):
        scalar = onnx.ModelProto()
        scalar.CopyFrom(model)
        (target,) = [i for i in scalar.graph.initializer if i.name == per]
        target.CopyFrom(onnx.numpy_helper.from_array(np.asarray(value), per))
        axis = 0 if per == "za" else 1
        rows.append(np.take(exact_int8_outputs(scalar, feeds)["out0"], [index], axis=axis))
    return np.concatenate(rows, axis=0 if per == "za" else 1)


def _results(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
             per: str | None = None) -> list[tuple[str, np.ndarray, np.ndarray]]:  # fmt: skip
    """(how, kernorch's output, onnxruntime's) through the reference interpreter and the compiled plan."""
    expected = _onnxruntime(model, feeds, per)
    graph = fission(import_model(model))
    assert not fallback_nodes(graph), "the rule did not take the node"
    compiled = cpu_compile(model, cost="analytic").run(feeds)["out0"]
    return [("reference", run_reference(graph, feeds)["out0"], expected), ("compiled", compiled, expected)]


def _assert_exact(model: onnx.ModelProto, feeds: dict[str, np.ndarray], per: str | None = None) -> None:
    for how, got, expected in _results(model, feeds, per):
        assert got.dtype == expected.dtype and got.shape == expected.shape, how
        np.testing.assert_array_equal(got, expected, err_msg=how)


def _assert_within_one_step(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    for how, got, expected in _results(model, feeds):
        assert got.dtype == expected.dtype and got.shape == expected.shape, how
        steps = np.abs(got.astype(np.int32) - expected.astype(np.int32))
        assert steps.max() <= 1, f"{how}: {steps.max()} steps apart"
        assert (steps == 1).mean() <= 0.01, f"{how}: {(steps == 1).sum()} of {steps.size} one step apart"


MATMUL_CASES: dict[str, dict[str, Any]] = {
    "uint8 x int8, scalar zero points": dict(a=(np.uint8, (5, 37)), b=(np.int8, (37, 11)), za=np.uint8(131),
                                             zb=np.int8(-3)),
    "uint8 x uint8": dict(a=(np.uint8, (3, 8)), b=(np.uint8, (8, 4)), za=np.uint8(255), zb=np.uint8(128)),
    "int8 x int8": dict(a=(np.int8, (7, 13)), b=(np.int8, (13, 17)), za=np.int8(-128), zb=np.int8(127)),
    "no zero points": dict(a=(np.uint8, (4, 6)), b=(np.int8, (6, 5)), za=None, zb=None),
    "a's zero point only": dict(a=(np.uint8, (4, 6)), b=(np.int8, (6, 5)), za=np.uint8(3), zb=None),
    "zero point of shape [1]": dict(a=(np.int8, (2, 3)), b=(np.int8, (3, 2)), za=np.array([5], np.int8),
                                    zb=np.array([-7], np.int8)),
    "per row of a": dict(a=(np.uint8, (3, 5)), b=(np.int8, (5, 4)), za=np.array([0, 128, 255], np.uint8),
                         zb=np.int8(1), per="za"),
    "per column of b": dict(a=(np.uint8, (3, 5)), b=(np.int8, (5, 4)), za=np.uint8(9),
                            zb=np.array([-128, 0, 5, 127], np.int8)),
    "one by one": dict(a=(np.uint8, (1, 1)), b=(np.int8, (1, 1)), za=np.uint8(200), zb=np.int8(-100)),
    "batched a, 2-D b": dict(a=(np.uint8, (2, 3, 19)), b=(np.int8, (19, 23)), za=np.uint8(77), zb=np.int8(0)),
    "batched both": dict(a=(np.int8, (2, 3, 5)), b=(np.int8, (2, 5, 3)), za=np.int8(4), zb=np.int8(-4)),
    # every product 255 x 128 in magnitude: the sums reach 2.4e8 (exact in int32, not in float32)
    "long K at the extremes": dict(a=(np.uint8, (2, 7331)), b=(np.int8, (7331, 3)), za=np.uint8(0),
                                   zb=np.int8(0), fill=(255, -128)),
}  # fmt: skip


def _matmul_model(case: dict[str, Any]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    a = _integers(*case["a"])
    b = _integers(*case["b"])
    if "fill" in case:
        a[:], b[:] = case["fill"]
    constants: dict[str, np.ndarray] = {"b": b}
    order = ["a", "b"]
    for name in ("za", "zb"):
        if case[name] is not None:
            constants[name] = np.asarray(case[name])
        order.append(name if case[name] is not None else "")
    while order[-1] == "":
        order.pop()
    return single_op_model("MatMulInteger", {"a": a}, {}, constants, input_order=order), {"a": a}


@pytest.mark.parametrize("case", list(MATMUL_CASES))
def test_matmul_integer_equals_onnxruntime(case: str) -> None:
    _assert_exact(*_matmul_model(MATMUL_CASES[case]), per=MATMUL_CASES[case].get("per"))


def test_long_sums_are_not_float32_sums() -> None:
    """The long-K case's sums are beyond float32's exact integers: a float32 product would differ there."""
    model, feeds = _matmul_model(MATMUL_CASES["long K at the extremes"])
    expected = exact_int8_outputs(model, feeds)["out0"]
    assert abs(int(expected[0, 0])) == 7331 * 255 * 128 and abs(int(expected[0, 0])) > 2**24


def _qlinear_matmul_model(a: np.ndarray, b: np.ndarray, b_scale: np.ndarray, b_zero: np.ndarray,
                          y_zero: np.ndarray) -> onnx.ModelProto:  # fmt: skip
    a_zero = np.asarray(120 if a.dtype == np.uint8 else -5, a.dtype)
    constants = {"a_scale": np.asarray(0.02, np.float32), "a_zero": a_zero, "b": b, "b_scale": b_scale,
                 "b_zero": b_zero, "y_scale": np.asarray(0.7, np.float32), "y_zero": y_zero}  # fmt: skip
    order = ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "y_scale", "y_zero"]
    return single_op_model("QLinearMatMul", {"a": a}, {}, constants, input_order=order)


@pytest.mark.parametrize("case", ["uint8 to uint8", "int8 to int8, per column", "uint8 to int8, odd sizes"])
def test_qlinear_matmul_within_one_step_of_onnxruntime(case: str) -> None:
    b_scale: Any
    b_zero: Any
    y_zero: Any
    if case == "uint8 to uint8":
        a, b = _integers(np.uint8, (16, 64)), _integers(np.uint8, (64, 32))
        b_scale, b_zero, y_zero = np.float32(0.01), np.uint8(128), np.uint8(100)
    elif case == "int8 to int8, per column":
        a, b = _integers(np.int8, (8, 48)), _integers(np.int8, (48, 24))
        b_scale, b_zero = np.linspace(0.001, 0.03, 24).astype(np.float32), np.zeros(24, np.int8)
        y_zero = np.int8(-10)
    else:
        a, b = _integers(np.uint8, (1, 3, 29)), _integers(np.int8, (29, 13))
        b_scale, b_zero, y_zero = np.float32(0.05), np.int8(3), np.uint8(0)
    model = _qlinear_matmul_model(a, b, np.asarray(b_scale), np.asarray(b_zero), np.asarray(y_zero))
    _assert_within_one_step(model, {"a": a})


CONV_CASES: dict[str, dict[str, Any]] = {
    "uint8 x int8, padded": dict(x=(np.uint8, (1, 3, 9, 9)), w=(np.int8, (4, 3, 3, 3)), zx=np.uint8(128),
                                 zw=np.int8(0), attrs=dict(pads=[1, 1, 1, 1])),
    "grouped, strided, per-channel weight zero points": dict(
        x=(np.uint8, (2, 4, 7, 11)), w=(np.uint8, (6, 2, 3, 1)), zx=np.uint8(7),
        zw=np.array([0, 1, 128, 255, 3, 9], np.uint8), attrs=dict(group=2, strides=[2, 1], pads=[0, 1, 2, 0]),
        per="zw"),
    # as an integer product of its windows: strided and dilated taps, uneven padding corrected per pixel
    "strided, dilated, unevenly padded 2-D": dict(x=(np.uint8, (2, 5, 11, 9)), w=(np.int8, (7, 5, 3, 2)),
                                                  zx=np.uint8(200), zw=np.int8(-1),
                                                  attrs=dict(strides=[2, 1], dilations=[2, 3], pads=[1, 2, 0, 1])),
    "per-channel weight zero points, padded 2-D": dict(x=(np.uint8, (1, 3, 6, 7)), w=(np.uint8, (4, 3, 3, 3)),
                                                       zx=np.uint8(9), zw=np.array([0, 7, 128, 250], np.uint8),
                                                       attrs=dict(pads=[1, 1, 1, 1]), per="zw"),
    "int8 x int8, no zero points, 1-D": dict(x=(np.int8, (1, 5, 13)), w=(np.int8, (3, 5, 2)), zx=None, zw=None,
                                            attrs=dict(dilations=[3])),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_integer_equals_onnxruntime(case: str) -> None:
    spec = CONV_CASES[case]
    x, w = _integers(*spec["x"]), _integers(*spec["w"])
    constants = {"w": w, **{k: np.asarray(spec[k]) for k in ("zx", "zw") if spec[k] is not None}}
    order = ["x", "w", *(k for k in ("zx", "zw") if spec[k] is not None)]
    model = single_op_model("ConvInteger", {"x": x}, spec["attrs"], constants, input_order=order)
    _assert_exact(model, {"x": x}, per=spec.get("per"))


# convolutions the int8 kernels take: constant weights within int8 of their zero points, any source zero point
INT8_CONV_CASES: dict[str, dict[str, Any]] = {
    "uint8 source at a zero point of 255, padded 3x3": dict(x=(np.uint8, (1, 8, 9, 9)), w=(np.int8, (16, 8, 3, 3)),
                                                         zx=np.uint8(255), attrs=dict(pads=[1, 1, 1, 1])),
    "int8 source at -128, depthwise, strided": dict(x=(np.int8, (1, 12, 11, 11)), w=(np.int8, (12, 1, 3, 3)),
                                                    zx=np.int8(-128), attrs=dict(group=12, strides=[2, 2],
                                                                                 pads=[1, 1, 1, 1])),
    "two groups, dilated, unevenly padded": dict(x=(np.uint8, (2, 8, 10, 7)), w=(np.int8, (6, 4, 3, 2)),
                                                 zx=np.uint8(3), attrs=dict(group=2, dilations=[2, 1],
                                                                            pads=[1, 0, 2, 1])),
    "1-D, odd length": dict(x=(np.uint8, (1, 6, 17)), w=(np.int8, (5, 6, 3)), zx=np.uint8(128),
                            attrs=dict(pads=[1, 1])),
}  # fmt: skip


@pytest.mark.parametrize("case", list(INT8_CONV_CASES))
def test_int8_convolutions_run_on_the_int8_kernel_exactly(case: str) -> None:
    spec = INT8_CONV_CASES[case]
    x, w = _integers(*spec["x"]), _integers(*spec["w"])
    model = single_op_model("ConvInteger", {"x": x}, spec["attrs"], {"w": w, "zx": np.asarray(spec["zx"])},
                            input_order=["x", "w", "zx"])  # fmt: skip
    compiled = cpu_compile(model, cost="analytic")
    # without VNNI oneDNN's sums are exact for an unsigned source by 7-bit weights only (the test below); these
    # windows are short enough for float32 sums, which are exact then (the float convolution kernels)
    exact_here = machine.int8_dot_products() or (x.dtype == np.uint8 and np.abs(w.astype(np.int32)).max() <= 64)
    assert _convolutions(compiled) == [("conv_integer", True) if exact_here else ("conv", True)]
    np.testing.assert_array_equal(compiled.run({"x": x})["out0"], run_onnxruntime(model, {"x": x})["out0"])


@pytest.mark.parametrize(("source", "widest", "on_onednn"), [(np.uint8, 64, True), (np.uint8, 65, False),
                                                            (np.int8, 64, False)])  # fmt: skip
def test_without_vnni_onednn_takes_only_the_convolutions_it_sums_exactly(  # type: ignore[no-untyped-def]
        monkeypatch, source: type, widest: int, on_onednn: bool) -> None:
    """On a CPU without VNNI (AMD Zen 3: AVX2) oneDNN adds pairs of unsigned-by-signed byte products in a saturating
    int16 and halves a signed source's weights: it takes an unsigned source by weights within 64 only; the rest
    runs elsewhere, exactly. The weights' extremes meet the source's, where a pair sum saturates first."""
    monkeypatch.setattr(machine, "int8_dot_products", lambda: False)
    x = _integers(source, (1, 16, 6, 5))
    w = RNG.integers(-widest, widest + 1, (8, 16, 3, 3)).astype(np.int8)
    w[:, :, 0, 0], x[...] = widest, np.iinfo(source).max  # every window's first pair at 2 * 255 * widest
    model = single_op_model("ConvInteger", {"x": x}, dict(pads=[1, 1, 1, 1]), {"w": w, "zx": np.asarray(source(0))},
                            input_order=["x", "w", "zx"])  # fmt: skip
    compiled = cpu_compile(model, cost="analytic", layout="channels-last")
    # the others: float32 sums, exact for windows this short (the next test)
    assert _convolutions(compiled) == [("conv_integer", True) if on_onednn else ("conv", True)]
    exact = run_reference(fission(import_model(model)), {"x": x})["out0"]
    np.testing.assert_array_equal(compiled.run({"x": x})["out0"], exact)


def _convolutions(compiled: Any) -> list[tuple[str, bool]]:
    """(primitive, whether it is int8 on oneDNN or an exact float32 one) of each convolution of a compiled plan."""
    return [(n.prim, b.name == "onednn" if n.prim == "conv_integer" else bool(n.attr("exact_sums")))
            for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
            for n in k.primitives if n.prim.startswith("conv")]  # fmt: skip


@pytest.mark.parametrize(("window", "in_float32"), [(518, True), (519, False)])
@pytest.mark.parametrize("source", [np.uint8, np.int8])
def test_without_vnni_sums_provably_below_2_24_run_in_float32_exactly(  # type: ignore[no-untyped-def]
        monkeypatch, window: int, in_float32: bool, source: type) -> None:
    """Without VNNI, a convolution oneDNN does not sum exactly runs on the float kernels where every partial sum is
    an integer below 2^24: 255 (the widest source minus any zero point) times an output channel's Σ|w|. At the edge:
    a window of 518 weights of 127 against sources 255 from their zero point sums to 16 775 430 < 2^24 (exact in
    float32, and the extreme case is run); 519 could reach 16 807 815, past it (the int8 primitive then)."""
    monkeypatch.setattr(machine, "int8_dot_products", lambda: False)
    channels = window // 2 if window % 2 == 0 else window  # a 2-tap 1-D window over half the channels, or 1 tap
    taps = window // channels
    low, high = np.iinfo(source).min, np.iinfo(source).max
    x: np.ndarray = np.full((1, channels, 9), high, source)  # at 255 from the zero point below, everywhere
    x[0, :, 4] = RNG.integers(low, high + 1, channels)  # and one position of ordinary values
    w = np.full((3, channels, taps), 127, np.int8)  # -128 would take 518 past 2^24: weights within 127 here
    w[1] = -127
    w[2] = RNG.integers(-127, 128, (channels, taps))
    model = single_op_model("ConvInteger", {"x": x}, {}, {"w": w, "zx": np.asarray(source(low))},
                            input_order=["x", "w", "zx"])  # fmt: skip
    graph = fission(import_model(model))
    assert [(n.prim, bool(n.attr("exact_sums"))) for n in graph.nodes if n.prim.startswith("conv")] == \
        [("conv", True) if in_float32 else ("conv_integer", False)]  # fmt: skip
    compiled = cpu_compile(model, cost="analytic")
    got, exact = compiled.run({"x": x})["out0"], run_reference(graph, {"x": x})["out0"]
    np.testing.assert_array_equal(got, exact)
    if in_float32:
        assert int(np.abs(exact).max()) == 255 * 127 * window  # the extreme sum itself, exact


def test_a_zero_point_given_at_run_time_is_read_on_every_run() -> None:
    # 7-bit weights: oneDNN's on any CPU (without VNNI, its sums of wider ones are not exact)
    x, w = _integers(np.uint8, (1, 4, 7, 7)), np.clip(_integers(np.int8, (8, 4, 3, 3)), -64, 64)
    model = single_op_model("ConvInteger", {"x": x, "zx": np.asarray(np.uint8(0))}, dict(pads=[1, 1, 1, 1]),
                            {"w": w}, input_order=["x", "w", "zx"])  # fmt: skip
    compiled = cpu_compile(model, cost="analytic")
    assert "onednn" in [b.name for b in compiled.executor.backends]
    for zero in (0, 200, 255, 17):
        feeds = {"x": x, "zx": np.asarray(np.uint8(zero))}
        np.testing.assert_array_equal(compiled.run(feeds)["out0"], run_onnxruntime(model, feeds)["out0"],
                                      err_msg=f"zero point {zero}")  # fmt: skip


@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv_within_one_step_of_onnxruntime(per_channel: bool) -> None:
    x, w = _integers(np.uint8, (1, 8, 10, 10)), _integers(np.int8, (16, 8, 3, 3))
    w_scale = np.linspace(0.001, 0.01, 16).astype(np.float32) if per_channel else np.float32(0.004)
    constants: dict[str, np.ndarray] = {
        "x_scale": np.asarray(0.03, np.float32), "x_zero": np.asarray(128, np.uint8), "w": w,
        "w_scale": np.asarray(w_scale), "w_zero": np.zeros(16, np.int8) if per_channel else np.asarray(0, np.int8),
        "y_scale": np.asarray(0.9, np.float32), "y_zero": np.asarray(17, np.uint8),
        "bias": RNG.integers(-5000, 5000, 16).astype(np.int32)}  # fmt: skip
    order = ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero", "bias"]
    model = single_op_model("QLinearConv", {"x": x}, dict(pads=[1, 1, 1, 1]), constants, input_order=order)
    _assert_within_one_step(model, {"x": x})


@pytest.mark.parametrize("what, model", [
    ("1-D by 2-D", lambda: single_op_model("MatMulInteger", {"a": np.zeros(3, np.uint8)}, {},
                                              {"b": np.zeros((3, 2), np.int8)})),
    ("per tensor or per column", lambda: _qlinear_matmul_model(np.zeros((2, 3), np.uint8), np.zeros((3, 2), np.int8),
                                                      np.ones((3, 2), np.float32), np.asarray(0, np.int8),
                                                      np.asarray(0, np.uint8))),
])  # fmt: skip
def test_refused_with_a_reason(what: str, model: Any) -> None:
    with pytest.raises(UnsupportedOperator, match=what):
        fission(import_model(model()))


def test_the_longest_k_is_exact_in_int32() -> None:
    assert MAX_INTEGER_K * 255**2 <= 2**31 - 1 < (MAX_INTEGER_K + 1) * 255**2


MUTANTS = [
    here("integer sums in float32 bounded by the widest weight's 128, not the source's 255",
         "return 255 * widest_sum < FLOAT32_WHOLE", "return 128 * widest_sum < FLOAT32_WHOLE",
         file="kernorch/fission/rules/common.py"),
    here("bfloat16 offered to exact integer sums", "            and not node.attr(\"exact_sums\")\n", "",
         file="kernorch/precision/stage.py"),
    here("a per-row zero point read per column", "a_zero_point = reshape(ctx, a_zero_point, (a_type.shape[-2], 1))",
         "a_zero_point = a_zero_point"),
    here("QLinearMatMul multiplies by the output scale",
         'multiplier = ctx.emit("div", ctx.emit("mul", a_scale, b_scale), y_scale)\n    return [requantized(ctx, acc,',
         'multiplier = ctx.emit("mul", ctx.emit("mul", a_scale, b_scale), y_scale)\n    return [requantized(ctx, '
         'acc,'),
    here("the conv's zero point subtracted from the weights only", 'sums = ctx.emit("conv", centred_float('
         'ctx.input(x), x_zero_point, "float64")', 'sums = ctx.emit("conv", ctx.emit("cast", ctx.input(x), '
         'to="float64")'),
    here("the float32 conv's source zero point ignored", 'sums = ctx.emit("conv", centred_float(ctx.input(x), '
         'x_zero_point, "float32")', 'sums = ctx.emit("conv", ctx.emit("cast", ctx.input(x), to="float32")'),
    here("per-channel weight zero points folded along the wrong axis", "    along[axis] = -1", "    along[1] = -1",
         file="kernorch/fission/rules/common.py"),
    here("the int8 convolution's source zero point is ignored", "ctx.constant(centred), x_zero_point,",
         "ctx.constant(centred), ctx.scalar(0, x_dtype),"),
    here("oneDNN's scales of a grouped convolution taken per group", "return 3 if len(call.weights.dims) == "
         "len(call.dst.dims) + 1 else 1", "return 1", file="kernorch/codegen/library/onednn.py",
         tests=("kernorch/fission/qdq_test.py",)),
    here("the zero point read once, when the plan is created",
         '            w.line(f"s->{field_name} = (int32_t)*(const {C_ELEMENTS[zero.dtype]} *)a[{zero.slot}];")',
         "            pass", file="kernorch/codegen/library/onednn.py"),
    here("oneDNN's int8 convolution taken on a CPU without VNNI whatever its weights",
         'if call.precision == "int8" and not machine.int8_dot_products():', 'if False:',
         file="kernorch/codegen/library/onednn.py"),
    here("a pair of products of 7-bit weights judged to saturate",
         "if widest_weight > machine.SATURATION_FREE_WEIGHT else",
         "if widest_weight >= machine.SATURATION_FREE_WEIGHT else", file="kernorch/codegen/library/onednn.py"),
    here("QLinearConv's bias taken as a bound", 'sums = ctx.emit("add", sums, channel_param(',
         'sums = ctx.emit("max", sums, channel_param('),
]  # fmt: skip
