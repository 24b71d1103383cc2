"""Caches and plans are untrusted input: a library kernorch did not build is never loaded, a plan's threads and
sizes are bounded, a weights.npz that would inflate beyond what the plan declares is refused before it is
decompressed, concurrent creators of one profile database lose nothing, Ray workers' timings are validated, and
a plan or model whose attributes would index out of bounds is refused naming the node."""

from __future__ import annotations

import io
import json
import multiprocessing
import re
import stat
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kernorch
from kernorch.api import ArtifactError
from kernorch.cli import main
from kernorch.codegen.program.compiler import UntrustedCache, compile_source, library_path
from kernorch.cost.profile_db import Measurement, ProfileDatabase
from kernorch.cost.remote import validated
from kernorch.devtools.mutate import here
from kernorch.errors import KernorchError
from kernorch.tools.demo_models import conv_norm_act_block

from .test_api import resign


@pytest.fixture(scope="module")
def model() -> kernorch.CompiledModel:
    return kernorch.compile(conv_norm_act_block(channels=8, size=16), cost="analytic")


def _x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32)


def _evil_library(target: Path, marker: Path) -> None:
    source = target.with_suffix(".c")
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void run(void) '
                      f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')  # fmt: skip
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(target)], check=True)
    source.unlink()


def test_a_foreign_library_in_the_compile_cache_is_never_loaded(model: kernorch.CompiledModel,
                                                                 tmp_path: Path) -> None:  # fmt: skip
    """Someone who can write the cache plants a library at the name a public plan's source hashes to (with a
    forged MAC file beside it): kernorch rebuilds it instead of loading it, and the plan computes right."""
    cache = tmp_path / "cache"
    directory = model.save(tmp_path / "plan")
    target = library_path(model.executor.source, cache)
    target.parent.mkdir(parents=True)
    marker = tmp_path / "constructor-ran"
    _evil_library(target, marker)
    target.with_name(target.name + ".mac").write_text("0" * 64)
    loaded = kernorch.load(directory, cache_dir=cache)
    assert loaded.executor.library_path == target
    np.testing.assert_array_equal(loaded(_x()), model(_x()))
    assert not marker.exists()


def test_a_library_signed_with_another_key_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restored CI cache: libraries and MACs built by another kernorch (another key) are rebuilt, not loaded."""
    import kernorch.codegen.program.compiler as compiler

    source = "int ko_probe(void) { return 7; }\n"
    built = compile_source(source, tmp_path)
    first = built.read_bytes()
    import kernorch.signing as signing

    monkeypatch.setattr(signing, "signing_key", lambda: b"\x01" * 32)  # the other machine's key
    compiler._verified.clear()
    assert not compiler.is_trusted(built)
    with pytest.raises(UntrustedCache, match="not built by this user's kernorch"):
        compiler.load_library(built)
    rebuilt = compile_source(source, tmp_path)
    assert rebuilt == built and compiler.is_trusted(rebuilt) and rebuilt.read_bytes() == first
    assert compiler.load_library(rebuilt).ko_probe() == 7


def test_a_cache_others_can_write_is_refused_in_one_line(tmp_path: Path) -> None:
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    kernels.chmod(0o777)
    with pytest.raises(UntrustedCache, match="can be changed by other users.*chmod 700") as error:
        compile_source("int ko_probe(void) { return 1; }\n", tmp_path)
    assert "\n" not in str(error.value) and error.value.exit_code == 2
    kernels.chmod(0o700)
    assert compile_source("int ko_probe(void) { return 1; }\n", tmp_path).is_file()
    assert stat.S_IMODE(kernels.stat().st_mode) == 0o700


@pytest.mark.parametrize("threads", [0, 10**6, "2", True, 2.5])
def test_a_plans_thread_count_is_bounded(model: kernorch.CompiledModel, tmp_path: Path, threads: Any) -> None:
    directory = model.save(tmp_path / "plan")
    resign(directory, lambda plan: plan.update(threads=threads))
    with pytest.raises(ArtifactError, match="threads must be an integer from 1 to 1024"):
        kernorch.load(directory)


def test_a_plans_sizes_are_bounded(model: kernorch.CompiledModel, tmp_path: Path) -> None:
    """A value declared 2^25 x 2^25 (wrapping int64 arithmetic downstream) or merely larger than memory."""
    directory = model.save(tmp_path / "plan")
    output = json.loads((directory / "plan.json").read_text())["graph"]["outputs"][0]
    resign(directory, lambda plan: plan["graph"]["types"][output].__setitem__(0, [2**25, 2**25]))
    with pytest.raises(ArtifactError, match="more than 2\\^40 elements"):
        kernorch.load(directory)
    directory = model.save(tmp_path / "plan2")
    constant = json.loads((directory / "plan.json").read_text())["graph"]["constants"][0]
    resign(directory, lambda plan: plan["graph"]["types"].__setitem__(constant, [[2**38], "float32"]))
    with pytest.raises(KernorchError, match="needs .* GiB .*available"):
        kernorch.load(directory)


def test_weights_that_would_inflate_beyond_the_plan_are_refused_unread(model: kernorch.CompiledModel,
                                                                      tmp_path: Path) -> None:  # fmt: skip
    """A zip bomb: the first constant's member holds 256 MiB of zeros (256 KiB compressed). Refused from the
    archive's directory, before a byte is inflated."""
    directory = model.save(tmp_path / "plan")
    plan = json.loads((directory / "plan.json").read_text())
    buffer = io.BytesIO()
    with zipfile.ZipFile(directory / "weights.npz") as original, \
            zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bomb:  # fmt: skip
        for member in original.infolist():
            if member.filename == "c0.npy":
                with bomb.open("c0.npy", "w") as out:
                    chunk = bytes(2**20)
                    for _ in range(256):
                        out.write(chunk)
            else:
                bomb.writestr(member, original.read(member))
    (directory / "weights.npz").write_bytes(buffer.getvalue())
    assert len(buffer.getvalue()) < 2**21
    import hashlib

    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    resign(directory, lambda p: p["sha256"].update({"weights.npz": digest}))
    declared = plan["graph"]["types"][sorted(plan["graph"]["constants"])[0]]
    assert np.prod(declared[0]) * 4 < 2**20
    with pytest.raises(ArtifactError, match="c0.npy inflates to 268435456 bytes"):
        kernorch.load(directory)


