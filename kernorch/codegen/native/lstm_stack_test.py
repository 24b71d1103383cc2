"""The stacked-LSTM wave template against onnxruntime: layer counts against thread counts (layers per vEU,
uneven splits), chunk tails, batches, initial state and peepholes, small unit blocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernorch import compile
from kernorch.codegen.native.lstm_stack import BACKEND, CHUNK_STEPS
from kernorch.devtools.mutate import here
from kernorch.testing import cpu_compile
from kernorch.tools.check import run_onnxruntime
from kernorch.tools.demo_models import stacked_lstm

pytestmark = pytest.mark.sanitize  # under the sanitizers in `make sanitize`


@pytest.mark.parametrize(("layers", "hidden", "seq", "batch", "state", "threads"), [
    (2, 32, 9, 1, False, 2),  # one layer per vEU; 9 steps: a short last chunk
    (3, 20, 7, 2, True, 2),  # 3 layers on 2 vEUs; hidden 20: unit blocks of 4; initial state, peepholes
    (5, 48, 13, 3, True, 2),
    (4, 16, 2 * CHUNK_STEPS, 1, False, 1),  # one vEU runs every layer
    (2, 16, 1, 1, True, 2),  # a single step
])  # fmt: skip
def test_stack_matches_onnxruntime(layers: int, hidden: int, seq: int, batch: int, state: bool,
                                   threads: int) -> None:  # fmt: skip
    model = stacked_lstm(layers, hidden, seq, batch, features=12, state=state)
    x = np.random.default_rng(1).standard_normal((seq, batch, 12)).astype(np.float32)
    compiled = cpu_compile(model, cost="analytic", threads=threads)  # the roofline always takes the stack
    stacks = [(k, b) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
              if k.primitives[0].prim == "lstm_stack"]  # fmt: skip
    assert [b for _, b in stacks] == [BACKEND]
    assert len(stacks[0][0].primitives[0].attr("unit_blocks")) == layers
    got, expected = compiled.run({"x": x}), run_onnxruntime(model, {"x": x})
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


def test_stack_runs_in_an_rprogram() -> None:
    """The stack synchronises its own threads: in an rProgram it is one device-wide call, and the plan's
    outputs match the kernel-by-kernel run."""
    model = stacked_lstm(3, 32, 10, 1, features=8)
    x = np.random.default_rng(2).standard_normal((10, 1, 8)).astype(np.float32)
    by_kernel = compile(model, cost="analytic", runtime="kernels").run({"x": x})
    as_program = compile(model, cost="analytic", runtime="rprogram").run({"x": x})
    for name, value in by_kernel.items():
        np.testing.assert_allclose(as_program[name], value, rtol=1e-6, atol=1e-6, err_msg=name)


def test_explain_describes_the_waves(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import onnx

    from kernorch.cli import main

    path = tmp_path / "stack.onnx"
    onnx.save(stacked_lstm(3, 16, 9, 1, features=4), path)
    assert main(["explain", str(path), "--cost", "analytic"]) == 0
    out = capsys.readouterr().out
    assert "stacked LSTM layers as waves, C template: 3 layers (hidden 16)" in out
    assert "9 rTasks of 4 steps" in out  # 3 layers x 3 chunks (the last one step)
    assert "lstm-layers-as-waves" in out


def test_saved_plan_with_a_stack_loads(tmp_path: Path) -> None:
    """The plan directory holds the stack as data (its unit blocks a list) and the regenerated C matches."""
    import kernorch

    model = stacked_lstm(2, 16, 6, 1, features=4)
    x = np.random.default_rng(3).standard_normal((6, 1, 4)).astype(np.float32)
    compiled = cpu_compile(model, cost="analytic")
    expected = compiled.run({"x": x})
    loaded = kernorch.load(compiled.save(tmp_path / "plan"))
    assert [k.primitives[0].prim for k in loaded.kernels].count("lstm_stack") == 1
    for name, value in loaded.run({"x": x}).items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    # stacked LSTM waves
    here("stack rTask does not wait for the layer below",
         "__ATOMIC_ACQUIRE) < chunk + 1)",
         "__ATOMIC_ACQUIRE) < chunk)"),
    here("stack projection drops the bias",
         "acc[i][j] = bp[j];",
         "acc[i][j] = 0;"),
]  # fmt: skip
