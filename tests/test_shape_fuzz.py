"""Every bad shape is one line: random `--input-shape` and `--dim` strings through the CLI, and random `shapes=` /
`input_shapes=` values through the API, on a model with a symbolic batch. The CLI exits 0 or 2 — with exactly one
`kernorch: error:` line for 2, never a traceback — and the API returns a model or raises a KernorchError. Edge
numbers (0, -1, 2^31, 2^40, 2^63, 2^64, 10^30, blanks, non-ASCII digits) in every position; the exit-code
histogram is printed (`pytest -s`)."""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kernorch
from kernorch.cli import main
from kernorch.devtools.mutate import here
from kernorch.errors import KernorchError

NUMBERS = ["0", "1", "2", "3", "7", "-1", "-0", "+2", "01", "2147483648", "4294967296", "1099511627776",
           "9223372036854775807", "9223372036854775808", "18446744073709551616", "1" + "0" * 30, "1e3", "1.5", "",
           "x", "٣", " 4", "0x10", "nan", "5000000"]  # fmt: skip
NAMES = ["x", "x", "x", "y", "", "x=x", "X", "batch"]
DIM_NAMES = ["batch", "batch", "batch", "seq", "", "batch=1"]
FAST = {"cost": "analytic", "device": "cpu-nominal", "rewrite": False}


def symbolic_batch_model() -> onnx.ModelProto:
    """relu(x + b), x [batch, 3, 4]: every input size is a valid shape, and big ones are big."""
    b = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "b")
    nodes = [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 4])
    graph = helper.make_graph(nodes, "fuzz", [x], [y], [b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def input_shape_spec(rng: np.random.Generator) -> str:
    dims = [str(rng.choice(NUMBERS)) for _ in range(int(rng.integers(0, 6)))]
    if rng.random() < 0.3:  # mostly right apart from the batch: the size checks, not the parser, decide
        dims = [str(rng.choice(NUMBERS)), "3", "4"]
    return f"{rng.choice(NAMES)}={'x'.join(dims)}"


def dim_spec(rng: np.random.Generator) -> str:
    low, high = rng.choice(NUMBERS), rng.choice(NUMBERS)
    sizes = rng.choice([",".join(str(rng.choice(NUMBERS)) for _ in range(int(rng.integers(1, 4)))),
                        f"pow2:{low}..{high}", f"x{rng.choice(NUMBERS)}:{low}..{high}", f"x1:1..{high}",
                        f"{low}..{high}", "pow2:1..4"])  # fmt: skip
    return f"{rng.choice(DIM_NAMES)}={sizes}"


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's own refusals
            code = int(exit_.code or 0)
    return code, err.getvalue()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "batch.onnx"
    onnx.save(symbolic_batch_model(), path)
    return path


def _assert_contract(argv: list[str], code: int, stderr: str, histogram: Counter[int]) -> None:
    histogram[code] += 1
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code in (0, 2), (argv, code, stderr[-800:])
    assert "Traceback" not in stderr, (argv, stderr[-800:])
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("kernorch: error: "), (argv, stderr[-800:])


def test_input_shape_strings_exit_0_or_2_in_one_line(model_path: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(2026)
    histogram: Counter[int] = Counter()
    for _ in range(300):
        argv = ["check", str(model_path), f"--input-shape={input_shape_spec(rng)}"]
        _assert_contract(argv, *run_cli(argv), histogram)
    print(f"\n--input-shape: exit codes {dict(sorted(histogram.items()))}")
    assert histogram[0] >= 10 and histogram[2] >= 100  # both outcomes reached
    assert set(histogram) <= {0, 2}


def test_dim_strings_exit_0_or_2_in_one_line(model_path: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(2027)
    histogram: Counter[int] = Counter()
    for _ in range(200):
        argv = ["optimize", str(model_path), "--cost", "analytic", "--device", "cpu-nominal", "--no-rewrite",
                f"--dim={dim_spec(rng)}"]  # fmt: skip
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("KERNORCH_CACHE", str(tmp_path))  # repeated sizes come from the specialisation cache
            _assert_contract(argv, *run_cli(argv), histogram)
    print(f"\n--dim: exit codes {dict(sorted(histogram.items()))}")
    assert histogram[0] >= 5 and histogram[2] >= 100
    assert set(histogram) <= {0, 2}


def _api_value(rng: np.random.Generator) -> object:
    def number() -> object:
        text = str(rng.choice(NUMBERS))
        return int(text) if text.lstrip("-").isdigit() and text.isascii() and rng.random() < 0.8 else text

    dims = [number() for _ in range(int(rng.integers(0, 5)))] if rng.random() < 0.5 else [number(), 3, 4]
    return {str(rng.choice(NAMES)): tuple(dims)}


def test_api_shapes_raise_kernorch_errors_only(tmp_path: Path) -> None:
    rng = np.random.default_rng(2028)
    model = symbolic_batch_model()
    outcomes: Counter[str] = Counter()
    for index in range(150):
        value = _api_value(rng)
        try:
            if index % 2:
                kernorch.compile(model, shapes=[value], cache_dir=tmp_path, **FAST)
            else:
                kernorch.compile(model, input_shapes=value, cache_dir=tmp_path, **FAST)  # type: ignore[arg-type]
            outcomes["compiled"] += 1
        except KernorchError:
            outcomes["KernorchError"] += 1
    print(f"\nAPI shapes: {dict(outcomes)}")
    assert outcomes["compiled"] >= 5 and outcomes["KernorchError"] >= 50


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("an input too large to index raises ValueError (a traceback)",
         "        except ValueError as error:  # beyond 2^40",
         "        except ZeroDivisionError as error:  # beyond 2^40",
         file="kernorch/frontend/onnx_import.py"),
    here("check draws feeds larger than memory",
         '    check_values_fit(fissioned_graph, "the model at these input shapes")',
         "",
         file="kernorch/tools/check.py"),
    here("a --dim range is listed before its sizes are counted",
         "if (last - start) // step >= MAX_DIM_SIZES:",
         "if False:",
         file="kernorch/frontend/signature.py"),
]  # fmt: skip
