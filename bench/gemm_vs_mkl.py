"""oneDNN matmul (kernorch's library call, weights packed once at plan creation) against MKL's packed sgemm
(`cblas_sgemm_pack` once, `cblas_sgemm_compute` per call, from the torch wheel's libtorch_cpu), on every
distinct weight GEMM of the shared models. Both are called from Python through ctypes, so the per-call
overhead is alike; medians over repeated calls, same thread count.

    python bench/gemm_vs_mkl.py [--models ../shared/models] [--threads 2]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import make_kernel
from kernorch.ir.types import TensorType
from kernorch.pipeline import import_graph
from kernorch.runtime.executor import PlanExecutor
from kernorch.runtime.threads import thread_count
from kernorch.runtime.timing import time_call

ROW_MAJOR, NO_TRANS, PACKED, B_MATRIX = 101, 111, 151, 162


def weight_gemms(models: Path) -> dict[tuple[int, int, int], list[str]]:
    """(M, K, N) of every matmul with a constant 2-D right operand -> the models that have it."""
    shapes: dict[tuple[int, int, int], list[str]] = {}
    for path in sorted(models.glob("*.onnx")):
        graph = import_graph(path)
        for node in graph.nodes:
            if node.prim == "matmul" and node.inputs[1] in graph.constants and graph.types[node.inputs[1]].rank == 2:
                a = graph.types[node.inputs[0]].shape
                k, n = graph.types[node.inputs[1]].shape
                m = int(np.prod(a[:-1]))
                shapes.setdefault((m, k, n), [])
                if path.stem not in shapes[m, k, n]:
                    shapes[m, k, n].append(path.stem)
    return shapes


def geometric_mean(ratios: list[float]) -> float:
    return float(np.exp(np.mean(np.log(ratios))))


def onednn_seconds(m: int, k: int, n: int, threads: int) -> float:
    rng = np.random.default_rng(0)
    graph = Graph(inputs=["a"], outputs=["c"], name="gemm")
    graph.constants = {"b": rng.standard_normal((k, n)).astype(np.float32)}
    graph.types = {"a": TensorType((m, k), "float32"), "b": TensorType((k, n), "float32"),
                   "c": TensorType((m, n), "float32")}  # fmt: skip
    graph.nodes = [Node("matmul", ("a", "b"), ("c",))]
    executor = PlanExecutor(graph, [make_kernel(graph, (0,), ("c",))], threads)
    executor.buffers["a"][...] = rng.standard_normal((m, k))
    (step,) = executor.steps
    with thread_count(threads):
        return time_call(step, runs=200, warmup=20).median


def mkl_seconds(mkl: ctypes.CDLL, m: int, k: int, n: int, threads: int) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.empty((m, n), np.float32)
    size = mkl.cblas_sgemm_pack_get_size(B_MATRIX, m, n, k)
    packed = np.empty(size // 4 + 16, np.float32)
    mkl.cblas_sgemm_pack(ROW_MAJOR, B_MATRIX, NO_TRANS, m, n, k, ctypes.c_float(1.0), b.ctypes.data, n,
                         packed.ctypes.data)  # fmt: skip

    def compute() -> None:
        mkl.cblas_sgemm_compute(ROW_MAJOR, NO_TRANS, PACKED, m, n, k, a.ctypes.data, k, packed.ctypes.data, n,
                                ctypes.c_float(0.0), c.ctypes.data, n)  # fmt: skip

    compute()
    np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-3)
    with thread_count(threads):  # MKL here runs on the process's OpenMP (libgomp) threads
        return time_call(compute, runs=200, warmup=20).median


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=str(Path(__file__).resolve().parents[2] / "shared" / "models"))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        print("torch (for MKL) is not installed", file=sys.stderr)
        return 2
    mkl = ctypes.CDLL(str(Path(spec.origin).parent / "lib" / "libtorch_cpu.so"))
    mkl.cblas_sgemm_pack_get_size.restype = ctypes.c_size_t
    # pointers must be declared: ctypes passes bare Python ints as 32-bit C ints (MKL_INT is 32-bit: LP64)
    i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    mkl.cblas_sgemm_pack_get_size.argtypes = [i, i, i, i]
    mkl.cblas_sgemm_pack.argtypes = [i, i, i, i, i, i, f, p, i, p]
    mkl.cblas_sgemm_compute.argtypes = [i, i, i, i, i, i, p, i, p, i, f, p, i]
    print(f"{'M':>6} {'K':>6} {'N':>6}  {'oneDNN us':>9}  {'MKL packed us':>13}  {'oneDNN/MKL':>10}  models")
    ratios = []
    for (m, k, n), models in sorted(weight_gemms(Path(args.models)).items()):
        ours, theirs = onednn_seconds(m, k, n, args.threads), mkl_seconds(mkl, m, k, n, args.threads)
        ratios.append(ours / theirs)
        print(f"{m:>6} {k:>6} {n:>6}  {ours * 1e6:>9.1f}  {theirs * 1e6:>13.1f}  {ours / theirs:>10.2f}  "
              f"{', '.join(models)}")
    print(f"geometric mean oneDNN/MKL time: {geometric_mean(ratios):.2f} over {len(ratios)} shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
