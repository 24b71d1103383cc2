"""The fused attention's AMX path (native/attention_amx.py): in a bf16 plan it multiplies the bfloat16-rounded Q,
Kᵀ, V and weights on tiles. Checked against a numpy model of exactly that arithmetic (operands rounded to bfloat16,
products summed in float32 or better, E rounded to bfloat16, the output divided by the row sums) tightly enough
that the float32 path (which multiplies unrounded operands) would fail: so on an AMX machine these tests also
prove the tiles ran. Shapes cover every tail: keys not a multiple of 16 or 32, a head dim padded to 32, value
head dims of one, three and eight 16-column tiles, a last block of fewer than 16 query rows."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kernorch.pipeline
from kernorch.codegen.native.attention_test import fused_kernels
from kernorch.devtools.mutate import here
from kernorch.machine import isa_flags
from kernorch.precision import choose_precision
from kernorch.runtime.compiled import CompiledModel
from kernorch.testing import cpu_compile, random_array
from kernorch.tools.check import run_onnxruntime

pytestmark = [pytest.mark.sanitize,  # under the sanitizers in `make sanitize`
              pytest.mark.skipif("amx_bf16" not in isa_flags(), reason="the AMX path needs AMX-BF16 tiles")]


def bf16_plan(model: onnx.ModelProto, monkeypatch: pytest.MonkeyPatch) -> CompiledModel:
    """The model's bf16 plan with both matmuls in bf16 (the precision stage without prices: as `check`'s reference
    run; priced, small heads stay float32), the fused attention chosen (analytic costs)."""
    monkeypatch.setattr(kernorch.pipeline, "choose_precision",
                        lambda graph, _, precision: choose_precision(graph, None, precision))
    return cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=True, precision="bf16")


def attention_only(batch: int, heads: int, tokens: int, head_dim: int, value_dim: int, mask: str,
                   nan_guard: bool = False) -> onnx.ModelProto:  # fmt: skip
    """softmax(q·kᵀ·s + mask)·v from inputs q, k [B, H, T, D] and v [B, H, T, Dv]; mask "none", "input" (an
    additive [B, 1, 1, T] input) or "causal" (a constant); nan_guard: where(isnan(P), 0, P) before ·v."""
    qk = (batch, heads, tokens, head_dim)
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, qk),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, qk),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, (batch, heads, tokens, value_dim))]  # fmt: skip
    inits = [numpy_helper.from_array(np.array(head_dim**-0.5, np.float32), "scale")]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Mul", ["s0", "scale"], ["s1"])]  # fmt: skip
    scores = "s1"
    if mask == "input":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, (batch, 1, 1, tokens)))
        nodes.append(helper.make_node("Add", ["s1", "mask"], ["s"]))
        scores = "s"
    elif mask == "causal":
        inits.append(numpy_helper.from_array(causal_mask(tokens)[None, None], "causal"))
        nodes.append(helper.make_node("Add", ["s1", "causal"], ["s"]))
        scores = "s"
    nodes.append(helper.make_node("Softmax", [scores], ["p0" if nan_guard else "p"], axis=-1))
    if nan_guard:
        inits.append(numpy_helper.from_array(np.array([0], np.float32), "zero"))
        nodes += [helper.make_node("IsNaN", ["p0"], ["isnan"]),
                  helper.make_node("Where", ["isnan", "zero", "p0"], ["p"])]
    nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)  # fmt: skip
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                                                               ir_version=8))  # fmt: skip


def causal_mask(tokens: int) -> np.ndarray:
    return np.triu(np.full((tokens, tokens), -1e4, np.float32), 1)


def bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def tile_arithmetic(feeds: dict[str, np.ndarray], mask: str, nan_guard: bool, divide_after: bool) -> np.ndarray:
    """What the AMX path computes: S from bf16 operands (float32 scores), the steps and softmax in float32, the
    weights rounded to bf16 where the graph rounds them — E when it divides the product (matmul(E, V) / l),
    else E / l, guarded when torch's guard is there."""
    q, k, v = bf16(feeds["q"]), bf16(feeds["k"]), bf16(feeds["v"])
    scores = (q @ np.swapaxes(k, -1, -2)).astype(np.float32) * np.float32(q.shape[-1] ** -0.5)
    if mask == "input":
        scores = scores + feeds["mask"]
    elif mask == "causal":
        scores = scores + causal_mask(q.shape[-2])
    e = np.exp(scores - scores.max(axis=-1, keepdims=True)).astype(np.float32)
    total = e.sum(axis=-1, keepdims=True, dtype=np.float32)
    if divide_after:
        return (bf16(e) @ v) / total
    weights = e / total
    return bf16(np.where(np.isnan(weights), 0, weights) if nan_guard else weights) @ v


