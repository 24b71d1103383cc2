"""The int8 matmul (native/int8_matmul.py): chosen exactly where it applies (and why not elsewhere), equal to
onnxruntime's int32 sums bit for bit and its dequantized floats to rounding (onnx.reference's where onnxruntime's
own sums saturate: a CPU without VNNI), for uint8 and int8 rows at their
extremes, zero points at both ends, sizes that leave a short group of k, a short vector of columns and a short
block of rows (and 1 of each); and its scalar C (what a CPU without VNNI runs) equal to its VNNI path on the same
packed weights, both compiled and run here."""

from __future__ import annotations

import ctypes
import math
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.c import PRELUDE
from kernorch.codegen.native import int8_matmul
from kernorch.codegen.native.int8_matmul import Int8Matmul, Operand, Step, describe, render
from kernorch.codegen.program import ERROR_BUFFER
from kernorch.devtools.mutate import here
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.machine import isa_flags
from kernorch.testing import cpu_compile, exact_int8_outputs

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`

RNG = np.random.default_rng(5)
VNNI = "avx512_vnni" in isa_flags()
AMX_INT8 = "amx_int8" in isa_flags()
ON_AMX_TILES = int8_matmul.on_amx_tiles


@pytest.fixture(autouse=True)
def _kernorch_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """kernorch's kernel takes its matmuls on a CPU with AMX-INT8 too (in plans there oneDNN's tiles take those
    oneDNN runs: test_amx_tiles_take_the_product)."""
    monkeypatch.setattr(int8_matmul, "on_amx_tiles", lambda kernel: None)


def _extremes(values: np.ndarray) -> np.ndarray:
    """The array with its type's lowest and highest values planted at both ends of each row."""
    info = np.iinfo(values.dtype)
    values[..., 0], values[..., -1] = info.max, info.min
    return values


def _model(rows: tuple[int, ...], depth: int, columns: int, *, source: str = "uint8", zero: int = 131,
           weights: str = "int8", weights_zero: int = 0, epilogue: str = "dequantize") -> onnx.ModelProto:  # fmt: skip
    """MatMulInteger of a graph input by constant weights, then `epilogue`: "none" (the int32 sums), "dequantize"
    (cast, the product of the two scales, a per-column bias: dynamic quantization's), "per column" (the same by a
    scale per column), "swapped" (a column vector minus the sums, then a quotient by a scalar), "requantize"
    (dequantized, then QuantizeLinear to int8: a quotient, rounding, the zero point, saturation, the cast), "gelu"
    (dequantized, then BERT's GELU), or "relu" (a max no step takes)."""
    source_type = TensorProto.UINT8 if source == "uint8" else TensorProto.INT8
    info = np.iinfo(np.int8 if weights == "int8" else np.uint8)
    w = _extremes(RNG.integers(info.min, int(info.max) + 1, (depth, columns)).astype(weights))
    constants = {"w": w, "wz": np.asarray(weights_zero, weights), "xz": np.asarray(zero, source),
                 "scale": np.asarray(0.0123, np.float32), "bias": RNG.standard_normal(columns).astype(np.float32),
                 "zero": np.zeros((), np.float32)}  # fmt: skip
    nodes = [helper.make_node("MatMulInteger", ["x", "w", "xz", "wz"], ["acc"])]
    if epilogue != "none":
        nodes.append(helper.make_node("Cast", ["acc"], ["f"], to=TensorProto.FLOAT))
    if epilogue == "dequantize":
        nodes += [helper.make_node("Mul", ["f", "scale"], ["g"]), helper.make_node("Add", ["g", "bias"], ["y"])]
    elif epilogue == "per column":  # a static QDQ file's: the weights' scale per output channel
        constants.update(scales=RNG.uniform(0.001, 0.02, columns).astype(np.float32))
        nodes += [helper.make_node("Mul", ["f", "scales"], ["g"]), helper.make_node("Add", ["g", "bias"], ["y"])]
    elif epilogue == "swapped":
        nodes += [helper.make_node("Sub", ["bias", "f"], ["g"]), helper.make_node("Div", ["g", "scale"], ["y"])]
    elif epilogue == "requantize":
        constants.update(ys=np.asarray(0.9, np.float32), yz=np.asarray(-5, np.int8))
        nodes += [helper.make_node("Mul", ["f", "scale"], ["g"]),
                  helper.make_node("QuantizeLinear", ["g", "ys", "yz"], ["y"])]  # fmt: skip
    elif epilogue == "gelu":  # dequantized, then BERT's GELU as torch exports it
        constants.update(root2=np.asarray(np.sqrt(2), np.float32), one=np.ones((), np.float32),
                         half=np.asarray(0.5, np.float32))
        nodes += [helper.make_node("Mul", ["f", "scale"], ["g"]), helper.make_node("Add", ["g", "bias"], ["h"]),
                  helper.make_node("Div", ["h", "root2"], ["q"]), helper.make_node("Erf", ["q"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["h", "p"], ["r"]),
                  helper.make_node("Mul", ["r", "half"], ["y"])]  # fmt: skip
    elif epilogue == "relu":
        nodes += [helper.make_node("Max", ["f", "zero"], ["y"])]
    else:
        nodes[-1].output[0] = "y"
    out_type = {"none": TensorProto.INT32, "requantize": TensorProto.INT8}.get(epilogue, TensorProto.FLOAT)
    graph = helper.make_graph(nodes, "int8_matmul", [helper.make_tensor_value_info("x", source_type, [*rows, depth])],
                              [helper.make_tensor_value_info("y", out_type, [*rows, columns])],
                              [numpy_helper.from_array(v, k) for k, v in constants.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    x = model.graph.input[0]
    dtype = np.uint8 if x.type.tensor_type.elem_type == TensorProto.UINT8 else np.int8
    info = np.iinfo(dtype)
    shape = tuple(d.dim_value for d in x.type.tensor_type.shape.dim)
    return {"x": _extremes(RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype))}


def _compiled(model: onnx.ModelProto) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(kernorch's output, onnxruntime's, the backend of each kernel)."""
    feeds = _feeds(model)
    compiled = cpu_compile(model, cost="analytic")
    expected = exact_int8_outputs(model, feeds)["y"]
    return compiled.run(feeds)["y"], expected, [b.name for b in compiled.executor.backends]


SHAPES: dict[str, dict[str, Any]] = {
    "bert_mini's query: 128 x 256 x 256": dict(rows=(1, 128), depth=256, columns=256),
    "short k group, short vector, short row block": dict(rows=(2, 25), depth=77, columns=130),
    "one of each": dict(rows=(1,), depth=1, columns=1),
    "k past AVX2's widened chunk, odd": dict(rows=(5,), depth=1031, columns=9),
    "int8 rows, zero point at the top": dict(rows=(7,), depth=33, columns=17, source="int8", zero=127),
    "int8 rows, zero point at the bottom": dict(rows=(3, 5), depth=64, columns=64, source="int8", zero=-128),
    "uint8 weights around 128": dict(rows=(13,), depth=40, columns=70, weights="uint8", weights_zero=128, zero=0),
    "int8 rows, prime sizes, zero point at the top": dict(rows=(2, 31), depth=97, columns=67, source="int8", zero=127),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SHAPES))
@pytest.mark.parametrize("epilogue", ["none", "dequantize", "per column", "swapped", "requantize", "gelu"])
def test_equals_onnxruntime(case: str, epilogue: str) -> None:
    got, expected, backends = _compiled(_model(**SHAPES[case], epilogue=epilogue))
    assert backends == ["int8_matmul"]  # the whole epilogue in the one kernel
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if epilogue in ("none", "requantize"):  # integers; the quotient before rounding is the same IEEE division
        np.testing.assert_array_equal(got, expected)
    else:  # the same float operations; a product and a sum may be contracted into one rounding; erf's error 4e-7
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6 * float(np.abs(expected).max()))


@pytest.mark.skipif(not AMX_INT8, reason="oneDNN's int8 matmul takes the product from kernorch's only on AMX-INT8")
@pytest.mark.parametrize("case", ["bert_mini's query: 128 x 256 x 256", "short k group, short vector, short row block",
                                  "int8 rows, prime sizes, zero point at the top"])
@pytest.mark.parametrize("epilogue", ["none", "dequantize", "per column", "requantize"])
def test_amx_tiles_take_the_product(case: str, epilogue: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # (a small product, 7x33x17 or 1x1x1, oneDNN runs without the tiles: kernorch's kernel keeps it)
    monkeypatch.setattr(int8_matmul, "on_amx_tiles", ON_AMX_TILES)
    got, expected, backends = _compiled(_model(**SHAPES[case], epilogue=epilogue))
    assert "onednn" in backends and "int8_matmul" not in backends, backends
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if epilogue == "none":
        np.testing.assert_array_equal(got, expected)
    elif epilogue == "requantize":  # oneDNN scales the sums once by the product of the scales: one step at most
        assert np.abs(got.astype(np.int32) - expected.astype(np.int32)).max() <= 1
    else:
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6 * float(np.abs(expected).max()))


@pytest.mark.parametrize("change, reason, product_taken", [
    (dict(weights="uint8", weights_zero=0), "does not fit int8", False),
    (dict(epilogue="relu"), "max in the epilogue", True),  # the product alone, the max in generated C
])  # fmt: skip
def test_declines_with_its_reason(change: dict[str, Any], reason: str, product_taken: bool) -> None:
    model = _model((4,), 8, 16, **change)
    compiled = cpu_compile(model, cost="analytic")
    (kernel,) = [k for k in compiled.kernels if k.primitives[0].prim == "matmul_integer"]
    assert reason in str(describe(_whole(kernel)))
    # the product alone on kernorch's kernel, or with the max as a post-op on oneDNN's int8 matmul
    assert bool({"int8_matmul", "onednn"} & {b.name for b in compiled.executor.backends}) == product_taken
    feeds = _feeds(model)
    np.testing.assert_allclose(compiled.run(feeds)["y"], exact_int8_outputs(model, feeds)["y"], rtol=1e-6)


def _whole(kernel: CandidateKernel) -> CandidateKernel:
    """The kernel with every node after the product (the whole epilogue)."""
    graph = kernel.graph
    first = kernel.nodes[0]
    nodes = tuple(range(first, len(graph.nodes)))
    return make_kernel(graph, nodes, (graph.nodes[-1].outputs[0],))


def run_library(source: str, isa: str, directory: Path, arrays: list[np.ndarray]) -> None:
    """Compile `source` (kernel `k`) for `isa`, create its state and run it once on `arrays` (the last written)."""
    path = directory / f"k_{isa}.c"
    path.write_text(ERROR_BUFFER + PRELUDE + source +
                    "void *ko_create(void **a) { return k_create(0, 0, a); }\n"
                    "int ko_run(void *s, void **a) { return k_run(s, 0, a); }\n"
                    "void ko_destroy(void *s) { k_destroy(s); }\n")  # fmt: skip
    library = directory / f"k_{isa}.so"
    subprocess.run(["cc", "-O2", f"-march={isa}", "-fopenmp", "-fPIC", "-shared", "-std=gnu11",
                    "-Werror=implicit-function-declaration", str(path), "-o", str(library)], check=True)  # fmt: skip
    lib = ctypes.CDLL(str(library))
    lib.ko_create.restype = ctypes.c_void_p
    lib.ko_create.argtypes = [ctypes.c_void_p]
    lib.ko_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.ko_destroy.argtypes = [ctypes.c_void_p]
    pointers = (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))
    state = lib.ko_create(pointers)
    assert state
    assert lib.ko_run(state, pointers) == 0
    lib.ko_destroy(state)


def _sums_to_int8(scale: int, low: int, high: int) -> tuple[Step, ...]:
    """cast, quotient by input `scale`, round, saturate by compares and selects against inputs `low` and `high`,
    cast to int8: a requantization as the QuantizeLinear rule writes it."""
    def step(index: int) -> Operand:
        return Operand("step", index)

    return (Step("cast", (Operand("sums"),), "float32"), Step("div", (step(0), Operand("input", scale)), "float32"),
            Step("round", (step(1),), "float32"), Step("greater", (step(2), Operand("input", low)), "bool"),
            Step("where", (step(3), step(2), Operand("input", low)), "float32"),
            Step("less", (step(4), Operand("input", high)), "bool"),
            Step("where", (step(5), step(4), Operand("input", high)), "float32"), Step("cast", (step(6),), "int8"))


def _saturating_round_to_int8() -> tuple[Step, ...]:
    """The requantization as the QuantizeLinear rule writes it now: the quotient, one saturating round with the
    zero point (here input 5, one per column) and bounds (inputs 6 and 7), the cast."""
    return (Step("cast", (Operand("sums"),), "float32"),
            Step("div", (Operand("step", 0), Operand("input", 4)), "float32"),
            Step("saturating_round", (Operand("step", 1), Operand("input", 5, per_column=True), Operand("input", 6),
                                      Operand("input", 7)), "float32"),
            Step("cast", (Operand("step", 2),), "int8"))


EPILOGUES: dict[str, tuple[Step, ...]] = {
    "none": (),
    "dequantize, swapped difference": (Step("cast", (Operand("sums"),), "float32"),
                                       Step("mul", (Operand("step", 0), Operand("input", 4)), "float32"),
                                       Step("sub", (Operand("input", 5, per_column=True), Operand("step", 1)),
                                            "float32")),
    "dequantize, erf": (Step("cast", (Operand("sums"),), "float32"),
                        Step("mul", (Operand("step", 0), Operand("input", 4)), "float32"),
                        Step("erf", (Operand("step", 1),), "float32")),
    "requantize to int8": _sums_to_int8(4, 6, 7),
    "requantize by a zero scale (NaN and infinities saturate)": _sums_to_int8(4, 6, 7),
    "requantize in one saturating round, a zero point per column": _saturating_round_to_int8(),
    "requantize in one saturating round by a zero scale, a zero point per column": _saturating_round_to_int8(),
}  # fmt: skip


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("epilogue", list(EPILOGUES))
def test_scalar_c_equals_the_vnni_path(tmp_path: Path, signed: bool, epilogue: str) -> None:
    """The scalar path (compiled for x86-64: no AVX2) against the reference, and the AVX2 path (x86-64-v3) and the
    VNNI path (where this CPU has it) against the scalar one, bit for bit."""
    steps = EPILOGUES[epilogue]
    rows, depth, columns = 11, 30, 35
    dtype = np.int8 if signed else np.uint8
    info = np.iinfo(dtype)
    x = _extremes(RNG.integers(info.min, int(info.max) + 1, (rows, depth)).astype(dtype))
    w = RNG.integers(-130, 126, (depth, columns)).clip(-128).astype(np.int8)  # centred on -2: -126 to 127
    zero, wz = np.asarray(info.max // 3, dtype), np.asarray(-2, np.int8)
    x[0] = zero  # a row of zero sums: 0 / 0 is NaN with a zero scale
    # an even scale: odd sums land halfway between two integers (ties to even); far sums saturate
    scale = np.asarray(0.0 if "zero scale" in epilogue else 2.0 if "requantize" in epilogue else
                       2.0**-14 if "erf" in epilogue else 0.5, np.float32)  # erf's: sums to about ±3  # fmt: skip
    vector = RNG.standard_normal(columns).astype(np.float32)
    low, high = np.asarray(-128, np.float32), np.asarray(127, np.float32)
    sums = ((x.astype(np.int64) - int(zero)) @ (w.astype(np.int64) - int(wz))).astype(np.int32)
    with np.errstate(divide="ignore", invalid="ignore"):
        rounded = np.round(sums.astype(np.float32) / scale)
    if "zero point per column" in epilogue:
        rounded = rounded + vector
    above = np.where(rounded > -128, rounded, np.float32(-128))  # NaN: the lowest value, as the selects give it
    saturated = np.where(above < 127, above, np.float32(127)).astype(np.int8)
    expected: np.ndarray = saturated if "requantize" in epilogue else sums if epilogue == "none" else \
        np.vectorize(math.erf)(sums * float(scale)).astype(np.float32) if "erf" in epilogue else \
        vector - sums.astype(np.float32) * scale  # fmt: skip
    spec = Int8Matmul(rows=rows, depth=depth, columns=columns, signed=signed, src=0, src_zero=1, weights=2,
                      weights_type="int8", weights_zero=3, weights_zero_per_column=False, dst=8, steps=steps)
    outputs = {}
    for isa in ("x86-64", "x86-64-v3", *(("native",) if VNNI else ())):
        out = np.zeros((rows, columns), expected.dtype)
        run_library(render("k", spec), isa, tmp_path, [x, zero, w, wz, scale, vector, low, high, out])
        outputs[isa] = out
    if "erf" in epilogue:  # the prelude's erf (error < 4e-7), its polynomials contracted where FMA is targeted
        assert 0.1 < np.abs(expected).mean() < 0.9  # the sums spread over erf's curve, not only its tails
        for out in outputs.values():
            np.testing.assert_allclose(out, expected, rtol=0, atol=5e-7)
        return
    np.testing.assert_array_equal(outputs["x86-64"], expected)
    np.testing.assert_array_equal(outputs["x86-64-v3"], outputs["x86-64"])
    if VNNI:
        np.testing.assert_array_equal(outputs["native"], outputs["x86-64"])
    if epilogue == "requantize to int8":
        assert np.abs(sums % 2).max() == 1 and np.abs(sums / 2).max() > 127  # ties and saturation were exercised
    if "zero scale" in epilogue:
        assert (sums == 0).any() and (expected == -128).any() and (expected == 127).any()  # 0/0 = NaN, ±inf


MUTANTS = [
    here("the zero point's column sums not subtracted", "_mm512_sub_epi32(c{r}_{j}, zc)", "c{r}_{j}"),
    here("int8 rows read without the sign flip", "f'_mm512_xor_si512({load}, flip)' if spec.signed else load",
         "load"),
    here("the last k group's bytes shifted", "(uint32_t)row{r}[g * 4 + {t}] << {8 * t}",
         "(uint32_t)row{r}[g * 4 + {t}] << {8 * t + 8}"),
    here("the weights' zero point ignored", "(int32_t)b[k * {spec.columns} + n] - (int32_t){zero}",
         "(int32_t)b[k * {spec.columns} + n]"),
    here("the short vector stored whole", "(__mmask16)((1u << ({spec.columns} - n)) - 1)", "(__mmask16)0xFFFF",
         needs="avx512f"),
    here("a select's branches swapped (AVX-512)", 'select="_mm512_mask_blend_ps({mask}, {no}, {yes})"',
         'select="_mm512_mask_blend_ps({mask}, {yes}, {no})"', needs="avx512f"),
    here("a select's branches swapped (AVX2)", 'select="_mm256_blendv_ps({no}, {yes}, {mask})"',
         'select="_mm256_blendv_ps({yes}, {no}, {mask})"'),
    here("rounding toward zero (AVX-512)", "_mm512_roundscale_ps({x}, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)",
         "_mm512_roundscale_ps({x}, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC)", needs="avx512f"),
    here("rounding toward zero (AVX2)", "_mm256_round_ps({x}, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)",
         "_mm256_round_ps({x}, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC)"),
    here("a compare true on NaN", '"greater": "_CMP_GT_OQ"', '"greater": "_CMP_GT_UQ"'),
    here("a saturating round keeps NaN", "{isa.prefix}_max_ps({isa.prefix}_add_ps({rounded}, {x[1]}), {x[2]})",
         "{isa.prefix}_max_ps({x[2]}, {isa.prefix}_add_ps({rounded}, {x[1]}))"),
    here("a saturating round without its offset", "{isa.prefix}_add_ps({rounded}, {x[1]})", "{rounded}"),
    here("AVX2's rows widened with their zero point", "(int32_t)(row{r}[k0 + k]{flip}) - za)",
         "(int32_t)(row{r}[k0 + k]{flip}))"),
    here("AVX2's weights read from the first chunk of k", "({j * pairs}L + k0 / 2 + p)", "({j * pairs}L + p)"),
    here("AVX2's short vector stored whole", "_mm256_set1_epi32(count)", "_mm256_set1_epi32(8)"),
    here("AVX2's 8-bit results stored from the wrong bytes", "_mm256_setr_epi8(0, 4, 8, 12, -1",
         "_mm256_setr_epi8(1, 5, 9, 13, -1"),
    here("uint8 weights beyond int8 taken", "if centred.size and (centred.min() < -128 or centred.max() > 127):",
         "if centred.size and (centred.min() < -256 or centred.max() > 255):"),
    here("a transcendental step's vector maps one lane too few", "for (int i = 0; i < {isa.lanes}; i++)",
         "for (int i = 1; i < {isa.lanes}; i++)"),
    here("oneDNN's int8 matmul scales along its rows", "return 1 << (len(call.weights.dims) - 1)",
         "return 1 << (len(call.weights.dims) - 2)", file="kernorch/codegen/library/onednn.py",
         needs="amx_int8"),
    here("the tiles take an int8 matmul oneDNN runs without them", '"amx" in implementation else None',
         '"amx" not in implementation else None', needs="amx_int8"),
    here("the scalar path skips a transcendental step", 'value = f"{_LANEWISE[step.prim]}({x[0]})"',
         'value = f"{x[0]}"'),
]  # fmt: skip
