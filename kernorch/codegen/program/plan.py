"""Render a whole plan as one C translation unit with three entry points.

- `<prefix>_create(buffers)`: once, when the plan is loaded: a oneDNN engine and stream, and every library
  kernel's primitive with its weights packed (library/onednn.py). Returns the plan state, or NULL with the
  reason in `<prefix>_error()`.
- `<prefix>_run(state, buffers, first, last)`: runs kernels first..last-1 in plan order, each reading and
  writing the buffers the table points to. Returns 0, or k+1 when kernel k failed. Python calls it once per
  stretch of native kernels (a kernel only the reference interpreter runs splits the plan).
- `<prefix>_destroy(state)`.
- `<prefix>_region(state, buffers, entries, offsets, veus, trace)`: one region of an rProgram (schedule/): the
  plan's units (a generated kernel's phases, each library or opaque kernel) run as rTasks by the threads of one
  parallel region, each following its own list of entries (codegen/program/rprogram.py); `<prefix>_program` runs a
  stretch of regions and device-wide calls with one foreign call. The lists are data: the same library runs the
  plan kernel by kernel and as any rProgram. Only with `tasks` (the executor's plans; the profiler's one-kernel
  plans have none).

`buffers` is a table of pointers, one per value the native kernels touch (`NativePlan.slots`). Symbols of
kernels are derived from the prefix and the kernel's position, and the source is regenerated from the plan
when a saved plan is loaded, so the two always agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernorch.codegen.backends import Backend, choose_backend
from kernorch.codegen.c import PRELUDE, CWriter
from kernorch.codegen.library import ONEDNN_PRELUDE
from kernorch.codegen.program.rprogram import MAX_VEUS, UnitCall, render_region_runner
from kernorch.ir.kernel import CandidateKernel
from kernorch.schedule.program import Unit

# Why the last call failed, per calling thread (calls run concurrently in workspaces of their own). A generated
# kernel returns its `err` bits: 1 a gather index out of range, 2 an integer division or modulo by zero.
ERROR_BUFFER = """#ifndef KO_ERROR_DEFINED
#define KO_ERROR_DEFINED
static __thread char ko_error[512];
#endif
"""
_KERNEL_ERROR = """static int ko_kernel_failed(int k, int err) {
    snprintf(ko_error, sizeof ko_error, "kernel %d: %s", k, (err & 1) ? "gather index out of range"
             : (err & 2) ? "integer division or modulo by zero" : "failed");
    return k + 1;
}
"""


@dataclass(frozen=True)
class NativePlan:
    prefix: str
    body: str  # the kernels and entry points, without the translation unit's prelude
    slots: dict[str, int]  # value -> its position in the buffer table
    backends: tuple[Backend, ...]  # per kernel; those not native run by Python
    uses_onednn: bool
    units: tuple[Unit, ...] = ()  # with tasks: what an rProgram schedules, in plan order
    tasks: bool = False  # rendered with its rTask variants and region runner (an rProgram can run it)

    @property
    def native(self) -> tuple[bool, ...]:
        return tuple(b.native for b in self.backends)

    @property
    def source(self) -> str:
        return translation_unit([self])


def translation_unit(plans: list[NativePlan]) -> str:
    """One compilable source holding `plans` (the profiler batches many one-kernel plans)."""
    onednn = any(p.uses_onednn for p in plans)
    head = ERROR_BUFFER + (ONEDNN_PRELUDE if onednn else "") + PRELUDE + _KERNEL_ERROR
    return head + "\n".join(p.body for p in plans)


def render_plan(prefix: str, kernels: list[CandidateKernel], backends: list[Backend] | None = None,
                tasks: bool = False) -> NativePlan:  # fmt: skip
    """The plan's native code; `backends` (from choose_backend) may be passed when already known. Each kernel
    takes its backend's shape: a function (`int name(void **args)`, its scratch allocated here), a library-shaped
    create/run/destroy against the plan's oneDNN engine (`Backend.stateful`), or nothing (an alias). With
    `tasks`, also every unit as rTasks and the rProgram region runner."""
    chosen = backends or [_backend(k) for k in kernels]
    slots: dict[str, int] = {}
    for kernel, backend in zip(kernels, chosen, strict=True):
        if backend.native:
            for value in (*kernel.inputs, *kernel.outputs):
                slots.setdefault(value, len(slots))
    parts: list[str] = []
    calls: list[str] = []
    creates: list[str] = []
    destroys: list[str] = []
    onednn = False
    max_args = 1
    scratch: list[int] = []  # bytes of every scratch buffer of the plan, allocated in create
    unit_calls: list[UnitCall] = []
    for k, (kernel, backend) in enumerate(zip(kernels, chosen, strict=True)):
        if not backend.native:
            unit_calls.append(UnitCall(Unit(k, 0, 1, splittable=False, native=False), "", ""))
            continue
        if not backend.runs_code:  # its output's slot already points at the input's bytes
            calls.append(f"case {k}: break;")
            continue
        name = f"{prefix}_k{k}"
        arguments = [slots[v] for v in (*kernel.inputs, *kernel.outputs)]
        parts.append(f"static const int {name}_slots[] = {{{', '.join(map(str, arguments))}}};")
        gather = f"for (int i = 0; i < {len(arguments)}; i++) args[i] = buffers[{name}_slots[i]];"
        if not backend.stateful:
            sizes = backend.scratch_bytes(kernel)
            for j in range(len(sizes)):
                gather += f" args[{len(arguments) + j}] = p->scratch[{len(scratch) + j}];"
            scratch += sizes
            arguments += [-1] * len(sizes)
        max_args = max(max_args, len(arguments))
        if not backend.stateful:
            parts.append(backend.source(name, kernel))
            calls.append(f"case {k}: {{ {gather} int err = {name}(args); "
                         f"if (err) return ko_kernel_failed({k}, err); break; }}")
            tasked = backend.task_source(f"{name}_task", kernel) if tasks else None
            if tasked is not None:
                parts.append(tasked[0])
                unit_calls += [UnitCall(Unit(k, phase, trips, splittable=True, native=True), gather,
                                        f"{name}_task(args, {phase}, ko_begin, ko_end)")
                               for phase, trips in enumerate(tasked[1])]  # fmt: skip
            else:
                unit_calls.append(UnitCall(Unit(k, 0, 1, splittable=False, native=True), gather, f"{name}(args)"))
        else:
            onednn = True
            parts.append(backend.source(name, kernel))
            creates += [gather, f"p->state[{k}] = {name}_create(p->engine, p->stream, args);",
                        f"if (!p->state[{k}]) goto fail;"]  # fmt: skip
            destroys.append(f"if (p->state[{k}]) {name}_destroy(p->state[{k}]);")
            calls.append(f"case {k}: {gather} if ({name}_run(p->state[{k}], p->stream, args)) "
                         f"{{ snprintf(ko_error, sizeof ko_error, \"kernel {k}: oneDNN execution failed\"); "
                         f"return {k + 1}; }} break;")  # fmt: skip
            unit_calls.append(UnitCall(Unit(k, 0, 1, splittable=False, native=True), gather,
                                       f"{name}_run(p->state[{k}], p->vstream[ko_veu], args)", library=True))
    count = max(len(kernels), 1)
    engine = "dnnl_engine_t engine; dnnl_stream_t stream;" if onednn else "void *engine; void *stream;"
    # one oneDNN stream per vEU: library kernels run single-threaded rTasks side by side
    engine += " dnnl_stream_t vstream[KO_MAX_VEUS];" if onednn and tasks else ""
    w = CWriter()
    if tasks:
        w.line(f"#define KO_MAX_VEUS {MAX_VEUS}")
    w.line(f"typedef struct {{ {engine} void *state[{count}]; void *scratch[{max(len(scratch), 1)}]; }} {prefix}_plan;")
    with w.function(f"void {prefix}_destroy(void *plan)", returns=None):
        w.line(f"{prefix}_plan *p = ({prefix}_plan *)plan;", "if (!p) return;", *destroys)
        if scratch:
            w.line(f"for (int i = 0; i < {len(scratch)}; i++) free(p->scratch[i]);")
        if onednn and tasks:
            w.line("for (int v = 0; v < KO_MAX_VEUS; v++) if (p->vstream[v]) dnnl_stream_destroy(p->vstream[v]);")
        if onednn:
            w.line("if (p->stream) dnnl_stream_destroy(p->stream);", "if (p->engine) dnnl_engine_destroy(p->engine);")
        w.line("free(p);")
    with w.function(f"void *{prefix}_create(void **buffers)", returns=None):
        w.line(f"{prefix}_plan *p = ({prefix}_plan *)calloc(1, sizeof({prefix}_plan));", f"void *args[{max_args}];",
               "(void)args; (void)buffers;",
               'if (!p) { snprintf(ko_error, sizeof ko_error, "out of memory"); return NULL; }')  # fmt: skip
        if scratch:
            w.line(f"static const size_t scratch_bytes[] = {{{', '.join(map(str, scratch))}}};")
            with w.block(f"for (int i = 0; i < {len(scratch)}; i++)"):
                w.line("p->scratch[i] = aligned_alloc(64, (scratch_bytes[i] + 63) / 64 * 64);",
                       'if (!p->scratch[i]) { snprintf(ko_error, sizeof ko_error, "out of memory for scratch"); '
                       "goto fail; }")  # fmt: skip
        if onednn:
            w.line("if (dnnl_engine_create(&p->engine, dnnl_cpu, 0) != dnnl_success ||")
            with w.indented():
                w.line("dnnl_stream_create(&p->stream, p->engine, dnnl_stream_default_flags) != dnnl_success) {")
                w.line('snprintf(ko_error, sizeof ko_error, "cannot create a oneDNN CPU engine"); goto fail; }')
        if onednn and tasks:
            w.line("for (int v = 0; v < KO_MAX_VEUS; v++)")
            with w.indented():
                w.line("if (dnnl_stream_create(&p->vstream[v], p->engine, dnnl_stream_default_flags) != "
                       "dnnl_success) {")
                with w.indented():
                    w.line('snprintf(ko_error, sizeof ko_error, "cannot create a oneDNN stream"); goto fail; }')
        w.line(*creates, "return p;")
        if creates or onednn or scratch:
            w.verbatim("fail:")
            w.line(f"{prefix}_destroy(p);", "return NULL;")
    with w.function(f"int {prefix}_run(void *plan, void **buffers, int first, int last)"):
        w.line(f"{prefix}_plan *p = ({prefix}_plan *)plan;", f"void *args[{max_args}];", "(void)p;", "ko_error[0] = 0;")
        with w.block("for (int k = first; k < last; k++)"), w.flat_block("switch (k)"):
            w.line(*calls, "default: return k + 1;")
    w.line(f"const char *{prefix}_error(void) {{ return ko_error; }}")
    parts += [*w.lines, render_region_runner(prefix, unit_calls, max_args) if tasks else "", ""]
    units = tuple(call.unit for call in unit_calls) if tasks else ()
    return NativePlan(prefix, "\n".join(line for line in parts if line != ""), slots, tuple(chosen), onednn, units,
                      tasks)


def _backend(kernel: CandidateKernel) -> Backend:
    backend, reason = choose_backend(kernel)
    if backend is None:
        raise ValueError(f"no backend can run {kernel.describe()}: {reason}")
    return backend
