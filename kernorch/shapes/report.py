"""What a model with symbolic dims runs each shape on, in words: `kernorch explain --range` and `kernorch explain
PLANS_DIR` print it.

A shape set has its own plan (prepared, or specialised once it was called HOT_IN_RANGE times in a range), runs on
the generic plan of the range that holds it (all the others of the range, and a specialised one the generic plan
measured faster on), or has neither (served by onnxruntime or planned on first use: `DynamicModel.runs_on`). A
generic plan's kernels either take the sizes (their code unified over the range: codegen/generic/) or are the same
program at every size of it.
"""

from __future__ import annotations

from kernorch.codegen.generic import GenericKernelBackend
from kernorch.codegen.library import PER_SHAPE_PRIMITIVES
from kernorch.frontend import bind, describe_shapes
from kernorch.shapes.dynamic import DynamicModel
from kernorch.shapes.generic import GenericPlan


def generic_plan_lines(plan: GenericPlan) -> list[str]:
    """The range's plan kernel by kernel: its primitives, where they came from, what runs it and whether it
    takes the sizes."""
    executor = plan.executor
    graph = executor.graph
    lines = [f"range [{plan.size_range.describe()}]: one plan, {len(executor.kernels)} kernels "
             f"({plan.generic_kernels} take the sizes), planned in {plan.seconds:.1f} s "
             f"({plan.rounds} orchestration(s)); sizes its polynomials take: "
             f"{', '.join(_units(plan)) or 'none'}"]  # fmt: skip
    for index, (kernel, backend) in enumerate(zip(executor.kernels, executor.backends, strict=True)):
        primitives = " → ".join(graph.nodes[n].prim for n in kernel.nodes)
        origins = sorted({graph.nodes[n].origin for n in kernel.nodes})
        if isinstance(backend, GenericKernelBackend) and backend.takes_sizes:
            how = f"{backend.code.inner.name}, generic over {', '.join(sorted(backend.code.source.used))}"
            if backend.stateful and "_entry;" in backend.code.source.text:  # codegen/library/run_sizes.py
                how += f" (a primitive created per shape on its first call, the last {PER_SHAPE_PRIMITIVES} kept)"
        elif isinstance(backend, GenericKernelBackend):
            how = f"{backend.code.inner.name}, the same code at every size"
        else:
            how = f"{backend.name}, the same shapes at every size" if backend.runs_code else "a view (no code)"
        lines.append(f"  kernel {index} [{primitives}] from {', '.join(origins)[:80]}: {how}")
    return lines


def shape_lines(model: DynamicModel) -> list[str]:
    """Each shape set with a plan of its own, and what it runs on; each range, and what it holds."""
    lines = []
    for shapes in model.specialisations:
        lines.append(f"[{describe_shapes(shapes)}]: {model.runs_on(shapes)}"
                     + (" (specialised, measured slower than the generic plan)" if shapes in model.generic_first
                        else ""))  # fmt: skip
    for plan in model.generic_plans:
        own = sum(plan.size_range.contains(bind(model.signature, dict(shapes), empty=True))
                  for shapes in model.specialisations)  # fmt: skip
        lines.append(f"every other shape of [{plan.size_range.describe()}]: its generic plan ({own} shape set(s) of "
                     f"it specialised, {plan.calls} call(s) on the generic plan)")  # fmt: skip
    for spec, why in model.range_refusals.items():
        lines.append(f"[{spec}]: no generic plan ({why}); its shapes are served as other new shapes")
    return lines or ["no shape set has a plan yet"]


def _units(plan: GenericPlan) -> list[str]:
    return [f"{name} / {step}" if step > 1 else name for name, lo, hi, step in plan.size_range.bounds if lo < hi]

