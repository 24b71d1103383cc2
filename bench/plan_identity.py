"""Is the C this checkout generates for saved plans byte-identical to what they ship? For refactors that must
not change behaviour: save plans with the code before (`kernorch optimize MODEL --cost analytic -o DIR`, in a
worktree of the old commit), then run this with the code after.

    .venv/bin/python bench/plan_identity.py PLAN_DIR [PLAN_DIR ...]

Per plan: "identical" (kernels.c, rTask variants included, regenerated from plan.json equals the shipped file),
or the first line that differs. Exits 1 when any differs. Nothing is compiled.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from kernorch.runtime.artifact import ArtifactError, read_manifest, read_plan
from kernorch.runtime.executor import generate_source


def compare(directory: Path) -> str | None:
    """None when identical, else where the regenerated source first differs."""
    try:
        saved = read_plan(directory)
    except ArtifactError as error:
        if "is not the code plan.json generates" not in str(error):
            raise
        read_manifest(directory)
        shipped = (directory / "kernels.c").read_text().splitlines()
        # the manifest is intact, so the kernels are those of plan.json: regenerate without the check
        return _first_difference(shipped, _regenerated(directory))
    backends = Counter(b.name for b in generate_source(saved.kernels)[1].backends)
    print(f"  backends: {dict(sorted(backends.items()))}")
    return None


def _regenerated(directory: Path) -> list[str]:
    import json

    from kernorch.ir.kernel import make_kernel
    from kernorch.ir.serialize import graph_from_json

    plan = json.loads((directory / "plan.json").read_text())
    graph = graph_from_json(plan["graph"], (directory / "weights.npz").read_bytes())
    kernels = [make_kernel(graph, tuple(k["nodes"]), tuple(k["outputs"])) for k in plan["kernels"]]
    return generate_source(kernels)[0].splitlines()


def _first_difference(shipped: list[str], regenerated: list[str]) -> str:
    for number, (old, new) in enumerate(zip(shipped, regenerated, strict=False), 1):
        if old != new:
            return f"line {number}: shipped {old[:100]!r}, regenerated {new[:100]!r}"
    return f"lengths differ: {len(shipped)} shipped lines, {len(regenerated)} regenerated"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plans", nargs="+", type=Path)
    args = parser.parse_args()
    differing = 0
    for directory in args.plans:
        print(f"{directory}:")
        difference = compare(directory)
        print(f"  {'identical' if difference is None else 'DIFFERS: ' + difference}")
        differing += difference is not None
    print(f"{len(args.plans) - differing} of {len(args.plans)} plans generate byte-identical C")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
