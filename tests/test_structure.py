"""The folder tree is the architecture: which stage may import which, checked from the source.

Every `import kernorch.X` / `from kernorch.X import ...` in a stage's modules (also inside functions and
`if TYPE_CHECKING:` blocks; tests excluded) is an edge stage → stage. The edges must form a DAG that respects
the pipeline's layers. The same holds module by module (no import circle, however it is hidden), within
codegen/ between its subpackages, and no module imports another module's private (`_name`) names.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import kernorch
from kernorch.devtools.mutate import here

PACKAGE = Path(kernorch.__file__).parent
# Leaf modules anything may use: they import no stage.
BASE = {"errors", "options", "machine", "signing"}
# stage -> the stages it may import (besides itself and BASE)
ALLOWED = {
    "ir": set(),
    "frontend": {"ir"},
    "fission": {"ir", "frontend"},
    "rewrite": {"ir"},
    "schedule": set(),  # rPrograms: units, barriers, the wavefront policy, the simulator (data only)
    "codegen": {"ir", "schedule"},  # schedule: the units a plan offers for an rProgram
    "runtime": {"ir", "codegen", "schedule"},
    "cost": {"ir", "codegen", "runtime"},
    "layout": {"ir", "cost"},  # cost: the cost-model interface its decisions are measured with
    "precision": {"ir", "cost"},  # likewise: a linear primitive's bf16 and float32 twins priced alone
    "orchestrate": {"ir", "cost"},
    # whole plans compiled and timed end to end: the orchestrator's alternatives, run by the runtime
    "validate": {"ir", "orchestrate", "runtime", "cost"},
    "pipeline": {"ir", "frontend", "fission", "rewrite", "layout", "precision", "orchestrate", "cost", "runtime",
                 "validate"},
    # one plan per concrete shape of a model with symbolic dims; fission: the padding proof reads the primitives
    # codegen: a range's generic plan unifies its kernels' code rendered at several sizes (shapes/generic.py)
    "shapes": {"ir", "frontend", "fission", "pipeline", "runtime", "codegen"},
    "api": {"pipeline", "runtime", "frontend", "shapes"},  # frontend: a torch module is exported to ONNX first
    "torch_backend": {"api", "frontend", "shapes"},
    "tools": {"ir", "frontend", "fission", "rewrite", "orchestrate", "cost", "codegen", "runtime", "pipeline", "api",
              "schedule", "shapes", "precision", "validate"},
    # helpers for tests: models, the rewrite rules' graphs, the native kernels' C for every ISA
    "testing": {"ir", "frontend", "fission", "rewrite", "codegen", "runtime", "tools", "api"},
    "cli": {"api", "pipeline", "frontend", "orchestrate", "rewrite", "codegen", "runtime", "tools", "shapes",
            "precision"},
    # on-demand tools driving the CLI and tests; the compile check plans a model and compiles its candidates
    "devtools": {"api", "cli", "testing", "tools", "ir", "runtime", "pipeline", "cost", "codegen"},
    "__init__": {"api", "fission", "frontend", "runtime", "torch_backend"},  # plus BASE (Options)
}


def stage_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _module_imports(path: Path) -> set[str]:
    """The kernorch modules `path` imports (anywhere in it: inside functions and TYPE_CHECKING blocks too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kernorch."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("kernorch.")}
    return found


def import_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name.endswith("_test.py"):
            continue
        source = stage_of(path)
        for name in _module_imports(path):
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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py") if not p.name.endswith("_test.py")}


def _exports(module: str) -> set[str]:
    """The names a package's `__init__` lists in `__all__` (a name exported there shadows a module of that name)."""
    path = MODULES.get(module)
    if path is None or path.name != "__init__.py":
        return set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {ast.literal_eval(e) for e in node.value.elts} if isinstance(node.value, ast.List) else set()
    return set()


def module_imports() -> dict[str, list[tuple[str, list[str]]]]:
    """Per module, every kernorch module it imports (anywhere in it) with the names it takes from it. `from
    package import submodule` is an import of the submodule; a package's `__init__` run by importing one of its
    own submodules is Python's doing, not an edge."""
    found: dict[str, list[tuple[str, list[str]]]] = {}
    for name, path in MODULES.items():
        edges = found.setdefault(name, [])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kernorch"):
                names = [alias.name for alias in node.names]
                exported = _exports(node.module)
                submodules = [f"{node.module}.{n}" for n in names
                              if f"{node.module}.{n}" in MODULES and n not in exported]  # fmt: skip
                edges += [(module, []) for module in submodules]
                rest = [n for n in names if f"{node.module}.{n}" not in submodules]
                if rest:
                    edges.append((node.module, rest))
            elif isinstance(node, ast.Import):
                edges += [(alias.name, []) for alias in node.names if alias.name in MODULES]
    return found


def test_modules_have_no_import_circle() -> None:
    graph = {m: {t for t, _ in edges if t != m and not m.startswith(t + ".")} for m, edges in module_imports().items()}
    state: dict[str, int] = {}  # 1 visiting, 2 done
    path: list[str] = []

    def visit(module: str) -> None:
        if state.get(module) == 2:
            return
        assert state.get(module) != 1, f"import circle: {' → '.join([*path[path.index(module):], module])}"
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        visit(module)


def test_no_module_imports_a_private_name_of_another() -> None:
    taken = [(m, t, n) for m, edges in module_imports().items() for t, names in edges for n in names
             if n.startswith("_") and t != m]  # fmt: skip
    assert not taken, f"private names imported across modules: {taken}"


# codegen/ inside: the subpackage (or top-level module) -> what it may import (besides itself)
CODEGEN = "kernorch.codegen"
CODEGEN_ALLOWED = {
    "loops": set(),  # the loop description and its index algebra
    "gir": {"loops", "target"},  # the GIR, its lowering, rules and passes: no language in it
    "c": {"loops", "gir", "target"},  # C from the GIR
    "library": {"loops", "c"},  # oneDNN calls; their post-ops written in C
    "native": {"loops", "library", "c", "backend"},  # hand-written kernels (oneDNN-shaped calls, templates)
    "views": set(),
    "target": set(),
    # the Backend interface and the kinds of backend a kernel family instantiates (BACKEND_KINDS): what native/
    # imports of backends/, never the registry, which imports every native family
    "backend": {"loops", "gir", "c", "library"},
    "triton": {"loops", "gir", "target"},  # Triton from the loop description; gir: which phases read transposed
    "backends": {"loops", "gir", "c", "library", "native", "views", "backend", "target", "triton"},  # the registry
    "program": {"backends", "backend", "c", "library", "target", "triton"},  # the whole-plan program, compiler
    "generic": {"backend", "c"},  # one kernel's code for a range of sizes, its entry point in a plan (c: how C
    # receives the sizes)
}


REGISTRY = f"{CODEGEN}.backends.registry"
BACKEND_KINDS = {f"{CODEGEN}.backends.{name}" for name in ("base", "library_calls", "templates")}


def codegen_part(module: str) -> str | None:
    if module in BACKEND_KINDS:
        return "backend"
    parts = module.split(".")
    return parts[2] if module.startswith(CODEGEN + ".") and len(parts) > 2 else None


def test_codegen_subpackages_import_only_their_layer() -> None:
    for module, edges in module_imports().items():
        source = codegen_part(module)
        if source is None:
            continue
        assert source in CODEGEN_ALLOWED, f"{module}: codegen part {source!r} has no declared layer"
        for target, _ in edges:
            part = codegen_part(target)
            if part is not None and part != source:
                assert part in CODEGEN_ALLOWED[source], f"{module} imports {target} ({source} → {part})"
    assert "c" not in CODEGEN_ALLOWED["gir"]


def test_outsiders_import_a_codegen_subpackage_only_through_its_init() -> None:
    """A subpackage's `__init__` exports the few names others use; its modules are its own business. The one
    exception is the registry, which lists every native kernel family by its module (each declares its BACKEND)."""
    reached = []
    for module, edges in module_imports().items():
        for target, _ in edges:
            part = codegen_part(target)
            if part is None or len(target.split(".")) < 4 or codegen_part(module) == part:
                continue
            if module == REGISTRY and part == "native":
                continue
            if (MODULES.get(f"{CODEGEN}.{part}", Path()).name == "__init__.py"
                    and MODULES[f"{CODEGEN}.{part}"].parent.name == part):  # a subpackage, not a module
                reached.append(f"{module} → {target}")
    assert not reached, reached


def test_every_native_kernel_family_is_registered() -> None:
    """A module of codegen/native/ that declares a BACKEND is a kernel family: the registry asks it (one line in
    its order), and nothing else lists it."""
    from kernorch.codegen.backends import registered

    native = Path(__file__).resolve().parents[1] / "kernorch" / "codegen" / "native"
    declared = sorted(p.stem for p in native.glob("*.py") if "\nBACKEND = " in p.read_text())
    assert len(declared) >= 10, declared
    asked = [name for name in declared if importlib.import_module(f"{CODEGEN}.native.{name}").BACKEND in registered()]
    assert asked == declared


def test_every_native_kernel_family_has_its_test_its_sanitizer_marker_and_its_mutants() -> None:
    """One room: a family's test sits beside it, is marked for `make sanitize`, and declares mutants of the family's
    own code that `make mutate` collects."""
    from kernorch.devtools.mutate import collected

    native = Path(__file__).resolve().parents[1] / "kernorch" / "codegen" / "native"
    mutated = {mutant.file for mutant in collected()}
    for family in (p for p in native.glob("*.py") if "\nBACKEND = " in p.read_text()):
        test = family.with_name(f"{family.stem}_test.py")
        assert test.exists(), f"{family.name} has no test beside it"
        assert "pytest.mark.sanitize" in test.read_text(), f"{test.name} is not marked for the sanitizers"
        assert f"kernorch/codegen/native/{family.name}" in mutated, f"no mutant of {family.name}"


def test_no_backend_name_is_compared_as_a_string_outside_the_registry() -> None:
    """What runs a kernel is a Backend object: callers read its attributes, never match its name. (A comparison
    of a primitive's name — `node.prim == "lstm_stack"` — is about the primitive, not a backend.)"""
    from kernorch.codegen.backends import registered

    names = {backend.name for backend in registered()} | {"library"}  # "library": the name before the registry
    found = []
    for name, path in MODULES.items():
        if name.startswith(f"{CODEGEN}.backends"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare) or isinstance(node.left, ast.Attribute) and node.left.attr == "prim":
                continue
            operands = [node.left, *node.comparators]
            operands += [e for c in node.comparators if isinstance(c, ast.Tuple | ast.List | ast.Set) for e in c.elts]
            if any(isinstance(o, ast.Constant) and o.value in names for o in operands):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


if __name__ == "__main__":  # print the graphs: python tests/test_structure.py
    for stage, targets in sorted(import_edges().items()):
        print(f"{stage:<12} → {', '.join(sorted(targets))}")
    parts: dict[str, set[str]] = {}
    for module, edges in module_imports().items():
        if (source := codegen_part(module)) is not None:
            parts.setdefault(source, set()).update(
                p for t, _ in edges if (p := codegen_part(t)) is not None and p != source)
    print()
    for part, targets in sorted(parts.items()):
        print(f"codegen/{part:<9} → {', '.join(sorted(targets))}")


def test_stages_that_price_kernels_import_the_cost_interface_only() -> None:
    """orchestrate, layout and precision ask a cost model through cost/interface.py, which imports no codegen;
    no module of them imports a cost model or cost/model.py (which loads codegen's backends)."""
    for stage in ("orchestrate", "layout", "precision"):
        for path in (PACKAGE / stage).rglob("*.py"):
            if path.name.endswith("_test.py"):
                continue
            cost = {m for m in _module_imports(path) if m == "kernorch.cost" or m.startswith("kernorch.cost.")}
            assert cost <= {"kernorch.cost.interface"}, f"{path.relative_to(PACKAGE)} imports {sorted(cost)}"
    interface = _module_imports(PACKAGE / "cost" / "interface.py")
    assert not {m for m in interface if m.split(".")[1] not in ("ir",)}, interface


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    # the backend registry
    here("a caller matches a backend's name instead of reading its attributes",
         "priced = (self.base.cost(candidate) if backend.runs_code else 0.0, None)",
         'priced = (self.base.cost(candidate) if backend.name != "view" else 0.0, None)',
         file="kernorch/cost/model.py"),
]  # fmt: skip


# fixed preambles: parameter-free C text a unit (or every AMX kernel) starts with
C_PREAMBLES = {"c/prelude.py", "native/amx_product.py", "native/preambles.py"}


def test_c_emitters_write_through_the_writer() -> None:
    """No emitter indents C by hand or writes its own closing braces and `return 0;`: they say block, function,
    line to codegen/c/writer.py's CWriter. A string constant starting an indented closer is a hand-written one
    (the preambles above are the known exceptions)."""
    import re

    closer = re.compile(r"^ {4,}(\}|return 0;)", re.M)
    codegen = PACKAGE / "codegen"
    found = {}
    for path in codegen.rglob("*.py"):
        relative = path.relative_to(codegen).as_posix()
        if path.name.endswith("_test.py") or relative in C_PREAMBLES:
            continue
        count = sum(len(closer.findall(node.value)) for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.Constant) and isinstance(node.value, str))  # fmt: skip
        if count:
            found[relative] = count
    assert not found, found
    assert all((codegen / name).exists() for name in C_PREAMBLES)
