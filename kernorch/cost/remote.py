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
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
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


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise WorkersUnavailable("--workers ray needs Ray: pip install 'kernorch[ray]'") from None
    return ray


Progress = Callable[[Iterable[Any], int], Iterator[Any]]


def validated(reply: Any, asked: set[str]) -> tuple[list[RemoteResult], int]:
    """The results of a worker's reply that can be believed, and how many rows were dropped: a worker is another
    machine, and what it returns is data like any other. Kept: rows for signatures that were asked for, with a
    finite positive time, at least one run, a finite non-negative spread; the machine a short string."""
    if not isinstance(reply, dict) or not isinstance(reply.get("results"), list):
        return [], 1
    machine, worker = reply.get("machine"), reply.get("worker", "")
    if not isinstance(machine, str) or not 0 < len(machine) <= 512 or not isinstance(worker, str):
        return [], len(reply["results"])
    kept: list[RemoteResult] = []
    for row in reply["results"]:
        try:
            key, seconds, runs, spread, contended = row
            measurement = Measurement(float(seconds), int(runs), float(spread), bool(contended))
        except (TypeError, ValueError, OverflowError):
            continue
        if key in asked and isinstance(key, str) and math.isfinite(measurement.seconds) and \
                0 < measurement.seconds < 3600 and measurement.runs >= 1 and \
                math.isfinite(measurement.spread) and measurement.spread >= 0:  # fmt: skip
            kept.append(RemoteResult(key, machine, measurement, worker[:200]))
    return kept, len(reply["results"]) - len(kept)


Worker = Callable[[Sequence[dict[str, Any]], int], dict[str, Any]]


def measure_on_ray(address: str, kernels: Sequence[CandidateKernel], threads: int, keys: Sequence[str],
                   worker: Worker, progress: Progress | None = None) -> list[RemoteResult]:  # fmt: skip
    """Measure `kernels` (isolated) on the Ray cluster at `address` ("" = RAY_ADDRESS or a local instance) by
    running `worker` (cost/profile.py's `measure_payloads`) there on chunks of encoded kernels. `keys`: their
    signatures, the only ones a reply may carry."""
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
    task = ray.remote(num_cpus=max(cpus, 1))(worker)  # a whole node per task: no timing side by side
    size = min(MAX_CHUNK, -(-len(kernels) // max(len(nodes), 1)))  # one chunk per node, at most MAX_CHUNK
    starts = range(0, len(kernels), size)
    pending = {task.remote([encode_kernel(k) for k in kernels[i: i + size]], threads): set(keys[i: i + size])
               for i in starts}  # fmt: skip
    bar = progress(iter(range(len(kernels))), len(kernels)) if progress else None
    results: list[RemoteResult] = []
    dropped = 0
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            asked = pending.pop(ref)
            kept, refused = validated(ray.get(ref), asked)
            results += kept
            dropped += refused
            for _ in asked:
                if bar is not None:
                    next(bar, None)
    if dropped:
        warnings.warn(f"kernorch: {dropped} result(s) from Ray workers were not believable (a signature not asked "
                      "for, a time not finite and positive) and were dropped: those kernels are measured here",
                      stacklevel=2)  # fmt: skip
    return results
