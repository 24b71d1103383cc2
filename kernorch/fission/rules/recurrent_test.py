"""LSTM rule: input projection as linear primitives, the scan as one opaque primitive."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.testing import fission_and_compare, primitive_names, random_array, single_op_model


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm(direction: str) -> None:
    seq, batch, features, hidden = 5, 2, 3, 4
    dirs = 2 if direction == "bidirectional" else 1
    x = random_array((seq, batch, features))
    constants = {
        "w": random_array((dirs, 4 * hidden, features), seed=1),
        "r": random_array((dirs, 4 * hidden, hidden), seed=2),
        "b": random_array((dirs, 8 * hidden), seed=3),
        "lens": np.full(batch, seq, dtype=np.int32),
        "h0": random_array((dirs, batch, hidden), seed=4),
        "c0": random_array((dirs, batch, hidden), seed=5),
        "p": random_array((dirs, 3 * hidden), seed=6),
    }
    model = single_op_model("LSTM", {"x": x}, {"hidden_size": hidden, "direction": direction}, constants,
                            input_order=["x", "w", "r", "b", "lens", "h0", "c0", "p"], outputs=3)  # fmt: skip
    graph = fission_and_compare(model, {"x": x}, rtol=1e-5, atol=1e-5)
    assert primitive_names(graph) == ["reshape", "matmul", "add", "reshape", "lstm_recurrence"]
