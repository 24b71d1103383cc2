"""Run kernorch over the model zoo: `kernorch check --compiled` (measured costs by default) on every model, then
`kernorch bench --quick` (kernorch's plan against onnxruntime and OpenVINO fp32, same threads), one table.

    .venv/bin/python bench/zoo/run.py ZOO_DIR [--cost profile|analytic] [--no-bench] [--only NAME ...]
                                      [--out bench/results/DATE-zoo.md] [--timeout SECONDS] [--resume]
                                      [--repeat N] [--quantized DIR [--kinds static,dynamic]]

Each model runs in a process of its own with a time limit, so one that hangs or dies is a row, not the end. The
table lists per model: its family, whether `check --compiled` passed (and its error), the operators that ran
through the onnxruntime fallback, kernorch's median latency, the best peer's, and the ratio. A JSON file beside
the table keeps every row, written after each model; `--resume` skips the models it already holds a measured
row for (a run of all 53 takes about 2 h when profiles are cold, so it can be split across sessions). Exits 1
when a model fails its check.

`--repeat N` benches every model N times, each time in a pass over the whole zoo, so a model's runs lie minutes
apart: a shared VM's speed drifts for minutes at a time (Zen 3, session 40: a model's ratio moved by up to 0.25
between two runs), and runs back to back share one state. The row keeps the run with the median ratio and shows
the range; rows `--resume` keeps are not benched again.

`--quantized DIR` runs the same over the zoo's quantized files instead, as bench/quantize.py writes them into DIR
(`bench/quantize.py ZOO_DIR/*.onnx -o DIR`): each model's `--kinds` (NAME.static.onnx: QDQ, per-channel;
NAME.dynamic.onnx: DynamicQuantizeLinear + MatMulInteger), one row each; a model the tool did not quantize (no
file) is a row saying so. `kernorch check --compiled` on a quantized file compares with onnxruntime on that file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kernorch.precision import PRECISIONS
from kernorch.tools.bench import OPENVINO_DEFAULT, PEERS

ROOT = Path(__file__).resolve().parents[2]


def _run(command: list[str], timeout: float) -> tuple[int, str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s"
    return done.returncode, done.stdout + done.stderr


def check(model: Path, cost: str, timeout: float, precision: str = "fp32") -> dict[str, Any]:
    started = time.perf_counter()
    code, output = _run([sys.executable, "-m", "kernorch.cli", "check", str(model), "--compiled", "--cost", cost,
                         "--precision", precision], timeout)  # fmt: skip
    row: dict[str, Any] = {"check_exit": code, "check_seconds": round(time.perf_counter() - started, 1)}
    error = re.search(r"rel err ([0-9.e+-]+|inf|nan) vs tolerance", output)
    row["rel_err"] = float(error.group(1)) if error else None
    arbitrated = re.search(r"arbitrated in exact arithmetic: (\d+) quantizer", output)
    if arbitrated and code == 0:  # beyond the tolerance, every divergence an exact rounding or a tie
        row["arbitrated"] = int(arbitrated.group(1))
    fallback = re.search(r"run through onnxruntime, not optimized by kernorch: (.*)", output)
    row["fallback"] = fallback.group(1).strip() if fallback else ""
    if code != 0:
        lines = [line for line in output.strip().splitlines() if line.strip()]
        row["error"] = lines[-1][:300] if lines else f"exit {code}"
    return row


def bench(model: Path, runs: int, timeout: float, precision: str = "fp32") -> dict[str, Any]:
    """kernorch against the bench's best peer: the faster of onnxruntime and OpenVINO f32, or with bf16 of
    onnxruntime and OpenVINO's default (bf16 where the CPU has it); each contender's error against onnxruntime."""
    code, output = _run([sys.executable, "-m", "kernorch.cli", "bench", str(model), "--quick", "--json",
                         "--runs", str(runs), "--precision", precision], timeout)  # fmt: skip
    if code != 0:
        lines = [line for line in output.strip().splitlines() if line.strip()]
        return {"bench_error": lines[-1][:300] if lines else f"exit {code}"}
    report, _ = json.JSONDecoder().raw_decode(output, output.index("{"))  # warnings may follow on stderr
    contenders = report["contenders"]
    peers = {name: contenders[name]["median_ms"] for name in PEERS if name in contenders}
    best = report["best_peer"]
    ours = contenders["kernorch"]["median_ms"]
    errors = {name: contenders[name].get("rel_err") for name in ("kernorch", *peers)}
    return {"kernorch_ms": ours, "best_peer": best, "best_peer_ms": contenders[best]["median_ms"],
            "ratio": contenders[best]["median_ms"] / ours, "peers_ms": peers, "errors": errors}  # fmt: skip


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The bench result with the median ratio (the lower middle of an even count) and every run's ratio."""
    ordered = sorted(runs, key=lambda run: run["ratio"])
    return {**ordered[(len(ordered) - 1) // 2], "ratios": [run["ratio"] for run in runs]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("zoo", type=Path)
    parser.add_argument("--cost", default="profile", choices=("profile", "analytic"))
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS, help="both commands' --precision: bf16 "
                        "against the faster of onnxruntime and OpenVINO's default")
    parser.add_argument("--no-bench", action="store_true")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--only", nargs="*", help="these models only (names as in export.json, spaces or commas)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / f"{datetime.date.today()}-zoo.md")
    parser.add_argument("--resume", action="store_true", help="skip the models the JSON beside --out already holds "
                        "a passing, benchmarked row for")  # fmt: skip
    parser.add_argument("--quantized", type=Path, help="the zoo's quantized files (bench/quantize.py -o DIR)")
    parser.add_argument("--kinds", default="static,dynamic", help="which quantized files, with --quantized")
    parser.add_argument("--repeat", type=int, default=1, help="bench each model this many times, in passes over the "
                        "whole zoo; the row keeps the median ratio and shows the range")  # fmt: skip
    args = parser.parse_args()
    if args.repeat < 1:
        print(f"run.py: --repeat must be at least 1, got {args.repeat}", file=sys.stderr)
        return 2
    exported = json.loads((args.zoo / "export.json").read_text())
    only = {name for names in args.only or [] for name in names.split(",") if name}
    if only - set(exported):
        print(f"run.py: no model {', '.join(sorted(only - set(exported)))} in {args.zoo / 'export.json'}",
              file=sys.stderr)  # fmt: skip
        return 2
    rows: dict[str, dict[str, Any]] = {}
    results = args.out.with_suffix(".json")
    if results.exists():
        rows = json.loads(results.read_text())
    benched: dict[str, tuple[Path, list[dict[str, Any]]]] = {}  # model -> its file and bench results
    runs = [(name, info, args.zoo / f"{name}.onnx") for name, info in exported.items()]
    if args.quantized:
        runs = [(f"{name}.{kind}", info, args.quantized / f"{name}.{kind}.onnx")
                for name, info in exported.items() for kind in args.kinds.split(",")]  # fmt: skip
    for name, info, model in runs:
        if not info["ok"] or (only and name.split(".")[0] not in only):
            continue
        if args.resume and rows.get(name, {}).get("check_exit") == 0 and ("ratio" in rows[name] or args.no_bench):
            print(f"{name}: kept from {results.name}", flush=True)
            continue
        if not model.exists():
            rows[name] = {"family": info["family"], "source": info["source"], "check_exit": None, "rel_err": None,
                          "fallback": "", "error": "not quantized (onnxruntime's tool wrote no file)"}  # fmt: skip
            continue
        checked = check(model, args.cost, args.timeout, args.precision)
        row = {"family": info["family"], "source": info["source"], **checked}
        if not args.no_bench and row["check_exit"] == 0:
            first = bench(model, args.runs, args.timeout, args.precision)
            row.update(first)
            benched[name] = (model, [first] if "ratio" in first else [])
        rows[name] = row
        print(f"{name}: check exit {row['check_exit']} ({row['check_seconds']} s)"
              + (f", {row.get('ratio', math.nan):.2f}x {row.get('best_peer', '')}" if "ratio" in row else "")
              + (f" -- {row['error']}" if "error" in row else "") + (f" -- {row['bench_error']}"
                                                                     if "bench_error" in row else ""), flush=True)
        results.write_text(json.dumps(rows, indent=1))
    for repeat in range(1, args.repeat):  # each pass over the whole zoo: a model's runs minutes apart
        for name, (model, runs_of) in benched.items():
            again = bench(model, args.runs, args.timeout, args.precision)
            if "ratio" in again:
                runs_of.append(again)
                rows[name].update(median_run(runs_of))
            print(f"{name}: run {repeat + 1} of {args.repeat}, "
                  + (f"{again['ratio']:.2f}x" if "ratio" in again else again.get("bench_error", "")), flush=True)
            results.write_text(json.dumps(rows, indent=1))
    text = table(rows, args.cost, args.precision)
    if args.out.exists() and "\n| model |" in (old := args.out.read_text()):  # notes written above the table stay
        text = old[:old.index("\n| model |") + 1] + text[text.index("| model |"):]
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 1 if any(r["check_exit"] not in (0, None) for r in rows.values()) else 0


