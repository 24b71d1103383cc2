"""Quantize models with onnxruntime's own tool, as a user of onnxruntime would, for the int8 benchmarks:

    .venv/bin/python bench/quantize.py MODEL.onnx... [-o DIR] [--kind dynamic|static|operator|both|all]
                                       [--calibration N] [--keep-going]

- dynamic (`quantize_dynamic`): int8 weights per tensor, activations quantized at run time (DynamicQuantizeLinear
  + MatMulInteger for the products; what onnxruntime recommends for transformers);
- static (`quantize_static`, QDQ format): int8 weights per channel and int8 activations (S8S8), their ranges
  calibrated on N seeded random inputs drawn as `kernorch check` draws them (seeds 0..N-1; check's own seed 0
  among them), with onnxruntime's pre-processing (shape inference, its graph optimizations) first;
- operator (`quantize_static`, QOperator format): the same calibration, uint8 activations and int8 weights per
  channel (U8S8, onnxruntime's default), written as QLinearConv/QLinearMatMul and com.microsoft's QLinearAdd,
  QLinearMul, QLinearSigmoid, QLinearConcat, QLinearGlobalAveragePool, QGemm... instead of QDQ pairs.

`both` is dynamic and static, `all` adds operator. Writes DIR/<name>.dynamic.onnx, DIR/<name>.static.onnx and
DIR/<name>.qoperator.onnx (default DIR: build/quantized, not committed), skipping a file that exists; a model the
tool fails on is reported and skipped (exit 1; 0 with --keep-going unless it failed on every model). `kernorch
bench` then times onnxruntime and OpenVINO on the same file (their int8 paths) beside kernorch.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.runtime.feeds import graph_feeds


class SeededInputs:
    """onnxruntime's CalibrationDataReader: the feeds `kernorch check` draws for seeds 0..count-1."""

    def __init__(self, model: Path, count: int) -> None:
        graph = fission(import_model(str(model)), strict=False)
        self._feeds: Iterator[dict[str, np.ndarray]] = (graph_feeds(graph, seed) for seed in range(count))

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def _loadable(target: Path) -> None:
    """Raise (and remove the file) where onnxruntime cannot load what its own tool wrote: bert_mini in QOperator
    format gets a QGemm whose int32 bias is a uint8 tensor (an initializer the pre-processing shared with a
    LayerNorm's bias), which onnxruntime's type check refuses."""
    import onnxruntime

    try:
        onnxruntime.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime's exceptions share no base class
        target.unlink()
        raise RuntimeError(f"onnxruntime cannot load the file its tool wrote: {str(error)[:160]}") from None


def quantize(model: Path, out_dir: Path, kind: str, calibration: int) -> list[Path]:
    """The quantized files of `model` (written unless they exist)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    written = []
    stem = model.name.removesuffix(".onnx")
    if kind in ("dynamic", "both", "all"):
        target = out_dir / f"{stem}.dynamic.onnx"
        if not target.exists():
            quantize_dynamic(str(model), str(target), weight_type=QuantType.QInt8)
        written.append(target)
    formats = [("static", "static", QuantFormat.QDQ, QuantType.QInt8),
               ("operator", "qoperator", QuantFormat.QOperator, QuantType.QUInt8)]  # fmt: skip
    for name, suffix, quant_format, activations in formats:
        if kind not in (name, "all") and not (kind == "both" and name == "static"):
            continue
        target = out_dir / f"{stem}.{suffix}.onnx"
        if not target.exists():
            with tempfile.TemporaryDirectory() as scratch:
                prepared = Path(scratch) / "prepared.onnx"
                quant_pre_process(str(model), str(prepared))
                quantize_static(str(prepared), str(target), SeededInputs(model, calibration),
                                quant_format=quant_format, per_channel=True, activation_type=activations,
                                weight_type=QuantType.QInt8)  # fmt: skip
            _loadable(target)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", type=Path, help="ONNX models (float32)")
    parser.add_argument("-o", "--out", type=Path, default=Path("build/quantized"), help="where to write them")
    parser.add_argument("--kind", choices=("dynamic", "static", "operator", "both", "all"), default="both")
    parser.add_argument("--calibration", type=int, default=8, help="seeded inputs to calibrate static ranges on")
    parser.add_argument("--keep-going", action="store_true",
                        help="exit 0 although the tool failed on some models, not all (reported; what it did write "
                             "is kept): make sanitize checks the files there are")  # fmt: skip
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    failed = 0
    for model in (path.resolve() for path in args.models):  # before the scratch directory becomes the working one
        started = time.perf_counter()
        try:
            # in a scratch directory: the tool's shape inference leaves sym_shape_infer_temp.onnx and its external
            # data in the working directory when it fails (swin_t)
            with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
                files = quantize(model, out, args.kind, args.calibration)
        except Exception as error:  # the tool's failures share no base class; one model's does not stop the rest
            failed += 1
            print(f"{model.name}: onnxruntime's quantization failed: {str(error).splitlines()[0][:200]}")
            continue
        print(f"{model.name}: {', '.join(str(f) for f in files)} ({time.perf_counter() - started:.1f} s)")
    # --keep-going tolerates the tool failing on some models, not on every one (nothing written: a setup error)
    return 1 if failed and (not args.keep_going or failed == len(args.models)) else 0


if __name__ == "__main__":
    sys.exit(main())
