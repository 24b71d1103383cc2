"""Tuning on a Ray cluster: kernels measured by Ray workers merge into the local profile database, keyed by the
measuring machine; results from another machine kind are kept apart and the kernels measured here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
# the workers' measurements count only when undisturbed: run alone, not beside the parallel test workers
pytestmark = pytest.mark.serial

from kernorch.cost import profile, remote  # noqa: E402
from kernorch.cost.profile import ProfileDatabase, ProfiledCostModel  # noqa: E402
from kernorch.cost.profile_db import Measurement  # noqa: E402
from kernorch.errors import KernorchError  # noqa: E402
from kernorch.options import Options  # noqa: E402
from kernorch.pipeline import import_graph, plan_graph  # noqa: E402
from kernorch.tools.demo_models import self_attention_block  # noqa: E402


@pytest.fixture
def cluster() -> Any:
    """A local Ray cluster of two worker CPUs, started (and stopped) by the test."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             configure_logging=False)  # fmt: skip
    yield ray
    ray.shutdown()


def test_kernels_measured_on_ray_workers_merge_into_the_local_database(cluster: Any, tmp_path: Path) -> None:
    graph = import_graph(self_attention_block(seq=16, hidden=32, heads=2))
    on_ray = plan_graph(graph, Options(workers="ray", cache_dir=tmp_path, rewrite=False))
    assert on_ray.tuning is not None
    # on a quiet machine every kernel is measured on the workers; a value a busy machine disturbed there is
    # stored marked and measured again here
    assert on_ray.tuning["measured_remotely"] > 0 and on_ray.tuning["measured"] < on_ray.tuning["measured_remotely"]
    assert on_ray.tuning["foreign"] == 0  # the workers are this machine's kind
    # the local database now answers everything: a local run measures nothing
    local = plan_graph(graph, Options(workers="local", cache_dir=tmp_path, rewrite=False))
    assert local.tuning is not None and local.tuning["measured"] == 0
    assert local.plan.cost == pytest.approx(on_ray.plan.cost)
    database = ProfileDatabase.open(tmp_path)
    machine = ProfiledCostModel(database, 2).machine
    assert database.count(machine) >= on_ray.tuning["measured_remotely"]


def test_measurements_come_from_ray_worker_processes(cluster: Any, tmp_path: Path) -> None:
    import os
    import socket

    from kernorch.cost.profile import isolate, measure_payloads, signature
    from kernorch.ir.kernel import make_kernel

    graph = import_graph(self_attention_block(seq=16, hidden=32, heads=2))
    kernels = [isolate(make_kernel(graph, (i,), node.outputs)) for i, node in enumerate(graph.nodes)][:12]
    results = remote.measure_on_ray("", kernels, 2, [signature(k)[1] for k in kernels], measure_payloads)
    assert len({r.signature for r in results}) >= 6
    workers = {r.worker for r in results}
    assert workers and f"{socket.gethostname()}:{os.getpid()}" not in workers  # not this (the driver) process


def test_results_of_another_machine_kind_are_kept_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = import_graph(self_attention_block(seq=16, hidden=32, heads=2))

    def foreign_cluster(address: str, kernels: list, threads: int, *rest: Any) -> list:
        from kernorch.cost.profile import isolate, signature

        return [remote.RemoteResult(signature(isolate(k))[1], "Some Other CPU|64|threads=2",
                                    Measurement(1e-3, 5, 0.01, False)) for k in kernels]  # fmt: skip

    monkeypatch.setattr(profile, "measure_on_ray", foreign_cluster)
    result = plan_graph(graph, Options(workers="ray://example:10001", cache_dir=tmp_path, rewrite=False))
    assert result.tuning is not None
    assert result.tuning["foreign"] > 10 and result.tuning["measured_remotely"] == 0
    assert result.tuning["measured"] == result.tuning["foreign"]  # every kernel measured here after all
    database = ProfileDatabase.open(tmp_path)
    assert database.count("Some Other CPU|64|threads=2") == result.tuning["foreign"]
    assert result.plan.cost < 1e-3 * len(result.plan.kernels)  # this machine's values, not the foreign 1 ms


def test_a_bad_workers_spec_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kernorch.cli import main

    with pytest.raises(KernorchError, match="unknown workers"):
        Options(workers="spark")
    model = tmp_path / "m.onnx"
    model.write_bytes(self_attention_block(seq=16, hidden=32, heads=2).SerializeToString())
    assert main(["optimize", str(model), "--workers", "spark"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "kernorch: error: unknown workers 'spark' (choose local, ray, or ray://HOST:PORT)"]
