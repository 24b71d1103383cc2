"""C for running one region of an rProgram (schedule/program.py): a persistent parallel region whose threads
(vEUs) each follow a list of entries.

`<prefix>_region(state, buffers, entries, offsets, veus, trace)`:
- `entries` is int64 [n, 5]: an rTask (0, unit, begin, end, order) or a barrier rTask (1, vEU j, count, 0, 0);
  vEU v runs entries offsets[v] .. offsets[v+1]-1. The lists come from the scheduler as data, so one compiled
  plan runs any rProgram (the calibration programs and the chosen one).
- After each rTask a vEU publishes how many it has finished in its own cache line (release store); a barrier
  rTask spins (acquire load, `pause`) until vEU j has published `count` (Rammer's step array).
- `trace`, when not NULL, receives each rTask's start and end (CLOCK_MONOTONIC ns) at 2*order and 2*order+1.
- A region with entries for vEU 0 only runs on the calling thread: no team is forked.
- If the runtime gives the region fewer threads than vEUs (OMP_DYNAMIC, a thread limit), thread 0 runs every
  rTask alone in the global order, which every dependency respects.
- Returns 0, k+1 when kernel k failed (the others stop at their next entry, and waits give up), or -1 when
  `veus` is out of range.

`<prefix>_program(state, buffers, segments, count, entries, offsets, veus, trace)` runs `count` segments with
one foreign call: int64 [count, 3] rows (0, r, 0) for region r, whose vEU offsets are offsets[r*(veus+1) ...],
or (1, k, order) for kernel k run device-wide outside any region (traced at `order`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernorch.codegen.c import CWriter
from kernorch.schedule.program import Unit

MAX_VEUS = 16
ENTRY_FIELDS = 5
TASK, WAIT = 0, 1
SEGMENT_FIELDS = 3
REGION, CALL = 0, 1


@dataclass(frozen=True)
class UnitCall:
    unit: Unit
    gather: str  # C statements filling args[] from the buffer table (empty: only Python runs it)
    call: str  # C expression running the unit's range ko_begin..ko_end on vEU ko_veu; nonzero on failure
    library: bool = False  # a oneDNN call (its failure message goes into ko_error)


def render_region_runner(prefix: str, units: list[UnitCall], max_args: int) -> str:
    w = CWriter()
    w.line("#include <time.h>")
    with w.function(f"static int64_t {prefix}_now_ns(void)", returns="(int64_t)t.tv_sec * 1000000000LL + t.tv_nsec"):
        w.line("struct timespec t;", "clock_gettime(CLOCK_MONOTONIC, &t);")
    _unit(w, prefix, units, max_args)
    with w.function(f"static int {prefix}_task({prefix}_plan *p, void **buffers, const int64_t *e, int veu, "
                    "int64_t *trace)", returns="failed"):  # fmt: skip
        w.line(f"const int64_t start = trace ? {prefix}_now_ns() : 0;",
               f"const int failed = {prefix}_unit(p, buffers, e[1], e[2], e[3], veu);",
               f"if (trace) {{ trace[2 * e[4]] = start; trace[2 * e[4] + 1] = {prefix}_now_ns(); }}")
    _region(w, prefix)
    _program(w, prefix)
    return "\n" + w.text("\n")


def _unit(w: CWriter, prefix: str, units: list[UnitCall], max_args: int) -> None:
    """`<prefix>_unit`: a case per native unit, running its range ko_begin..ko_end on vEU ko_veu."""
    with w.function(f"static int {prefix}_unit({prefix}_plan *p, void **buffers, int64_t unit, int64_t ko_begin, "
                    "int64_t ko_end,\n                         int ko_veu)", returns=None):  # fmt: skip
        w.line(f"void *args[{max_args}];", "(void)p; (void)ko_begin; (void)ko_end; (void)ko_veu; (void)args;")
        with w.flat_block("switch (unit)"):
            for u, unit_call in enumerate(units):
                if not unit_call.unit.native:
                    continue
                k = unit_call.unit.kernel
                failure = (f'{{ snprintf(ko_error, sizeof ko_error, "kernel {k}: oneDNN execution failed"); '
                           f"return {k + 1}; }}") if unit_call.library else f"return {k + 1};"  # fmt: skip
                # a range outside the unit's iterations is refused before any kernel code runs (the kernels assume it)
                bounds = f"if (ko_begin < 0 || ko_begin >= ko_end || ko_end > {unit_call.unit.iterations}) return -1;"
                w.line(f"case {u}: {bounds} {unit_call.gather} if ({unit_call.call}) {failure} return 0;")
            w.line("default: return -1;")


def _region(w: CWriter, prefix: str) -> None:
    """`<prefix>_region`: one region's vEUs, each following its list of entries."""
    task = f"entries[{ENTRY_FIELDS} * i] == {TASK}"
    with w.function(f"int {prefix}_region(void *plan, void **buffers, const int64_t *entries, const int64_t *offsets, "
                    "int veus,\n                    int64_t *trace)", returns="failed"):  # fmt: skip
        w.line(f"{prefix}_plan *p = ({prefix}_plan *)plan;", "if (veus < 1 || veus > KO_MAX_VEUS) return -1;",
               "int64_t done[KO_MAX_VEUS * 8] __attribute__((aligned(64)));"
               "  /* vEU v's finished rTasks at done[8 * v] */",
               "for (int v = 0; v < veus; v++) done[8 * v] = 0;", "int failed = 0;",
               "int others = 0;  /* rTasks or waits on vEUs other than 0 */",
               "for (int v = 1; v < veus; v++) others |= offsets[v + 1] > offsets[v];")  # fmt: skip
        with w.block("if (!others)", comment="all on vEU 0: run here, without forking a team that would only wait"):
            w.line("const int threads = omp_get_max_threads();",
                   "omp_set_num_threads(1);"
                   "  /* a library or opaque kernel's own parallel loops stay single-threaded */")
            w.nest("for (int64_t i = offsets[0]; i < offsets[1]; i++)",
                   f"if ({task}\n"
                   f"    && (failed = {prefix}_task(p, buffers, entries + {ENTRY_FIELDS} * i, 0, trace))) break;")
            w.line("omp_set_num_threads(threads);", "return failed;")
        w.line("#pragma omp parallel num_threads(veus)")
        with w.block(""):
            w.line("const int v = omp_get_thread_num();")
            with w.block("if (omp_get_num_threads() == veus)"):
                _entries_of_one_veu(w, prefix)
            with w.orelse("else if (v == 0)", comment="fewer threads than vEUs: every rTask here, in the global order"):
                _entries_in_global_order(w, prefix)


