"""Every place a plan is read from refuses (or rebuilds) a plan made for something else: another model's plan in
a specialisation cache slot, in a saved family, a plan moved between shape sets of one model, a GPU plan of
another model — each with the right outputs afterwards, against onnxruntime. The two models are the same
network with other weights: same shapes, same kernels, only the origin tells them apart."""

from __future__ import annotations

import json
import logging
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

import kernorch
from kernorch.devtools.mutate import here
from kernorch.options import Options
from kernorch.runtime.artifact import MANIFEST_HASH_KEY, ArtifactError, manifest_digest, manifest_hash
from kernorch.shapes import DynamicModel
from kernorch.shapes.dynamic import CACHE_DIR, SLOT_MAC_FILE, SLOT_MAC_PURPOSE, _slot_place
from kernorch.shapes.dynamic_test import FAST, RNG, assert_matches, cnn_with_symbolic_batch
from kernorch.signing import sign

SHAPES = [{"x": (2, 3, 8, 8)}]


def _slots(cache: Path) -> list[Path]:
    return sorted(p.parent for p in (cache / CACHE_DIR).glob("*/*/plan.json"))


def _feeds(batch: int = 2) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((batch, 3, 8, 8)).astype(np.float32)}


def _forge_mac(slot: Path) -> None:
    """What only this user's kernorch can do (it holds the key): vouch for whatever is in the slot now."""
    (slot / SLOT_MAC_FILE).write_text(sign(SLOT_MAC_PURPOSE, _slot_place(slot), manifest_hash(slot).encode()))


