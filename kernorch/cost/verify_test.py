"""The profiler's check of a kernel's outputs (cost/verify.py) on bfloat16 outputs: one bfloat16 step from the
reference passes (a float32 value a few ulps off rounds to the neighbouring bfloat16), two do not, nor a NaN or an
infinity where the reference has a number."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kernorch.cost.verify import output_mismatch
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime import run_reference
from kernorch.testing import random_array


def _halved_to_bf16() -> CandidateKernel:
    """y = bfloat16(x · c), x [64] float32, c a constant."""
    graph = Graph(inputs=["x"], outputs=["y"], name="halved")
    graph.types = {"x": TensorType((64,), "float32"), "c": TensorType((), "float32"),
                   "h": TensorType((64,), "float32"), "y": TensorType((64,), "bfloat16")}  # fmt: skip
    graph.constants = {"c": np.array(0.37, np.float32)}
    graph.nodes = [Node("mul", ("x", "c"), ("h",)), Node("cast", ("h",), ("y",), (("to", "bfloat16"),))]
    return make_kernel(graph, (0, 1), ("y",))


def _steps(values: np.ndarray, steps: int) -> np.ndarray:
    """Each bfloat16 value moved `steps` bfloat16 steps away from zero (its bit pattern + steps)."""
    return (values.view(np.uint16) + np.uint16(steps)).view(ml_dtypes.bfloat16)


@pytest.mark.parametrize(("change", "passes"), [
    ("none", True),
    ("one step on every element", True),
    ("two steps on one element", False),
    ("NaN for a number", False),
    ("infinity for a number", False),
])  # fmt: skip
def test_a_bfloat16_output_may_be_one_step_from_the_reference(change: str, passes: bool) -> None:
    kernel = _halved_to_bf16()
    x = random_array((64,), seed=3) * np.float32(10)
    got = run_reference(kernel.graph, {"x": x})["y"].copy()
    if change == "one step on every element":
        got = _steps(got, 1)
    elif change == "two steps on one element":
        got[5] = _steps(got[5:6], 2)[0]
    elif change == "NaN for a number":
        got[7] = np.nan
    elif change == "infinity for a number":
        got[9] = np.inf
    problem = output_mismatch(kernel, {"x": x, "y": got})
    assert (problem is None) == passes, problem
    if not passes:
        assert "more than a bfloat16 step" in str(problem)


def _masked_scores() -> CandidateKernel:
    """y = x + m, float32, m a mask of 0 and float32's lowest (a causal mask as exporters write it)."""
    graph = Graph(inputs=["x"], outputs=["y"], name="masked")
    graph.types = {"x": TensorType((4, 4), "float32"), "m": TensorType((4, 4), "float32"),
                   "y": TensorType((4, 4), "float32")}  # fmt: skip
    graph.constants = {"m": np.triu(np.full((4, 4), np.finfo(np.float32).min, np.float32), 1)}
    graph.nodes = [Node("add", ("x", "m"), ("y",))]
    return make_kernel(graph, (0,), ("y",))


@pytest.mark.parametrize(
    ("change", "passes"),
    [("none", True), ("NaN for a number", False), ("-inf for -max", False), ("one element off by 0.1", False)],
)
def test_float32_outputs_near_float32s_extremes_are_judged_without_overflow(change: str, passes: bool) -> None:
    """|want| + scale overflowed in float32 for outputs near float32's max: a RuntimeWarning on every profile of
    gpt2_mini's masked attention; and the mask's magnitude is no scale for the other elements' error."""
    kernel = _masked_scores()
    x = random_array((4, 4), seed=5)
    got = run_reference(kernel.graph, {"x": x})["y"].copy()
    if change == "NaN for a number":
        got[1, 0] = np.nan
    elif change == "-inf for -max":
        got[0, 3] = -np.inf
    elif change == "one element off by 0.1":
        got[2, 1] += np.float32(0.1)
    with np.errstate(all="raise"):
        problem = output_mismatch(kernel, {"x": x, "y": got})
    assert (problem is None) == passes, problem


def _cast_kernel(x_type: TensorType | None, out_dtype: str) -> tuple[CandidateKernel, dict[str, np.ndarray]]:
    """y = cast(x) · 1 or, without x, y = cast(c) · 1: the kernels whose float operands can be none."""
    graph = Graph(inputs=["x"] if x_type else [], outputs=["y"], name="cast")
    source = "x" if x_type else "c"
    graph.types = {"c": TensorType((3,), "int32"), "one": TensorType((), "float32"),
                   "f": TensorType(x_type.shape if x_type else (3,), "float32"),
                   "g": TensorType(x_type.shape if x_type else (3,), "float32"),
                   "y": TensorType(x_type.shape if x_type else (3,), out_dtype)}  # fmt: skip
    if x_type:
        graph.types["x"] = x_type
    graph.constants = {"c": np.array([1, -7, 300], np.int32), "one": np.array(1.0, np.float32)}
    graph.nodes = [Node("cast", (source,), ("f",), (("to", "float32"),)), Node("mul", ("f", "one"), ("g",)),
                   Node("cast", ("g",), ("y",), (("to", out_dtype),))]  # fmt: skip
    feeds = {}
    if x_type:
        size = int(np.prod(x_type.shape))
        feeds["x"] = (np.arange(size) * 37 % 101 - 50).astype(x_type.dtype).reshape(x_type.shape)
    return make_kernel(graph, (0, 1, 2), ("y",)), feeds


@pytest.mark.parametrize("case", ["integer input", "constants only", "empty float input", "empty integer input"])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32", "int64"])
def test_kernels_without_float_operands_are_verified_not_crashed(case: str, out_dtype: str) -> None:
    """A kernel whose feeds hold no float value — integer inputs, only constants, empty tensors — is checked like
    any other: right outputs pass, a wrong element is named (max() over no operands raised TypeError here, and a
    bf16 profile of a transformer died of it)."""
    x_type = {"integer input": TensorType((5,), "int32"), "constants only": None,
              "empty float input": TensorType((0, 4), "float32"),
              "empty integer input": TensorType((0,), "int64")}[case]  # fmt: skip
    kernel, feeds = _cast_kernel(x_type, out_dtype)
    right = run_reference(kernel.graph, feeds)["y"]
    assert output_mismatch(kernel, {**feeds, "y": right.copy()}) is None
    if right.size:
        wrong = right.copy()
        wrong[0] = wrong[0] + (wrong.dtype.type(64) if out_dtype != "bfloat16" else ml_dtypes.bfloat16(64))
        assert "differs from the reference" in str(output_mismatch(kernel, {**feeds, "y": wrong}))


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the profiler's check lets a bfloat16 output sit four steps from the reference",
         "BF16_BITS = 8",
         "BF16_BITS = 6"),
    here("the profiler's check scales every element's error by a mask's -3.4e38",
         "magnitudes[magnitudes < SENTINEL]",
         "magnitudes[np.isfinite(magnitudes)]"),
    here("the profiler's check takes max() over operands that may be none",
         "return max([_magnitude(output), *(_magnitude(values) for values in operands)])",
         "return max(_magnitude(output), *(_magnitude(values) for values in operands))"),
]  # fmt: skip
