"""Dependencies a user can live with: the core install is numpy, onnx, HiGHS, tqdm and oneDNN; PyTorch and the
picture libraries are extras, and what needs them says so in one line when they are missing."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import onnx

from kernorch.tools.demo_models import conv_norm_act_block

ROOT = Path(__file__).resolve().parents[1]
BLOCK_TORCH = "import sys\nsys.modules['torch'] = None  # any `import torch` now raises ImportError\n"


def test_the_core_install_holds_no_heavy_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {requirement.split(">")[0].split("=")[0].split("<")[0] for requirement in project["dependencies"]}
    assert core == {"numpy", "ml_dtypes", "onnx", "highspy", "tqdm", "onednn-cpu-gomp", "onednn-devel-cpu-gomp"}
    extras = project["optional-dependencies"]
    assert any(r.startswith("torch>=") and "<" in r for r in extras["torch"])  # a range, not the local pin
    assert {"graphviz>=0.20", "matplotlib>=3.7"} <= set(extras["pictures"])


def test_check_without_torch_says_what_to_install_in_one_line(tmp_path: Path) -> None:
    """A conv's reference implementation is torch's: without it `kernorch check` exits 2 naming the extra."""
    model = tmp_path / "conv.onnx"
    onnx.save(conv_norm_act_block(channels=4, size=8), model)
    script = BLOCK_TORCH + f"from kernorch.cli import main\nsys.exit(main(['check', {str(model)!r}]))\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'kernorch[torch]'" in lines[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
