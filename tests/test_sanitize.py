"""The generated C of the ONNX semantics property test (integers at their extremes, floats at ±inf and NaN) built
with AddressSanitizer and UndefinedBehaviorSanitizer: zero reports. `make sanitize` runs the whole set (random
plans, native kernels, node tests, shared models); this is its quick part, so signed overflow, a shift past the
sign bit or an out-of-range conversion in a template fails the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kernorch.devtools.mutate import here
from kernorch.devtools.sanitize import ROOT, runtimes


def test_generated_c_has_no_undefined_behaviour_on_edge_values(tmp_path: Path) -> None:
    try:
        runtimes()
    except SystemExit as missing:
        pytest.skip(str(missing))
    done = subprocess.run([sys.executable, "-m", "kernorch.devtools.sanitize", "--quick", "--cache", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "sanitizer reports: 0; steps failed: 0" in done.stdout


def test_only_runs_the_steps_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--only narrows the run to the steps whose name contains its text (none: exit 2, saying so)."""
    from kernorch.devtools.sanitize import main

    try:
        runtimes()
    except SystemExit as missing:
        pytest.skip(str(missing))
    assert main(["--only", "no such step", "--cache", str(tmp_path), "--quantized", str(tmp_path)]) == 2
    assert "no step's name contains no such step" in capsys.readouterr().err


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("integer add overflows as C's signed add",
         'if dtype not in _UNSIGNED:\n        return f"({a} {operator} {b})"',
         'if True:\n        return f"({a} {operator} {b})"',
         file="kernorch/codegen/c/expr.py"),
]  # fmt: skip
