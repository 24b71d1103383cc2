"""oneDNN matmul with its constant weights packed dense vs with a padded row pitch (`c_library.padded_pitch`),
on every distinct weight GEMM of the shared models: kernorch's own library call (PlanExecutor), both variants
timed alternately, best median of `--rounds`.

    python bench/gemm_pitch.py [--models ../shared/models] [--threads 2] [--rounds 4]

Where oneDNN packs the weights itself (a blocked layout, e.g. brgemm with AVX-512) both variants are the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gemm_vs_mkl import geometric_mean, onednn_seconds, weight_gemms

from kernorch.codegen.library import onednn as c_library


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=str(Path(__file__).resolve().parents[2] / "shared" / "models"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    padded_pitch = c_library.padded_pitch
    print(f"{'M':>6} {'K':>6} {'N':>6}  {'pitch':>5}  {'dense us':>8}  {'padded us':>9}  {'dense/padded':>12}  models")
    ratios = []
    for (m, k, n), models in sorted(weight_gemms(Path(args.models)).items()):
        pitch = padded_pitch(m, n)
        if pitch is None:
            continue
        dense, padded = [], []
        for _ in range(args.rounds):
            c_library.padded_pitch = lambda rows, columns: None  # type: ignore[assignment]
            dense.append(onednn_seconds(m, k, n, args.threads))
            c_library.padded_pitch = padded_pitch
            padded.append(onednn_seconds(m, k, n, args.threads))
        ratios.append(min(dense) / min(padded))
        print(f"{m:>6} {k:>6} {n:>6}  {pitch:>5}  {min(dense) * 1e6:>8.1f}  {min(padded) * 1e6:>9.1f}  "
              f"{ratios[-1]:>12.2f}  {', '.join(models)}")
    print(f"geometric mean dense/padded time: {geometric_mean(ratios):.2f} over {len(ratios)} shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
