"""One compiled model for every shape a model's symbolic dims allow.

kernorch plans static shapes (the orchestration's costs are of concrete kernels), so a model with symbolic dims
(`batch`, `sequence`) becomes a `DynamicModel`: a plan per concrete shape set, each an ordinary `CompiledModel`.

Policy (the `Options` fields):
- `shapes` and `buckets` name the shape sets prepared when the model is compiled (`buckets`: every combination
  of the listed sizes of each symbolic dim);
- a call with a shape set not prepared is answered at once by onnxruntime (`new_shapes="serve"`, the default;
  logged on the `kernorch.shapes` logger), and a shape set called again and again is planned in a background
  thread and runs on its plan once that is ready (shapes/serving.py); `new_shapes="specialise"` plans and
  compiles it on the caller's thread on first use (later calls instant; also where onnxruntime is missing or
  cannot load the model), `new_shapes="refuse"` refuses it;
- `ranges` give one shape-generic plan each (kernorch/shapes/generic.py), made when the model is compiled: a
  call inside a range runs on it at once; one of its shape sets called HOT_IN_RANGE times is specialised in the
  background and kept where it measures faster;
- `pad` names symbolic dims a call may be padded along to the next bucket (kernorch/shapes/padding.py proves
  per primitive that the rows beyond the call's size do not reach its rows; where it cannot, the shape is
  specialised instead, and the log says why);
- `background_tuning` (with cost "profile"): a new shape runs at once on the analytic model's plan while its
  measured plan is tuned in a daemon thread and swapped in when ready.

Every specialisation is cached in memory and on disk (the cache directory's `specialisations/`, keyed by the
model's bytes, the plan-shaping options and the shape set). That cache is untrusted as the compiled-library
cache is: the directory must be private to the user (0700), each entry carries a MAC under the user's key over
its slot and its plan's manifest hash, and the plan must record this model, shape set and options as its origin
(runtime/origin.py); an entry that fails any check is logged, planned again and replaced. Kernels shared between
specialisations are profiled once: the profile database is keyed by kernel, not by model. `DynamicModel.save`
writes them as a family of plans that `load_dynamic` verifies (shapes/family.py).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from kernorch.errors import InputMismatch, KernorchError
from kernorch.frontend import (
    ShapeSet,
    bind,
    describe_shapes,
    input_signature,
    shape_set,
    shapes_for,
    symbols_of,
)
from kernorch.frontend.onnx_import import load_proto
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel
from kernorch.options import SHAPE_POLICY_FIELDS, Options, plan_shaping
from kernorch.pipeline import SILENT, Progress, compile_model
from kernorch.runtime.artifact import (
    ArtifactError,
    manifest_hash,
)
from kernorch.runtime.compiled import CompiledModel, load_model
from kernorch.runtime.executor import KernelFailed, PlanExecutor
from kernorch.runtime.feeds import call_with_arrays
from kernorch.runtime.origin import PlanOrigin
from kernorch.shapes.family import FAMILY_FILE, read_family, write_family
from kernorch.shapes.generic import (
    GenericPlan,
    NotGeneric,
    SavedKernels,
    SizeRange,
    build_generic_plan,
)
from kernorch.shapes.padding import PaddingProof, prove_paddable
from kernorch.shapes.serving import GenericServer, HotShapes, onnxruntime_available
from kernorch.signing import private_dir, sign, signed

LOGGER = logging.getLogger("kernorch.shapes")
CACHE_DIR = "specialisations"  # under the cache root: private to the user (0700), each slot signed
SLOT_MAC_FILE = "slot.mac"
SLOT_MAC_PURPOSE = "kernorch-cached-plan"
HOT_IN_RANGE = 16  # calls of one shape set inside a range before it is specialised (the generic plan is fast)
RANGE_TIMING_RUNS = 5  # timed runs of a specialised shape set and of its range's generic plan, each

K = TypeVar("K")
V = TypeVar("V")


class Memo(Generic[K, V]):
    """A thread-safe map whose values are built once: concurrent callers of one key wait for the one building
    it (a failed build lets the next caller try again); callers of other keys do not wait."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[K, V] = {}
        self._building: dict[K, threading.Lock] = {}

    def get(self, key: K, build: Callable[[], V]) -> V:
        if key in self._values:
            return self._values[key]
        with self._lock:
            building = self._building.setdefault(key, threading.Lock())
        with building:
            if key not in self._values:
                self._values[key] = build()
            return self._values[key]

    def put(self, key: K, value: V) -> None:
        self._values[key] = value  # one assignment: a caller sees the old value or the new, never half of one

    def lookup(self, key: K) -> V | None:
        return self._values.get(key)

    def snapshot(self) -> dict[K, V]:
        return dict(self._values)


