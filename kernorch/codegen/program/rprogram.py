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
    cases: list[str] = []
    for u, unit_call in enumerate(units):
        if not unit_call.unit.native:
            continue
        k = unit_call.unit.kernel
        failure = (f'{{ snprintf(ko_error, sizeof ko_error, "kernel {k}: oneDNN execution failed"); '
                   f"return {k + 1}; }}") if unit_call.library else f"return {k + 1};"  # fmt: skip
        # a range outside the unit's iterations is refused before any kernel code runs (the kernels assume it)
        bounds = f"if (ko_begin < 0 || ko_begin >= ko_end || ko_end > {unit_call.unit.iterations}) return -1;"
        cases.append(f"    case {u}: {bounds} {unit_call.gather} if ({unit_call.call}) {failure} return 0;")
    return f"""
#include <time.h>
static int64_t {prefix}_now_ns(void) {{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}}
static int {prefix}_unit({prefix}_plan *p, void **buffers, int64_t unit, int64_t ko_begin, int64_t ko_end,
                         int ko_veu) {{
    void *args[{max_args}];
    (void)p; (void)ko_begin; (void)ko_end; (void)ko_veu; (void)args;
    switch (unit) {{
{chr(10).join(cases)}
    default: return -1;
    }}
}}
static int {prefix}_task({prefix}_plan *p, void **buffers, const int64_t *e, int veu, int64_t *trace) {{
    const int64_t start = trace ? {prefix}_now_ns() : 0;
    const int failed = {prefix}_unit(p, buffers, e[1], e[2], e[3], veu);
    if (trace) {{ trace[2 * e[4]] = start; trace[2 * e[4] + 1] = {prefix}_now_ns(); }}
    return failed;
}}
int {prefix}_region(void *plan, void **buffers, const int64_t *entries, const int64_t *offsets, int veus,
                    int64_t *trace) {{
    {prefix}_plan *p = ({prefix}_plan *)plan;
    if (veus < 1 || veus > KO_MAX_VEUS) return -1;
    int64_t done[KO_MAX_VEUS * 8] __attribute__((aligned(64)));  /* vEU v's finished rTasks at done[8 * v] */
    for (int v = 0; v < veus; v++) done[8 * v] = 0;
    int failed = 0;
    int others = 0;  /* rTasks or waits on vEUs other than 0 */
    for (int v = 1; v < veus; v++) others |= offsets[v + 1] > offsets[v];
    if (!others) {{  /* all on vEU 0: run here, without forking a team that would only wait */
        const int threads = omp_get_max_threads();
        omp_set_num_threads(1);  /* a library or opaque kernel's own parallel loops stay single-threaded */
        for (int64_t i = offsets[0]; i < offsets[1]; i++)
            if (entries[{ENTRY_FIELDS} * i] == {TASK}
                && (failed = {prefix}_task(p, buffers, entries + {ENTRY_FIELDS} * i, 0, trace))) break;
        omp_set_num_threads(threads);
        return failed;
    }}
    #pragma omp parallel num_threads(veus)
    {{
        const int v = omp_get_thread_num();
        if (omp_get_num_threads() == veus) {{
            int64_t finished = 0;
            for (int64_t i = offsets[v]; i < offsets[v + 1]; i++) {{
                const int64_t *e = entries + {ENTRY_FIELDS} * i;
                if (__atomic_load_n(&failed, __ATOMIC_RELAXED)) break;
                if (e[0] == {WAIT}) {{
                    while (__atomic_load_n(&done[8 * e[1]], __ATOMIC_ACQUIRE) < e[2]
                           && !__atomic_load_n(&failed, __ATOMIC_RELAXED)) {{
#if defined(__x86_64__) || defined(__i386__)
                        __builtin_ia32_pause();
#endif
                    }}
                    continue;
                }}
                const int rc = {prefix}_task(p, buffers, e, v, trace);
                if (rc) {{ int expected = 0; __atomic_compare_exchange_n(&failed, &expected, rc, 0,
                                                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED); break; }}
                __atomic_store_n(&done[8 * v], ++finished, __ATOMIC_RELEASE);
            }}
        }} else if (v == 0) {{  /* fewer threads than vEUs: every rTask here, in the global order */
            int64_t cursor[KO_MAX_VEUS];
            for (int j = 0; j < veus; j++) cursor[j] = offsets[j];
            for (;;) {{
                int best = -1;
                for (int j = 0; j < veus; j++) {{
                    while (cursor[j] < offsets[j + 1] && entries[{ENTRY_FIELDS} * cursor[j]] == {WAIT}) cursor[j]++;
                    if (cursor[j] < offsets[j + 1] && (best < 0 || entries[{ENTRY_FIELDS} * cursor[j] + 4]
                                                       < entries[{ENTRY_FIELDS} * cursor[best] + 4])) best = j;
                }}
                if (best < 0) break;
                const int rc = {prefix}_task(p, buffers, entries + {ENTRY_FIELDS} * cursor[best]++, 0, trace);
                if (rc) {{ failed = rc; break; }}
            }}
        }}
    }}
    return failed;
}}
int {prefix}_program(void *plan, void **buffers, const int64_t *segments, int64_t count, const int64_t *entries,
                     const int64_t *offsets, int veus, int64_t *trace) {{
    for (int64_t s = 0; s < count; s++) {{
        const int64_t *g = segments + {SEGMENT_FIELDS} * s;
        int failed;
        if (g[0] == {CALL}) {{  /* a kernel with its own parallel region, outside any rProgram region */
            const int64_t start = trace ? {prefix}_now_ns() : 0;
            failed = {prefix}_run(plan, buffers, (int)g[1], (int)g[1] + 1);
            if (trace) {{ trace[2 * g[2]] = start; trace[2 * g[2] + 1] = {prefix}_now_ns(); }}
        }} else {{
            failed = {prefix}_region(plan, buffers, entries, offsets + g[1] * (veus + 1), veus, trace);
        }}
        if (failed) return failed;
    }}
    return 0;
}}
"""