@pytest.mark.parametrize("forged", [False, True], ids=["copied", "copied-and-signed"])
def test_another_models_plan_in_a_cache_slot_is_rebuilt(tmp_path: Path, forged: bool,
                                                        caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    mine, theirs = cnn_with_symbolic_batch(), cnn_with_symbolic_batch()  # other weights, same shapes
    kernorch.compile(mine, cache_dir=tmp_path, shapes=SHAPES, **FAST)
    (my_slot,) = _slots(tmp_path)
    kernorch.compile(theirs, cache_dir=tmp_path, shapes=SHAPES, **FAST)
    (their_slot,) = [s for s in _slots(tmp_path) if s != my_slot]
    shutil.rmtree(my_slot)
    shutil.copytree(their_slot, my_slot)  # valid in itself, MAC and all: the planted plan
    if forged:
        _forge_mac(my_slot)  # even a valid MAC for this slot does not make it this model's plan
    with caplog.at_level(logging.WARNING, logger="kernorch.shapes"):
        again = kernorch.compile(mine, cache_dir=tmp_path, shapes=SHAPES, **FAST)
    assert isinstance(again, DynamicModel) and again.specialised_here == 1  # rebuilt, not served
    reason = "planned for another model" if forged else "no valid MAC"
    assert any("refused" in r.message and reason in r.message for r in caplog.records), caplog.text
    assert_matches(mine, again, _feeds())
    third = kernorch.compile(mine, cache_dir=tmp_path, shapes=SHAPES, **FAST)  # the slot now holds my plan
    assert isinstance(third, DynamicModel) and third.specialised_here == 0
    assert_matches(mine, third, _feeds())


def test_a_plan_moved_between_shape_slots_of_one_model_is_rebuilt(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    model = cnn_with_symbolic_batch()
    kernorch.compile(model, cache_dir=tmp_path, shapes=[{"x": (2, 3, 8, 8)}, {"x": (4, 3, 8, 8)}], **FAST)
    first, second = _slots(tmp_path)
    swap = first.with_name("swap")
    first.rename(swap)
    second.rename(first)
    swap.rename(second)
    for slot in (first, second):
        _forge_mac(slot)
    with caplog.at_level(logging.WARNING, logger="kernorch.shapes"):
        again = kernorch.compile(model, cache_dir=tmp_path, shapes=[{"x": (2, 3, 8, 8)}, {"x": (4, 3, 8, 8)}],
                                 **FAST)  # fmt: skip
    assert isinstance(again, DynamicModel) and again.specialised_here == 2
    assert sum("planned for the input shapes" in r.message for r in caplog.records) == 2, caplog.text
    for batch in (2, 4):
        assert_matches(model, again, _feeds(batch))


def test_a_cache_others_can_write_is_not_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = cnn_with_symbolic_batch()
    kernorch.compile(model, cache_dir=tmp_path, shapes=SHAPES, **FAST)
    assert stat.S_IMODE((tmp_path / CACHE_DIR).stat().st_mode) == 0o700
    (tmp_path / CACHE_DIR).chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="kernorch.shapes"):
        again = kernorch.compile(model, cache_dir=tmp_path, shapes=SHAPES, **FAST)
    assert isinstance(again, DynamicModel) and again.specialised_here == 1
    assert "can be changed by other users" in caplog.text
    assert_matches(model, again, _feeds())


def _family_pair(tmp_path: Path) -> tuple[object, Path, Path]:
    mine, theirs = cnn_with_symbolic_batch(), cnn_with_symbolic_batch()
    saved = []
    for name, model in (("mine", mine), ("theirs", theirs)):
        compiled = kernorch.compile(model, cache_dir=tmp_path / "cache", buckets={"batch": (1, 4)}, **FAST)
        assert isinstance(compiled, DynamicModel)
        saved.append(compiled.save(tmp_path / name))
    return mine, saved[0], saved[1]


def _rewrite_family(family_dir: Path, folder: str) -> None:
    """What anyone can do to a family.json (its hash is a checksum, not a MAC): list the planted plan's hash."""
    family = json.loads((family_dir / "family.json").read_text())
    for entry in family["specialisations"]:
        if entry["dir"] == folder:
            entry["manifest_sha256"] = manifest_hash(family_dir / folder)
    family[MANIFEST_HASH_KEY] = manifest_digest(family)
    (family_dir / "family.json").write_text(json.dumps(family))


@pytest.mark.parametrize("listed", [False, True], ids=["planted", "planted-and-listed"])
def test_another_models_plan_in_a_saved_family_is_refused(tmp_path: Path, listed: bool) -> None:
    mine, my_family, their_family = _family_pair(tmp_path)
    shutil.rmtree(my_family / "shape-0")
    shutil.copytree(their_family / "shape-0", my_family / "shape-0")
    if listed:
        _rewrite_family(my_family, "shape-0")
    message = "planned for another model" if listed else "is not the plan family.json lists there"
    with pytest.raises(ArtifactError, match=message):
        kernorch.load(my_family, cache_dir=tmp_path / "cache")
    # a whole family loaded for a model must be that model's; its own model's family loads and runs right
    model_bytes = mine.SerializeToString()  # type: ignore[attr-defined]
    with pytest.raises(ArtifactError, match="holds the plans of another model"):
        kernorch.load(their_family, cache_dir=tmp_path / "cache", model=model_bytes)
    (tmp_path / "mine").rename(tmp_path / "planted")
    options = Options(**FAST, buckets=(("batch", (1, 4)),), cache_dir=tmp_path / "cache")
    DynamicModel(model_bytes, options).prepare().save(tmp_path / "mine")
    restored = kernorch.load(tmp_path / "mine", cache_dir=tmp_path / "cache", model=model_bytes)
    for batch in (1, 4):
        assert_matches(mine, restored, _feeds(batch))  # type: ignore[arg-type]


def test_plans_swapped_between_shape_sets_of_a_family_are_refused(tmp_path: Path) -> None:
    mine, my_family, _ = _family_pair(tmp_path)
    (my_family / "shape-0").rename(my_family / "swap")
    (my_family / "shape-1").rename(my_family / "shape-0")
    (my_family / "swap").rename(my_family / "shape-1")
    _rewrite_family(my_family, "shape-0")
    _rewrite_family(my_family, "shape-1")
    with pytest.raises(ArtifactError, match="planned for the input shapes"):
        kernorch.load(my_family, cache_dir=tmp_path / "cache")
    (my_family / "shape-0").rename(my_family / "swap")
    (my_family / "shape-1").rename(my_family / "shape-0")
    (my_family / "swap").rename(my_family / "shape-1")
    _rewrite_family(my_family, "shape-0")
    _rewrite_family(my_family, "shape-1")
    loaded = kernorch.load(my_family, cache_dir=tmp_path / "cache")
    for batch in (1, 4):
        assert_matches(mine, loaded, _feeds(batch))  # type: ignore[arg-type]


def test_a_plan_loaded_for_a_model_must_come_from_it_gpu_and_cpu(tmp_path: Path) -> None:
    """`kernorch.load(dir, model=...)`: a CPU or GPU plan of another model is refused; its own loads and runs."""
    mine, theirs = cnn_with_symbolic_batch(), cnn_with_symbolic_batch()
    shapes = {"x": (2, 3, 8, 8)}
    for device in ("cpu-nominal", "h100"):
        options = {**FAST, "device": device}
        theirs_plan = kernorch.compile(theirs, shapes, **options).save(tmp_path / f"theirs-{device}")
        mine_plan = kernorch.compile(mine, shapes, **options).save(tmp_path / f"mine-{device}")
        with pytest.raises(ArtifactError, match="planned for another model"):
            kernorch.load(theirs_plan, model=mine.SerializeToString())
        loaded = kernorch.load(mine_plan, model=mine.SerializeToString())
        if device == "h100":
            loaded.interpret = True  # type: ignore[union-attr]
        assert_matches(mine, loaded, _feeds())


def test_a_gpu_plan_of_another_model_planted_in_a_family_is_refused(tmp_path: Path) -> None:
    mine, my_family, _ = _family_pair(tmp_path)
    theirs = cnn_with_symbolic_batch()
    gpu_plan = kernorch.compile(theirs, {"x": (1, 3, 8, 8)}, **{**FAST, "device": "h100"}).save(tmp_path / "gpu")
    shutil.rmtree(my_family / "shape-0")
    shutil.copytree(gpu_plan, my_family / "shape-0")
    _rewrite_family(my_family, "shape-0")
    with pytest.raises(ArtifactError, match="planned for another model"):
        kernorch.load(my_family, cache_dir=tmp_path / "cache")


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("a cached plan is served without its MAC",
         "            if not _signed_slot(cached):",
         "            if False:",
         file="kernorch/shapes/dynamic.py"),
    here("a plan's origin is not checked against what it is loaded for",
         "    if expected is not None:  # before a byte",
         "    if False:  # before a byte",
         file="kernorch/runtime/artifact.py"),
    here("family.json's manifest hashes are not checked",
         'if manifest_hash(source / folder) != entry["manifest_sha256"]:',
         "if False:",
         file="kernorch/shapes/family.py"),
    here("a cache slot's MAC does not cover its place",
         'return f"{slot.parent.name}/{slot.name}".encode()',
         'return b""',
         file="kernorch/shapes/dynamic.py"),
]  # fmt: skip
