"""`make sanitize`: the generated C and the native kernels built with AddressSanitizer and UndefinedBehaviorSanitizer
(float-to-integer overflow included), then run on the random-plan tests, the ONNX semantics property test, the
native kernels' own tests (those marked `sanitize`), the concurrency tests, the compiled ONNX node tests, every
shared model and every quantized one (`--quantized DIR`: the static QDQ, dynamic and QOperator files
bench/quantize.py writes; the int8 kernels, their requantizing epilogues and the quantizers' generated C on real
models).

Each step runs in a child process with the sanitizers' runtimes preloaded and KERNORCH_SANITIZE=1 (the compile
cache keys sanitized libraries apart, in a cache directory of their own). A report stops its process
(halt_on_error) after it is printed (pytest runs with -s: a captured stream would die with the process); the run
prints each step's verdict, every report, and their number, and exits 1 when there is any (or a step failed
otherwise), 0 with zero reports.

    python -m kernorch.devtools.sanitize [--quick] [--models DIR] [--quantized DIR] [--cache DIR] [--only TEXT]

`--quick` runs the semantics property test's groups of the dtypes generated C handles only (what the test suite
runs, tests/test_sanitize.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTEST_STEPS = {
    "random plans and layout kernels": ["kernorch/runtime/executor_test.py"],
    "rProgram runtime": ["kernorch/runtime/rprogram_test.py"],
    "one model, many callers": ["kernorch/runtime/concurrency_test.py"],
    "ONNX semantics, every dtype": ["tests/test_onnx_semantics.py"],
    # every test module marked `pytestmark = pytest.mark.sanitize`: each native kernel family's, the loop kernels'
    "native kernels (the sanitize marker)": ["-m", "sanitize and not slow", "kernorch"],
    "bf16 library calls, bfloat16 values between kernels, activations on NaN": [
        "kernorch/precision/precision_test.py", "kernorch/precision/storage_test.py",
        "kernorch/codegen/library/epilogue_test.py"],
    "Reduce semantics, the fast math's thresholds, a short soak": [
        "tests/test_reduce_semantics.py", "tests/test_transcendental_edges.py", "tests/test_soak.py"],
    "compiled ONNX node tests (subset)":
        ["tests/test_conformance.py::test_compiled_path_passes_what_the_reference_passes"],
}  # fmt: skip
QUICK_STEPS = {
    "ONNX semantics, the dtypes of generated C": ["tests/test_onnx_semantics.py", "-k",
                                                  "int64 or int32 or float32 or float64 or bool-ops"],
}  # fmt: skip


def runtimes() -> list[str]:
    """The sanitizers' shared runtimes of the C compiler kernorch uses (to preload: ASan must come first)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or "gcc"
    found = []
    for name in ("libasan.so", "libubsan.so"):
        path = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True, text=True,
                              check=False).stdout.strip()  # fmt: skip
        if not path or not Path(path).exists():
            raise SystemExit(f"sanitize: {compiler} has no {name} (install gcc's sanitizer runtimes)")
        found.append(path)
    return found


REPORT = re.compile(r"(runtime error:|ERROR: AddressSanitizer|ERROR: LeakSanitizer)")


def environment(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "KERNORCH_SANITIZE": "1", "KERNORCH_CACHE": str(cache), "LD_PRELOAD": ":".join(runtimes()),
        # leaks are Python's and torch's by design; a report stops the process with its own exit code
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:exitcode=66",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=67",
    })  # fmt: skip
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernorch.devtools.sanitize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="only the semantics test's generated-C groups")
    parser.add_argument("--models", type=Path, default=ROOT.parent / "shared" / "models",
                        help="ONNX models checked compiled under the sanitizers (default ../shared/models)")
    parser.add_argument("--quantized", type=Path, default=ROOT / "build" / "quantized",
                        help="quantized models checked the same way (default build/quantized, which `make sanitize` "
                             "fills with bench/quantize.py)")  # fmt: skip
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "kernorch-sanitize",
                        help="compile cache of the sanitized libraries")  # fmt: skip
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="only the steps whose name contains TEXT (repeatable): a failed step run again, e.g. "
                             "--only candy.dynamic")  # fmt: skip
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    env = environment(args.cache)
    steps: dict[str, list[str]] = {}
    pytest = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-x"]
    for name, arguments in (QUICK_STEPS if args.quick else PYTEST_STEPS).items():
        steps[name] = [*pytest, *arguments]
    if not args.quick:
        quantized = sorted(args.quantized.glob("*.onnx")) if args.quantized.is_dir() else []
        if not quantized:
            print(f"no quantized models in {args.quantized} (bench/quantize.py MODELS -o DIR writes them): the int8 "
                  "kernels run only in their own tests", flush=True)  # fmt: skip
        for model in [*sorted(args.models.glob("*.onnx")), *quantized]:
            kind = "quantized model" if model in quantized else "model"
            steps[f"{kind} {model.stem}"] = [sys.executable, "-m", "kernorch.cli", "check", str(model), "--compiled",
                                             "--cost", "analytic"]  # fmt: skip
    if args.only:
        steps = {name: command for name, command in steps.items() if any(text in name for text in args.only)}
        if not steps:
            print(f"no step's name contains {' or '.join(args.only)}", file=sys.stderr)
            return 2
    failed = found = 0
    for name, command in steps.items():
        started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        lines = (done.stdout + done.stderr).splitlines()
        reports = [i for i, line in enumerate(lines) if REPORT.search(line)]
        found += len(reports)
        verdict = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
        failed += done.returncode != 0
        print(f"{name}: {verdict}, {len(reports)} report(s) ({time.perf_counter() - started:.0f} s)", flush=True)
        for i in reports:
            print("    " + "\n    ".join(lines[i: i + 12]), flush=True)
        if done.returncode != 0 and not reports:
            print("    " + "\n    ".join(lines[-15:]), flush=True)
    print(f"sanitizer reports: {found}; steps failed: {failed} of {len(steps)}")
    return 1 if found or failed else 0


if __name__ == "__main__":
    sys.exit(main())
