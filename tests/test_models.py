"""Whole-model tests over ../shared/models: every operator has a rule; every model matches onnxruntime."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from kernorch.cli import main
from kernorch.fission import FISSION_RULES
from kernorch.tools.check import check_model

from .conftest import shared_models

MODELS = shared_models()
pytestmark = pytest.mark.skipif(not MODELS, reason="../shared/models not present")


def test_every_shared_operator_has_a_rule() -> None:
    missing = {}
    for path in MODELS:
        model = onnx.load(str(path), load_external_data=False)
        for node in model.graph.node:
            if node.op_type not in FISSION_RULES:
                missing.setdefault(node.op_type, path.name)
    assert not missing, f"operators without a fission rule: {missing}"


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_check_matches_onnxruntime(path: Path) -> None:
    report, graph = check_model(path)
    assert report.passed, "\n".join(report.lines())
    assert report.worst_relative <= 1e-4
    assert graph.nodes and not any(node.prim == "identity" and node.origin != "output" for node in graph.nodes)


def test_check_cli_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    smallest = min(MODELS, key=lambda p: p.stat().st_size)
    assert main(["check", str(smallest)]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "rel err" in out and "import+fission+rewrite" in out
    assert main(["check", str(smallest), "--no-rewrite"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "import+fission " in out
