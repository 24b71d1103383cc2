"""The mutant list follows the code: a refactor that moves or rewrites a mutated line must update its mutant,
or `make mutate` would report it stale instead of checking the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernorch import machine
from kernorch.devtools.mutate import ROOT, Mutant, collected, run_mutant


@pytest.mark.parametrize("mutant", collected(), ids=lambda m: m.name)
def test_every_mutant_changes_exactly_one_place_of_its_file(mutant: Mutant) -> None:
    source = (ROOT / mutant.file).read_text()
    assert source.count(mutant.original) == 1, f"{mutant.file}: the text to mutate moved or changed"
    assert mutant.mutated != mutant.original
    for test in mutant.tests:
        assert Path(ROOT / test.split("::")[0]).exists(), test


def test_mutants_are_collected_from_the_test_modules_beside_the_code() -> None:
    mutants = collected()
    assert len({m.name for m in mutants}) == len(mutants), "two mutants share a name"
    native = [m for m in mutants if m.file.startswith("kernorch/codegen/native/")]
    assert native and all(m.tests[0].startswith("kernorch/codegen/native/") for m in native)


def test_a_mutant_whose_code_never_runs_here_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """An AVX-512 path's mutant on an AVX2 machine: neither run nor counted as a survivor, its file untouched."""
    mutant = next(m for m in collected() if m.needs == "avx512f")
    monkeypatch.setattr(machine, "isa_flags", lambda: ("avx2", "fma"))
    before = (ROOT / mutant.file).read_text()
    verdict, seconds = run_mutant(mutant, timeout=60.0)
    assert verdict == "not run here (its code runs with avx512f only)" and seconds == 0.0
    assert (ROOT / mutant.file).read_text() == before


def test_flags_a_mutant_needs_are_the_cpus_names() -> None:
    """`needs` is compared with /proc/cpuinfo's flags: a misspelt one would silence its mutant everywhere."""
    assert {m.needs for m in collected()} - {""} <= {"avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "avx512_vnni"}
