"""Fuzz the front door: malformed ONNX bytes must end in exit 0, 1 or 2 with a one-line message; never a
crash, a hang or a traceback.

Inputs are seeded mutations of small valid models (the built-in demo models and single-operator models):
byte flips, truncations, splices of two models, inserted and repeated chunks, zeroed runs. Each goes through
`kernorch check --no-rewrite` in a worker process (the whole path: parse, checker, import, fission, the
reference interpreter, onnxruntime). A worker that dies (a segfault in a library) or exceeds the time limit
is recorded as a crash or hang and replaced. `python -m kernorch.devtools.fuzz --count 10000` (or `make fuzz`)
prints the exit-code histogram; the exit status is 1 when anything broke the contract.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

TIMEOUT_SECONDS = 60.0


def seed_models() -> list[bytes]:
    """Small valid models covering several operators (conv, norm, attention, matmul, gather, pad...)."""
    from onnx import TensorProto, helper, numpy_helper

    from kernorch.testing import random_array, single_op_model
    from kernorch.tools.demo_models import conv_norm_act_block, self_attention_block

    seeds = [conv_norm_act_block(channels=4, size=8), self_attention_block(seq=8, hidden=16, heads=2)]
    x = random_array((1, 3, 6, 6))
    seeds.append(single_op_model("Conv", {"x": x}, {"pads": [1, 1, 1, 1]}, {"w": random_array((2, 3, 3, 3))}))
    seeds.append(single_op_model("Softmax", {"x": random_array((2, 7))}, {"axis": 1}))
    seeds.append(single_op_model("Pad", {"x": x}, {"mode": "reflect"},
                                 {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}))  # fmt: skip
    gather = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"])], "gather",
                               [helper.make_tensor_value_info("ids", TensorProto.INT64, (4,))],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, 3))],
                               [numpy_helper.from_array(random_array((10, 3)), "table")])  # fmt: skip
    seeds.append(helper.make_model(gather, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    return [model.SerializeToString() for model in seeds]


def mutate(rng: np.random.Generator, seeds: list[bytes]) -> bytes:
    data = bytearray(seeds[int(rng.integers(len(seeds)))])
    kind = int(rng.integers(6))
    if kind == 0:  # flip a few bytes
        for _ in range(int(rng.integers(1, 9))):
            data[int(rng.integers(len(data)))] ^= int(rng.integers(1, 256))
    elif kind == 1:  # truncate
        data = data[: int(rng.integers(len(data)))]
    elif kind == 2:  # splice two models
        other = seeds[int(rng.integers(len(seeds)))]
        data = data[: int(rng.integers(len(data)))] + other[int(rng.integers(len(other))):]
    elif kind == 3:  # insert random bytes
        at = int(rng.integers(len(data) + 1))
        data[at:at] = rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
    elif kind == 4:  # repeat a chunk
        start = int(rng.integers(len(data)))
        chunk = data[start: start + int(rng.integers(1, 256))]
        data[start:start] = chunk * int(rng.integers(1, 4))
    else:  # zero a run
        start = int(rng.integers(len(data)))
        length = int(rng.integers(1, 32))
        data[start: start + length] = bytes(min(length, len(data) - start))
    return bytes(data)


@dataclass
class Outcome:
    code: int | str  # 0, 1, 2, or "crash" / "hang" / "traceback" / "long message"
    message: str = ""


def _worker(connection: Connection) -> None:
    from kernorch.cli import main

    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "model.onnx"
        while True:
            data = connection.recv()
            if data is None:
                return
            path.write_bytes(data)
            out, err = io.StringIO(), io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    code: int | str = main(["check", str(path), "--no-rewrite"])
            except SystemExit as exit_:  # argparse
                code = int(exit_.code or 0)
            except BaseException as error:  # noqa: BLE001 - anything escaping main is a contract breach
                code, err = "traceback", io.StringIO(f"{type(error).__name__}: {error}")
            lines = [line for line in err.getvalue().splitlines() if line.strip()]
            if code == 2 and len(lines) != 1:
                code = "long message"
            connection.send(Outcome(code, lines[-1] if lines else ""))


class _Worker:
    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_worker, args=(child,), daemon=True)
        self.process.start()

    def run(self, data: bytes, timeout: float) -> Outcome:
        self.connection.send(data)
        if not self.connection.poll(timeout):
            return Outcome("hang")
        try:
            return self.connection.recv()  # type: ignore[no-any-return]
        except (EOFError, OSError):
            return Outcome("crash", f"worker died (exit {self.process.exitcode})")

    def close(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)


def fuzz(count: int, seed: int = 0, timeout: float = TIMEOUT_SECONDS,
         progress: bool = False) -> tuple[Counter[int | str], list[tuple[bytes, Outcome]]]:  # fmt: skip
    """(histogram of outcomes, the inputs that broke the contract)."""
    rng = np.random.default_rng(seed)
    seeds = seed_models()
    histogram: Counter[int | str] = Counter()
    broken: list[tuple[bytes, Outcome]] = []
    worker = _Worker()
    try:
        for i in range(count):
            data = mutate(rng, seeds)
            outcome = worker.run(data, timeout)
            histogram[outcome.code] += 1
            if outcome.code not in (0, 1, 2):
                broken.append((data, outcome))
                worker.close()
                worker = _Worker()
            if progress and (i + 1) % 500 == 0:
                print(f"{i + 1} inputs: {dict(histogram)}", file=sys.stderr, flush=True)
    finally:
        worker.connection.send(None)
        worker.close()
    return histogram, broken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", help="directory to write the inputs that broke the contract")
    args = parser.parse_args(argv)
    histogram, broken = fuzz(args.count, args.seed, progress=True)
    print(f"{args.count} inputs; exit codes: " + ", ".join(f"{k}: {v}" for k, v in sorted(histogram.items(),
                                                                                        key=str)))  # fmt: skip
    for index, (data, outcome) in enumerate(broken[:20]):
        print(f"BROKEN {outcome.code}: {outcome.message}")
        if args.save:
            Path(args.save).mkdir(parents=True, exist_ok=True)
            (Path(args.save) / f"broken_{index}.onnx").write_bytes(data)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
