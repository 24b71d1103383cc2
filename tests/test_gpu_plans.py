"""GPU plans on a machine without a GPU: planned for an A100 (analytic cost), saved with their Triton sources,
verified at load like the C of CPU plans, refused in one line by `kernorch run`, and run kernel by kernel in
Triton's interpreter by `kernorch check --compiled`. The shared models' plans are verified kernel by kernel in
`make gpu-verify` (all nine) and here for the one that takes a second (the suite's ten minutes are spent)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import kernorch
from kernorch.cli import main
from kernorch.codegen.triton import nvidia_device_present
from kernorch.devtools.mutate import here
from kernorch.errors import KernorchError
from kernorch.runtime.artifact import ArtifactError
from kernorch.tools.demo_models import conv_norm_act_block, self_attention_block
from tests.conftest import SHARED_MODELS

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(nvidia_device_present(), reason="checks the CPU-only path")


@pytest.fixture(scope="module")
def saved_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("gpu")
    model = directory / "attention.onnx"
    model.write_bytes(self_attention_block(seq=32, hidden=64).SerializeToString())
    plan = directory / "plan"
    assert main(["optimize", str(model), "--device", "a100", "--cost", "analytic", "-o", str(plan)]) == 0
    return model, plan


def test_a_gpu_plan_saves_its_triton_and_loads_verified(saved_plan: tuple[Path, Path]) -> None:
    model, plan = saved_plan
    manifest = json.loads((plan / "plan.json").read_text())
    assert manifest["device"] == "a100" and "kernels.py" in manifest["sha256"] and not (plan / "kernels.c").exists()
    source = (plan / "kernels.py").read_text()
    assert "@triton.jit" in source and "tl.load" in source
    loaded = kernorch.load(plan)
    assert isinstance(loaded, kernorch.GpuModel) and loaded.device == "a100"
    assert loaded.source() == source  # what was verified is what would be imported


def test_without_a_gpu_run_refuses_in_one_line(saved_plan: tuple[Path, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    _, plan = saved_plan
    assert main(["run", str(plan)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "no CUDA device" in error and "Traceback" not in error
    with pytest.raises(KernorchError, match="no CUDA device"):
        kernorch.load(plan)(np.zeros((1, 32, 64), np.float32))


def test_the_loaded_plan_runs_in_the_interpreter_like_onnxruntime(saved_plan: tuple[Path, Path]) -> None:
    model, plan = saved_plan
    from kernorch.runtime.compiled import load_model

    loaded = load_model(plan, interpret=True)
    x = np.random.default_rng(0).standard_normal((1, 32, 64)).astype(np.float32)
    session = ort.InferenceSession(str(model))
    expected = session.run(None, {session.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(loaded(x), expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))


def test_an_edited_triton_source_is_refused(saved_plan: tuple[Path, Path], tmp_path: Path) -> None:
    import shutil

    _, plan = saved_plan
    copy = tmp_path / "edited"
    shutil.copytree(plan, copy)
    text = (copy / "kernels.py").read_text().replace("tl.load(", "tl.load(  ", 1)
    (copy / "kernels.py").write_text(text)
    with pytest.raises(ArtifactError, match="checksum"):
        kernorch.load(copy)
    manifest = json.loads((copy / "plan.json").read_text())  # the hash updated too: the regeneration catches it
    import hashlib

    manifest["sha256"]["kernels.py"] = hashlib.sha256(text.encode()).hexdigest()
    from kernorch.runtime.artifact import MANIFEST_HASH_KEY, manifest_digest

    manifest[MANIFEST_HASH_KEY] = manifest_digest(manifest)
    (copy / "plan.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="not the code plan.json generates"):
        kernorch.load(copy)
    for device in (["a100"], "tpu"):  # a hostile device field (its hash forged too) is refused in one line
        manifest["device"] = device
        manifest[MANIFEST_HASH_KEY] = manifest_digest(manifest)
        (copy / "plan.json").write_text(json.dumps(manifest))
        with pytest.raises(ArtifactError, match="unknown device"):
            kernorch.load(copy)


def test_check_compiled_runs_a_gpu_plan_in_the_interpreter(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    model = tmp_path / "block.onnx"
    model.write_bytes(conv_norm_act_block(channels=8, size=12).SerializeToString())
    assert main(["check", str(model), "--compiled", "--device", "a100", "--cost", "analytic"]) == 0
    out = capsys.readouterr().out
    assert "GPU plan for a100, run in Triton interpreter" in out and "PASS" in out.upper()


def test_explain_draws_a_gpu_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("graphviz")
    import shutil

    if shutil.which("dot") is None:
        pytest.skip("graphviz's dot is not installed")
    model = tmp_path / "attention.onnx"
    model.write_bytes(self_attention_block(seq=16, hidden=32).SerializeToString())
    svg = tmp_path / "plan.svg"
    assert main(["explain", str(model), "--device", "h100", "--cost", "analytic", "--svg", str(svg),
                 "--gir", "0"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "runs as: " in out and ("generated Triton" in out or "cuBLAS" in out)
    assert "generated Triton" in svg.read_text()


@pytest.mark.parametrize("name", ["lstm_tc"])  # all nine: make gpu-verify (20 minutes; bert_mini alone takes 14 s)
def test_shared_model_gpu_plans_match_kernel_by_kernel(name: str) -> None:
    from kernorch.tools.gpu_verify import verify_model

    path = SHARED_MODELS / f"{name}.onnx"
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    report = verify_model(str(path), "a100")
    assert report.distinct > 0 and not report.failures, report.failures
    assert report.by_backend["triton"] > 0


def test_the_gpu_bench_runs_every_contender_in_its_own_process(tmp_path: Path) -> None:
    from kernorch.tools.gpu_bench import bench_gpu, format_gpu_report

    model = tmp_path / "block.onnx"
    model.write_bytes(conv_norm_act_block(channels=4, size=8).SerializeToString())
    # on the CPU here (the same code, kernorch in Triton's interpreter); bench/gpu.sh runs it on a GPU
    report = bench_gpu(str(model), {"cost": "analytic", "device": "a100"}, runs=2, device="cpu",
                       contenders=("kernorch", "torch eager"))  # fmt: skip
    for name in ("kernorch", "torch eager"):
        result = report["contenders"][name]
        assert "error" not in result, result
        assert result["rel_err"] < 1e-4 and result["median_ms"] > 0
    assert report["speedup_vs"]["torch eager"] > 0 and "kernorch" in "\n".join(format_gpu_report(report))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16"])
def test_a_gpu_plan_holds_8_and_16_bit_integers(dtype: str) -> None:
    """The GPU runtime allocates every integer type the CPU plan computes (int16 and uint16 had no torch dtype
    there: the plan died in a KeyError); sums that wrap equal onnxruntime's."""
    from kernorch.options import Options
    from kernorch.testing import single_op_model
    from kernorch.tools.check import check_model

    info = np.iinfo(dtype)
    a = np.array([[info.max, info.min, 7, 1]], dtype)
    report, _ = check_model(single_op_model("Add", {"a": a, "b": a}), compiled=True,
                            options=Options(cost="analytic", device="a100"))  # fmt: skip
    assert report.passed and report.worst_relative == 0.0


