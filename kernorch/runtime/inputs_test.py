"""Run-time inputs are checked whole: byte order converted, strided and read-only arrays read correctly, a wrong
dtype, shape, structured or object array refused in one line (exit 2)."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.devtools.mutate import here
from kernorch.errors import InputMismatch
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor


@pytest.fixture(scope="module")
def executor() -> PlanExecutor:
    graph = Graph(inputs=["x", "n"], outputs=["y", "m"],
                  types={"x": TensorType((8, 16), "float32"), "t": TensorType((8, 16), "float32"),
                         "y": TensorType((8, 16), "float32"), "n": TensorType((4,), "int64"),
                         "m": TensorType((4,), "int64")})  # fmt: skip
    graph.nodes = [Node("exp", ("x",), ("t",)), Node("neg", ("t",), ("y",)), Node("neg", ("n",), ("m",))]
    return PlanExecutor(graph, [make_kernel(graph, (0, 1), ("y",)), make_kernel(graph, (2,), ("m",))])


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((8, 16)).astype(np.float32), "n": np.array([1, -2, 2**40, -(2**62)])}


def test_big_endian_inputs_are_converted_not_read_swapped(executor: PlanExecutor) -> None:
    native = executor(_inputs())
    swapped = {name: array.astype(array.dtype.newbyteorder(">")) for name, array in _inputs().items()}
    assert not swapped["x"].dtype.isnative and swapped["x"].dtype.name == "float32"
    result = executor(swapped)
    for name, value in native.items():
        np.testing.assert_array_equal(result[name], value)
    np.testing.assert_allclose(native["y"], -np.exp(_inputs()["x"]), rtol=1e-6)


def test_strided_read_only_and_fortran_inputs(executor: PlanExecutor) -> None:
    expected = executor(_inputs())
    x = _inputs()["x"]
    wide = np.zeros((8, 32), np.float32)
    wide[:, ::2] = x
    fortran = np.asfortranarray(x)
    frozen = x.copy()
    frozen.flags.writeable = False
    for variant in (wide[:, ::2], fortran, frozen):
        np.testing.assert_array_equal(executor({"x": variant, "n": _inputs()["n"]})["y"], expected["y"])


@pytest.mark.parametrize("bad, message", [
    (np.zeros((8, 16), np.float64), "dtype float64 \\(<f8\\), the model expects float32"),
    (np.zeros((8, 16), np.int32), "expects float32"),
    (np.zeros((16, 8), np.float32), "shape \\(16, 8\\), the model expects \\(8, 16\\)"),
    (np.zeros((8, 16), dtype=[("a", np.float32)]), "expects float32"),
    (np.zeros((8, 16), dtype=object), "expects float32"),
    (np.zeros((8, 16), np.complex64), "expects float32"),
])  # fmt: skip
def test_wrong_inputs_are_refused_in_one_line(executor: PlanExecutor, bad: np.ndarray, message: str) -> None:
    with pytest.raises(InputMismatch, match=message) as error:
        executor({"x": bad, "n": _inputs()["n"]})
    assert "\n" not in str(error.value) and error.value.exit_code == 2


def test_seeded_masks_are_zeros_and_ones() -> None:
    """An integer input named as a mask is drawn from {0, 1}: OPT derives position ids from its running sum, and
    draws in [0, 10) sent them past the position table (found by the zoo)."""
    from kernorch.ir.types import TensorType
    from kernorch.runtime.feeds import seeded_feeds

    feeds = seeded_feeds({"attention_mask": TensorType((4, 64), "int64"), "ids": TensorType((4, 64), "int64")})
    assert set(np.unique(feeds["attention_mask"]).tolist()) == {0, 1}
    assert feeds["ids"].max() > 1


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a call's input check takes any array whose dtype has the expected name (a big-endian >f4 too)",
         "array.dtype == _native_dtype(expected.dtype)",
         "array.dtype.name == expected.dtype",
         file="kernorch/runtime/reference.py"),
]  # fmt: skip