CASES = {
    "vit: 197 keys, head dim 64, 3 heads": dict(batch=1, heads=3, tokens=197, head_dim=64, value_dim=64, mask="none"),
    "13 keys, head dims 16 padded to a tile": dict(batch=1, heads=2, tokens=13, head_dim=16, value_dim=16, mask="none"),
    "causal, 70 keys, value dim of three tiles": dict(batch=1, heads=2, tokens=70, head_dim=48, value_dim=48,
                                                      mask="causal"),
    "an input mask, batch 2, 40 keys": dict(batch=2, heads=4, tokens=40, head_dim=32, value_dim=32, mask="input"),
    "head dim 128, value dim of eight tiles": dict(batch=1, heads=2, tokens=129, head_dim=128, value_dim=128,
                                                   mask="none"),
    "the NaN guard: weights divided and rounded": dict(batch=1, heads=2, tokens=33, head_dim=32, value_dim=32,
                                                       mask="input", nan_guard=True),
}


def feeds_for(spec: dict[str, object], seed: int = 5) -> dict[str, np.ndarray]:
    model = attention_only(**spec)  # type: ignore[arg-type]
    feeds = {}
    for value in model.graph.input:
        feeds[value.name] = random_array(tuple(d.dim_value for d in value.type.tensor_type.shape.dim), seed=seed)
        seed += 1
    if "mask" in feeds:
        feeds["mask"] = np.where(feeds["mask"] > -0.5, 0, -1e4).astype(np.float32)
    return feeds


@pytest.mark.parametrize("case", list(CASES))
def test_tiles_multiply_the_rounded_operands(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = CASES[case]
    model = attention_only(**spec)  # type: ignore[arg-type]
    feeds = feeds_for(spec)
    compiled = bf16_plan(model, monkeypatch)
    (fused,) = fused_kernels(compiled)
    assert fused.bf16_products
    actual = compiled.run(feeds)["y"]
    expected = tile_arithmetic(feeds, str(spec["mask"]), bool(spec.get("nan_guard")), fused.divide_after)
    scale = float(np.abs(expected).max())
    # float32 sums in another order, and a rare E on a bf16 rounding tie; the float32 path is ~1e-2 away
    np.testing.assert_allclose(actual, expected, rtol=0, atol=2e-4 * scale)
    reference = run_onnxruntime(model, feeds)["y"]
    assert np.abs(actual - reference).max() < 2e-2 * float(np.abs(reference).max())


def test_float32_plans_keep_float32_products() -> None:
    """Without the bf16 plan's casts the kernel must not round: fp32 plans never take the tiles."""
    spec = CASES["vit: 197 keys, head dim 64, 3 heads"]
    model = attention_only(**spec)  # type: ignore[arg-type]
    feeds = feeds_for(spec)
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=True)
    (fused,) = fused_kernels(compiled)
    assert not fused.bf16_products
    reference = run_onnxruntime(model, feeds)["y"]
    scale = float(np.abs(reference).max())
    np.testing.assert_allclose(compiled.run(feeds)["y"], reference, rtol=1e-4, atol=1e-5 * scale)


def test_a_fully_masked_row_is_nan_as_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch item masked -inf on every key: onnxruntime's softmax gives NaN, so do the tiles' weights."""
    spec = CASES["an input mask, batch 2, 40 keys"]
    model = attention_only(**spec)  # type: ignore[arg-type]
    feeds = feeds_for(spec)
    feeds["mask"][1] = -np.inf
    compiled = bf16_plan(model, monkeypatch)
    assert fused_kernels(compiled)[0].bf16_products
    actual, expected = compiled.run(feeds)["y"], run_onnxruntime(model, feeds)["y"]
    assert np.isnan(expected[1]).all() and np.isnan(actual[1]).all()
    assert np.isfinite(actual[0]).all()


def test_keys_masked_with_minus_infinity_weigh_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Some keys masked -inf (exp(-inf) = 0 through the vscalefps exp's clamp) and scores in the hundreds (the
    row max keeps exp in range): equal to the tile arithmetic's model."""
    spec = CASES["an input mask, batch 2, 40 keys"]
    model = attention_only(**spec)  # type: ignore[arg-type]
    feeds = feeds_for(spec)
    feeds["mask"] = np.where(feeds["mask"] < 0, -np.inf, 0).astype(np.float32)
    feeds["q"] = feeds["q"] * np.float32(30)
    assert np.isinf(feeds["mask"]).any() and not np.isinf(feeds["mask"]).all(axis=-1).any()
    compiled = bf16_plan(model, monkeypatch)
    actual = compiled.run(feeds)["y"]
    expected = tile_arithmetic(feeds, "input", False, fused_kernels(compiled)[0].divide_after)
    assert np.isfinite(actual).all()
    np.testing.assert_allclose(actual, expected, rtol=0, atol=2e-4 * float(np.abs(expected).max()))


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("AMX attention skips the last block of keys or values",
         "for (; n < blocks; n++) {",
         "for (; n < blocks - 1; n++) {", file="kernorch/codegen/native/preambles.py"),
    here("AMX attention leaves divided weights out of the tiles",
         'f"if ({int(separately)} && r < rows)"',
         'f"if (0 && r < rows)"'),
    here("fused attention rounds the operands of a float32 plan",
         "weights_rounded and q.rounded and kt.rounded and v.rounded",
         "True",
         file="kernorch/codegen/native/attention.py"),
]  # fmt: skip
