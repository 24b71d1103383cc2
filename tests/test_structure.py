"""The folder tree is the architecture: which stage may import which, checked from the source.

Every `import kernorch.X` / `from kernorch.X import ...` in a stage's modules (also inside functions;
tests excluded) is an edge stage → stage. The edges must form a DAG that respects the pipeline's layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kernorch

PACKAGE = Path(kernorch.__file__).parent
# Leaf modules anything may use: they import no stage.
BASE = {"errors", "options", "machine"}
# stage -> the stages it may import (besides itself and BASE)
ALLOWED = {
    "ir": set(),
    "frontend": {"ir"},
    "fission": {"ir", "frontend"},
    "rewrite": {"ir", "runtime"},  # runtime: the reference interpreter in its test helpers
    "schedule": set(),  # rPrograms: units, barriers, the wavefront policy, the simulator (data only)
    "codegen": {"ir", "schedule"},  # schedule: the units a plan offers for an rProgram
    "runtime": {"ir", "codegen", "schedule"},
    "cost": {"ir", "codegen", "runtime"},
    "layout": {"ir", "cost"},  # cost: the cost-model interface its decisions are measured with
    "orchestrate": {"ir", "cost"},
    "pipeline": {"ir", "frontend", "fission", "rewrite", "layout", "orchestrate", "cost", "runtime"},
    "api": {"pipeline", "runtime", "frontend"},  # frontend: a torch module is exported to ONNX first
    "torch_backend": {"api", "frontend"},
    "tools": {"ir", "frontend", "fission", "rewrite", "orchestrate", "cost", "codegen", "runtime", "pipeline", "api",
              "schedule"},
    "testing": {"ir", "frontend", "fission", "runtime", "tools"},
    "cli": {"api", "pipeline", "frontend", "orchestrate", "rewrite", "codegen", "runtime", "tools"},
    # on-demand tools driving the CLI and tests; the compile check plans a model and compiles its candidates
    "devtools": {"api", "cli", "testing", "tools", "ir", "runtime", "pipeline", "cost", "codegen"},
    "__init__": {"api", "fission", "frontend", "runtime", "torch_backend"},  # plus BASE (Options)
}


def stage_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def import_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name.endswith("_test.py"):
            continue
        source = stage_of(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kernorch."):
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.startswith("kernorch.")]
            for name in names:
                target = name.split(".")[1]
                if target != source:
                    edges.setdefault(source, set()).add(target)
    return edges


def test_every_stage_imports_only_what_its_layer_allows() -> None:
    edges = import_edges()
    assert set(edges) - BASE <= set(ALLOWED), f"modules with no declared layer: {set(edges) - BASE - set(ALLOWED)}"
    for source, targets in edges.items():
        allowed = ALLOWED.get(source, set()) | BASE
        assert targets <= allowed, f"{source} imports {sorted(targets - allowed)}"
    for base in BASE:
        assert edges.get(base, set()) <= BASE, f"{base} must stay a leaf, imports {edges[base]}"


def test_stage_imports_have_no_cycle() -> None:
    edges = import_edges()
    visiting: list[str] = []
    done: set[str] = set()

    def visit(stage: str) -> None:
        assert stage not in visiting, f"import cycle: {' → '.join([*visiting[visiting.index(stage):], stage])}"
        if stage in done:
            return
        visiting.append(stage)
        for target in sorted(edges.get(stage, ())):
            visit(target)
        visiting.pop()
        done.add(stage)

    for stage in sorted(edges):
        visit(stage)


def test_key_rules_of_the_issue() -> None:
    edges = import_edges()
    for below in ("cost", "codegen", "runtime", "ir"):
        assert "orchestrate" not in edges.get(below, set()), f"{below} imports orchestrate"
    assert "fission" not in edges.get("rewrite", set())


if __name__ == "__main__":  # print the graph: python tests/test_structure.py
    for stage, targets in sorted(import_edges().items()):
        print(f"{stage:<12} → {', '.join(sorted(targets))}")
