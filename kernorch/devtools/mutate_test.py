"""The mutant list follows the code: a refactor that moves or rewrites a mutated line must update its mutant,
or `make mutate` would report it stale instead of checking the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernorch.devtools.mutate import ROOT, Mutant, collected


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
