"""A reshape's index, group by group (description.py's `reshaped_index`): the input element it names is the
row-major one for every output element, an axis a reshape splits is read without a division, and a bilinear
upsampling behind such a reshape (lraspp's classifier) reads its rows by a division-free address."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from kernorch.codegen.backends import GENERATED_C
from kernorch.codegen.loops import Tree, count_kinds
from kernorch.codegen.loops.description import reshaped_index
from kernorch.codegen.loops.indexing_test import evaluate
from kernorch.devtools.mutate import here
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.reference import run_reference

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`


def _random_shapes(rng: random.Random) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes of one element count: the same factors, cut into axes two different ways, ones sprinkled in."""
    factors = [rng.choice([2, 3, 4, 5]) for _ in range(rng.randint(1, 4))]

    def cut() -> tuple[int, ...]:
        axes, run = [], 1
        for factor in factors:
            run *= factor
            if rng.random() < 0.5:
                axes.append(run)
                run = 1
        axes.append(run)
        for _ in range(rng.randint(0, 2)):
            axes.insert(rng.randint(0, len(axes)), 1)
        return tuple(axes)

    return cut(), cut()


@pytest.mark.parametrize("seed", range(60))
def test_every_output_element_reads_the_row_major_input_element(seed: int) -> None:
    out_shape, in_shape = _random_shapes(random.Random(seed))
    assert math.prod(out_shape) == math.prod(in_shape)
    names = [f"o{k}" for k in range(len(out_shape))]
    index = reshaped_index([("var", name) for name in names], out_shape, in_shape)
    for flat, coordinates in enumerate(np.ndindex(*out_shape)):
        point = dict(zip(names, coordinates, strict=True))
        assert tuple(evaluate(t, point) for t in index) == np.unravel_index(flat, in_shape), (out_shape, in_shape)


def test_an_axis_split_in_two_is_recombined_without_a_division() -> None:
    index: list[Tree] = [("var", v) for v in "nchw"]
    split = reshaped_index(index, (1, 21, 16, 16), (1, 21, 256))
    assert split[1] == ("var", "c") and sum(count_kinds(t, ("/", "%")) for t in split) == 0, split
    merged = reshaped_index([("var", "n"), ("var", "c"), ("var", "p")], (1, 21, 256), (1, 21, 16, 16))
    assert merged[1] == ("var", "c") and count_kinds(merged[2], ("/", "%")) == 1, merged  # p / 16 and p % 16


def test_a_bilinear_upsampling_behind_a_split_reads_by_a_division_free_address() -> None:
    """[1, 21, 256] + z -> [1, 21, 16, 16] -> bilinear x8: the rows' addresses hold table lookups the index
    algebra cannot bound, so a flat offset through the reshape kept `/ 256 % 21` per element."""
    graph = Graph(inputs=["x", "z"], outputs=["y"])
    graph.types.update(x=TensorType((1, 21, 256), "float32"), z=TensorType((1, 21, 256), "float32"),
                       s=TensorType((1, 21, 256), "float32"), r=TensorType((1, 21, 16, 16), "float32"),
                       y=TensorType((1, 21, 128, 128), "float32"))  # fmt: skip
    attrs = (("sizes", (1, 21, 128, 128)), ("scales", (1.0, 1.0, 8.0, 8.0)), ("mode", "linear"),
             ("coordinate_mode", "half_pixel"), ("nearest_mode", "round_prefer_floor"), ("cubic_coeff_a", -0.75),
             ("exclude_outside", False))  # fmt: skip
    graph.nodes += [Node("add", ("x", "z"), ("s",), ()), Node("reshape", ("s",), ("r",), (("shape", (1, 21, 16, 16)),)),
                    Node("resize", ("r",), ("y",), attrs)]  # fmt: skip
    kernel = make_kernel(graph, (0, 1, 2), ("y",))
    source = GENERATED_C.source("k", kernel)
    assert "/ 256)" not in source and "% 21)" not in source, source
    rng = np.random.default_rng(5)
    feeds = {name: rng.standard_normal(graph.types[name].shape).astype(np.float32) for name in graph.inputs}
    feeds["x"][0, 3, 0] = 1e30  # a corner (NaN and inf in a resize: resize_taps_test.py)
    got = PlanExecutor(graph, [kernel], threads=2)(feeds)["y"]
    np.testing.assert_allclose(got, run_reference(graph, feeds)["y"], rtol=1e-5, atol=1e-5)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a reshape group's later coordinates lose their remainder",
         "div(flat, stride) if k == 0 else mod(div(flat, stride), size)",
         "div(flat, stride)",
         file="kernorch/codegen/loops/description.py"),
]  # fmt: skip
