"""Prediction error before and after costs in place, and what whole-plan validation kept, per model (issue 43).

    .venv/bin/python bench/plan_validation.py MODEL.onnx ... [--in-plan 2] [--validate 3] [--json-dir DIR]

Each model runs `kernorch optimize MODEL --in-plan R --validate K --json` in a process of its own (profiles
from the default cache; a model not tuned before is tuned first), then one markdown table: per model the
plan's cost on isolated profiles against its measured end-to-end time (the error the BLP optimized with), the
same plan's cost on in-plan costs (the error after), the plans measured in place, the plan validation kept
and its measured time against the optimum's, and the seconds both steps took. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def optimize(model: Path, in_plan: int, validate: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "kernorch.cli", "optimize", str(model), "--in-plan", str(in_plan),
               "--validate", str(validate), "--json"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        return {"error": lines[-1][:200]}
    result: dict[str, Any] = json.loads(done.stdout[done.stdout.index("{"):])
    return result


def row(name: str, report: dict[str, Any]) -> str:
    if "error" in report:
        return f"| {name} | {report['error']} |" + " |" * 7
    rounds = report["in_plan"]["rounds"]
    first = rounds[0]
    validation = report["validation"]
    plans = validation["plans"]
    kept = plans[validation["chosen"]]
    optimum = plans[0]
    gain = optimum["measured_ms"] / kept["measured_ms"] if kept["measured_ms"] else float("nan")
    after = ", ".join(f"{r['error_after']:.0%}" for r in rounds)
    seconds = report["in_plan"]["seconds"] + validation["seconds"]
    return (f"| {name} | {first['isolated_ms']:.3f} | {first['in_plan_ms']:.3f} | {first['measured_ms']:.3f} | "
            f"{first['error_before']:.0%} | {after} | {len(rounds)} | {kept['source']} | {gain:.3f}x | "
            f"{seconds:.0f} |")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--in-plan", type=int, default=2)
    parser.add_argument("--validate", type=int, default=3)
    parser.add_argument("--json-dir", type=Path, help="also keep each model's optimize --json output here")
    args = parser.parse_args()
    print("| model | optimum: isolated ms | in place ms | measured ms | error before | error after (each plan "
          "measured) | plans measured in place | kept | kept vs optimum, end to end | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models:
        report = optimize(model, args.in_plan, args.validate)
        if args.json_dir is not None:
            args.json_dir.mkdir(parents=True, exist_ok=True)
            (args.json_dir / f"{model.stem}.json").write_text(json.dumps(report, indent=1))
        print(row(model.stem, report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
