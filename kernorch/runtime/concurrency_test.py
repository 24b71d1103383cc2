"""One compiled model, many callers: concurrent calls equal the same calls made one at a time, bit for bit,
through the kernel runtime, the rProgram runtime, a loaded plan and the torch backend; thread counts set by a
call never outlive it."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kernorch
from kernorch.codegen.backends import GENERATED_C, ONEDNN, ONNXRUNTIME
from kernorch.devtools.mutate import here
from kernorch.errors import FallbackWarning
from kernorch.runtime.compiled import CompiledModel

CALLERS = 8
CALLS = 64  # distinct inputs, each called CALLS_EACH times in a shuffled order
CALLS_EACH = 3


def _mixed_model() -> onnx.ModelProto:
    """MatMul+bias (a oneDNN call), a layer norm and tanh (generated C), a Det with no kernorch rule (run by
    onnxruntime from Python, between native stretches) and a Softmax after it."""
    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2, name)
               for name, shape in (("w1", (48, 96)), ("b1", (96,)), ("w2", (96, 4)))]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("LayerNormalization", ["hb", "b1"], ["n"], axis=-1),
             helper.make_node("Tanh", ["n"], ["g"]),
             helper.make_node("MatMul", ["g", "w2"], ["m"]),
             helper.make_node("Reshape", ["m", "shape"], ["sq"]), helper.make_node("Det", ["sq"], ["d"]),
             helper.make_node("Softmax", ["d"], ["y"], axis=-1)]  # fmt: skip
    weights.append(numpy_helper.from_array(np.array([8, 4, 4], np.int64), "shape"))
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 4, 48])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8]),
                               helper.make_tensor_value_info("m", TensorProto.FLOAT, [8, 4, 4])], weights)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(2)
    return [rng.standard_normal((8, 4, 48)).astype(np.float32) for _ in range(CALLS)]


def _hammer(call: Callable[[np.ndarray], list[np.ndarray]], inputs: list[np.ndarray]) -> None:
    """Every input alone first, then all of them from CALLERS threads at once: the same arrays, bit for bit."""
    serial = [call(x) for x in inputs]
    order = [i for _ in range(CALLS_EACH) for i in range(len(inputs))]
    np.random.default_rng(3).shuffle(order)
    start = threading.Barrier(CALLERS)

    def worker(chunk: list[int]) -> list[tuple[int, list[np.ndarray]]]:
        start.wait()  # every caller starts at once
        return [(i, call(inputs[i])) for i in chunk]

    with ThreadPoolExecutor(CALLERS) as pool:
        results = [r for part in pool.map(worker, [order[c::CALLERS] for c in range(CALLERS)]) for r in part]
    assert len(results) == len(order)
    differing = [i for i, outputs in results
                 if any(not np.array_equal(a, b, equal_nan=True) for a, b in zip(outputs, serial[i], strict=True))]
    assert not differing, f"{len(differing)} of {len(results)} concurrent calls differ from the same call alone"


@pytest.fixture(scope="module")
def compiled() -> CompiledModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        model = kernorch.compile(_mixed_model(), cost="analytic")
    assert isinstance(model, CompiledModel)
    return model


def _outputs(model: CompiledModel) -> Callable[[np.ndarray], list[np.ndarray]]:
    return lambda x: list(model.run({"x": x}).values())


def test_the_model_mixes_native_library_generated_and_python_kernels(compiled: CompiledModel) -> None:
    backends = set(compiled.executor.backends)
    assert {ONEDNN, GENERATED_C, ONNXRUNTIME} <= backends, backends


def _hammer_until_overlapped(model: CompiledModel, tries: int = 5) -> None:
    """`_hammer` until the callers really overlapped (a second workspace was taken): a call that takes a few
    hundred microseconds may finish before the next caller asks, and then one hammer proves nothing."""
    for _ in range(tries):
        _hammer(_outputs(model), _inputs())
        if model.executor.workspaces > 1:
            return
    raise AssertionError(f"{tries} rounds of {CALLERS} callers never overlapped")


def test_concurrent_calls_equal_serial_calls(compiled: CompiledModel) -> None:
    _hammer_until_overlapped(compiled)


def test_max_workspaces_bounds_the_pool_and_callers_wait(tmp_path: Path) -> None:
    """Eight callers on a plan allowed two workspaces: never more than two exist, every call completes and equals
    the same call alone (callers beyond the bound wait for an idle workspace; none fails)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        bounded = kernorch.compile(_mixed_model(), cost="analytic", max_workspaces=2)
    assert isinstance(bounded, CompiledModel)
    _hammer(_outputs(bounded), _inputs())
    assert bounded.executor.peak_workspaces == 2 and bounded.executor.workspaces == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        loaded = kernorch.load(bounded.save(tmp_path / "plan"), max_workspaces=1)
    assert isinstance(loaded, CompiledModel)
    _hammer(_outputs(loaded), _inputs()[:16])
    assert loaded.executor.peak_workspaces == 1
    with pytest.raises(kernorch.errors.KernorchError, match="max_workspaces must be a positive integer"):
        kernorch.compile(_mixed_model(), cost="analytic", max_workspaces=0)


