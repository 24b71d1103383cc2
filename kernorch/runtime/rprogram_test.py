"""The rProgram runtime computes what the kernel-by-kernel runtime and onnxruntime compute: random primitive
graphs under random plans, a branchy NAS-like model, a region given fewer threads than vEUs, failing kernels."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernorch.api import compile as compile_model
from kernorch.ir.graph import Graph, Node, verify
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.runtime.executor import KernelFailed, PlanExecutor
from kernorch.runtime.executor_test import random_case
from kernorch.schedule.program import Region, RTask
from kernorch.testing import branchy_model
from kernorch.tools.check import run_onnxruntime


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), size=st.integers(2, 6))
def test_random_plans_as_rprograms_match_reference(seed: int, size: int) -> None:
    graph, plan, feeds, expected = random_case(seed, size)
    executor = PlanExecutor(graph, plan, runtime="rprogram")
    for _ in range(2):  # a second run reuses the arena the first left dirty
        actual = executor(feeds)
        for name, value in expected.items():
            np.testing.assert_allclose(actual[name], value, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def branchy() -> tuple[object, dict[str, np.ndarray], np.ndarray]:
    model = branchy_model(cells=2, branches=6, channels=8, size=10)
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 8, 10, 10)).astype(np.float32)}
    # one layout: the test is about scheduling, and "auto" orchestrates the graph a second time channels-last
    compiled = compile_model(model, cost="analytic", rewrite=False, layout="nchw")
    return compiled, feeds, run_onnxruntime(model, feeds)["output"]


def test_a_plan_run_kernel_by_kernel_compiles_its_rtasks_when_an_rprogram_is_built() -> None:
    graph, plan, feeds, expected = random_case(7, 5)
    executor = PlanExecutor(graph, plan)
    assert not executor.plan.tasks and "_task(" not in executor.source  # half the code to compile
    before = executor(feeds)
    executor.build_rprogram(feeds)
    executor.runtime = "rprogram"
    assert executor.plan.tasks and "_task(" in executor.source
    for name, value in expected.items():
        np.testing.assert_allclose(before[name], value, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(executor(feeds)[name], value, rtol=1e-4, atol=1e-5)


def test_branchy_model_runs_branches_side_by_side(branchy: tuple) -> None:
    compiled, feeds, expected = branchy
    executor = compiled.executor
    runner = executor.build_rprogram(feeds)
    program = runner.program
    assert program is not None
    # independent branches: some region gives rTasks to both vEUs
    busy = [sum(isinstance(e, RTask) for e in p) for s in program.segments if isinstance(s, Region)
            for p in s.programs]  # fmt: skip
    assert sum(1 for count in busy if count) >= 2, program.describe()
    for runtime in ("kernels", "rprogram"):
        executor.runtime = runtime
        np.testing.assert_allclose(executor(feeds)["output"], expected, rtol=1e-4, atol=1e-5)
    spans = runner.traced()
    assert len(spans) == program.task_count and all(end >= start for _, start, end in spans)


def test_region_with_fewer_threads_than_veus_runs_in_global_order(tmp_path: object) -> None:
    """OMP_THREAD_LIMIT=1: every region gets one thread, which runs all rTasks in their global order."""
    script = (
        "import numpy as np\n"
        "from kernorch.api import compile\n"
        "from kernorch.testing import branchy_model\n"
        "from kernorch.tools.check import run_onnxruntime\n"
        "m = branchy_model(cells=1, branches=4, channels=8, size=10)\n"
        "x = {'input': np.random.default_rng(1).standard_normal((1, 8, 10, 10)).astype(np.float32)}\n"
        "c = compile(m, cost='analytic', rewrite=False)\n"
        "c.executor.build_rprogram(x); c.executor.runtime = 'rprogram'\n"
        "np.testing.assert_allclose(c.executor(x)['output'], run_onnxruntime(m, x)['output'], rtol=1e-4, atol=1e-5)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_a_failing_rtask_stops_the_region_and_names_its_kernel() -> None:
    table = np.random.default_rng(1).standard_normal((10, 4)).astype(np.float32)
    graph = Graph(inputs=["ids"], outputs=["y", "z"], constants={"table": table},
                  types={"ids": TensorType((2, 3), "int64"), "table": TensorType.of(table),
                         "y": TensorType((2, 3, 4), "float32"), "g": TensorType((2, 3, 4), "float32"),
                         "z": TensorType((2, 3, 4), "float32")})  # fmt: skip
    graph.nodes = [Node("gather", ("table", "ids"), ("g",), (("axis", 0),)), Node("exp", ("g",), ("y",)),
                   Node("tanh", ("g",), ("z",))]  # fmt: skip
    verify(graph)
    kernels = [make_kernel(graph, (0,), ("g",)), make_kernel(graph, (1,), ("y",)), make_kernel(graph, (2,), ("z",))]
    executor = PlanExecutor(graph, kernels, runtime="rprogram")
    ids = np.array([[0, 9, -1], [3, 3, 2]], dtype=np.int64)
    np.testing.assert_allclose(executor({"ids": ids})["z"], np.tanh(table[ids.reshape(-1) % 10].reshape(2, 3, 4)),
                               rtol=1e-6)  # fmt: skip
    with pytest.raises(KernelFailed, match="kernel 0 .*out of range"):
        executor({"ids": np.array([[0, 10, 0], [0, 0, 0]], dtype=np.int64)})


def test_the_library_refuses_an_rtask_range_outside_its_unit() -> None:
    """Even a program that skipped check_program cannot make a kernel run iterations it does not have."""
    from kernorch.runtime.rprogram import _encode

    graph = Graph(inputs=["x"], outputs=["y"], types={"x": TensorType((64, 512), "float32"),
                                                      "y": TensorType((64, 512), "float32")})  # fmt: skip
    graph.nodes = [Node("exp", ("x",), ("y",))]
    executor = PlanExecutor(graph, [make_kernel(graph, (0,), ("y",))])
    runner = executor._rprogram_runner()
    (unit,) = runner.units
    assert unit.splittable and unit.iterations > 1
    beyond = Region(((RTask(0, 0, unit.iterations + 1, 0),), ()))
    step = runner._native_step(_encode([beyond], runner.units, runner.veus))
    with pytest.raises(KernelFailed, match="refused"):
        step(None)
