"""The vectorizable float32 exp/tanh/erf/sigmoid of the generated C, against float64 references."""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from kernorch.codegen.c.prelude import PRELUDE
from kernorch.codegen.program.compiler import compile_source, load_library
from kernorch.devtools.mutate import here

SOURCE = PRELUDE + """
void apply(const float *x, float *e, float *t, float *r, float *s, long n) {
    for (long i = 0; i < n; i++) { e[i] = ko_expf(x[i]); t[i] = ko_tanhf(x[i]); r[i] = ko_erff(x[i]);
                                   s[i] = ko_sigmoidf(x[i]); }
}
"""


def test_float32_math_accuracy_and_special_values() -> None:
    library = load_library(compile_source(SOURCE))
    x = np.concatenate([np.linspace(-120, 100, 200_001), np.linspace(-3, 3, 100_001),
                        [0.0, -0.0, 1e-30, -1e-8, np.inf, -np.inf, np.nan]]).astype(np.float32)  # fmt: skip
    outputs = [np.empty_like(x) for _ in range(4)]
    library.apply(*(ctypes.c_void_p(a.ctypes.data) for a in (x, *outputs)), ctypes.c_long(len(x)))
    wide = x.astype(np.float64)
    with np.errstate(all="ignore"):
        references = [np.exp(wide), np.tanh(wide), torch.erf(torch.from_numpy(wide)).numpy(), 1 / (1 + np.exp(-wide))]
    limits = {"exp": (2e-7, None), "tanh": (None, 2e-7), "erf": (None, 5e-7), "sigmoid": (None, 2e-7)}
    for (name, (max_rel, max_abs)), got, ref in zip(limits.items(), outputs, references, strict=True):
        representable = np.isfinite(ref) & (np.abs(ref) > 1e-37) & (np.abs(ref) < 3.4e38)
        error = np.abs(got[representable] - ref[representable])
        if max_rel is not None:
            assert (error / np.abs(ref[representable])).max() < max_rel, name
        if max_abs is not None:
            assert error.max() < max_abs, name
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=name)
        if name in ("tanh", "erf"):  # a cast to an integer must see exactly ±1 where float32 has it
            saturated = np.abs(ref.astype(np.float32)) == 1
            np.testing.assert_array_equal(got[saturated], ref[saturated].astype(np.float32), err_msg=name)
        overflow = ~np.isnan(ref) & (np.abs(ref) > np.finfo(np.float32).max)
        np.testing.assert_array_equal(got[overflow], np.float32(np.inf), err_msg=name)
    # the sigmoid selects its ends where its 2^n would wrap: exactly 0 and 1 there (swish's x * 0 at -inf is NaN,
    # as in onnxruntime), never above 1 or below 0 anywhere
    sigmoid = outputs[3]
    ends = ~np.isnan(x) & (np.abs(wide) > 88)
    np.testing.assert_array_equal(sigmoid[ends], (x[ends] > 0).astype(np.float32))
    assert ((sigmoid[~np.isnan(x)] >= 0) & (sigmoid[~np.isnan(x)] <= 1)).all()


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the sigmoid's low end wraps (no select below -88)",
         "    y = x < -88.0f ? 0.0f : y;\n",
         "\n",
         file="kernorch/codegen/c/prelude.py"),
    here("the sigmoid's high end wraps (no select above 88)",
         "return x > 88.0f ? 1.0f : y;",
         "return y;",
         file="kernorch/codegen/c/prelude.py"),
    here("the sigmoid's exp drops ln2's low part",
         "r = n * 2.12194440e-4f + r;",
         "r = r + 0.0f;",
         file="kernorch/codegen/c/prelude.py"),
    here("ko_erff leaves NaN to its integer clamp (erf(NaN) = ±1)",
         "return x != x ? x : out.f;",
         "return out.f;",
         file="kernorch/codegen/c/prelude.py"),
]  # fmt: skip