@pytest.mark.parametrize("seed", range(12))
def test_random_plans_run_on_the_gpu_runtime_like_the_reference(seed: int) -> None:
    """Random graphs cut into random valid kernels (views into outputs, scratch, reductions, layouts among them)."""
    from kernorch.codegen.target import GPU_TARGETS
    from kernorch.runtime.executor_test import random_case
    from kernorch.runtime.gpu_plan import GpuProgram

    graph, plan, feeds, expected = random_case(seed, 6 + seed % 5)
    actual = GpuProgram(graph, plan, GPU_TARGETS["a100"], interpret=True, streams=1)(feeds)
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_kernels_captured_on_one_stream_depth_never_read_each_other(seed: int) -> None:
    """The CUDA graph puts kernels of one depth on separate streams: none may read another's output."""
    from kernorch.codegen.target import GPU_TARGETS
    from kernorch.runtime.executor_test import random_case
    from kernorch.runtime.gpu_plan import GpuProgram

    graph, plan, _, _ = random_case(seed, 10)
    levels = GpuProgram(graph, plan, GPU_TARGETS["a100"], interpret=True)._levels()
    latest: dict[str, int] = {}  # a value's latest producer before a kernel (a plan may recompute it later)
    for k, kernel in enumerate(plan):
        for value in kernel.inputs:
            if value in latest:
                assert levels[latest[value]] < levels[k]
        latest.update((value, k) for value in kernel.outputs)
    assert max(levels) < len(plan)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("gpu plans: a saved plan's Triton is not compared with the plan's",
         "    if regenerated.encode() != shipped_source:",
         "    if False:",
         file="kernorch/runtime/artifact.py"),
]  # fmt: skip
