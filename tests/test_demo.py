from __future__ import annotations

import pytest

from kernorch.cli import main


def test_demo_prints_plan_and_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--runs", "3"]) == 0
    out = capsys.readouterr().out
    assert "self_attention" in out and "conv_norm_act" in out
    assert out.count("PASS") == 4  # reference and compiled, for each model
    assert "speedup" in out and "kernel plan" in out
    assert "reduce_max" in out  # softmax fissioned into the stable form
