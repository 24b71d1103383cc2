"""Is anything else using the CPU while we measure? Read from the kernel's accounting, not guessed.

Over a window, the machine's busy CPU time (/proc/stat: user, nice, system, irq, softirq and steal — the
hypervisor running someone else counts) minus this process's own CPU time (/proc/self/stat, all threads)
is what other processes used. Divided by the window's length it is the number of cores they kept busy.
On a 2-core machine running 2 OpenMP threads, even half a core used by another process slows parallel
kernels several times over (threads wait at barriers for a descheduled peer).

Clock ticks are 10 ms, so windows shorter than ~0.1 s are too coarse to judge; callers measure in slices.
Where /proc is missing the monitor reports 0 and only the spread between repeats can reveal contention.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

CONTENDED_CORES = 0.25  # other processes using more than this many cores on average: contended
_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_ticks() -> tuple[int, int] | None:
    """(busy ticks, total ticks) of all CPUs since boot, or None without /proc."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def _own_ticks() -> int | None:
    try:
        with open("/proc/self/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may contain spaces
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))


@dataclass
class LoadWindow:
    """`with LoadWindow() as window: ...` then `window.other_cores`."""

    other_cores: float = 0.0
    seconds: float = 0.0
    _start: tuple[float, tuple[int, int] | None, int | None] = (0.0, None, None)

    def __enter__(self) -> LoadWindow:
        self._start = (time.monotonic(), _machine_ticks(), _own_ticks())
        return self

    def __exit__(self, *_: object) -> None:
        started, machine, own = self._start
        self.seconds = time.monotonic() - started
        machine_now, own_now = _machine_ticks(), _own_ticks()
        if machine is None or machine_now is None or own is None or own_now is None or self.seconds <= 0:
            self.other_cores = 0.0
            return
        others = (machine_now[0] - machine[0]) - (own_now - own)
        self.other_cores = max(0.0, others / _TICKS_PER_SECOND / self.seconds)

    @property
    def contended(self) -> bool:
        return self.other_cores > CONTENDED_CORES


def other_cores_busy(seconds: float = 0.2) -> float:
    """Cores other processes keep busy, sampled over `seconds` while this process sleeps."""
    with LoadWindow() as window:
        time.sleep(seconds)
    return window.other_cores


def wait_for_quiet(max_seconds: float, sample_seconds: float = 0.2) -> bool:
    """Sleep until other processes leave the CPU alone (True) or `max_seconds` pass (False)."""
    deadline = time.monotonic() + max_seconds
    while True:
        if other_cores_busy(sample_seconds) <= CONTENDED_CORES:
            return True
        if time.monotonic() >= deadline:
            return False