def table(rows: dict[str, dict[str, Any]], cost: str, precision: str = "fp32") -> str:
    """The markdown table; with bf16, also kernorch's and OpenVINO default's errors against onnxruntime (float32)
    as the bench measured them."""
    bf16 = precision == "bf16"
    lines = [f"# Model zoo ({len(rows)} models; `check --compiled --cost {cost} --precision {precision}`, "
             "`bench --quick`)", "",
             "| model | family | check --compiled | rel err | onnxruntime fallback | kernorch ms | best peer ms | "
             "ratio |" + (" bench err: kernorch / openvino-default |" if bf16 else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if bf16 else "")]  # fmt: skip
    ratios = []
    for name, row in sorted(rows.items(), key=lambda item: (item[1]["family"], item[0])):
        verdict = "pass" if row["check_exit"] == 0 else row["error"] if row["check_exit"] is None else \
            f"FAIL: {row.get('error', '')}"  # fmt: skip
        if row.get("arbitrated"):
            verdict += f" (arbitrated: {row['arbitrated']} quantizers differ, each an exact rounding or a tie)"
        error = f"{row['rel_err']:.1e}" if row.get("rel_err") is not None else ""
        spread = f" ({min(row['ratios']):.2f}-{max(row['ratios']):.2f}x)" if len(row.get("ratios", [])) > 1 else ""
        timing = (f"{row['kernorch_ms']:.3f} | {row['best_peer_ms']:.3f} ({row['best_peer']}) | {row['ratio']:.2f}x"
                  f"{spread}" if "ratio" in row else f" | | {row.get('bench_error', '')}")  # fmt: skip
        if "ratio" in row:
            ratios.append(row["ratio"])
        errors = row.get("errors", {})
        against = " / ".join(f"{errors[k]:.1e}" if errors.get(k) is not None else "-"
                             for k in ("kernorch", OPENVINO_DEFAULT))  # fmt: skip
        lines.append(f"| {name} | {row['family']} | {verdict} | {error} | {row['fallback']} | {timing} |"
                     + (f" {against} |" if bf16 else ""))
    passed = sum(1 for row in rows.values() if row["check_exit"] == 0)
    checked = sum(1 for row in rows.values() if row["check_exit"] is not None)
    lines += ["", f"{passed} of {checked} pass `check --compiled`"
              + (f" ({len(rows) - checked} not quantized by onnxruntime's tool)." if checked < len(rows) else ".")]
    if ratios:
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        lines.append(f"Speed against the best peer: geometric mean {geomean:.2f}x over {len(ratios)} models, "
                     f"lowest {min(ratios):.2f}x, highest {max(ratios):.2f}x.")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
