"""The LSTM scan template against onnxruntime: each direction, batches, unit blocks split evenly and unevenly over
the threads, initial state and peepholes."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.codegen.native.lstm import BACKEND
from kernorch.devtools.mutate import here
from kernorch.testing import cpu_compile, random_array, single_op_model
from kernorch.tools.check import run_onnxruntime

pytestmark = pytest.mark.sanitize


@pytest.mark.parametrize(("direction", "batch", "hidden", "threads"), [
    ("forward", 2, 4, 2), ("reverse", 2, 4, 2), ("bidirectional", 2, 4, 2),
    # several unit blocks: split evenly over two threads, unevenly (3 blocks of 8), and on one thread
    ("forward", 1, 64, 2), ("bidirectional", 3, 24, 2), ("reverse", 2, 48, 1),
])  # fmt: skip
def test_lstm_scan_template_matches_onnxruntime(direction: str, batch: int, hidden: int, threads: int) -> None:
    seq, features = 7, 3
    dirs = 2 if direction == "bidirectional" else 1
    x = random_array((seq, batch, features))
    constants = {"w": random_array((dirs, 4 * hidden, features), seed=1),
                 "r": random_array((dirs, 4 * hidden, hidden), seed=2), "b": random_array((dirs, 8 * hidden), seed=3),
                 "h0": random_array((dirs, batch, hidden), seed=4), "c0": random_array((dirs, batch, hidden), seed=5),
                 "p": random_array((dirs, 3 * hidden), seed=6)}  # fmt: skip
    model = single_op_model("LSTM", {"x": x}, {"hidden_size": hidden, "direction": direction}, constants,
                            input_order=["x", "w", "r", "b", "", "h0", "c0", "p"], outputs=3)  # fmt: skip
    compiled = cpu_compile(model, cost="analytic", threads=threads)
    scan = [b for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
            if k.primitives[0].prim == "lstm_recurrence"]  # fmt: skip
    assert scan == [BACKEND]
    got, expected = compiled.run({"x": x}), run_onnxruntime(model, {"x": x})
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the LSTM scan's Y_h is read from the buffer of the step before last",
         "const float *h = ({S} & 1) ? hbuf1 : hbuf0;",
         "const float *h = ({S} & 1) ? hbuf0 : hbuf1;"),
    here("a reverse LSTM scans forward",
         "const int64_t t = reverse ? {S - 1} - step : step;",
         "const int64_t t = step;"),
    here("the LSTM scan's last thread skips its last unit block",
         "last = {blocks} * (p + 1) / np;",
         "last = {blocks} * (p + 1) / np - (p + 1 == np);"),
]  # fmt: skip