def _entries_of_one_veu(w: CWriter, prefix: str) -> None:
    """vEU v's entries: its rTasks, each published when done, and its waits for other vEUs' counts."""
    w.line("int64_t finished = 0;")
    with w.block("for (int64_t i = offsets[v]; i < offsets[v + 1]; i++)"):
        w.line(f"const int64_t *e = entries + {ENTRY_FIELDS} * i;",
               "if (__atomic_load_n(&failed, __ATOMIC_RELAXED)) break;")
        with w.block(f"if (e[0] == {WAIT})"):
            with w.block("while (__atomic_load_n(&done[8 * e[1]], __ATOMIC_ACQUIRE) < e[2]\n"
                         "       && !__atomic_load_n(&failed, __ATOMIC_RELAXED))"):  # fmt: skip
                w.verbatim("#if defined(__x86_64__) || defined(__i386__)")
                w.line("__builtin_ia32_pause();")
                w.verbatim("#endif")
            w.line("continue;")
        w.line(f"const int rc = {prefix}_task(p, buffers, e, v, trace);",
               "if (rc) { int expected = 0; __atomic_compare_exchange_n(&failed, &expected, rc, 0,\n"
               "                                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED); break; }",
               "__atomic_store_n(&done[8 * v], ++finished, __ATOMIC_RELEASE);")  # fmt: skip


def _entries_in_global_order(w: CWriter, prefix: str) -> None:
    """Every vEU's rTasks on this one thread, the one with the earliest order first (waits skipped: the global
    order respects them)."""
    order = f"entries[{ENTRY_FIELDS} * cursor[j] + 4]\n{' ' * 35}< entries[{ENTRY_FIELDS} * cursor[best] + 4]"
    w.line("int64_t cursor[KO_MAX_VEUS];", "for (int j = 0; j < veus; j++) cursor[j] = offsets[j];")
    with w.block("for (;;)"):
        w.line("int best = -1;")
        with w.block("for (int j = 0; j < veus; j++)"):
            w.line(f"while (cursor[j] < offsets[j + 1] && entries[{ENTRY_FIELDS} * cursor[j]] == {WAIT}) cursor[j]++;",
                   f"if (cursor[j] < offsets[j + 1] && (best < 0 || {order})) best = j;")
        w.line("if (best < 0) break;",
               f"const int rc = {prefix}_task(p, buffers, entries + {ENTRY_FIELDS} * cursor[best]++, 0, trace);",
               "if (rc) { failed = rc; break; }")


def _program(w: CWriter, prefix: str) -> None:
    """`<prefix>_program`: the segments in turn, a region or a kernel run device-wide."""
    with w.function(f"int {prefix}_program(void *plan, void **buffers, const int64_t *segments, int64_t count, "
                    "const int64_t *entries,\n                     const int64_t *offsets, int veus, int64_t *trace)"):
        with w.block("for (int64_t s = 0; s < count; s++)"):
            w.line(f"const int64_t *g = segments + {SEGMENT_FIELDS} * s;", "int failed;")
            with w.block(f"if (g[0] == {CALL})", comment="a kernel with its own parallel region, outside any rProgram "
                         "region"):  # fmt: skip
                w.line(f"const int64_t start = trace ? {prefix}_now_ns() : 0;",
                       f"failed = {prefix}_run(plan, buffers, (int)g[1], (int)g[1] + 1);",
                       f"if (trace) {{ trace[2 * g[2]] = start; trace[2 * g[2] + 1] = {prefix}_now_ns(); }}")
            with w.orelse():
                w.line(f"failed = {prefix}_region(plan, buffers, entries, offsets + g[1] * (veus + 1), veus, trace);")
            w.line("if (failed) return failed;")
