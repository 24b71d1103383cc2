"""A sample of the fuzzer in every test run (the full 10 000 inputs: `make fuzz`): malformed ONNX bytes end
in exit 0, 1 or 2 with one line, never a crash, a hang or a traceback."""

from __future__ import annotations

import numpy as np

from kernorch.devtools.fuzz import fuzz, mutate, seed_models


def test_mutations_are_seeded_and_varied() -> None:
    seeds = seed_models()
    first = [mutate(np.random.default_rng(3), seeds) for _ in range(5)]
    again = [mutate(np.random.default_rng(3), seeds) for _ in range(5)]
    assert first == again
    assert len({bytes(m) for m in (mutate(np.random.default_rng(i), seeds) for i in range(50))}) > 40


def test_a_sample_of_malformed_models_keeps_the_cli_contract() -> None:
    histogram, broken = fuzz(150, seed=12345, timeout=120)
    assert not broken, [(outcome.code, outcome.message) for _, outcome in broken]
    assert sum(histogram.values()) == 150
    assert histogram[2] > 0  # most mutants are refused with exit 2
