"""Tuning on a Ray cluster: candidate kernels compiled and timed on worker machines, results merged locally.

`kernorch optimize --workers ray` (a local Ray instance, or the cluster `RAY_ADDRESS` names) or
`--workers ray://HOST:PORT`. The kernels that the local profile database lacks are cut into chunks; each chunk
travels as data (graph JSON + constants NPZ, see ir/serialize.py) to a Ray task that compiles and measures it
with the same code as a local run (a ProfiledCostModel on the worker, quiet-machine checks included) and returns
its machine fingerprint with the measurements. A task takes all CPUs of a node, so kernels are never timed side
by side on one machine. Results are stored in the local SQLite database under the fingerprint of the machine
that measured them: a worker of another kind than this machine adds nothing to this plan's costs (those kernels
are then measured here), and its values stay apart for plans made on that kind.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernorch.cost.profile_db import Measurement
from kernorch.errors import KernorchError
from kernorch.ir.kernel import CandidateKernel, make_kernel
from kernorch.ir.serialize import constants_npz, graph_from_json, graph_to_json

MAX_CHUNK = 150  # kernels per task at most (one translation unit, as a local batch)


class WorkersUnavailable(KernorchError):
    """Ray is not installed, or the cluster cannot be reached."""


@dataclass(frozen=True)
class RemoteResult:
    signature: str
    machine: str  # fingerprint|threads of the worker that measured it
    measurement: Measurement
    worker: str = ""  # host:pid of the process that measured it


def encode_kernel(kernel: CandidateKernel) -> dict[str, Any]:
    """An isolated kernel as JSON-able data plus its constants (NPZ bytes)."""
    return {"graph": json.dumps(graph_to_json(kernel.graph)), "weights": constants_npz(kernel.graph),
            "nodes": list(kernel.nodes), "outputs": list(kernel.outputs)}  # fmt: skip


def decode_kernel(payload: dict[str, Any]) -> CandidateKernel:
    graph = graph_from_json(json.loads(payload["graph"]), payload["weights"])
    return make_kernel(graph, tuple(int(n) for n in payload["nodes"]), tuple(str(o) for o in payload["outputs"]))


def measure_payloads(payloads: Sequence[dict[str, Any]], threads: int) -> dict[str, Any]:
    """What a worker runs: measure the kernels here, return this machine's fingerprint and the measurements."""
    from kernorch.cost.profile import ProfileDatabase, ProfiledCostModel, isolate, signature

    kernels = [decode_kernel(p) for p in payloads]
    with tempfile.TemporaryDirectory(prefix="kernorch-worker-") as scratch:
        database = ProfileDatabase(Path(scratch) / "profiles.sqlite")
        model = ProfiledCostModel(database, threads)
        model.prepare(kernels)
        keys = [signature(isolate(k))[1] for k in kernels]
        found = database.lookup(keys, model.machine)
    rows = [[key, m.seconds, m.runs, m.spread, m.contended] for key, m in found.items()]
    return {"machine": model.machine, "results": rows, "worker": f"{socket.gethostname()}:{os.getpid()}"}


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise WorkersUnavailable("--workers ray needs Ray: pip install 'kernorch[ray]'") from None
    return ray


Progress = Callable[[Iterable[Any], int], Iterator[Any]]


def measure_on_ray(address: str, kernels: Sequence[CandidateKernel], threads: int,
                   progress: Progress | None = None) -> list[RemoteResult]:  # fmt: skip
    """Measure `kernels` (isolated) on the Ray cluster at `address` ("" = RAY_ADDRESS or a local instance)."""
    ray = _ray()
    if not kernels:
        return []
    if not ray.is_initialized():  # once per process: Ray shuts itself down at exit
        try:
            with warnings.catch_warnings():  # Ray's client warns before it raises; the error says it in one line
                warnings.simplefilter("ignore")
                ray.init(address=address or None, include_dashboard=False, log_to_driver=False,
                         logging_level="ERROR", configure_logging=False)  # fmt: skip
        except Exception as error:  # ConnectionError, TimeoutError, RuntimeError...: a cluster not reachable
            raise WorkersUnavailable(f"cannot reach the Ray cluster {address or '(local)'}: "
                                     f"{str(error).strip().splitlines()[0][:200]}") from None  # fmt: skip
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = min(int(n["Resources"].get("CPU", 1)) for n in nodes) if nodes else 1
    task = ray.remote(num_cpus=max(cpus, 1))(measure_payloads)  # a whole node per task: no timing side by side
    size = min(MAX_CHUNK, -(-len(kernels) // max(len(nodes), 1)))  # one chunk per node, at most MAX_CHUNK
    chunks = [list(kernels[i: i + size]) for i in range(0, len(kernels), size)]
    pending = {task.remote([encode_kernel(k) for k in chunk], threads): len(chunk) for chunk in chunks}
    bar = progress(iter(range(len(kernels))), len(kernels)) if progress else None
    results: list[RemoteResult] = []
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            reply = ray.get(ref)
            results += [RemoteResult(str(key), str(reply["machine"]),
                                     Measurement(float(seconds), int(runs), float(spread), bool(contended)),
                                     str(reply.get("worker", "")))
                        for key, seconds, runs, spread, contended in reply["results"]]  # fmt: skip
            for _ in range(pending.pop(ref)):
                if bar is not None:
                    next(bar, None)
    return results
