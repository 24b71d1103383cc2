"""The roofline a linear kernel is read against in `bench --breakdown`, and the row its time goes to."""

from __future__ import annotations

import pytest

from kernorch.codegen.native.int8_matmul_test import _model
from kernorch.devtools.mutate import here
from kernorch.testing import cpu_compile
from kernorch.tools.breakdown import kind_of, roofline


def test_a_product_over_few_rows_is_bound_by_its_weight_stream() -> None:
    # resnet's 512 -> 512 3x3 conv on a 2x2 map: 19 MFLOP over 9.4 MB of weights
    flops, moved = 2 * 4 * 512 * 512 * 9, 4 * 512 * 512 * 9
    at = roofline(flops, moved, 0.4e-3, peak=300e9, stream=25e9)
    assert at["bound"] == "memory" and at["of_roofline"] == pytest.approx(moved / 25e9 / 0.4e-3)


def test_a_product_over_many_rows_is_bound_by_the_peak() -> None:
    flops, moved = 2 * 3136 * 64 * 64 * 9, 4 * (64 * 64 * 9 + 2 * 3136 * 64)  # 56x56, 64 -> 64 channels
    at = roofline(flops, moved, 1e-3, peak=300e9, stream=25e9)
    assert at["bound"] == "compute" and at["of_roofline"] == pytest.approx(flops / 300e9 / 1e-3)


def test_an_unmeasured_stream_leaves_the_peak() -> None:
    assert roofline(1e6, 1e9, 1e-3, peak=1e12, stream=0.0) == {"bound": "compute", "of_roofline": pytest.approx(1e-3)}


def test_an_integer_product_is_read_as_int8() -> None:
    compiled = cpu_compile(_model((4,), 8, 16), cost="analytic")  # MatMulInteger, then its dequantization
    kinds = [kind_of(k, b) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)]
    assert "linear, int8 (native C)" in kinds and not any(k.startswith("linear, fp32") for k in kinds)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the breakdown reads a linear kernel against the lower of its two roofs",
         "max(compute, memory) / seconds",
         "min(compute, memory) / seconds"),
]  # fmt: skip