def plan_options(options: Options) -> Options:
    """The options one specialisation is compiled with: the shape policy cleared."""
    return options.with_(**{name: getattr(Options(), name) for name in SHAPE_POLICY_FIELDS})


def _digest(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "little") + part)
    return digest.hexdigest()


class DynamicModel:
    """A model with symbolic dims, callable like a `CompiledModel` on any shape they allow (module doc)."""

    def __init__(self, model: bytes, options: Options, progress: Progress = SILENT,
                 plans: Mapping[ShapeSet, CompiledModel] | None = None) -> None:  # fmt: skip
        self.model_bytes = model
        self.options = options
        self.signature = input_signature(model)
        self.output_names = [o.name for o in load_proto(model).graph.output]
        self._progress = progress
        self._plans: Memo[ShapeSet, CompiledModel] = Memo()
        for shapes, plan in (plans or {}).items():
            self._plans.put(shapes, plan)
        self._tuning: dict[ShapeSet, threading.Thread] = {}
        self._proofs: Memo[tuple[ShapeSet, ShapeSet], PaddingProof] = Memo()
        self.model_sha256 = hashlib.sha256(model).hexdigest()
        self._model_key = _digest(model, json.dumps(plan_shaping(options), sort_keys=True).encode())
        self.specialised_here = 0  # shape sets planned and compiled by this object (not read from a cache)
        # new_shapes="serve": shape sets without a plan answered by onnxruntime, the hot ones planned aside
        self._serving = options.new_shapes == "serve" and onnxruntime_available()
        if options.new_shapes == "serve" and not self._serving:
            LOGGER.warning("kernorch: onnxruntime is not installed: shapes without a plan are planned on first use")
        self._generic = GenericServer(model, options.threads, self.output_names)
        self._hot = HotShapes(self.specialisation)
        self.generic_plans: list[GenericPlan] = []  # one per range of options.ranges that has one (prepare)
        self.range_refusals: dict[str, str] = {}  # range -> why it has no generic plan
        # a range's shape set called HOT_IN_RANGE times is specialised in the background, and its own plan used
        # from then on unless the generic plan measured faster on it (then it is in `generic_first`)
        self._hot_in_range = HotShapes(self._specialise_in_range, hot_calls=HOT_IN_RANGE,
                                       served_by="its range's generic plan")  # fmt: skip
        self.generic_first: set[ShapeSet] = set()

    # -- what it is ---------------------------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.signature]

    @property
    def threads(self) -> int:
        return self.options.threads

    @property
    def specialisations(self) -> dict[ShapeSet, CompiledModel]:
        """The plans made so far, by shape set."""
        return self._plans.snapshot()

    # A plan's attributes, where there is one plan: a model with symbolic dims that was made for one shape reads
    # like a CompiledModel; with several, the caller must say which (`specialisation(shapes)`).
    @property
    def only_plan(self) -> CompiledModel:
        plans = self.specialisations
        if len(plans) != 1:
            raise KernorchError(f"this model has symbolic dims and {len(plans)} plans (one per shape): pick one with "
                                ".specialisation({input: shape})")  # fmt: skip
        return next(iter(plans.values()))

    @property
    def graph(self) -> Graph:
        return self.only_plan.graph

    @property
    def kernels(self) -> list[CandidateKernel]:
        return self.only_plan.kernels

    @property
    def costs(self) -> list[float]:
        return self.only_plan.costs

    @property
    def metadata(self) -> dict[str, Any]:
        return self.only_plan.metadata

    @property
    def executor(self) -> PlanExecutor:
        return self.only_plan.executor

    def describe(self) -> str:
        inputs = "; ".join(s.describe() for s in self.signature)
        made = ", ".join(f"[{describe_shapes(s)}]" for s in self.specialisations) or "none yet"
        sets, calls = self._hot.totals
        generic = f"; served by onnxruntime without a plan: {sets} shape set(s), {calls} call(s)" if sets else ""
        ranges = "".join(f"; generic plan {plan.describe()}" for plan in self.generic_plans)
        refused = "".join(f"; no generic plan for [{spec}]: {why}" for spec, why in self.range_refusals.items())
        return f"{inputs} — specialisations: {made}{ranges}{refused}{generic}"

    def prepared_shape_sets(self) -> list[ShapeSet]:
        """The shape sets `options.shapes` and `options.buckets` name, each checked against the signature."""
        sets = [self._checked(dict(shapes)) for shapes in self.options.shapes]
        buckets = dict(self.options.buckets)
        symbols = symbols_of(self.signature)
        unknown = sorted(set(buckets) - set(symbols))
        if unknown:
            raise KernorchError(f"--dim names '{unknown[0]}', which is not a symbolic dim of the model "
                                f"(its symbolic dims: {', '.join(symbols) or 'none'})")  # fmt: skip
        if buckets:
            free = [s for s in symbols if s not in buckets]
            if free and not self.options.shapes:
                raise KernorchError(f"symbolic dim '{free[0]}' has no buckets: give its sizes with --dim too, or "
                                    "whole shapes with --input-shape")  # fmt: skip
            if not free:
                for sizes in itertools.product(*(buckets[s] for s in symbols)):
                    sets.append(shapes_for(self.signature, dict(zip(symbols, sizes, strict=True))))
        return list(dict.fromkeys(sets))

    def _checked(self, shapes: Mapping[str, Sequence[int]]) -> ShapeSet:
        return shapes_for(self.signature, bind(self.signature, shapes))

    # -- specialising -------------------------------------------------------------------------------------------
    def prepare(self) -> DynamicModel:
        """Plan and compile every prepared shape set and every range's generic plan now (the ones already made
        are kept); load the session that serves shape sets without a plan, where new shapes are served."""
        for shapes in self.prepared_shape_sets():
            self.specialisation(shapes)
        self.load_server()
        self.prepare_ranges()
        return self

    def prepare_ranges(self, saved: Mapping[str, SavedKernels] | None = None) -> None:
        """A generic plan for each range of options.ranges not planned yet (shapes/generic.py): checked against
        onnxruntime before it serves; a range without one is logged with the reason and served as before.
        `saved`: range -> the kernels a saved family recorded for it, used instead of orchestrating (their code
        regenerated and checked; refused ones are planned again)."""
        made = {plan.size_range for plan in self.generic_plans}
        for bounds in self.options.ranges:
            size_range = SizeRange(bounds)
            if size_range in made or size_range.describe() in self.range_refusals:
                continue
            size_range.checked(self.signature)  # a range the model does not have is the caller's error
            try:
                if not onnxruntime_available():
                    raise NotGeneric("onnxruntime is needed to check it")
                self._generic.prepare()
                plan = self._generic_plan(size_range, (saved or {}).get(size_range.describe()))
            except KernorchError as reason:  # NotGeneric, or a kernel that failed to compile or run: served as before
                self.range_refusals[size_range.describe()] = str(reason)
                LOGGER.warning("kernorch: no generic plan for [%s]: %s; its shapes are served as other new shapes",
                               size_range.describe(), reason)  # fmt: skip
                continue
            self.generic_plans.append(plan)

    def _generic_plan(self, size_range: SizeRange, saved: SavedKernels | None) -> GenericPlan:
        options = plan_options(self.options)
        if saved is not None:
            try:
                return build_generic_plan(self.model_bytes, self.signature, size_range, options, self._generic.run,
                                          saved)  # fmt: skip
            except NotGeneric as reason:  # saved data is untrusted: planned again, and the log says why
                LOGGER.warning("kernorch: the saved plan of [%s] is refused (%s); planning it again",
                               size_range.describe(), reason)  # fmt: skip
        return build_generic_plan(self.model_bytes, self.signature, size_range, options, self._generic.run)

    def load_server(self) -> DynamicModel:
        """Load onnxruntime's session that serves shape sets without a plan, where new shapes are served (else its
        first such call would)."""
        if self._serving:
            try:
                self._generic.prepare()
            except KernorchError as error:  # a model onnxruntime cannot run: new shapes are planned instead
                LOGGER.warning("kernorch: %s; shapes without a plan are planned on first use", error)
                self._serving = False
        return self

    def specialisation(self, shapes: ShapeSet | Mapping[str, Sequence[int]]) -> CompiledModel:
        """The plan for one shape set: from memory, else from the disk cache, else planned and compiled now."""
        key = shapes if isinstance(shapes, tuple) else self._checked(shapes)
        return self._plans.get(key, lambda: self._specialise(key))

    def _cache_path(self, shapes: ShapeSet) -> Path:
        return self.options.cache / CACHE_DIR / self._model_key[:32] / _digest(repr(shapes).encode())[:32]

    def expected_origin(self, shapes: ShapeSet) -> PlanOrigin:
        """What a plan for `shapes` must have been made for: this model, these shapes, these options."""
        return PlanOrigin(self.model_sha256, shapes, plan_shaping(self.options))

    def _specialise(self, shapes: ShapeSet) -> CompiledModel:
        options = plan_options(self.options)
        cached = self._from_cache(shapes, options)
        if cached is not None:
            return cached
        if self.options.background_tuning and options.cost == "profile":
            quick = compile_model(self.model_bytes, dict(shapes), options.with_(cost="analytic"), self._progress)
            self._tune_in_background(shapes, options)
            return quick
        return self._compile_and_cache(shapes, options)

    def _from_cache(self, shapes: ShapeSet, options: Options) -> CompiledModel | None:
        """The cached plan, if this user's kernorch stored it there (its MAC, under the user's key, binds the
        plan's manifest to this slot) and it was made for this model, shapes and options; else None, and a
        cached plan refused is logged (and replaced when the new plan is stored)."""
        cached = self._cache_path(shapes)
        if not (cached / "plan.json").is_file():
            return None
        try:
            private_dir(cached.parents[1], "cached plans")
            if not _signed_slot(cached):
                raise ArtifactError(f"{cached} was not stored by this user's kernorch (no valid MAC)")
            loaded = load_model(cached, options.threads, options.cache, options.runtime,
                                expected=self.expected_origin(shapes),
                                max_workspaces=options.max_workspaces)  # fmt: skip
        except KernorchError as error:  # a cache is rebuilt, never trusted: log and plan again
            LOGGER.warning("kernorch: the cached plan for [%s] is refused (%s); planning it again",
                           describe_shapes(shapes), error)  # fmt: skip
            return None
        loaded.metadata["specialised_seconds"] = None  # read from the cache, not planned here
        return loaded

    def _compile_and_cache(self, shapes: ShapeSet, options: Options) -> CompiledModel:
        LOGGER.info("kernorch: specialising for [%s]: planning and compiling (%s cost)", describe_shapes(shapes),
                    options.cost)  # fmt: skip
        started = time.perf_counter()
        compiled = compile_model(self.model_bytes, dict(shapes), options, self._progress)
        self.specialised_here += 1
        compiled.metadata["specialised_seconds"] = round(time.perf_counter() - started, 3)
        self._store(shapes, compiled)
        LOGGER.info("kernorch: [%s] specialised in %.1f s (%d kernels)", describe_shapes(shapes),
                    time.perf_counter() - started, len(compiled.kernels))  # fmt: skip
        return compiled

    def _store(self, shapes: ShapeSet, compiled: CompiledModel) -> None:
        """Into the disk cache, atomically (a reader sees the whole plan or none); a cache that cannot be
        written costs the next process a re-plan, nothing more."""
        target = self._cache_path(shapes)
        try:
            private_dir(target.parents[1], "cached plans")
            target.parent.mkdir(exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
            compiled.save(staging)
            _sign_slot(staging, target)
            if target.exists():  # a refused entry (another model's plan, no MAC): the new plan replaces it
                shutil.rmtree(target, ignore_errors=True)
            try:
                os.rename(staging, target)
            except OSError:  # another process stored it first: theirs is as good
                shutil.rmtree(staging, ignore_errors=True)
        except (OSError, KernorchError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else error
            LOGGER.warning("kernorch: cannot cache the plan for [%s] in %s: %s", describe_shapes(shapes), target,
                           reason)  # fmt: skip

    def _tune_in_background(self, shapes: ShapeSet, options: Options) -> None:
        def tune() -> None:
            try:
                self._plans.put(shapes, self._compile_and_cache(shapes, options))
            except Exception as error:  # noqa: BLE001 - the analytic plan keeps serving; say why tuning stopped
                LOGGER.warning("kernorch: background tuning of [%s] failed: %s", describe_shapes(shapes), error)

        LOGGER.info("kernorch: [%s] runs on the analytic plan while its measured plan is tuned in the background",
                    describe_shapes(shapes))  # fmt: skip
        thread = threading.Thread(target=tune, name=f"kernorch-tune-{len(self._tuning)}", daemon=True)
        self._tuning[shapes] = thread
        thread.start()

    def wait_for_tuning(self, timeout: float | None = None) -> bool:
        """Wait for the background tuning and planning started so far; True when none is left running."""
        for thread in list(self._tuning.values()):
            thread.join(timeout)
        planned = self._hot.wait(timeout) and self._hot_in_range.wait(timeout)
        return planned and not any(t.is_alive() for t in self._tuning.values())

    # -- running ------------------------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Like `CompiledModel.__call__`: inputs positionally or by name, numpy arrays or torch tensors."""
        return call_with_arrays(self.run, self.input_names, self.output_names, args, kwargs)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        shapes = shape_set({name: np.shape(value) for name, value in feeds.items()})
        plan, padding = self._dispatch(shapes)
        if plan is None:
            return self._generic.run(feeds)
        if isinstance(plan, _InRange):
            try:
                return plan.run(feeds)
            except KernelFailed as failure:  # a convolution's primitive refused at a new image size, memory...
                if not self._serving:
                    raise
                LOGGER.warning("kernorch: [%s] failed on its range's generic plan (%s): served by onnxruntime",
                               describe_shapes(shapes), failure)  # fmt: skip
                return self._generic.run(feeds)
        return plan.run(feeds) if padding is None else padding.run(plan, dict(feeds))

    def _dispatch(self, shapes: ShapeSet) -> tuple[CompiledModel | _InRange | None, PaddingProof | None]:
        """The plan (and padding proof) a call of these shapes runs on: its own, a padded bucket's, a range's
        generic plan; None: served by onnxruntime."""
        known = self._plans.lookup(shapes)
        if known is not None and shapes not in self.generic_first:
            return known, None
        values = bind(self.signature, dict(shapes), empty=self._serving)  # refuses what the signature does not allow
        if any(0 in shape for _, shape in shapes):  # bind let it through: served, never planned
            self._hot.called(shapes, plannable=False)
            return None, None
        padded = self._padded(values, shapes)
        if padded is not None:
            return padded
        # a range's generic plan serves every size in it at once; a shape set called again and again is specialised
        # in the background and kept where it measures faster (`_specialise_in_range`)
        generic = self._range_plan(values)
        if generic is not None:
            if known is None:
                self._hot_in_range.called(shapes)
            return _InRange(generic, values), None
        if self.options.new_shapes == "refuse":
            made = "; ".join(f"[{describe_shapes(s)}]" for s in self.specialisations) or "none"
            raise InputMismatch(f"no plan for [{describe_shapes(shapes)}] and new shapes are refused "
                                f"(prepared: {made})")  # fmt: skip
        if self._serving:
            self._hot.called(shapes)
            return None, None
        return self.specialisation(shapes), None

    def _range_plan(self, values: Mapping[str, int]) -> GenericPlan | None:
        return next((plan for plan in self.generic_plans if plan.size_range.contains(values)), None)

    def _specialise_in_range(self, shapes: ShapeSet) -> None:
        """Plan a hot shape set of a range (in the background worker), then time its plan and the generic plan on
        the same inputs (median of RANGE_TIMING_RUNS each): the slower one is not used for it again."""
        plan = self.specialisation(shapes)
        values = bind(self.signature, dict(shapes))
        generic = self._range_plan(values)
        if generic is None:
            return
        from kernorch.runtime.feeds import graph_feeds

        feeds = graph_feeds(plan.graph, seed=0)
        own = _median_seconds(lambda: plan.run(feeds))
        shared = _median_seconds(lambda: generic.run(values, feeds))
        if shared <= own:
            self.generic_first.add(shapes)
        LOGGER.info("kernorch: [%s] specialised: %.3f ms, its range's generic plan %.3f ms: %s kept",
                    describe_shapes(shapes), own * 1e3, shared * 1e3,
                    "the generic plan" if shared <= own else "its own plan")  # fmt: skip

    def runs_on(self, shapes: ShapeSet) -> str:
        """What a call of these shapes runs on, as `_dispatch` chooses (what `kernorch run` reports)."""
        if self._plans.lookup(shapes) is not None and shapes not in self.generic_first:
            return "its own plan"
        values = bind(self.signature, dict(shapes), empty=True)
        if self._padded(values, shapes) is not None:
            return "a prepared bucket's plan, padded"
        generic = self._range_plan(values)
        if generic is not None:
            return f"the generic plan of [{generic.size_range.describe()}] ({len(generic.executor.kernels)} kernels)"
        return "onnxruntime's session (no plan for it)" if self._serving else "a plan made for it on first use"

    def _padded(self, values: dict[str, int], call: ShapeSet) -> tuple[CompiledModel, PaddingProof] | None:
        """The plan of the next bucket up along the paddable dims, with the proof that padding is exact there."""
        buckets = dict(self.options.buckets)
        target = dict(values)
        for dim in self.options.pad:
            if dim in values and values[dim] not in buckets[dim]:
                larger = [size for size in buckets[dim] if size > values[dim]]
                if not larger:
                    return None
                target[dim] = larger[0]
        if target == values:
            return None
        shapes = shapes_for(self.signature, target)
        plan = self._plans.lookup(shapes)
        if plan is None:
            return None  # its bucket is not compiled: padding would not save the planning
        padded_dims = tuple(sorted(d for d in target if target[d] != values[d]))
        proof = self._proofs.get((call, shapes), lambda: prove_paddable(self.model_bytes, self.signature,
                                                                         padded_dims, target, values))  # fmt: skip
        if not proof.exact:
            LOGGER.info("kernorch: not padding %s to [%s]: %s", ", ".join(padded_dims), describe_shapes(shapes),
                        proof.reason)  # fmt: skip
            return None
        return plan, proof

    # -- saving -------------------------------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Every specialisation (each a plan directory, verified at load), the model (new shapes after a load),
        the policy and each range's kernels, under `directory` (shapes/family.py)."""
        return write_family(directory, self.model_bytes, self.signature, self.options, self.specialisations,
                            [(plan.size_range.describe(), plan.saved) for plan in self.generic_plans],
                            sorted(self.generic_first))  # fmt: skip

def _median_seconds(run: Callable[[], object]) -> float:
    run()  # warm: first-call allocations, a library's first run
    samples = []
    for _ in range(RANGE_TIMING_RUNS):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return float(np.median(samples))


@dataclass(frozen=True)
class _InRange:
    """A call's sizes on the generic plan of the range holding them."""

    plan: GenericPlan
    sizes: dict[str, int]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.plan.run(self.sizes, {name: np.asarray(array) for name, array in feeds.items()})


def _slot_place(slot: Path) -> bytes:
    """A cache slot's place (model key / shape key): in its MAC, so an entry moved to another model's or shape's
    slot is not vouched for. The MAC's other part is the plan's manifest hash, which covers every file."""
    return f"{slot.parent.name}/{slot.name}".encode()


def _sign_slot(staging: Path, slot: Path) -> None:
    mac = sign(SLOT_MAC_PURPOSE, _slot_place(slot), manifest_hash(staging).encode())
    (staging / SLOT_MAC_FILE).write_text(mac)


def _signed_slot(slot: Path) -> bool:
    try:
        recorded = (slot / SLOT_MAC_FILE).read_text().strip()
        return signed(recorded, SLOT_MAC_PURPOSE, _slot_place(slot), manifest_hash(slot).encode())
    except (OSError, UnicodeDecodeError, KernorchError):
        return False


def is_family(directory: str | os.PathLike[str]) -> bool:
    return (Path(directory) / FAMILY_FILE).is_file()


def load_dynamic(directory: str | os.PathLike[str], threads: int | None = None, cache_dir: Path | None = None,
                 runtime: str = "kernels", max_workspaces: int | None = None,
                 model_sha256: str | None = None) -> DynamicModel:  # fmt: skip
    """A saved `DynamicModel` (shapes/family.py: every part verified before any is used), serving its ranges
    with the kernels it saved for them, their code regenerated and checked. `model_sha256`: the model the family
    must hold, checked before any plan is read (or compiled)."""
    family = read_family(directory, threads, cache_dir, runtime, max_workspaces, model_sha256)
    loaded = DynamicModel(family.model, family.options, plans=family.plans)
    declared = [{"name": s.name, "dims": list(s.dims), "dtype": s.dtype} for s in loaded.signature]
    if declared != family.inputs:
        raise ArtifactError(f"{family.manifest} declares inputs that are not the model's")
    loaded.load_server()
    loaded.generic_first.update(shapes for shapes in family.generic_first if shapes in family.plans)
    loaded.prepare_ranges(family.ranges)  # each range's kernels as saved; their code regenerated and checked
    return loaded
