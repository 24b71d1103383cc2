"""The runtime chosen per region, not per plan (issue 43, item 4): a wavefront rProgram in which the regions that
ran slower than their kernels run one after another, each on all threads, are replaced by exactly that.

Neither runtime wins everywhere: two kernels of a branch side by side on one thread each beat each kernel split
over both threads where the kernels are small (fork/join and barriers cost more than half a kernel), and lose
where a kernel is large enough to keep both threads busy on its own (the single-thread piece then takes twice
as long and its neighbour's share of the caches). A plan has both kinds of stretch, so the choice is made for
each region of the wavefront rProgram, from what that region and its kernels measured.

Any segment boundary of an rProgram is a clean cut: a segment only depends on units of earlier segments or of
itself. So the units of one region can run kernel by kernel instead, in plan order (a topological order), without
touching the segments around it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kernorch.schedule.program import Call, Entry, Region, RProgram, RTask, Segment, Unit, Wait


def kernel_by_kernel(units: Sequence[Unit], veus: int, subset: Iterable[int] | None = None) -> list[Segment]:
    """`subset` of the units (all by default) in plan order, each on all vEUs: a splittable unit cut into one
    rTask per vEU after a barrier on every vEU's previous rTask, any other unit as a call of its own. rTasks are
    numbered from 0 in that order."""
    chosen = sorted(subset) if subset is not None else range(len(units))
    segments: list[Segment] = []
    programs: list[list[Entry]] = [[] for _ in range(veus)]
    order = 0
    for u in chosen:
        unit = units[u]
        if not unit.splittable:
            if any(programs):
                segments.append(Region(tuple(tuple(p) for p in programs)))
                programs = [[] for _ in range(veus)]
            segments.append(Call(RTask(u, 0, unit.iterations, order)))
            order += 1
            continue
        counts = [sum(isinstance(e, RTask) for e in p) for p in programs]
        parts = min(veus, unit.iterations)
        for v in range(parts):
            programs[v] += [Wait(j, counts[j]) for j in range(veus) if j != v and counts[j]]
            begin, end = unit.iterations * v // parts, unit.iterations * (v + 1) // parts
            programs[v].append(RTask(u, begin, end, order))
            order += 1
    if any(programs):
        segments.append(Region(tuple(tuple(p) for p in programs)))
    return segments


def slower_regions(program: RProgram, region_seconds: Sequence[float], unit_seconds: Sequence[float]) -> set[int]:
    """Indices of the regions of `program` that took longer (`region_seconds[s]`: segment s as it ran, first rTask
    start to last end) than their units kernel by kernel (`unit_seconds[u]`: unit u on all threads, as the
    kernel-by-kernel rProgram ran it)."""
    slower: set[int] = set()
    for s, segment in enumerate(program.segments):
        if isinstance(segment, Region):
            alone = sum(unit_seconds[u] for u in region_units(segment))
            if alone < region_seconds[s]:
                slower.add(s)
    return slower


def region_units(region: Region) -> set[int]:
    return {task.unit for _, task in region.tasks()}


def per_region(program: RProgram, replaced: set[int]) -> RProgram:
    """`program` with the regions at the indices in `replaced` run kernel by kernel (consecutive ones as one
    stretch), every rTask renumbered in the new program order."""
    segments: list[Segment] = []
    stretch: set[int] = set()
    for s, segment in enumerate(program.segments):
        if s in replaced and isinstance(segment, Region):
            stretch |= region_units(segment)
            continue
        if stretch:
            segments += kernel_by_kernel(program.units, program.veus, stretch)
            stretch = set()
        segments.append(segment)
    if stretch:
        segments += kernel_by_kernel(program.units, program.veus, stretch)
    return RProgram(program.veus, program.units, _renumbered(segments))


def _renumbered(segments: list[Segment]) -> tuple[Segment, ...]:
    """Orders 0, 1, ... segment by segment, each segment's rTasks keeping their relative order (so every vEU
    still runs its rTasks in increasing order, and every Wait still waits for lower-numbered ones)."""
    result: list[Segment] = []
    base = 0
    for segment in segments:
        if isinstance(segment, Call):
            result.append(Call(_numbered(segment.task, base)))
            base += 1
            continue
        rank = {task.order: i for i, task in enumerate(sorted((t for _, t in segment.tasks()), key=_order))}
        result.append(Region(tuple(tuple(e if isinstance(e, Wait) else _numbered(e, base + rank[e.order])
                                         for e in entries) for entries in segment.programs)))  # fmt: skip
        base += len(rank)
    return tuple(result)


def _order(task: RTask) -> int:
    return task.order


def _numbered(task: RTask, order: int) -> RTask:
    return RTask(task.unit, task.begin, task.end, order)
