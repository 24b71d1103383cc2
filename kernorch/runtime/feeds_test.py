"""Seeded feeds: the same arrays for the same seed, and every one an array (a draw of shape () is a numpy scalar,
which has no buffer to hand a kernel: the profiler crashed on DynamicQuantizeLinear's scalar input)."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.devtools.mutate import here
from kernorch.ir.types import TensorType
from kernorch.runtime.feeds import seeded_feeds


@pytest.mark.parametrize("dtype", ["float32", "float64", "bool", "int8", "uint8", "int32", "int64"])
@pytest.mark.parametrize("shape", [(), (1,), (3, 5)])
def test_every_feed_is_an_array_drawn_from_the_seed(dtype: str, shape: tuple[int, ...]) -> None:
    types = {"v": TensorType(shape, dtype)}
    feeds, again = seeded_feeds(types, seed=3), seeded_feeds(types, seed=3)
    assert type(feeds["v"]) is np.ndarray and feeds["v"].shape == shape and feeds["v"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(feeds["v"], again["v"])


# (integer and float draws of shape () are 0-d arrays already: np.asarray changes nothing there, so only the
# boolean one, a comparison's numpy scalar, has a mutant that can fail)
MUTANTS = [
    here("a drawn boolean input of shape () stays a numpy scalar (no buffer to profile with)",
         "feeds[name] = np.asarray(rng.random(value_type.shape) < 0.5)",
         "feeds[name] = rng.random(value_type.shape) < 0.5"),
]  # fmt: skip
