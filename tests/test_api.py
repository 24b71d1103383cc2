"""kernorch.compile / CompiledModel / save / load, and the optimize -o / run / check --compiled commands."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kernorch
from kernorch.api import ArtifactError
from kernorch.cli import main
from kernorch.codegen.backends import GENERATED_C, ONEDNN
from kernorch.devtools.mutate import here
from kernorch.errors import InputMismatch
from kernorch.runtime.artifact import MANIFEST_HASH_KEY, manifest_digest
from kernorch.tools.check import run_onnxruntime
from kernorch.tools.demo_models import conv_norm_act_block, self_attention_block


def resign(directory: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    """Edit plan.json and recompute its manifest hash, as someone tampering on purpose would."""
    plan = json.loads((directory / "plan.json").read_text())
    edit(plan)
    plan[MANIFEST_HASH_KEY] = manifest_digest(plan)
    (directory / "plan.json").write_text(json.dumps(plan))


@pytest.fixture(scope="module")
def attention() -> kernorch.CompiledModel:
    return kernorch.compile(self_attention_block(), cost="analytic", device="cpu-nominal")


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
    assert {p.name for p in directory.iterdir()} == {"plan.json", "weights.npz", "kernels.c"}  # no binary shipped
    loaded = kernorch.load(directory)
    x = np.random.default_rng(4).standard_normal((1, 64, 128)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), attention(x))
    assert [k.nodes for k in loaded.kernels] == [k.nodes for k in attention.kernels]
    # the model runs kernel by kernel (compiled without rTasks unless a test built an rProgram on it), yet the plan
    # it saved holds them and runs as an rProgram
    assert attention.executor.plan.tasks or "_task(" not in attention.executor.source
    assert "_task(" in (directory / "kernels.c").read_text()
    as_rprogram = kernorch.load(directory, runtime="rprogram")
    np.testing.assert_allclose(as_rprogram(x), attention(x), rtol=1e-5, atol=1e-6)


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
    with pytest.raises(ArtifactError, match="modified after it was written"):
        kernorch.load(directory)
    resign(directory, lambda plan: plan.update(kernels=plan["kernels"][1:]))  # as an attacker would
    with pytest.raises(ArtifactError, match="malformed"):
        kernorch.load(directory)
    with pytest.raises(ArtifactError, match="not a kernorch plan directory"):
        kernorch.load(tmp_path / "nowhere")


def test_cli_optimize_output_then_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "block.onnx"
    model.write_bytes(conv_norm_act_block(channels=8, size=16).SerializeToString())
    plan_dir = tmp_path / "plan"
    assert main(["optimize", str(model), "-o", str(plan_dir), "--cost", "analytic", "--device", "cpu-nominal"]) == 0
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
    plain = kernorch.compile(self_attention_block(), cost="analytic", device="cpu-nominal", rewrite=False)
    assert plain.metadata["rewrites"] is None and attention.metadata["rewrites"]
    assert [n.prim for n in attention.graph.nodes] != [n.prim for n in plain.graph.nodes]  # the rewrites changed it
    x = np.random.default_rng(5).standard_normal((1, 64, 128)).astype(np.float32)
    expected = run_onnxruntime(self_attention_block(), {"x": x})["y"]
    for model in (attention, plain):
        np.testing.assert_allclose(model(x), expected, rtol=1e-4, atol=1e-5)


def test_a_shipped_library_is_never_loaded(attention: kernorch.CompiledModel, tmp_path: Path) -> None:
    """A kernels.so dropped into a plan directory (with a constructor that runs on dlopen) is never loaded:
    the library is always built here from the verified source."""
    import subprocess

    directory = attention.save(tmp_path / "plan")
    marker = tmp_path / "constructor-ran"
    evil = tmp_path / "evil.c"
    evil.write_text('#include <stdio.h>\n__attribute__((constructor)) static void run(void) '
                    f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')  # fmt: skip
    subprocess.run(["cc", "-shared", "-fPIC", str(evil), "-o", str(directory / "kernels.so")], check=True)
    loaded = kernorch.load(directory)
    x = np.random.default_rng(5).standard_normal((1, 64, 128)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), attention(x))
    assert not marker.exists()
    assert loaded.executor.library_path is None or loaded.executor.library_path.parent != directory


def test_a_consistent_but_edited_plan_is_refused(attention: kernorch.CompiledModel, tmp_path: Path) -> None:
    """Merging two kernels in plan.json (manifest re-signed, every listed checksum valid) used to bind
    symbols by index and segfault; now the regenerated C differs from the shipped source."""
    directory = attention.save(tmp_path / "plan")

    def merge_first_two(plan: dict[str, Any]) -> None:
        first, second = plan["kernels"][0], plan["kernels"][1]
        produced_by_first = set(first["outputs"])
        merged_nodes = sorted(set(first["nodes"]) | set(second["nodes"]))
        plan["kernels"][0:2] = [{"nodes": merged_nodes, "outputs": sorted(produced_by_first | set(second["outputs"]))}]
        plan["costs"] = plan["costs"][1:]

    resign(directory, merge_first_two)
    with pytest.raises(ArtifactError, match=r"kernels.c is not the code plan.json generates|malformed"):
        kernorch.load(directory)
    directory = attention.save(tmp_path / "plan2")
    source = (directory / "kernels.c").read_text().replace("+", "-", 1)
    (directory / "kernels.c").write_text(source)
    import hashlib

    resign(directory, lambda plan: plan["sha256"].update({"kernels.c": hashlib.sha256(source.encode()).hexdigest()}))
    with pytest.raises(ArtifactError, match="kernels.c is not the code plan.json generates"):
        kernorch.load(directory)


def test_every_file_hash_is_required(attention: kernorch.CompiledModel, tmp_path: Path) -> None:
    directory = attention.save(tmp_path / "plan")
    resign(directory, lambda plan: plan["sha256"].pop("kernels.c"))
    with pytest.raises(ArtifactError, match="lists no hash for kernels.c"):
        kernorch.load(directory)
    directory = attention.save(tmp_path / "plan2")
    (directory / "weights.npz").unlink()
    with pytest.raises(ArtifactError, match="weights.npz is missing"):
        kernorch.load(directory)


def test_a_plan_from_another_cpu_is_rebuilt_here(attention: kernorch.CompiledModel, tmp_path: Path) -> None:
    directory = attention.save(tmp_path / "plan")
    plan = json.loads((directory / "plan.json").read_text())
    from kernorch.machine import isa_digest

    assert plan["built_on"]["isa_digest"] == isa_digest() and plan["built_on"]["isa_flags"]
    resign(directory, lambda plan: plan["built_on"].update(isa_digest="0" * 16, isa_flags=["sse2"]))
    loaded = kernorch.load(directory)
    assert loaded.metadata.get("rebuilt_for_this_cpu") is True
    x = np.random.default_rng(6).standard_normal((1, 64, 128)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), attention(x))


def test_compile_cache_key_includes_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernorch.codegen.program import compiler

    here = compiler.library_path("int f(void) { return 0; }")
    monkeypatch.setattr(compiler, "isa_digest", lambda: "another-cpu")
    assert compiler.library_path("int f(void) { return 0; }") != here


def test_threads_are_per_model_and_restored(attention: kernorch.CompiledModel) -> None:
    import torch

    one = kernorch.compile(self_attention_block(), cost="analytic", device="cpu-nominal", threads=1)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        x = np.random.default_rng(7).standard_normal((1, 64, 128)).astype(np.float32)
        np.testing.assert_allclose(one(x), attention(x), rtol=1e-5, atol=1e-6)
        assert torch.get_num_threads() == 3  # neither model left its count behind
        assert (one.threads, attention.threads) == (1, 2)
    finally:
        torch.set_num_threads(previous)


def test_unknown_option_is_one_line() -> None:
    with pytest.raises(kernorch.KernorchError, match="unknown option"):
        kernorch.compile(self_attention_block(), thread=2)
    with pytest.raises(kernorch.KernorchError, match="threads must be an integer from 1 to 1024"):
        kernorch.compile(self_attention_block(), threads=0)


def test_a_loaded_plan_runs_without_torch(tmp_path: Path) -> None:
    """The hot path is generated C and oneDNN: load and run a conv model with torch made unimportable."""
    import subprocess
    import sys

    proto = conv_norm_act_block(channels=8, size=16)
    model = kernorch.compile(proto, cost="analytic", device="cpu-nominal")
    assert ONEDNN in model.executor.backends and GENERATED_C in model.executor.backends
    plan = model.save(tmp_path / "plan")
    x = np.random.default_rng(8).standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    script = (
        "import sys\n"
        "sys.modules['torch'] = None  # any `import torch` now raises ImportError\n"
        "import numpy as np, kernorch\n"
        f"m = kernorch.load({str(plan)!r})\n"
        f"np.save({str(tmp_path / 'y.npy')!r}, m.run({{'x': np.load({str(tmp_path / 'x.npy')!r})}})['y'])\n"
        "assert 'torch' not in {name.split('.')[0] for name, mod in sys.modules.items() if mod is not None}\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    expected = run_onnxruntime(proto, {"x": x})["y"]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-4, atol=1e-4)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("transposed matmul operand read untransposed",
         "tuple(shape[p] for p in perm), tuple(strides[p] for p in perm)",
         "tuple(shape[p] for p in perm), tuple(strides)",
         file="kernorch/ir/strided.py",
         tests=("tests/test_api.py", "kernorch/runtime/executor_test.py")),
    # saved plans
    here("shipped C not compared with the plan",
         "if regenerated.encode() != shipped_source:",
         "if False:",
         file="kernorch/runtime/artifact.py"),
    here("manifest hash not checked",
         "if plan.get(MANIFEST_HASH_KEY) != manifest_digest(plan):",
         "if False:",
         file="kernorch/runtime/artifact.py"),
    here("compile cache ignores the CPU",
         'version, isa_digest()])',
         'version])',
         file="kernorch/codegen/program/compiler.py"),
]  # fmt: skip
