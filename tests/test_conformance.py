"""ONNX backend node tests: no case of an operator with a rule may fail (refusals count as unsupported)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernorch.cli import main
from kernorch.devtools.mutate import here
from kernorch.fission import FISSION_RULES
from kernorch.tools.conformance import default_cache_dir, run_conformance, summarize


@pytest.fixture(scope="module")
def results() -> list:
    return run_conformance(default_cache_dir())


def test_no_case_fails(results: list) -> None:
    failed = [f"{r.name}: {r.detail}" for r in results if r.status == "failed"]
    assert not failed, "\n".join(failed)


def test_every_ruled_operator_passes_some_case(results: list) -> None:
    per_op = summarize(results)
    assert sum(counts["passed"] for counts in per_op.values()) >= 840
    # Every operator kernorch claims appears in the suite and passes at least one of its cases.
    tested = {op for op in per_op if op in FISSION_RULES}
    never_passing = sorted(op for op in tested if per_op[op]["passed"] == 0)
    assert not never_passing, never_passing
    for op in ("Softmax", "LayerNormalization", "Resize", "Pad", "Conv", "ConvTranspose", "LSTM", "AveragePool"):
        assert per_op[op]["passed"] > 0, op


def test_refusals_name_the_cause(results: list) -> None:
    for result in results:
        if result.status == "unsupported" and result.op in FISSION_RULES:
            assert result.detail, result.name


def test_cli_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "-k", "test_softmax", "-q"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    passed, failed, unsupported = (int(part.split()[0]) for part in last.split(", "))
    assert passed > 10 and failed == 0
    assert Path(default_cache_dir() / "cases.json").is_file()


# Linear primitives (oneDNN calls) and the memory-bound kinds most worth covering; the whole suite compiled
# is `kernorch conformance --compiled` (about 3 minutes). Of attention's 50 three-dimensional cases, the 12
# grouped-query ones (masks, causal, scale, softcap, past/present, each also expanded) stand for the rest.
COMPILED_SUBSET = ("test_conv", "test_basic_conv", "test_convtranspose", "test_matmul", "test_gemm", "pool",
                   "test_softmax", "test_transpose", "test_resize", "test_argm", "test_top_k", "test_cumsum",
                   "test_einsum", "test_gathernd", "test_scatternd", "test_onehot", "test_tril", "test_triu",
                   "test_mod", "test_rms_normalization_4d", "test_attention_3d_gqa")


@pytest.mark.parametrize("pattern", COMPILED_SUBSET)
def test_compiled_path_passes_what_the_reference_passes(pattern: str, results: list) -> None:
    compiled = run_conformance(default_cache_dir(), pattern, compiled=True)
    failed = [f"{r.name}: {r.detail}" for r in compiled if r.status == "failed"]
    assert not failed, "\n".join(failed)
    reference_passed = {r.name for r in results if r.status == "passed" and pattern in r.name}
    assert reference_passed and {r.name for r in compiled if r.status == "passed"} == reference_passed


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("deconv weights not transposed",
         "w_strides = (strides[2], strides[1], *strides[3:])",
         "w_strides = (strides[1], strides[2], *strides[3:])",
         file="kernorch/codegen/library/call.py",
         tests=("tests/test_conformance.py::test_compiled_path_passes_what_the_reference_passes",)),
]  # fmt: skip
