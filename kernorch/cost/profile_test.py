"""Profiler: measures once, resumes from the database, refuses a corrupt database, plugs into orchestration."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernorch.codegen.backends import GENERATED_C, ONEDNN, VIEW, choose_backend
from kernorch.cost.profile import ProfileDatabase, ProfileDatabaseError, ProfiledCostModel, isolate, signature
from kernorch.cost.profile_db import Measurement
from kernorch.devtools.mutate import here
from kernorch.errors import KernorchError
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel
from kernorch.orchestrate import orchestrate
from kernorch.tools.demo_models import self_attention_block


def test_measures_once_then_reads_back(tmp_path: Path) -> None:
    graph = fission(import_model(self_attention_block(seq=16, hidden=32, heads=2)))
    database = tmp_path / "profiles.sqlite"
    cold = ProfiledCostModel(ProfileDatabase(database))
    first = orchestrate(graph, cold)
    assert cold.measured > 0 and first.all_optimal
    assert first.plan.cost <= first.greedy_plan.cost * (1 + 1e-9)
    warm = ProfiledCostModel(ProfileDatabase(database))
    second = orchestrate(graph, warm)
    # everything came from the database, except values a busy machine (another process, or a hypervisor's steal
    # time) kept from a quiet measurement: those are stored marked and measured again, by design
    assert warm.measured == len(cold.contended)
    if not cold.contended:
        assert second.plan.cost == pytest.approx(first.plan.cost)
    assert ProfileDatabase(database).count(warm.machine) == cold.measured  # measured again: replaced, not added


@pytest.mark.parametrize("dtype", ["float32", "int64", "int32", "uint8", "int8", "bool"])
def test_kernels_with_scalar_inputs_of_every_dtype_are_profiled(dtype: str, tmp_path: Path) -> None:
    """A kernel whose graph inputs include a scalar (shape ()) of any dtype is measured: its seeded input is an
    array (a numpy scalar has no buffer: DynamicQuantizeLinear's scalar 'is the range 0' crashed profiling), and the
    plan computes what onnxruntime computes."""
    from onnx import TensorProto, helper

    from kernorch.testing import cpu_compile
    from kernorch.tools.check import run_onnxruntime

    element = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    # y = where(s != 0, x, -x): the scalar s steers a fused kernel over x
    nodes = [helper.make_node("Cast", ["s"], ["s_float"], to=TensorProto.FLOAT),
             helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])),
             helper.make_node("Equal", ["s_float", "zero"], ["off"]),
             helper.make_node("Neg", ["x"], ["nx"]), helper.make_node("Where", ["off", "nx", "x"], ["y"])]
    graph = helper.make_graph(nodes, "scalar", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 5)),
                                                helper.make_tensor_value_info("s", element, ())],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (3, 5))])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = cpu_compile(model, cost="profile", cache_dir=tmp_path)
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    for value in (0, 1):
        feeds = {"x": x, "s": np.array(value, dtype)}
        np.testing.assert_array_equal(compiled.run(feeds)["y"], run_onnxruntime(model, feeds)["y"])


def test_interrupted_run_resumes(tmp_path: Path) -> None:
    graph = fission(import_model(self_attention_block(seq=16, hidden=32, heads=2)))
    from kernorch.options import OrchestrationLimits
    from kernorch.orchestrate.candidates import enumerate_candidates
    from kernorch.orchestrate.pruning import LinearEpilogues
    from kernorch.orchestrate.subgraph import build_subgraphs

    (sub,) = build_subgraphs(graph, [(0, len(graph.nodes))])
    kernels = enumerate_candidates(sub, OrchestrationLimits(), LinearEpilogues(graph)).kernels
    database = tmp_path / "profiles.sqlite"
    partial = ProfiledCostModel(ProfileDatabase(database))
    partial.prepare(kernels[:10])  # "killed" after ten candidates
    done = partial.measured
    resumed = ProfiledCostModel(ProfileDatabase(database))
    resumed.prepare(kernels)
    distinct = {signature(isolate(k))[1] for k in kernels if (choose_backend(k)[0] or VIEW).runs_code}  # views: 0
    # values the first run could only measure on a busy machine are stored marked and measured again
    assert done + resumed.measured == len(distinct) + len(partial.contended)


def test_repeated_blocks_share_measurements() -> None:
    graph = fission(import_model(self_attention_block(seq=16, hidden=32, heads=2)))
    matmuls = [i for i, n in enumerate(graph.nodes) if n.prim == "matmul"]
    from kernorch.ir.kernel import make_kernel

    q = make_kernel(graph, (matmuls[0],), graph.nodes[matmuls[0]].outputs)
    k = make_kernel(graph, (matmuls[1],), graph.nodes[matmuls[1]].outputs)
    assert signature(isolate(q)) == signature(isolate(k))  # same shapes, different weights: one measurement


def test_corrupt_database_is_moved_aside_and_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "profiles.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    with caplog.at_level(logging.WARNING, logger="kernorch.profile"):
        database = ProfileDatabase(path)
    assert "corrupt" in caplog.text and "rebuilding" in caplog.text
    database.store("sig", "machine", Measurement(1e-3, 5, 0.01, False))
    assert database.lookup(["sig"], "machine")["sig"].seconds == 1e-3
    (aside,) = tmp_path.glob("profiles.sqlite.bad-*")
    assert aside.read_bytes() == b"this is not sqlite" * 100  # kept for a post-mortem, never reused


def test_old_or_foreign_schema_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "profiles.sqlite"
    with sqlite3.connect(path) as old:  # the version-1 layout: no spread, no contended flag
        old.execute("CREATE TABLE measurements (signature TEXT, machine TEXT, seconds REAL, runs INTEGER, "
                    "measured_at REAL, PRIMARY KEY (signature, machine))")
        old.execute("INSERT INTO measurements VALUES ('sig', 'machine', 1.0, 3, 0)")
    with caplog.at_level(logging.WARNING, logger="kernorch.profile"):
        database = ProfileDatabase(path)
    assert "schema version 0" in caplog.text
    assert database.lookup(["sig"], "machine") == {}  # nothing of the old layout is trusted
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as other:
        other.execute("CREATE TABLE songs (title TEXT)")
    ProfileDatabase(foreign).store("sig", "machine", Measurement(1.0, 3, 0.0, False))


def test_locked_database_waits_then_fails_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "profiles.sqlite"
    database = ProfileDatabase(path, busy_timeout=1.5)
    holder = sqlite3.connect(path)
    holder.execute("BEGIN EXCLUSIVE")  # another process in the middle of a write
    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="kernorch.profile"), \
                pytest.raises(ProfileDatabaseError, match="locked by another process for 1.5 s") as error:  # fmt: skip
            database.store("sig", "machine", Measurement(1.0, 3, 0.0, False))
        assert time.monotonic() - started >= 1.5
        assert "waiting" in caplog.text  # said so while waiting
        assert "\n" not in str(error.value)
    finally:
        holder.rollback()
        holder.close()
    database.store("sig", "machine", Measurement(1.0, 3, 0.0, False))  # free again: works


def test_unwritable_cache_directory_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    with pytest.raises(KernorchError, match="cannot create the cache directory") as error:
        ProfileDatabase(blocker / "cache" / "profiles.sqlite")
    assert "\n" not in str(error.value)


@pytest.mark.slow  # 20 s of measuring: `make test-slow`
def test_profiling_beside_a_cpu_hog_chooses_a_plan_as_good_as_quiet(tmp_path: Path) -> None:
    """With another process burning a core, contended slices are measured again (after waiting for quiet,
    then keeping the least disturbed run): the plan chosen under load costs, by quiet measurements, within
    25 % of the plan chosen on a quiet machine. (Contention taken at face value inflates kernels 2-100x; the
    margin is for this VM's own run-to-run noise of small kernels, which made a 10 % bound fail now and then,
    and a 25 % bound judged by the earlier quiet measurements once on the AVX-512 host: 1.27x.)"""
    import subprocess
    import sys

    from kernorch.tools.demo_models import conv_norm_act_block

    graph = fission(import_model(conv_norm_act_block(channels=16, size=32)))
    quiet_model = ProfiledCostModel(ProfileDatabase(tmp_path / "quiet.sqlite"))
    quiet = orchestrate(graph, quiet_model)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        loaded_model = ProfiledCostModel(ProfileDatabase(tmp_path / "loaded.sqlite"))
        loaded = orchestrate(graph, loaded_model)
    finally:
        hog.kill()
        hog.wait()
    assert loaded_model.remeasured > 0  # the contention was seen
    # both plans judged by the same fresh quiet measurements, taken together; a judgement disturbed by the host
    # is taken again (up to three), a plan truly worse stays worse in every one
    ratios = []
    for attempt in range(3):
        judge = ProfiledCostModel(ProfileDatabase(tmp_path / f"judge{attempt}.sqlite"))
        ratios.append(sum(judge.cost(k) for k in loaded.plan.kernels) / sum(judge.cost(k) for k in quiet.plan.kernels))
        if ratios[-1] <= 1.25:
            break
    assert min(ratios) <= 1.25, ratios
    # what could not be measured quietly is stored marked, never as if it were clean
    stored = ProfileDatabase(tmp_path / "loaded.sqlite")
    assert stored.count(loaded_model.machine, contended=True) == len(loaded_model.contended)


class _ScriptedMachine:
    """Stands in for the clock and /proc: each measurement returns the next scripted (median, spread,
    contended) instead of timing a kernel."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, script: list[tuple[float, float, bool]]) -> None:
        import kernorch.cost.profile as profile
        from kernorch.runtime.timing import Timing

        self.script = list(script)
        self.waits = 0
        machine = self

        class Window:
            contended = False

            def __enter__(self) -> Window:
                return self

            def __exit__(self, *_: object) -> None:
                return None

        def time_call(launch: object, **_: object) -> Timing:
            median, spread, contended = machine.script.pop(0)
            Window.contended = contended
            low, high = median * (1 - spread / 2), median * (1 + spread / 2)  # quartiles: IQR/median = spread
            return Timing((low, low, median, high, high))

        def wait_for_quiet(_: float) -> bool:
            machine.waits += 1
            return False

        monkeypatch.setattr(profile, "LoadWindow", Window)
        monkeypatch.setattr(profile, "time_call", time_call)
        monkeypatch.setattr(profile, "wait_for_quiet", wait_for_quiet)
        monkeypatch.setattr(ProfiledCostModel, "_compile_all", lambda self, batches: [None for _ in batches])
        monkeypatch.setattr(ProfiledCostModel, "_launchers",
                            lambda self, batch, libraries: {p.key: (lambda: None) for p in batch})  # fmt: skip


def _one_kernel() -> tuple[Graph, CandidateKernel]:
    from kernorch.ir.kernel import make_kernel

    graph = fission(import_model(self_attention_block(seq=16, hidden=32, heads=2)))
    first = graph.nodes[0]
    return graph, make_kernel(graph, (0,), first.outputs)


def test_a_value_never_measured_quietly_is_stored_marked_and_measured_again_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from kernorch.cost.profile import MAX_ATTEMPTS, QUIET_ROUNDS

    _, kernel = _one_kernel()
    busy = _ScriptedMachine(monkeypatch, [(1e-3 * (i + 1), 0.1, True) for i in range(MAX_ATTEMPTS)])
    loaded = ProfiledCostModel(ProfileDatabase(tmp_path / "p.sqlite"))
    assert loaded.cost(kernel) == pytest.approx(1e-3 * 0.95)  # the fastest run of the least disturbed attempt
    assert loaded.remeasured == MAX_ATTEMPTS - 1 and busy.waits == MAX_ATTEMPTS - 1 and not busy.script
    assert loaded.contended_in([kernel]) == 1
    assert ProfileDatabase(tmp_path / "p.sqlite").count(loaded.machine, contended=True) == 1
    quiet = _ScriptedMachine(monkeypatch, [(4e-4, 0.1, False)] * QUIET_ROUNDS)
    later = ProfiledCostModel(ProfileDatabase(tmp_path / "p.sqlite"))
    assert later.cost(kernel) == pytest.approx(4e-4) and not quiet.script  # measured again, quietly
    assert later.contended_in([kernel]) == 0
    assert ProfileDatabase(tmp_path / "p.sqlite").count(later.machine, contended=True) == 0


def test_repeats_that_disagree_are_measured_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernorch.cost.profile import QUIET_ROUNDS

    _, kernel = _one_kernel()
    machine = _ScriptedMachine(monkeypatch, [(9e-3, 2.0, False)] + [(5e-4, 0.1, False)] * QUIET_ROUNDS)
    model = ProfiledCostModel(ProfileDatabase(tmp_path / "p.sqlite"))
    assert model.cost(kernel) == pytest.approx(5e-4) and model.remeasured == 1 and not machine.script
    assert model.contended_in([kernel]) == 0


def test_a_cost_asked_inside_the_block_measures_what_is_queued(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside `measuring_together` prepare only queues; asking a queued candidate's cost measures the queue then
    (every round of it), and the block's end has nothing left; an exception leaves the queue for a later cost."""
    from kernorch.cost.profile import QUIET_ROUNDS

    _, kernel = _one_kernel()
    machine = _ScriptedMachine(monkeypatch, [(3e-4, 0.1, False)] * QUIET_ROUNDS)
    model = ProfiledCostModel(ProfileDatabase(tmp_path / "p.sqlite"))
    with model.measuring_together():
        model.prepare([kernel])
        assert model.measured == 0 and len(machine.script) == QUIET_ROUNDS  # queued, not timed
        assert model.cost(kernel) == pytest.approx(3e-4) and not machine.script
    assert model.measured == 1
    machine = _ScriptedMachine(monkeypatch, [(2e-4, 0.1, False)] * QUIET_ROUNDS)
    other = ProfiledCostModel(ProfileDatabase(tmp_path / "q.sqlite"))
    with pytest.raises(RuntimeError), other.measuring_together():
        other.prepare([kernel])
        raise RuntimeError("enumeration failed")
    assert other.measured == 0 and other.cost(kernel) == pytest.approx(2e-4) and not machine.script


def test_the_cost_is_the_fastest_of_the_quiet_rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slowdown /proc/stat does not show (a neighbour in the last-level cache) inflates a round, quiet by every
    measure: the other rounds outvote it, and the stored value counts every quiet round's runs."""
    from kernorch.cost.profile import QUIET_ROUNDS

    _, kernel = _one_kernel()
    rounds = [(1.7e-3, 0.1, False), (1e-3, 0.1, False)] + [(1.1e-3, 0.1, False)] * (QUIET_ROUNDS - 2)
    machine = _ScriptedMachine(monkeypatch, rounds)
    model = ProfiledCostModel(ProfileDatabase(tmp_path / "p.sqlite"))
    assert model.cost(kernel) == pytest.approx(1e-3) and model.remeasured == 0 and not machine.script
    assert machine.waits == 0  # nothing disturbed: the rounds follow one another without waiting
    key = model.signature_of(kernel)
    assert key is not None
    (stored,) = ProfileDatabase(tmp_path / "p.sqlite").lookup([key], model.machine).values()
    assert (stored.seconds, stored.runs, stored.contended) == (pytest.approx(1e-3), 5 * QUIET_ROUNDS, False)


def test_a_signature_changes_with_the_prelude_helpers_the_kernel_calls_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a helper to the C prelude must not invalidate every stored measurement; changing one a kernel
    calls (here exp, inside softmax) must."""
    from kernorch.codegen.c import prelude as c_prelude
    from kernorch.ir.kernel import make_kernel

    graph = fission(import_model(self_attention_block(seq=16, hidden=32, heads=2)))
    exp = next(i for i, n in enumerate(graph.nodes) if n.prim == "exp")
    max_node = next(i for i, n in enumerate(graph.nodes) if n.prim == "reduce_max")
    exp_kernel = isolate(make_kernel(graph, (exp,), graph.nodes[exp].outputs))
    max_kernel = isolate(make_kernel(graph, (max_node,), graph.nodes[max_node].outputs))
    before = (signature(exp_kernel), signature(max_kernel))
    prelude = c_prelude.PRELUDE
    monkeypatch.setattr(c_prelude, "PRELUDE", prelude + "static inline int ko_new(int a) { return a; }\n")
    assert (signature(exp_kernel), signature(max_kernel)) == before
    monkeypatch.setattr(c_prelude, "PRELUDE", prelude.replace("4.999999403953552e-1f", "0.5f"))
    assert signature(exp_kernel) != before[0] and signature(max_kernel) == before[1]


def test_isolated_kernels_read_aligned_read_only_normal_values_each_input_its_own() -> None:
    from kernorch.cost.profile import _random_inputs
    from kernorch.ir.kernel import make_kernel
    from kernorch.ir.types import TensorType

    graph = Graph(inputs=["a", "b", "i"], outputs=["y"], name="three")
    graph.types = {"a": TensorType((64, 100), "float32"), "b": TensorType((3, 5), "float16"),
                   "i": TensorType((7,), "int64"), "y": TensorType((64, 100), "float32")}  # fmt: skip
    graph.nodes = [Node("add", ("a", "a"), ("y",))]
    feeds = _random_inputs(make_kernel(graph, (0,), ("y",)))
    a, b, i = feeds["a"], feeds["b"], feeds["i"]
    assert a.dtype == np.float32 and b.dtype == np.float16 and a.shape == (64, 100) and b.shape == (3, 5)
    assert a.ctypes.data % 64 == 0 and a.flags.c_contiguous and not a.flags.writeable
    assert abs(float(a.mean())) < 0.1 and 0.9 < float(a.std()) < 1.1  # standard normal
    assert not np.array_equal(a.reshape(-1)[:15].astype(np.float16), b.reshape(-1))  # each input its own values
    assert not i.any()  # integer inputs are zeros: a valid index anywhere
    again = _random_inputs(make_kernel(graph, (0,), ("y",)))
    assert np.array_equal(again["a"], a) and np.array_equal(again["b"], b)  # the same values every time


def test_a_candidate_is_signed_as_its_isolated_copy() -> None:
    """The profiler signs and compiles a generated or library kernel as it is in the graph (sharing the screen's
    description) and times it isolated: the code must be the same, constants (literals, packed weights) too."""
    from kernorch.options import OrchestrationLimits
    from kernorch.orchestrate.candidates import enumerate_candidates
    from kernorch.orchestrate.pruning import LinearEpilogues
    from kernorch.orchestrate.subgraph import build_subgraphs

    graph = fission(import_model(self_attention_block(seq=16, hidden=32, heads=2)))
    (sub,) = build_subgraphs(graph, [(0, len(graph.nodes))])
    native = [(k, backend) for k in enumerate_candidates(sub, OrchestrationLimits(), LinearEpilogues(graph)).kernels
              if (backend := choose_backend(k)[0]) in (GENERATED_C, ONEDNN)]  # fmt: skip
    assert {backend for _, backend in native} == {GENERATED_C, ONEDNN} and len(native) > 50
    assert any(k.graph.constants.keys() & set(k.inputs) for k, _ in native)  # constants among their inputs
    for kernel, backend in native:
        assert signature(kernel, backend) == signature(isolate(kernel), backend), kernel.describe()


def test_orchestrating_describes_each_candidate_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The screen, the backend choice and the signature share one description per candidate (codegen/gir/memo.py)."""
    import kernorch.codegen.gir.memo as memo
    from kernorch.cost.gir_model import GirScreen

    described: dict[tuple[object, ...], int] = {}
    original = memo.construct

    def counted(kernel: CandidateKernel):  # type: ignore[no-untyped-def]
        key = (kernel.nodes, kernel.outputs)
        described[key] = described.get(key, 0) + 1
        return original(kernel)

    monkeypatch.setattr(memo, "construct", counted)
    graph = fission(import_model(self_attention_block(seq=16, hidden=32, heads=2)))
    model = ProfiledCostModel(ProfileDatabase(tmp_path / "profiles.sqlite"), screen=GirScreen(_levels, 2))
    assert orchestrate(graph, model).all_optimal
    assert len(described) > 50 and max(described.values()) == 1, max(described.values())


def test_orchestrating_measures_every_subgraphs_candidates_in_the_same_rounds(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel's rounds are passes over the whole graph's candidates, seconds apart, not over one subgraph's few
    (milliseconds apart, inside one slowdown): orchestrate queues every subgraph's, then measures them at once."""
    from kernorch.options import OrchestrationLimits

    measured: list[int] = []
    original = ProfiledCostModel._measure

    def counted(self: ProfiledCostModel, missing: list[Any]) -> None:
        measured.append(len(missing))
        original(self, missing)

    monkeypatch.setattr(ProfiledCostModel, "_measure", counted)
    graph = fission(import_model(self_attention_block(seq=16, hidden=32, heads=2)))
    model = ProfiledCostModel(ProfileDatabase(tmp_path / "profiles.sqlite"))
    result = orchestrate(graph, model, OrchestrationLimits(max_subgraph_size=4))
    assert len(result.subgraphs) > 3 and result.all_optimal
    assert measured == [model.measured] and model.measured > 20, measured


def test_twins_are_signed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two blocks of equal structure (ir/structure.py) under other value names: one signature, one measurement."""
    import kernorch.cost.profile as profile
    from kernorch.testing.blocks import block_kernel, chain_of_blocks

    signed: list[CandidateKernel] = []
    original = profile.signature

    def counted(kernel: CandidateKernel, backend: Any = None) -> Any:
        signed.append(kernel)
        return original(kernel, backend)

    monkeypatch.setattr(profile, "signature", counted)
    graph = chain_of_blocks()
    model = ProfiledCostModel(ProfileDatabase(tmp_path / "profiles.sqlite"))
    first, second = block_kernel(graph, 1), block_kernel(graph, 2)
    model.prepare([first, second])
    assert len(signed) == 1 and model.signature_of(first) == model.signature_of(second) is not None
    assert model.cost(first) == model.cost(second) > 0 and model.measured == 1


def _levels():  # type: ignore[no-untyped-def]
    from kernorch.cost.bandwidth import MemoryLevel, MemoryLevels

    return MemoryLevels((MemoryLevel("L2", 1 << 21, 1.5e11), MemoryLevel("DRAM", 1 << 62, 5e10)), 1e-6)


def _refused_when_fused(render: Any) -> Any:
    """oneDNN's renderer, with every call that absorbed post-ops made to fail as oneDNN failed on an unseen
    model: a memory descriptor it refuses (status 2, invalid arguments) when the plan's kernels are created."""

    def planted(name: str, call: Any) -> str:
        code = render(name, call)
        if not call.post_ops:
            return code
        anchor = "    KO_CHECK(dnnl_primitive_create(&s->prim, pd));"
        assert anchor in code
        return code.replace(anchor, "    { const dnnl_dim_t bad[] = {-5}; KO_CHECK(ko_md(&md[15], 1, bad, bad)); }\n"
                            + anchor)  # fmt: skip

    return planted


def test_a_candidate_a_library_refuses_is_dropped_with_its_reason(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The model still compiles, without the refused kernels (each listed with oneDNN's reason among the
    rejections), and computes what onnxruntime does; a kernel computing a wrong result is dropped the same way."""
    from kernorch.codegen.backends import ONEDNN
    from kernorch.options import Options
    from kernorch.pipeline import compile_plan, import_graph
    from kernorch.tools.check import run_onnxruntime
    from kernorch.tools.demo_models import conv_norm_act_block

    monkeypatch.setattr(ONEDNN, "render_call", _refused_when_fused(ONEDNN.render_call))
    model = conv_norm_act_block(channels=8, size=16)
    graph = import_graph(model)
    cost = ProfiledCostModel(ProfileDatabase(tmp_path / "profiles.sqlite"), kernel_cache=tmp_path)
    result = orchestrate(graph, cost)
    refused = [r for r in result.rejected if "returned oneDNN status 2" in r.reason]
    assert refused and all(r.rule == "backend" for r in refused)
    assert cost.failures and all("ko_md(&md[15], 1, bad, bad)" in reason for reason in cost.failures.values())
    compiled = compile_plan(result, Options(cache_dir=tmp_path))
    from kernorch.codegen.library.call import describe_library_call

    calls = [describe_library_call(k) for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
             if b.stateful]  # fmt: skip
    assert calls and not any(call.post_ops for call in calls)
    x = np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32)
    (expected,) = run_onnxruntime(model, {"x": x}, 2).values()
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=1e-4, atol=1e-5)


def test_a_kernel_that_computes_a_wrong_result_is_dropped(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from kernorch.cost import verify

    reference = verify.run_reference

    def off_for_exp(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = reference(graph, feeds)
        fused_exp = len(graph.nodes) > 1 and any(node.prim == "exp" for node in graph.nodes)
        return {n: v * 1.01 if fused_exp else v for n, v in values.items()}

    monkeypatch.setattr(verify, "run_reference", off_for_exp)
    graph = fission(import_model(self_attention_block(seq=16, hidden=32, heads=2)))
    cost = ProfiledCostModel(ProfileDatabase(tmp_path / "profiles.sqlite"), kernel_cache=tmp_path)
    result = orchestrate(graph, cost)
    assert cost.failures and all("differs from the reference" in r for r in cost.failures.values())
    assert not any(node.prim == "exp" for kernel in result.plan.kernels if len(kernel.nodes) > 1
                   for node in kernel.primitives)  # fmt: skip


def _every_conv_refused(render: Any) -> Any:
    """oneDNN's renderer, with every convolution call made to fail when it is created (oneDNN status 2)."""

    def planted(name: str, call: Any) -> str:
        code = render(name, call)
        anchor = "    KO_CHECK(dnnl_primitive_create(&s->prim, pd));"
        if call.op != "convolution" or anchor not in code:
            return code
        return code.replace(anchor, "    { const dnnl_dim_t bad[] = {-5}; KO_CHECK(ko_md(&md[15], 1, bad, bad)); }\n"
                            + anchor)  # fmt: skip

    return planted


@pytest.mark.parametrize("planned", ["profiled", "unfused"])
def test_a_primitive_whose_every_kernel_a_library_refuses_runs_by_its_reference(
        planned: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Every oneDNN conv refused, the lone conv kernels too: the model still compiles, each such conv running by
    its reference implementation (the profiler times that; a plan that was not profiled — here one kernel per
    primitive — falls back when its library refuses a lone primitive), matches onnxruntime, and saves and loads
    in a process that never saw the refusal."""
    import subprocess
    import sys

    from kernorch.codegen.backends import ONEDNN, REFERENCE, registry
    from kernorch.options import Options
    from kernorch.pipeline import compile_plan, import_graph
    from kernorch.tools.bench import unfused_plan
    from kernorch.tools.check import run_onnxruntime
    from kernorch.tools.demo_models import conv_norm_act_block

    monkeypatch.setattr(registry, "_REFUSED", {})
    monkeypatch.setattr(ONEDNN, "render_call", _every_conv_refused(ONEDNN.render_call))
    model = conv_norm_act_block(channels=8, size=16)
    options = Options(cache_dir=tmp_path, layout="nchw")
    result = orchestrate(import_graph(model),
                         ProfiledCostModel(ProfileDatabase(tmp_path / "p.sqlite"), kernel_cache=tmp_path))
    plan = result.plan
    if planned == "unfused":
        registry._REFUSED.clear()  # nothing learned from profiling: the executor meets the refusal itself
        plan = unfused_plan(result)
    compiled = compile_plan(result, options, plan)
    convs = [b for k, b in zip(compiled.kernels, compiled.executor.backends, strict=True)
             if any(n.prim == "conv" for n in k.primitives)]  # fmt: skip
    assert REFERENCE in convs and ONEDNN not in convs  # (a depthwise conv is generated C either way)
    x = np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32)
    (expected,) = run_onnxruntime(model, {"x": x}, 2).values()
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=1e-4, atol=1e-5)
    directory = compiled.save(tmp_path / "plan")
    np.save(tmp_path / "x.npy", x)
    script = ("import sys, numpy as np, kernorch; m = kernorch.load(sys.argv[1], cache_dir=sys.argv[3]); "
              "print(sum(not b.native for b in m.executor.backends)); "
              "np.save(sys.argv[2], m.run({'x': np.load(sys.argv[4])})['y'])")
    done = subprocess.run([sys.executable, "-c", script, str(directory), str(tmp_path / "y.npy"), str(tmp_path),
                           str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) >= convs.count(REFERENCE)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-4, atol=1e-5)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("twins signed anew", "            if structure in self._signature_by_structure:  # a twin's",
         "            if False:  # a twin's"),
    here("a lone primitive a library refuses is dropped, not run by its reference",
         "    if len(kernel.nodes) != 1:\n        return False\n    _REFUSED",
         "    if True:\n        return False\n    _REFUSED",
         file="kernorch/codegen/backends/registry.py",
         tests=("kernorch/cost/profile_test.py::test_a_primitive_whose_every_kernel_a_library_refuses_runs_by_its_reference",)),
    here("orchestration prices candidates outside the description memo",
         "with cost_model.pricing():",
         'with __import__("contextlib").nullcontext():',
         file="kernorch/orchestrate/orchestrator.py"),
    here("orchestration measures subgraph by subgraph",
         "with cost_model.measuring_together():",
         'with __import__("contextlib").nullcontext():',
         file="kernorch/orchestrate/orchestrator.py"),
    # profiling
    here("a kernel's cost is its first quiet round's, not its fastest",
         "fastest = _faster(item.quiet, Measurement(timing.median, runs, timing.spread, False))",
         "fastest = item.quiet or Measurement(timing.median, runs, timing.spread, False)"),
    here("an exception inside the block drops the queue its signatures point to",
         "            self._together = False  # measures it rather than finding no value",
         "            self._together = False; self._queued.clear()"),
    here("a kernel is done after one quiet round",
         "if item.quiet_rounds >= QUIET_ROUNDS or item.attempts >= MAX_ATTEMPTS:",
         "if item.quiet_rounds >= 1 or item.attempts >= MAX_ATTEMPTS:"),
    here("every input of an isolated kernel reads the same pool values",
         "offset = position * _POOL_STRIDE",
         "offset = 0"),
]  # fmt: skip