def test_concurrent_calls_of_a_loaded_plan_as_rprogram(compiled: CompiledModel, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        loaded = kernorch.load(compiled.save(tmp_path / "plan"), runtime="rprogram")
    assert isinstance(loaded, CompiledModel)
    assert loaded.executor.rprogram is not None and loaded.executor.rprogram.program is not None
    _hammer_until_overlapped(loaded)


def test_a_rebuilt_rprogram_reaches_every_workspace(compiled: CompiledModel) -> None:
    executor = compiled.executor
    x = _inputs()[0]
    expected = executor({"x": x})
    with ThreadPoolExecutor(4) as pool:  # several workspaces exist before the schedule is built
        list(pool.map(lambda _: executor({"x": x}), range(16)))
    runner = executor.build_rprogram()
    executor.runtime = "rprogram"
    try:
        with ThreadPoolExecutor(4) as pool:
            for outputs in pool.map(lambda _: executor({"x": x}), range(16)):
                for name, value in expected.items():
                    np.testing.assert_array_equal(outputs[name], value)
        assert all(w.rprogram is None or w.rprogram.program is runner.program for w in executor._workspaces)
    finally:
        executor.runtime = "kernels"


def _omp_threads() -> int:
    library = ctypes.CDLL("libgomp.so.1")
    return int(library.omp_get_max_threads())


def _set_omp_threads(count: int) -> None:
    ctypes.CDLL("libgomp.so.1").omp_set_num_threads(ctypes.c_int(count))


def test_the_calling_threads_openmp_count_is_restored_after_a_call(compiled: CompiledModel) -> None:
    """OpenMP's count is the calling thread's: a model with 2 threads called from a thread set to 5 (or 3, 4)
    leaves it at 5, in the main thread and in every worker, one call at a time and overlapping."""
    inputs = _inputs()[:8]
    assert compiled.threads == 2
    _set_omp_threads(5)
    try:
        compiled.run({"x": inputs[0]})
        assert _omp_threads() == 5

        def call(i: int) -> bool:
            own = 3 + i % 3  # never the model's 2
            _set_omp_threads(own)
            compiled.run({"x": inputs[i % len(inputs)]})
            return _omp_threads() == own

        with ThreadPoolExecutor(CALLERS) as pool:
            restored = list(pool.map(call, range(120)))
        assert all(restored), f"{restored.count(False)} of {len(restored)} calls left their count behind"
        assert _omp_threads() == 5
    finally:
        _set_omp_threads(2)


def test_thread_counts_never_leak_from_overlapping_calls() -> None:
    """Models with 1 and 2 threads called at once from many threads: afterwards torch's count and each thread's
    OpenMP count are what they were before."""
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        one, two = (kernorch.compile(_mixed_model(), cost="analytic", threads=n) for n in (1, 2))
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        inputs = _inputs()[:16]

        def call(i: int) -> int:
            (one if i % 2 else two).run({"x": inputs[i % len(inputs)]})
            return _omp_threads()

        omp_before = _omp_threads()
        with ThreadPoolExecutor(CALLERS) as pool:
            list(pool.map(call, range(200)))
        assert torch.get_num_threads() == 3
        assert _omp_threads() == omp_before
    finally:
        torch.set_num_threads(before)


_OVERLAPPING_SCOPES = """
import threading, torch
from kernorch.runtime.threads import thread_count
torch.set_num_threads(3)
a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
def first():
    with thread_count(1):
        a_in.set(); b_in.wait(10)
    a_out.set()
def second():
    a_in.wait(10)
    with thread_count(2):
        b_in.set(); a_out.wait(10)
threads = [threading.Thread(target=first), threading.Thread(target=second)]
for t in threads: t.start()
for t in threads: t.join(20)
print(torch.get_num_threads())
"""


def test_overlapping_thread_scopes_restore_torchs_count() -> None:
    """The interleaving that leaked before: scope A (1 thread) enters, B (2) enters, A leaves, B leaves. In a
    fresh interpreter: torch's count as the user set it, with nothing else in the process touching it."""
    pytest.importorskip("torch")
    result = subprocess.run([sys.executable, "-c", _OVERLAPPING_SCOPES], capture_output=True, text=True, timeout=120,
                            check=True)  # fmt: skip
    assert result.stdout.split() == ["3"], result.stdout + result.stderr


def test_torch_backend_called_from_many_threads() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                              torch.nn.Linear(64, 8)).eval()  # fmt: skip
    fast = torch.compile(net, backend="kernorch", dynamic=False, options={"cost": "analytic"})
    inputs = [torch.randn(4, 48) for _ in range(CALLS)]
    with torch.no_grad():
        fast(inputs[0])  # compiled here, once

        def call(x: np.ndarray) -> list[np.ndarray]:
            with torch.no_grad():
                return [fast(torch.from_numpy(x)).numpy()]

        _hammer(call, [x.numpy() for x in inputs])


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    # one model, many callers
    here("a busy workspace is shared",
         "if w.lock.acquire(blocking=False)), None)",
         "if w.lock.acquire(blocking=False) or True), None)",
         file="kernorch/runtime/executor.py"),
    here("each overlapping scope saves torch's count",
         "if self._active == 0:\n                self._saved",
         "if True:\n                self._saved",
         file="kernorch/runtime/threads.py"),
    here("a call leaves its OpenMP thread count in the calling thread",
         "            self._openmp.omp_set_num_threads(self._previous)",
         "            pass",
         file="kernorch/runtime/threads.py"),
    here("the workspace pool grows past max_workspaces",
         "(self.max_workspaces is None or count < self.max_workspaces)",
         "True",
         file="kernorch/runtime/executor.py"),
    here("a call leaves torch's thread count behind",
         "                torch.set_num_threads(self._saved)",
         "                pass",
         file="kernorch/runtime/threads.py"),
]  # fmt: skip
