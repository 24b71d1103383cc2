"""Fused attention (native/attention.py): found where an attention is, chosen when cheaper, and equal to
onnxruntime for vit's (projection split into Q, K, V, Q scaled), bert's (an additive mask from an input) and a
causal mask's shapes, odd sequence lengths (the padded keys, the last partial block of query rows), several heads
and batch items, bfloat16 operands, and edge values (a row masked with -inf everywhere: NaN as onnxruntime)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.backends import withheld
from kernorch.codegen.native.attention import BACKEND, Attention, match_attention
from kernorch.devtools.mutate import here
from kernorch.machine import bf16_supported
from kernorch.runtime.compiled import CompiledModel
from kernorch.testing import cpu_compile, random_array
from kernorch.tools.check import run_onnxruntime

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`


def attention_model(tokens: int, heads: int, head_dim: int, batch: int = 1, mask: str = "none",
                    scale_query: bool = True, nan_guard: bool = False) -> onnx.ModelProto:  # fmt: skip
    """x [B, T, C] → QKV projection → split into heads → softmax(Q·Kᵀ·s + mask)·V → merge heads → projection.
    mask: "none", "input" (an additive [B, 1, 1, T] input, bert's) or "causal" (a constant [1, 1, T, T]);
    nan_guard: the softmax's NaN (a fully masked row) replaced by 0 before ·V, as torch's exports do."""
    channels = heads * head_dim
    scale = np.float32(head_dim**-0.5)
    inits = [numpy_helper.from_array(random_array((channels, 3 * channels), seed=1) * 0.2, "w_qkv"),
             numpy_helper.from_array(random_array((channels, channels), seed=2) * 0.2, "w_out"),
             numpy_helper.from_array(np.array([batch, tokens, 3, heads, head_dim], np.int64), "shape5"),
             numpy_helper.from_array(np.array([batch, tokens, channels], np.int64), "shape3"),
             numpy_helper.from_array(np.array(scale, np.float32), "scale")]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"]),
             helper.make_node("Reshape", ["qkv", "shape5"], ["qkv5"]),
             helper.make_node("Transpose", ["qkv5"], ["qkvt"], perm=[2, 0, 3, 1, 4]),
             helper.make_node("Split", ["qkvt"], ["q1", "k1", "v1"], axis=0, num_outputs=3),
             *(helper.make_node("Squeeze", [f"{n}1", "zero"], [f"{n}0"]) for n in "qkv"),
             helper.make_node("Transpose", ["k0"], ["kt"], perm=[0, 1, 3, 2])]  # fmt: skip
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "zero"))
    if scale_query:
        nodes += [helper.make_node("Mul", ["q0", "scale"], ["q"]), helper.make_node("MatMul", ["q", "kt"], ["s0"])]
    else:
        nodes += [helper.make_node("MatMul", ["q0", "kt"], ["s1"]), helper.make_node("Mul", ["s1", "scale"], ["s0"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, tokens, channels))]
    scores = "s0"
    if mask == "input":  # bert's: 1 where attended, 0 where padded, made additive in the graph, added first
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, (batch, 1, 1, tokens)))
        inits += [numpy_helper.from_array(np.array(1, np.float32), "one"),
                  numpy_helper.from_array(np.array(-1e4, np.float32), "big")]  # fmt: skip
        nodes += [helper.make_node("Sub", ["one", "mask"], ["padded"]),
                  helper.make_node("Mul", ["padded", "big"], ["additive"]),
                  helper.make_node("Add", ["additive", "s0"], ["s"])]  # fmt: skip
        scores = "s"
    elif mask == "causal":
        causal = np.triu(np.full((tokens, tokens), -1e4, np.float32), 1)[None, None]
        inits.append(numpy_helper.from_array(causal, "causal"))
        nodes.append(helper.make_node("Add", ["causal", "s0"], ["s"]))
        scores = "s"
    nodes.append(helper.make_node("Softmax", [scores], ["p0" if nan_guard else "p"], axis=-1))
    if nan_guard:
        inits.append(numpy_helper.from_array(np.array([0], np.float32), "zero_f"))
        nodes += [helper.make_node("IsNaN", ["p0"], ["isnan"]),
                  helper.make_node("Where", ["isnan", "zero_f", "p0"], ["p"])]  # fmt: skip
    nodes += [helper.make_node("MatMul", ["p", "v0"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "shape3"], ["o3"]),
              helper.make_node("MatMul", ["o3", "w_out"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def feeds_of(model: onnx.ModelProto, seed: int = 3) -> dict[str, np.ndarray]:
    feeds = {}
    for value in model.graph.input:
        shape = tuple(d.dim_value for d in value.type.tensor_type.shape.dim)
        feeds[value.name] = random_array(shape, seed=seed)
    if "mask" in feeds:  # bert's mask: 1 where attended, 0 where padded
        feeds["mask"] = (feeds["mask"] > -0.5).astype(np.float32)
    return feeds


def fused_kernels(compiled: CompiledModel) -> list[Attention]:
    """What each fused-attention kernel of the plan computes."""
    found = [match_attention(k) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
             if b is BACKEND]  # fmt: skip
    assert all(isinstance(f, Attention) for f in found), found
    return [f for f in found if isinstance(f, Attention)]


CASES: dict[str, dict[str, Any]] = {
    "vit: Q scaled, 197 tokens, 3 heads": dict(tokens=197, heads=3, head_dim=64),
    "scores scaled, odd length": dict(tokens=13, heads=2, head_dim=16, scale_query=False),
    "bert: an input mask, batch 2": dict(tokens=40, heads=4, head_dim=32, batch=2, mask="input"),
    "causal mask, 70 tokens": dict(tokens=70, heads=2, head_dim=48, mask="causal"),
    "torch's NaN guard after the softmax": dict(tokens=33, heads=2, head_dim=16, mask="input", nan_guard=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_attention_is_chosen_and_equals_onnxruntime(case: str) -> None:
    model = attention_model(**CASES[case])
    feeds = feeds_of(model)
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=True)
    fused = fused_kernels(compiled)
    assert len(fused) == 1, [b.name for b in compiled.executor.backends]
    spec = CASES[case]
    assert (fused[0].lq, fused[0].lk, fused[0].dv) == (spec["tokens"],) * 2 + (spec["head_dim"],)
    expected = run_onnxruntime(model, feeds)["y"]
    np.testing.assert_allclose(compiled.run(feeds)["y"], expected, rtol=1e-4, atol=1e-5 * float(np.abs(expected).max()))


@pytest.mark.skipif(not bf16_supported(), reason="bf16 mode needs AVX512-BF16 or AMX")
def test_a_bf16_plans_attention_fuses_its_operand_casts() -> None:
    """In a bf16 plan the attention's matmul operands are cast to bfloat16 (kernorch/precision/); the fused kernel
    absorbs the casts and multiplies them rounded on AMX tiles, or in float32 without AMX (AVX512-BF16's vdpbf16ps,
    tried, ran slower than float32 FMAs on the Xeon of 2026-11-27: one per cycle; attention_amx_test checks the
    tiles' arithmetic): its error against onnxruntime is at most the bf16 plan's own (the same plan
    without the fused kernel)."""
    model = attention_model(tokens=128, heads=4, head_dim=64)
    feeds = feeds_of(model)
    expected = run_onnxruntime(model, feeds)["y"]
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=True, precision="bf16")
    (fused,) = fused_kernels(compiled)
    assert fused.q.prologue == (("mul", float(np.float32(64**-0.5))),) and fused.bf16_products
    kernels = [k for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True) if b is BACKEND]
    assert sum(n.prim == "cast" for n in kernels[0].primitives) == 4  # Q, Kᵀ, V and the softmax
    error = np.abs(compiled.run(feeds)["y"] - expected).max()
    with withheld(BACKEND):
        unfused = cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=True, precision="bf16")
    assert not fused_kernels(unfused)
    bf16_error = np.abs(unfused.run(feeds)["y"] - expected).max()
    assert error <= 1.25 * bf16_error + 1e-3 * np.abs(expected).max(), (error, bf16_error)
    assert error < 5e-2 * np.abs(expected).max()


def test_torchs_nan_guard_gives_a_fully_masked_row_zeros() -> None:
    """With where(isnan(P), 0, P) between the softmax and ·V (transformers' exports), a batch item masked -inf
    everywhere gets zeros, not NaN, as onnxruntime; the fused kernel divides and guards each weight."""
    model = attention_model(tokens=21, heads=2, head_dim=16, batch=2, mask="input", nan_guard=True)
    feeds = feeds_of(model)
    feeds["mask"][1] = -np.inf
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=True)
    (fused,) = fused_kernels(compiled)
    assert fused.weight_expr is not None and not fused.divide_after
    expected = run_onnxruntime(model, feeds)["y"]
    actual = compiled.run(feeds)["y"]
    assert np.isfinite(expected).all() and np.isfinite(actual).all()
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * float(np.abs(expected).max()))


def test_edge_values_large_scores_and_a_fully_masked_row() -> None:
    """Scores in the hundreds (exp overflows unless the row max is subtracted first) and one batch item whose keys
    are all masked with -inf (a mask input of -inf: onnxruntime's softmax gives NaN there, so does the fused
    kernel)."""
    model = attention_model(tokens=37, heads=2, head_dim=32, batch=2, mask="input")
    feeds = feeds_of(model)
    feeds["x"] = feeds["x"] * np.float32(40)
    feeds["mask"][1] = -np.inf  # (1 + inf) · -1e4 = -inf on every key
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=True)
    assert len(fused_kernels(compiled)) == 1
    expected = run_onnxruntime(model, feeds)["y"]
    actual = compiled.run(feeds)["y"]
    assert np.isnan(expected[1]).all() and np.isnan(actual[1]).all()
    assert np.isfinite(expected[0]).all()
    np.testing.assert_allclose(actual[0], expected[0], rtol=1e-4, atol=1e-5 * float(np.abs(expected[0]).max()))


def separate_qkv_model(tokens: int, heads: int, head_dim: int, value_dim: int, keys_first: bool) -> onnx.ModelProto:
    """softmax(Q·Kᵀ·s)·V on Q, K and V as graph inputs. keys_first: Kᵀ is the input, laid out [heads, D, T] (the
    keys contiguous, as a plan that transposed K in an earlier kernel leaves them); else K [heads, T, D] transposed
    in the graph (the head dim contiguous, as the QKV projection's split leaves it)."""
    k_shape = (1, heads, head_dim, tokens) if keys_first else (1, heads, tokens, head_dim)
    shapes = {"q": (1, heads, tokens, head_dim), "k": k_shape, "v": (1, heads, tokens, value_dim)}
    nodes = [] if keys_first else [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    nodes += [helper.make_node("MatMul", ["q", "k" if keys_first else "kt"], ["s0"]),
              helper.make_node("Mul", ["s0", "scale"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"])]  # fmt: skip
    scale = numpy_helper.from_array(np.array(head_dim**-0.5, np.float32), "scale")
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                                   for n, s in shapes.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [scale])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize(("tokens", "head_dim", "keys_first"), [(19, 32, True), (40, 32, True), (19, 24, False),
                                                                (37, 40, False)])  # fmt: skip
def test_kt_is_packed_along_its_contiguous_axis(tokens: int, head_dim: int, keys_first: bool) -> None:
    """Kᵀ is packed along its contiguous axis: the keys' rows copied when the keys are contiguous, 16 x 16 tiles
    transposed when the head dim is — here with a last tile of the head dim partly filled (24, 40) and of the keys
    (19, 37)."""
    model = separate_qkv_model(tokens=tokens, heads=3, head_dim=head_dim, value_dim=32, keys_first=keys_first)
    feeds = feeds_of(model)
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=True)
    (fused,) = fused_kernels(compiled)
    strides = (fused.kt.row_stride, fused.kt.col_stride)
    assert strides == ((tokens, 1) if keys_first else (1, head_dim)), strides
    expected = run_onnxruntime(model, feeds)["y"]
    np.testing.assert_allclose(compiled.run(feeds)["y"], expected, rtol=1e-4, atol=1e-5 * float(np.abs(expected).max()))


@pytest.mark.parametrize("isa", [("-mavx2", "-mfma"), ("-mavx512f",)])
@pytest.mark.parametrize("case", ["vit: Q scaled, 197 tokens, 3 heads", "torch's NaN guard after the softmax"])
def test_the_same_source_compiles_for_avx2_and_avx512(case: str, isa: tuple[str, ...], tmp_path: Path) -> None:
    """The register blocking follows the vector width (#if on KO_VC_LANES): both branches must compile, though
    only this machine's runs in the tests above."""
    from kernorch.codegen.c.prelude import PRELUDE
    from kernorch.codegen.native.attention import render_attention

    compiled = cpu_compile(attention_model(**CASES[case]), cost="analytic", device="cpu-nominal", rewrite=True)
    (kernel,) = [k for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True) if b is BACKEND]
    source = tmp_path / "attention.c"
    source.write_text(PRELUDE + render_attention("k", kernel))
    subprocess.run(["cc", "-fsyntax-only", "-std=gnu11", "-fopenmp", *isa, "-Werror=implicit-function-declaration",
                    str(source)], check=True)  # fmt: skip


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("an attention's mask added first is taken for its scores",
         "scores = a if from_matmul(a) else b",
         "scores = a",
         file="kernorch/orchestrate/attention_sets.py"),
    here("fused attention drops torch's NaN guard on the weights",
         "const float w = sr[j] / l; sr[j] = {a.weight_expr};",
         "const float w = sr[j] / l; sr[j] = w;"),
    here("fused attention's softmax skips the row max",
         "m = v > m ? v : m;",
         "m = 0.0f;"),
    here("fused attention reads Q without its scaling",
         "for op, scalar in operand.prologue:",
         "for op, scalar in ():"),
    here("fused attention drops the keys of the last partial block",
         "for (; j < LKP; j += KO_VC_LANES * (",
         "for (; j < LKP - KO_VC_LANES; j += KO_VC_LANES * ("),
    here("fused attention packs Kᵀ's contiguous keys short of the last",
         "for (int64_t j = 0; j < LK; j++) kt[d * LKP + j] = {load_k};",
         "for (int64_t j = 0; j < LK - 1; j++) kt[d * LKP + j] = {load_k};"),
    here("fused attention's last Kᵀ tile drops a column of the head dim",
         "const int64_t dn = HD - d0 < 16 ? HD - d0 : 16;",
         "const int64_t dn = HD - d0 < 16 ? HD - d0 - 1 : 16;"),
    here("fused attention's Kᵀ tiles are copied without their transpose",
         "kt[(d0 + dd) * LKP + j0 + jj] = tile[jj][dd];",
         "kt[(d0 + dd) * LKP + j0 + jj] = tile[dd][jj];"),
]  # fmt: skip
