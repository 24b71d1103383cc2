"""kernorch.compile / CompiledModel / save / load, and the optimize -o / run / check --compiled commands."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import kernorch
from kernorch.api import ArtifactError
from kernorch.cli import main
from kernorch.errors import InputMismatch
from kernorch.tools.check import run_onnxruntime
from kernorch.tools.demo_models import conv_norm_act_block, self_attention_block


@pytest.fixture(scope="module")
def attention() -> kernorch.CompiledModel:
    return kernorch.compile(self_attention_block(), cost="analytic", device="a100")


def test_compiled_model_matches_onnxruntime_numpy_and_torch(attention: kernorch.CompiledModel) -> None:
    import torch

    x = np.random.default_rng(3).standard_normal((1, 64, 128)).astype(np.float32)
    expected = run_onnxruntime(self_attention_block(), {"x": x})["y"]
    got = attention(x)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    as_tensor = attention(torch.from_numpy(x))
    assert isinstance(as_tensor, torch.Tensor)
    np.testing.assert_allclose(as_tensor.numpy(), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(attention(x=x), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(InputMismatch):
        attention(x[:, :10])
    with pytest.raises(InputMismatch):
        attention(x.astype(np.float64))


def test_save_load_roundtrip_without_retuning(attention: kernorch.CompiledModel, tmp_path: Path) -> None:
    directory = attention.save(tmp_path / "plan")
    assert {p.name for p in directory.iterdir()} == {"plan.json", "weights.npz", "kernels.c", "kernels.so"}
    loaded = kernorch.load(directory)
    x = np.random.default_rng(4).standard_normal((1, 64, 128)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), attention(x))
    assert [k.nodes for k in loaded.kernels] == [k.nodes for k in attention.kernels]


def test_corrupted_artifacts_are_refused(attention: kernorch.CompiledModel, tmp_path: Path) -> None:
    directory = attention.save(tmp_path / "plan")
    weights = directory / "weights.npz"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="weights.npz does not match its checksum"):
        kernorch.load(directory)
    directory = attention.save(tmp_path / "plan2")
    (directory / "plan.json").write_text("{ truncated")
    with pytest.raises(ArtifactError, match="corrupted"):
        kernorch.load(directory)
    directory = attention.save(tmp_path / "plan3")
    plan = json.loads((directory / "plan.json").read_text())
    plan["version"] = 99
    (directory / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(ArtifactError, match="version"):
        kernorch.load(directory)
    directory = attention.save(tmp_path / "plan4")
    plan = json.loads((directory / "plan.json").read_text())
    plan["kernels"] = plan["kernels"][1:]  # a plan missing its first kernel cannot run
    (directory / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(ArtifactError, match="malformed"):
        kernorch.load(directory)
    with pytest.raises(ArtifactError, match="not a kernorch plan directory"):
        kernorch.load(tmp_path / "nowhere")


def test_cli_optimize_output_then_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "block.onnx"
    model.write_bytes(conv_norm_act_block(channels=8, size=16).SerializeToString())
    plan_dir = tmp_path / "plan"
    assert main(["optimize", str(model), "-o", str(plan_dir), "--cost", "analytic", "--device", "v100"]) == 0
    assert "saved to" in capsys.readouterr().out
    x = np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(plan_dir), "--input", f"x={tmp_path / 'x.npy'}", "--runs", "3"]) == 0
    out = capsys.readouterr().out
    assert "median latency" in out and "output y" in out
    np.save(tmp_path / "bad.npy", x[:, :4])
    assert main(["run", str(plan_dir), "--input", f"x={tmp_path / 'bad.npy'}"]) == 2
    assert "shape" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing")]) == 2


def test_check_compiled(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "attention.onnx"
    model.write_bytes(self_attention_block(seq=16, hidden=32, heads=2).SerializeToString())
    assert main(["check", str(model), "--compiled", "--cost", "analytic"]) == 0
    assert "compiled run" in capsys.readouterr().out


def test_compile_with_and_without_rewrites(attention: kernorch.CompiledModel) -> None:
    plain = kernorch.compile(self_attention_block(), cost="analytic", device="a100", rewrite=False)
    assert plain.metadata["rewrites"] is None and attention.metadata["rewrites"]
    assert len(attention.graph.nodes) < len(plain.graph.nodes)
    x = np.random.default_rng(5).standard_normal((1, 64, 128)).astype(np.float32)
    expected = run_onnxruntime(self_attention_block(), {"x": x})["y"]
    for model in (attention, plain):
        np.testing.assert_allclose(model(x), expected, rtol=1e-4, atol=1e-5)