def _store_rows(path: str, worker: int, start: Any) -> None:
    start.wait()
    database = ProfileDatabase(Path(path))
    for row in range(40):
        database.store(f"kernel-{worker}-{row}", "machine", Measurement(1e-6 * (row + 1), 5, 0.1, False))


def test_processes_creating_a_fresh_profile_database_at_once_lose_nothing(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(6)
    path = tmp_path / "profiles.sqlite"
    workers = [context.Process(target=_store_rows, args=(str(path), w, start)) for w in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    assert ProfileDatabase(path).count("machine") == 6 * 40
    assert not list(tmp_path.glob("*.bad-*"))


def test_ray_workers_results_are_validated() -> None:
    good = ["a", 1e-5, 5, 0.1, False]
    reply = {"machine": "m|threads=2", "worker": "host:1", "results": [
        good, ["b", float("nan"), 5, 0.1, False], ["c", -1.0, 5, 0.1, False], ["d", float("inf"), 5, 0.1, False],
        ["e", 1e-5, 0, 0.1, False], ["f", 1e-5, 5, float("nan"), False], ["not-asked", 1e-5, 5, 0.1, False],
        ["g", "fast", 5, 0.1, False], ["h", 1e-5], None]}  # fmt: skip
    kept, dropped = validated(reply, {"a", "b", "c", "d", "e", "f", "g", "h"})
    assert [r.signature for r in kept] == ["a"] and dropped == 9
    assert validated({"machine": 7, "results": [good]}, {"a"}) == ([], 1)
    assert validated("nonsense", {"a"}) == ([], 1)


# ---------------------------------------------------------------------------------- contracts at import and load


def _gather_elements_model(indices_shape: tuple[int, ...]) -> onnx.ModelProto:
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, [2, 3])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(indices_shape))
    index = numpy_helper.from_array(np.zeros(indices_shape, np.int64), "idx")
    node = helper.make_node("GatherElements", ["data", "idx"], ["y"], axis=1, name="too_wide")
    graph = helper.make_graph([node], "ge", [data], [out], [index])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_gather_elements_indices_beyond_the_data_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Off the gather axis an index is its own position: indices 4 rows tall over data 2 rows tall would read past
    the buffer. kernorch's rule refuses it (the node then runs through onnxruntime, which refuses it too): exit 2,
    naming the node, never an out-of-bounds read; a saved plan with such a node is refused when it is loaded."""
    path = tmp_path / "ge.onnx"
    onnx.save(_gather_elements_model((4, 3)), path)
    assert main(["check", str(path), "--compiled", "--cost", "analytic"]) == 2
    err = capsys.readouterr().err
    assert "too_wide" in err and "within bounds" in err and len(err.strip().splitlines()) == 1
    ok = kernorch.compile(_gather_elements_model((2, 3)), cost="analytic")
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(ok(data), np.repeat(data[:, :1], 3, axis=1))


@pytest.mark.parametrize("edit, message", [
    (lambda n: n["attrs"].__setitem__("ranges", [[0, 1, 1], [0, 40, 1], [0, 16, 1], [0, 16, 1]]), "reads outside"),
    (lambda n: n["attrs"].__setitem__("ranges", [[0, 1, 1], [0, 8, 0], [0, 16, 1], [0, 16, 1]]), "reads outside"),
    (lambda n: n["attrs"].__setitem__("ranges", [[0, 1, 1], [0, 8, 1], [0, 16, "1"], [0, 16, 1]]),
     "must be an integer"),
])  # fmt: skip
def test_an_edited_slice_in_a_plan_is_refused_naming_it(tmp_path: Path, edit: Any, message: str) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])
    starts, ends = (numpy_helper.from_array(np.array(v, np.int64), n) for v, n in (([0], "s"), ([4], "e")))
    axes = numpy_helper.from_array(np.array([1], np.int64), "a")
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Slice", ["r", "s", "e", "a"], ["y"])]
    sliced = kernorch.compile(helper.make_model(helper.make_graph(nodes, "s", [x], [y], [starts, ends, axes]),
                                                opset_imports=[helper.make_opsetid("", 17)]), cost="analytic")
    directory = sliced.save(tmp_path / "plan")

    def hostile(plan: dict[str, Any]) -> None:
        edit(next(n for n in plan["graph"]["nodes"] if n["prim"] == "slice"))

    resign(directory, hostile)
    with pytest.raises(ArtifactError, match=message):
        kernorch.load(directory)


@pytest.mark.parametrize("attrs, message", [
    ({"strides": [0, 1]}, "non-positive strides"),
    ({"dilations": [1, -2]}, "non-positive strides/dilations"),
    ({"kernel_shape": [3]}, "kernel_shape rank"),
])  # fmt: skip
def test_pooling_attributes_out_of_range_are_refused_at_import(tmp_path: Path, attrs: dict[str, Any], message: str,
                                                                capsys: pytest.CaptureFixture) -> None:  # fmt: skip
    settings = {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1]} | attrs
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])
    node = helper.make_node("MaxPool", ["x"], ["y"], name="the_pool", **settings)
    path = tmp_path / "pool.onnx"
    onnx.save(helper.make_model(helper.make_graph([node], "p", [x], [y]),
                                opset_imports=[helper.make_opsetid("", 17)]), path)  # fmt: skip
    code = main(["check", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "the_pool" in err and re.search(message, err), err


@pytest.mark.parametrize("edit, message", [
    (dict(strides=[0, 1]), "strides\\[0\\] = 0 is out of range"),
    (dict(dilations=[1, -2]), "dilations\\[1\\] = -2 is out of range"),
    (dict(pads=[3, 1, 1, 1]), "must be smaller than the window"),
    (dict(kernel=[3, 3, 3, 3, 3]), "a window over 5 axes of a rank-4 tensor"),
    (dict(ceil_mode=2), "ceil_mode = 2 is not one of"),
])  # fmt: skip
def test_window_attributes_edited_in_a_plan_are_refused(tmp_path: Path, edit: dict[str, Any], message: str) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    pooled = kernorch.compile(helper.make_model(helper.make_graph([node], "p", [x], [y]),
                                                opset_imports=[helper.make_opsetid("", 17)]), cost="analytic")
    directory = pooled.save(tmp_path / "plan")
    resign(directory, lambda plan: next(n for n in plan["graph"]["nodes"] if n["prim"] == "window_max")["attrs"]
           .update(edit))  # fmt: skip
    with pytest.raises(ArtifactError, match=message):
        kernorch.load(directory)


def test_workspace_memory_is_checked_before_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernorch.pipeline as pipeline
    import kernorch.runtime.memory as memory

    monkeypatch.setattr(memory, "available_bytes", lambda: 1024)
    with pytest.raises(memory.OutOfMemory, match="the model at these input shapes needs .*value 'x'.*available"):
        kernorch.compile(conv_norm_act_block(channels=8, size=16), cost="analytic")  # before planning
    monkeypatch.setattr(pipeline, "check_values_fit", lambda graph, what: None)  # the executor's own check
    with pytest.raises(memory.OutOfMemory, match="the plan needs .*available"):
        kernorch.compile(conv_norm_act_block(channels=8, size=16), cost="analytic")



@pytest.mark.parametrize("refused", [{"99": "x"}, {"-1": "x"}, {"0": 7}, ["0"], {"0": "x" * 400}])
def test_a_malformed_list_of_refused_kernels_is_refused(model: kernorch.CompiledModel, tmp_path: Path,
                                                        refused: Any) -> None:  # fmt: skip
    directory = model.save(tmp_path / "plan")
    resign(directory, lambda plan: plan.update(refused_native=refused))
    with pytest.raises(ArtifactError, match="malformed"):
        kernorch.load(directory)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("planning starts on a model whose value alone exceeds memory",
         '    check_values_fit(graph, "the model at these input shapes")\n',
         "",
         file="kernorch/pipeline.py"),
]  # fmt: skip
