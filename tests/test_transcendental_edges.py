"""The fast transcendental functions at and around their thresholds, through a compiled plan against onnxruntime:
where exp overflows to inf (its clamp at 88.72284 and ln(FLT_MAX)) and flushes or underflows to 0 (its clamp at
-87.33, FLT_MIN's and the smallest subnormal's logarithms), where sigmoid's selected ends begin (±88) and where it
rounds to 0 and 1, where tanh switches from its series to exp (0.625) and rounds to ±1, where erf's argument is
clamped (3.9) and float32 erf rounds to ±1, where softplus becomes x (and onnxruntime's overflows: its documented
difference). At every threshold: the value itself, the last floats before it and the first past it.

Both spellings run: the generated C (ko_expf, ko_sigmoidf, ko_tanhf, ko_erff) and Triton's (an h100 plan in
Triton's interpreter). Values agree to the semantics test's tolerance (1e-4 relative, 1e-8 absolute near 0),
and wherever onnxruntime saturates — exactly 0, ±1 or ±inf — kernorch gives exactly that value too, except where
float32's own value is not saturated there (then onnxruntime's rounding is not the function's, and both are
within the tolerance) — and kernorch returns an end value (0, ±1, ±inf) only where float32's own value is that
end, or within the function's documented error of it (ZERO_SLACK, ONE_SLACK).

`make mutate` shifts each threshold by one unit (1.0) each way; a shift that fires on values not yet at the end
fails here. Three shifts are equivalent mutants, left out: exp's overflow clamp one unit late (its scale
overflows to inf by itself up to x = 89.7), sigmoid's 1 end one unit early (it has rounded to 1 from 16.6 on),
sigmoid's 0 end one unit late (its own results there are subnormals within 1e-38 of the truth). By an ulp, most
thresholds change no output at all (swept over ±3 000 ulps: exp's clamps, sigmoid's 1 end, erf's clamp)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import kernorch
from kernorch.codegen.backends import GENERATED_C
from kernorch.devtools.mutate import here
from kernorch.errors import FallbackWarning

F32 = np.float32
THRESHOLDS = {
    "Exp": [88.72284, 88.7228391, -87.33, -87.336544, -103.972077, -103.27893, 0.0],
    "Sigmoid": [88.0, -88.0, 16.635532, 17.3286795, -87.336544, -103.972077, 0.0],
    "Tanh": [0.625, -0.625, 9.010913, -9.010913, 7.9, 0.0],
    "Erf": [3.9, -3.9, 3.832506, 3.919206, -3.919206, 0.0],
    "Softplus": [16.635532, 88.72284, -87.33, -103.972077, 15.942385, 0.0],
}
NEIGHBOURS = 3  # floats on each side of a threshold, the threshold's own float included
SPREAD = 1.5  # and a sweep of 61 values over the threshold ± this: a threshold moved by a unit is inside it
# How far from float32's own value kernorch may return an end value (0 or ±1) — its documented error there
# (codegen/c/prelude.py, codegen/triton/expr.py): exp flushes results under 2^-125.5 to 0 (its scale's exponent
# field is 0 from there), softplus with it; sigmoid is 0 below -88 (results under 6.1e-39) and 1 from 16.635532,
# where 1 + e^-x rounds to 1 (float32's sigmoid is 0.99999994 up to 17.33: 1 ulp); Triton's tanh, (1 - t) / (1 + t),
# is ±1 from |x| = 8.66, where t = e^-2|x| rounds away (1 ulp); erf's rational fit is 3.3e-7 off, so it may round
# to ±1 from |x| = 3.62. An end value farther from float32's is a threshold in the wrong place. (onnxruntime is
# no closer: its sigmoid and tanh are 0.9999999 and 0.9999998 at 16.7 and 8.9, 2 and 3 ulps off.)
ZERO_SLACK = {"Exp": 2.0**-125.5, "Softplus": 2.0**-125.5, "Sigmoid": 6.1e-39, "Tanh": 0.0, "Erf": 0.0}
ONE_SLACK = {"Exp": 0.0, "Softplus": 0.0, "Sigmoid": 1.2e-7, "Tanh": 1.2e-7, "Erf": 5e-7}


def around(threshold: float) -> np.ndarray:
    """The float32 nearest `threshold`, NEIGHBOURS floats before and past it, and a sweep around it."""
    centre = F32(threshold)
    values = [centre]
    below = above = centre
    for _ in range(NEIGHBOURS):
        below, above = np.nextafter(below, F32(-np.inf)), np.nextafter(above, F32(np.inf))
        values += [below, above]
    sweep = np.linspace(threshold - SPREAD, threshold + SPREAD, 61).astype(F32)
    return np.unique(np.concatenate([np.array(values, dtype=F32), sweep]))


def inputs(op: str) -> np.ndarray:
    return np.concatenate([around(t) for t in THRESHOLDS[op]] + [np.array([np.inf, -np.inf, np.nan], F32)])


def edge_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    nodes, graph_inputs, outputs, feeds = [], [], [], {}
    for op in THRESHOLDS:
        x = inputs(op)
        feeds[f"x_{op}"] = x
        graph_inputs.append(helper.make_tensor_value_info(f"x_{op}", TensorProto.FLOAT, [x.size]))
        outputs.append(helper.make_tensor_value_info(op, TensorProto.FLOAT, [x.size]))
        nodes.append(helper.make_node(op, [f"x_{op}"], [op]))
    graph = helper.make_graph(nodes, "edges", graph_inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), feeds


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def float32_truth(op: str, x: np.ndarray) -> np.ndarray:
    """The function in float64, rounded to float32: what a correctly rounded float32 function returns."""
    import math

    wide = x.astype(np.float64)
    with np.errstate(all="ignore"):
        exact = {"Exp": np.exp, "Sigmoid": lambda v: 1 / (1 + np.exp(-v)), "Tanh": np.tanh,
                 "Erf": np.vectorize(math.erf, otypes=[np.float64]),
                 "Softplus": lambda v: np.maximum(v, 0) + np.log1p(np.exp(-np.abs(v)))}[op](wide)  # fmt: skip
        return exact.astype(F32)


def mismatches(op: str, x: np.ndarray, actual: np.ndarray, expected: np.ndarray) -> list[str]:
    truth = float32_truth(op, x)
    nan = np.isnan(expected)
    if op == "Softplus":  # onnxruntime's log(exp(x) + 1) overflows where softplus is x: kernorch returns x
        overflow = np.isinf(expected) & np.isfinite(x)
        expected = np.where(overflow, x, expected)
    with np.errstate(all="ignore"):
        wide = expected.astype(np.float64)
        close = np.abs(actual.astype(np.float64) - wide) <= 1e-4 * np.maximum(np.abs(wide), 1e-4)
    same = (actual == expected) | (nan & np.isnan(actual)) | (close & np.isfinite(actual) & ~nan)
    # saturated where onnxruntime and float32 both are: exactly that value (a cast, a comparison sees it)
    ends = [0.0, 1.0, -1.0, np.inf, -np.inf]
    saturated = np.isin(expected, ends) & (truth == expected)
    same &= ~saturated | (actual == expected)
    # and saturated only there: an end value where float32's is not one is a threshold in the wrong place (but
    # for the documented flush of tiny results to 0)
    with np.errstate(invalid="ignore"):
        slack = np.where(actual == 0, ZERO_SLACK[op], ONE_SLACK[op])
        near = np.abs(actual.astype(np.float64) - truth.astype(np.float64)) <= slack
    same &= ~np.isin(actual, ends) | (actual == truth) | near
    return [f"{op}({v!r}) = {a!r}, onnxruntime {e!r}, float32 {t!r}"
            for v, a, e, t in zip(x[~same], actual[~same], expected[~same], truth[~same], strict=True)]  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", "h100"])
def test_transcendental_functions_at_their_thresholds_match_onnxruntime(device: str) -> None:
    model, feeds = edge_model()
    expected = _onnxruntime(model, feeds)
    options = {"cost": "analytic", "rewrite": False}
    if device == "h100":
        pytest.importorskip("triton")
        options.update(device="h100", interpret=True)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", FallbackWarning)
        compiled = kernorch.compile(model, **options)
        outputs = compiled.run(feeds)
    if device == "cpu":  # the C spellings ran, not the reference kernels
        in_c = {o for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True) if b is GENERATED_C
                for o in k.outputs}  # fmt: skip
        assert set(THRESHOLDS) <= in_c, set(THRESHOLDS) - in_c
    problems = [p for op in THRESHOLDS for p in mismatches(op, feeds[f"x_{op}"], np.asarray(outputs[op]), expected[op])]
    assert not problems, "\n".join(problems[:20])


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    # each threshold of the fast float32 functions shifted by one unit (1.0) each way; the shifts that change no
    # output (the polynomial overflows, flushes or rounds to the same end there) are left out: equivalent mutants,
    # listed in tests/test_transcendental_edges.py
    here("threshold: exp overflows to inf one unit early",
         "y = x > 88.72284f ? INFINITY : y;",
         "y = x > 87.72284f ? INFINITY : y;",
         file="kernorch/codegen/c/prelude.py"),
    here("threshold: exp flushes to 0 one unit early",
         "return x < -87.33f ? 0.0f : y;",
         "return x < -86.33f ? 0.0f : y;",
         file="kernorch/codegen/c/prelude.py"),
    here("threshold: exp flushes to 0 one unit late",
         "return x < -87.33f ? 0.0f : y;",
         "return x < -88.33f ? 0.0f : y;",
         file="kernorch/codegen/c/prelude.py"),
    here("threshold: sigmoid's 0 end selected one unit early",
         "y = x < -88.0f ? 0.0f : y;",
         "y = x < -87.0f ? 0.0f : y;",
         file="kernorch/codegen/c/prelude.py"),
    here("threshold: sigmoid's 1 end selected one unit late",
         "return x > 88.0f ? 1.0f : y;",
         "return x > 89.0f ? 1.0f : y;",
         file="kernorch/codegen/c/prelude.py"),
    here("threshold: tanh's series reaches one unit further",
         "return a < 0.625f ? small : big;",
         "return a < 1.625f ? small : big;",
         file="kernorch/codegen/c/prelude.py"),
    here("threshold: erf's argument clamped one unit early",
         "clamped.i = magnitude < 0x4079999Au ? magnitude : 0x4079999Au;",
         "clamped.i = magnitude < 0x4039999Au ? magnitude : 0x4039999Au;",
         file="kernorch/codegen/c/prelude.py"),
    here("threshold: erf's argument clamped one unit late",
         "clamped.i = magnitude < 0x4079999Au ? magnitude : 0x4079999Au;",
         "clamped.i = magnitude < 0x409CCCCDu ? magnitude : 0x409CCCCDu;",
         file="kernorch/codegen/c/prelude.py"),
    here("threshold: Triton's tanh series reaches one unit further",
         "tl.where(ax < 0.04, near,",
         "tl.where(ax < 1.04, near,",
         file="kernorch/codegen/triton/expr.py"),
]  # fmt: skip
