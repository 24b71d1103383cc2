"""Profiler: measures once, resumes from the database, refuses a corrupt database, plugs into orchestration."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernorch.codegen.backends import choose_backend
from kernorch.cost.profile import ProfileDatabase, ProfileDatabaseError, ProfiledCostModel, isolate, signature
from kernorch.fission import fission
from kernorch.frontend import import_model
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
    assert warm.measured == 0  # everything came from the database
    assert second.plan.cost == pytest.approx(first.plan.cost)
    assert ProfileDatabase(database).count(warm.machine) == cold.measured


def test_interrupted_run_resumes(tmp_path: Path) -> None:
    graph = fission(import_model(self_attention_block(seq=16, hidden=32, heads=2)))
    from kernorch.orchestrate.candidates import enumerate_candidates
    from kernorch.orchestrate.pruning import LinearEpilogues, OrchestrationLimits
    from kernorch.orchestrate.subgraph import build_subgraphs

    (sub,) = build_subgraphs(graph, [(0, len(graph.nodes))])
    kernels = enumerate_candidates(sub, OrchestrationLimits(), LinearEpilogues(graph)).kernels
    database = tmp_path / "profiles.sqlite"
    partial = ProfiledCostModel(ProfileDatabase(database))
    partial.prepare(kernels[:10])  # "killed" after ten candidates
    done = partial.measured
    resumed = ProfiledCostModel(ProfileDatabase(database))
    resumed.prepare(kernels)
    distinct = {signature(isolate(k))[1] for k in kernels if choose_backend(k)[0] is not None}
    assert done + resumed.measured == len(distinct)


def test_repeated_blocks_share_measurements() -> None:
    graph = fission(import_model(self_attention_block(seq=16, hidden=32, heads=2)))
    matmuls = [i for i, n in enumerate(graph.nodes) if n.prim == "matmul"]
    from kernorch.orchestrate.kernel import make_kernel

    q = make_kernel(graph, (matmuls[0],), graph.nodes[matmuls[0]].outputs)
    k = make_kernel(graph, (matmuls[1],), graph.nodes[matmuls[1]].outputs)
    assert signature(isolate(q)) == signature(isolate(k))  # same shapes, different weights: one measurement


def test_corrupt_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "profiles.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ProfileDatabaseError, match="corrupt"):
        ProfileDatabase(path)
