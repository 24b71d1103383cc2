"""Memory levels: which level a working set is priced at, and the measured levels' cache."""

from __future__ import annotations

import json
from pathlib import Path

from kernorch.cost.bandwidth import MemoryLevel, MemoryLevels, _cache_bytes, measure_levels

LEVELS = MemoryLevels((MemoryLevel("L2", 2 << 20, 200e9), MemoryLevel("L3", 32 << 20, 100e9),
                       MemoryLevel("DRAM", 1 << 62, 20e9)), 1e-6)  # fmt: skip


def test_a_working_set_is_priced_at_the_fastest_level_it_fits_in() -> None:
    assert LEVELS.level_for(1 << 20).name == "L2"
    assert LEVELS.level_for(2 << 20).name == "L2"
    assert LEVELS.level_for((2 << 20) + 1).name == "L3"
    assert LEVELS.level_for(1 << 30).name == "DRAM"
    assert LEVELS.roofline_seconds(100e6) == 100e6 / 20e9 + 1e-6


def test_measured_levels_are_cached_and_a_corrupt_cache_is_measured_again(tmp_path: Path) -> None:
    levels = measure_levels(tmp_path, threads=1)
    assert [lv.name for lv in levels.levels] == ["L2", "L3", "DRAM"]
    assert all(lv.bandwidth > 1e9 for lv in levels.levels) and levels.dispatch > 0
    capacities = [lv.capacity for lv in levels.levels]
    assert capacities == sorted(capacities)
    assert capacities[1] == _cache_bytes(3, 32 << 20) // 2  # the largest working set L3 was measured on
    path = tmp_path / "memory_levels.json"
    cached = json.loads(path.read_text())
    cached["levels"][0]["bandwidth"] = 123.0  # a value no measurement gives: proves the cache is what is read
    path.write_text(json.dumps(cached))
    assert measure_levels(tmp_path, threads=1).levels[0].bandwidth == 123.0
    path.write_text("{not json")
    assert measure_levels(tmp_path, threads=1).levels[0].bandwidth > 1e9
