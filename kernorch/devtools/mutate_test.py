"""The mutant list follows the code: a refactor that moves or rewrites a mutated line must update its mutant,
or `make mutate` would report it stale instead of checking the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernorch.devtools.mutate import MUTANTS, ROOT, Mutant


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_every_mutant_changes_exactly_one_place_of_its_file(mutant: Mutant) -> None:
    source = (ROOT / mutant.file).read_text()
    assert source.count(mutant.original) == 1, f"{mutant.file}: the text to mutate moved or changed"
    assert mutant.mutated != mutant.original
    for test in mutant.tests:
        assert Path(ROOT / test.split("::")[0]).exists(), test
