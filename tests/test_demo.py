from __future__ import annotations

from pathlib import Path

import pytest

from kernorch.cli import main


def test_demo_prints_plan_and_check(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["demo", "--runs", "3", "--pictures", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "self_attention" in out and "conv_norm_act" in out
    assert out.count("PASS") == 4  # reference and compiled, for each model
    assert "speedup" in out and "kernel plan" in out
    assert "reduce_max" in out  # softmax fissioned into the stable form
    for name in ("self_attention", "conv_norm_act"):  # where the pictures went, and they are there
        assert f"picture of the plan: {tmp_path / name}.svg" in out
        assert (tmp_path / f"{name}.svg").read_text().count('class="cluster"') >= 2
